"""The arguments of DeepSpeed's ``engine.backward`` (``retain_graph``, ``scale_wrt_gas``), and two losses of one forward
each with its own backward, in the loops of ``helpers/backward_args.py``: as one process at every stage.

Before, stage 3 failed on the second backward with ``setStorage: ... out of bounds for storage of size 0`` from inside
torch: its units were gathered once per forward, and the first backward had freed them. Now a unit is gathered once
per autograd graph task (each backward is one), as DeepSpeed's fix for the same failure does.
"""

from __future__ import annotations

import pytest

from tests.helpers.backward_args import all_cases
from tests.helpers.dist import run_distributed
from tests.helpers.tiers import STAGES

pytestmark = pytest.mark.dist

TOL = 1e-6  # fp32, 3 AdamW steps at lr 1e-2: measured 1.5e-8


@pytest.fixture(scope="module", params=STAGES)
def ran(request):
    """Every case at one stage, run once (one spawn of the two ranks per stage)."""
    return request.param, run_distributed(all_cases, 2, request.param, timeout=300)


@pytest.mark.parametrize("loop", ("plain", "zero_between", "accum"))
def test_two_losses_with_separate_backwards(ran, loop):
    for r in ran[1]:
        assert r["two_losses"][loop]["diff"] <= TOL, r["two_losses"]


def test_scale_wrt_gas_false_leaves_the_division_to_the_loop(ran):
    """DeepSpeed's ``engine.backward(loss, scale_wrt_gas=False)``: the loss is not divided by ``grad_accum_steps``."""
    for r in ran[1]:
        assert r["unscaled"]["diff"] <= TOL, r["unscaled"]


@pytest.mark.parametrize("precision", ("fp32", "fp16"))
def test_engine_scale_then_plain_backward(ran, precision):
    """DeepSpeed's ``engine.scale(loss).backward()`` gives ``engine.backward(loss)``'s training bit for bit (the same
    scaling, applied at the same point); under fp16 it is how a plain backward is allowed (the bare loss's is still
    refused: it would step on unscaled gradients)."""
    for r in ran[1]:
        got = r["scaled"][precision]
        assert got["diff"] == 0.0, got
        if precision == "fp16":
            assert got["bare_error"] is not None and "engine.scale(loss).backward()" in got["bare_error"], got
