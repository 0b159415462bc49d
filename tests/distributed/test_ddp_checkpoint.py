"""Stage 0 equals torch DDP; a DP=4 checkpoint resumes at DP=2 exactly and loads into one process."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.workers_engine import checkpoint_resume, ddp_vs_stage0

pytestmark = pytest.mark.dist


def test_stage0_matches_torch_ddp():
    diffs = run_distributed(ddp_vs_stage0, 2, 3)
    assert max(diffs) <= 1e-5, diffs


@pytest.mark.parametrize("stage", [*(pytest.param(s, marks=pytest.mark.slow) for s in (0, 1, 2)), 3])
def test_checkpoint_dp4_resumes_at_dp2(stage, tmp_path):
    results = run_distributed(checkpoint_resume, 4, stage, str(tmp_path / "ckpt"))
    for r in results:
        assert r["moved"] > 1e-4, "training after the checkpoint changed nothing: vacuous comparison"
        assert r["diff"] <= 1e-6, r
        assert r["step_after_load"] == 2
        assert r["single_vs_saved"] == 0.0, r


@pytest.mark.parametrize("stage", [2, 3])
def test_a_one_parameter_bucket_is_reduced_from_its_gradient(stage):
    from tests.helpers.workers_engine import sole_buckets

    for res in run_distributed(sole_buckets, 2, stage):
        assert "wte.weight" in res[True]["sole"], res[True]["sole"]
        assert res[True]["taken"] == sorted(res[True]["sole"]), "no copy into staging for a one-parameter bucket"
        assert res[False]["taken"] == []
        for name, value in res[False]["params"].items():
            assert (res[True]["params"][name] == value).all(), name


@pytest.mark.parametrize("stage", [0, 1])
def test_grads_are_views_of_the_bucket_buffer(stage):
    from tests.helpers.workers_engine import grad_views

    for res in run_distributed(grad_views, 2, stage):
        assert res[False]["views"] == [True] * 3, "autograd must accumulate into the bucket buffer in place"
        assert res[True]["views"] == [True] * 3, "a reset .grad is put back as the view"
        for name, value in res[False]["params"].items():
            assert (res[True]["params"][name] == value).all(), name
