"""Append-only JSON Lines result rows, long format: one row per (run, metric[, step][, rank]).

Every row carries ``metric``, ``value``, ``unit``, ``status``, the run id, the resolved config and its
hash, provenance and the rows format (``schema``; ``results/status.py`` says what it tells a reader of a run
without a status row). A row is written whole or not at all: appended on an ``O_APPEND`` descriptor,
short writes continued, fsynced; if the disk fills (or any write fails) the file is cut back to where
the row began and ``RowWriteError`` says so in one line. Readers skip a torn last line (a writer killed
mid-row) with a warning, and refuse a file whose other lines are not rows, or rows without a field every reader
takes as given (``REQUIRED``); the next append cuts that line off
first, with a warning, so a status row written after a killed rank's fragment is a row of its own.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from zerobench.config import ConfigError, RunFailed, config_hash, to_dict
from zerobench.files import fsync_dir
from zerobench.results.provenance import provenance
from zerobench.results.status import SCHEMA

ROWS_FILE = "rows.jsonl"
OUTPUT_ONLY_KEYS = ("tensorboard_dir", "profile")
"""Config fields that say where output goes, not what runs: kept in rows, left out of the hash. A profiled run's
traced steps are left out of its timing medians, so its step times are those of the run unprofiled (its peak RSS
includes the profiler's host buffers)."""


def run_hash(config: Any) -> str:
    """The hash that identifies a run's configuration (``--resume`` and the regression gate key on it)."""
    cfg = to_dict(config)
    if isinstance(cfg, dict):
        cfg = {k: v for k, v in cfg.items() if k not in OUTPUT_ONLY_KEYS}
    return config_hash(cfg)


class RowWriter:
    """Writes rows for one run into ``out_dir/rows.jsonl``."""

    def __init__(
        self,
        out_dir: str | os.PathLike,
        run_id: str,
        config: Any,
        suite: str | None = None,
        hardware: dict | None = None,
        tags: dict[str, Any] | None = None,
    ):
        """``hardware``: where the figures were measured, when that is not where this process runs (a summary
        computed from another machine's rows); by default this machine's. ``tags``: fields every row of this
        writer carries (``instrumented``: the run ran under a tool that changes its timings, e.g. callgrind)."""
        self.path = Path(out_dir) / ROWS_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        cfg = to_dict(config)
        prov = provenance()
        if hardware is not None:
            prov = {**prov, "hardware": hardware}
        self.base = {
            "schema": SCHEMA,
            "suite": suite,
            "run_id": run_id,
            "config": cfg,
            "config_hash": run_hash(cfg),
            "provenance": prov,
            **(tags or {}),
        }

    def write(
        self, metric: str, value: float | None, unit: str, status: str = "ok", once: bool = False, **extra: Any
    ) -> bool:
        """Append one row; ``once``: unless the file already holds this run's row of ``metric``, checked under the
        file's lock, so that of two ranks recording one run's end only the first writes (whether it did: the
        return value)."""
        row = {"metric": metric, "value": value, "unit": unit, "status": status, **extra, **self.base}
        data = (json.dumps(row, sort_keys=True, default=str) + "\n").encode()
        return append_whole(self.path, data, skip_if=_holds(self.base["run_id"], metric) if once else None)


def _holds(run_id: str, metric: str):
    """Whether rows (a file's bytes) hold a row of ``run_id``'s ``metric`` (a torn or foreign line is skipped)."""

    def check(data: bytes) -> bool:
        for line in data.decode(errors="replace").splitlines():
            with contextlib.suppress(ValueError):
                r = json.loads(line)
                if isinstance(r, dict) and r.get("run_id") == run_id and r.get("metric") == metric:
                    return True
        return False

    return check


def partial_path(path: Path) -> Path:
    """Where ``written_whole`` stages the rows of ``path`` (a rows file): hidden, and not named ``rows.jsonl``, so
    no reader takes it for results."""
    return path.parent / f".{path.name}.partial"


@contextlib.contextmanager
def written_whole(writer: RowWriter):
    """Rows ``writer`` writes inside the block appear in its rows file all at once when the block ends, or not at
    all: for a result that is one unit (a profile), of which a part would read as the whole. They are appended to
    ``partial_path`` and renamed into place; a block that raises (a kill, a full disk) leaves only that file."""
    final = writer.path
    if final.exists() and final.stat().st_size:
        raise ConfigError(f"{final} already holds rows: give a new directory")
    staged = partial_path(final)
    staged.unlink(missing_ok=True)
    writer.path = staged
    try:
        yield writer
    finally:
        writer.path = final
    if staged.exists():  # a block that wrote no row leaves no file
        os.replace(staged, final)
    fsync_dir(final.parent)


class RowWriteError(RunFailed):
    """A row could not be written (disk full, file system gone); nothing of it was left behind."""


TORN_SETTLE_S = 1.0
"""How long a torn last row must stay unchanged before it is taken for a dead writer's and cut."""
TORN_WAIT_S = 30.0
"""The longest an appender waits for a torn last row to settle."""


def _tail_torn(fd: int, size: int) -> bool:
    return bool(size) and os.pread(fd, 1, size - 1) != b"\n"


def _cut_torn_tail(fd: int, path: Path) -> int:
    """The file's size once a torn last line (no newline: its writer died mid-row) is cut off, with a warning.
    Appending after it would glue the next row onto the fragment, a line that is neither, and the file would no
    longer read (``read_rows`` skips only a torn *last* line).

    A torn tail is cut only once it has stayed unchanged for ``TORN_SETTLE_S``. Under a lock every writer honours
    it would be a dead writer's at once, but on a shared file system the lock can be missing (``flock`` fails) or
    local to one node (NFS mounted ``nolock``, Lustre's ``localflock``), and then a rank on another node may be
    writing that row right now: it finishes within milliseconds, and the wait ends as its newline lands."""
    size = os.fstat(fd).st_size
    if not _tail_torn(fd, size):
        return size
    began = settled = time.monotonic()
    while time.monotonic() - settled < TORN_SETTLE_S and time.monotonic() - began < TORN_WAIT_S:
        time.sleep(0.05)
        now = os.fstat(fd).st_size
        if now != size:
            size, settled = now, time.monotonic()
            if not _tail_torn(fd, size):
                return size
    end, chunk = size, 1 << 16
    while end > 0:
        start = max(0, end - chunk)
        block = os.pread(fd, end - start, start)
        if (i := block.rfind(b"\n")) >= 0:
            end = start + i + 1
            break
        end = start
    os.ftruncate(fd, end)
    print(
        f"zerobench: warning: {path}: cut {size - end} byte(s) of a torn last row (its writer stopped mid-row) "
        "before appending",
        file=sys.stderr,
    )
    return end


def append_whole(path: Path, data: bytes, skip_if=None) -> bool:
    """Append ``data`` to ``path`` entirely, or leave the file as it was and raise ``RowWriteError``. Appenders
    take the file's lock (``flock``), so a row of another writer is never half there; a fragment a dead writer
    left is cut first (``_cut_torn_tail``). Where the file system has no lock, a failed write's fragment is left
    for the next appender to cut once it has settled: truncating it at once could cut rows other writers appended
    after it. ``skip_if(the file's bytes)``, read under the lock: True leaves the file as it is (returns False)."""
    try:
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
    except OSError as e:
        raise RowWriteError(f"cannot open {path} to write results: {e.strerror}") from None
    try:
        locked = True
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)  # released when fd closes, or when the process dies
        except OSError:  # a file system without locks: appends are still whole per writer
            locked = False
        try:
            start = _cut_torn_tail(fd, path)
            if skip_if is not None and skip_if(os.pread(fd, start, 0)):
                return False
        except OSError as e:
            raise RowWriteError(f"cannot write results to {path}: {e.strerror}") from None
        view = memoryview(data)
        try:
            while view:
                view = view[os.write(fd, view) :]
            os.fsync(fd)
        except OSError as e:
            if locked:  # unlocked, rows of other writers may follow: the fragment is left for the next appender
                with contextlib.suppress(OSError):
                    os.ftruncate(fd, start)
            raise RowWriteError(f"cannot write results to {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    return True


_WARNED_LINKS: set[str] = set()
"""Links ``files_below`` has warned about in this process."""


def _loops_or_leaves(d: str, inside: tuple[str, ...]) -> bool:
    """Whether ``d`` is a link to a directory that contains (or is) one of the real paths ``inside``."""
    if not os.path.islink(d):
        return False
    target = os.path.realpath(d)
    return any(p == target or p.startswith(target.rstrip(os.sep) + os.sep) for p in inside)


def files_below(root: str | os.PathLike, name: str = ROWS_FILE) -> list[Path]:
    """Every entry called ``name`` at or below the directory ``root`` (a directory of that name too: its reader says
    it cannot be read), sorted, symbolic links to directories followed: a results directory assembled from links to
    runs elsewhere (``Path.rglob`` skips them, so their rows were left out of reports and gates without a word). A
    directory reached twice (two links to it) is walked once, and an entry reached by two paths listed once, so no
    run's rows are read twice. A link back to a directory the walk is inside, or to one above ``root``, is not
    followed: it would loop, or take in rows outside the directory asked for."""
    tops = (os.path.realpath(root), os.path.abspath(root))  # the root as resolved, and as given (it may be a link)
    seen_dirs, seen_files, out = set(), set(), []
    for here, dirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(here)
        if real in seen_dirs:
            dirs[:] = []  # a second path to a directory walked already
            continue
        seen_dirs.add(real)
        inside = (real, os.path.abspath(here), *tops)
        for d in [d for d in dirs if _loops_or_leaves(os.path.join(here, d), inside)]:
            dirs.remove(d)
            link = os.path.join(here, d)
            if link not in _WARNED_LINKS:  # a command walks one directory more than once: one warning
                _WARNED_LINKS.add(link)
                print(
                    f"zerobench: warning: {link} links to a directory holding {root}: not followed "
                    "(it would read rows from outside it, or loop)",
                    file=sys.stderr,
                )
        dirs.sort()
        for entry in ([name] if name in files else []) + ([name] if name in dirs else []):
            f = Path(here) / entry
            key = os.path.realpath(f)
            if key not in seen_files:
                seen_files.add(key)
                out.append(f)
    return sorted(out)


def read_rows(path: str | os.PathLike, whole: str | None = None, source: bool = False) -> list[dict]:
    """Rows from a rows file or every ``rows.jsonl`` under a directory (``files_below``: links followed). A torn
    last line (no newline, not JSON: a writer died mid-row) is skipped with a warning, or, where the file must be as
    it was recorded, ``whole`` names what it is (the gate's ``"baseline"``) and it is a ``ConfigError``; any other
    bad line is a ``ConfigError``, as is a row without one of the ``REQUIRED`` fields or with a known field of another
    type (``_check_types``). ``source``: each row also says which file it came from (``rows_file``)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"no results at {p}: pass a results directory or a rows.jsonl file")
    files = files_below(p) if p.is_dir() else [p]
    rows = []
    for f in files:
        try:
            text = f.read_text(errors="replace")
        except OSError as e:  # a directory named rows.jsonl, an unreadable file
            raise ConfigError(f"{f}: cannot read result rows: {e.strerror or e}") from None
        lines = text.splitlines()
        for n, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as e:
                if n == len(lines) and not text.endswith("\n"):
                    if whole:
                        raise ConfigError(
                            f"{f}:{n}: its last row is torn: a damaged {whole}; restore it or record it again"
                        ) from None
                    print(
                        f"zerobench: warning: {f}:{n}: skipped a torn last row (its writer stopped mid-row)",
                        file=sys.stderr,
                    )
                    continue
                raise ConfigError(f"{f}:{n}: not a JSON row ({e.msg})") from None
            if not (isinstance(row, dict) and "metric" in row and "run_id" in row):
                raise ConfigError(f"{f}:{n}: not a zerobench result row (a JSON object with 'metric' and 'run_id')")
            _check_types(row, f"{f}:{n}")
            lacks = next((k for k in REQUIRED if k not in row), None)
            if lacks is not None:
                raise ConfigError(
                    f"{f}:{n}: not a whole result row: it has no {lacks!r} (every row carries "
                    f"{', '.join(REQUIRED)}); restore the file, or leave it out of the inputs"
                )
            if source:  # resolved: one file given by two spellings (a relative and an absolute path) is one source
                row["rows_file"] = str(f.resolve())
            rows.append(row)
    return rows


REQUIRED = ("metric", "run_id", "value", "status")
"""The fields of a row that readers take as given (``RowWriter`` writes them in every row): a row without one is not
whole. Refused on read, naming its line, for every reader alike: a row without ``status`` was read as ``ok`` by some
readers and failed others with a traceback, and a row without ``value`` failed them all."""

_NUMBER = (int, float)
FIELD_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    "metric": ((str,), "a string"),
    "run_id": ((str,), "a string"),
    "unit": ((str,), "a string"),
    "status": ((str,), "a string"),
    "config_hash": ((str,), "a string"),
    "value": ((*_NUMBER, type(None)), "a number or null"),
    "step": ((int, type(None)), "an integer or null"),
    "rank": ((int, type(None)), "an integer or null"),
    "config": ((dict,), "an object"),
    "provenance": ((dict,), "an object"),
    "suite": ((str, type(None)), "a string or null"),
    "label": ((str, type(None)), "a string or null"),
    "reason": ((str, type(None)), "a string or null"),
    "phase": ((str, type(None)), "a string or null"),
    "of": ((str, int, type(None)), "a string, an integer or null"),
    "instrumented": ((str, type(None)), "a string or null"),
}
"""The fields every reader relies on, with the JSON types a writer gives them (``RowWriter``). ``phase``, ``of`` and
``instrumented`` key a run's figures (``results.status.ONCE_KEY``, the gate's runs): readers hash and sort them."""
NOT_BOOL = ("step", "rank", "of")
"""Integer fields where a JSON ``true`` is no integer (Python's bool is one)."""


NESTED_OBJECTS = (("provenance", "hardware"), ("config", "zero"), ("config", "model"), ("config", "activation"))
"""Sections inside ``provenance`` and ``config`` that readers look into: objects wherever a row has them."""


def _check_types(row: dict, where: str) -> None:
    """Refuse a row whose known fields have other types (a hand-edited or foreign file), naming the line:
    readers compare, sort and sum these fields, and a string among numbers fails there, far from its line."""
    for key, (types, expected) in FIELD_TYPES.items():
        v = row.get(key)
        if key in row and (not isinstance(v, types) or (isinstance(v, bool) and key in NOT_BOOL)):
            raise ConfigError(f"{where}: not a zerobench result row: {key!r} must be {expected}, got {v!r:.40}")
    huge = next((k for k, v in row.items() if isinstance(v, int) and abs(v) > sys.float_info.max), None)
    if huge is not None:  # readers take numbers as floats: it would overflow there, far from its line
        raise ConfigError(f"{where}: not a zerobench result row: {huge!r} is beyond a number's range")
    for outer, inner in NESTED_OBJECTS:
        section = row.get(outer)
        if isinstance(section, dict) and inner in section and not isinstance(section[inner], dict):
            raise ConfigError(
                f"{where}: not a zerobench result row: '{outer}.{inner}' must be an object, got {section[inner]!r:.40}"
            )
