"""Append-only JSON Lines result rows, long format: one row per (run, metric[, step][, rank]).

Every row carries ``metric``, ``value``, ``unit``, ``status``, the run id, the resolved config and its
hash, and provenance. Each row is written with a single ``write`` on an ``O_APPEND`` descriptor and
flushed, so a killed run never leaves a half-written earlier row.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from zerobench.config import config_hash, to_dict
from zerobench.results.provenance import provenance

ROWS_FILE = "rows.jsonl"
OUTPUT_ONLY_KEYS = ("tensorboard_dir",)
"""Config fields that say where output goes, not what runs: kept in rows, left out of the hash."""


def run_hash(config: Any) -> str:
    """The hash that identifies a run's configuration (``--resume`` and the regression gate key on it)."""
    cfg = to_dict(config)
    if isinstance(cfg, dict):
        cfg = {k: v for k, v in cfg.items() if k not in OUTPUT_ONLY_KEYS}
    return config_hash(cfg)


class RowWriter:
    """Writes rows for one run into ``out_dir/rows.jsonl``."""

    def __init__(self, out_dir: str | os.PathLike, run_id: str, config: Any, suite: str | None = None):
        self.path = Path(out_dir) / ROWS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        cfg = to_dict(config)
        self.base = {
            "suite": suite,
            "run_id": run_id,
            "config": cfg,
            "config_hash": run_hash(cfg),
            "provenance": provenance(),
        }

    def write(self, metric: str, value: float | None, unit: str, status: str = "ok", **extra: Any) -> None:
        row = {"metric": metric, "value": value, "unit": unit, "status": status, **extra, **self.base}
        line = (json.dumps(row, sort_keys=True, default=str) + "\n").encode()
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)


def read_rows(path: str | os.PathLike) -> list[dict]:
    """Rows from a rows file or every ``rows.jsonl`` under a directory."""
    p = Path(path)
    files = sorted(p.rglob(ROWS_FILE)) if p.is_dir() else [p]
    rows = []
    for f in files:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as e:
                    raise ValueError(f"{f}:{n}: not a JSON row ({e.msg})") from None
    return rows
