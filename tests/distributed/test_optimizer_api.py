"""``engine.optimizer`` as a ``torch.optim.Optimizer``: learning-rate schedules, closures, step hooks, state dicts
and checkpoints, at stages 0-3 against single-process ``torch.optim.AdamW`` driven the same way."""

from __future__ import annotations

import pytest

from tests.distributed.test_user_models import close
from tests.helpers.dist import run_distributed
from tests.helpers.optimizer_api import run_optimizer_api, schedule
from tests.helpers.user_models import ADAM

pytestmark = pytest.mark.dist


@pytest.fixture(
    scope="module",
    params=[
        pytest.param((w, s), marks=[pytest.mark.slow] if w == 3 else [], id=f"w{w}-s{s}")
        for w in (2, 3)
        for s in (0, 1, 2, 3)
    ],
)
def api(request):
    world, stage = request.param
    return world, stage, run_distributed(run_optimizer_api, world, stage, timeout=300)


def test_lr_scheduler_drives_the_engine(api):
    """``LambdaLR(engine.optimizer, ...)`` stepped after ``engine.step()``: each step uses the schedule's lr
    (0 on the first), the parameters follow torch's AdamW under the same schedule, and torch sees the
    optimizer stepped before the scheduler (no order warning)."""
    world, stage, ranks = api
    for r in ranks:
        assert r["is_optimizer"]
        assert r["lrs"] == pytest.approx([ADAM.lr * schedule(s) for s in range(5)])
        assert r["warnings"] == []
        assert r["schedule"]["max_update"] > 1e-3
        assert close(r["schedule"]), (world, stage, r["schedule"])


def test_weight_decay_set_in_param_groups_with_closure_and_hooks(api):
    """Built with no weight decay, given 0.1 through ``param_groups``; stepped as ``optimizer.step(closure)``
    (under ZeRO-Offload at stages 1-3): the same parameters as torch's AdamW with 0.1, and the step hooks
    ran once per step."""
    world, stage, ranks = api
    for r in ranks:
        assert close(r["closure_decay_offload"]), (world, stage, r["closure_decay_offload"])
        assert r["hook_calls"] == ["pre", "post"] * 5


def test_clip_grad_norm_matches_torch(api):
    """``engine.clip_grad_norm_(0.05)`` clips the global gradient as ``torch.nn.utils.clip_grad_norm_`` does on one
    process (which on a rank would see summed or no ``.grad``), and returns the same total norm."""
    world, stage, ranks = api
    for r in ranks:
        norms, ref_norms = r["clip_norms"]
        assert min(ref_norms) > 0.05  # every step clipped
        assert norms == pytest.approx(ref_norms, rel=1e-5)
        assert close(r["clip"]), (world, stage, r["clip"])
        assert r["clip_early"] == (
            "RuntimeError: clip_grad_norm_() before this window's gradients are reduced: "
            "call it after the last backward() of the window, before step()"
        )


def test_the_models_own_clip_grad_norm_in_fsdp1s_loop(api):
    """FSDP1's loop (``loss.backward()``, ``model.clip_grad_norm_(0.05)``, ``optimizer.step()``): the model's method
    is the engine's, so it trains and returns norms as the engine's does, which torch's function on the rank's
    ``.grad`` would not at stages 1-3; a norm_type that is no p-norm is refused in one line."""
    world, stage, ranks = api
    for r in ranks:
        _, ref_norms = r["clip_norms"]
        assert r["model_clip_norms"] == pytest.approx(ref_norms, rel=1e-5)
        assert close(r["model_clip"]), (world, stage, r["model_clip"])
        assert r["clip_bad_norm"] == (
            "ConfigError: clip_grad_norm_(norm_type=0): the ZeRO engine clips by a global "
            "p-norm, p > 0 or inf (2 by default)"
        )


@pytest.mark.parametrize("p", ("1.0", "3.0", "inf"))
def test_clip_grad_norm_with_another_norm_type(api, p):
    """``norm_type`` 1, 3 and inf, as FSDP's and torch's ``clip_grad_norm_`` take it: the same norms and parameters as
    torch's function on one process, every step clipped (before: refused, L2 only)."""
    world, stage, ranks = api
    for r in ranks:
        res = r[f"clip_p{p}"]
        norms, ref_norms = res["norms"]
        assert min(ref_norms) > res["max_norm"], "no step clipped: a vacuous comparison"
        assert norms == pytest.approx(ref_norms, rel=1e-5), (stage, norms, ref_norms)
        assert close(res["compare"]), (world, stage, res["compare"])


def test_state_dict_resumes_mid_schedule_bit_identically(api):
    """Optimizer and scheduler state dicts after 3 of 5 steps, through ``torch.save``/``torch.load(weights_only=True)``,
    loaded into an engine built from another initialisation: the last 2 steps land exactly where
    training straight through does. The sharded checkpoint restores the current lr as well."""
    _, _, ranks = api
    for r in ranks:
        assert r["resume_lr"] == pytest.approx(ADAM.lr * schedule(3))
        assert r["resume_diff"] == 0.0
        (group,) = r["resume_groups"]
        assert group["initial_lr"] == ADAM.lr and group["lr"] == pytest.approx(ADAM.lr * schedule(3))
        assert r["checkpoint_lr"] == pytest.approx(ADAM.lr * schedule(3))
        assert r["checkpoint_initial_lr"] == ADAM.lr


def test_bad_param_groups_fail_in_one_line_on_every_rank(api):
    for r in api[2]:
        assert r["negative_lr"] == "ConfigError: param_groups[0]['lr'] must be a finite number >= 0, got -1.0"
        assert r["nan_lr"] == "ConfigError: param_groups[0]['lr'] must be a finite number >= 0, got nan"
        assert r["bad_betas"].startswith("ConfigError: param_groups[0] needs eps > 0 and betas in [0, 1)")
        assert r["add_group"].startswith(
            "ValueError: the ZeRO engine lays out its param groups in the partition at "
            "construction: pass every group to apply_zero(param_groups=...)"
        )
        assert all("\n" not in r[k] for k in ("negative_lr", "nan_lr", "bad_betas", "add_group"))
        assert r["after_errors_stepped"] is True
