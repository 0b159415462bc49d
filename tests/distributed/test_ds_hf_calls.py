"""The DeepSpeed engine calls Accelerate and HF's Trainer make, at DP 2 against one process on the same batch.

- ``get_global_grad_norm()`` was None without clipping: DeepSpeed's ZeRO, bf16 and fp16 optimizers compute the norm
  at every step, and Accelerate's ``clip_grad_norm_`` returns it. After the user's own ``clip_grad_norm_`` it is the
  norm that call measured, before its clip (the step's own measure would be after it).
- At stage 3 Accelerate's ``get_state_dict`` (which Trainer's ``save_model`` calls at every checkpoint) asks
  ``zero_gather_16bit_weights_on_model_save()`` and then ``_zero3_consolidated_16bit_state_dict()``: both were
  missing, so every stage-3 Trainer save raised ``AttributeError``.
- ``save_checkpoint``'s ``exclude_frozen_parameters`` was hidden in ``**options``: Trainer passes it only where
  ``inspect.signature`` shows it, so PEFT checkpoints kept the frozen base weights.
"""

from __future__ import annotations

import copy
import inspect

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed
from tests.helpers.tiers import tiered

pytestmark = pytest.mark.dist


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))


def _batch(step: int) -> torch.Tensor:
    return torch.randn(8, 8, generator=torch.Generator().manual_seed(step))


def _run(rank: int, world: int, stage: int, precision: str, gather: bool | None, clipping: float = 0.0) -> dict:
    from zerobench.zero import initialize

    model = _model()
    ref = copy.deepcopy(model)
    ref_opt = torch.optim.AdamW(ref.parameters(), lr=1e-2)
    zero = {"stage": stage}
    if gather is not None:
        zero["stage3_gather_16bit_weights_on_model_save"] = gather
    config = {
        "train_micro_batch_size_per_gpu": 4,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2, "betas": [0.9, 0.999], "weight_decay": 0.01}},
        "gradient_clipping": clipping,  # DeepSpeed's default is 1.0: 0, the norm must not depend on clipping
        "zero_optimization": zero,
        "bf16": {"enabled": precision == "bf16"},
    }
    engine, *_ = initialize(model=model, model_parameters=model.parameters(), config=config)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32  # DeepSpeed's engine casts no inputs
    norms, ref_norms = [], []
    for step in range(3):
        x = _batch(step)
        engine.backward(engine(x[rank * 4 : (rank + 1) * 4].to(dtype)).float().pow(2).mean())
        engine.step()
        norms.append(engine.get_global_grad_norm())
        ref(x).pow(2).mean().backward()
        ref_norms.append(torch.nn.utils.clip_grad_norm_(ref.parameters(), float("inf")).item())
        ref_opt.step()
        ref_opt.zero_grad()
    x = _batch(3)  # a window the user clips: the reported norm is the one measured before the clip
    engine.backward(engine(x[rank * 4 : (rank + 1) * 4].to(dtype)).float().pow(2).mean())
    before_clip = engine.clip_grad_norm_(1e-2).item()
    engine.clip_grad_norm_(1e-3)  # a second clip: the window's norm is still the first one measured
    engine.step()
    out = {"norms": norms, "ref_norms": ref_norms, "asks": engine.zero_gather_16bit_weights_on_model_save()}
    out["user_clip"] = (before_clip, engine.get_global_grad_norm())
    try:
        sd = engine._zero3_consolidated_16bit_state_dict()
    except ValueError as e:
        out["consolidated"] = f"ValueError: {e}"
    else:
        with engine.gathered_params():
            whole = {k: v.detach().clone() for k, v in model.state_dict().items()}
        out["consolidated"] = sd is None if rank else {k: torch.equal(v, whole[k]) for k, v in sd.items()}
        out["dtypes"] = None if sd is None else sorted({str(v.dtype) for v in sd.values()})
    engine.destroy()
    return out


@pytest.mark.parametrize("precision", ["fp32", pytest.param("bf16", marks=pytest.mark.slow)])
@pytest.mark.parametrize("stage", tiered((0, 1, 2, 3), fast=(0, 3)))
def test_the_global_norm_at_every_step_and_the_stage3_16bit_state_dict(stage, precision):
    gather = True if stage == 3 else None
    for rank, r in enumerate(run_distributed(_run, 2, stage, precision, gather)):
        if stage == 0 and precision == "fp32":  # DeepSpeed steps a plain torch optimizer there and keeps no norm
            assert r["norms"] == [None] * 3
        else:
            assert r["norms"] == pytest.approx(r["ref_norms"], rel=1e-5 if precision == "fp32" else 2e-2), r
        assert r["user_clip"][0] > 1e-2 and r["user_clip"][1] == pytest.approx(r["user_clip"][0], rel=1e-6), r
        assert r["asks"] is (stage == 3)
        if stage < 3:
            assert r["consolidated"] == "ValueError: this function requires ZeRO-3 mode"
        elif rank:
            assert r["consolidated"] is True  # None on the other ranks, as DeepSpeed's
        else:
            assert r["consolidated"] == {"0.weight": True, "0.bias": True, "2.weight": True, "2.bias": True}
            assert r["dtypes"] == ["torch.bfloat16" if precision == "bf16" else "torch.float32"]


def test_a_user_clip_under_the_configs_clipping_reports_the_first_norm():
    """With DeepSpeed's ``gradient_clipping`` on too, the step measured again after the user's clips and reported
    that."""
    for r in run_distributed(_run, 2, 3, "fp32", None, 0.05):
        first, reported = r["user_clip"]
        assert first > 1e-2 and reported == pytest.approx(first, rel=1e-6), r


def test_the_16bit_gather_is_off_by_default_and_read_under_either_name():
    from zerobench.config import ConfigError
    from zerobench.zero.compat.deepspeed.config import from_deepspeed

    def gathers(zero: dict) -> bool:
        cfg = {"train_batch_size": 2, "optimizer": {"type": "AdamW", "params": {"lr": 1e-3}}}
        return from_deepspeed({**cfg, "zero_optimization": {"stage": 3, **zero}}, 1).gather_16bit_on_save

    assert not gathers({})
    assert gathers({"stage3_gather_16bit_weights_on_model_save": True})
    assert gathers({"stage3_gather_fp16_weights_on_model_save": True})
    with pytest.raises(ConfigError, match="stage3_gather_16bit_weights_on_model_save: must be true or false"):
        gathers({"stage3_gather_16bit_weights_on_model_save": "auto"})


def test_save_checkpoint_names_deepspeeds_options_in_its_signature():
    from zerobench.zero.compat.deepspeed.engine import DeepSpeedEngine

    names = inspect.signature(DeepSpeedEngine.save_checkpoint).parameters
    assert {"tag", "client_state", "save_latest", "exclude_frozen_parameters"} <= set(names)
