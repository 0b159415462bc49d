"""Where a command's output goes, checked before anything runs: a directory that can be written (for a run's
rows, one that holds no other run's rows: two runs in one ``rows.jsonl`` would read as one run in ``results
show`` and reports), or a file whose directory can be written; and names (run ids, suite names) that stay one
directory inside ``runs/``. A bad location is one ``ConfigError`` line before any work, not a traceback after it.
(``results/lock.py``: one writer per directory.)"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import fcntl
import json
import os
import re
import socket
import tempfile
from pathlib import Path

from zerobench.config import ConfigError
from zerobench.results.rows import ROWS_FILE, files_below, read_rows

CREATED: list[Path] = []
"""Directories this process created to prove them writable, deepest first: a command refused afterwards (bad
input found later) removes those still empty (``remove_created``), so a refusal leaves nothing behind."""


def remove_created() -> None:
    """Remove the directories ``_prove_writable`` created that are still empty (a refused command's)."""
    while CREATED:
        d = CREATED.pop(0)
        with contextlib.suppress(OSError):
            d.rmdir()  # only an empty one: whatever a command wrote stays


def _prove_writable(directory: Path) -> None:
    """Create ``directory`` if needed and write (then remove) a file in it; raises ``OSError`` otherwise."""
    if directory.exists() and not directory.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(directory))
    made = []
    for d in reversed([d for d in (directory, *directory.parents) if not d.exists()]):  # shallowest first
        try:
            d.mkdir()
            made.append(d)  # only what this call created: another process's directory is never ours to remove
        except FileExistsError:
            pass
    CREATED[:0] = made[::-1]  # deepest first
    fd, probe = tempfile.mkstemp(prefix=".zerobench-probe-", dir=directory)
    os.close(fd)
    os.unlink(probe)


def _prove_creatable(directory: Path) -> None:
    """What ``_prove_writable`` proves, leaving nothing behind: ``directory``, or the nearest of its parents that
    exists, is a directory in which a file can be created (a probe, removed at once); the directories missing below
    it would be created there by this user. Raises ``OSError`` otherwise."""
    top = next(d for d in (directory, *directory.parents) if d.exists())  # '.' or '/' at the latest
    if not top.is_dir():
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), str(top))
    fd, probe = tempfile.mkstemp(prefix=".zerobench-probe-", dir=top)
    os.close(fd)
    os.unlink(probe)


def check_writable_dir(
    path: str | os.PathLike, flag: str = "--out", what: str = "results", create: bool = True
) -> None:
    """Create ``path`` if needed and prove a file can be written there, or raise a one-line ConfigError.

    ``flag`` names the option the path came from and ``what`` the output, both for the message. ``create`` False:
    the same refusals with nothing created, for a check of a command that does not run it (``sweep --check``)."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{flag} {path} is a file: give a directory for {what}")
    try:
        _prove_writable(path) if create else _prove_creatable(path)
    except OSError as e:
        raise ConfigError(
            f"cannot write {what} to {flag} {path}: {e.strerror or e}: choose a writable directory"
        ) from None


def check_writable_file(
    path: str | os.PathLike, flag: str | None, what: str, fix: str = "choose a writable path"
) -> None:
    """Prove the file ``path`` can be written (its directory created if needed; an existing file is opened
    for appending, not changed), or raise a one-line ConfigError naming ``flag`` (None: a default path,
    which ``fix`` then says how to move)."""
    path = Path(path)
    where = f"{flag} {path}" if flag else str(path)
    if path.is_dir():
        raise ConfigError(f"{where} is a directory: give a file path for the {what}")
    try:
        _prove_writable(path.parent)
        if path.exists():
            os.close(os.open(path, os.O_WRONLY | os.O_APPEND))
    except OSError as e:
        raise ConfigError(f"cannot write the {what} to {where}: {e.strerror or e}: {fix}") from None


SWEEP_PLAN_FILE = "sweep-plan.json"
"""What marks a sweep's results directory (``bench.sweep_state`` writes it when a sweep starts)."""


def never_ran(out: str | os.PathLike, rows: list[dict]) -> list[str]:
    """Labels of the runs ``out``'s sweep planned (``SWEEP_PLAN_FILE``) that left no row in ``rows``: neither a status
    row of their label and config hash nor any other row of theirs (a run killed mid-way left rows and no status: it
    is ``incomplete``, not unstarted); [] where ``out`` holds no plan (a single run, or a sweep of before plans).

    A planned run's other rows are found by its run id (any attempt's: ``<id>`` or ``<id>-r<k>``), which the plan
    records; two entries of one configuration under two labels then stay apart, where matching by config hash
    would count the one that ran for both. A plan written before it recorded run ids is matched by config hash."""
    path = Path(out) / SWEEP_PLAN_FILE
    if not path.is_file():
        return []
    try:
        planned = json.loads(path.read_text())["runs"]
        keys = [(str(r["label"]), str(r["config_hash"]), r.get("run_id")) for r in planned]
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(
            f"{path} is damaged ({type(e).__name__}): the sweep's plan cannot be read, so which of its runs never ran "
            "is unknown; restore it from a copy, or delete it to read the runs as a set of single runs"
        ) from None
    ran = {(r.get("label"), r.get("config_hash")) for r in rows if r.get("metric") == "run_status"}
    hashes = {r.get("config_hash") for r in rows}
    # every row's run id, and for a later attempt (sweep_state.attempt_id's <id>-r<k>) the id it retried: run ids
    # begin with their run's index, so a first attempt's id that merely ends like "-r2" names no other planned run
    attempts = {r.get("run_id") for r in rows if isinstance(r.get("run_id"), str)}
    started = attempts | {_RETRY.sub("", x) for x in attempts}
    return [
        label
        for label, h, rid in keys
        if (label, h) not in ran and not (rid in started if isinstance(rid, str) else h in hashes)
    ]


_RETRY = re.compile(r"-r[0-9]+$")


LOCK_FILE = ".zerobench.lock"
"""The writer's lock file in its output directory (``results/lock.py``): present while a writer holds it, left
behind only by one that was killed."""


@dataclasses.dataclass(frozen=True)
class Holder:
    """What a writer's lock file records of it (``results/lock.py`` writes it)."""

    pid: int
    host: str | None
    command: str

    def describe(self, command: bool = False) -> str:
        where = "" if self.host in (None, "", socket.gethostname()) else f" on {self.host}"
        return f"pid {self.pid}{where}" + (f": {self.command}" if command else "")

    def may_live(self) -> bool:
        """Another host's process (not checkable from here), or a live one of this host."""
        if self.host not in (None, "", socket.gethostname()):
            return True
        if self.pid <= 0:
            return False
        try:
            os.kill(self.pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            pass  # alive, another user's
        return True


def read_holder(fd: int) -> Holder | None:
    """The record in the lock file open at ``fd``, or None where it holds none (yet)."""
    try:
        me = json.loads(os.pread(fd, 4096, 0))
        return Holder(int(me["pid"]), me.get("host"), str(me.get("command", "?")))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def writer_of(directory: str | os.PathLike, command: bool = False) -> str | None:
    """Who is writing ``directory`` now, as its lock file records them (``command``: with the command it runs), or
    None where no one holds its lock. The lock itself answers (a shared ``flock`` probe, released at once): a lock
    file left by a writer that was killed is held by no one, on this host or another whose file system shares locks.
    Where the file system has no locks, the record is all there is: a live pid of this host, or any pid of another,
    is named."""
    path = Path(directory) / LOCK_FILE
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None  # none: its writer ended and removed it (or never ran)
    except OSError as e:
        return f"unknown: {path} cannot be read ({e.strerror})"
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            who = read_holder(fd)
            return who.describe(command) if who is not None else f"a writer holds {path}"
        except OSError:  # no locks on this file system: judge by the record
            who = read_holder(fd)
            return who.describe(command) if who is not None and who.may_live() else None
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)


@dataclasses.dataclass(frozen=True)
class Unfinished:
    """A sweep at or below a reader's path with planned runs that left no row."""

    labels: list[str]
    """Each as ``<sweep dir relative to the path>/<label>``."""
    writer: str | None
    """Who may still be running the sweep (``writer_of``), or None: it stopped before them."""

    def describe(self) -> str:
        n = len(self.labels)
        runs = f"{n} planned run{'s' if n != 1 else ''}"
        if self.writer is None:
            return f"{runs} (the sweep stopped before them): {', '.join(self.labels)}"
        return f"{runs} (not yet: the sweep is still running, {self.writer}): {', '.join(self.labels)}"


def unfinished(path: str | os.PathLike, rows: list[dict] | None = None) -> list[Unfinished]:
    """The sweeps at or below the directory ``path`` (a rows file: none) whose planned runs left no row, with who may
    still be running each. ``rows``: those already read from ``path``, not read again for a sweep at ``path`` itself.
    Readers of a sweep's rows (``results show``, reports, the gate) name them: a run that left no row would
    otherwise be absent without a word."""
    root = Path(path)
    if not root.is_dir():
        return []
    out = []
    for plan in files_below(root, SWEEP_PLAN_FILE):  # its own sweep's, and those below (a baseline's timed/, counted/)
        sweep = plan.parent
        below = "" if sweep == root else f"{sweep.relative_to(root).as_posix()}/"
        held = rows if sweep == root and rows is not None else read_rows(sweep)
        left = never_ran(sweep, held)
        if left:
            out.append(Unfinished([below + label for label in left], writer_of(sweep)))
    return out


def stopped_before(path: str | os.PathLike, rows: list[dict] | None = None) -> list[str]:
    """The labels of every ``unfinished`` sweep's runs that left no row, whether stopped or still running."""
    return [label for u in unfinished(path, rows) for label in u.labels]


def check_fresh_run_dir(
    path: Path, flag: str = "--out", fix: str = "give each run its own directory (omit --out for runs/<run id>)"
) -> None:
    """``check_writable_dir``, and refuse a directory that already holds result rows anywhere below it, or that lies
    inside a sweep's directory: every reader takes a directory's rows recursively, so a run written into a sweep (at
    its top, or as one more run directory) would read as one of that sweep's runs in reports, ``results show`` and
    the regression gate. ``fix`` says where such a run goes instead."""
    check_outside_sweep(path, flag)  # before check_writable_dir creates it
    check_writable_dir(path, flag)
    held = next((f for f in files_below(path) if f.is_file() and f.stat().st_size), None)  # an empty one: no run
    if held is not None:
        raise ConfigError(f"{flag} {path} already holds result rows ({held}): {fix} or remove the old rows")


def check_outside_sweep(path: Path, flag: str = "--out") -> None:
    """Refuse, in one line, a ``path`` in a sweep's directory (one holding ``sweep-plan.json``): rows written there
    would read as the sweep's. And one below a run's directory (``check_outside_run``)."""
    where = path.resolve()
    sweep = next((d for d in (where, *where.parents) if (d / SWEEP_PLAN_FILE).is_file()), None)
    if sweep is not None:
        raise ConfigError(
            f"{flag} {path} is in the sweep {sweep} (it holds {SWEEP_PLAN_FILE}): a run there would read as one "
            "of the sweep's runs; give it a directory of its own outside the sweep"
        )
    check_outside_run(path, flag)


def check_outside_run(path: Path, flag: str = "--out") -> None:
    """Refuse, in one line, a ``path`` below a run's directory (a directory holding a rows file itself: a
    ``zerobench train`` run, a sweep's run, a directory of rows from before sweep plans): every reader takes a
    directory's rows recursively, so whatever is written there would read as part of that run in ``results show``,
    reports and the gate."""
    run = next((d for d in path.resolve().parents if (d / ROWS_FILE).is_file()), None)
    if run is not None:
        raise ConfigError(
            f"{flag} {path} is inside the run directory {run} (it holds {ROWS_FILE}): rows written there would read "
            "as that run's; give it a directory of its own outside it"
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
