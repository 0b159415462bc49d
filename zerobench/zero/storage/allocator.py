"""How the engine allocates outside the plain path, as an interface it is given (``apply_zero(allocator=)``):
marking work on host memory (offload: outside the device's budget) and resizing a storage in place
(stage 3 gathers into a unit's full buffer and frees it).

``PlainAllocator`` does exactly that and nothing more. The harness gives a tracking implementation
(``zerobench.metrics.memory.TrackedAllocator``) when it emulates a device budget on CPU with its live-tensor
tracker; the engine itself never imports the emulator.
"""

from __future__ import annotations

import contextlib
from contextlib import AbstractContextManager
from typing import Protocol

import torch


class Allocator(Protocol):
    def host_region(self, enabled: bool = True) -> AbstractContextManager[None]:
        """Allocations inside are host memory (not the device's) when ``enabled``."""
        ...

    def resize(self, t: torch.Tensor, nbytes: int) -> None:
        """Resize ``t``'s storage to ``nbytes`` in place (0 frees it)."""
        ...


class PlainAllocator:
    """No accounting: a no-op host region and a plain storage resize."""

    def host_region(self, enabled: bool = True) -> AbstractContextManager[None]:
        return contextlib.nullcontext()

    def resize(self, t: torch.Tensor, nbytes: int) -> None:
        st = t.untyped_storage()
        if st.nbytes() != nbytes:
            st.resize_(nbytes)
