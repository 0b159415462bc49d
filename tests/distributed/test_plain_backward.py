"""DDP/FSDP-style loops (``loss.backward()``, ``optimizer.step()``) against the engine, stages 0-3 at world 2
(world 3 in the full tier), compared with single-process ``torch.optim.AdamW`` (``tests/helpers/plain_backward.py``)."""

from __future__ import annotations

import pytest

from tests.distributed.test_user_models import close
from tests.helpers.dist import run_distributed
from tests.helpers.plain_backward import run_plain_backward
from zerobench.zero.grads.backward import FP16_PLAIN_BACKWARD

pytestmark = pytest.mark.dist

CASES = (
    "plain",
    "accum",
    "reentrant",
    "mixed",
    "no_root_hooks",
    "two_windows",
    "module_zero_grad",
    "module_zero_grad_keep",
    "grad_none_by_hand",
    "ds_loop",
    "ds_loop_accum",
)


@pytest.fixture(
    scope="module",
    params=[
        pytest.param((w, s), marks=[pytest.mark.slow] if w == 3 else [], id=f"w{w}-s{s}")
        for w in (2, 3)
        for s in (0, 1, 2, 3)
    ],
)
def ranks(request):
    world, stage = request.param
    return stage, run_distributed(run_plain_backward, world, stage, timeout=300)


@pytest.mark.parametrize("case", CASES)
def test_plain_loss_backward_trains_as_torch_does(ranks, case):
    stage, results = ranks
    if case == "no_root_hooks" and stage == 3:
        pytest.skip("stage 3 gathers the root's parameters in its forward hooks: call the module, not .forward")
    if case == "grad_none_by_hand" and stage >= 2:
        pytest.skip("at stages 2-3 .grad is None already: clear with model.zero_grad() or the engine's")
    for r in results:
        got = r[case]
        assert got["max_update"] > 1e-3, "parameters did not move: the comparison would be vacuous"
        assert got["missing"] == [] and close(got), got
        assert got.get("state", "idle") == "idle"  # every pass closed by autograd's callback


def test_an_aborted_backward_leaves_nothing_open(ranks):
    _, results = ranks
    for r in results:
        a = r["aborted"]
        assert a["error"] == "ValueError: user hook failed"
        assert a["state_after_error"] == "plain"  # its close never ran: the next forward drops it
        assert a["max_update"] > 1e-3 and close(a), a


def test_fp16_plain_backward_is_refused_in_one_line(ranks):
    _, results = ranks
    for r in results:
        assert r["fp16_error"] == f"RuntimeError: {FP16_PLAIN_BACKWARD}"
        assert r["fp16_state"] == "idle"


def test_a_window_mixing_both_backwards_is_refused_in_one_line(ranks):
    _, results = ranks
    for r in results:
        assert r["mixed_window_error"] == (
            "RuntimeError: one accumulation window mixes engine.backward(loss) (or "
            "engine.scale(loss).backward()) and plain loss.backward(): use one of them "
            "for all grad_accum_steps micro-batches of a window"
        )


@pytest.mark.parametrize("path", ("engine", "plain"))
def test_gradients_are_ddps_mean_over_ranks(ranks, path):
    """What DDP users read after backward: the gradient averaged over ranks (``p.grad`` at stage 0, where it is
    the whole gradient; ``full_gradients`` at every stage), and torch's ``clip_grad_norm_`` on ``p.grad``."""
    stage, results = ranks
    for r in results:
        assert r["ddp_grad_max"] > 1e-2
        assert r[f"{path}_full_diff"] <= 1e-6 * r["ddp_grad_max"] * 10, r
        assert r[f"{path}_engine_clip_norm"] == pytest.approx(r["ddp_clip_norm"], rel=1e-5)
        if stage == 0:
            assert r[f"{path}_pgrad_diff"] <= 1e-6 * r["ddp_grad_max"] * 10, r
            assert r[f"{path}_torch_clip_norm"] == pytest.approx(r["ddp_clip_norm"], rel=1e-5)


def test_the_model_keeps_its_class_and_copies_are_plain(ranks):
    _, results = ranks
    for r in results:
        assert r["class_name"] == "MLP" and r["isinstance"]
        assert r["copy_class"]
        assert r["reduced_after_copy_cleared"] is True


def test_zero_grad_leaves_grad_as_torch_optim_does(ranks):
    stage, results = ranks
    for r in results:
        assert r["grad_none_after_zero_grad"] is True
        assert r["grad_zeros_after_zero_grad_keep"] is (True if stage < 2 else None)


def test_no_sync_accumulates_without_traffic_at_stages_0_1(ranks):
    """DDP's ``no_sync()`` loop trains as the reference at every stage; at stages 0-1 the gradients of the pass
    under it are not communicated (half the traffic of two synchronised passes), at stages 2-3 they are
    reduce-scattered into the partition as usual (the same traffic)."""
    stage, results = ranks
    for r in results:
        for use in (True, False):
            got = r[f"no_sync_{use}"]
            assert got["max_update"] > 1e-3 and close(got), (use, got)
        ratio = r["grad_volume_True"] / r["grad_volume_False"]
        assert ratio == (0.5 if stage < 2 else 1.0), r
        assert r["no_sync_step_error"] == (
            "RuntimeError: step() after 1 backward pass(es) under no_sync() and none "
            "outside it: the window's last backward must run outside no_sync() (it "
            "synchronises)"
        )


def test_deepspeed_loop_steps_at_window_ends_only(ranks):
    """``engine.step()`` after every micro-batch, as DeepSpeed's loop calls it: a no-op inside a window, the step
    (then ``zero_grad``) at its end."""
    _, results = ranks
    for r in results:
        assert r["ds_applied_1"] == [True] * 3
        assert r["ds_applied_2"] == [False, True] * 3
