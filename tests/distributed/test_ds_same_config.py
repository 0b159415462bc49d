"""One DeepSpeed config with an optimizer and a scheduler section, trained by DeepSpeed's engine and by
``zerobench.zero.initialize`` side by side in the same ranks (``tests/helpers/ds_same_config.py``), and the same
with a client optimizer and scheduler handed over instead: the learning rate after every step is DeepSpeed's, and
the parameters end where DeepSpeed's do, at stages 0-3."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.ds_same_config import ACCUM, STEPS, same_config
from zerobench.peers.registry import deepspeed_available

# Full grid only: DeepSpeed's first use in a fresh environment builds its ops (35 s on the 2-core CI VM).
pytestmark = [pytest.mark.dist, pytest.mark.slow]


CASES = [
    pytest.param(stage, client, bf16, id=f"s{stage}-{form}")
    for stage in (0, 1, 2, 3)
    for client, bf16, form in (
        (False, False, "config_sections"),
        (True, False, "client_optimizer_and_scheduler"),
        (False, True, "config_sections_bf16"),
    )
    if not (bf16 and stage == 0)
]
"""bf16 at stages 1-3. DeepSpeed 0.19.8's stage 0 under bf16 (its FP16_Optimizer in bf16 mode) ends about 9% of the
update (relative L2) away from its own stages 1-3 in this loop, while zerobench's stage 0 matches zerobench's stage 1
to 2e-7 and its stages 1-3 match DeepSpeed's: there is no common answer to test against at stage 0."""


@pytest.mark.parametrize("stage, client, bf16", CASES)
def test_a_deepspeed_config_trains_as_deepspeed_does(stage, client, bf16):
    """Both fp32 masters compared (DeepSpeed's through ``deepspeed.utils.safe_get_full_fp32_param``). Measured: the
    whole update within 3e-7 (relative L2), fp32 and bf16 alike."""
    if not deepspeed_available():
        pytest.skip("DeepSpeed is not installed (the test extra installs it)")
    for r in run_distributed(same_config, 2, stage, client, bf16, timeout=300):
        assert len(r["ours"]) == STEPS * ACCUM and len({lr[0] for lr in r["ours"]}) > 2
        ours, theirs = [lr for step in r["ours"] for lr in step], [lr for step in r["theirs"] for lr in step]
        assert ours == pytest.approx(theirs, rel=1e-12), (r["ours"], r["theirs"])
        assert r["moved"] > 1e-3 and r["param_diff"] < 1e-5 and r["update_rel_err"] < 1e-5, r
