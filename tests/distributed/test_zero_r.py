"""ZeRO-R with TP: activation checkpointing, P_a, P_a+cpu, M_D — parity and ledgers as numbers."""

from __future__ import annotations

import itertools

import pytest

from tests.distributed.test_tp_parity import TP_BF16_UPDATE_RTOL
from tests.helpers.dist import run_distributed
from tests.helpers.scenarios import Scenario, run_scenarios
from tests.helpers.workers_tp import zero_r_ledgers
from zerobench.parallel.checkpointing import ActivationConfig

pytestmark = pytest.mark.dist

MESHES = [(1, 2), (2, 2), (1, 4)]
# checkpointing off, then on with every P_a / P_a+cpu / M_D combination
ACS = [ActivationConfig()] + [
    ActivationConfig(checkpoint=True, partition=pa, cpu_offload=cpu, contiguous=md)
    for pa, cpu, md in itertools.product([False, True], repeat=3)
    if not (cpu and not pa)
]
FULL = [(dp, tp, s, ac) for (dp, tp), s, ac in itertools.product(MESHES, range(4), ACS)]
# The per-commit subset: every mesh, every stage and every activation option at least once.
SUBSET = [(dp, tp, s, ac) for i, (dp, tp, s, ac) in enumerate(FULL) if i % 5 == 0 or (s == 3 and ac.cpu_offload)]


def _check(results, dp, tp, stage, ac, precision):
    for rank_res in results:
        r = rank_res[Scenario(dp, stage, precision, tp=tp, ac=ac).key]
        assert r["max_update"] > 1e-4
        if precision == "fp32":
            assert r["grad_rel_err"] <= 1e-5, r
            assert r["max_diff"] <= 5e-5, r  # see test_tp_parity for the reasoning
            assert r["loss_diff"] <= 1e-5, r
        else:
            assert r["update_rel_err"] <= TP_BF16_UPDATE_RTOL, r
            assert r["loss_diff"] <= 1e-3, r


@pytest.fixture(scope="module")
def subset_results():
    scen = [Scenario(dp, s, p, tp=tp, ac=ac) for dp, tp, s, ac in SUBSET for p in ("fp32", "bf16")]
    return run_distributed(run_scenarios, 4, scen)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("dp,tp,stage,ac", SUBSET, ids=[Scenario(d, s, tp=t, ac=a).key for d, t, s, a in SUBSET])
def test_zero_r_parity_subset(subset_results, dp, tp, stage, ac, precision):
    _check(subset_results, dp, tp, stage, ac, precision)


@pytest.fixture(scope="module")
def full_results():
    scen = [Scenario(dp, s, p, tp=tp, ac=ac) for dp, tp, s, ac in FULL for p in ("fp32", "bf16")]
    return run_distributed(run_scenarios, 4, scen, timeout=900)


@pytest.mark.slow
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
@pytest.mark.parametrize("dp,tp,stage,ac", FULL, ids=[Scenario(d, s, tp=t, ac=a).key for d, t, s, a in FULL])
def test_zero_r_parity_full_grid(full_results, dp, tp, stage, ac, precision):
    _check(full_results, dp, tp, stage, ac, precision)


@pytest.fixture(scope="module")
def ledgers():
    return run_distributed(zero_r_ledgers, 4)


@pytest.mark.parametrize("tp", [2, 4])
def test_pa_divides_checkpoint_bytes_by_mp(ledgers, tp):
    for r in ledgers:
        plain = r[(tp, "ckpt")]["ckpt"]["activation_checkpoints"]
        pa = r[(tp, "pa")]["ckpt"]["activation_checkpoints"]
        assert plain == r[(tp, "ckpt")]["expected_full"], "L*b*s*h*bytes without P_a"
        assert pa == plain // tp
        cpu = r[(tp, "pa_cpu")]["ckpt"]
        assert cpu["activation_checkpoints"] == 0 and cpu["activation_checkpoints_host"] == plain // tp
        md = r[(tp, "pa_md")]["ckpt"]
        assert md["activation_checkpoints"] == plain // tp, "M_D: one buffer of L slots of 1/MP each"


@pytest.mark.parametrize("tp", [2, 4])
def test_pa_volume_is_one_twelfth_of_mp(ledgers, tp):
    for r in ledgers:
        d = r[(tp, "pa")]
        L, bsh = d["layers"], d["bsh"]
        frac = (tp - 1) / tp
        assert d["mp"] == pytest.approx(L * 12 * bsh * frac, rel=1e-9), "12*b*s*h per block (paper §7)"
        assert d["pa"] == pytest.approx(L * bsh * frac, rel=1e-9)
        assert d["pa"] / d["mp"] == pytest.approx(1 / 12, rel=0.01)
        assert r[(tp, "ckpt")]["pa"] == 0
