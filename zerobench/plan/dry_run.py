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
from zerobench.models.gpt import GPT, GPTConfig
from zerobench.plan.memory_model import params_per_mp_rank
from zerobench.zero.config import Precision, ZeroConfig


def dry_run(
    model: GPTConfig,
    gpus: int,
    mp: int,
    stage: int,
    rank: int = 0,
    precision: str = "fp16",
    bucket_numel: int = 500_000_000,
) -> dict:
    """Engine-measured vs analytic model-state bytes on ``rank`` of a ``gpus``-rank world."""
    from zerobench.distributed.mesh import build_mesh
    from zerobench.metrics.analytic import paper_model_state_bytes
    from zerobench.parallel.parallelize import ParallelSpec, parallelize

    init_fake_world(gpus, rank)
    try:
        mesh = build_mesh(mp)
        with torch.device("meta"):
            gpt = GPT(model)
        zero = ZeroConfig(stage=stage, precision=Precision(precision), bucket_numel=bucket_numel)
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
            "analytic_model_state_bytes": paper_model_state_bytes(psi, mesh.dp.size, stage),
            "padding_elements": engine.layout.numel - engine.layout.unpadded_numel,
            "ledger": ledger,
        }
    finally:
        dist.destroy_process_group()
