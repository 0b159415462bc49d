"""Measures of a step's host work that hold still on a shared machine, beside the wall clock.

A step is three phases, each one call into the training system: ``forward_backward`` (the forward and the
engine's backward: its gradient hooks, bucket bookkeeping and reductions, stage 3's gathers), ``optimizer``
(the optimizer call: the engine's step over its partition) and ``zero_grad``. Per rank:

- **CPU time by phase**, every step: process CPU time (user + system, every thread) of each phase. Time the
  rank waited (for its peer in a collective, for a CPU another process held) is not counted; cache and
  SMT-sibling contention still is, so on a busy machine it moves by several per cent.
- **Counts of the counted step** (the last warm-up step, so the counting costs no timed step): Python calls
  (``sys.setprofile``: Python functions and builtins called on the training thread), operators dispatched,
  storages allocated and their bytes (the live-tensor tracker; on a GPU the caching allocator's counters),
  collective calls and the bytes they were given (the communication ledger). These do not depend on the
  machine's load at all: unchanged code gives the same numbers.
- **Instructions of the counted step by phase**, when the rank runs under callgrind (``metrics/callgrind.py``):
  the host work itself, without the machine.

Each measure covers the phase's call and what the plant hook adds to it (``after_phase``: the test-only
host-work slowdown), except the Python-call and operator counts, which cover the system's call alone: the
plant stands for slower native host code, which those counts do not see. The plant is given the phase's CPU
time and, under callgrind, a ``Meter``: a fraction more of the phase's host work is then that fraction more of
its instructions (valgrind runs vector code far slower than scalar code, so a share of CPU time there is not a
share of the instructions). Python's cyclic garbage collector is run before the counted step and held off
during it: when a collection falls is an accident of earlier allocations, not a property of the step.
"""

from __future__ import annotations

import contextlib
import gc
import sys
import time
from collections.abc import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

PHASES = ("forward_backward", "optimizer", "zero_grad")
COUNTS = ("py_calls", "ops_dispatched", "allocations", "allocated_bytes", "collective_calls", "collective_bytes")


class _OpCounter(TorchDispatchMode):
    """Counts the operators dispatched while active (each ``aten`` call, once)."""

    def __init__(self) -> None:
        super().__init__()
        self.n = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def counted_step(warmup_steps: int) -> int | None:
    """The step whose work is counted: the last warm-up step (0-based), None without warm-up (a counted step
    runs slower, and every step after the warm-up is timed)."""
    return warmup_steps - 1 if warmup_steps >= 1 else None


class Meter:
    """The host-work plant's hold on callgrind at the end of a phase of the counted step: ``spend`` adds a fraction
    of the phase's own instructions, counted under the phase."""

    unit: float | None = None
    """Instructions per unit of the plant's work, measured once per process."""
    CALIBRATION = 100_000

    def __init__(self, marks, read: Callable[[], dict[str, int]], phase: str):
        self.marks, self.read, self.phase = marks, read, phase

    def spend(self, fraction: float, work: Callable[[int], None]) -> int:
        """Run ``work(n)`` with n units of work worth ``fraction`` of the phase's instructions; return n."""
        own = self.read().get(self.phase, 0)
        if Meter.unit is None:
            self.marks.dump("probe")  # what reading cost, apart
            work(self.CALIBRATION)
            self.marks.dump("plant calibration")
            Meter.unit = self.read()["plant calibration"] / self.CALIBRATION
        n = round(fraction * own / Meter.unit)
        self.marks.dump("probe")
        work(n)
        self.marks.dump(self.phase)
        return n


class StepProbe:
    """Measures the phases of each step (``step`` then ``phase`` per phase); ``cpu`` holds the CPU time series,
    ``counts`` and ``instructions`` the counted step's figures per phase and for the whole step (``"step"``)."""

    def __init__(
        self,
        counted: int | None,
        ledger,
        tracker=None,
        device: torch.device | None = None,
        marks=None,
        read: Callable[[], dict[str, int]] | None = None,
        after_phase: Callable[[str, float, Meter | None], None] | None = None,
    ):
        """``marks``: callgrind client requests (``metrics.callgrind.Marks``) when the rank runs under callgrind,
        ``read`` what its dumps hold so far; ``after_phase(phase, cpu_seconds, meter)``: called at the end of
        each phase, inside its measures (``meter``: in the counted step under callgrind, else None)."""
        self.counted, self.ledger, self.tracker, self.marks, self.read = counted, ledger, tracker, marks, read
        self.gpu = device is not None and device.type == "cuda"
        self.device = device
        self.after_phase = after_phase or (lambda phase, seconds, meter: None)
        self.cpu: dict[str, list[float]] = {p: [] for p in PHASES}
        self.counts: dict[str, dict[str, int | None]] = {}
        self.instructions: dict[str, int] | None = None
        self._counting = False
        self._calls = 0

    @contextlib.contextmanager
    def step(self, step: int) -> Iterator[StepProbe]:
        """One step: its phases follow inside."""
        self._counting = step == self.counted
        if self._counting:
            gc.collect()
            gc.disable()
            if self.marks is not None:
                self.marks.start()
                self.marks.zero()
        try:
            yield self
        finally:
            if self._counting:
                if self.marks is not None:
                    self.marks.stop()
                gc.enable()
                self._total()
            self._counting = False

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """One phase (a phase that raises records nothing)."""
        c0 = time.process_time()
        counting = self._counting
        instrumented = counting and self.marks is not None
        before = self._snapshot() if counting else None
        with self._count(name) if counting else contextlib.nullcontext():
            yield
        if instrumented:
            self.marks.dump(name)
        self.after_phase(name, time.process_time() - c0, Meter(self.marks, self.read, name) if instrumented else None)
        self.cpu[name].append(time.process_time() - c0)
        if counting:
            after = self._snapshot()
            self.counts[name].update({k: None if v is None else after[k] - v for k, v in before.items()})
        if instrumented:
            self.marks.dump("probe")  # this bookkeeping, apart from the next phase

    @contextlib.contextmanager
    def _count(self, name: str) -> Iterator[None]:
        ops = _OpCounter()
        calls = [0]

        def profile(frame, event, arg):  # Python functions and builtins called on this thread
            if event in ("call", "c_call"):
                calls[0] += 1

        previous = sys.getprofile()
        with ops:
            sys.setprofile(profile)
            try:
                yield
            finally:
                sys.setprofile(previous)
        self.counts[name] = {"py_calls": calls[0], "ops_dispatched": ops.n}

    def _snapshot(self) -> dict[str, int | None]:
        allocs, nbytes = None, None
        if self.gpu:
            stats = torch.cuda.memory_stats(self.device)
            allocs, nbytes = stats.get("allocation.all.allocated", 0), stats.get("allocated_bytes.all.allocated", 0)
        elif self.tracker is not None:
            allocs, nbytes = self.tracker.allocations, self.tracker.allocated_bytes
        recs = self.ledger.records
        return {
            "allocations": allocs,
            "allocated_bytes": nbytes,
            "collective_calls": len(recs),
            "collective_bytes": sum(r.bytes for r in recs),
        }

    def _total(self) -> None:
        if not all(p in self.counts for p in PHASES):
            return  # a phase raised: the step is not whole
        self.counts["step"] = {
            k: None if any(self.counts[p].get(k) is None for p in PHASES) else sum(self.counts[p][k] for p in PHASES)
            for k in COUNTS
        }

    def read_instructions(self) -> None:
        """Collect the counted step's instruction counts by phase from the rank's callgrind dumps."""
        got = self.read() if self.read is not None else {}
        if got and all(p in got for p in PHASES):
            self.instructions = {p: got[p] for p in PHASES}
            self.instructions["step"] = sum(got[p] for p in PHASES)
