"""``model.load_state_dict`` after ``apply_zero`` at stages 0-3, fp32 and bf16: the loaded weights reach the
engine's master and shards (``zerobench/zero/module_state.py``), ZeRO-Offload included, and errors read
as plain PyTorch's."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.module_load import CASES, run_module_load
from tests.helpers.tiers import STAGES

pytestmark = pytest.mark.dist
KEYS = [key for key, _, _ in CASES]
ASSIGN_REFUSED = (
    "ValueError: load_state_dict(assign=True) would replace parameters the ZeRO engine holds views "
    "of: load with assign=False (the default)"
)


@pytest.fixture(scope="module")
def ranks():
    return run_distributed(run_module_load, 2, timeout=300)


@pytest.mark.parametrize("case", KEYS)
def test_loaded_weights_are_the_engines(ranks, case):
    """Loading another model's state dict gives exactly the engine built from that model: the same fp32
    master (not only the low-precision parameters, which the next step would overwrite from the old
    master) and parameters, and the same two training steps after it."""
    for r in ranks:
        res = r[case]
        assert res["keys"] == ([], [])
        assert res["moved_from_start"] > 0.1  # the load changed something
        for k in ("master", "params", "trained_master", "trained_params"):
            assert res[k] == 0.0, (case, k, res[k])


@pytest.mark.parametrize("case", KEYS)
def test_a_submodule_loads_its_own_state_dict(ranks, case):
    for r in ranks:
        loaded, untouched = r[case]["submodule"]
        assert loaded == 0.0 and untouched == 0.0


@pytest.mark.parametrize("case", KEYS)
def test_loading_into_a_deepcopy_leaves_the_engine_alone(ranks, case):
    """``copy.deepcopy(model)`` carries the load hooks along; they only act on the engine's own parameters."""
    for r in ranks:
        assert r[case]["deepcopy_untouched"] == 0.0


@pytest.mark.parametrize("stage", STAGES)
def test_bad_state_dicts_read_as_plain_torch(ranks, stage):
    """At stage 3 the parameters are placeholders, yet a wrong shape names the real one, and strict=False
    reports the same missing and unexpected keys as the model without ZeRO; assign=True is refused."""
    for r in ranks:
        res = r[f"s{stage}-errors"]
        got, plain = res["shape"]
        assert got[1] is not None and got == plain, (got, plain)
        assert "size mismatch for blocks.0.fc1.weight" in got[1] and "torch.Size([300, 24])" in got[1]
        got, plain = res["partial"]
        assert got == plain == ((("blocks.1.fc2.bias",), ("head.extra",)), None)
        assert res["assign"][0] == (None, ASSIGN_REFUSED)
        assert res["after_errors"] < 1e-6  # the refused and partial loads left the start's values
