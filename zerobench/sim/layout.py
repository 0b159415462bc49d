"""The engine's real bucket layout for a configuration, as the simulator needs it.

Built exactly as a dry run builds the engine (``parallelize`` on a meta-device GPT over a ``fake``
process group of the configuration's world, rank 0), so the simulator replays the buckets, shards and
stage-3 units the engine would use — not a model of them. Each bucket is annotated with the point of
backward where its last gradient lands: the head (LM head + loss, then the final LayerNorm), a block, or
the embedding (the tied word embedding's gradient is complete only after the embedding's backward).
"""

from __future__ import annotations

import dataclasses
import functools
import re
from dataclasses import dataclass

from zerobench.train.config import TrainConfig

HEAD = -1
"""Landing point of the head's parameters (before any block, in backward order)."""


@dataclass(frozen=True)
class Bucket:
    index: int
    numel: int
    shard_numel: int
    unit: int
    """Stage-3 unit: 0 the root (embeddings, final norm), k block k-1."""
    params: int
    """Parameters in the bucket."""
    param_numel: int
    """Elements of parameters (unpadded)."""
    lands: int
    """Backward point after which it is complete: ``HEAD``, block index, or ``layers`` (the embedding)."""
    held_back: bool = False
    """Stages 2-3: its gradients wait while another bucket is reduced (``zero/grads/staging.py``'s ``held_back``)."""
    tied: bool = False
    """Holds a parameter two modules own (the word embedding, tied to the LM head): held back, its second gradient
    waits for the collectives in flight (``zero/grads/staging.py``)."""
    param_sizes: tuple[int, ...] = ()
    """Elements of each of its parameters on this rank (their TP pieces), in the bucket's order."""


def _landing(name: str, layers: int) -> int:
    m = re.match(r"blocks\.(\d+)\.", name)
    if m:
        return int(m.group(1))
    return HEAD if name.startswith("ln_f") else layers


def _backward_order(point: int, layers: int) -> int:
    """Position in backward: head 0, block L-1 .. block 0 as 1..L, embedding L+1."""
    return 0 if point == HEAD else (layers + 1 if point == layers else layers - point)


@functools.lru_cache(maxsize=64)
def engine_buckets(cfg: TrainConfig) -> tuple[Bucket, ...]:
    """The buckets of rank 0's engine for ``cfg`` (initialises, then destroys, a fake default process group:
    call it where no real one is in use)."""
    import torch
    import torch.distributed as dist

    from zerobench.distributed.fake import init_fake_world
    from zerobench.distributed.mesh import build_mesh
    from zerobench.models.gpt import GPT
    from zerobench.parallel.parallelize import ParallelSpec, parallelize
    from zerobench.zero.grads.staging import held_back, tied_owners

    if dist.is_initialized() and dist.get_backend() != "fake":
        raise RuntimeError(
            "engine_buckets builds the engine on a fake process group: call it in a process "
            "without a real one (e.g. not inside a training rank)"
        )
    init_fake_world(cfg.world_size, 0)
    try:
        with torch.device("meta"):
            gpt = GPT(cfg.model)
        # Offload moves where states live, not the layout (and cannot stage meta tensors on the host).
        zero = dataclasses.replace(
            cfg.zero, offload_optimizer="none", offload_param="none", nvme_path=None, kernels="reference"
        )
        engine = parallelize(gpt, build_mesh(cfg.tp), ParallelSpec(zero=zero, kernels="reference")).engine
        layout, L = engine.layout, cfg.model.layers
        held = held_back(layout)
        tied = {engine.zparams[i].slot.bucket for i in tied_owners(gpt, engine.zparams)}
        out = []
        for b in layout.buckets:
            slots = [layout.params[i] for i in b.params]
            lands = max((_landing(s.name, L) for s in slots), key=lambda p: _backward_order(p, L))
            out.append(
                Bucket(
                    b.index,
                    b.numel,
                    b.shard_numel,
                    b.unit,
                    len(slots),
                    sum(s.end - s.start for s in slots),
                    lands,
                    held[b.index],
                    b.index in tied,
                    tuple(s.end - s.start for s in slots),
                )
            )
        return tuple(out)
    finally:
        dist.destroy_process_group()
