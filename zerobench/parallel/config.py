"""Parallelism options and shape checks as plain Python: importable without torch (suite parsing, the sweep
parent)."""

from __future__ import annotations

from dataclasses import dataclass

from zerobench.config import ConfigError
from zerobench.models.config import GPTConfig


@dataclass(frozen=True)
class ActivationConfig:
    """Activation checkpointing and ZeRO-R activation options."""

    checkpoint: bool = False
    """Recompute each transformer block's activations in backward from its saved input."""
    partition: bool = False
    """P_a: keep 1/MP of each checkpoint per TP rank, all-gather before recompute (needs checkpoint)."""
    cpu_offload: bool = False
    """P_a+cpu: keep the (partitioned) checkpoints in host memory (implies partition)."""
    contiguous: bool = False
    """M_D: place checkpoints in one pre-allocated contiguous buffer."""

    def validate(self) -> None:
        from zerobench.config import ConfigError

        if (self.partition or self.cpu_offload or self.contiguous) and not self.checkpoint:
            raise ConfigError("P_a, P_a+cpu and M_D act on activation checkpoints: add --checkpoint-activations")


def validate_tp(cfg: GPTConfig, tp: int) -> None:
    """One-line errors for model shapes that a TP degree cannot split."""
    for what, n in (("attention heads", cfg.heads), ("hidden size", cfg.hidden), ("vocabulary", cfg.vocab)):
        if n % tp:
            fix = (
                "pad the vocabulary to a multiple of the TP degree"
                if what == "vocabulary"
                else "choose a TP degree dividing it"
            )
            raise ConfigError(f"{what} {n} is not divisible by TP degree {tp}: {fix}")


def validate_sp(activation: ActivationConfig, sequence_parallel: bool, tp: int) -> None:
    """Refuse P_a (or P_a+cpu) under sequence parallelism: there each TP rank's block input is its own slice of the
    sequence, and P_a, which keeps 1/TP of a checkpoint it takes to be the same on every TP rank, would gather the
    slices of different tensors back into a wrong input for the recompute. Megatron-LM refuses the pair too
    (``distribute_saved_activations`` with ``sequence_parallel``); SP already keeps 1/TP of each checkpoint."""
    if sequence_parallel and tp > 1 and (activation.partition or activation.cpu_offload):
        raise ConfigError(
            "P_a (--pa, --pa-cpu, --paper-config C2/C4/C5) with sequence parallelism (--sp): under SP each TP rank's "
            "checkpoint is already its own 1/TP of the sequence, which P_a cannot partition again; drop one of them"
        )


COMPILED = "compiled"
"""The kernel mode that compiles the blocks (``ParallelSpec.kernels``, ``TrainConfig.kernels``)."""


def check_compilable(tp: int, activation: ActivationConfig) -> None:
    """One line for the combinations ``apply_compile`` does not take (why: ``parallel/compiled.py``)."""
    if tp > 1:
        raise ConfigError(
            "--kernels compiled compiles whole blocks, and TP's collectives run inside them: use --tp 1, "
            "or --kernels auto with TP"
        )
    if activation.checkpoint:
        raise ConfigError(
            "--kernels compiled does not take activation checkpointing (the recompute runs inside the block): "
            "drop --checkpoint-activations/--pa, or use --kernels auto"
        )
