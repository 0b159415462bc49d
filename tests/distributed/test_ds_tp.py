"""DeepSpeed's ``initialize(mpu=...)`` on a tensor-parallel model. Before, ``mpu=`` was refused and the refusal sent
users to apply TP first and pass ``dp_group=``: the engine then knew no TP group, each TP rank clipped by its own
shard's norm (0.844 where the model's is 0.978), and the replicated LayerNorms drifted apart across TP ranks."""

from __future__ import annotations

import numpy as np
import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.ds_tp import initialize_with_mpu

pytestmark = pytest.mark.dist


def _check(results: list[dict]) -> None:
    for r in results:
        assert r["sharded"] > 0, r
        assert r["norms"] == pytest.approx(r["ref_norms"], rel=1e-5), r
        assert r["drift"] < 2e-5, r  # the parameters follow the single-process reference (fp32)
    a, b = results[0]["replicated"], results[1]["replicated"]
    assert a.keys() == b.keys() and all(np.array_equal(a[n], b[n]) for n in a)  # TP ranks 0 and 1 step alike


@pytest.mark.parametrize("stage", [2, pytest.param(0, marks=pytest.mark.slow), pytest.param(3, marks=pytest.mark.slow)])
def test_initialize_takes_a_mesh_as_mpu_and_clips_by_the_whole_models_norm(stage):
    _check(run_distributed(initialize_with_mpu, 2, 2, stage, "mesh", timeout=180))


@pytest.mark.slow
def test_initialize_takes_megatron_cores_parallel_state_as_mpu():
    pytest.importorskip("megatron.core")
    _check(run_distributed(initialize_with_mpu, 2, 2, 1, "megatron", timeout=180))


def test_a_tensor_parallel_model_without_mpu_is_refused():
    for r in run_distributed(initialize_with_mpu, 2, 2, 2, "none", timeout=180):
        msg = r["refused"]
        assert msg is not None and "\n" not in msg, r
        assert msg.startswith("apply_zero: ") and "are tensor-parallel shards" in msg and "mpu=" in msg, r
