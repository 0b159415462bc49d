"""The report's "offload on one card" table: runs under a device memory budget or with offload, the ones
that ran out of memory included, so the largest model per system reads straight off the rows.

One row per configuration (config hash) and hardware class: which system (zerobench's stage and offload, or a peer such as
``deepspeed-2-offload``), the budget, the model size, whether it fit (a ``run_status`` row with status
``oom`` and no timing means it did not; a failed or incomplete run's figures are left out), and the median
step time, TFLOPs, device peak, host model states and peak RSS over repeats (rank 0). A repeat is a run as the
rest of the report counts one (``RUN_KEY``: the same suite swept into two directories is two repeats), and runs
under a measuring tool are left out (``timed_rows``).
"""

from __future__ import annotations

import pandas as pd

from zerobench.models.config import GPTConfig
from zerobench.models.sizes import num_params
from zerobench.report.aggregate import run_hardware, timed_rows
from zerobench.results.status import RUN_KEY, counted_rows, with_run_key

GiB = 2**30
METRICS = {
    "step_time_s": "step_ms",
    "tflops_per_gpu": "tflops_per_gpu",
    "peak_memory_bytes": "device_peak_GiB",
    "host_model_state_bytes": "host_states_GiB",
    "peak_rss_bytes": "peak_rss_GiB",
}
SCALE = {"step_ms": 1e-3, "device_peak_GiB": GiB, "host_states_GiB": GiB, "peak_rss_GiB": GiB}


def _col(g: pd.DataFrame, name: str, default=None):
    if name not in g:
        return default
    v = g[name].dropna()
    return v.iloc[0] if len(v) else default


def _system(g: pd.DataFrame) -> str:
    system = _col(g, "config.system", "zerobench")
    if system != "zerobench":
        return system
    name = f"zerobench-{int(_col(g, 'config.zero.stage', 0))}"
    if _col(g, "config.zero.offload_optimizer", "none") != "none":
        name += "-offload"
    if _col(g, "config.zero.offload_param", "none") != "none":
        name += "+param"
    return name


def _params(g: pd.DataFrame) -> float | None:
    fields = {k: _col(g, f"config.model.{k}") for k in ("layers", "hidden", "heads", "vocab", "seq")}
    if any(v is None for v in fields.values()):
        return None
    return float(num_params(GPTConfig(**{k: int(v) for k, v in fields.items()})))


def offload_table(df: pd.DataFrame) -> pd.DataFrame:
    """Runs with a memory budget or offload, fitted or not; empty when the rows have none."""
    if "config.system" not in df:
        return pd.DataFrame()
    sel = df["config.system"].fillna("zerobench").str.endswith("-offload")
    if "config.memory_budget_bytes" in df:
        sel |= df["config.memory_budget_bytes"].notna()
    for col in ("config.zero.offload_optimizer", "config.zero.offload_param"):
        if col in df:
            sel |= df[col].fillna("none") != "none"
    d = with_run_key(timed_rows(df[sel & ~df["metric"].str.startswith("peer_")]))
    if "rank" in d:
        d = d[d["rank"].isna() | (d["rank"] == 0)]
    # a failed or incomplete run's figures are no data (results/status.py)
    counts = pd.Series(d.index.isin(counted_rows(d).index), index=d.index)
    hw = "provenance.hardware.class"
    # a run's status row (an OOM's only row) in its run's class: under Slurm the submit host wrote it, with its own
    d = d.assign(**{hw: run_hardware(d, hw)})
    out = []
    for _, g in d.groupby(["config_hash", hw], sort=False):
        ok = g[(g["status"].fillna("ok") == "ok") & counts[g.index]]
        timed = ok[ok["metric"] == "step_time_s"]
        oom = (g["metric"] == "run_status") & (g["status"] == "oom")
        budget, params = _col(g, "config.memory_budget_bytes"), _params(g)
        rec = {
            "hardware": _col(g, hw),
            "system": _system(g),
            "budget_GiB": budget / GiB if budget is not None else None,
            "layers": _col(g, "config.model.layers"),
            "params_B": params / 1e9 if params else None,
            "fits": "yes" if len(timed) else ("OOM" if oom.any() else "no result"),
            "runs": len(g.groupby(RUN_KEY[:2])),
        }
        for metric, name in METRICS.items():
            per_run = ok[ok["metric"] == metric].groupby(RUN_KEY[:2])["value"].last()
            rec[name] = float(per_run.median()) / SCALE.get(name, 1) if len(per_run) else None
        out.append(rec)
    if not out:
        return pd.DataFrame()
    table = pd.DataFrame(out)
    table["step_ms"] = (
        pd.to_numeric(table["step_ms"], errors="coerce").round().astype("Int64")
    )  # whole milliseconds: 1236, not 1.24e+03
    return table.sort_values(["hardware", "budget_GiB", "params_B", "system"], na_position="last", ignore_index=True)
