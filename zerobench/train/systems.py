"""The training-system interface the loop drives, and zerobench's own system (registered as ``train.entry.ZEROBENCH``).

A system owns the model and its parallelism and exposes one micro-batch ``forward_backward``, ``step``,
``zero_grad`` and its memory figures; the training loop (data, timing, rows) is shared, so every system
is measured the same way.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from zerobench.distributed.mesh import Mesh
from zerobench.metrics.comm import CommLedger
from zerobench.metrics.memory import TrackedAllocator
from zerobench.models.gpt import GPT
from zerobench.parallel.config import COMPILED
from zerobench.parallel.init import init_gpt
from zerobench.parallel.parallelize import ParallelSpec, parallelize
from zerobench.train.config import TrainConfig


class TrainSystem(Protocol):
    module: nn.Module
    ledger: CommLedger

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor: ...
    def step(self) -> bool: ...
    def zero_grad(self) -> None: ...
    def memory_ledger(self) -> dict[str, int]: ...
    def model_state_bytes(self) -> int: ...
    def model_state_bytes_analytic(self) -> float | None: ...
    def tensors(self) -> list[torch.Tensor]: ...


def parallel_spec(cfg: TrainConfig) -> ParallelSpec:
    """What ``parallelize`` applies for this run."""
    return ParallelSpec(
        zero=cfg.zero,
        sequence_parallel=cfg.sequence_parallel,
        kernels=cfg.kernels,
        activation=cfg.activation,
        seed=cfg.seed,
    )


class ZeroSystem:
    """zerobench: plain GPT -> apply_tp -> fused kernels -> activation checkpointing -> apply_zero."""

    def __init__(self, cfg: TrainConfig, mesh: Mesh, ledger: CommLedger, device: torch.device):
        torch.manual_seed(cfg.seed)
        with torch.device("meta"):  # no rank holds the whole model: each initialises its own part (parallel/init.py)
            model = GPT(cfg.model)
        # The CPU memory-budget emulation (live-tensor tracker) sees host work and stage-3 resizes.
        built = parallelize(model, mesh, parallel_spec(cfg), ledger, allocator=TrackedAllocator(), device=device)
        init_gpt(built.engine, cfg.model, built.tp)
        self.store, self.engine = built.store, built.engine
        self.module, self.ledger = model, ledger
        self.model_kernels = built.kernels
        self.op_counting = built.kernels != COMPILED  # compiled code refuses to run under the operator counter

    def forward_backward(self, x, y):
        loss = self.module(x, y)
        self.engine.backward(loss)
        return loss.detach()

    def step(self) -> bool:  # the loop zeroes next (zero_grad): torch's step, not engine.step()'s step-and-zero
        self.engine.optimizer.step()
        return self.engine.optimizer.applied

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def memory_ledger(self) -> dict[str, int]:
        led = self.engine.accounting.memory_ledger()
        if self.store is not None:
            led.update(self.store.peak)
        return led

    def model_state_bytes(self) -> int:
        return self.engine.accounting.model_state_bytes()

    def model_state_bytes_analytic(self) -> float:
        return sum(self.engine.accounting.model_state_bytes_analytic().values())

    def tensors(self) -> list[torch.Tensor]:
        return self.engine.accounting.tensors()

    def kernel_paths(self) -> dict[str, str]:
        """The paths the model's and the optimizer's kernels took ("fused", "reference" or "compiled"): ``auto``
        takes the reference where the fused kernels do not load (no C++ compiler, no Triton), and such a run's times and
        working memory are not the fused run's."""
        return {"model": self.model_kernels, "optimizer": self.engine.adamw.path}

    def host_state_bytes(self) -> dict | None:
        """Offloaded model states: measured host bytes and the analytic figure (None without offload)."""
        if not self.engine.placement.offloaded:
            return None
        return {
            "measured": self.engine.accounting.host_model_state_bytes(),
            "analytic": sum(self.engine.accounting.host_state_bytes_analytic().values()),
        }
