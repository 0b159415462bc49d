"""Local launcher: start a run's N processes on this host (no torchrun needed) and watch them.

Each process gets torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``: a port held free for the launch, ``reserved_port``), an even share of the cores, and a
pipe on which it says, as it ends, that it finished or why not (``channel.py``). The launcher fails the run
as soon as any rank exits non-zero or exits 0 before finishing (and stops the others, which would otherwise
wait on a collective until their timeout), and kills everything past the run's wall-clock timeout. A rank
that timed out waiting on a collective exits with ``EXIT_PEER_TIMEOUT``: the reason then names the ranks it
waited for (still running, or stopped), not the healthy rank that noticed. SIGTERM/SIGINT to the launcher
stops the ranks (``cancelled``). The ranks' output goes to the run's log file; with ``echo`` rank 0's
standard output (the progress lines) is shown too. A failure is one line, not every rank's traceback: the
line the blamed rank sent on its pipe, which arrives even when the log cannot be written.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from zerobench.config import ConfigError, to_dict
from zerobench.launch.base import EXIT_IO, EXIT_PEER_TIMEOUT, LaunchResult, describe_exit, with_detail
from zerobench.launch.cancel import Cancellation
from zerobench.launch.channel import ENV as REPORT_ENV
from zerobench.launch.channel import LauncherEnds
from zerobench.train.config import TrainConfig

MAX_LOCAL_WORLD = 16
"""The most processes one run starts on this host by itself (``launch_local``, the profiler's ranks, a max-size
probe, a peers run): a typed-in world of 100000 started that many Python processes and took the host down, or
died part-way on open files with a traceback. A larger world runs under torchrun or srun, each node starting its
own ranks."""


def check_local_world(world: int, what: str, fix: str) -> None:
    """Refuse in one line a world past ``MAX_LOCAL_WORLD`` local processes: ``what`` names who asks for it (a
    flag, a suite's run), ``fix`` says what to do instead. Every command that starts local ranks calls it before
    it creates or starts anything, so the refusal never follows half a launch."""
    if world > MAX_LOCAL_WORLD:
        raise ConfigError(f"{what} needs {world} processes; the local launcher runs at most {MAX_LOCAL_WORLD}: {fix}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def reserved_port():
    """A free port, held for the block: bound with ``SO_REUSEADDR`` but not listening, so that no other
    process is given it (the kernel skips a bound port when it picks one for a bind or a connect) while rank
    0's store, which binds with ``SO_REUSEADDR`` too, can still listen on it. ``free_port`` alone leaves a
    window between choosing the port and rank 0 binding it."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", 0))
        yield s.getsockname()[1]


def allowed_cpus() -> set[int]:
    """The CPU ids this process may run on: its affinity mask (taskset, Slurm's cpuset), else all of them."""
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return set(range(os.cpu_count() or 1))


def usable_cpus() -> int:
    """How many CPUs this process may run on (``allowed_cpus``), not the machine's count."""
    return len(allowed_cpus())


def launch_local(
    cfg: TrainConfig,
    out_dir: str | Path | None,
    run_id: str = "train",
    timeout_s: float = 3600.0,
    extra_env: dict[str, str] | None = None,
    log_path: str | Path | None = None,
    suite: str | None = None,
    on_poll=None,
    echo: bool = False,
    cancel: Cancellation | None = None,
    callgrind_ranks: tuple[int, ...] = (),
) -> LaunchResult:
    """Run ``cfg`` on ``cfg.world_size`` local processes, their output into ``log_path`` (a temporary
    file if None); a failure's reason quotes the blamed rank's own line (else the log's first ``zerobench:``
    line). ``echo``: rank 0's standard output also goes to the terminal. ``cancel``: stop when it is
    requested (else SIGTERM/SIGINT to this process are watched for the launch's duration). ``callgrind_ranks``:
    these ranks run under valgrind's callgrind (``_under_callgrind``). A world past ``MAX_LOCAL_WORLD`` is
    refused (``ConfigError``) before anything starts; the commands refuse it earlier, with their own advice."""
    n = cfg.world_size
    check_local_world(n, f"run {run_id!r}", "run it under torchrun or srun, which start each node's ranks")
    threads = max(1, usable_cpus() // n)
    with contextlib.ExitStack() as stack:
        try:  # the launch's own files: a full disk here is the run's outcome, as it is in a rank
            tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="zerobench-launch-"))
            log_path = Path(log_path) if log_path is not None else Path(tmp) / "run.log"
            log = stack.enter_context(open(log_path, "ab"))
            cfg_path = Path(tmp) / "config.json"
            cfg_path.write_text(json.dumps(to_dict(cfg)))
        except OSError as e:
            return _not_started(e, n)
        port = stack.enter_context(reserved_port())
        cancel = cancel if cancel is not None else stack.enter_context(Cancellation())
        ends = LauncherEnds()
        stack.callback(ends.close)
        procs = []
        for rank in range(n):
            w = ends.open_for(rank)
            env = {
                **os.environ,
                **(extra_env or {}),
                "RANK": str(rank),
                "WORLD_SIZE": str(n),
                "LOCAL_RANK": str(rank),
                "LOCAL_WORLD_SIZE": str(n),
                "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": str(threads),
                "PYTHONUNBUFFERED": "1",
                "ZEROBENCH_LAUNCHER_PID": str(os.getpid()),
                REPORT_ENV: str(w),
            }
            cmd = [sys.executable, "-m", "zerobench.launch.worker", str(cfg_path), run_id]
            if out_dir is not None:
                cmd.append(str(out_dir))
                if suite is not None:
                    cmd.append(suite)
            if callgrind_ranks:
                cmd = _instrumented(cmd, env, Path(out_dir or tmp) / "callgrind", rank, rank in callgrind_ranks)
            stdout = None if echo and rank == 0 else log
            try:
                procs.append(subprocess.Popen(cmd, env=env, stdout=stdout, stderr=log, pass_fds=(w,)))
            finally:
                os.close(w)
        t0 = time.monotonic()
        status, reason, blamed = _watch(procs, ends, timeout_s, cancel, on_poll)
        with contextlib.suppress(OSError):
            log.flush()
        detail = None
        if blamed is not None:
            detail = ends.report(blamed).error
            if detail is None and procs[blamed].returncode:  # it crashed or was killed: it said nothing
                detail = _first_error(log_path)
            elif detail is not None:
                detail = detail.removeprefix(f"rank {blamed}: ")
        elif status not in ("ok", "cancelled"):
            detail = _first_error(log_path)
    reason = with_detail(status, reason, detail)
    return LaunchResult(
        status == "ok", reason if status != "ok" else "", status, [p.returncode for p in procs], time.monotonic() - t0
    )


def _not_started(e: OSError, world: int) -> LaunchResult:
    """The outcome of a launch whose own files (its log, the ranks' config) could not be written: failed, and,
    where the storage is exhausted, with every rank's code ``EXIT_IO`` so that a sweep stops as on a full disk."""
    full = e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)
    where = f" ({e.filename})" if e.filename else ""
    return LaunchResult(
        False,
        f"the launch could not write its files: {e.strerror or e}{where}",
        "failed",
        [EXIT_IO if full else 1] * world,
        0.0,
    )


def _instrumented(cmd: list[str], env: dict[str, str], dumps: Path, rank: int, counted: bool) -> list[str]:
    """A rank of an instrumented run: every rank is told (it stops after its counted step); a ``counted`` rank
    runs under callgrind, its dumps in ``dumps`` (``metrics/callgrind.py``), with one intra-op thread (valgrind
    runs a process's threads one at a time, and an OpenMP barrier's spinning would count), a fixed hash seed
    (set iteration order, and so the work, is the same in every run) and, on x86-64, the C++ kernels built for
    AVX2 (valgrind does not run AVX-512 code)."""
    import platform

    from kernels.cpu import MARCH_ENV
    from zerobench.metrics import callgrind

    dumps.mkdir(parents=True, exist_ok=True)
    env[callgrind.ENV] = str(dumps)
    if not counted:
        return cmd
    env["OMP_NUM_THREADS"] = "1"
    env.setdefault("PYTHONHASHSEED", "0")
    if platform.machine() in ("x86_64", "AMD64"):
        env.setdefault(MARCH_ENV, "x86-64-v3")
    return callgrind.valgrind_command(cmd, dumps, f"rank{rank}")


def _watch(
    procs: list[subprocess.Popen], ends: LauncherEnds, timeout_s: float, cancel: Cancellation, on_poll
) -> tuple[str, str, int | None]:
    """Poll the ranks until all finish, one fails, the timeout passes or a stop is requested; stop the rest.
    Returns (status, reason, the rank blamed or None). A rank that exits 0 without having said it finished
    (``channel.py``) stopped early: it is the cause, before any rank that then failed for want of it."""
    t0 = time.monotonic()
    status, reason, blamed = "ok", "", None
    try:
        while True:
            codes = [p.poll() for p in procs]
            if cancel.requested:  # first: a SIGTERM to the job (scancel, preemption) reaches the ranks too
                status, reason = "cancelled", f"cancelled ({cancel.requested}): the ranks were stopped"
                break
            early = [r for r, c in enumerate(codes) if c == 0 and not ends.report(r).done]
            bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
            if early:
                blamed = early[0]
                status, reason = "failed", f"rank {blamed} exited (code 0) before the run finished"
                if bad:
                    reason += f"; then {describe_exit(f'rank {bad[0][0]}', bad[0][1])[1]}"
                break
            if bad and bad[0][1] in (-signal.SIGTERM, -signal.SIGINT) and not cancel.requested:
                time.sleep(0.5)  # a signal to the whole job reaches this process too: let its handler run first
                if cancel.requested:
                    continue
            if bad:
                blamed = bad[0][0]
                status, reason = describe_exit(f"rank {blamed}", bad[0][1])
                if bad[0][1] == EXIT_PEER_TIMEOUT:
                    reason = _stuck(procs, reason)
                break
            if all(c == 0 for c in codes):
                break
            if time.monotonic() - t0 > timeout_s:
                status, reason = "timeout", f"timed out after {timeout_s:.0f}s"
                break
            if on_poll is not None:
                on_poll()
            time.sleep(0.1)
    finally:
        _stop(procs)
    return status, reason, blamed


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every rank still running, SIGKILL any that has not exited 10 s later."""
    for p in procs:
        if p.poll() is None:
            p.terminate()
            p.send_signal(signal.SIGCONT)  # a stopped rank acts on the SIGTERM only once continued
    deadline = time.monotonic() + 10
    for p in procs:
        try:
            p.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def _stuck(procs: list[subprocess.Popen], reason: str) -> str:
    """Name the ranks a collective timed out on: those still running (or stopped) when it did."""
    stuck = []
    for r, p in enumerate(procs):
        if p.poll() is None:
            stuck.append(f"rank {r} ({'stopped' if _process_state(p.pid) in ('T', 't') else 'not responding'})")
    return f"{', '.join(stuck)} stuck: {reason}" if stuck else reason


def _process_state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return None


def _first_error(path: Path) -> str | None:
    """The first ``zerobench:`` line of the log, for a rank that sent none of its own (it crashed or was
    killed); None where the log cannot be read (a device or a missing file is not searched)."""
    if not path.is_file():
        return None
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("zerobench: "):
            return line.split(": ", 1)[1].strip().removeprefix("error: ")
    return None
