"""What a run computes, as one comparable key: its resolved config without the keys that do not change a step.

Readers that pair runs (the regression gate's timing reference, the report's baseline-DP-vs-ZeRO table and its
figures) must pair runs that differ only where they mean to: a stage-0 run of another micro-batch, vocabulary,
checkpointing or kernel choice is not the baseline of a ZeRO run, and two such runs drawn under one label are not
one measurement. ``workload`` is that identity; ``differences`` names what sets apart runs that share a label.
"""

from __future__ import annotations

import json
import math
from typing import TYPE_CHECKING

from zerobench.results.status import RUN_KEY

if TYPE_CHECKING:
    import pandas as pd

NOT_WORKLOAD = ("system", "preset", "tensorboard_dir", "collective_timeout_s")
"""Config keys that do not change what a step computes: the system's name (compared runs say which system they
are apart), the preset's name (its shape is in ``model``), where TensorBoard writes, how long a collective may
wait."""


def flatten(config: dict, prefix: str = "") -> dict[str, object]:
    """``{"zero": {"stage": 2}}`` -> ``{"zero.stage": 2}`` (lists and scalars are leaves)."""
    out: dict[str, object] = {}
    for k, v in config.items():
        path = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(flatten(v, path + "."))
        else:
            out[path] = v
    return out


def _leaf(v):
    if isinstance(v, float) and math.isnan(v):
        return None
    return v.tolist() if hasattr(v, "tolist") else v


def workload(flat: dict[str, object], without: tuple[str, ...] = ("zero.stage",)) -> str:
    """The key of a flattened config (``flatten``): every path but ``NOT_WORKLOAD``'s and ``without``, missing
    values (None, NaN) left out, as sorted JSON."""
    keep = {
        k: _leaf(v)
        for k, v in flat.items()
        if k.split(".")[0] not in NOT_WORKLOAD and k not in without and _leaf(v) is not None
    }
    return json.dumps(keep, sort_keys=True, default=str)


def differences(flats: list[dict[str, object]], shown: tuple[str, ...] = ()) -> list[str]:
    """For configs that share a label, one short text per config naming what sets it apart from the others:
    ``micro_batch=8, model.vocab=16384`` (the paths whose values differ among them, ``shown`` and
    ``NOT_WORKLOAD`` left out); ``""`` where nothing does."""
    keys = sorted({k for f in flats for k in f} - set(shown))
    varying = []
    for k in keys:
        if k.split(".")[0] in NOT_WORKLOAD:
            continue
        values = [_leaf(f.get(k)) for f in flats]
        if None in values:  # a key some configs lack (written before it existed) sets none apart
            continue
        if len({json.dumps(v, default=str) for v in values}) > 1:
            varying.append(k)
    return [", ".join(f"{k}={_short(f.get(k))}" for k in varying) for f in flats]


def _short(v) -> str:
    v = _leaf(v)
    return str(int(v)) if isinstance(v, float) and v.is_integer() else str(v)


def kernels_text(row) -> str | None:
    """A row's ``kernels_ran`` (the paths its run's kernels took, flattened as ``kernels_ran.<part>`` columns) as
    ``model=fused, optimizer=fused``; None where it has none (rows of before runs recorded them)."""
    parts = sorted(
        (str(k)[12:], v) for k, v in row.items() if str(k).startswith("kernels_ran.") and _leaf(v) is not None
    )
    return ", ".join(f"{part}={v}" for part, v in parts) or None


def with_kernels(df: pd.DataFrame) -> pd.DataFrame:
    """``kernels``: each run's ``kernels_text`` on every row of it (its status row, written by whoever recorded the
    run's end, carries none)."""
    cols = [c for c in df.columns if str(c).startswith("kernels_ran.")]
    if not cols or df.empty:
        return df
    text = [kernels_text(dict(zip(cols, vals))) for vals in zip(*(df[c] for c in cols))]
    keys = list(zip(*(df[c] for c in RUN_KEY)))
    per_run: dict = {}
    for k, t in zip(keys, text):
        if t is not None:
            per_run.setdefault(k, t)
    return df.assign(kernels=[per_run.get(k) for k in keys])


def comparable(flat: dict) -> dict:
    """A flattened config with its integral floats as integers (a rows column with a gap reads its integers as
    floats) and numpy scalars as Python's: two readings of one config give one ``workload`` key."""
    out = {}
    for k, raw in flat.items():
        v = raw.item() if hasattr(raw, "item") else raw
        out[k] = int(v) if isinstance(v, float) and v.is_integer() else v
    return out
