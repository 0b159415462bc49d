"""Training systems the loop can drive: zerobench's own stack, or a baseline adapter.

A system owns the model and its parallelism and exposes one micro-batch ``forward_backward``, ``step``,
``zero_grad`` and its memory figures; the training loop (data, timing, rows) is shared, so every system
is measured the same way.
"""

from __future__ import annotations

from typing import Protocol

import torch
from torch import nn

from zerobench.config import ConfigError
from zerobench.distributed.mesh import Mesh
from zerobench.metrics.comm import CommLedger
from zerobench.models.fused import apply_fused_kernels
from zerobench.models.gpt import GPT
from zerobench.parallel.checkpointing import apply_activation_checkpointing
from zerobench.parallel.tensor_parallel import apply_tp
from zerobench.train.config import TrainConfig
from zerobench.zero import apply_zero

SYSTEMS = ("zerobench", "megatron")  # and the peers of zerobench.peers


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


class ZeroSystem:
    """zerobench: plain GPT -> apply_tp -> fused kernels -> activation checkpointing -> apply_zero."""

    def __init__(self, cfg: TrainConfig, mesh: Mesh, ledger: CommLedger, device: torch.device):
        torch.manual_seed(cfg.seed)
        model = GPT(cfg.model).to(device)
        # Order matters: TP decides which parameters exist on this rank, checkpointing wraps the blocks,
        # and ZeRO partitions whatever parameters are left, over this TP rank's DP group.
        tp_info = apply_tp(model, mesh.tp, ledger, seed=cfg.seed, sequence_parallel=cfg.sequence_parallel)
        apply_fused_kernels(model, cfg.kernels)
        self.store = apply_activation_checkpointing(model, cfg.activation, mesh.tp, ledger, tp_info.rng)
        self.engine = apply_zero(model, mesh.dp, cfg.zero, ledger, tp=tp_info)
        self.module, self.ledger = model, ledger

    def forward_backward(self, x, y):
        loss = self.module(x, y)
        self.engine.backward(loss)
        return loss.detach()

    def step(self) -> bool:
        return self.engine.step()

    def zero_grad(self) -> None:
        self.engine.zero_grad()

    def memory_ledger(self) -> dict[str, int]:
        led = self.engine.memory_ledger()
        if self.store is not None:
            led.update(self.store.peak)
        return led

    def model_state_bytes(self) -> int:
        return self.engine.model_state_bytes()

    def model_state_bytes_analytic(self) -> float:
        return sum(self.engine.model_state_bytes_analytic().values())

    def tensors(self) -> list[torch.Tensor]:
        return self.engine.tensors()

    def host_state_bytes(self) -> dict | None:
        """Offloaded model states: measured host bytes and the analytic figure (None without offload)."""
        if self.engine.host is None:
            return None
        return {"measured": self.engine.host_model_state_bytes(),
                "analytic": sum(self.engine.host_state_bytes_analytic().values())}


def build_system(cfg: TrainConfig, mesh: Mesh, ledger: CommLedger, device: torch.device) -> TrainSystem:
    if cfg.system == "zerobench":
        return ZeroSystem(cfg, mesh, ledger, device)
    if cfg.system == "megatron":
        from zerobench.baselines.megatron import MegatronSystem

        return MegatronSystem(cfg, mesh, ledger, device)
    from zerobench.peers import PEERS

    if cfg.system in PEERS:
        return PEERS[cfg.system](cfg, mesh, ledger, device)
    raise ConfigError(f"unknown system {cfg.system!r}: choose zerobench, megatron or a peer ({', '.join(PEERS)})")
