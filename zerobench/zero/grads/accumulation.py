"""Accumulation windows: which backward passes synchronise gradients, and when ``step()`` may run.

A window is ``grad_accum_steps`` micro-batches (``ZeroConfig``); its last backward synchronises: reduces the
window's gradients over the DP group. Backward passes under ``no_sync()`` (DDP's and DeepSpeed's spelling)
are extra micro-batches of the current window that never synchronise and do not count towards it; the
next backward outside it synchronises them all, so DDP's accumulation loop runs unchanged::

    with engine.no_sync():
        (model(x0) / 2).backward()
    (model(x1) / 2).backward()      # synchronises both
    engine.optimizer.step()

At stages 0-1 gradients then accumulate locally and are reduced once; at stages 2-3 each micro-batch's
gradients are reduce-scattered into the partition as usual (the partition is what accumulates, as it must
be with sharded gradients): ``no_sync()`` changes neither the result nor the traffic there. A window's
micro-batches come either all from ``engine.backward(loss)`` or all from a plain ``loss.backward()``: the
two scale the loss differently (``zero/grads/backward.py``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass


@dataclass
class MicroBatch:
    """What the bucket group needs to know about the micro-batch whose backward starts."""

    sync: bool
    """Its backward reduces the window's gradients."""
    first: bool
    """It starts a window."""


class StepInsideNoSync(RuntimeError, AssertionError):
    """A step called inside ``no_sync()``, whose backward passes have not synchronised the window's gradients.
    An ``AssertionError`` too, as DeepSpeed's engine asserts it (``test_no_sync_ctxt.py`` expects that type)."""


def refuse_inside_no_sync(window: AccumulationWindow, caller: str) -> None:
    if window.suspended:
        raise StepInsideNoSync(
            f"{caller} inside no_sync(): the window's gradients are not synchronised yet; leave the no_sync() "
            "context first, and run the window's last backward outside it"
        )


class AccumulationWindow:
    """Counts micro-batches into windows; see the module docstring."""

    def __init__(self, grad_accum_steps: int):
        self.accum = grad_accum_steps
        self.counted = 0
        """Micro-batches counted towards windows since construction (not those under ``no_sync()``)."""
        self.unsynced = 0
        """Micro-batches under ``no_sync()`` since the last synchronising one."""
        self.plain = False
        """This window's micro-batches come from plain ``loss.backward()`` calls."""
        self.suspended = False
        self.boundary: bool | None = None
        """A boundary set by hand (DeepSpeed's ``set_gradient_accumulation_boundary``), for every backward until
        it is set again: True ends the window at this micro-batch whatever the count (a window shorter or longer
        than ``accum``, e.g. an epoch's last); False makes it one more micro-batch of the window that does not
        synchronise, as under ``no_sync()``. None: windows are counted."""
        self.counted_from = 0
        """The engine's ``micro_steps`` where windows counted in ``step()`` calls begin (``rule``): where the
        accumulation steps last changed, or a load restarted the window."""
        self.rule: Callable[[], bool] | None = None
        """Where no boundary is set by hand: whether the current micro-batch ends its window, asked at each
        backward (``initialize``'s engine: DeepSpeed counts micro-batches in ``engine.step()`` calls, so every
        backward between two of them belongs to one micro-batch). None: each backward is a micro-batch."""

    @contextlib.contextmanager
    def no_sync(self):
        outer, self.suspended = self.suspended, True
        try:
            yield
        finally:
            self.suspended = outer

    def begin(self, plain: bool) -> MicroBatch:
        first = self.counted % self.accum == 0 and not self.unsynced
        if not first and plain != self.plain:
            raise RuntimeError(
                "one accumulation window mixes engine.backward(loss) (or engine.scale(loss).backward()) "
                "and plain loss.backward(): use one of them for all grad_accum_steps micro-batches "
                "of a window"
            )
        self.plain = plain
        boundary = self.boundary if self.boundary is not None or self.rule is None else self.rule()
        if self.suspended or boundary is False:
            self.unsynced += 1
            return MicroBatch(sync=False, first=first)
        if boundary:  # the window ends here: count it whole
            self.counted = (self.counted // self.accum + 1) * self.accum
            self.unsynced = 0
            return MicroBatch(sync=True, first=first)
        self.counted += 1
        sync = self.counted % self.accum == 0
        if sync:
            self.unsynced = 0
        return MicroBatch(sync=sync, first=first)

    def cleared(self) -> None:
        """``zero_grad()`` dropped the gradients of the passes under ``no_sync()``: nothing of them is left to
        synchronise, so a ``step()`` next is torch's no-op, not a window missing its last backward. Counted
        micro-batches keep counting (DeepSpeed's boundaries do not move with ``zero_grad()``)."""
        self.unsynced = 0

    def restart(self) -> None:
        """A new window starts with the next micro-batch, whatever ran before (a checkpoint was loaded: the state
        it holds is a window's boundary, and micro-batches run before the load belong to no window now)."""
        self.counted = self.unsynced = 0

    @property
    def open(self) -> int:
        """Micro-batches of the current window run so far (0: none, or the window is complete)."""
        return self.counted % self.accum + self.unsynced

    def check_step(self) -> None:
        """``step()`` needs a complete window: one line saying what is missing otherwise."""
        if self.counted % self.accum:
            raise RuntimeError(
                f"step() after {self.counted % self.accum} of {self.accum} micro-batches: call "
                f"backward() for every micro-batch first"
            )
        if self.unsynced and self.rule is not None and self.boundary is None:
            raise RuntimeError(
                f"step() after {self.unsynced} backward pass(es) of a window that has not ended: this engine counts "
                "micro-batches in engine.step() calls, as DeepSpeed's does; call engine.step() after each "
                "micro-batch's backward (it steps at the window's end)"
            )
        if self.unsynced:
            raise RuntimeError(
                f"step() after {self.unsynced} backward pass(es) under no_sync() and none outside it: "
                f"the window's last backward must run outside no_sync() (it synchronises)"
            )
