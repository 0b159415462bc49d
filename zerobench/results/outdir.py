"""Where a run's rows go, checked before anything runs: a directory that can be written and holds no
other run's rows (two runs in one ``rows.jsonl`` would read as one run in ``results show`` and reports), and
names (run ids, suite names) that stay one directory inside ``runs/``. (``results/lock.py``: one writer.)"""

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


NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-+=,@")
NAME_MAX = 200


def check_name(name: object, what: str, fix: str) -> str:
    """``name`` (a run id, a suite name) as one directory name under ``runs/``, or a one-line ``ConfigError``
    ending in ``fix``: no path separator (nor an absolute path), no leading '.' (nor '..'), letters, digits and
    ``. _ - + = , @`` only, so that results written under a default directory stay inside ``runs/``. (An explicit
    ``--out`` may be anywhere.)"""
    if not isinstance(name, str) or not name:
        raise ConfigError(f"{what} must be a non-empty name, got {name!r}{fix}")
    bad = next((c for c in name if c not in NAME_CHARS), None)
    if "/" in name or "\\" in name:
        why = "is a path (it holds a separator)"
    elif name.startswith("."):
        why = "starts with '.' (a hidden directory, or one outside runs/)"
    elif bad is not None:
        why = f"holds {bad!r} (a name is letters, digits and . _ - + = , @)"
    elif len(name) > NAME_MAX:
        why = f"is longer than {NAME_MAX} characters"
    else:
        return name
    raise ConfigError(f"{what} {name[:NAME_MAX]!r} {why}{fix}")
