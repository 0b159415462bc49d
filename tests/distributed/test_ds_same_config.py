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


@pytest.mark.parametrize("client", [False, True], ids=["config_sections", "client_optimizer_and_scheduler"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_a_deepspeed_config_trains_as_deepspeed_does(stage, client):
    if not deepspeed_available():
        pytest.skip("DeepSpeed is not installed (the test extra installs it)")
    for r in run_distributed(same_config, 2, stage, client, timeout=300):
        assert len(r["ours"]) == STEPS * ACCUM and len({lr[0] for lr in r["ours"]}) > 2
        ours, theirs = [lr for step in r["ours"] for lr in step], [lr for step in r["theirs"] for lr in step]
        assert ours == pytest.approx(theirs, rel=1e-12), (r["ours"], r["theirs"])
        assert r["moved"] > 1e-3 and r["param_diff"] < 1e-5, r
