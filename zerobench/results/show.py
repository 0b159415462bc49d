"""``zerobench results show``: one readable line per run, built from rows (never from logs)."""

from __future__ import annotations

from pathlib import Path


def summarize(path: str | Path):
    """A per-run summary DataFrame: status, configuration and the headline metrics (rank 0)."""
    import pandas as pd

    from zerobench.results import load

    df = load(path)
    runs = []
    for run_id, g in df.groupby("run_id", sort=True):
        def metric(name, rank0=True, g=g):
            m = g[g["metric"] == name]
            if rank0 and "rank" in m:
                m = m[(m["rank"].isna()) | (m["rank"] == 0)]
            return m["value"].iloc[-1] if len(m) else None

        status = g[g["metric"] == "run_status"]
        loss = g[g["metric"] == "loss"].sort_values("step") if "step" in g else g.iloc[0:0]
        first = g.iloc[0]
        runs.append({
            "run": run_id,
            "status": status["status"].iloc[-1] if len(status) else "ok",
            "system": first.get("config.system"),
            "stage": first.get("config.zero.stage"),
            "dp": first.get("config.dp"), "tp": first.get("config.tp"),
            "precision": first.get("config.zero.precision"),
            "step_ms": (metric("step_time_s") or float("nan")) * 1e3,
            "tflops_gpu": metric("tflops_per_gpu"),
            "model_state_MiB": (metric("model_state_bytes") or float("nan")) / 2**20,
            "peak_MiB": (metric("peak_memory_bytes") or float("nan")) / 2**20,
            "final_loss": loss["value"].iloc[-1] if len(loss) else None,
            "reason": status["reason"].iloc[-1] if len(status) and "reason" in status else None,
        })
    return pd.DataFrame(runs)


def show(path: str | Path) -> str:
    df = summarize(path)
    return df.to_string(index=False, max_cols=None, max_colwidth=70, float_format=lambda x: f"{x:.4g}")
