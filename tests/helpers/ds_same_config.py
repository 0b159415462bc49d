"""One DeepSpeed config, with an ``optimizer`` and a ``scheduler`` section, given to DeepSpeed's own
``deepspeed.initialize`` and to ``zerobench.zero.initialize`` in the same ranks: the same model, batches and
loop; or, as Hugging Face Accelerate hands them, a client AdamW with two param groups and a scheduler built on it.
Records each engine's learning rates after every ``step()`` and the parameters at the end."""

from __future__ import annotations

import copy
import os

import torch

from tests.helpers.user_models import batches, make_model, slice_of

MICRO, ACCUM, STEPS = 2, 2, 6
CONFIG = {
    "train_micro_batch_size_per_gpu": MICRO,
    "gradient_accumulation_steps": ACCUM,
    "gradient_clipping": 1.0,
    "steps_per_print": 10**9,
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1, "torch_adam": True},
    },
    "scheduler": {
        "type": "WarmupDecayLR",
        "params": {"total_num_steps": STEPS, "warmup_min_lr": 1e-3, "warmup_max_lr": 1e-2, "warmup_num_steps": 2},
    },
}


def _loop(engine, data, rank: int, world: int) -> list[list[float]]:
    lrs = []
    for x, y in data:
        engine.backward(engine(slice_of(x, rank, world), slice_of(y, rank, world)))
        engine.step()
        lrs.append([float(lr) for lr in engine.get_lr()])
    return lrs


def _client(model):
    """The client form (Hugging Face Accelerate's): an AdamW with two groups and a scheduler built on it."""
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=1e-2,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, lambda s: 1.0 / (1 + s))


def _initialize(init, model, config: dict, client: bool, **kw):
    if not client:
        return init(model=model, config=config, model_parameters=model.parameters(), **kw)[0]
    opt, sched = _client(model)
    return init(
        model=model,
        config={k: v for k, v in config.items() if k not in ("optimizer", "scheduler")},
        optimizer=opt,
        lr_scheduler=sched,
        **kw,
    )[0]


def same_config(rank: int, world: int, stage: int, client: bool = False, bf16: bool = False) -> dict:
    """``client``: the optimizer and scheduler are built by the caller and handed over, not config sections.
    ``bf16``: DeepSpeed's ``bf16`` section. DeepSpeed casts the module to bf16 and builds its fp32 master from that,
    where zerobench keeps the model's fp32 values, so the model starts from bf16-representable values here: the
    two masters then start equal (otherwise they differ by bf16's rounding from the first step)."""
    import deepspeed

    from zerobench.zero import initialize

    os.environ.setdefault("LOCAL_RANK", str(rank))
    model = make_model("all_in_blocks")  # DeepSpeed cannot broadcast the MLP's 0-dim parameter
    data = batches(STEPS * ACCUM, MICRO * world)
    config = {**CONFIG, "zero_optimization": {"stage": stage}, **({"bf16": {"enabled": True}} if bf16 else {})}
    if bf16:
        with torch.no_grad():
            for p in model.parameters():
                p.copy_(p.to(torch.bfloat16).float())
    ours = _initialize(initialize, copy.deepcopy(model), copy.deepcopy(config), client)
    theirs = _initialize(
        deepspeed.initialize,
        copy.deepcopy(model),
        {**config, "zero_allow_untested_optimizer": True},
        client,
        dist_init_required=False,
    )
    out = {"ours": _loop(ours, data, rank, world), "theirs": _loop(theirs, data, rank, world)}
    return {**out, **compare_parameters(ours, theirs, model)}


def deepspeed_masters(engine) -> dict[str, torch.Tensor]:
    """DeepSpeed's fp32 master of every parameter, by name (through ``deepspeed.utils.safe_get_full_fp32_param``)."""
    from deepspeed.utils import safe_get_full_fp32_param

    flat = {}  # stage 0 under bf16: DeepSpeed's FP16_Optimizer keeps one flat fp32 master per param group
    for params, master_flat in zip(
        getattr(engine.optimizer, "fp16_groups", []), getattr(engine.optimizer, "fp32_groups_flat", [])
    ):
        offset = 0
        for q in params:
            flat[id(q)] = master_flat[offset : offset + q.numel()].view(q.shape)
            offset += q.numel()

    def master(p):  # DeepSpeed's fp32 master; fp32 at stage 0 has none: the module's parameter is it
        full = flat[id(p)] if id(p) in flat else safe_get_full_fp32_param(p)
        return (p if full is None else full).detach().float().clone()

    return {n: master(p) for n, p in engine.module.named_parameters()}


def compare_parameters(ours, theirs, model) -> dict:
    """How far zerobench's engine ``ours`` ended from DeepSpeed's ``theirs``, both started from ``model``:
    ``param_diff`` (largest element), ``moved`` (largest element of zerobench's update), ``update_rel_err`` (the
    whole update's relative L2 difference)."""
    from zerobench.zero.state.shards import full_parameters

    full = full_parameters(ours)
    theirs_params = deepspeed_masters(theirs)
    out = {
        "param_diff": max((full[n] - p).abs().max().item() for n, p in theirs_params.items()),
        "moved": max((full[n] - p.detach()).abs().max().item() for n, p in model.named_parameters()),
    }
    init = dict(model.named_parameters())
    num = sum((full[n] - p).pow(2).sum().item() for n, p in theirs_params.items())
    den = sum((full[n] - init[n].detach()).pow(2).sum().item() for n in theirs_params)
    out["update_rel_err"] = (num / den) ** 0.5
    return out
