"""Memory measurement: storage accounting and a live-tensor tracker (what ``metrics/analytic.py`` predicts, measured).

- ``storage_bytes``: bytes of distinct storages behind a set of tensors (views count once).
- ``LiveTensorTracker``: a dispatch mode that follows every storage allocated under it (plus those
  registered with ``track``) and records current and peak live bytes — the CPU stand-in for
  ``torch.cuda.max_memory_allocated``. With ``budget_bytes`` it raises ``TrackedOutOfMemory`` when an
  allocation would exceed the budget, emulating a device of that size. ``untracked()`` pauses it around
  host-memory work (offload), which a device budget does not cover. Storages resized in place while it is
  active (stage 3's gathers; FSDP's unsharded parameters, freed and re-grown) are followed by intercepting
  ``UntypedStorage.resize_``, which no operator reports. With ``rss=True`` it also keeps the
  resident set's breakdown at its highest sample (``metrics/rss.py``).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterable

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _get_current_dispatch_mode_stack
from torch.utils._pytree import tree_flatten

from zerobench.metrics.rss import RssPeak


def storage_bytes(tensors: Iterable[torch.Tensor]) -> int:
    seen: dict[int, int] = {}
    for t in tensors:
        st = t.untyped_storage()
        if st.nbytes():
            seen[st._cdata] = st.nbytes()  # the StorageImpl: also distinct for meta tensors
    return sum(seen.values())


class TrackedOutOfMemory(RuntimeError):
    """Raised by ``LiveTensorTracker`` when live bytes would exceed its budget."""


class LiveTensorTracker(TorchDispatchMode):
    """Tracks live storage bytes of everything allocated while active."""

    def __init__(self, budget_bytes: int | None = None, rss: bool = False):
        super().__init__()
        self.budget_bytes = budget_bytes
        self.paused = False
        self.live: dict[int, tuple[weakref.ref, int]] = {}
        self.current = 0
        self.peak = 0
        self.allocations = 0
        """Storages it began to follow, and storages it follows that grew from empty (stage 3's gathers)."""
        self.allocated_bytes = 0
        """Bytes those allocations and every in-place growth of a followed storage added."""
        self.rss = RssPeak(self.live_ranges) if rss else None
        """With ``rss``: the RSS sampled after every operator, broken down at its highest (``metrics/rss.py``)."""

    def live_ranges(self) -> list[tuple[int, int]]:
        """(address, bytes) of every live tracked storage."""
        out = []
        for ref, _ in list(self.live.values()):
            st = ref()
            try:  # a storage swapped out or resized by its owner (FSDP2) reads as it is now, or not at all
                if st is not None and st.nbytes():
                    out.append((st.data_ptr(), st.nbytes()))
            except RuntimeError:
                continue
        return out

    def _key(self, st: torch.UntypedStorage) -> int:
        return id(st)

    def track(self, t: torch.Tensor) -> None:
        self._track_storage(t.untyped_storage())

    def _track_storage(self, st: torch.UntypedStorage) -> None:
        key = self._key(st)
        if key in self.live or st.device.type == "meta":
            return
        nbytes = st.nbytes()

        def _gone(_ref, key=key):
            entry = self.live.pop(key, None)
            if entry is not None:
                self.current -= entry[1]

        self._add(nbytes)  # raises (and records nothing) when over budget
        self.live[key] = (weakref.ref(st, _gone), nbytes)
        self.allocations += 1
        self.allocated_bytes += nbytes

    def _add(self, nbytes: int) -> None:
        self.current += nbytes
        if self.budget_bytes is not None and self.current > self.budget_bytes:
            over = self.current
            self.current -= nbytes
            raise TrackedOutOfMemory(
                f"tracked memory {over / 2**20:.1f} MiB would exceed the budget of {self.budget_bytes / 2**20:.1f} MiB"
            )
        self.peak = max(self.peak, self.current)

    def resized(self, st: torch.UntypedStorage, old: int, new: int) -> None:
        """``st`` was resized in place from ``old`` to ``new`` bytes (a storage not followed yet that grows
        is followed from now on)."""
        key = self._key(st)
        if key not in self.live:
            if new > old and not self.paused:
                self._track_storage(st)
            return
        ref, _ = self.live[key]
        self.live[key] = (ref, new)
        if new > old:
            self._add(new - old)
            self.allocations += old == 0
            self.allocated_bytes += new - old
        else:
            self.current -= old - new

    def __enter__(self):
        _intercept_resizes(True)
        try:
            return super().__enter__()
        except BaseException:
            _intercept_resizes(False)
            raise

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            _intercept_resizes(False)

    def reset_peak(self) -> None:
        self.peak = self.current
        if self.rss is not None:
            self.rss.reset()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.paused:
            return out
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor):
                self.track(t)
        if self.rss is not None:
            self.rss.sample()
        return out


@contextlib.contextmanager
def untracked(enabled: bool = True):
    """Pause every active ``LiveTensorTracker``: for host-memory work (offload), outside a device budget."""
    modes = [m for m in _get_current_dispatch_mode_stack() if isinstance(m, LiveTensorTracker)] if enabled else []
    before = [m.paused for m in modes]
    for m in modes:
        m.paused = True
    try:
        yield
    finally:
        for m, b in zip(modes, before):
            m.paused = b


def resize_storage(t: torch.Tensor, nbytes: int) -> None:
    """Resize ``t``'s storage (stage 3 alloc/free); an active ``LiveTensorTracker`` sees it, as it sees
    every storage resize made while it is active, whoever makes it."""
    st = t.untyped_storage()
    if st.nbytes() != nbytes:
        st.resize_(nbytes)


_real_resize = torch.UntypedStorage.resize_
_active = [0]  # trackers entered and not exited


def _tracked_resize(self: torch.UntypedStorage, size: int):
    """``UntypedStorage.resize_`` while a tracker is active: FSDP1 and FSDP2 free and re-grow their
    unsharded parameters' storages in place, which no operator reports; every active tracker is told."""
    old = self.nbytes()
    out = _real_resize(self, size)
    if self.nbytes() != old:
        for mode in _get_current_dispatch_mode_stack():
            if isinstance(mode, LiveTensorTracker):
                mode.resized(self, old, self.nbytes())
    return out


def _intercept_resizes(on: bool) -> None:
    _active[0] += 1 if on else -1
    torch.UntypedStorage.resize_ = _tracked_resize if _active[0] > 0 else _real_resize


def _proc_status_kib(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def peak_rss_bytes() -> int | None:
    """Peak resident set size of this process (VmHWM), or None where /proc is unavailable."""
    kib = _proc_status_kib("VmHWM")
    return None if kib is None else kib * 1024


def reset_peak_rss() -> None:
    """Reset VmHWM to the current RSS (Linux ``clear_refs``), so peaks exclude set-up."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


class TrackedAllocator:
    """The engine's allocator (``zerobench.zero.storage.allocator.Allocator``) when a ``LiveTensorTracker`` may be
    counting: host work pauses the tracker. Its resize is the plain one: an active tracker follows every
    storage resize itself. Harmless with none active."""

    def host_region(self, enabled: bool = True):
        return untracked(enabled)

    def resize(self, t: torch.Tensor, nbytes: int) -> None:
        resize_storage(t, nbytes)
