"""The report's baseline-DP-vs-ZeRO table: each ZeRO stage beside the stage-0 run of its workload, with ratios."""

from __future__ import annotations

import pandas as pd

from zerobench.report.maxsize import sizes_for


def comparison_table(runs: pd.DataFrame, maxsize: pd.DataFrame | None = None) -> pd.DataFrame:
    """Baseline DP (stage 0) vs each ZeRO stage of the same workload (every config key but the stage and the run's
    length: ``workload``), hardware class, processor, torch version and commit, with ratios; ``variant`` says what sets a workload apart from others
    drawn under the same model label. The max model size comes from the ``zerobench maxsize`` searches of the same
    workload, stage, hardware and code (``maxsize.sizes_for``), a ratio only from searches within one memory budget
    (``max_model_budget``), and a capped search's answer keeps its "at least" (``max_model_bound``,
    ``vs_DP_max_model_bound``)."""
    if runs.empty or "system" not in runs:  # no successful training run among the rows (maxsize, peers only)
        return pd.DataFrame()
    runs = runs[runs["system"].fillna("zerobench") == "zerobench"]
    out = []
    keys = [k for k in ("workload", "hardware", "device", "torch", "commit") if k in runs]
    for _, g in runs.groupby(keys, dropna=False):
        base = g[g["stage"] == 0]
        if base.empty:
            continue
        b = base.iloc[0]
        for _, r in g.sort_values("stage").iterrows():
            out.append(
                {
                    "dp": r["dp"],
                    "tp": r["tp"],
                    "model": f"{r['preset']} L{r['layers']} h{r['hidden']}",
                    "variant": r.get("variant", ""),
                    "precision": r["precision"],
                    "hardware": r["hardware"],
                    "stage": r["stage"],
                    "offload": r.get("offload", "none"),
                    "model_states_MiB": r.get("model_state_bytes", float("nan")) / 2**20,
                    "vs_DP_memory": r.get("model_state_bytes", float("nan")) / b.get("model_state_bytes", float("nan")),
                    "peak_MiB": r.get("peak_memory_bytes", float("nan")) / 2**20,
                    "tflops_per_gpu": r.get("tflops_per_gpu"),
                    "vs_DP_throughput": r.get("tflops_per_gpu", float("nan")) / b.get("tflops_per_gpu", float("nan")),
                    **sizes_for(maxsize, r, b),
                }
            )
    return pd.DataFrame(out)
