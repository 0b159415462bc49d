"""What every launcher shares: the exit codes a rank reports, how an exit is described, the result of a
launch, the request a launcher is given, and the ``Launcher`` interface (``launch/launchers.py`` has the
implementations: local processes, an ``srun`` step inside an allocation)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from zerobench.launch.cancel import Cancellation
from zerobench.results.rows import RowWriter
from zerobench.train.config import TrainConfig

EXIT_CONFIG = 2
"""A rank rejected its configuration."""
EXIT_OOM = 75
"""A rank ran out of (budgeted) memory."""
EXIT_IO = 74
"""A rank could not write its results or other output: the disk or the quota is full, or a file reached its
size limit (ENOSPC, EDQUOT, EFBIG). A sweep stops on it: the next runs would fail alike."""
EXIT_PEER_TIMEOUT = 76
"""A rank timed out in a collective: a peer is stuck or dead."""


def describe_exit(who: str, code: int) -> tuple[str, str]:
    """(status, reason) for a non-zero exit code of ``who`` (e.g. ``rank 1``, ``srun step``)."""
    if code == EXIT_OOM:
        return "oom", f"{who} ran out of memory"
    if code == EXIT_CONFIG:
        return "invalid", f"{who} rejected the configuration"
    if code == EXIT_IO:
        return "failed", f"{who} could not write its results"
    if code == EXIT_PEER_TIMEOUT:
        return "failed", f"{who} timed out waiting for its peers in a collective"
    if code < 0:
        return "failed", f"{who} was killed by signal {-code}"
    return "failed", f"{who} exited with code {code}"


def with_detail(status: str, reason: str, detail: str | None) -> str:
    """``reason`` with the blamed rank's own line: the line alone for an OOM that names its rank (the rank that ran
    out, which may not be the first to exit), else after the reason."""
    if not detail:
        return reason
    return detail if status == "oom" and detail.startswith("rank ") else f"{reason}: {detail}"


def first_failure_of(ends) -> tuple[str, str, int] | None:
    """(status, reason, exit code) of the rank whose own failure came first among ``ends`` (``channel.RankEnd``:
    its report's line after the reason, code 1 where it wrote none), or None where none failed on its own (a rank
    that lost a peer or was stopped is not a cause)."""
    failed = sorted((e for e in ends if e.failed_at is not None and not e.secondary), key=lambda e: e.failed_at)
    if not failed:
        return None
    first = failed[0]
    code = first.code if first.code is not None else 1
    status, reason = describe_exit(f"rank {first.rank}", code)
    return status, with_detail(status, reason, first.error), code


@dataclass(frozen=True)
class LaunchResult:
    """How a launch ended."""

    ok: bool
    reason: str
    status: str
    returncodes: list[int | None]
    elapsed_s: float


def write_status(
    res: LaunchResult, out_dir: str | Path, run_id: str, cfg: TrainConfig, suite: str | None = None, **extra
) -> None:
    """The launched run's one ``run_status`` row in ``out_dir``: ``ok``, or the failure and its reason. Whoever
    launches a run writes it once the ranks have ended (a sweep writes its own, with the run's label); a run
    whose rows lack it reads as incomplete. Raises ``RowWriteError`` if it cannot be written."""
    RowWriter(out_dir, run_id, cfg, suite=suite).write(
        "run_status",
        1 if res.ok else 0,
        "bool",
        status=res.status,
        reason=res.reason or None,
        elapsed_s=round(res.elapsed_s, 3),
        **extra,
    )


@dataclass
class LaunchRequest:
    """One run to launch."""

    cfg: TrainConfig
    """The resolved configuration (its world size is the number of processes)."""
    out_dir: Path
    """The run's directory (rows, run.log, run.json)."""
    run_id: str
    """Stored in every row."""
    timeout_s: float
    """Wall-clock limit; past it the run is stopped and recorded as timed out."""
    log_path: Path
    """Every rank's output."""
    suite: str | None = None
    """The suite the run belongs to (stored in rows)."""
    index: int = 0
    """The run's index in its sweep (a distinct rendezvous port per run under srun)."""
    on_poll: Callable[[], None] | None = None
    """Called while the run is watched (progress display)."""
    cancel: Cancellation | None = None
    """Stop the run when cancellation is requested."""
    extra_env: dict[str, str] = field(default_factory=dict)
    """More environment for the ranks (A/B turns, test-only plantings: read by ``launch/worker.py``)."""
    callgrind_ranks: tuple[int, ...] = ()
    """Ranks to start under valgrind's callgrind, counting the instructions of their counted step
    (``metrics/callgrind.py``; the local launcher only)."""


class Launcher(Protocol):
    """Starts a run's processes, waits for them, and says how it ended (never raises for a failed run)."""

    name: str

    def launch(self, req: LaunchRequest) -> LaunchResult: ...
