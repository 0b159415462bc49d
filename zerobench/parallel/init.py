"""Sharded initialisation of a GPT built on the meta device: no rank ever holds the whole model.

``GPT(cfg).to(device)`` materialises every parameter on every rank before TP and ZeRO cut it down: an 8B model's
fp32 parameters alone fill a 32 GB V100, and at 100B with 16 ranks a node the host would need 6.4 TB. Built on the
meta device instead (``parallelize(..., device=...)``: the engine's storage is real and zero), the model is
initialised here one parameter at a time: each is drawn whole on the host, in ``GPT.reset_parameters``'s order and
with its rule (``models.gpt.init_parameter``), so from the same seed the values are exactly those of a materialised
GPT (whose layers' own default initialisation drew from the RNG first: it is replayed, one layer at a time, before);
cut to this TP rank's piece (``shard_parameter``, the cut ``apply_tp`` makes); and this rank's segments of it are
written into the fp32 master and the parameter shards (``write_segments`` of ``zero/state/module_state.py``, the
path ``model.load_state_dict`` takes). Stages 1-2 then all-gather the replica. The largest transient is one whole
parameter (the embedding) on the host. Like the broadcast at construction, the all-gather is set-up, not a training
step: it is not recorded in the comm ledger.
"""

from __future__ import annotations

import copy

import torch

from zerobench.models.config import GPTConfig
from zerobench.models.gpt import GPT, init_parameter
from zerobench.parallel.tensor_parallel import TPInfo, shard_parameter
from zerobench.zero.engine import ZeroEngine
from zerobench.zero.state.module_state import segments_by_param, write_segments


@torch.no_grad()
def init_gpt(engine: ZeroEngine, cfg: GPTConfig, tp: TPInfo, generator: torch.Generator | None = None) -> None:
    """Initialise the meta-built GPT that ``engine`` trains, as ``GPT(cfg)`` would have from the same RNG state
    (every rank of the DP and TP groups draws the same values: seed them alike)."""
    with torch.device("meta"):
        plain = GPT(cfg)  # names and shapes, in the order reset_parameters draws them
    _replay_construction(plain)
    index, segments = {zp.name: i for i, zp in enumerate(engine.zparams)}, segments_by_param(engine)
    for name, p in plain.named_parameters():
        full = torch.empty(p.shape, dtype=torch.float32)
        init_parameter(name, full, cfg, generator)
        if name not in index:
            raise KeyError(
                f"the engine trains no parameter {name!r}: init_gpt initialises the GPT as parallelize "
                f"built it (TP, fused kernels, checkpointing keep its parameter names)"
            )
        i = index[name]
        write_segments(engine, segments.get(i, ()), shard_parameter(name, full, tp.group))
    engine.storage.publish(engine.group, None)


@torch.no_grad()
def _replay_construction(plain: GPT) -> None:
    """Draw what building ``GPT(cfg)`` on a real device draws before ``reset_parameters``: each layer's own default
    initialisation (``nn.Linear``'s Kaiming-uniform, ``nn.Embedding``'s normal), in construction order, on a
    throw-away host copy of one layer at a time (the tied LM head draws too, before it is tied)."""
    for module in plain.modules():
        if next(module.parameters(recurse=False), None) is not None and hasattr(module, "reset_parameters"):
            layer = copy.deepcopy(module).to_empty(device="cpu")
            layer.reset_parameters()
            del layer
