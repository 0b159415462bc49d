"""Stage 0 equals torch DDP; a DP=4 checkpoint resumes at DP=2; how gradient buckets are staged, held, waited for."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.tiers import STAGES, tiered
from tests.helpers.workers_engine import checkpoint_resume, ddp_vs_stage0

pytestmark = pytest.mark.dist


def test_stage0_matches_torch_ddp():
    diffs = run_distributed(ddp_vs_stage0, 2, 3)
    assert max(diffs) <= 1e-5, diffs


@pytest.mark.parametrize("stage", tiered((0, 1, 2, 3), fast=(3,)))
def test_checkpoint_dp4_resumes_at_dp2(stage, tmp_path):
    results = run_distributed(checkpoint_resume, 4, stage, str(tmp_path / "ckpt"))
    for r in results:
        assert r["moved"] > 1e-4, "training after the checkpoint changed nothing: vacuous comparison"
        assert r["diff"] <= 1e-6, r
        assert r["step_after_load"] == 2
        assert r["single_vs_saved"] == 0.0, r


@pytest.mark.parametrize("stage", tiered((2, 3), fast=(3,)))
def test_a_one_parameter_bucket_is_reduced_from_its_gradient(stage):
    from tests.helpers.workers_buckets import sole_buckets

    for res in run_distributed(sole_buckets, 2, stage):
        assert "wte.weight" in res[True]["sole"], res[True]["sole"]
        assert res[True]["taken"] == sorted(res[True]["sole"]), "no copy into staging for a one-parameter bucket"
        assert res[False]["taken"] == []
        for name, value in res[False]["params"].items():
            assert (res[True]["params"][name] == value).all(), name


@pytest.mark.parametrize("stage", tiered((0, 1), fast=(0,)))
def test_grads_are_views_of_the_bucket_buffer(stage):
    from tests.helpers.workers_buckets import grad_views

    for res in run_distributed(grad_views, 2, stage):
        assert res[False]["views"] == [True] * 3, "autograd must accumulate into the bucket buffer in place"
        assert res[True]["views"] == [True] * 3, "a reset .grad is put back as the view"
        for name, value in res[False]["params"].items():
            assert (res[True]["params"][name] == value).all(), name


@pytest.mark.parametrize("stage", tiered((2, 3), fast=(3,)))
def test_the_gradient_partition_is_held_from_backward_to_zero_grad(stage):
    """As ``zero_grad(set_to_none=True)``: no gradient shard through forward; during backward each bucket's
    shard appears as its reduce-scatter starts; all are released by ``zero_grad``. The ledger reports the
    partition at its size while held."""
    from tests.helpers.workers_buckets import grad_partition_lifetime

    for res in run_distributed(grad_partition_lifetime, 2, stage):
        n = res["buckets"]
        for step in range(2):
            assert res[f"after_forward_{step}"] == 0, "forward holds no gradient shard"
            assert res[f"held_at_take_{step}"] == list(range(n)), "one shard more per bucket reduced"
            assert res[f"after_step_{step}"] == n
            assert res[f"after_zero_{step}"] == 0
        assert res["ledger_before"] == res["ledger_after"] == res["partition_bytes"]
        assert res["grads_after_zero"] == 0.0


@pytest.mark.parametrize("stage", STAGES)
def test_overlap_comm_off_waits_for_each_bucket(stage):
    """``overlap_comm`` on, with a network too slow to finish any collective before it is waited for: at
    stages 0-1 up to two bucket collectives run on while backward goes on; at stages 2-3 one, and the next
    bucket's gradients are held back as autograd made them instead of filling a second staging buffer (at
    most one large one is alive). Off: backward waits for each as it starts, so at stages 2-3 nothing is held
    next to the bucket filling, and the peak live bytes are lower. The trained parameters are the same."""
    from tests.helpers.workers_buckets import overlap_comm

    for res in run_distributed(overlap_comm, 2, stage):
        on, off = res[True], res[False]
        assert on["buckets"] >= 3
        assert on["outstanding"] == 2 if stage < 2 else on["outstanding"] >= 1, on["outstanding"]
        assert off["outstanding"] == 0, off["outstanding"]
        if stage >= 2:
            assert on["staged_beside"] == 0 and on["held"] > 0, on
            assert off["held"] == 0, off
            assert on["peak"] <= off["peak"] + on["largest_bytes"], (on["peak"], off["peak"])
        for name, value in on["params"].items():
            assert (off["params"][name] == value).all(), name


@pytest.mark.parametrize("stage", tiered((2, 3), fast=(3,)))
def test_a_tied_parameters_second_gradient_waits_for_the_buckets_in_flight(stage):
    """The tied embedding's lookup gradient (autograd's second full-size one beside the head's) is allocated
    with no bucket being reduced: the collectives in flight finished first, so the peak is lower than without
    that wait, which had some in flight there on a slow network. The trained parameters are the same."""
    from tests.helpers.workers_buckets import tied_wait

    for res in run_distributed(tied_wait, 2, stage):
        on, off = res[True], res[False]
        assert "wte.weight" in on["sole"], on["sole"]
        assert len(on["inflight"]) == 3 and on["inflight"] == [0, 0, 0], on["inflight"]
        assert min(off["inflight"]) >= 1, off["inflight"]
        assert on["peak"] < off["peak"], (on["peak"], off["peak"])
        for name, value in on["params"].items():
            assert (off["params"][name] == value).all(), name
