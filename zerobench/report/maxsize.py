"""``zerobench maxsize`` rows as the report draws them: one record per search configuration, and the searches that
size a training run.

A search is what its answer depends on: the configuration its probes ran (resolved to the ``TrainConfig``, the depth
aside), its budget, its hardware class and its code version. Records that a figure would draw under one label
(budget, model, precision, DP, TP, hardware) are named by what sets them apart (``label``), never averaged into one
bar; repeats of one search (searched twice, into one ``--out`` or several) are one record. A training run takes its
largest model only from searches of its own workload (``sized``), hardware and code: a search of another micro-batch,
with 8-bit moments, or of another commit answers another question.
"""

from __future__ import annotations

import json
import sys
import typing

import pandas as pd

from zerobench.bench.spec import FIELDS, RENAMED, RunSpec, to_train_config
from zerobench.config import ConfigError, parse_bytes, to_dict
from zerobench.report.aggregate import UNKNOWN_HARDWARE, UNSIZED, code_of, missing, paper_config
from zerobench.results.provenance import short_version
from zerobench.results.status import RUN_KEY, with_run_key
from zerobench.results.workload import comparable, differences, flatten, kernels_text, workload

BARS = ("zero.offload_optimizer", "zero.offload_param", "zero.nvme_path")
"""Config paths Fig 4 draws as bars of one setting, beside the stage."""
SPEC_ONLY = ("stage", "layers", "offload_optimizer", "offload_param", "nvme_path", "steps", "warmup", "budget")
"""The same, and ``UNSIZED``'s, as a search's own (``RunSpec``) keys: for rows whose configuration does not resolve."""
SHOWN = ("budget", "preset", "precision", "dp", "tp", "hardware")
"""What a setting's label shows, before what sets it apart."""


def maxsize_table(df: pd.DataFrame) -> pd.DataFrame:
    """One record per search: its stage, offload, budget and hardware, its answer (``max_layers``, ``max_params``,
    ``at_least`` where the search's limit itself fit), ``repeats`` (how many searches of it the rows hold), its code
    version (``code``, ``commit``), ``setting`` and ``sized`` (the keys of what Fig 4 draws as one setting and of the
    training runs it sizes) and ``label`` (the setting, named apart from others under the same label)."""
    d = df[df["metric"].isin(["max_params", "max_layers"])] if "metric" in df else df.iloc[0:0]
    if d.empty:
        return pd.DataFrame()
    found = []
    # a search is its rows file's (run id, config hash) and the pair of rows it wrote: run ids repeat across searches
    # and directories, one search's answer must not be completed by another's, and a search repeated into one --out
    # writes its pair again
    for (_, run, _), g in with_run_key(d).groupby(RUN_KEY, sort=False):
        found += [_search(run, layers, params) for layers, params in _answers(run, g)]
    table = _repeats_as_one(pd.DataFrame(found))
    return _labelled(table)


def _answers(run, g: pd.DataFrame) -> list[tuple[pd.Series, pd.Series]]:
    """(max_layers row, max_params row) of each search of ``g``, in the order written (each search writes its layers,
    then its parameters); a row without its pair (the search stopped while writing its answer) is named and left
    out."""
    pairs, layers = [], None
    for _, row in g.iterrows():
        if row["metric"] == "max_layers":
            if layers is not None:
                _unpaired(run, "max_params")
            layers = row
        elif layers is None:
            _unpaired(run, "max_layers")
        else:
            pairs.append((layers, row))
            layers = None
    if layers is not None:
        _unpaired(run, "max_params")
    return pairs


def _unpaired(run, lacking: str) -> None:
    print(
        f"zerobench: warning: maxsize search {run} lacks its {lacking} row (it stopped while writing its answer): "
        "left out of the table",
        file=sys.stderr,
    )


def _search(run, layers: pd.Series, params: pd.Series) -> dict:
    """One search's record from its two answer rows."""

    def col(name, default=None):
        v = params.get(f"config.{name}", default)
        return default if missing(v) else v

    resolved = _resolved(params)
    kernels = kernels_text(params)
    if resolved is not None and kernels is not None:  # the path its probes' kernels took, as a run records it
        resolved["kernels_ran"] = kernels
    prov = {k: v for k, v in params.items() if str(k).startswith("provenance.")}
    offload = col("offload_optimizer", "none")
    hardware = params.get("provenance.hardware.class")
    return {
        "run_id": run,
        "stage": int(col("stage", 0)),
        "dp": int(col("dp", 1) or 1),
        "tp": int(col("tp", 1) or 1),
        "preset": col("preset"),
        "precision": col("precision", "fp32"),
        "budget": col("budget"),
        "offload": offload + ("+param" if col("offload_param", "none") != "none" else ""),
        "paper_config": paper_config(
            col("stage", 0), col("checkpoint_activations") or col("pa"), col("pa"), col("pa_cpu"), col("md")
        ),
        "hardware": UNKNOWN_HARDWARE if missing(hardware) else hardware,
        "device": params.get("provenance.hardware.device"),
        "code": code_of(prov),
        "max_params": float(params["value"]),
        "max_layers": float(layers["value"]),
        "at_least": params.get("bound") == "at least",  # the search's limit fitted: the largest is beyond it
        "config": resolved,
        "setting": workload(resolved, without=(*UNSIZED, *BARS)) if resolved else _raw_setting(params),
        "sized": workload(resolved, without=UNSIZED) if resolved else None,
    }


def _resolved(row: pd.Series) -> dict | None:
    """The flattened ``TrainConfig`` a search's probes ran (at one layer: the depth is what it varies), from its
    rows' ``RunSpec`` fields; None where they name a field this version does not know (a later version's rows, or
    edited ones), which then size no training run."""
    hints = typing.get_type_hints(RunSpec)
    fields = {}
    for col, raw in row.items():
        if not str(col).startswith("config.") or missing(raw):
            continue
        key = RENAMED.get(col[7:], col[7:])
        if key == "budget":
            continue
        if key not in FIELDS:
            return None
        v = raw.item() if hasattr(raw, "item") else raw
        types = (hints[key], *typing.get_args(hints[key]))
        integral = isinstance(v, float) and v.is_integer() and int in types and float not in types
        fields[key] = int(v) if integral else v  # a column with a gap reads its integers as floats
    try:
        cfg = to_train_config(RunSpec(**{**fields, "layers": 1, "memory_budget": None}), check_system=False)
    except (ConfigError, TypeError, ValueError):
        return None
    return comparable(flatten(to_dict(cfg)))


def _raw_setting(row: pd.Series) -> str:
    """The setting of a search whose configuration does not resolve: its own keys, as written."""
    keep = {
        str(c)[7:]: v
        for c, v in row.items()
        if str(c).startswith("config.") and not missing(v) and str(c)[7:] not in SPEC_ONLY
    }
    return json.dumps(comparable(keep), sort_keys=True, default=str)


def _repeats_as_one(found: pd.DataFrame) -> pd.DataFrame:
    """One record per (setting, budget, stage, offload, hardware, code): where some repeat found the edge, the median
    of those that did (a capped repeat's bound says less); else the best lower bound, ``at_least``."""
    found = found.assign(budget_bytes=[None if missing(b) else int(parse_bytes(b)) for b in found["budget"]])
    keys = ["setting", "budget_bytes", "stage", "offload", "hardware", "code"]
    out = []
    for _, g in found.groupby(keys, sort=False, dropna=False):
        exact = g[~g["at_least"]]
        rec = g.iloc[-1].to_dict()
        if len(exact):
            rec.update(max_params=float(exact["max_params"].median()), max_layers=float(exact["max_layers"].median()))
            rec["spread"] = float(exact["max_params"].max() - exact["max_params"].min())
            rec["at_least"] = False
        else:
            best = g.loc[g["max_params"].idxmax()]
            rec.update(max_params=float(best["max_params"]), max_layers=float(best["max_layers"]), spread=0.0)
        rec["repeats"] = len(g)
        out.append(rec)
    return pd.DataFrame(out)


def _labelled(table: pd.DataFrame) -> pd.DataFrame:
    """``commit`` and ``label``: ``4MiB budget, tiny bf16, DP 2 TP 1 [cpu-2core]``, and where other settings share
    that label, what sets this one apart (config paths, and the commit where they were measured at several)."""
    table = table.assign(
        commit=[None if missing(c) else short_version(c, 7) for c in table["code"]],
        label=[
            f"{b} budget, {p} {pr}, DP {dp} TP {tp} [{hw}]"
            for b, p, pr, dp, tp, hw in zip(*(table[c] for c in SHOWN), strict=True)
        ],
        apart=[
            json.dumps([s, b, c], default=str)
            for s, b, c in zip(table["setting"], table["budget_bytes"], table["code"])
        ],
    )
    named = {}
    for label, g in table.groupby("label", sort=False):
        settings = g.drop_duplicates("apart")
        if len(settings) < 2:
            continue
        flats = [c if isinstance(c, dict) else {} for c in settings["config"]]
        texts = differences(flats, shown=(*UNSIZED, *BARS, "zero.precision", "dp", "tp"))
        several = settings["code"].nunique(dropna=False) > 1
        for apart, commit, text in zip(settings["apart"], settings["commit"], texts, strict=True):
            at = f"@{commit}" if several and commit else ""
            named[label, apart] = ", ".join(x for x in (text, at) if x)
    table["label"] = [
        f"{label}, {named[label, apart]}" if named.get((label, apart)) else label
        for label, apart in zip(table["label"], table["apart"])
    ]
    return table.drop(columns=["config", "apart"])


def sizes_for(maxsize: pd.DataFrame | None, r: pd.Series, b: pd.Series) -> dict:
    """The max-model columns of the comparison row of run ``r`` (``b``: its stage-0 baseline, None where it has no
    single one: no ratio): from the searches of
    their workload (``sized``), stage, hardware and code, at the one budget ``r``'s were searched in (several: which
    one the row means is not said, so none). ``max_model_bound`` is "at least" where ``r``'s search found no edge;
    ``vs_DP_max_model_bound`` says which way a capped search bounds the ratio (both capped: no ratio)."""
    nan = float("nan")
    none = {
        "max_model_budget": None,
        "max_model_M_params": nan,
        "max_model_bound": "",
        "vs_DP_max_model": nan,
        "vs_DP_max_model_bound": "",
    }
    if maxsize is None or maxsize.empty or missing(r.get("sized")):
        return none

    def found(x) -> pd.DataFrame:
        return maxsize[
            (maxsize["sized"] == x["sized"])
            & (maxsize["stage"] == x["stage"])
            & (maxsize["hardware"] == x["hardware"])
            & (maxsize["code"] == x.get("code"))
        ]

    mine, theirs = found(r), found(b) if b is not None else maxsize.iloc[0:0]
    if mine["budget_bytes"].nunique(dropna=False) != 1:
        return none
    m = mine.iloc[0]
    at = theirs[theirs["budget_bytes"] == m["budget_bytes"]]
    out = {**none, "max_model_budget": m["budget"], "max_model_M_params": m["max_params"] / 1e6}
    out["max_model_bound"] = "at least" if m["at_least"] else ""
    if len(at) and at.iloc[0]["max_params"]:
        base = at.iloc[0]
        if not (m["at_least"] and base["at_least"]):
            out["vs_DP_max_model"] = m["max_params"] / base["max_params"]
            out["vs_DP_max_model_bound"] = "at least" if m["at_least"] else "at most" if base["at_least"] else ""
    return out
