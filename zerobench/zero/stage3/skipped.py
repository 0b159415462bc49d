"""Stage 3 with a unit that some ranks skip and others run (LayerDrop, a rank-dependent branch): which units a rank
replays, and where, so that every rank still issues the same collectives in the same order.

A unit's all-gathers and reduce-scatters are collectives. A rank whose forward skips unit j would otherwise issue
unit j+1's all-gather where the others issue unit j's, and in backward an all-gather where the others
reduce-scatter: a hang until the collective timeout, a crash inside gloo or NCCL, or, where the two units' buckets
have the same sizes, each rank silently given the other's shards. So the skipping rank *replays* the unit at the
point where it would have run:

- in forward, before the next unit it does run (or at the end of the model's forward): the unit's gather, the
  prefetch its forward would have started, and its free;
- in backward, before the next unit whose backward begins (or at the end of backward): its gather and prefetch,
  its gradient buckets completed with zeros and reduce-scattered, and its free. The other ranks' gradients are
  reduced with this rank's zeros, which is single-process training's gradient on the global batch, as for a
  parameter unused within a unit (``find_unused_parameters=True``; without it every rank refuses the step, as
  at stages 0-2).

Units are expected in the order ``apply_zero`` was given them (registration order by default) in forward and in its
reverse in backward, the order the prefetch assumes too. A unit called again, or out of that order, is gathered where
it is called and replays nothing. A model whose forward runs its units in another order (a decoder
registered before the encoder it follows) would have its early units replayed and then run: the first time a
replayed unit runs in the same forward, which every rank sees in the same forward, replaying stops for good
(``out_of_order`` names the two units, for the gatherer's warning). A backward replays only units that ran in no
forward since the last backward, so one never replays a unit whose gradients are still to come.

Still unmatched: a unit *called* a different number of times on different ranks (each extra call is an all-gather
the others do not issue), and a unit run on every rank whose output reaches the loss on some ranks only.
``SkipTracker`` is the bookkeeping alone, without tensors or processes; the gatherer (``zero/stage3/gatherer.py``)
does the replays.
"""

from __future__ import annotations


class SkipTracker:
    """Which of units 1..n (0 is the root, never skipped) a rank skipped, and when to replay them."""

    def __init__(self, n_units: int):
        self.n = n_units
        self.window: set[int] = set()
        """Units run in a forward with autograd recording since the last backward (what a backward may find gradients
        for; an evaluation forward under ``torch.no_grad()`` leaves none)."""
        self._stale = False
        """A backward ran since ``window`` was last started: the next forward starts it anew."""
        self._fwd_next: int | None = None
        """The next unit due in the model's forward now running; None outside it."""
        self._bwd_task: int | None = None
        self._bwd_next = 0
        """The next unit due in the backward of autograd task ``_bwd_task`` (descending)."""
        self._from_root = False
        """That backward began at the root's output (the model's whole backward)."""
        self._replayed: set[int] = set()
        """Units replayed in the forward now running."""
        self._last_run = 0
        self.out_of_order: tuple[int, int] | None = None
        """(a unit replayed and then run in the same forward, the unit run before it): replaying is off."""

    def begin_forward(self) -> None:
        """The model's (root's) forward begins."""
        if self._stale:
            self.window, self._stale = set(), False
        self._fwd_next, self._replayed, self._last_run = 1, set(), 0

    def forward_unit(self, i: int, graph: bool = True) -> list[int]:
        """Unit ``i``'s forward begins: the units this forward skipped before it, to replay first (ascending).
        ``graph``: autograd records it (not under ``torch.no_grad()``), so its gradients may come."""
        if graph:
            self.window.add(i)
        last, self._last_run = self._last_run, i
        if self._fwd_next is None or i < self._fwd_next:  # outside the model's forward, called again or out of order
            if i in self._replayed and self.out_of_order is None:
                self.out_of_order = (i, last)
            return []
        skipped = [] if self.out_of_order else list(range(self._fwd_next, i))
        self._replayed.update(skipped)
        self._fwd_next = i + 1
        return skipped

    def end_forward(self) -> list[int]:
        """The model's forward ends: the units it skipped after the last one it ran, to replay (ascending)."""
        skipped = [] if self._fwd_next is None or self.out_of_order else list(range(self._fwd_next, self.n + 1))
        self._fwd_next = None
        return skipped

    def begin_backward(self, task: int) -> None:
        """The root's backward begins in autograd task ``task`` (the backward of the whole model)."""
        self._bwd_task, self._bwd_next, self._stale, self._from_root = task, self.n, True, True

    def backward_unit(self, i: int, task: int) -> list[int]:
        """Unit ``i``'s backward begins in ``task``: the units skipped since the last one, to replay first (descending);
        none in a backward that did not begin at the root's output."""
        self._stale = True
        if task != self._bwd_task:  # a backward that did not start at the root's output: nothing to match
            self._bwd_task, self._from_root = task, False
        if not self._from_root or self.out_of_order:
            return []
        skipped = [j for j in range(self._bwd_next, i, -1) if j not in self.window]
        self._bwd_next = min(self._bwd_next, i - 1)
        return skipped

    def end_backward(self, task: int) -> list[int]:
        """Task ``task``'s backward ends: the units below the last one it reached that it skipped (descending)."""
        if task != self._bwd_task or not self._from_root or self.out_of_order:
            return []
        skipped = [j for j in range(self._bwd_next, 0, -1) if j not in self.window]
        self._bwd_task = None
        return skipped
