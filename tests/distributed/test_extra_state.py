"""A module's extra state (``get_extra_state`` / ``set_extra_state``, as Transformer Engine's FP8 layers keep their
scaling history) through DeepSpeed's checkpoint surface, as ``module.state_dict()`` carries it: saved and restored
by ``save_checkpoint`` / ``load_checkpoint``, in ``save_16bit_model``'s file and in ``zero_to_fp32``'s state dict.

Before, all three walked the parameters and buffers only: the state was dropped without a word (a counter saved
at 3 came back as 0), and ``load_state_dict_from_zero_checkpoint`` then failed on the missing key."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed

pytestmark = pytest.mark.dist


class Counted(nn.Linear):
    """A layer whose extra state counts its forwards (a tensor and plain data, as weights_only loads them)."""

    def __init__(self):
        super().__init__(4, 4)
        self.calls = 0

    def forward(self, x):
        self.calls += 1
        return super().forward(x)

    def get_extra_state(self):
        return {"calls": self.calls, "history": torch.arange(3.0) * self.calls}

    def set_extra_state(self, state):
        self.calls = int(state["calls"])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.a = nn.Linear(4, 4)
        self.c = Counted()

    def forward(self, x):
        return self.c(self.a(x)).pow(2).mean()


class Opaque:
    """Not plain data: weights_only cannot load it."""


class OpaqueNet(Net):
    def __init__(self):
        super().__init__()
        self.c.get_extra_state = lambda: {"obj": Opaque()}


def _engine(model, stage):
    from tests.helpers.ds import ds_apply_zero
    from zerobench.zero import ZeroConfig

    return ds_apply_zero(model, None, ZeroConfig(stage=stage, bucket_numel=16))


def _worker(rank: int, world: int, stage: int, root: str) -> dict:
    from zerobench.zero.compat.deepspeed.zero_to_fp32 import (
        get_fp32_state_dict_from_zero_checkpoint,
        load_state_dict_from_zero_checkpoint,
    )

    torch.manual_seed(0)
    engine = _engine(Net(), stage)
    for _ in range(3):
        engine.backward(engine(torch.ones(2, 4)))
        engine.step()
    engine.save_checkpoint(root, tag="t")
    engine.save_16bit_model(root, "model16.bin")
    fresh = _engine(Net(), stage)
    fresh.load_checkpoint(root, tag="t")
    out = {"loaded_calls": fresh.module.c.calls}
    out["file16"] = torch.load(f"{root}/model16.bin", weights_only=True).get("c._extra_state", {}).get("calls")
    out["fp32"] = get_fp32_state_dict_from_zero_checkpoint(root, "t").get("c._extra_state", {}).get("calls")
    plain = load_state_dict_from_zero_checkpoint(Net(), root, "t")  # strict: every key, the extra state's too
    out["plain_calls"] = plain.c.calls
    opaque = _engine(OpaqueNet(), stage)
    try:
        opaque.save_checkpoint(f"{root}/opaque", tag="t")
        out["opaque"] = "saved"
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        out["opaque"] = f"{type(e).__name__}: {e}"
    return out


@pytest.mark.parametrize("stage", [0, 3])
def test_a_modules_extra_state_is_saved_and_restored(stage, tmp_path):
    for r in run_distributed(_worker, 2, stage, str(tmp_path), timeout=180):
        assert r["loaded_calls"] == 3, r
        assert r["file16"] == 3 and r["fp32"] == 3 and r["plain_calls"] == 3, r
        assert "c._extra_state (the module's get_extra_state()) must hold only tensors and plain" in r["opaque"], r
        assert len(r["opaque"].splitlines()) == 1, r
        assert not (tmp_path / "opaque" / "t").exists()
