"""Results as data: one JSON row per (run, metric) with provenance; ``load`` gives a pandas DataFrame."""

from __future__ import annotations

import math
import os
from pathlib import Path


def load(path: str | os.PathLike):
    """All rows under ``path`` (a rows file or a directory searched recursively) as a DataFrame.

    Columns: the row's own fields (metric, value, unit, status, run_id, suite, step, rank, ...), the resolved
    config flattened as ``config.<key>`` (e.g. ``config.zero.stage``), ``provenance.<key>``, and ``rows_file``: the
    file a row was read from, which tells apart runs of the same id in different directories (``RUN_KEY``), and
    ``value_nan``: True where the row's value is a NaN, not a null.
    Raises ``ValueError`` with one line when there is nothing to load, or when a training run's figure is there twice
    (``results.status.measured_twice``): each reader would keep one of the two without a word.
    """
    import pandas as pd

    from zerobench.results.rows import read_rows

    p = Path(path)
    if not p.exists():
        raise ValueError(f"no results at {p}: run a sweep first (zerobench sweep SUITE --out {p})")
    rows = read_rows(p, source=True)  # raises ValueError naming the file and line for a malformed row
    if not rows:
        raise ValueError(f"no result rows under {p} (empty or no rows.jsonl files)")
    from zerobench.results.status import measured_twice

    for r in rows:  # a NaN measured and a null (not measured) are both NaN once in a frame: marked while they differ
        v = r.get("value")
        if isinstance(v, float) and math.isnan(v):
            r["value_nan"] = True
    df = pd.json_normalize(rows, sep=".")
    twice = measured_twice(df)
    if twice:
        raise ValueError(twice)
    return df
