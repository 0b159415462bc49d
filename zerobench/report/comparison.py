"""The report's baseline-DP-vs-ZeRO table: each ZeRO stage beside the stage-0 run of its workload, with ratios."""

from __future__ import annotations

import json

import pandas as pd

from zerobench.report.aggregate import NON_FINITE, RUN_LENGTH, code_of, missing, non_finite_runs, timed_rows
from zerobench.report.maxsize import sizes_for
from zerobench.results.status import COUNTED, RUN_KEY, counted_rows, frame_statuses, with_run_key
from zerobench.results.workload import comparable, workload

NAN = float("nan")


def comparison_table(
    runs: pd.DataFrame, maxsize: pd.DataFrame | None = None, missed: pd.DataFrame | None = None
) -> pd.DataFrame:
    """Baseline DP (stage 0) vs each ZeRO stage of the same workload (every config key but the stage and the run's
    length: ``workload``), hardware class, processor, torch version and commit, with ratios; ``variant`` says what
    sets a workload apart from others drawn under the same model label. The baseline is ``_baseline``'s: where it is
    ambiguous the ratios are blank and ``note`` says why. ZeRO runs whose workload's stage-0 run is among ``missed``
    (``missed_baselines``: it failed, ran out of memory, stopped, measured a non-finite figure) are listed with blank
    ratios and a note naming it; those of a workload with no stage-0 run at all are not a comparison and are left
    out. The max model size comes from the ``zerobench maxsize``
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
        lost = _lost(g.iloc[0], missed) if bases.empty else ""
        if bases.empty and not lost:
            continue
        for _, r in g.sort_values("stage").iterrows():
            b, note = _baseline(r, bases) if lost == "" else (None, lost)
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


def missed_baselines(df: pd.DataFrame) -> pd.DataFrame:
    """The stage-0 training runs that are not data points (as ``aggregate.run_statuses`` names them: failed, oom,
    incomplete, non-finite, ...), one row each: ``run`` (its run id), ``status``, ``bare`` (``_bare``) and ``code``
    (its code version), runs under a measuring tool left out."""
    cols = ["run", "status", "bare", "code"]
    if df.empty or "config.zero.stage" not in df:
        return pd.DataFrame(columns=cols)
    df = with_run_key(timed_rows(df))
    fate = {k: s for k, s in frame_statuses(df)["status"].items() if s is not None and s not in COUNTED}
    fate |= dict.fromkeys(non_finite_runs(counted_rows(df)), NON_FINITE)
    config = [c for c in df.columns if c.startswith("config.")]
    out = []
    for r in df[df["config.zero.stage"] == 0].drop_duplicates(RUN_KEY).to_dict("records"):
        if (key := tuple(r[c] for c in RUN_KEY)) in fate:
            flat = {c.removeprefix("config."): r[c] for c in config if not missing(r[c])}
            prov = {k: v for k, v in r.items() if k.startswith("provenance.")}
            out.append(
                {
                    "run": str(r["run_id"]),
                    "status": fate[key],
                    "bare": _bare(workload(flat, without=("zero.stage", *RUN_LENGTH))),
                    "code": code_of(prov) if "provenance.commit" in df else None,
                }
            )
    return pd.DataFrame(out, columns=cols)


def _bare(key: str) -> str:
    """A ``workload`` key without the kernels' paths (``kernels_ran``: a run that stopped before its first step
    recorded none) and with integral floats as integers (a column with gaps reads integers as floats)."""
    flat = comparable(json.loads(key))
    flat.pop("kernels_ran", None)
    return json.dumps(flat, sort_keys=True, default=str)


def _lost(r: pd.Series, missed: pd.DataFrame | None) -> str:
    """The note of the rows of record ``r``'s workload and code where its stage-0 runs are all in ``missed``; "" where
    none is there."""
    if missed is None or missed.empty:
        return ""
    code = None if missing(r.get("code")) else r.get("code")
    same_code = pd.Series([(None if missing(c) else c) == code for c in missed["code"]], index=missed.index)
    m = missed[(missed["bare"] == _bare(r["workload"])) & same_code]
    if m.empty:
        return ""
    runs = ", ".join(f"{run}: {status}" for run, status in zip(m["run"], m["status"]))
    return f"no ratio: the stage-0 run of this workload is not counted ({runs})"
