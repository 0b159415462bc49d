"""Clocks for the profiler: where a piece of a step starts and ends, on the device that runs it.

On a CPU the host *is* the device: ``perf_counter`` at hooks bounds each piece. On a GPU the host only
issues kernels and runs ahead, so a piece has two costs, and the profiler reads each with its own clock:

- ``DeviceClock``: CUDA events recorded on the current stream at each hook; after the step's
  synchronisation they give the stream's time between hooks (what the device spends on the piece,
  including any gap where it waited for the host to issue work);
- ``LaunchClock``: host time with the device drained at every stamp (``synchronize`` before reading on),
  the time spent in synchronisation left out: what the host needs to *issue* the piece with nothing
  queued ahead of it, the launch cost the replay puts on its host stream.

Every clock's ``stamp()`` returns an opaque mark and ``seconds(mark)`` turns it into seconds since an
arbitrary origin once the step is done (``finish()``), so the profiler's arithmetic is the same on all
three.
"""

from __future__ import annotations

import time

import torch


class HostClock:
    """``perf_counter``: the CPU path."""

    def stamp(self):
        return time.perf_counter()

    def finish(self) -> None:
        pass

    def seconds(self, mark) -> float:
        return mark


class DeviceClock:
    """CUDA events on the current stream of ``device``."""

    def __init__(self, device: torch.device):
        self.device = device
        self.origin = self._event()

    def _event(self):
        ev = torch.cuda.Event(enable_timing=True)
        ev.record()
        return ev

    def stamp(self):
        return self._event()

    def finish(self) -> None:
        torch.cuda.synchronize(self.device)

    def seconds(self, mark) -> float:
        return self.origin.elapsed_time(mark) / 1e3


class LaunchClock:
    """Host time that stops while the device drains at each stamp."""

    def __init__(self, device: torch.device):
        self.device = device
        self.waited = 0.0

    def stamp(self):
        now = time.perf_counter()
        mark = now - self.waited
        torch.cuda.synchronize(self.device)
        self.waited += time.perf_counter() - now
        return mark

    def finish(self) -> None:
        torch.cuda.synchronize(self.device)

    def seconds(self, mark) -> float:
        return mark


def sync(device: torch.device) -> None:
    """Wait for ``device``'s queued work (nothing to wait for on a CPU)."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
