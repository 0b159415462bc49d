"""A gradient penalty (``torch.autograd.grad(..., create_graph=True)`` inside the loss) trains as one process at every
stage, in DeepSpeed's loop and in DDP's, with and without accumulation, and costs no collective of its own.

Before: the autograd.grad backward went through the model's output hook and opened a micro-batch. With
accumulation the window was refused as mixing the two loops; without, it reduced a window of zeros (one more
collective per step); at stage 3 closing it freed the units the second backward needed (a ``setStorage`` error
from inside torch).
"""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.grad_penalty import LOOPS, penalty_all
from tests.helpers.tiers import STAGES

pytestmark = pytest.mark.dist

TOL = 1e-6  # fp32, 3 AdamW steps at lr 1e-2: measured 3e-8


@pytest.fixture(scope="module", params=STAGES)
def ran(request):
    """Every loop at one stage, run once (one spawn of the two ranks per stage)."""
    return run_distributed(penalty_all, 2, request.param, timeout=300)


@pytest.mark.parametrize("loop, accum", LOOPS)
def test_gradient_penalty_trains_as_one_process(ran, loop, accum):
    for ranks in ran:
        r = ranks[f"{loop}-{accum}"]
        assert r["diff"] <= TOL, r
        for with_penalty, without in r["volumes"]:
            assert with_penalty == without > 0, r["volumes"]
