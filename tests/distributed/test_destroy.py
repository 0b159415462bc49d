"""``engine.destroy()`` (DeepSpeed's): the model handed back as a plain module, at stages 0-3. No hook of the
engine's is left on it, its class and ``zero_grad`` are torch's again, its parameters hold their trained values
(stage 3: whole, gathered), training through the destroyed engine is one line, and ``apply_zero`` wraps the model
again, training exactly as a fresh model given the same values."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed
from tests.helpers.ds import ds_apply_zero
from tests.helpers.tiers import STAGES

pytestmark = pytest.mark.dist


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(6, 16), nn.GELU(), nn.Sequential(nn.Linear(16, 16), nn.GELU()), nn.Linear(16, 3))


def _hooks(model: nn.Module) -> int:
    n = 0
    for m in model.modules():
        n += sum(
            len(getattr(m, k))
            for k in (
                "_forward_hooks",
                "_forward_pre_hooks",
                "_backward_hooks",
                "_state_dict_pre_hooks",
                "_load_state_dict_pre_hooks",
            )
        )
    return n + sum(len(p._post_accumulate_grad_hooks or {}) for p in model.parameters())


def _train(engine, model, rank: int, steps: int, seed: int) -> None:
    g = torch.Generator().manual_seed(seed + rank)
    for _ in range(steps):
        engine.backward(model(torch.randn(4, 6, generator=g)).pow(2).mean())
        engine.step()


def _destroy(rank: int, world: int, stage: int) -> dict:
    from zerobench.zero.config import ZeroConfig
    from zerobench.zero.interop.teardown import DestroyedEngineError

    def wrap(m):
        units = [m[0], m[2], m[3]] if stage == 3 else None
        return ds_apply_zero(m, None, ZeroConfig(stage=stage, bucket_numel=200), units=units)

    model = _model()
    cls, plain_hooks = type(model), _hooks(model)
    engine = wrap(model)
    _train(engine, model, rank, 2, seed=0)
    with engine.gathered_params():
        trained = {n: p.detach().clone() for n, p in model.named_parameters()}
    engine.destroy()
    engine.destroy()  # a second call does nothing
    out = {
        "cls": type(model) is cls,
        "hooks": (plain_hooks, _hooks(model)),
        "zero_grad_is_torchs": type(model).zero_grad is nn.Module.zero_grad,
        "grads": [p.grad is None for p in model.parameters()],
        "values": max((p.detach() - trained[n]).abs().max().item() for n, p in model.named_parameters()),
        "plain_forward": list(model(torch.ones(2, 6)).shape),
    }
    errors = []
    calls = (
        engine.step,
        lambda: engine.backward(model(torch.ones(2, 6)).sum()),
        engine.gathered_params,
        engine.zero_grad,
        engine.empty_partition_cache,
        lambda: engine.save_checkpoint("unused"),
    )
    for call in calls:
        try:
            call()
            errors.append(None)
        except DestroyedEngineError as e:
            errors.append(str(e))
    out["errors"] = errors
    out["values_after_refusals"] = max(
        (p.detach() - trained[n]).abs().max().item() for n, p in model.named_parameters()
    )
    # wrapped again: trains exactly as a fresh model given the trained values
    again = wrap(model)
    _train(again, model, rank, 2, seed=1)
    fresh = _model()
    fresh.load_state_dict(trained)
    ref = wrap(fresh)
    _train(ref, fresh, rank, 2, seed=1)
    with again.gathered_params(), ref.gathered_params():
        out["rewrapped"] = max((a - b).abs().max().item() for a, b in zip(model.parameters(), fresh.parameters()))
        out["moved"] = max((p.detach() - trained[n]).abs().max().item() for n, p in model.named_parameters())
    return out


@pytest.mark.parametrize("stage", STAGES)
def test_destroy_hands_the_model_back(stage):
    for r in run_distributed(_destroy, 2, stage):
        assert r["cls"] and r["zero_grad_is_torchs"] and r["hooks"] == (0, 0), r
        assert all(r["grads"]) and r["values"] == 0.0 and r["plain_forward"] == [2, 3]
        assert len(r["errors"]) == 6 and all(e is not None and "\n" not in e for e in r["errors"]), r["errors"]
        for e, call in zip(
            r["errors"],
            (
                "step()",
                "backward()",
                "gathered_params()",
                "zero_grad()",
                "empty_partition_cache()",
                "save_checkpoint()",
            ),
        ):
            assert e.startswith(f"{call} on an engine after destroy()"), e
        assert r["values_after_refusals"] == 0.0  # stage 3's units were not resharded under the plain model
        assert r["rewrapped"] == 0.0 and r["moved"] > 1e-4, r
