"""Where a run's rows go, checked before anything runs: a directory that can be written and holds no
other run's rows (two runs in one ``rows.jsonl`` would read as one run in ``results show`` and reports)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from zerobench.config import ConfigError
from zerobench.results.rows import ROWS_FILE


def check_writable_dir(path: Path, flag: str = "--out") -> None:
    """Create ``path`` if needed and prove a file can be written there, or raise a one-line ConfigError."""
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file: give a directory for the results")
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, probe = tempfile.mkstemp(prefix=".zerobench-probe-", dir=path)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise ConfigError(f"cannot write results to {flag} {path}: {e.strerror}: choose a writable directory") from None


def check_fresh_run_dir(path: Path, flag: str = "--out") -> None:
    """``check_writable_dir``, and refuse a directory that already holds a run's rows."""
    check_writable_dir(path, flag)
    rows = path / ROWS_FILE
    if rows.exists() and rows.stat().st_size:
        raise ConfigError(
            f"{flag} {path} already holds result rows ({rows}): give each run its own directory "
            "(omit --out for runs/<run id>) or remove the old rows"
        )
