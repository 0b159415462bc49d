"""Changes made inside ``engine.gathered_params()`` at stages 0-3, fp32 and bf16, ZeRO-Offload included
(``zerobench/zero/gathered.py``): kept by default (FSDP's ``summon_full_params(writeback=True)``), DP rank r's
kept under ``modifier_rank=r`` (DeepSpeed's ``GatheredParameters``), discarded under ``writeback=False``;
what was written before an exception is treated as on a normal exit. Before, every change made there was lost: at stage 3 on exit, at stages 0-2 under
bf16 at the next step, which recomputed the parameters from the untouched master."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.gathered_writeback import run_gathered_writeback
from tests.helpers.module_load import CASES
from tests.helpers.tiers import STAGES

pytestmark = pytest.mark.dist
KEYS = [key for key, _, _ in CASES]
SAME = ("master", "params", "trained_master", "trained_params")


@pytest.fixture(scope="module")
def ranks():
    return run_distributed(run_gathered_writeback, 2, timeout=300)


@pytest.mark.parametrize("case", KEYS)
def test_changes_inside_are_kept(ranks, case):
    """Copying another model's weights in gives exactly the engine built from that model, and its training."""
    for r in ranks:
        res = r[case]["kept"]
        assert all(res[k] == 0.0 for k in SAME), (case, res)


@pytest.mark.parametrize("case", KEYS)
def test_untouched_parameters_keep_their_full_precision_master(ranks, case):
    """Only changed elements are written: under bf16 the others keep their fp32 master, not its rounding."""
    for r in ranks:
        zeroed, others = r[case]["one_changed"]
        assert zeroed == 0.0 and others == 0.0, (case, zeroed, others)


@pytest.mark.parametrize("case", KEYS)
def test_writeback_false_discards(ranks, case):
    for r in ranks:
        res = r[case]["discarded"]
        assert all(res[k] == 0.0 for k in SAME), (case, res)


@pytest.mark.parametrize("writeback", (True, False))
@pytest.mark.parametrize("case", KEYS)
def test_an_exception_inside_leaves_parameters_and_master_agreeing(ranks, case, writeback):
    """The exception propagates; what was written before it is kept (writeback) or discarded, as on a normal exit:
    never parameters that the next step would silently replace from an untouched master."""
    for r in ranks:
        assert "user code failed" in r[case][f"raised-{writeback}"]
        res = r[case][f"after_exception-{writeback}"]
        assert all(res[k] == 0.0 for k in SAME), (case, res)


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("precision", ("fp32", "bf16"))
def test_modifier_rank_values_win(ranks, stage, precision):
    """Rank 1 writes the other weights, rank 0 zeroes everything: both end with rank 1's, frozen ones too."""
    for r in ranks:
        res = r[f"modifier-s{stage}-{precision}"]
        assert all(res[k] == 0.0 for k in (*SAME, "frozen")), (stage, precision, res)


@pytest.mark.parametrize("stage", STAGES)
def test_a_state_dict_the_modifier_rank_alone_loads_reaches_every_master_exactly(ranks, stage):
    """HF's ZeRO-3 loading (rank 0 alone loads, inside ``GatheredParameters(modifier_rank=0)``) under bf16, of a
    fine-tune whose deltas (1e-5) bf16 mostly cannot hold: every rank ends with the engine built from the loaded
    model, master and parameters, before and after training. Before, the other ranks' master shards took the bf16
    broadcast: rounded values, and the old ones wherever the rounding did not change."""
    for r in ranks:
        res = r[f"modifier-s{stage}-load"]
        assert all(res[k] == 0.0 for k in SAME), (stage, res)


@pytest.mark.parametrize("stage", STAGES)
def test_gathered_parameters_of_frozen_ones_alone_reach_every_rank(ranks, stage):
    """``GatheredParameters(frozen_params, modifier_rank=r)`` found no engine for a frozen parameter and did nothing:
    rank r's pretrained weights stayed on rank r (a helper's review), where DeepSpeed, which partitions frozen
    parameters at stage 3, gives them to every rank. Without ``modifier_rank`` the change is discarded."""
    for r in ranks:
        res = r[f"modifier-s{stage}-frozen-only"]
        assert res["n"] > 0 and res["kept"] == 0.0 and res["discarded"] == 0.0, (stage, res)


BAD_MODIFIER = {
    "bad": (
        "ConfigError: gathered_params(modifier_rank=2): expected a DP rank, an int in [0, 2), or None (each rank "
        "keeps its own changes)"
    ),
    "discard": (
        "ConfigError: gathered_params(writeback=False, modifier_rank=...): modifier_rank keeps that rank's "
        "changes, writeback=False discards them: pass one of the two"
    ),
}


@pytest.mark.parametrize("call", BAD_MODIFIER)
@pytest.mark.parametrize("stage", STAGES)
def test_a_bad_modifier_rank_is_one_line(ranks, stage, call):
    """A rank outside the group, or ``modifier_rank`` with ``writeback=False``."""
    for r in ranks:
        assert r[f"modifier-s{stage}-{call}"] == BAD_MODIFIER[call]


@pytest.mark.parametrize("case", KEYS)
def test_contexts_nest(ranks, case):
    """An inner ``gathered_params()`` leaves the outer one gathered (before, its exit freed every stage-3 unit under
    the outer block); an inner discard undoes its own change only; the outer block's writes are kept."""
    for r in ranks:
        res = r[case]["nested"]
        assert res["full_after_inner"] and res["head_back"], res
        assert all(res[k] == 0.0 for k in SAME), (case, res)
