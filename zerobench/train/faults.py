"""Test-only fault and regression planting; with no plant given, nothing happens.

The specs arrive as ``train.hooks.Plants`` (read from the launcher's environment by ``launch/worker.py``,
the one place that does; the variable names below are the interface tests and the A/B gate use):

- ``ZEROBENCH_FAULT=RANK:STEP[:KIND]``: at the start of that step that rank fails. KIND ``exit``
  (default) exits abruptly (``os._exit(17)``), as a crashed or OOM-killed process would; ``raise``
  raises an exception (a traceback); ``oom`` asks the host allocator for more than any machine has (a
  real allocation failure); ``stop`` stops itself with SIGSTOP (a hung rank); ``enospc`` fails to write
  its results as on a full disk; ``nospace`` raises the ``OSError`` (ENOSPC) a write raises when the disk
  fills, naming the file it was writing; ``exit0`` exits with code 0 in mid-run (``os._exit(0)``), as a
  stray ``sys.exit(0)`` in a script or a library would.
- ``ZEROBENCH_PLANT_DELAY`` / ``ZEROBENCH_PLANT_BUFFER``: an exact slowdown or an extra buffer, so tests
  can check that the regression gate catches them.
- ``ZEROBENCH_PLANT_PROFILE=SECONDS[:REPLICATES]``: ``zerobench profile`` busy-waits SECONDS in block 0's
  forward at every step of the first REPLICATES compute replicates each profiling process takes (one slow
  piece in one measurement, which the profile must catch; read by ``zerobench/sim/command.py``).
- ``ZEROBENCH_PLANT_CPU=FRACTION[:STAGE]``: each phase of the step (``train/probes.py``) spends FRACTION x its
  CPU time more CPU time, busy on the CPU as slower host code would be: a host-work slowdown for the gate's
  CPU-time and instruction metrics. It makes no Python call the call counter sees (it runs after the counted
  call), as a slower C++ path would not.
"""

from __future__ import annotations

import os

EXIT_CODE = 17


FAULT_ENV, DELAY_ENV, BUFFER_ENV = "ZEROBENCH_FAULT", "ZEROBENCH_PLANT_DELAY", "ZEROBENCH_PLANT_BUFFER"
PROFILE_PLANT_ENV = "ZEROBENCH_PLANT_PROFILE"
CPU_ENV = "ZEROBENCH_PLANT_CPU"


def maybe_fail(spec: str | None, rank: int, step: int) -> None:
    """Fail as ``spec`` (``RANK:STEP[:KIND]``) says when it names this rank and step."""
    if not spec:
        return
    r, s, kind = (spec + ":exit").split(":")[:3]
    if int(r) != rank or int(s) != step:
        return
    if kind == "raise":
        raise RuntimeError(f"planted fault on rank {rank} at step {step}")
    if kind == "oom":
        import torch

        torch.empty(2**62, dtype=torch.uint8)  # 4 EiB: the allocator fails, as on a full host
    if kind == "stop":
        import signal

        os.kill(os.getpid(), signal.SIGSTOP)
        return
    if kind == "enospc":
        import errno

        from zerobench.results.rows import RowWriteError

        raise RowWriteError(f"cannot write results: {os.strerror(errno.ENOSPC)} (planted)")
    if kind == "nospace":
        import errno
        import tempfile

        path = os.path.join(tempfile.gettempdir(), f"zerobench-planted-rank{rank}-step{step}.bin")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), path)
    os._exit(0 if kind == "exit0" else EXIT_CODE)


def planted_delay(spec: str | None, stage: int, step_seconds: float) -> float:
    """Test-only: with ``spec`` = ``FRACTION[:STAGE]`` spend FRACTION x this step's time
    (only for ZeRO stage STAGE when given), planting an exact slowdown for regression-gate tests.

    The delay busy-waits, as slower code would (a sleep would leave the core to other processes)."""
    if not spec:
        return 0.0
    frac, _, only = spec.partition(":")
    if only and int(only) != stage:
        return 0.0
    import time

    delay = float(frac) * step_seconds
    end = time.perf_counter() + delay
    while time.perf_counter() < end:
        pass
    return delay


def planted_cpu(spec: str | None, stage: int, cpu_seconds: float, meter=None) -> float:
    """Test-only: with ``spec`` = ``FRACTION[:STAGE]`` do FRACTION more host work in this phase (only for ZeRO
    stage STAGE when given): busy on the CPU for FRACTION x ``cpu_seconds`` of this process's CPU time or, given
    the counted step's ``meter`` under callgrind (``train/probes.py``), for FRACTION x the phase's instructions.
    Returns the CPU time it aimed to spend (0 with a meter)."""
    if not spec:
        return 0.0
    frac, _, only = spec.partition(":")
    if only and int(only) != stage:
        return 0.0
    if meter is not None:
        meter.spend(float(frac), _spin)
        return 0.0
    import time

    burn = float(frac) * cpu_seconds
    end = time.process_time() + burn
    while time.process_time() < end:
        _spin(100)  # work between clock reads: the burn is user-space code, not clock syscalls
    return burn


def _spin(n: int) -> None:
    """``n`` units of plain interpreter work."""
    for _ in range(n):
        pass
