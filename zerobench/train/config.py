"""Typed configuration of one training run (model + ZeRO + batch + schedule), validated up front."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from zerobench.config import SEED_MAX, ConfigError
from zerobench.distributed.backends import BACKENDS
from zerobench.models.config import GPTConfig
from zerobench.parallel.config import COMPILED, ActivationConfig, check_compilable
from zerobench.zero.config import ZeroConfig


@dataclass(frozen=True)
class ProfileConfig:
    """torch.profiler traces of a run's last steps (``train/profiling.py``)."""

    dir: str
    """Rank r writes ``<dir>/<run id>/rank<r>.trace.json`` (Perfetto, chrome://tracing) and ``rank<r>.ops.txt``
    (operators by self time, CUDA time first on a GPU)."""
    steps: int = 2
    """Steps traced: the run's last ones. They run slower under the profiler, so the timing medians leave them
    out; peak RSS includes the profiler's host buffers. On CPU, ``track_memory`` off keeps the live-tensor
    tracker's dispatch (``PythonDispatchMode``) out of the trace."""


@dataclass(frozen=True)
class TrainConfig:
    """One training run."""

    model: GPTConfig = field(default_factory=GPTConfig)
    """Model shape."""
    zero: ZeroConfig = field(default_factory=ZeroConfig)
    """ZeRO stage, precision, buckets, optimizer."""
    preset: str | None = None
    """Name of the model preset the shape came from (informational)."""
    dp: int = 1
    """Data-parallel degree."""
    tp: int = 1
    """Tensor (model) parallel degree; the world size is dp * tp, TP innermost."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism inside the TP group (activations outside the matmuls split along s); needs
    ``tp`` > 1 (refused at TP 1, where it would run without SP and be recorded as on)."""
    activation: ActivationConfig = field(default_factory=ActivationConfig)
    """Activation checkpointing and ZeRO-R activation options (P_a, P_a+cpu, M_D)."""
    micro_batch: int = 2
    """Sequences per micro-batch per rank."""
    steps: int = 10
    """Optimizer steps."""
    warmup_steps: int = 2
    """Steps excluded from the timing medians."""
    system: str = "zerobench"
    """Which system trains: ``zerobench`` (this engine), ``megatron`` (the Megatron-LM baseline) or a peer;
    ``zerobench.systems.validate_run`` checks what the system can run."""
    seed: int = 1234
    """Seed of the model init and the synthetic data."""
    data_vocab: int | None = None
    """The vocabulary the synthetic data draws tokens from; None: the model's. A sweep sets it where it pads the
    model's vocabulary for TP (Megatron-LM's ``make_vocab_size_divisible_by``), so every TP degree trains on the
    samples of a single-process run: the padding adds embedding rows, never tokens."""
    track_memory: bool = True
    """On CPU, track live tensor bytes (peak memory); costs some Python overhead per op."""
    tensorboard_dir: str | None = None
    """Rank 0 also writes per-step loss, step time and TFLOPs as TensorBoard scalars here."""
    profile: ProfileConfig | None = None
    """Trace the last steps with torch.profiler; ``None``: no profiler."""
    memory_budget_bytes: int | None = None
    """Per-device memory budget; exceeding it fails the run as out of memory (CPU: tracked live bytes)."""
    collective_timeout_s: float = 300.0
    """A collective waiting longer than this fails the run (a dead or stuck rank)."""
    backend: str = "auto"
    """Process-group backend: auto (NCCL where each rank has a GPU of its own, else gloo), nccl or gloo (several
    ranks on one GPU; ``distributed/env.py``)."""
    kernels: str = "auto"
    """Model kernels: auto (fused LayerNorm and bias+GeLU where the device has them), fused, reference, or
    compiled (each block through ``torch.compile``; ``parallel/compiled.py``). The optimizer's kernels are
    ``zero.kernels``; the CLI sets both, ``auto`` for the optimizer with ``compiled``."""

    @property
    def timed_steps(self) -> int:
        """Steps the timing medians come from: those after warm-up, less the profiler's."""
        return self.steps - self.warmup_steps - (self.profile.steps if self.profile else 0)

    @property
    def world_size(self) -> int:
        return self.dp * self.tp

    @property
    def global_batch(self) -> int:
        return self.dp * self.micro_batch * self.zero.grad_accum_steps

    def validate(self, world_size: int | None = None) -> None:
        """System-independent checks; ``zerobench.systems.validate_run`` adds the system's own."""
        from zerobench.parallel.config import validate_sp, validate_tp

        self.model.validate()
        self.zero.validate()
        self.activation.validate()
        if self.dp < 1 or self.tp < 1:
            raise ConfigError(f"--dp and --tp must be >= 1, got dp {self.dp}, tp {self.tp}")
        validate_tp(self.model, self.tp)
        if self.sequence_parallel and self.tp == 1:  # it would run without SP and be recorded as on
            raise ConfigError(
                "--sp splits the sequence over the TP group, and at --tp 1 there is none to split it over (Megatron-LM "
                "turns it off there): give --tp 2 or more with it, or drop --sp"
            )
        if self.sequence_parallel and self.model.seq % self.tp:
            raise ConfigError(
                f"sequence length {self.model.seq} is not divisible by TP degree {self.tp}: "
                "sequence parallelism splits the sequence evenly"
            )
        validate_sp(self.activation, self.sequence_parallel, self.tp)
        if world_size is not None and world_size != self.world_size:
            if world_size % self.tp:
                raise ConfigError(f"world size {world_size} is not divisible by TP degree {self.tp}")
            raise ConfigError(
                f"DP degree {self.dp} x TP degree {self.tp} does not match the world size {world_size}: "
                f"pass --dp {world_size // self.tp} or launch {self.world_size} processes"
            )
        if self.backend not in BACKENDS:
            raise ConfigError(f"unknown backend {self.backend!r}: choose {', '.join(BACKENDS)}")
        if self.kernels not in ("auto", "fused", "reference", COMPILED):
            raise ConfigError(f"unknown kernel mode {self.kernels!r}: choose auto, fused, reference or compiled")
        if self.kernels == COMPILED:
            check_compilable(self.tp, self.activation)
        if self.micro_batch < 1:
            raise ConfigError(f"--micro-batch must be >= 1, got {self.micro_batch}")
        if self.steps < 1:
            raise ConfigError(f"--steps must be >= 1, got {self.steps}")
        if not self.warmup_steps >= 0:
            raise ConfigError(f"--warmup must be >= 0, got {self.warmup_steps}")
        if self.profile is not None and self.profile.steps < 1:
            raise ConfigError(f"--profile-steps must be >= 1, got {self.profile.steps}")
        if self.profile is not None and self.timed_steps < 1:
            need = self.warmup_steps + self.profile.steps + 1
            raise ConfigError(
                f"--profile-steps {self.profile.steps} leaves no timed step of {self.steps} after "
                f"{self.warmup_steps} warm-up (the traced steps are left out of the medians): "
                f"give --steps {need} or more"
            )
        if self.data_vocab is not None and not 1 <= self.data_vocab <= self.model.vocab:
            raise ConfigError(
                f"data vocabulary {self.data_vocab} must be in [1, {self.model.vocab}] (the model's vocabulary): "
                "the data's tokens index the embedding"
            )
        if not 0 <= self.seed <= SEED_MAX:
            raise ConfigError(f"--seed must be in [0, 2**40-1] (the data stream's seeds stay int64), got {self.seed}")
        if not (math.isfinite(self.collective_timeout_s) and self.collective_timeout_s > 0):
            raise ConfigError(
                f"collective timeout must be a positive number of seconds, got {self.collective_timeout_s}"
            )
        if self.memory_budget_bytes is not None and self.memory_budget_bytes <= 0:
            raise ConfigError(f"memory budget must be positive, got {self.memory_budget_bytes} bytes")
