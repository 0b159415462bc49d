"""``apply_zero(param_groups=...)`` at stages 0-3: users' param groups, each with its own hyperparameters and
schedule, against single-process ``torch.optim.AdamW`` with the same groups (``tests/helpers/param_groups.py``)."""

from __future__ import annotations

import pytest

from tests.distributed.test_user_models import close
from tests.helpers.dist import run_distributed
from tests.helpers.param_groups import run_param_groups

pytestmark = pytest.mark.dist


@pytest.fixture(
    scope="module",
    params=[
        pytest.param((w, s), marks=[pytest.mark.slow] if w == 3 or s < 3 else [], id=f"w{w}-s{s}")
        for w in (2, 3)
        for s in (0, 1, 2, 3)
    ],
)
def groups(request):
    world, stage = request.param
    return world, stage, run_distributed(run_param_groups, world, stage, timeout=300)


def test_each_group_steps_with_its_own_hyperparameters_and_schedule(groups):
    """Fused kernel, reference path and (stages 1-3) ZeRO-Offload: the parameters of torch's AdamW with the same
    three groups, and each step's lr per group as torch's per-group ``LambdaLR`` sets it."""
    world, stage, ranks = groups
    for r in ranks:
        variants = ["fused", "reference_kernels"] + (["offload"] if stage > 0 else [])
        for v in variants:
            assert r[v]["max_update"] > 1e-3 and not r[v]["missing"]
            assert close(r[v]), (world, stage, v, r[v])
            assert [lr for lrs in r[f"{v}_lrs"] for lr in lrs] == pytest.approx(
                [lr for lrs in r["ref_lrs"] for lr in lrs]
            )
        assert len({tuple(lrs) for lrs in r["ref_lrs"]}) == len(r["ref_lrs"])  # the groups' lrs move apart


def test_a_checkpoint_carries_every_group_and_refuses_other_groups(groups):
    """Each group's lr after two steps comes back from a sharded checkpoint; two more steps then equal four
    straight; an engine with the default single group, or with groups 1 and 2 swapped, refuses
    the checkpoint and keeps its own hyperparameters."""
    for r in groups[2]:
        assert r["resumed_lrs"] == r["saved_lrs"] and len(set(r["saved_lrs"])) == 3
        assert r["resume_diff"] == 0.0
        assert r["other_groups"] == (
            "CheckpointMismatch: checkpoint has 3 param group(s), this engine 1: build the "
            "engine with the same param_groups"
        )
        assert r["other_members"].startswith(
            "CheckpointMismatch: param_groups[1] holds other parameters than the checkpoint's"
        )
        assert r["other_members_kept"], "a refused checkpoint changed the engine's hyperparameters"


def test_a_trained_parameter_in_no_group_fails_in_one_line_on_every_rank(groups):
    """The first left-out parameter in ``model.parameters()`` order, at every stage (stage 3 lays them out by unit)."""
    line = (
        "ConfigError: parameter scale requires a gradient but is in no param group (9 such): add it "
        "to one, or set requires_grad=False"
    )
    assert {r["left_out"] for r in groups[2]} == {line}
