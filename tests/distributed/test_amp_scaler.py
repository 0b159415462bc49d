"""torch.amp loss scaling on the engine (``zerobench/zero/amp.py``): ``ShardedGradScaler``, as FSDP's, against one
process with torch's ``GradScaler`` and ``AdamW``, at stages 0-3, with an overflow on one rank and with
``unscale_`` + clipping. Before, torch's ``GradScaler`` failed inside torch at stages 2-3 (``No inf checks were
recorded for this optimizer``), and nothing checked the reduced gradient at stage 1."""

from __future__ import annotations

import pytest

from tests.helpers.amp_scaler import BAD_STEP, STEPS, run_amp_scaler
from tests.helpers.dist import run_distributed
from tests.helpers.tiers import STAGES

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def ranks():
    return run_distributed(run_amp_scaler, 2, timeout=300)


@pytest.mark.parametrize("clip", (0, 1))
@pytest.mark.parametrize("stage", STAGES)
def test_sharded_grad_scaler_trains_as_one_process(ranks, stage, clip):
    """The same parameters as one process (fp32, world 2: measured equal), the overflow step skipped on every rank
    and the scale backed off and grown again as torch's GradScaler does it."""
    for r in ranks:
        res = r[f"s{stage}-clip{clip}"]
        assert res["max_update"] > 1e-2, res
        assert res["update_rel_err"] <= 1e-5 and res["max_diff"] <= 1e-5, res
        assert res["scales"] == res["ref_scales"] == [1024.0, 512.0, 512.0, 1024.0], res
        assert res["applied"] == [step != BAD_STEP for step in range(STEPS)], res


def test_torch_grad_scaler_is_right_at_stage_0(ranks):
    """At stage 0 ``.grad`` is the whole reduced gradient: torch's own GradScaler drives the engine (the scale is
    folded into the step: no pass over the gradients)."""
    for r in ranks:
        assert r["s0-plain"] is None and r["s0-fsdp"] is None
        res = r["s0-plain-params"]
        assert res["max_update"] > 1e-3 and res["max_diff"] <= 1e-5, res


@pytest.mark.parametrize("stage", (1, 2, 3))
@pytest.mark.parametrize("which", ("plain", "fsdp"))
def test_torch_grad_scaler_is_refused_in_one_line_at_stages_1_to_3(ranks, stage, which):
    """torch.amp's GradScaler and FSDP's ShardedGradScaler both unscale and check the ``.grad`` each rank holds. The
    line names both, so a user of FSDP's is not told to use what they already use."""
    for r in ranks:
        assert r[f"s{stage}-{which}"] == (
            "ConfigError: torch's GradScaler (torch.amp's, or FSDP's ShardedGradScaler) checks the .grad this rank "
            f"holds, which at ZeRO stage {stage} is not the reduced gradient: use zerobench.zero.ShardedGradScaler, "
            "this engine's counterpart of FSDP's"
        )


@pytest.mark.parametrize("stage", STAGES)
def test_an_fp16_engine_keeps_its_own_loss_scale(ranks, stage):
    for r in ranks:
        msg = r[f"s{stage}-fp16"]
        assert (
            msg is not None
            and msg.startswith("RuntimeError: fp16 training needs the dynamic loss scale on the loss")
            and "\n" not in msg
        ), msg
        assert r[f"s{stage}-fp16-step"] == (
            "ConfigError: a torch.amp GradScaler on an fp16 ZeRO engine would scale the loss twice: the engine scales "
            "it itself (ZeroConfig.precision='fp16'); drop the GradScaler, or train fp32/bf16 under torch.autocast "
            "with zerobench.zero.ShardedGradScaler"
        )
