"""What every peer adapter shares: the model and optimizer set-up identical to zerobench's, the
accumulation window, and memory figures measured from the tensors a system holds."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from zerobench.config import ConfigError
from zerobench.metrics.memory import storage_bytes
from zerobench.models.gpt import GPT
from zerobench.train.config import TrainConfig


def check_supported(name: str, cfg: TrainConfig) -> None:
    """Peers run the plain DP comparison: one-line errors for what they are not wired for."""
    if cfg.tp != 1 or cfg.sequence_parallel:
        raise ConfigError(f"{name} is a data-parallel peer: drop --tp/--sp (TP peers: --system megatron)")
    deepspeed = name.startswith("deepspeed")  # also wired for checkpointing: the offload comparison on one card
    if cfg.zero.precision.value not in ("fp32", "bf16"):
        raise ConfigError(f"{name} runs fp32 or bf16 in the peer comparison: use --precision fp32 or bf16")
    if not cfg.zero.overlap_comm and not deepspeed:
        raise ConfigError(
            f"{name} always overlaps its gradient collectives with backward: drop --no-overlap-comm "
            "(it is wired for zerobench and the DeepSpeed peers)"
        )
    act = cfg.activation
    if act.checkpoint and not deepspeed:
        raise ConfigError(f"{name}: activation checkpointing is wired for the DeepSpeed peers only; drop it")
    if act.partition or act.cpu_offload or act.contiguous:
        raise ConfigError(
            f"{name}: P_a, P_a+cpu and M_D are zerobench's; a peer takes plain --checkpoint-activations at most"
        )


def build_model(cfg: TrainConfig, device: torch.device) -> GPT:
    """The same GPT, with the same init, as ``ZeroSystem`` builds."""
    torch.manual_seed(cfg.seed)
    return GPT(cfg.model).to(device)


def param_groups(module: nn.Module, cfg: TrainConfig) -> list[dict]:
    """zerobench's AdamW grouping: weight decay on parameters of 2+ dims only."""
    params = [p for p in module.parameters() if p.requires_grad]
    wd = cfg.zero.optimizer.weight_decay
    return [
        {"params": [p for p in params if p.dim() >= 2], "weight_decay": wd},
        {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0},
    ]


def adamw_kwargs(cfg: TrainConfig) -> dict:
    o = cfg.zero.optimizer
    return {"lr": o.lr, "betas": o.betas, "eps": o.eps}


def local(t: torch.Tensor) -> torch.Tensor:
    """The rank-local part of a (possibly DTensor) tensor."""
    return t.to_local() if hasattr(t, "to_local") else t


def optimizer_tensors(opt: torch.optim.Optimizer) -> list[torch.Tensor]:
    out = []
    for state in opt.state.values():
        out += [local(v) for v in state.values() if isinstance(v, torch.Tensor) and v.dim() > 0]
    return out


def bf16(cfg: TrainConfig) -> bool:
    return cfg.zero.precision.value == "bf16"


class PeerBase:
    """Shared loop plumbing: micro-batch window with ``no_sync`` where the wrapper has it, clipping,
    memory ledger from the tensors held. ``autocast``: the forward runs under ``torch.autocast`` in bf16 (fp32
    parameters, gradients and optimizer: torch's mixed precision for wrappers without a policy of their own)."""

    name: str
    module: nn.Module
    optimizer: torch.optim.Optimizer
    autocast: bool = False
    op_counting: bool = True
    """Whether the loop may count the last warm-up step's operators (a ``TorchDispatchMode``; ``train/probes.py``):
    ``torch.compile``'d code refuses to run under one."""

    def __init__(self, name: str, cfg: TrainConfig, ledger):
        check_supported(name, cfg)
        self.name, self.cfg, self.ledger = name, cfg, ledger
        self.micro = 0

    def _forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if not self.autocast:
            return self.module(x, y)
        with torch.autocast(device_type=x.device.type, dtype=torch.bfloat16):
            return self.module(x, y)

    def _no_sync(self):
        return contextlib.nullcontext()

    def forward_backward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        accum = self.cfg.zero.grad_accum_steps
        self.micro += 1
        ctx = self._no_sync() if self.micro % accum else contextlib.nullcontext()
        with ctx:
            loss = self._forward(x, y)
            (loss / accum).backward()
        return loss.detach()

    def _clip(self) -> None:
        if self.cfg.zero.clip_grad_norm is not None:
            torch.nn.utils.clip_grad_norm_(self.module.parameters(), self.cfg.zero.clip_grad_norm)

    def step(self) -> bool:
        self._clip()
        self.optimizer.step()
        return True

    def zero_grad(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def _params(self) -> list[torch.Tensor]:
        return [local(p) for p in self.module.parameters()]

    def _grads(self) -> list[torch.Tensor]:
        return [local(p.grad) for p in self.module.parameters() if p.grad is not None]

    def memory_ledger(self) -> dict[str, int]:
        return {
            "params": storage_bytes(self._params()),
            "grads": storage_bytes(self._grads()),
            "master": 0,
            "optimizer_states": storage_bytes(optimizer_tensors(self.optimizer)),
            "comm_buffers": 0,
        }

    def model_state_bytes(self) -> int:
        led = self.memory_ledger()
        return led["params"] + led["grads"] + led["master"] + led["optimizer_states"]

    def model_state_bytes_analytic(self) -> float | None:
        return None

    def tensors(self) -> list[torch.Tensor]:
        return self._params() + self._grads() + optimizer_tensors(self.optimizer)
