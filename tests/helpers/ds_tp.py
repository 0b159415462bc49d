"""``zerobench.zero.initialize`` (DeepSpeed's API) on a model that tensor parallelism sharded first, with the groups
given as DeepSpeed takes them (``mpu=``): trained beside torch's AdamW and ``clip_grad_norm_`` on the same global batch
in one process. Each TP rank must clip by the whole model's norm, and the parameters TP replicates must stay equal."""

from __future__ import annotations

import copy

import torch

from tests.helpers.scenarios import tp_local
from zerobench.config import ConfigError
from zerobench.distributed.mesh import build_mesh
from zerobench.models.gpt import GPT
from zerobench.models.sizes import PRESETS
from zerobench.parallel.parallelize import ParallelSpec, parallelize
from zerobench.train.data import SyntheticTokens
from zerobench.zero import initialize

CLIP, STEPS, BATCH = 0.05, 3, 8


def _config(stage: int, micro: int) -> dict:
    adamw = {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.0}
    return {
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": CLIP,
        "optimizer": {"type": "AdamW", "params": adamw},
        "zero_optimization": {"stage": stage},
        "steps_per_print": 10**9,
    }


def initialize_with_mpu(rank: int, world: int, tp: int, stage: int, mpu_kind: str) -> dict:
    """Norms and parameters after ``STEPS`` clipped steps, against the reference's; ``mpu_kind``: "mesh" (zerobench's
    ``Mesh``), "megatron" (``megatron.core.parallel_state``) or "none" (the refusal)."""
    mesh = build_mesh(tp, world // tp)
    cfg = PRESETS["tiny"]
    data = SyntheticTokens(cfg.vocab, cfg.seq, seed=7)
    torch.manual_seed(0)
    model = GPT(cfg)
    ref = copy.deepcopy(model)
    opt = torch.optim.AdamW(ref.parameters(), lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.0)
    ref_norms = []
    for t in range(STEPS):
        x, y = data.samples(t, 0, BATCH)
        ref(x, y).backward()
        ref_norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), CLIP).item())
        opt.step()
        opt.zero_grad()
    dp, micro = mesh.dp.size, BATCH // mesh.dp.size
    parallelize(model, mesh, ParallelSpec(zero=None))  # TP alone, as a Megatron program shards before DeepSpeed
    if mpu_kind == "none":
        try:
            initialize(model=model, config=_config(stage, micro), dp_group=mesh.dp.pg)
        except ConfigError as e:
            return {"refused": str(e)}
        return {"refused": None}
    if mpu_kind == "megatron":
        from megatron.core import parallel_state

        parallel_state.initialize_model_parallel(tensor_model_parallel_size=tp)
        mpu = parallel_state
    else:
        mpu = mesh
    engine = initialize(model=model, config=_config(stage, micro), mpu=mpu)[0]
    norms = []
    for t in range(STEPS):
        x, y = data.micro_batch(t, mesh.dp.rank, dp, 0, micro)
        engine.backward(engine(x, y))
        engine.step()
        norms.append(float(engine.get_global_grad_norm()))
    with engine.gathered_params(writeback=False):
        got = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
    drift = max((got[n] - tp_local(n, p.detach(), mesh.tp)).abs().max().item() for n, p in ref.named_parameters())
    sharded = {n for n, p in engine.module.named_parameters() if getattr(p, "tensor_model_parallel", False)}
    replicated = {n: v.numpy().copy() for n, v in got.items() if n not in sharded}  # tensors die with the rank
    return {"ref_norms": ref_norms, "norms": norms, "drift": drift, "replicated": replicated, "sharded": len(sharded)}
