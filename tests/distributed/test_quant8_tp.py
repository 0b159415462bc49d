"""8-bit Adam moments under tensor parallelism. A quantization block (2048 elements of a flat chunk, one absmax)
that held both TP-sharded and TP-replicated parameters took a different absmax on each TP rank, so the replicated
parameters were rounded differently and drifted apart across TP ranks (9e-5 after 3 steps, 6e-4 after 20, in a
review). Under TP the blocks now start afresh at the edges of the replicated ranges."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.scenarios import Scenario, run_scenarios

pytestmark = pytest.mark.dist

SHARDED = ("qkv.weight", "qkv.bias", "fc.weight", "fc.bias", "proj.weight")

CASES = [
    Scenario(1, 0, tp=2, optim_bits=8, steps=6),
    Scenario(1, 2, tp=2, optim_bits=8, steps=6),
    Scenario(1, 3, tp=2, optim_bits=8, steps=6, offload="nvme", offload_param="cpu"),
    Scenario(1, 2, tp=2, optim_bits=32, steps=6),
]
DP_ONLY = Scenario(2, 2, optim_bits=8, steps=6)
"""8-bit moments without TP: the rounding the 8-bit TP runs are compared with."""


@pytest.fixture(scope="module")
def trained():
    return run_distributed(run_scenarios, 2, [*CASES, DP_ONLY], True, timeout=400)


def _replicated(params: dict) -> dict:
    return {n: v for n, v in params.items() if not n.endswith(SHARDED) and n != "wte.weight"}


@pytest.mark.parametrize("sc", CASES, ids=[sc.key for sc in CASES])
def test_replicated_parameters_stay_equal_across_tp_ranks(trained, sc):
    a, b = (_replicated(trained[r][sc.key]["params"]) for r in (0, 1))
    assert len(a) > 10 and a.keys() == b.keys()
    unequal = [n for n in a if not np.array_equal(a[n], b[n])]
    assert not unequal, (sc.key, unequal[:4])
    for r in (0, 1):
        res = trained[r][sc.key]
        assert res["max_update"] > 1e-4, "parameters did not move: the comparison would be vacuous"
        # 8-bit moments are not fp32's: against the single-process fp32 reference, an 8-bit TP run's update is off by
        # about what 8-bit moments without TP are. Its blocks hold other elements (each TP rank half of every sharded
        # parameter), so not the same: 5.1% against 3.8% here, with blocks cut at the replicated ranges or not.
        bound = 1.5 * trained[r][DP_ONLY.key]["update_rel_err"] if sc.optim_bits == 8 else 1e-4
        assert res["update_rel_err"] <= bound, (sc.key, res["update_rel_err"], bound)
