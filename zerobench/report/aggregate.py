"""From long-format rows to the tables the report draws: one record per run, medians across repeats.

Repeats are runs with the same config hash (e.g. several sweeps of the same suite): their metric values
are reduced to the median, with the min-max spread kept. Per-rank metrics use rank 0 (the ledgers are
identical across DP ranks by construction; the tests check that).
"""

from __future__ import annotations

import pandas as pd

RUN_METRICS = ("step_time_s", "tflops_per_gpu", "hw_tflops_per_gpu", "pflops_aggregate", "tokens_per_s_per_gpu",
               "num_params", "model_state_bytes", "model_state_bytes_analytic", "comm_volume_elements_per_step",
               "peak_memory_bytes", "peak_rss_bytes", "memory_params_bytes", "memory_grads_bytes",
               "memory_master_bytes", "memory_optimizer_states_bytes", "memory_activation_checkpoints_bytes",
               "max_params", "max_layers")


def runs_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per config hash: configuration columns and the median (and spread) of each metric."""
    df = df[(df["status"].fillna("ok") == "ok") & ~df["metric"].str.startswith("peer_")]
    if "rank" in df:
        df = df[df["rank"].isna() | (df["rank"] == 0)]
    cfg_cols = {
        "system": "config.system", "stage": "config.zero.stage", "dp": "config.dp", "tp": "config.tp",
        "precision": "config.zero.precision", "preset": "config.preset", "layers": "config.model.layers",
        "hidden": "config.model.hidden", "suite": "suite", "hardware": "provenance.hardware.class",
        "device": "provenance.hardware.device",
    }
    records = []
    for key, g in df.groupby("config_hash"):
        first = g.iloc[0]
        rec = {"config_hash": key, "repeats": g["run_id"].nunique()}
        for name, col in cfg_cols.items():
            rec[name] = first.get(col) if col in g else None
        for m in RUN_METRICS:
            vals = g[g["metric"] == m]["value"].dropna()
            if len(vals):
                per_run = g[g["metric"] == m].groupby("run_id")["value"].last()
                rec[m] = float(per_run.median())
                rec[m + "_spread"] = float(per_run.max() - per_run.min())
        records.append(rec)
    return pd.DataFrame(records)


def losses_table(df: pd.DataFrame) -> pd.DataFrame:
    loss = df[(df["metric"] == "loss") & (df["status"].fillna("ok") == "ok")]
    cols = ["run_id", "step", "value", "config.zero.stage", "config.dp", "provenance.hardware.class"]
    return loss[[c for c in cols if c in loss]].rename(columns={"config.zero.stage": "stage", "config.dp": "dp"})


def comparison_table(runs: pd.DataFrame) -> pd.DataFrame:
    """Baseline DP (stage 0) vs each ZeRO stage at the same DP/TP/model/hardware, with ratios."""
    out = []
    keys = ["dp", "tp", "preset", "layers", "hidden", "precision", "hardware", "system"]
    runs = runs[runs["system"].fillna("zerobench") == "zerobench"]
    for _, g in runs.groupby([k for k in keys if k in runs], dropna=False):
        base = g[g["stage"] == 0]
        if base.empty:
            continue
        b = base.iloc[0]
        for _, r in g.sort_values("stage").iterrows():
            out.append({
                "dp": r["dp"], "tp": r["tp"], "model": f"{r['preset']} L{r['layers']} h{r['hidden']}",
                "precision": r["precision"], "hardware": r["hardware"], "stage": r["stage"],
                "model_states_MiB": r.get("model_state_bytes", float("nan")) / 2**20,
                "vs_DP_memory": r.get("model_state_bytes", float("nan")) / b.get("model_state_bytes", float("nan")),
                "peak_MiB": r.get("peak_memory_bytes", float("nan")) / 2**20,
                "tflops_per_gpu": r.get("tflops_per_gpu"),
                "vs_DP_throughput": r.get("tflops_per_gpu", float("nan")) / b.get("tflops_per_gpu", float("nan")),
            })
    return pd.DataFrame(out)


PEER_METRICS = {"peer_time_vs_torch_ddp": "time_vs_torch_ddp", "peer_step_time_s": "step_time_s",
                "peer_peak_live_bytes": "peak_live_bytes", "peer_peak_rss_bytes": "peak_rss_bytes",
                "peer_loss_max_abs_diff": "loss_max_abs_diff"}


def peers_table(df: pd.DataFrame) -> pd.DataFrame:
    """``zerobench peers`` summary rows: one row per (comparison, candidate), failed candidates kept."""
    d = df[df["metric"].isin(list(PEER_METRICS))]
    if d.empty:
        return pd.DataFrame()
    out = []
    for (run, cand), g in d.groupby(["run_id", "candidate"], sort=False):
        first = g.iloc[0]
        rec = {"candidate": cand, "shards_like_stage": int(first["sharding_stage"]),
               "processes": first.get("config.peers.dp"), "params_M": None,
               "device": first.get("provenance.hardware.device"), "status": first.get("status") or "ok"}
        for metric, col in PEER_METRICS.items():
            v = g[g["metric"] == metric]["value"].dropna()
            rec[col] = float(v.iloc[-1]) if len(v) else None
        out.append(rec)
    t = pd.DataFrame(out).drop(columns=["params_M"])
    for col in ("peak_live_bytes", "peak_rss_bytes"):
        t[col.replace("_bytes", "_MiB")] = t.pop(col) / 2**20
    return t
