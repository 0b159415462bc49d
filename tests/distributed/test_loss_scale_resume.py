"""The fp16 loss scaler's counters travel in the engine's checkpoint (``tests/helpers/loss_scale_resume.py``): on
DeepSpeed's rule the steps since the last overflow decide the next growth, so a run resumed from a checkpoint must
grow and back off its scale at the steps an uninterrupted one does."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.loss_scale_resume import resumed_scales

pytestmark = pytest.mark.dist

T, F = True, False


@pytest.mark.parametrize("stage", [1, 3])
def test_a_resumed_run_moves_its_loss_scale_as_an_uninterrupted_one(tmp_path, stage):
    """Saved after 3 clean steps (the scale grew after the 3rd: 0 clean steps since the growth, 3 since the start),
    then clean steps and an overflow that uses up a restored hysteresis."""
    overflow = [F, F, F, F, F, F, T, F, F, F, T, F]
    for r in run_distributed(resumed_scales, 2, stage, str(tmp_path / "ckpt"), overflow, 3, timeout=240):
        assert r["resumed"] == r["whole"] and r["resumed_state"] == r["whole_state"], r
        assert len(set(r["whole"])) > 2, r
