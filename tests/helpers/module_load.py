"""``model.load_state_dict`` after ``apply_zero``, inside spawned ranks: loading another model's weights must
give exactly the engine that model would have built (the fp32 master and the parameters), and train on
identically, at every stage and precision; a submodule's own ``load_state_dict`` too. Wrong shapes, missing
and unexpected keys come back as plain PyTorch reports them for the same model without ZeRO.
"""

from __future__ import annotations

import copy

import torch

from tests.helpers.user_models import batches, engine_for, make_model, slice_of
from zerobench.distributed.collectives import Group
from zerobench.zero import Precision
from zerobench.zero.state.shards import full_parameters

CASES = [(f"s{s}-{p.value}", s, {"precision": p}) for s in (0, 1, 2, 3) for p in (Precision.FP32, Precision.BF16)] + [
    ("s2-bf16-offload", 2, {"precision": Precision.BF16, "offload_optimizer": "cpu"}),
    ("s3-bf16-offload-params", 3, {"precision": Precision.BF16, "offload_optimizer": "cpu", "offload_param": "cpu"}),
]


def other_model():
    """The same architecture with other weights (what a user loads: a pretrained or saved model)."""
    model = make_model("mlp")
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g) * 0.5)
    return model


def _params(engine) -> dict[str, torch.Tensor]:
    with engine.gathered_params():
        return {n: p.detach().clone() for n, p in engine.module.named_parameters()}


def _max_diff(a: dict, b: dict) -> float:
    return max((a[n].float() - b[n].float()).abs().max().item() for n in a)


def _train(engine, rank, world) -> None:
    for x, y in batches(2, 2 * world):
        engine.backward(engine.module(slice_of(x, rank, world), slice_of(y, rank, world)))
        engine.step()
        engine.zero_grad()


def _load(module, *args, **kw) -> tuple[tuple | None, str | None]:
    """``module.load_state_dict(...)``'s (missing, unexpected) keys, or the error it raised."""
    try:
        keys = module.load_state_dict(*args, **kw)
    except Exception as e:  # noqa: BLE001 - compared with what plain torch says
        return None, f"{type(e).__name__}: {e}"
    return (tuple(keys.missing_keys), tuple(keys.unexpected_keys)), None


def run_module_load(rank: int, world: int) -> dict:
    group = Group.of(None, "dp")
    start, target = make_model("mlp"), other_model()
    out: dict = {}
    for key, stage, kw in CASES:
        loaded = engine_for(copy.deepcopy(start), group, stage, **kw)
        keys = loaded.module.load_state_dict(target.state_dict())
        built = engine_for(copy.deepcopy(target), group, stage, **kw)
        res = {
            "keys": (keys.missing_keys, keys.unexpected_keys),
            "master": _max_diff(full_parameters(loaded), full_parameters(built)),
            "params": _max_diff(_params(loaded), _params(built)),
            "moved_from_start": _max_diff(full_parameters(loaded), dict(start.named_parameters())),
        }
        _train(loaded, rank, world)
        _train(built, rank, world)
        res["trained_master"] = _max_diff(full_parameters(loaded), full_parameters(built))
        res["trained_params"] = _max_diff(_params(loaded), _params(built))

        part = engine_for(copy.deepcopy(start), group, stage, **kw)
        part.module.blocks[0].load_state_dict(target.blocks[0].state_dict())
        full = full_parameters(part)
        res["submodule"] = (
            _max_diff({n: full[n] for n in full if n.startswith("blocks.0.")}, dict(target.named_parameters())),
            _max_diff({n: full[n] for n in full if not n.startswith("blocks.0.")}, dict(start.named_parameters())),
        )
        copied = copy.deepcopy(part.module)  # e.g. an EMA copy: loading into it must leave the engine alone
        before = full_parameters(part)
        _load(copied, target.state_dict())
        res["deepcopy_untouched"] = _max_diff(full_parameters(part), before)
        out[key] = res
    for stage in (0, 1, 2, 3):
        out[f"s{stage}-errors"] = _errors(group, stage, start)
    return out


def _errors(group, stage, start) -> dict:
    """The engine's answer and plain torch's (the same model, no ZeRO) to the same bad state dicts."""
    wrong = copy.deepcopy(start.state_dict())
    wrong["blocks.0.fc1.weight"] = torch.zeros(200, 24)
    partial = {k: v for k, v in start.state_dict().items() if k != "blocks.1.fc2.bias"}
    partial["head.extra"] = torch.zeros(1)
    engine = engine_for(copy.deepcopy(start), group, stage)
    plain = copy.deepcopy(start)
    res = {}
    for name, args, kw in (
        ("shape", (wrong,), {}),
        ("partial", (partial,), {"strict": False}),
        ("assign", (start.state_dict(),), {"assign": True}),
    ):
        res[name] = (_load(engine.module, *args, **kw), _load(plain, *args, **kw))
    res["after_errors"] = _max_diff(full_parameters(engine), dict(start.named_parameters()))
    return res
