"""TP-aware RNG: dropout differs across TP ranks only inside sharded regions; recompute replays it."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.workers_tp import tp_rng_and_dropout

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module")
def res():
    return run_distributed(tp_rng_and_dropout, 2)


def test_tracker_differs_inside_and_agrees_outside(res):
    a, b = res
    assert a["outside"] == b["outside"] and a["after"] == b["after"]
    assert a["inside"] != b["inside"]


def test_replicated_activations_agree_across_tp_ranks_with_dropout(res):
    a, b = res
    assert a["block_out_sum"] == b["block_out_sum"]


def test_checkpoint_recompute_replays_dropout_exactly(res):
    for r in res:
        assert r["grad_norm"] > 0
        assert r["ckpt_vs_plain"] <= 1e-7, r
