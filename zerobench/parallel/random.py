"""TP-aware random numbers: dropout differs across TP ranks inside sharded regions, agrees outside.

Outside sharded regions every TP rank draws from the default generator, seeded identically, so
dropout on replicated activations (the residual branches) is the same on every TP rank, as it must be.
Inside a sharded region (attention, whose heads are split over TP ranks) ``TPRngTracker.fork()`` swaps
in a generator state seeded per TP rank and swaps it back afterwards, as Megatron-LM's model-parallel
RNG tracker does. Checkpoint recompute captures and replays both states (``get_state``/``set_state``).
"""

from __future__ import annotations

import contextlib

import torch

TP_SEED_OFFSET = 2718


class TPRngTracker:
    """The per-TP-rank RNG state used inside sharded regions."""

    def __init__(self, seed: int, tp_rank: int, device: torch.device):
        self.device = device
        saved = self._get_global()
        torch.manual_seed(seed + TP_SEED_OFFSET + tp_rank)
        self.state = self._get_global()
        self._set_global(saved)

    def _get_global(self):
        cuda = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        return torch.get_rng_state(), cuda

    def _set_global(self, state) -> None:
        torch.set_rng_state(state[0])
        if state[1] is not None:
            torch.cuda.set_rng_state(state[1], self.device)

    @contextlib.contextmanager
    def fork(self):
        saved = self._get_global()
        self._set_global(self.state)
        try:
            yield
        finally:
            self.state = self._get_global()
            self._set_global(saved)

    def get_state(self):
        return self.state

    def set_state(self, state) -> None:
        self.state = state
