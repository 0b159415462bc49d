"""Dry run of the real engine for one rank of a large world, on the ``fake`` process-group backend.

The GPT is built on the meta device (no memory), tensor parallelism and ZeRO are applied exactly as in
training — same ``apply_tp``, same layout, same buffers — and the bytes the engine would hold on that
rank are read from its own (meta) tensors. Collectives are never issued (construction needs none), so a
400-GPU, 170B configuration runs on one small machine in seconds. Like torchtitan's fake-backend mode,
this needs its own process: it initialises the default process group with the fake backend.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from zerobench.distributed.fake import init_fake_world
from zerobench.models.gpt import GPT
from zerobench.plan.memory_model import PlanConfig, memory_per_gpu, params_per_mp_rank
from zerobench.zero.config import Precision, ZeroConfig


def dry_run(p: PlanConfig, rank: int = 0) -> dict:
    """Engine-measured vs analytic model-state bytes on ``rank`` of ``p``'s world, the engine built with ``p``'s
    ZeRO settings (stage, precision, C_B, 8-bit moments, offload); the analytic figure is the planner's for the
    same settings (``memory_per_gpu``), the paper's formula only where they are the paper's."""
    from zerobench.distributed.mesh import build_mesh
    from zerobench.parallel.parallelize import ParallelSpec, parallelize
    from zerobench.zero.config import NO_BUCKET_LIMIT

    model, gpus, mp, stage = p.model, p.gpus, p.mp, p.stage
    init_fake_world(gpus, rank)
    try:
        mesh = build_mesh(mp)
        with torch.device("meta"):
            gpt = GPT(model)
        zero = ZeroConfig(
            stage=stage,
            precision=Precision(p.precision),
            bucket_numel=p.cb_elements if p.cb_elements is not None else NO_BUCKET_LIMIT,
            optim_bits=p.optim_bits,
            offload_optimizer="cpu" if p.offload_optimizer else "none",
            offload_param="cpu" if p.offload_param else "none",
        )
        # The production composition; fused kernels would only swap modules (reference on meta).
        engine = parallelize(gpt, mesh, ParallelSpec(zero=zero, kernels="reference")).engine
        ledger = engine.accounting.memory_ledger()
        measured = engine.accounting.model_state_bytes()
        psi = params_per_mp_rank(model, mp)
        assert psi == engine.numel, (psi, engine.numel)
        return {
            "rank": rank,
            "gpus": gpus,
            "mp": mp,
            "dp": mesh.dp.size,
            "stage": stage,
            "params_per_mp_rank": psi,
            "measured_model_state_bytes": measured,
            "analytic_model_state_bytes": memory_per_gpu(p)["model_states"],
            "padding_elements": engine.layout.numel - engine.layout.unpadded_numel,
            "ledger": ledger,
        }
    finally:
        dist.destroy_process_group()
