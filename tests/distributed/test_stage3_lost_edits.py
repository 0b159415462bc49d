"""A parameter changed in place between steps at stage 3, outside ``gathered_params()``: between gathers it is an
empty placeholder, so ``nn.init.zeros_``, a module's ``reset_parameters()`` or a ``mul_`` under ``no_grad`` changes
nothing the engine holds, and the next step would train on as if it never happened. torch.optim (and FSDP2, which
applies such an op to its local shard) would train from the change. Refused at the next gather (a forward, or
``gathered_params()``) and at the next ``step()``, in one line naming the parameter; ``destroy()`` after it still
gives the model its trained values back. A ``load_state_dict``, which also writes the placeholders (an empty copy),
is not taken for an edit (``tests/distributed/test_module_load.py`` trains after one)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.dist import run_distributed

pytestmark = pytest.mark.dist

EDITS = {
    "init-zeros": ("2.bias", lambda m: nn.init.zeros_(m[2].bias)),
    "reset-parameters": ("1.weight", lambda m: m[1].reset_parameters()),
    "no-grad-mul": ("0.weight", lambda m: torch.no_grad()(m[0].weight.mul_)(0)),
}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.LayerNorm(16), nn.Linear(16, 8))


def _after_edit(rank: int, world: int) -> dict:
    from zerobench.zero import ZeroConfig, apply_zero

    x, y = torch.randn(4, 8), torch.randn(4, 8)
    out = {}
    for key, (_, edit) in EDITS.items():
        for then in ("forward", "gathered", "step"):
            m = _model()
            e = apply_zero(m, None, ZeroConfig(stage=3), units=[m[0], m[2]])
            e.backward(F.mse_loss(m(x), y))
            e.step()
            with e.gathered_params():
                trained = {n: p.detach().clone() for n, p in m.named_parameters()}
            edit(m)
            try:
                if then == "forward":
                    m(x)
                elif then == "gathered":
                    with e.gathered_params():
                        pass
                else:
                    e.step()
                msg = None
            except RuntimeError as err:
                msg = str(err)
            e.destroy()  # no raise: the model gets its trained values back
            back = max((p.detach() - trained[n]).abs().max().item() for n, p in m.named_parameters())
            out[f"{key}-{then}"] = {"msg": msg, "restored": back}
    # the way that works: inside gathered_params(modifier_rank=0) the change is kept and trained from
    m = _model()
    e = apply_zero(m, None, ZeroConfig(stage=3), units=[m[0], m[2]])
    e.backward(F.mse_loss(m(x), y))
    e.step()
    with e.gathered_params(modifier_rank=0), torch.no_grad():
        if rank == 0:
            nn.init.zeros_(m[2].bias)
    with e.gathered_params():
        out["kept"] = m[2].bias.detach().abs().max().item()
    e.backward(F.mse_loss(m(x), y))
    out["kept_steps"] = e.step()
    e.destroy()
    # loads write the shards, and torch then copies an empty tensor into each placeholder: no edit. Also where a
    # loader calls _load_from_state_dict itself (transformers' own loader), which runs no post-hooks; but an edit to
    # a parameter the load leaves out is still one
    target = {k: v + 1 for k, v in _model().state_dict().items()}
    for case in ("direct", "partial-after-edit"):
        m = _model()
        e = apply_zero(m, None, ZeroConfig(stage=3), units=[m[0], m[2]])
        if case == "direct":
            errors: list = []
            for prefix, mod in m.named_modules():
                mod._load_from_state_dict(dict(target), prefix + "." if prefix else "", {}, True, [], [], errors)
        else:
            with torch.no_grad():
                m[2].bias.fill_(5.0)
            m.load_state_dict({"2.weight": target["2.weight"]}, strict=False)
        try:
            e.backward(F.mse_loss(m(x), y))
            out[case] = None
        except RuntimeError as err:
            out[case] = str(err)
        if out[case] is None:
            with e.gathered_params():
                out[f"{case}-bias"] = m[2].bias.detach().tolist()
        e.destroy()
    out["target-bias"] = target["2.bias"].tolist()
    return out


@pytest.fixture(scope="module")
def edited():
    return run_distributed(_after_edit, 2, timeout=300)


@pytest.mark.parametrize("then", ["forward", "gathered", "step"])
@pytest.mark.parametrize("edit", list(EDITS))
def test_an_edit_in_place_while_partitioned_is_refused_naming_the_parameter(edited, edit, then):
    name = EDITS[edit][0]
    for r in edited:
        res = r[f"{edit}-{then}"]
        assert res["msg"] is not None, f"{edit} then {then}: not refused"
        assert "\n" not in res["msg"] and name in res["msg"] and "gathered_params" in res["msg"], res["msg"]
        assert res["restored"] == 0.0  # destroy() gave the model the trained values, not a half-edited mix


def test_an_edit_inside_gathered_params_is_kept(edited):
    for r in edited:
        assert r["kept"] == 0.0 and r["kept_steps"] is True


def test_a_load_is_no_edit_and_an_edit_beside_a_partial_load_still_is(edited):
    for r in edited:
        assert r["direct"] is None and r["direct-bias"] == r["target-bias"]
        assert r["partial-after-edit"] is not None and "2.bias" in r["partial-after-edit"]
