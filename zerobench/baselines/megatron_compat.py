"""CPU compatibility for megatron-core 0.16.1, used only by the Megatron-LM baseline and only without CUDA.

megatron-core's ``GPTModel`` path asks ``torch.cuda.current_device()`` for buffer placement and keeps its
model-parallel RNG states through private CUDA-RNG helpers. On a CPU-only machine, inside ``cpu_compat()``
(and nowhere else) those calls are redirected to the CPU device and the CPU generator. zerobench's own
engine never imports this module. The default causal mask, which megatron builds on ``"cuda"`` when
``attention_mask`` is None, is avoided by passing an explicit mask (``causal_mask``), not by patching.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import torch


def causal_mask(seq: int, device: torch.device) -> torch.Tensor:
    """Megatron's mask convention: True where attention is *not* allowed, shape [1, 1, s, s]."""
    return torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=device), diagonal=1).view(1, 1, seq, seq)


@contextlib.contextmanager
def cpu_compat():
    if torch.cuda.is_available():
        yield
        return
    from megatron.core.tensor_parallel import random as mrandom

    with contextlib.ExitStack() as stack:
        stack.enter_context(mock.patch.object(torch.cuda, "current_device", lambda: torch.device("cpu")))
        stack.enter_context(mock.patch.object(torch.cuda, "manual_seed", torch.manual_seed))
        stack.enter_context(mock.patch.object(torch.cuda, "get_rng_state", lambda *a, **k: torch.get_rng_state()))
        stack.enter_context(mock.patch.object(torch.cuda, "set_rng_state", lambda s, *a, **k: torch.set_rng_state(s)))
        stack.enter_context(mock.patch.object(mrandom, "_get_cuda_rng_state", lambda *a, **k: torch.get_rng_state()))
        stack.enter_context(
            mock.patch.object(mrandom, "_set_cuda_rng_state", lambda state, *a, **k: torch.set_rng_state(state))
        )
        yield
