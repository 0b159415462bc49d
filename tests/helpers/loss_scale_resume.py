"""An fp16 engine on DeepSpeed's loss-scale rule, trained through a checkpoint: saved after some steps, loaded into
a fresh engine that trains on, next to one engine that never stopped. The loss is made infinite on chosen steps."""

from __future__ import annotations

import copy

from tests.helpers.user_models import batches, engine_for, make_model, slice_of
from zerobench.distributed.collectives import Group
from zerobench.zero.config import LossScaleConfig, LossScaleRule, Precision

LOSS_SCALE = LossScaleConfig(init_scale=256, growth_interval=2, hysteresis=2, rule=LossScaleRule.DEEPSPEED)


def _steps(engine, data, overflow, rank: int, world: int) -> list[float]:
    scales = []
    for (x, y), inf in zip(data, overflow):
        loss = engine(slice_of(x, rank, world), slice_of(y, rank, world))
        engine.backward(loss * float("inf") if inf else loss)
        engine.step()
        scales.append(engine.loss_scale)
    return scales


def resumed_scales(rank: int, world: int, stage: int, save_dir: str, overflow: list[bool], split: int) -> dict:
    """The loss scale after every step, and the scaler's state at the end: uninterrupted, and saved after ``split``
    steps then loaded into a fresh engine."""
    group = Group.of(None, "dp")
    model, data = make_model("all_in_blocks"), batches(len(overflow), 2 * world)

    def engine():
        return engine_for(copy.deepcopy(model), group, stage, precision=Precision.FP16, loss_scale=LOSS_SCALE)

    whole = engine()
    first = engine()
    scales = _steps(first, data[:split], overflow[:split], rank, world)
    first.save_checkpoint(save_dir)
    second = engine()
    second.load_checkpoint(save_dir)
    scales += _steps(second, data[split:], overflow[split:], rank, world)
    return {
        "whole": _steps(whole, data, overflow, rank, world),
        "resumed": scales,
        "whole_state": whole.scaler.state_dict(),
        "resumed_state": second.scaler.state_dict(),
    }
