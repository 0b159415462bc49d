"""DeepSpeed's loop queries (what ``engine.backward`` returns, ``is_gradient_accumulation_boundary``,
``was_step_applied``, ``global_steps``, ``get_global_grad_norm``, ``gradient_accumulation_steps``,
``zero_optimization_stage``) read what DeepSpeed's own engine reads in the same loop, and both engines end with
the same parameters (``tests/helpers/ds_counters.py``). Without DeepSpeed installed, the sequence is checked against its rule."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.ds_counters import ACCUM, BOUNDARIES, MICRO_BATCHES, ds_counters, ds_manual_boundaries
from tests.helpers.tiers import STAGES
from zerobench.peers.registry import deepspeed_available

# Full grid only: DeepSpeed's first use in a fresh environment builds its ops (35 s on the 2-core CI VM).
pytestmark = [pytest.mark.dist, pytest.mark.slow]


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("plain", [False, True], ids=["engine_backward", "loss_backward"])
def test_deepspeed_loop_queries_match_deepspeed(stage, plain):
    have_ds = deepspeed_available()
    for r in run_distributed(ds_counters, 2, stage, have_ds, plain, timeout=300):
        ours = r["ours"]
        boundary = [(k + 1) % ACCUM == 0 for k in range(MICRO_BATCHES)]
        assert [m["boundary_before_forward"] for m in ours] == boundary
        assert [m["boundary_after_backward"] for m in ours] == boundary
        assert [m["applied"] for m in ours] == boundary
        assert [m["global_steps"] for m in ours] == [(k + 1) // ACCUM for k in range(MICRO_BATCHES)]
        assert all(m["norm"] > 0 for m in ours if m["boundary_after_backward"])
        assert r["queries"] == (ACCUM, stage)
        assert [m["returned_over_loss"] for m in ours] == (
            [None] * MICRO_BATCHES if plain else [1 / ACCUM] * MICRO_BATCHES
        )
        if "deepspeed" not in r:  # not installed, or loss.backward() at stage 0, which DeepSpeed refuses
            continue
        theirs = r["deepspeed"]
        for key in (
            "boundary_before_forward",
            "boundary_after_backward",
            "applied",
            "global_steps",
            "returned_over_loss",
        ):
            assert [m[key] for m in ours] == [m[key] for m in theirs], key
        # DeepSpeed 0.19.8 keeps no norm at stage 0 with a client torch optimizer (None); ours has it there too.
        pairs = [(a["norm"], b["norm"]) for a, b in zip(ours, theirs) if b["norm"] is not None]
        assert len(pairs) == (0 if stage == 0 else MICRO_BATCHES // ACCUM)
        assert [a for a, _ in pairs] == pytest.approx([b for _, b in pairs], rel=1e-5)
        assert r["queries_deepspeed"] == r["queries"]
        assert r["moved"] > 1e-3 and r["param_diff"] < 1e-5, r


@pytest.mark.parametrize("stage", STAGES)
@pytest.mark.parametrize("step_every", [False, True], ids=["step_at_boundary", "step_every_micro_batch"])
def test_boundaries_set_by_hand_match_deepspeed(stage, step_every):
    """Accelerate's loop (``set_gradient_accumulation_boundary`` before each backward, windows of 2, 3 and 1
    micro-batches where the config says 2): the engine steps where the boundary is set, each window's gradients
    averaged by the configured accumulation steps, as the one-process reference and DeepSpeed's engine do."""
    have_ds = deepspeed_available()
    for r in run_distributed(ds_manual_boundaries, 2, stage, have_ds, step_every, timeout=300):
        ours = r["ours"]
        assert [m["boundary"] for m in ours] == BOUNDARIES
        assert [m["global_steps"] for m in ours] == [0, 1, 1, 1, 2, 3]
        assert [m.get("applied") for m in ours] == [
            False if step_every else None,
            True,
            *[False if step_every else None] * 2,
            True,
            True,
        ]
        assert r["moved"] > 1e-3 and r["reference_diff"] < 1e-5, r
        if "deepspeed" in r:
            assert r["deepspeed"] == ours
            assert r["param_diff"] < 1e-5, r
