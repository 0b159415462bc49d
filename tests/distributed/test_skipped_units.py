"""Stage 3 with units that some ranks skip and others run (LayerDrop; a mixture of experts whose unrouted experts are
not called): every rank issues the same collectives in the same order, and training matches one process running each
rank's slice with that rank's skips."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.skipped_units import SkipCase, run_skip_cases, skips_for

pytestmark = pytest.mark.dist

# Before ``zero/stage3/skipped.py`` skipping the last block hung until gloo's timeout, a skip with prefetch off crashed
# inside gloo (``op.preamble.length <= op.nbytes``), and this grid hung as a whole (its timeout caught it), MoE alone too.
CASES = [
    *(SkipCase(p) for p in ("last", "first", "middle_runs", "all_blocks", "random", "none")),
    *(SkipCase(p, prefetch=False) for p in ("last", "middle_runs", "random")),
    SkipCase("random", plain_backward=True),
    SkipCase("random", eval_between=True),
    SkipCase("random", config=(("offload_param", "cpu"), ("offload_optimizer", "cpu"))),
    SkipCase("random", config=(("overlap_comm", False),)),
    SkipCase("random", config=(("grad_accum_steps", 2),)),
    SkipCase("random", ckpt=True),
    *(SkipCase("random", stage=s) for s in (0, 1, 2)),
    SkipCase("none", reverse=True),
    SkipCase("moe"),
    SkipCase("middle_runs", find_unused=False),
    SkipCase("last", prefetch=False, find_unused=False),
]
# fp32; the gradient is summed over ranks in another order than one process sums it (see test_user_models).
UPDATE_RTOL, MAX_TOL = 1e-4, 2e-4


@pytest.fixture(scope="module", params=[2, pytest.param(3, marks=pytest.mark.slow)], ids=["w2", "w3"])
def grid(request):
    return request.param, run_distributed(run_skip_cases, request.param, CASES, timeout=300, coll_timeout=30)


@pytest.mark.parametrize("case", [c for c in CASES if c.find_unused], ids=lambda c: c.key)
def test_skipped_units_train_as_one_process(grid, case):
    world, ranks = grid
    results = [r[case.key] for r in ranks]
    for r in results:
        assert r["error"] is None, r["error"]
        assert r["missing"] == [], r
        assert r["max_update"] > 1e-3, "parameters did not move: the comparison would be vacuous"
        assert r["update_rel_err"] <= UPDATE_RTOL and r["max_diff"] <= MAX_TOL, (world, r)
    assert all(r["collectives"] == results[0]["collectives"] for r in results), "ranks issued different collectives"
    assert any(op == "all_gather" for op, _, _ in results[0]["collectives"]) or case.stage < 3
    # A forward out of the units' order is told once, and replays nothing after it sees that.
    assert [len(r["warnings"]) for r in results] == [1 if case.reverse else 0] * world, results[0]["warnings"]


def test_a_forward_out_of_the_units_order_is_told_which_units_and_how_to_fix_it(grid):
    _, ranks = grid
    (warning,) = ranks[0][SkipCase("none", reverse=True).key]["warnings"]
    assert warning.startswith("ZeRO stage 3: the forward ran unit 'blocks.3' after 'blocks.4', out of the units' order")
    assert "apply_zero(units=[...])" in warning


@pytest.mark.parametrize("case", [c for c in CASES if not c.find_unused], ids=lambda c: c.key)
def test_skipped_units_without_find_unused_are_refused_on_every_rank(grid, case):
    world, ranks = grid
    skipping = [r for r, s in enumerate(skips_for(case.pattern, world)[0]) if s]
    errors = [r[case.key]["error"] for r in ranks]
    head = f"UnusedParametersError: trained parameter(s) got no gradient on rank(s) {skipping}: unused in forward"
    assert all(e is not None and e.startswith(head) for e in errors), errors
    assert "blocks." in errors[0] and "find_unused_parameters=True" in errors[0]
    collectives = [r[case.key]["collectives"] for r in ranks]
    assert all(c == collectives[0] for c in collectives)


def test_moe_experts_as_units_differ_by_rank_and_train_as_one_process(grid):
    """The MoE case is not vacuous: some step routed no token to an expert on one rank and some on another."""
    _, ranks = grid
    per_rank = [r[SkipCase("moe").key]["experts_skipped"] for r in ranks]
    assert any(len(set(step)) > 1 for step in zip(*per_rank)), per_rank
