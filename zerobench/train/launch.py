"""Local launcher: start a run's N processes on this host (no torchrun needed) and watch them.

Each process gets torchrun's variables (``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``,
``MASTER_PORT``) and an even share of the cores. The launcher fails the run as soon as any rank exits
non-zero (and stops the others, which would otherwise wait on a collective until their timeout), and
kills everything past the run's wall-clock timeout.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from zerobench.config import to_dict
from zerobench.train.config import TrainConfig

EXIT_CONFIG = 2
"""A rank rejected its configuration."""
EXIT_OOM = 75
"""A rank ran out of (budgeted) memory."""


def describe_exit(who: str, code: int) -> tuple[str, str]:
    """(status, reason) for a non-zero exit code of ``who`` (e.g. ``rank 1``, ``srun step``)."""
    if code == EXIT_OOM:
        return "oom", f"{who} ran out of memory"
    if code == EXIT_CONFIG:
        return "invalid", f"{who} rejected the configuration"
    if code < 0:
        return "failed", f"{who} was killed by signal {-code}"
    return "failed", f"{who} exited with code {code}"


@dataclass(frozen=True)
class LaunchResult:
    """How a local launch ended."""

    ok: bool
    reason: str
    status: str
    returncodes: list[int | None]
    elapsed_s: float


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


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
    cfg: TrainConfig, out_dir: str | Path | None, run_id: str = "train", timeout_s: float = 3600.0,
    extra_env: dict[str, str] | None = None, log_path: str | Path | None = None,
    suite: str | None = None, on_poll=None,
) -> LaunchResult:
    """Run ``cfg`` on ``cfg.world_size`` local processes. With ``log_path`` the ranks' output goes to that
    file (and a failure's reason quotes the first ``zerobench:`` line in it) instead of the terminal."""
    n = cfg.world_size
    port = free_port()
    threads = max(1, usable_cpus() // n)
    log_cm = open(log_path, "ab") if log_path is not None else contextlib.nullcontext()  # noqa: SIM115
    with log_cm as log, tempfile.TemporaryDirectory(prefix="zerobench-launch-") as tmp:
        cfg_path = Path(tmp) / "config.json"
        cfg_path.write_text(json.dumps(to_dict(cfg)))
        procs = []
        for rank in range(n):
            env = {
                **os.environ, **(extra_env or {}),
                "RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
                "OMP_NUM_THREADS": str(threads), "PYTHONUNBUFFERED": "1",
            }
            cmd = [sys.executable, "-m", "zerobench.train.worker", str(cfg_path), run_id]
            if out_dir is not None:
                cmd.append(str(out_dir))
                if suite is not None:
                    cmd.append(suite)
            procs.append(subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT if log else None))
        t0 = time.monotonic()
        reason, status = "", "ok"
        try:
            while True:
                codes = [p.poll() for p in procs]
                bad = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
                if bad:
                    status, reason = describe_exit(f"rank {bad[0][0]}", bad[0][1])
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
            for p in procs:
                if p.poll() is None:
                    p.terminate()
            deadline = time.monotonic() + 10
            for p in procs:
                try:
                    p.wait(timeout=max(0.1, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
    if reason and log_path is not None:
        detail = _first_error(Path(log_path))
        reason = f"{reason}: {detail}" if detail else reason
    return LaunchResult(not reason, reason, status, [p.returncode for p in procs], time.monotonic() - t0)


def _first_error(path: Path) -> str | None:
    for line in path.read_text(errors="replace").splitlines():
        if line.startswith("zerobench: "):
            return line.split(": ", 1)[1].strip()
    return None
