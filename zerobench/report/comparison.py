"""The report's baseline-DP-vs-ZeRO table: each ZeRO stage beside the stage-0 run of its workload, with ratios."""

from __future__ import annotations

import pandas as pd

from zerobench.report.maxsize import sizes_for

NAN = float("nan")


def comparison_table(runs: pd.DataFrame, maxsize: pd.DataFrame | None = None) -> pd.DataFrame:
    """Baseline DP (stage 0) vs each ZeRO stage of the same workload (every config key but the stage and the run's
    length: ``workload``), hardware class, processor, torch version and commit, with ratios; ``variant`` says what
    sets a workload apart from others drawn under the same model label. The baseline is ``_baseline``'s: where it is
    ambiguous the ratios are blank and ``note`` says why. The max model size comes from the ``zerobench maxsize``
    searches of the same workload, stage, hardware and code (``maxsize.sizes_for``), a ratio only from searches within
    one memory budget (``max_model_budget``), and a capped search's answer keeps its "at least" (``max_model_bound``,
    ``vs_DP_max_model_bound``)."""
    if runs.empty or "system" not in runs:  # no successful training run among the rows (maxsize, peers only)
        return pd.DataFrame()
    runs = runs[runs["system"].fillna("zerobench") == "zerobench"]
    out = []
    keys = [k for k in ("workload", "hardware", "device", "torch", "commit") if k in runs]
    for _, g in runs.groupby(keys, dropna=False):
        bases = g[g["stage"] == 0]
        if bases.empty:
            continue
        for _, r in g.sort_values("stage").iterrows():
            b, note = _baseline(r, bases)
            out.append({**_row(r, b), **sizes_for(maxsize, r, b), "note": note})
    table = pd.DataFrame(out)
    return table.drop(columns="note") if len(table) and not table["note"].any() else table


def _baseline(r: pd.Series, bases: pd.DataFrame) -> tuple[pd.Series | None, str]:
    """The stage-0 record that run ``r``'s ratios divide by, of ``bases`` (the stage-0 records of its workload,
    hardware and code), and a note where there is none. A stage-0 run is its own; a workload with one stage-0 record
    has that one, whatever its length (a longer stage-0 run is still the baseline); with several (their lengths differ:
    steps, warm-up, seed, named by their ``variant``) the one of ``r``'s length, and where none has it, none: taking
    one of them would be a choice the table does not show."""
    if r["stage"] == 0:
        return r, ""
    if len(bases) == 1:
        return bases.iloc[0], ""
    same = bases[bases["length"] == r["length"]]
    if len(same) == 1:
        return same.iloc[0], ""
    names = [v or f"config {h[:8]}" for v, h in zip(bases["variant"].fillna(""), bases["config_hash"])]
    return None, f"no ratio: {len(bases)} stage-0 runs of this workload ({'; '.join(names)}), none of this run's length"


def _row(r: pd.Series, b: pd.Series | None) -> dict:
    """The table's columns for run ``r`` against baseline ``b`` (None: blank ratios)."""

    def ratio(metric: str) -> float:
        return NAN if b is None else r.get(metric, NAN) / b.get(metric, NAN)

    return {
        "dp": r["dp"],
        "tp": r["tp"],
        "model": f"{r['preset']} L{r['layers']} h{r['hidden']}",
        "variant": r.get("variant", ""),
        "precision": r["precision"],
        "hardware": r["hardware"],
        "stage": r["stage"],
        "offload": r.get("offload", "none"),
        "model_states_MiB": r.get("model_state_bytes", NAN) / 2**20,
        "vs_DP_memory": ratio("model_state_bytes"),
        "peak_MiB": r.get("peak_memory_bytes", NAN) / 2**20,
        "tflops_per_gpu": r.get("tflops_per_gpu"),
        "vs_DP_throughput": ratio("tflops_per_gpu"),
    }
