"""The Megatron-LM baseline's registration: what it can run (checked before launch) and how it is built."""

from __future__ import annotations

from zerobench.config import ConfigError
from zerobench.train.entry import SystemEntry


def validate(cfg) -> None:
    """Megatron-LM's DDP baseline: stage 0, fp32 or Megatron-LM's mixed precision (fp16, bf16), plain activation
    checkpointing."""
    if not cfg.zero.overlap_comm:
        raise ConfigError(
            "the megatron baseline always overlaps its gradient all-reduce with backward: drop --no-overlap-comm"
        )
    if cfg.sequence_parallel:
        raise ConfigError("--sp is zerobench's sequence parallelism: drop it for the megatron baseline")
    if cfg.zero.stage != 0:
        raise ConfigError("the megatron baseline is Megatron-LM's DDP (stage 0): drop --stage")
    if cfg.zero.clip_grad_norm is not None:
        raise ConfigError("the megatron baseline does not clip gradients: drop --clip")
    a = cfg.activation
    if a.partition or a.cpu_offload or a.contiguous:
        raise ConfigError(
            "P_a, P_a+cpu and M_D are ZeRO-R features: the megatron baseline takes only --checkpoint-activations"
        )


def build(cfg, mesh, ledger, device):
    from zerobench.baselines.megatron import MegatronSystem  # megatron-core loads here, not at import

    return MegatronSystem(cfg, mesh, ledger, device)


MEGATRON = SystemEntry("megatron", build, validate)
