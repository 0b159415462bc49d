"""DeepSpeed's defaults and fp16 loss-scale rule, compared on DeepSpeed's own engine: one config given to
``deepspeed.initialize`` and to ``zerobench.zero.initialize`` in the same ranks, the same model, batches and loop
(``tests/helpers/ds_same_config.py``'s way). ``clipping``: a config without ``gradient_clipping``; ``loss_scales``:
an fp16 config whose loss is made infinite on chosen steps in both engines, recording each engine's scale after
every step."""

from __future__ import annotations

import copy
import os

import torch

from tests.helpers.ds_same_config import compare_parameters
from tests.helpers.user_models import batches, make_model, slice_of

MICRO = 2


def _config(stage: int, lr: float, **extra) -> dict:
    return {
        "train_micro_batch_size_per_gpu": MICRO,
        "steps_per_print": 10**9,
        "zero_optimization": {"stage": stage},
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": lr, "betas": [0.9, 0.95], "weight_decay": 0.1, "torch_adam": True},
        },
        **extra,
    }


def _engines(rank: int, config: dict):
    """(model, zerobench's engine, DeepSpeed's engine), both from a copy of one model and of ``config``."""
    import deepspeed

    from zerobench.zero import initialize

    os.environ.setdefault("LOCAL_RANK", str(rank))
    model = make_model("all_in_blocks")  # DeepSpeed cannot broadcast the MLP's 0-dim parameter
    ours = initialize(model=(m := copy.deepcopy(model)), config=copy.deepcopy(config), model_parameters=m.parameters())[
        0
    ]
    theirs = deepspeed.initialize(
        model=(t := copy.deepcopy(model)),
        model_parameters=t.parameters(),
        config={**config, "zero_allow_untested_optimizer": True},
        dist_init_required=False,
    )[0]
    return model, ours, theirs


def clipping(rank: int, world: int, stage: int, steps: int = 3) -> dict:
    """fp32, no ``gradient_clipping`` key: each engine's ``gradient_clipping()``, DeepSpeed's global gradient norm
    at every step, and how far the parameters end apart."""
    model, ours, theirs = _engines(rank, _config(stage, lr=1e-2))
    data = batches(steps, MICRO * world)
    norms = []
    for engine in (ours, theirs):
        for x, y in data:
            engine.backward(engine(slice_of(x, rank, world), slice_of(y, rank, world)))
            if engine is theirs and stage == 0:  # DeepSpeed's stage 0 in fp32 records no norm: its reduced grads
                norms.append(torch.stack([p.grad.norm() for p in theirs.module.parameters()]).norm().item())
            engine.step()
            if engine is theirs and stage > 0:
                norms.append(float(theirs.get_global_grad_norm()))
    return {
        "clipping": (ours.gradient_clipping(), theirs.gradient_clipping()),
        "norms": norms,
        **compare_parameters(ours, theirs, model),
    }


def _scale(engine) -> float:
    """The current loss scale, by the name every optimizer involved gives it: ``loss_scale`` (DeepSpeed 0.19.8's fp16
    optimizer at stage 0, which has no ``cur_scale``; its ZeRO optimizers at stages 1-3; zerobench's DeepSpeed
    names)."""
    return float(engine.optimizer.loss_scale)


def loss_scales(rank: int, world: int, stage: int, fp16: dict, overflow: list[bool]) -> dict:
    """The ``fp16`` section (enabled), one step per entry of ``overflow``: where true, the loss is multiplied by
    infinity before ``backward`` (every gradient non-finite, on every rank). Each engine's loss scale and skipped-step
    count after every step, and the step whose ``step()`` raised (None: none did; training stops there), with
    zerobench's exception's type and message under ``error``."""
    _, ours, theirs = _engines(rank, _config(stage, lr=1e-4, fp16={"enabled": True, **fp16}))
    data = batches(len(overflow), MICRO * world)
    out = {"error": None}
    for name, engine in (("ours", ours), ("theirs", theirs)):
        scales, skipped, raised = [], [], None
        for i, ((x, y), inf) in enumerate(zip(data, overflow)):
            loss = engine(slice_of(x, rank, world), slice_of(y, rank, world))
            engine.backward(loss * float("inf") if inf else loss)
            try:
                engine.step()
            except Exception as e:  # noqa: BLE001 - DeepSpeed raises a plain Exception at its minimum scale
                raised = i
                out["error"] = (type(e).__name__, str(e)) if engine is ours else out["error"]
                break
            scales.append(_scale(engine))
            skipped.append(int(engine.skipped_steps))
        out[name] = {"scales": scales, "skipped": skipped, "raised": raised}
    return out


class _Probe(torch.nn.Module):
    """A regression head that records the dtypes its forward receives: ``x`` positionally, ``labels`` by keyword."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.lin = torch.nn.Linear(4, 1)
        self.seen: list[tuple[str, str]] = []

    def forward(self, x, labels):
        self.seen.append((str(x.dtype), str(labels.dtype)))
        out = self.lin(x.to(self.lin.weight.dtype)).float().squeeze(-1)
        return (out - labels.float()).pow(2).mean()


def input_dtypes(rank: int, world: int, precision: dict, deepspeed_too: bool) -> dict:
    """The dtypes a model's forward receives from zerobench's engine (and DeepSpeed's, where ``deepspeed_too``) for
    fp32 ``x`` (positional) and fp32 ``labels`` (keyword) under ``precision`` (the config's ``bf16``/``fp16``
    sections)."""
    import deepspeed

    from zerobench.zero import initialize

    os.environ.setdefault("LOCAL_RANK", str(rank))
    config = {**_config(1, lr=1e-3), **precision}
    x, labels = torch.randn(MICRO, 4), torch.tensor([1000.3, 1001.7])  # bf16 would round them to 1000 and 1002
    out = {}
    for name in ("zerobench", "deepspeed") if deepspeed_too else ("zerobench",):
        model = _Probe()
        if name == "zerobench":
            engine = initialize(model=model, model_parameters=model.parameters(), config=copy.deepcopy(config))[0]
        else:
            engine = deepspeed.initialize(
                model=model, model_parameters=model.parameters(), config=copy.deepcopy(config), dist_init_required=False
            )[0]
        engine(x, labels=labels)
        out[name] = engine.module.seen[-1]
    return out
