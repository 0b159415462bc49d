"""A parameter changed in place between steps under bf16/fp16 at stages 0-2, and under optimizer offload
(``tests/helpers/param_edits.py``): the next step starts from the change, checkpoints and
``safe_get_full_fp32_param`` hold it, and writes that change nothing leave training bit for bit as it was."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.param_edits import (
    CASES,
    case_key,
    run_param_edits,
    run_restore_after_write,
    run_sum_keeping_edits,
)
from tests.helpers.user_models import ADAM

pytestmark = pytest.mark.dist

# tests/distributed/test_user_models_bf16.py's bound on the whole update against the bf16 recipe.
BF16_UPDATE_RTOL = 0.05
# One Adam step moves an element by at most a few learning rates (|m_hat| / sqrt(v_hat) stays near 1): a row zeroed
# before the last step ends within this of zero, where the row it replaced was about 0.8 in magnitude.
ONE_STEP = 5 * ADAM.lr


@pytest.fixture(scope="module")
def edits():
    return run_distributed(run_param_edits, 2, timeout=300)


@pytest.mark.parametrize("case", [case_key(*c) for c in CASES])
def test_a_change_in_place_is_what_the_next_step_starts_from(edits, case):
    for r in edits:
        res = r[case]
        assert res["row0_max"] <= ONE_STEP, res
        assert res["row0_module"] <= ONE_STEP, res
        assert res["head_from_fixed"] <= 2 * ONE_STEP, res
        if "bf16" in case:
            assert res["update_rel_err"] <= BF16_UPDATE_RTOL, res
            assert res["row0_ref_diff"] <= ONE_STEP / 2, res


@pytest.mark.parametrize("case", [case_key(*c) for c in CASES])
def test_a_change_after_the_last_step_is_saved_and_read(edits, case):
    for r in edits:
        assert r[case]["row1_safe_get"] == 0.0, r[case]
        assert r[case]["row1_saved"][0] == 0.0, r[case]  # the optimizer state's fp32 master holds the change
    assert sum(r[case]["row1_saved"][1] for r in edits) >= 1  # the row is in some rank's shard


@pytest.mark.parametrize("case", [case_key(*c) for c in CASES])
def test_writes_that_change_nothing_change_no_master(edits, case):
    for r in edits:
        assert r[case]["noop_identical"], r[case]


def test_under_offload_a_restore_after_a_load_is_taken_in():
    """Under offload the step's checksum is not trusted after a write outside the step: the values copied back in
    place (equal to the checksummed ones) reach the master, after ``model.load_state_dict``,
    ``safe_set_full_fp32_param`` or a checkpoint load. Before, the master kept the written values silently."""
    for r in run_distributed(run_restore_after_write, 2, timeout=300):
        assert r == {"load_state_dict": 0.0, "safe_set": 0.0, "optimizer_load": 0.0}, r


def test_under_offload_a_change_that_keeps_the_sum_of_bits_is_taken_in():
    """Under offload the step finds a changed shard by its signature. A permutation in place and negating as many
    positive as negative values keep a plain sum of the shard's bits; the master must take them in all the same, when
    read and at the next step. Before, the next step silently restored the values the step had left."""
    for r in run_distributed(run_sum_keeping_edits, 2, timeout=300):
        assert set(r) == {case_key(*c) for c in CASES if c[3] != "none"}, r
        for case, res in r.items():
            assert res["edit_size"] > 4 * ONE_STEP, (case, res)  # each edit moves some value by several steps' moves
            assert res["read"] == 0.0, (case, res)
            assert res["from_edited"] <= 2 * ONE_STEP, (case, res)
            assert res["from_before"] > 2 * ONE_STEP, (case, res)  # not undone: undone, it would be one step's move
