"""One run, as a suite writes it in YAML and as ``zerobench train`` builds it from its flags, and its one
resolution into a validated ``TrainConfig`` (``to_train_config``): the rules below hold for both.

Keys not given fall back to the suite's ``base`` and then to the defaults below. Cluster suites (the
paper's) give ``gpus`` and ``tp``; ``dp`` is then ``gpus / tp``. Resolution rules: P_a and P_a+cpu imply
activation checkpointing; the warm-up is clamped to ``steps - 1``; a vocabulary that TP does not divide is
padded to a multiple of 128 x TP (Megatron-LM's rule); ``bucket_size: null`` means no C_B (one bucket as
large as the model). Renamed keys (``RENAMED``) are errors naming the new key.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from zerobench.config import ConfigError
from zerobench.models.sizes import preset as get_preset
from zerobench.parallel.config import COMPILED, ActivationConfig
from zerobench.systems import validate_run
from zerobench.train.config import ProfileConfig, TrainConfig
from zerobench.zero.config import NO_BUCKET_LIMIT, AdamWConfig, Precision, ZeroConfig


@dataclass(frozen=True)
class RunSpec:
    """One configuration to run."""

    label: str | None = None
    """Human-readable name (default: derived from the axes)."""
    system: str = "zerobench"
    """``zerobench`` or ``megatron``."""
    preset: str = "tiny"
    """Model preset (tiny, mini, small); the shape keys below override it."""
    layers: int | None = None
    """Transformer blocks."""
    hidden: int | None = None
    """Hidden size."""
    heads: int | None = None
    """Attention heads."""
    vocab: int | None = None
    """Vocabulary size."""
    seq: int | None = None
    """Sequence length."""
    stage: int = 0
    """ZeRO stage 0-3."""
    dp: int | None = None
    """Data-parallel degree (default: gpus / tp, or 1)."""
    tp: int | None = None
    """Tensor (model) parallel degree, the paper's MP (default 1)."""
    sp: bool = False
    """Sequence parallelism inside the TP group."""
    kernels: str = "auto"
    """Kernels (optimizer, LayerNorm, bias+GeLU): auto, fused or reference; or compiled (the blocks through
    ``torch.compile``, the optimizer as auto)."""
    offload_optimizer: str = "none"
    """ZeRO-Offload: none, cpu (master + Adam states on the host, CPU step) or nvme (states in files)."""
    offload_param: str = "none"
    """Stage 3 parameter partition in host memory: none or cpu."""
    nvme_path: str | None = None
    """Directory of the NVMe tier's state files; only with ``offload_optimizer: nvme`` (refused otherwise)."""
    optim_bits: int = 32
    """Adam moments in fp32 (32) or blockwise 8-bit (8)."""
    gpus: int | None = None
    """Total processes; must equal dp * tp when both are given."""
    precision: str = "fp32"
    """fp32, bf16 or fp16."""
    micro_batch: int = 2
    """Sequences per micro-batch per DP rank."""
    grad_accum: int = 1
    """Micro-batches per step."""
    steps: int = 6
    """Optimizer steps."""
    warmup: int = 2
    """Steps excluded from timing medians."""
    lr: float = 1e-3
    """AdamW learning rate."""
    weight_decay: float = 0.1
    """AdamW decoupled weight decay (on parameters of 2+ dimensions)."""
    clip: float | None = None
    """Gradient-norm clip."""
    bucket_size: int | None = 6_250_000
    """C_B: gradient/parameter bucket size in elements; null: no C_B (one bucket as large as the model)."""
    overlap_comm: bool = True
    """Gradient buckets' collectives run on while backward goes on; false: backward waits for each
    (``ZeroConfig.overlap_comm``)."""
    checkpoint_activations: bool = False
    """Activation checkpointing per block."""
    pa: bool = False
    """P_a."""
    pa_cpu: bool = False
    """P_a+cpu."""
    md: bool = False
    """M_D."""
    seed: int = 1234
    """Init and data seed."""
    timeout: float = 600.0
    """Wall-clock limit of the run in seconds; past it the run is killed and recorded as timed out."""
    collective_timeout: float = 300.0
    """A collective waiting longer than this many seconds fails the run (a dead or stuck rank)."""
    backend: str = "auto"
    """Process-group backend: auto, nccl or gloo (gloo runs several ranks on one GPU)."""
    track_memory: bool = True
    """On CPU, track live tensor bytes (the peak memory figure)."""
    tensorboard: str | None = None
    """Rank 0 also writes per-step scalars for TensorBoard under this directory."""
    profile: str | None = None
    """Trace the run's last ``profile_steps`` steps with torch.profiler: a trace and an operator table per rank
    under this directory (``train/profiling.py``); those steps are left out of the timing medians."""
    profile_steps: int = 2
    """Steps ``profile`` traces."""
    memory_budget: str | None = None
    """Per-device memory budget (e.g. ``64MiB``): on CPU enforced by the live-tensor tracker, on GPU by
    ``torch.cuda.set_per_process_memory_fraction``. Exceeding it records the run as out of memory."""
    fault: str | None = None
    """Test-only fault injection for tests of failure handling: ``RANK:STEP[:KIND]`` makes that rank fail at
    that step (``zerobench/train/faults.py``). Not part of the config: it reaches the ranks as environment
    (``rank_env``), which ``launch/worker.py`` alone reads."""
    # Informational keys carried by the paper's suites (kept in the resolved config, not interpreted).
    model_size: str | None = None
    """Paper model size name (informational)."""
    total_batch: int | None = None
    """Paper's total batch (informational)."""
    config: str | None = None
    """Paper configuration name, e.g. C1 (informational)."""
    search: str | None = None
    """What the paper varied to find this row (informational)."""

    def rank_env(self) -> dict[str, str]:
        """Extra environment for this run's ranks (every launcher passes it through unchanged)."""
        from zerobench.train.faults import FAULT_ENV

        return {FAULT_ENV: self.fault} if self.fault else {}


MAX_SECONDS = 1e9
"""Longest ``timeout`` / ``collective_timeout`` (about 31 years): a process group's timeout is a ``timedelta``,
which overflows past about 1e14 seconds."""
FIELDS = {f.name for f in dataclasses.fields(RunSpec)}
RENAMED = {"mp": "tp", "cb_size": "bucket_size"}
"""Old key -> its one spelling now (suites giving the old key fail, naming the new one)."""


def to_train_config(spec: RunSpec, world_size: int | None = None, check_system: bool = True) -> TrainConfig:
    """Resolve a run into a ``TrainConfig`` (checked against ``world_size`` processes when given); raises
    ``ConfigError`` with a one-line reason. ``check_system=False`` (the planner) checks the configuration
    alone, not whether this host's implementation of its system can run it (e.g. the paper's fp16
    Megatron-LM rows, which the local Megatron baseline runs in fp32/bf16 only)."""
    from zerobench.config import parse_bytes

    tp = spec.tp if spec.tp is not None else 1
    for key, value in (
        ("tp", tp),
        ("dp", spec.dp),
        ("gpus", spec.gpus),
        ("micro_batch", spec.micro_batch),
        ("grad_accum", spec.grad_accum),
        ("steps", spec.steps),
        ("bucket_size", spec.bucket_size),
        ("profile_steps", spec.profile_steps),
    ):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ConfigError(f"{key} must be a positive integer, got {value!r}")
    for key in ("lr", "timeout", "collective_timeout"):
        value = getattr(spec, key)
        if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
            raise ConfigError(f"{key} must be a positive finite number, got {value!r}")
        if key != "lr" and value > MAX_SECONDS:
            raise ConfigError(f"{key} must be at most {MAX_SECONDS:.0e} seconds, got {value!r}")
    if spec.gpus is not None:
        if spec.gpus % tp:
            raise ConfigError(f"gpus {spec.gpus} is not divisible by tp {tp}: use a GPU count that tp divides")
        if spec.dp is not None and spec.dp * tp != spec.gpus:
            raise ConfigError(f"dp {spec.dp} x tp {tp} != gpus {spec.gpus}: drop dp or fix gpus")
    dp = spec.dp if spec.dp is not None else (spec.gpus // tp if spec.gpus is not None else 1)
    model = get_preset(spec.preset)
    shape = {k: getattr(spec, k) for k in ("layers", "hidden", "heads", "vocab", "seq") if getattr(spec, k) is not None}
    model = dataclasses.replace(model, **shape)
    data_vocab = None
    if model.vocab % tp:  # Megatron-LM's make_vocab_size_divisible_by: pad to a multiple of 128 x TP
        from zerobench.models.sizes import padded_vocab

        data_vocab = model.vocab  # the data keeps the tokenizer's vocabulary: the same samples at every TP
        model = dataclasses.replace(model, vocab=padded_vocab(model.vocab, tp))
    try:
        precision = Precision(spec.precision)
    except ValueError:
        raise ConfigError(f"unknown precision {spec.precision!r}: choose fp32, bf16 or fp16") from None
    if spec.nvme_path is not None and spec.offload_optimizer != "nvme":  # it would be dropped without a word
        raise ConfigError(
            f"--nvme-path {spec.nvme_path} is where --offload-optimizer nvme keeps the optimizer states, and this "
            f"run's optimizer offload is {spec.offload_optimizer}: add --offload-optimizer nvme, or drop --nvme-path"
        )
    budget = int(parse_bytes(spec.memory_budget)) if spec.memory_budget else None
    cfg = TrainConfig(
        model=model,
        zero=ZeroConfig(
            stage=spec.stage,
            precision=precision,
            bucket_numel=spec.bucket_size if spec.bucket_size is not None else NO_BUCKET_LIMIT,
            grad_accum_steps=spec.grad_accum,
            clip_grad_norm=spec.clip,
            optimizer=AdamWConfig(lr=spec.lr, weight_decay=spec.weight_decay),
            kernels="auto" if spec.kernels == COMPILED else spec.kernels,  # the model's mode, not the optimizer's
            offload_optimizer=spec.offload_optimizer,
            offload_param=spec.offload_param,
            nvme_path=spec.nvme_path,
            optim_bits=spec.optim_bits,
            overlap_comm=spec.overlap_comm,
        ),
        activation=ActivationConfig(
            checkpoint=spec.checkpoint_activations or spec.pa or spec.pa_cpu,
            partition=spec.pa or spec.pa_cpu,
            cpu_offload=spec.pa_cpu,
            contiguous=spec.md,
        ),
        preset=spec.preset,
        dp=dp,
        tp=tp,
        sequence_parallel=spec.sp,
        micro_batch=spec.micro_batch,
        steps=spec.steps,
        warmup_steps=min(spec.warmup, max(spec.steps - 1, 0)),
        seed=spec.seed,
        data_vocab=data_vocab,
        system=spec.system,
        memory_budget_bytes=budget,
        kernels=spec.kernels,
        collective_timeout_s=spec.collective_timeout,
        backend=spec.backend,
        track_memory=spec.track_memory,
        tensorboard_dir=spec.tensorboard,
        profile=ProfileConfig(spec.profile, spec.profile_steps) if spec.profile else None,
    )
    if spec.profile and spec.steps <= spec.warmup + spec.profile_steps:  # advice from the warm-up asked for, not
        need = spec.warmup + spec.profile_steps + 1  # the clamped one (which grows as --steps does)
        raise ConfigError(
            f"--profile-steps {spec.profile_steps} leaves no timed step of {spec.steps} after {spec.warmup} warm-up "
            f"(the traced steps are left out of the medians): give --steps {need} or more"
        )
    if check_system:
        validate_run(cfg, world_size)
    else:
        cfg.validate(world_size)
    return cfg
