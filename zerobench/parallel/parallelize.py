"""``parallelize``: the one composition of parallelisms applied to a plain model, in their one order.

Production (``train/systems.py``), the dry run on the fake backend (``plan/dry_run.py``), the peers that
share zerobench's activation checkpointing, and the parity tests all call this function, so the order the
tests check is the order that trains:

1. ``apply_tp``: Megatron tensor parallelism decides which parameters exist on this rank;
2. ``apply_fused_kernels``: fused LayerNorm and bias+GeLU (parameter names unchanged);
3. ``apply_activation_checkpointing``: checkpoints the blocks (P_a, P_a+cpu, M_D), replaying TP's RNG;
   or, with ``kernels="compiled"`` instead of 2 and 3, ``apply_compile``: each block's forward through
   ``torch.compile`` (no TP, no checkpointing);
4. ``apply_zero``: partitions whatever parameters are left over this TP rank's DP group (skipped when the
   spec has no ZeRO config: a peer system brings its own data parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from zerobench.distributed.mesh import Mesh
from zerobench.metrics.comm import CommLedger
from zerobench.parallel.checkpointing import CheckpointStore, apply_activation_checkpointing
from zerobench.parallel.compiled import apply_compile
from zerobench.parallel.config import COMPILED, ActivationConfig, check_compilable, validate_sp
from zerobench.parallel.fused import apply_fused_kernels
from zerobench.parallel.tensor_parallel import TPInfo, apply_tp
from zerobench.zero.api import apply_zero
from zerobench.zero.config import ZeroConfig
from zerobench.zero.engine import ZeroEngine
from zerobench.zero.storage.allocator import Allocator


@dataclass(frozen=True)
class ParallelSpec:
    """What to apply to the model; ``parallelize`` fixes the order."""

    zero: ZeroConfig | None = field(default_factory=ZeroConfig)
    """ZeRO's configuration; None applies everything but ZeRO (for systems with their own DP)."""
    sequence_parallel: bool = False
    """Megatron sequence parallelism inside the TP group."""
    kernels: str = "auto"
    """Model kernels: auto (fused where the device has them), fused, reference (leave the model as is), compiled
    (each block through ``torch.compile``)."""
    activation: ActivationConfig = field(default_factory=ActivationConfig)
    """Activation checkpointing and ZeRO-R's activation options."""
    seed: int = 0
    """Seed of the per-TP-rank RNG of sharded regions (dropout inside attention)."""


@dataclass
class Parallelized:
    """What ``parallelize`` built around the (modified in place) model."""

    model: nn.Module
    """The model, parallelized in place."""
    tp: TPInfo
    """TP group, names of TP-sharded parameters, TP RNG."""
    store: CheckpointStore | None
    """Activation checkpoint store (None without checkpointing)."""
    engine: ZeroEngine | None
    """The ZeRO engine (None when the spec has no ZeRO config)."""
    kernels: str
    """The path the model's kernels took: "fused", or "reference" (asked for, or ``auto`` where the device has no
    fused kernels: the same config computes differently there, so a run records it)."""


def parallelize(
    model: nn.Module,
    mesh: Mesh,
    spec: ParallelSpec,
    ledger: CommLedger | None = None,
    units: list[nn.Module] | type | None = None,
    allocator: Allocator | None = None,
    param_groups=None,
    device: torch.device | None = None,
) -> Parallelized:
    """Apply TP -> fused kernels -> activation checkpointing -> ZeRO to ``model`` over ``mesh``, in that order.

    The order is not a choice: TP replaces the parameters it shards, the fused kernels and checkpointing wrap the
    modules TP produced, and ZeRO partitions whatever parameters the model holds at the end. Every rank must pass an
    identically built model.

    Args:
        model: a plain GPT (``zerobench.models.gpt``) or any model with the same block structure.
        mesh: the DP x TP process groups (``zerobench.distributed.mesh.build_mesh``).
        spec: what to apply: TP's sequence parallelism and seed, the kernels, activation checkpointing (and P_a),
            and the ``ZeroConfig`` (``None``: no ZeRO, e.g. the Megatron-LM baseline).
        ledger: where every collective is recorded (TP's, checkpointing's and the engine's).
        units: stage-3 gather units (default: every block of ``model.blocks``; or a layer class).
        allocator: passed to ``apply_zero``.
        param_groups: passed to ``apply_zero``; TP replaces the parameters it shards, so give them as a callable
            ``param_groups(model)``.
        device: where a model built on the meta device will run: the TP RNG, the kernel choice and the engine's
            storage go there (then ``zerobench.parallel.init.init_gpt`` fills it).

    Returns:
        ``Parallelized(model, tp, store, engine, kernels)``: the model, TP's record (its sharded parameter names and
        RNG), the checkpoint store, the engine (``None`` without ZeRO) and the kernels' path.
    """
    validate_sp(spec.activation, spec.sequence_parallel, mesh.tp.size)
    tp = apply_tp(model, mesh.tp, ledger, seed=spec.seed, sequence_parallel=spec.sequence_parallel, device=device)
    if spec.kernels == COMPILED:
        check_compilable(mesh.tp.size, spec.activation)
        kernels, store = apply_compile(model), None
    else:
        kernels = apply_fused_kernels(model, spec.kernels, device=device)
        store = apply_activation_checkpointing(model, spec.activation, mesh.tp, ledger, tp.rng)
    engine = None
    if spec.zero is not None:
        engine = apply_zero(
            model,
            mesh.dp,
            spec.zero,
            ledger,
            units,
            tp_group=mesh.tp,
            tp_sharded=tp.sharded,
            allocator=allocator,
            param_groups=param_groups,
            device=device,
        )
    return Parallelized(model, tp, store, engine, kernels)
