"""Entry point of one launched rank: ``python -m zerobench.launch.worker CONFIG.json RUN_ID [OUT_DIR [SUITE]]``.

The composition root of a rank: it resolves the run's system from ``zerobench.systems`` and hands the
entry to the training loop.

``run_rank`` is also how ``zerobench train`` trains in its own process (one process, or one rank under
torchrun / srun): a bad configuration, a failed rendezvous, a full disk (any ``OSError``) or running out of
memory ends in one line and an exit code the launcher understands, never a traceback, and the process group
is torn down on every path. Under the local launcher the rank also says on its pipe (``launch/channel.py``)
that it finished, or gives its one line there: the launcher then tells an early exit 0 from a finished run,
and hears the cause even when the rank's log cannot be written.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

from zerobench.config import ConfigError, RunFailed, from_dict
from zerobench.distributed.env import DistEnv, detect
from zerobench.launch import channel
from zerobench.launch.base import EXIT_CONFIG, EXIT_IO, EXIT_OOM, EXIT_PEER_TIMEOUT
from zerobench.launch.cancel import EXIT_CANCELLED, die_with_parent
from zerobench.launch.peer_ends import LauncherStopped, PeerEnds
from zerobench.metrics.callgrind import ENV as CALLGRIND_ENV
from zerobench.metrics.memory import TrackedOutOfMemory
from zerobench.metrics.rss import ENV as RSS_BREAKDOWN_ENV
from zerobench.results.rows import RowWriteError, RowWriter
from zerobench.systems import validate_run
from zerobench.train import faults, turnstile
from zerobench.train.config import TrainConfig
from zerobench.train.hooks import Plants, RankSettings
from zerobench.train.loop import train
from zerobench.train.turnstile import TurnstileError


def main(argv: list[str]) -> int:
    launcher = os.environ.get("ZEROBENCH_LAUNCHER_PID")
    die_with_parent(int(launcher) if launcher else None)
    fd = os.environ.get(channel.ENV)
    to_launcher = channel.RankChannel(int(fd) if fd else None)
    try:
        cfg_path, run_id = argv[0], argv[1]
        with open(cfg_path) as f:
            data = json.load(f)
        code = run(data, run_id, argv[2] if len(argv) > 2 else None, argv[3] if len(argv) > 3 else None, to_launcher)
    except Exception as e:  # the traceback goes to stderr (the log); the launcher gets its last line
        to_launcher.error(f"{type(e).__name__}: {first_line(e)}")
        raise
    if code == 0:
        to_launcher.done()
    return code


def rank_settings(environ=None) -> RankSettings:
    """The launcher's requests to this rank (A/B turns, test-only plantings): the one place in zerobench
    that reads them from the environment."""
    env = os.environ if environ is None else environ
    plants = Plants(
        fault=env.get(faults.FAULT_ENV),
        delay=env.get(faults.DELAY_ENV),
        buffer_bytes=int(env.get(faults.BUFFER_ENV, "0")),
        cpu=env.get(faults.CPU_ENV),
    )
    return RankSettings(
        plants,
        env.get(turnstile.ENV),
        float(env.get(turnstile.TIMEOUT_ENV, "600")),
        native_collectives=env.get("ZEROBENCH_GLOO_NATIVE") == "1",
        callgrind=env.get(CALLGRIND_ENV) or None,
        rss_breakdown=env.get(RSS_BREAKDOWN_ENV) == "1",
    )


def run(
    config: dict, run_id: str, out_dir: str | None, suite: str | None, to_launcher: channel.RankChannel | None = None
) -> int:
    """Train one rank of the run described by ``config`` (a resolved ``TrainConfig`` as plain data).

    The launcher that started this rank records the run's status from the exit code (and from what the
    rank sent on ``to_launcher``)."""
    return run_rank(
        from_dict(TrainConfig, config),
        detect(),
        out_dir,
        run_id,
        suite=suite,
        record_status=False,
        to_launcher=to_launcher,
    )


def run_rank(
    cfg: TrainConfig,
    denv: DistEnv,
    out_dir: str | Path | None,
    run_id: str,
    suite: str | None = None,
    record_status: bool = True,
    to_launcher: channel.RankChannel | None = None,
) -> int:
    """Train this rank; return 0, ``EXIT_CONFIG``, ``EXIT_OOM``, ``EXIT_IO`` (results not written, or the disk
    full), ``EXIT_PEER_TIMEOUT`` (a collective timed out: a peer is stuck), ``EXIT_CANCELLED`` (stopped by the
    launcher above it) or 1 (a run failure: a failed rendezvous, any other OSError).

    Each failure is one line on stderr and, when a launcher listens (``to_launcher``), on the rank's pipe too:
    stderr may be a log on the very disk that filled. With ``record_status`` (no launcher above this process to
    do it: ``zerobench train`` in one process or under torchrun / srun) the run's end is also written to its rows
    as the one ``run_status`` row a launcher would write: ``ok`` or ``failed`` with the reason by rank 0, ``oom``
    by the rank that ran out, so a probe that did not fit is a result, not a missing run, and a run without the
    row reads as incomplete. Under torchrun or srun each rank also reports how it ended, so that rank 0's row names
    the rank that ended the run (``peer_ends``)."""
    ends = None
    if record_status and denv.source != "single":
        ends = PeerEnds.for_run(denv.rank, denv.world_size, out_dir)
    if ends is None:
        return _run_rank(cfg, denv, out_dir, run_id, suite, record_status, to_launcher, None)
    try:
        with ends.stopping():
            code = _run_rank(cfg, denv, out_dir, run_id, suite, record_status, to_launcher or ends.file, ends)
    except BaseException as e:  # not one of the ends above: the traceback follows, the report says it first
        ends.file.error(f"{type(e).__name__}: {first_line(e)}")
        ends.file.exited(1)
        raise
    if code == 0:
        ends.file.done()
    ends.file.exited(code)
    return code


def _run_rank(cfg, denv, out_dir, run_id, suite, record_status, to_launcher, ends: PeerEnds | None) -> int:
    t0 = time.monotonic()
    say = functools.partial(_say, to_launcher or channel.RankChannel(None))
    try:
        with ends.training() if ends is not None else contextlib.nullcontext():
            system = validate_run(cfg, denv.world_size)
            train(cfg, denv, system, out_dir, run_id, suite=suite, settings=rank_settings())
    except LauncherStopped:
        return _stopped(cfg, denv, out_dir, run_id, suite, t0, ends)
    except ConfigError as e:
        return say(f"error: {e}", EXIT_CONFIG)
    except RowWriteError as e:
        return say(f"error: {e}", EXIT_IO)
    except (TurnstileError, RunFailed) as e:
        say(f"error: {e}", 1)
        if record_status and denv.rank == 0:
            return _status_row(cfg, out_dir, run_id, suite, t0, "failed", str(e), code=1)
        return 1
    except (TrackedOutOfMemory, torch.OutOfMemoryError) as e:
        return _oom(e, cfg, denv, out_dir, run_id, suite, record_status, t0, say)
    except OSError as e:
        reason = f"rank {denv.rank}: {describe_os_error(e)}"
        code = say(f"error: {reason}", EXIT_IO if e.errno in _FULL else 1)
        if record_status and denv.rank == 0:
            return _status_row(cfg, out_dir, run_id, suite, t0, "failed", reason, code=code)
        return code
    except (RuntimeError, MemoryError) as e:
        kind = classify(e)
        if kind is None or (kind == "peer" and not record_status):
            raise  # under zerobench's launcher the peer's own exit names the cause, not this rank's loss of it
        if kind in ("timeout", "peer"):
            return _peer_failed(e, kind, cfg, denv, out_dir, run_id, suite, record_status, t0, say, ends)
        return _oom(e, cfg, denv, out_dir, run_id, suite, record_status, t0, say)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    if record_status and denv.rank == 0:
        return _status_row(cfg, out_dir, run_id, suite, t0, "ok", None, code=0)
    return 0


def _peer_failed(e, kind, cfg, denv, out_dir, run_id, suite, record_status, t0, say, ends) -> int:
    """This rank failed because a peer did: it lost its connection (``peer``) or timed out waiting (``timeout``).
    Under torchrun or srun nobody above the ranks records the run's end: rank 0 does, naming the peer from the
    ranks' reports (``peer_ends``), or the rank that takes the recording over from a rank 0 that died. A peer that
    recorded its own end (it ran out of memory) named the cause, which this rank's later loss of it must not
    replace."""
    reason = (
        f"rank {denv.rank} timed out in a collective after {cfg.collective_timeout_s:.0f}s: a peer rank is "
        f"stuck or dead ({first_line(e)})"
        if kind == "timeout"
        else f"rank {denv.rank} lost its connection to a peer rank in a collective: the peer died ({first_line(e)})"
    )
    code = EXIT_PEER_TIMEOUT if kind == "timeout" else 1
    if ends is None:
        say(f"error: {reason}", code)
        if record_status and denv.rank == 0:  # (written once: not over a peer's own row)
            return _status_row(cfg, out_dir, run_id, suite, t0, "failed", reason, code=code)
        return code
    ends.file.lost(reason)  # not this rank's own failure: whoever records the run looks past it
    return _record_end(cfg, denv, out_dir, run_id, suite, t0, ends, "failed", reason, code, reason)


def _stopped(cfg, denv, out_dir, run_id, suite, t0, ends: PeerEnds) -> int:
    """The launcher above the ranks stopped this one (SIGTERM: ``LauncherStopped``, raised only inside
    ``PeerEnds.training``). The recorder records the run: failed, naming the rank that ended it where a peer did
    (torchrun stops every rank once one fails), else cancelled (stopped from outside)."""
    reason = "stopped by the launcher (SIGTERM)"
    ends.file.stopped()
    after = f"rank {denv.rank} was then stopped by the launcher (SIGTERM)"
    return _record_end(cfg, denv, out_dir, run_id, suite, t0, ends, "cancelled", reason, EXIT_CANCELLED, after)


def _record_end(cfg, denv, out_dir, run_id, suite, t0, ends: PeerEnds, status, reason, code, after) -> int:
    """This rank's one line; and where it records the run (rank 0, or the rank that took over from a rank 0 that
    died), the status row: the blamed rank first (``PeerEnds.blame``) and ``after`` it what this rank saw, else
    ``status`` with this rank's ``reason``."""
    line = functools.partial(_say, channel.RankChannel(None))
    if not (denv.rank == 0 or (ends.recorder_gone() and ends.claim())):
        return line(f"error: {reason}", code)
    found = ends.blame()
    if found is not None:
        status, reason = found[0], f"{found[1]}; {after}"
        code = EXIT_OOM if status == "oom" else (code if code != EXIT_CANCELLED else 1)
    line(f"error: {reason}", code)
    return _status_row(cfg, out_dir, run_id, suite, t0, status, reason, code=code)  # once: not over a peer's row


_FULL = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
"""The storage is exhausted (disk, quota, file-size limit): the next run would fail alike (``EXIT_IO``)."""


def describe_os_error(e: OSError) -> str:
    """``No space left on device writing /path``: the error's text and the file it names (if it names one)."""
    text = e.strerror or str(e) or type(e).__name__
    if e.filename is None:
        return text
    verb = "writing" if e.errno in _FULL else "at"
    return f"{text} {verb} {e.filename}"


def _say(to_launcher: channel.RankChannel, line: str, code: int) -> int:
    """``line`` on stderr (the rank's log) and to the launcher; ``code`` back. A stderr that cannot be written
    (the log's disk is full) does not stop the launcher from hearing it."""
    to_launcher.error(line.removeprefix("error: "))
    with contextlib.suppress(OSError):
        print(f"zerobench: {line}", file=sys.stderr, flush=True)
    return code


def _status_row(cfg, out_dir, run_id, suite, t0, status: str, reason: str | None, code: int) -> int:
    """Write the run's ``run_status`` row (when it has an output directory) unless one is there already (a peer
    that ran out of memory records its own, which this rank's later loss of it must not replace); ``code``, or
    ``EXIT_IO`` if the row cannot be written."""
    if out_dir is None:
        return code
    try:  # once: a peer that ran out of memory may be writing the run's row at this moment (its own, first)
        RowWriter(out_dir, run_id, cfg, suite=suite).write(
            "run_status",
            1 if status == "ok" else 0,
            "bool",
            status=status,
            once=True,
            reason=reason,
            elapsed_s=round(time.monotonic() - t0, 3),
        )
    except RowWriteError as e:
        with contextlib.suppress(OSError):
            print(f"zerobench: error: {e}", file=sys.stderr)
        return EXIT_IO
    return code


_OOM_TEXT = (
    "DefaultCPUAllocator",
    "can't allocate memory",
    "not enough memory",
    "Cannot allocate memory",
    # device allocations outside the caching allocator (which raises torch.OutOfMemoryError): cuBLAS's workspace,
    # NCCL's buffers, a raw CUDA call
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDA error: out of memory",
    "cudaErrorMemoryAllocation",
)
_TIMEOUT_TEXT = ("timed out", "timeout")
_PEER_TEXT = ("connection closed by peer", "connection reset by peer", "broken pipe")
"""How gloo reports a collective whose peer process is gone (NCCL reports it as a timeout or an async error)."""


def classify(e: BaseException) -> str | None:
    """``oom`` for a host allocator failure, ``timeout`` for a collective or rendezvous timeout, ``peer`` for a
    collective whose peer's connection closed (the peer died), else None."""
    if isinstance(e, MemoryError):
        return "oom"
    text = str(e)
    if any(t in text for t in _OOM_TEXT):
        return "oom"
    if any(t in text.lower() for t in _TIMEOUT_TEXT):
        return "timeout"
    if any(t in text.lower() for t in _PEER_TEXT):
        return "peer"
    return None


def first_line(e: BaseException) -> str:
    """An exception's first non-empty line (at most 200 characters), for a one-line reason."""
    lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
    return lines[0][:200] if lines else type(e).__name__


def _oom(e, cfg, denv, out_dir, run_id, suite, record_status, t0, say) -> int:
    """Out of (device, budgeted or host) memory: one line, exit ``EXIT_OOM``; with ``record_status`` an
    ``oom`` status row too."""
    reason = f"rank {denv.rank} ran out of memory: {first_line(e)}"
    say(reason, EXIT_OOM)
    if record_status and out_dir is not None:
        RowWriter(out_dir, run_id, cfg, suite=suite).write(  # once: rank 0 may have recorded the run's end first
            "run_status",
            0,
            "bool",
            status="oom",
            once=True,
            reason=reason,
            rank=denv.rank,
            elapsed_s=round(time.monotonic() - t0, 3),
        )
    return EXIT_OOM


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
