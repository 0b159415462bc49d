"""Parity of every ZeRO stage x DP degree x precision with single-process training (same global batch)."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.scenarios import Scenario, run_scenarios
from zerobench.zero import LossScaleConfig

pytestmark = pytest.mark.dist

STAGES = (0, 1, 2, 3)
DPS = (1, 2, 4)
# bf16: engine and reference run the same recipe, but the engine rounds each rank's gradient to bf16 and
# sums those over ranks, where the reference rounds one full-batch gradient. Adam's first steps move each
# element by ~±lr whatever its gradient's size, so an element whose true gradient is ~0 may step the
# other way: the worst element is no measure. The stated tolerance is on the whole update: the relative
# L2 error of (params after 3 steps - init) is at most 5% (measured: 1.9% at DP=2, 2.4% at DP=4), and
# the loss agrees to 1e-3 at every step (measured: 6e-5). At DP=1 the match is exact.
BF16_UPDATE_RTOL = 0.05


@pytest.fixture(scope="module")
def fp32_grid():
    scenarios = [Scenario(dp, s) for dp in DPS for s in STAGES]
    return run_distributed(run_scenarios, 4, scenarios)


@pytest.fixture(scope="module")
def bf16_grid():
    scenarios = [Scenario(dp, s, "bf16") for dp in DPS for s in STAGES]
    scenarios += [Scenario(1, s, "bf16", kernels="reference") for s in STAGES]
    return run_distributed(run_scenarios, 4, scenarios)


@pytest.mark.parametrize("dp", DPS)
@pytest.mark.parametrize("stage", STAGES)
def test_fp32_parity(fp32_grid, stage, dp):
    for rank_res in fp32_grid:
        r = rank_res[Scenario(dp, stage).key]
        assert r["max_update"] > 1e-4, "parameters did not move: the comparison would be vacuous"
        assert r["max_diff"] <= 1e-5, r
        assert r["loss_diff"] <= 1e-5, r
        if stage < 3:
            assert r["model_vs_master"] == 0.0


@pytest.mark.slow
@pytest.mark.parametrize("dp", DPS)
@pytest.mark.parametrize("stage", STAGES)
def test_bf16_parity(bf16_grid, stage, dp):
    for rank_res in bf16_grid:
        r = rank_res[Scenario(dp, stage, "bf16").key]
        assert r["max_update"] > 1e-4
        if dp == 1:
            # The reference optimizer path is torch.optim.AdamW's arithmetic op for op: bit-exact.
            exact = rank_res[Scenario(1, stage, "bf16", kernels="reference").key]
            assert exact["max_diff"] == 0.0, exact
            # The fused kernel's fp32 master differs from torch's by an ulp where torch's vectorized sqrt
            # is not correctly rounded (tests/kernels/test_adamw.py); that flips the bf16 rounding of some
            # parameters, and later gradients carry it on. Held to the DP>1 tolerance below (measured 1.0%).
        assert r["update_rel_err"] <= BF16_UPDATE_RTOL, r
        assert r["loss_diff"] <= 1e-3, r
        if stage < 3:
            assert r["model_vs_master"] == 0.0


@pytest.fixture(scope="module")
def options_grid():
    scenarios = []
    for s in STAGES:
        scenarios.append(Scenario(2, s, accum=2))
        scenarios.append(Scenario(2, s, clip=0.05))
        scenarios.append(
            Scenario(2, s, "fp16", steps=4, loss_scale=LossScaleConfig(init_scale=2.0**28, backoff_factor=2.0**-14))
        )
    return run_distributed(run_scenarios, 2, scenarios)


@pytest.mark.parametrize("stage", STAGES)
def test_grad_accumulation_parity(options_grid, stage):
    for rank_res in options_grid:
        r = rank_res[Scenario(2, stage, accum=2).key]
        assert r["max_diff"] <= 1e-5, r


@pytest.mark.parametrize("stage", STAGES)
def test_clipping_parity(options_grid, stage):
    for rank_res in options_grid:
        r = rank_res[Scenario(2, stage, clip=0.05).key]
        assert r["max_diff"] <= 1e-5, r


@pytest.mark.parametrize("stage", STAGES)
def test_fp16_overflow_is_skipped(options_grid, stage):
    sc = Scenario(2, stage, "fp16", steps=4, loss_scale=LossScaleConfig(init_scale=2.0**28, backoff_factor=2.0**-14))
    for rank_res in options_grid:
        r = rank_res[sc.key]
        assert r["stepped"][0] is False, "the first step should overflow at loss scale 2^28 and be skipped"
        assert r["stepped"] == r["ref_stepped"] == [False, True, True, True]
        assert r["loss_scale"] == 2.0**14
        # Same reasoning and tolerance as bf16 (fp16 gradients rounded per rank, then summed).
        assert r["update_rel_err"] <= BF16_UPDATE_RTOL, r
        assert r["loss_diff"] <= 1e-3, r
