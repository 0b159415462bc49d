"""From long-format rows to the tables the report draws: one record per run, medians across repeats.

Repeats are runs with the same config hash (e.g. several sweeps of the same suite): their metric values
are reduced to the median, with the min-max spread kept. Per-rank metrics use rank 0 (the ledgers are
identical across DP ranks by construction; the tests check that). Only runs whose status is ``ok`` (or
``unrecorded``: rows from before every launcher wrote a status) are data points; a failed run, or an
``incomplete`` one (no ``run_status`` row: ``results/status.py``), is named by ``run_statuses``, not counted.
"""

from __future__ import annotations

import json
import math
import numbers
from collections import Counter
from pathlib import Path

import pandas as pd

from zerobench.config import ConfigError
from zerobench.results.provenance import code_version, short_version
from zerobench.results.status import COUNTED, RUN_KEY, STATUS_METRIC, counted_rows, frame_statuses, with_run_key
from zerobench.results.workload import comparable, differences, with_kernels, workload

RUN_METRICS = (
    "step_time_s",
    "tflops_per_gpu",
    "hw_tflops_per_gpu",
    "pflops_aggregate",
    "tokens_per_s_per_gpu",
    "num_params",
    "model_state_bytes",
    "model_state_bytes_analytic",
    "comm_volume_elements_per_step",
    "peak_memory_bytes",
    "peak_rss_bytes",
    "memory_params_bytes",
    "memory_grads_bytes",
    "memory_master_bytes",
    "memory_optimizer_states_bytes",
    "memory_activation_checkpoints_bytes",
    "max_params",
    "max_layers",
)


UNKNOWN_HARDWARE = "unknown (no hardware provenance)"


def missing(v) -> bool:
    """None or a float NaN (pandas' marker for a config key a row does not have)."""
    return v is None or (isinstance(v, float) and math.isnan(v))


def paper_config(stage, ckpt, pa, pa_cpu, md) -> str | None:
    """The paper's Table 3 name (C1-C5) of a run's switches, or None."""
    if not (ckpt and md) or stage not in (1, 2):
        return None
    if pa_cpu:
        return "C5" if stage == 2 else None
    return {(1, False): "C1", (1, True): "C2", (2, False): "C3", (2, True): "C4"}[(int(stage), bool(pa))]


LAYOUT = (("stage", "zero.stage"), ("dp", "dp"), ("tp", "tp"), ("layers", "model.layers"), ("hidden", "model.hidden"))
"""The record's columns (and their config paths) that every figure of a run's training metrics is drawn and labelled
by: its stage, process layout and model shape."""


def _check_layout(run_id, rec: dict) -> None:
    """A run's training metrics are drawn by its stage, process layout and model shape (``LAYOUT``): refuse, in one
    line naming the run, rows whose ``config`` does not give them as integers (rows not written by a zerobench run,
    or edited). DP and TP may be absent (one process)."""
    for name, key in LAYOUT:
        v = rec[name]
        if name in ("dp", "tp") and missing(v):
            continue  # no DP or TP field: one process
        if missing(v) or isinstance(v, bool) or not isinstance(v, numbers.Real) or not math.isfinite(v) or v != int(v):
            shown = v.item() if hasattr(v, "item") else v  # numpy's scalars as the row wrote them: 64.5, not np.float64
            raise ConfigError(
                f"run {run_id}: its rows carry training metrics, but their config's {key} is {shown!r}, not an "
                "integer: they are not rows a zerobench run wrote; leave them out of the report's inputs"
            )


NON_FINITE = "non-finite"
"""The report's status for a run that completed but measured an infinite or NaN figure (a damaged row, a broken
measurement: a zero step time; a loss that diverged): not a data point, named as such."""


def run_statuses(df: pd.DataFrame) -> dict[str, list[str]]:
    """The training runs that are not data points, by status (``incomplete``, ``failed``, ``oom``, ...,
    ``non-finite``): their run ids, sorted."""
    df = with_run_key(df)
    st = frame_statuses(df)
    out: dict[str, list[str]] = {}
    for (_, run_id, _), status in st["status"].items():
        if status is not None and status not in COUNTED:
            out.setdefault(status, []).append(str(run_id))
    for _, run_id, _ in non_finite_runs(counted_rows(df)):
        out.setdefault(NON_FINITE, []).append(str(run_id))
    return {k: sorted(v) for k, v in sorted(out.items())}


FINITE = (*RUN_METRICS, "loss")
"""The figures a run that counts has as numbers: those the report draws, and its loss at every step (a run whose
loss went NaN or infinite diverged: its step times and memory are not those of training)."""


def non_finite_runs(df: pd.DataFrame) -> set[tuple]:
    """``RUN_KEY`` of every run with an infinite or NaN value of a ``FINITE`` figure. A null is a figure the run did
    not measure (no tokens timed, no RSS on this platform), drawn as missing; a NaN, told from it by
    ``results.load``'s ``value_nan``, is a figure it measured as no number."""
    if df.empty or "metric" not in df:
        return set()
    d = df[df["metric"].isin(FINITE) & (df["status"].fillna("ok") == "ok")]
    inf = d["value"].map(lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isinf(v))
    nan = d["value_nan"].fillna(False) if "value_nan" in d else pd.Series(False, index=d.index)
    bad = d[inf.astype(bool) | nan.astype(bool)]
    return set(zip(*(bad[c] for c in RUN_KEY))) if len(bad) else set()


def measurement_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of ``df`` that hold a run's figures, not its ``run_status`` row: whoever recorded the run's end wrote
    that one (under Slurm the submit host), stamped with its own machine's provenance, so the hardware, device and
    torch a run was measured on are read from these rows only."""
    return df[df["metric"] != STATUS_METRIC] if "metric" in df else df


def run_hardware(df: pd.DataFrame, col: str = "provenance.hardware.class", default=UNKNOWN_HARDWARE) -> pd.Series:
    """``col`` of each row of ``df`` (passed through ``with_run_key``) as its run's measurement rows give it
    (``measurement_rows``); a run that has none keeps its own rows', ``default`` where they lack the field."""
    if col not in df:
        return pd.Series(default, index=df.index, dtype=object)
    m = measurement_rows(df).dropna(subset=[col])
    known = dict(zip(zip(*(m[c] for c in RUN_KEY)), m[col]))
    keys = zip(*(df[c] for c in RUN_KEY))
    got = (known.get(k, v) for k, v in zip(keys, df[col]))
    return pd.Series([default if missing(v) else v for v in got], index=df.index, dtype=object)


def timed_rows(df: pd.DataFrame) -> pd.DataFrame:
    """The rows of runs no measuring tool changed: not those tagged ``instrumented`` (``sweep --instructions`` runs
    under callgrind, whose times, memory and losses are not a training run's)."""
    if "instrumented" not in df:
        return df
    return df[~df["instrumented"].fillna("").astype(bool)]


RECORD_COLUMNS = {
    "system": "config.system",
    "stage": "config.zero.stage",
    "dp": "config.dp",
    "tp": "config.tp",
    "precision": "config.zero.precision",
    "preset": "config.preset",
    "layers": "config.model.layers",
    "hidden": "config.model.hidden",
    "suite": "suite",
    "hardware": "provenance.hardware.class",
    "device": "provenance.hardware.device",
    "torch": "provenance.torch_version",
    "offload": "config.zero.offload_optimizer",
    "ckpt": "config.activation.checkpoint",
    "pa": "config.activation.partition",
    "pa_cpu": "config.activation.cpu_offload",
    "md": "config.activation.contiguous",
    "grad_accum": "config.zero.grad_accum_steps",
}
"""A record's configuration and provenance columns, from its first row's fields."""
RECORD_KEY = ("config_hash", "provenance.hardware.class", "provenance.hardware.device", "provenance.torch_version")
"""What sets records apart (with the code version and the kernels' paths): a processor or torch of their own makes
runs records of their own, their times being that machine's and build's."""


def runs_table(df: pd.DataFrame) -> pd.DataFrame:
    """One row per configuration, hardware class, processor (``device``), torch version and code version
    (``RECORD_KEY``): configuration columns and the median (and spread) of each metric over the runs that count
    (``counted_rows``; each run a (rows file, run id), so the same suite swept in two directories gives two repeats),
    runs under a measuring tool left out (``timed_rows``)."""
    df = counted_rows(with_run_key(timed_rows(df)))
    broken = non_finite_runs(df)  # named by run_statuses, not drawn: a NaN is no median, an inf no ratio
    if broken:
        df = df[[k not in broken for k in zip(*(df[c] for c in RUN_KEY))]]
    df = measurement_rows(df)  # a status row's provenance is its recorder's machine, not the run's
    df = df[
        (df["status"].fillna("ok") == "ok")
        & ~df["metric"].str.startswith("peer_")
        & ~df["metric"].isin(["max_params", "max_layers"])
    ]
    if "rank" in df:
        df = df[df["rank"].isna() | (df["rank"] == 0)]
    records, flats = [], []
    if "provenance.commit" in df:  # the code measured: a dirty tree's runs are not their commit's (nor another's)
        df = df.assign(code=[code_of(r) for r in df.filter(like="provenance.").to_dict("records")])
    df = with_kernels(df)
    by = [c for c in (*RECORD_KEY, "code", "kernels") if c in df]
    config_cols = [c for c in df.columns if c.startswith("config.")]
    for keys, g in df.groupby(by, dropna=False):
        first = g.iloc[0]
        rec = {"config_hash": keys[0], "repeats": len(g.groupby(["rows_file", "run_id"]))}
        for name, col in RECORD_COLUMNS.items():
            rec[name] = first.get(col) if col in g else None
        code = first.get("code")
        rec["code"] = None if missing(code) else code
        rec["commit"] = None if missing(code) else short_version(code, 7)
        flat = {c.removeprefix("config."): first[c] for c in config_cols if not missing(first[c])}
        if not missing(first.get("kernels")):  # what "auto" resolved to: runs of two paths are two workloads
            flat["kernels_ran"] = first["kernels"]
        rec["workload"] = workload(flat, without=("zero.stage", *RUN_LENGTH))  # what a stage-0 baseline shares
        rec["length"] = json.dumps({k: comparable(flat).get(k) for k in RUN_LENGTH}, default=str)  # and may not
        rec["scaling"] = workload(flat, without=("zero.stage", "dp", *RUN_LENGTH))  # what a weak-scaling line shares
        rec["sized"] = workload(comparable(flat), without=UNSIZED)  # what a max-size search of it shares
        flats.append(flat)
        if missing(rec["hardware"]):  # rows without hardware provenance: a class of their own, named so
            rec["hardware"] = UNKNOWN_HARDWARE
        if g["metric"].isin(RUN_METRICS).any():
            _check_layout(first["run_id"], rec)
        rec["world"] = (rec["dp"] or 1) * (rec["tp"] or 1) if rec["dp"] == rec["dp"] else None
        if rec["offload"] is None or rec["offload"] != rec["offload"]:
            rec["offload"] = "none"
        rec["paper_config"] = paper_config(rec["stage"], rec["ckpt"], rec["pa"], rec["pa_cpu"], rec["md"])
        for m in RUN_METRICS:
            vals = g[g["metric"] == m]["value"].dropna()
            if len(vals):
                per_run = g[g["metric"] == m].groupby(["rows_file", "run_id"])["value"].last()
                rec[m] = float(per_run.median())
                rec[m + "_spread"] = float(per_run.max() - per_run.min())
        records.append(rec)
    _name_variants(records, flats)
    return pd.DataFrame(records)


RUN_LENGTH = ("steps", "warmup_steps", "seed")
"""Config paths that change how long a run measures, not what a step computes: runs differing only in them are
the same workload to the report (a longer stage-0 run is still the baseline), and records of two lengths are named
by them (``variant``)."""
UNSIZED = ("zero.stage", "model.layers", *RUN_LENGTH, "memory_budget_bytes", "track_memory", "profile")
"""Config paths in which a training run and the ``zerobench maxsize`` search that sizes it may differ: the stage
(each stage's searches are compared), the depth (what a search varies), the run's length (a probe runs from the first
step), the budget (a search's own), the live-tensor tracker (on in every probe) and the profiler's output."""
LABELLED = (
    "system",
    "zero.stage",
    "dp",
    "tp",
    "preset",
    "model.layers",
    "model.hidden",
    "zero.precision",
    "zero.offload_optimizer",
)
"""Config paths every figure's label already shows."""
SHOWN = ("hardware", "system", "stage", "dp", "tp", "preset", "layers", "hidden", "precision", "offload")
"""The same, as the record's columns (offload normalised: rows of before the field read ``none``)."""


def _name_variants(records: list[dict], flats: list[dict]) -> None:
    """Set each record's ``variant``: what sets it apart from the other records its figures would draw under the same
    label (same system, stage, DP, TP, model, precision, offload and hardware class): the config paths that differ
    (the run's length too: two stage-0 runs of one workload may be of two lengths, ``comparison._baseline``),
    the processor and torch version where they were measured on several (``device=``, ``torch=``), and the commit
    where at several. Empty where nothing does."""
    for r in records:
        r["variant"] = ""
    groups: dict[tuple, list[int]] = {}
    for i, r in enumerate(records):
        if missing(r["system"]):
            continue  # not a training run's record (a simulator's validation, a peers summary)
        groups.setdefault(tuple(json.dumps(_plain(r[k]), default=str) for k in SHOWN), []).append(i)
    for idx in groups.values():
        if len(idx) < 2:
            continue
        texts = differences([flats[i] for i in idx], shown=LABELLED)
        apart = [k for k in ("device", "torch", "commit") if len({_plain(records[i][k]) for i in idx}) > 1]
        for i, text in zip(idx, texts):
            tags = [("@" if k == "commit" else f"{k}=") + str(records[i][k]) for k in apart if _plain(records[i][k])]
            records[i]["variant"] = ", ".join(x for x in (text, *tags) if x)


def code_of(prov: dict) -> str | None:
    """``code_version`` of a row's flattened provenance."""
    flat = {k.removeprefix("provenance."): (None if missing(v) else v) for k, v in prov.items()}
    return code_version(flat)


def _plain(v):
    return None if missing(v) else v


def losses_table(df: pd.DataFrame) -> pd.DataFrame:
    """Per-step losses of the runs that count (``counted_rows``), runs under a measuring tool left out. ``run`` names
    a run (``RUN_KEY``) for a legend: its run id, and where that id names more than one run (two directories, or two
    configurations under one id), the directory it was read from and its config hash's first 8 characters too, so
    two runs are never drawn as one."""
    df = counted_rows(with_run_key(timed_rows(df)))
    loss = df[(df["metric"] == "loss") & (df["status"].fillna("ok") == "ok")]
    cols = ["run_id", "step", "value", "config.zero.stage", "config.dp", "provenance.hardware.class"]
    out = loss[[c for c in cols if c in loss]].rename(columns={"config.zero.stage": "stage", "config.dp": "dp"})
    labels = run_labels(loss)
    return out.assign(run=[labels[k] for k in zip(*(loss[c] for c in RUN_KEY))])


def run_labels(df: pd.DataFrame) -> dict[tuple, str]:
    """``RUN_KEY`` -> a short name that no other run in ``df`` has: the run id, and where that id is shared, the
    directory and config hash prefix too (the whole rows file and hash if those still collide)."""
    runs = set(zip(*(df[c] for c in RUN_KEY)))
    ids = Counter(str(r[1]) for r in runs)
    labels = {
        r: str(r[1]) if ids[str(r[1])] == 1 else f"{r[1]} ({Path(str(r[0])).parent.name or '?'} {str(r[2])[:8]})"
        for r in runs
    }
    taken = Counter(labels.values())
    if len(taken) < len(labels):
        labels = {r: lab if taken[lab] == 1 else f"{r[1]} ({r[0]} {r[2]})" for r, lab in labels.items()}
    return labels


def sim_validation_table(df: pd.DataFrame) -> pd.DataFrame:
    """``zerobench simulate --validate --out`` rows: predicted vs measured step time per run, the prediction's
    interval and whether the measured step is inside it where the profile carried spreads, and peak memory where
    the profile had memory entries (a GPU's)."""
    d = df[df["metric"] == "sim_step_time_ratio"] if "metric" in df else df.iloc[0:0]
    if d.empty:
        return pd.DataFrame()
    # one validation is one config hash (its profile and measured runs): several in one report stay apart
    key = ["config_hash", "measured_run"]
    pred = df[df["metric"] == "sim_predicted_step_time_s"].set_index(key)["value"]
    keys = list(zip(d["config_hash"], d["measured_run"]))
    t = pd.DataFrame(
        {
            "run": d["measured_run"].values,
            "stage": d["stage"].astype(int).values,
            "dp": d["dp"].astype(int).values,
            "tp": d["tp"].astype(int).values,
            "hidden": d["hidden"].astype(int).values,
            "predicted_ms": [1e3 * pred.get(k, float("nan")) for k in keys],
            "measured_ms": 1e3 * d["measured_s"].values,
            "ratio": d["value"].values,
            "in_fit": d["in_fit"].astype(bool).values,
            "device": d["profile_device"].values,
        }
    )
    if "inside" in d.columns and d["inside"].notna().all():  # a profile with spreads: the prediction's interval
        t["predicted_low_ms"] = 1e3 * d["predicted_low_s"].values
        t["predicted_high_ms"] = 1e3 * d["predicted_high_s"].values
        t["inside"] = d["inside"].astype(bool).values
    mem = df[df["metric"] == "sim_peak_memory_ratio"]
    if not mem.empty:  # a GPU profile's memory planner: predicted vs max_memory_allocated
        ratio = mem.set_index(key)
        got = [k in ratio.index for k in keys]
        t["predicted_peak_MiB"] = [
            round(ratio.loc[k, "value"] * ratio.loc[k, "measured_peak_bytes"] / 2**20) if g else float("nan")
            for k, g in zip(keys, got)
        ]
        t["measured_peak_MiB"] = [
            round(ratio.loc[k, "measured_peak_bytes"] / 2**20) if g else float("nan") for k, g in zip(keys, got)
        ]
        t["memory_ratio"] = [ratio.loc[k, "value"] if g else float("nan") for k, g in zip(keys, got)]
    return t.sort_values(["device", "hidden", "dp", "tp", "stage"]).reset_index(drop=True)
