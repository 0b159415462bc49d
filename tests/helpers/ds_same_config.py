"""One DeepSpeed config, with an ``optimizer`` and a ``scheduler`` section, given to DeepSpeed's own
``deepspeed.initialize`` and to ``zerobench.zero.initialize`` in the same ranks: the same model, batches and
loop. Records each engine's learning rates after every ``step()`` and the parameters at the end."""

from __future__ import annotations

import copy
import os

import torch

from tests.helpers.user_models import batches, make_model, slice_of

MICRO, ACCUM, STEPS = 2, 2, 6
CONFIG = {
    "train_micro_batch_size_per_gpu": MICRO, "gradient_accumulation_steps": ACCUM, "gradient_clipping": 1.0,
    "steps_per_print": 10**9,
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.95], "eps": 1e-8, "weight_decay": 0.1,
                                              "torch_adam": True}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"total_num_steps": STEPS, "warmup_min_lr": 1e-3,
                                                      "warmup_max_lr": 1e-2, "warmup_num_steps": 2}},
}


def _loop(engine, data, rank: int, world: int) -> list[list[float]]:
    lrs = []
    for x, y in data:
        engine.backward(engine(slice_of(x, rank, world), slice_of(y, rank, world)))
        engine.step()
        lrs.append([float(lr) for lr in engine.get_lr()])
    return lrs


def same_config(rank: int, world: int, stage: int) -> dict:
    import deepspeed

    from zerobench.zero import initialize
    from zerobench.zero.state_dict import full_parameters

    os.environ.setdefault("LOCAL_RANK", str(rank))
    model = make_model("all_in_blocks")  # DeepSpeed cannot broadcast the MLP's 0-dim parameter
    data = batches(STEPS * ACCUM, MICRO * world)
    config = {**CONFIG, "zero_optimization": {"stage": stage}}
    mine = copy.deepcopy(model)
    ours, *_ = initialize(model=mine, config=copy.deepcopy(config), model_parameters=mine.parameters())
    theirs_model = copy.deepcopy(model)
    theirs, *_ = deepspeed.initialize(model=theirs_model, config=copy.deepcopy(config),
                                      model_parameters=theirs_model.parameters(), dist_init_required=False)
    out = {"ours": _loop(ours, data, rank, world), "theirs": _loop(theirs, data, rank, world)}
    full = full_parameters(ours)
    ctx = deepspeed.zero.GatheredParameters(list(theirs.module.parameters())) if stage == 3 else torch.no_grad()
    with ctx:
        out["param_diff"] = max((full[n] - p.detach().float()).abs().max().item()
                                for n, p in theirs.module.named_parameters())
    out["moved"] = max((full[n] - p.detach()).abs().max().item() for n, p in model.named_parameters())
    return out
