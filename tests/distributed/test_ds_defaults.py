"""DeepSpeed's defaults and fp16 loss-scale rule, against DeepSpeed 0.19.8 itself: one config trained by
``deepspeed.initialize`` and by ``zerobench.zero.initialize`` side by side in the same ranks
(``tests/helpers/ds_defaults.py``). A config without ``gradient_clipping`` clips at 1.0 as DeepSpeed's; the fp16
loss scale grows, skips and backs off at the steps DeepSpeed's does (window, hysteresis, consecutive hysteresis)."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.ds_defaults import clipping, input_dtypes, loss_scales
from tests.helpers.tiers import STAGES
from zerobench.peers.registry import deepspeed_available

# Full grid only: DeepSpeed's first use in a fresh environment builds its ops (35 s on the 2-core CI VM).
pytestmark = [pytest.mark.dist, pytest.mark.slow]


@pytest.fixture(autouse=True)
def _deepspeed():
    if not deepspeed_available():
        pytest.skip("DeepSpeed is not installed (the test extra installs it)")


@pytest.fixture
def deepspeed_fp16():
    """DeepSpeed's engine refuses fp16 where its accelerator says the device lacks it (its CPU accelerator asks oneDNN,
    which needs AVX512-FP16 or AMX-FP16: an AMD EPYC or an older Xeon has neither). There is then no reference to
    compare the loss scale with, so the case skips, as DeepSpeed's own fp16 tests do."""
    from deepspeed.accelerator import get_accelerator

    acc = get_accelerator()
    if not acc.is_fp16_supported():
        pytest.skip(f"DeepSpeed's {acc.device_name()} accelerator refuses fp16 on this machine: no reference engine")


@pytest.mark.parametrize("stage", STAGES)
def test_a_config_without_gradient_clipping_clips_at_one_as_deepspeed(stage):
    """Three fp32 steps whose global gradient norms exceed 1 (DeepSpeed's own measure): both engines answer
    ``gradient_clipping()`` 1.0 and end with the same parameters (unclipped, 3% of the update apart)."""
    for r in run_distributed(clipping, 2, stage, timeout=300):
        assert r["clipping"] == (1.0, 1.0), r
        assert min(r["norms"]) > 1.0, r["norms"]
        assert r["moved"] > 1e-3 and r["param_diff"] < 1e-5 and r["update_rel_err"] < 1e-5, r


T, F = True, False
OVERFLOWS = [F, T, F, F, T, F, T, F, F, T, T, F, F, F, T, F]
"""16 steps, the loss made infinite on 6 of them: DeepSpeed's hysteresis 2 ends this at scale 32 from 256; torch's
rule (the scale growing after every second clean step, hysteresis restored at each growth) at 512."""

CASES = [
    pytest.param({"initial_scale_power": 8, "loss_scale_window": 2}, [F] * 8, id="window2-no-overflow"),
    pytest.param({"initial_scale_power": 8, "loss_scale_window": 2, "hysteresis": 2}, OVERFLOWS, id="hysteresis2"),
    pytest.param(
        {"initial_scale_power": 8, "loss_scale_window": 2, "hysteresis": 2, "consecutive_hysteresis": True},
        OVERFLOWS,
        id="consecutive-hysteresis",
    ),
    pytest.param(
        {"initial_scale_power": 3, "loss_scale_window": 3, "min_loss_scale": 2},
        [F, T, T, F, F, F, F, T],
        id="window3-min2",
    ),
]


@pytest.mark.parametrize("stage", [0, 1, 3])
@pytest.mark.parametrize("fp16, overflow", CASES)
def test_the_fp16_loss_scale_moves_as_deepspeeds(stage, fp16, overflow, deepspeed_fp16):
    """The scale and DeepSpeed's ``skipped_steps`` after every step equal DeepSpeed's own, on every rank (at stage 0
    DeepSpeed's fp16 optimizer, which has no hysteresis; at stages 1-3 its ZeRO optimizers')."""
    for r in run_distributed(loss_scales, 2, stage, fp16, overflow, timeout=300):
        assert r["ours"] == r["theirs"], r
        assert r["theirs"]["skipped"][-1] == sum(overflow) and r["theirs"]["raised"] is None
        assert len(set(r["theirs"]["scales"])) > 1, r  # the scale moved: the case tests a rule


@pytest.mark.parametrize("stage", [1, 3])
def test_an_overflow_at_the_minimum_scale_stops_training_where_deepspeed_does(stage, deepspeed_fp16):
    """Scale 4, minimum 1, hysteresis 2, every step overflowing: the first overflow uses up the hysteresis, the next
    two back off to 1, the fourth raises in both engines; zerobench's error is one line saying what to do."""
    fp16 = {"initial_scale_power": 2, "min_loss_scale": 1, "hysteresis": 2}
    for r in run_distributed(loss_scales, 2, stage, fp16, [T] * 6, timeout=300):
        assert r["ours"] == r["theirs"] and r["theirs"]["raised"] == 3, r
        kind, msg = r["error"]
        assert kind == "LossScaleAtMinimum" and "\n" not in msg and "lower the learning rate" in msg, r


def test_without_zero_an_overflow_at_the_minimum_scale_skips_as_deepspeed(deepspeed_fp16):
    """Stage 0 (DeepSpeed's fp16 optimizer): the same run backs off at every overflow, hysteresis or not, and at the
    minimum only skips: neither engine raises, and the scales and skipped steps agree."""
    fp16 = {"initial_scale_power": 2, "min_loss_scale": 1, "hysteresis": 2}
    for r in run_distributed(loss_scales, 2, 0, fp16, [T] * 4 + [F] * 3 + [T], timeout=300):
        assert r["ours"] == r["theirs"] and r["theirs"]["raised"] is None, r
        assert r["theirs"]["scales"][:4] == [2, 1, 1, 1], r


_F32, _F16 = "torch.float32", "torch.float16"


@pytest.mark.parametrize(
    ("precision", "expected"),
    [
        ({"bf16": {"enabled": True}}, (_F32, _F32)),
        ({"fp16": {"enabled": True}}, (_F32, _F32)),
        ({"fp16": {"enabled": True, "auto_cast": True}}, (_F16, _F32)),
    ],
    ids=["bf16", "fp16", "fp16-auto-cast"],
)
def test_the_forward_s_inputs_are_cast_where_deepspeed_casts_them(precision, expected):
    """DeepSpeed's engine casts no forward input under bf16 or fp16, and under ``fp16.auto_cast`` only the positional
    ones, to half (``_cast_inputs_half``). zerobench's cast every floating-point argument to the training dtype, so
    float labels (a regression's 1000.3 and 1001.7) reached the loss rounded to 1000 and 1002 in bf16, where
    DeepSpeed's loss saw them whole; and ``auto_cast`` was read and ignored. Compared on DeepSpeed's own engine
    where it runs here (fp16 needs a CPU with fp16 support)."""
    from deepspeed.accelerator import get_accelerator

    ds_runs = "bf16" in precision or get_accelerator().is_fp16_supported()
    seen = run_distributed(input_dtypes, 1, precision, ds_runs, timeout=300)[0]
    assert seen["zerobench"] == expected, seen
    if ds_runs:
        assert seen["deepspeed"] == expected, seen
