"""Changes made inside ``engine.gathered_params()``, inside spawned ranks, at every stage and precision.

The reference for a change is the engine built from the changed model: writing another model's weights into
the parameters inside the context must give exactly that engine (its fp32 master and its parameters) and
the same training after it, as FSDP's ``summon_full_params(writeback=True)`` and DeepSpeed's
``GatheredParameters(modifier_rank=r)`` promise. The other model's weights are bf16 values, so a bf16
parameter can hold them exactly.
"""

from __future__ import annotations

import copy

import torch

from tests.helpers.module_load import CASES, _max_diff, _params, _train
from tests.helpers.user_models import engine_for, make_model
from zerobench.distributed.collectives import Group
from zerobench.zero import GatheredParameters, Precision
from zerobench.zero.state.shards import full_parameters


def target_model(variant: str = "mlp"):
    """The same architecture with other weights, each exactly representable in bf16 (frozen ones too) and at least
    0.05 from the start's (so its bf16 value differs too: an element written with the value it already rounds to
    is unchanged, and keeps its fp32 master)."""
    model = make_model(variant)
    g = torch.Generator().manual_seed(7)
    with torch.no_grad():
        for p in model.parameters():
            r = torch.randn(p.shape, generator=g)
            p.copy_((p + torch.where(r < 0, -0.05, 0.05) + r * 0.5).bfloat16().float())
    return model


def _copy_in(engine, values: dict[str, torch.Tensor]) -> None:
    with torch.no_grad():
        for n, p in engine.module.named_parameters():
            p.copy_(values[n])


def _same_as(engine, built, rank: int, world: int) -> dict:
    """Master and parameter differences to ``built``, before and after two training steps of both."""
    res = {
        "master": _max_diff(full_parameters(engine), full_parameters(built)),
        "params": _max_diff(_params(engine), _params(built)),
    }
    _train(engine, rank, world)
    _train(built, rank, world)
    res["trained_master"] = _max_diff(full_parameters(engine), full_parameters(built))
    res["trained_params"] = _max_diff(_params(engine), _params(built))
    return res


def _frozen(engine) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in engine.module.named_parameters() if not p.requires_grad}


def run_gathered_writeback(rank: int, world: int) -> dict:
    group = Group.of(None, "dp")
    start, target = make_model("mlp"), target_model()
    values = {n: p.detach().clone() for n, p in target.named_parameters()}
    out: dict = {}
    for key, stage, kw in CASES:
        res: dict = {}
        engine = engine_for(copy.deepcopy(start), group, stage, **kw)
        with engine.gathered_params():  # writeback is the default, as FSDP's
            _copy_in(engine, values)
        res["kept"] = _same_as(engine, engine_for(copy.deepcopy(target), group, stage, **kw), rank, world)

        # One parameter changed: every other one keeps its full-precision master (not its bf16 rounding).
        engine, fresh = (engine_for(copy.deepcopy(start), group, stage, **kw) for _ in range(2))
        with engine.gathered_params(), torch.no_grad():
            engine.module.blocks[0].fc1.weight.zero_()
        got, was = full_parameters(engine), full_parameters(fresh)
        res["one_changed"] = (
            got["blocks.0.fc1.weight"].abs().max().item(),
            _max_diff({n: got[n] for n in got if n != "blocks.0.fc1.weight"}, was),
        )

        engine = engine_for(copy.deepcopy(start), group, stage, **kw)
        with engine.gathered_params(writeback=False):
            _copy_in(engine, values)
        res["discarded"] = _same_as(engine, engine_for(copy.deepcopy(start), group, stage, **kw), rank, world)

        for writeback in (True, False):
            engine = engine_for(copy.deepcopy(start), group, stage, **kw)
            try:
                with engine.gathered_params(writeback=writeback):
                    _copy_in(engine, values)
                    raise KeyError("user code failed inside the context")
            except KeyError as e:
                res[f"raised-{writeback}"] = str(e)
            built = engine_for(copy.deepcopy(target if writeback else start), group, stage, **kw)
            res[f"after_exception-{writeback}"] = _same_as(engine, built, rank, world)
        res["nested"] = _nested(group, stage, kw, start, values, rank, world)
        out[key] = res
    out.update(_modifier_cases(rank, world, group))
    return out


def _modifier_cases(rank: int, world: int, group: Group) -> dict:
    """DeepSpeed's ``modifier_rank``: the last rank's values win, frozen parameters included; a bad rank is one line."""
    start, target = make_model("frozen"), target_model("frozen")
    values = {n: p.detach().clone() for n, p in target.named_parameters()}
    src = world - 1
    out: dict = {}
    for stage in (0, 1, 2, 3):
        for prec in (Precision.FP32, Precision.BF16):
            kw = {"precision": prec}
            engine = engine_for(copy.deepcopy(start), group, stage, **kw)
            with engine.gathered_params(modifier_rank=src):
                if rank == src:
                    _copy_in(engine, values)
                else:  # another rank's changes are dropped
                    with torch.no_grad():
                        for p in engine.module.parameters():
                            p.zero_()
            frozen = _max_diff(_frozen(engine), {n: values[n] for n in _frozen(engine)})
            res = _same_as(engine, engine_for(copy.deepcopy(target), group, stage, **kw), rank, world)
            out[f"modifier-s{stage}-{prec.value}"] = {**res, "frozen": frozen}
        out[f"modifier-s{stage}-load"] = _modifier_load(start, group, stage, rank, world, src)
        out[f"modifier-s{stage}-frozen-only"] = _frozen_only(start, values, group, stage, rank, src)
        try:
            engine_for(copy.deepcopy(start), group, stage).gathered_params(modifier_rank=world)
            out[f"modifier-s{stage}-bad"] = None
        except Exception as e:  # noqa: BLE001 - the message is the result
            out[f"modifier-s{stage}-bad"] = f"{type(e).__name__}: {e}"
        try:
            engine_for(copy.deepcopy(start), group, stage).gathered_params(writeback=False, modifier_rank=0)
            out[f"modifier-s{stage}-discard"] = None
        except Exception as e:  # noqa: BLE001 - the message is the result
            out[f"modifier-s{stage}-discard"] = f"{type(e).__name__}: {e}"
    return out


def _modifier_load(start, group, stage: int, rank: int, world: int, src: int) -> dict:
    """HF's ZeRO-3 loading under bf16: inside ``GatheredParameters(modifier_rank=src)`` rank ``src`` alone loads a
    state dict (a fine-tune of ``start``: deltas of 1e-5, below bf16's resolution at most elements). Every rank's
    master must then hold the state dict exactly, as the engine built from the loaded model does; the bf16 broadcast
    alone gave the other ranks' shards the rounded values, or none where the rounding did not change."""
    g = torch.Generator().manual_seed(3)
    sd = {k: v + 1e-5 * torch.randn(v.shape, generator=g) for k, v in start.state_dict().items()}
    loaded = copy.deepcopy(start)
    loaded.load_state_dict(sd)
    engine = engine_for(copy.deepcopy(start), group, stage, precision=Precision.BF16)
    with GatheredParameters(list(engine.module.parameters()), modifier_rank=src):
        if rank == src:
            engine.module.load_state_dict(sd)
    return _same_as(engine, engine_for(loaded, group, stage, precision=Precision.BF16), rank, world)


def _frozen_only(start, values: dict, group, stage: int, rank: int, src: int) -> dict:
    """DeepSpeed's ``GatheredParameters`` given only frozen parameters (pretrained weights loaded into a frozen part
    on one rank): under ``modifier_rank`` every rank ends with that rank's values; without it the change is
    discarded. Each: the largest difference from what every rank should hold."""
    engine = engine_for(copy.deepcopy(start), group, stage)
    frozen = {n: p for n, p in engine.module.named_parameters() if not p.requires_grad}
    with GatheredParameters(list(frozen.values()), modifier_rank=src), torch.no_grad():
        if rank == src:
            for n, p in frozen.items():
                p.copy_(values[n])
    kept = _max_diff(_frozen(engine), {n: values[n] for n in frozen})
    with GatheredParameters(list(frozen.values())), torch.no_grad():
        for p in frozen.values():
            p.add_(1.0)
    return {"kept": kept, "discarded": _max_diff(_frozen(engine), {n: values[n] for n in frozen}), "n": len(frozen)}


def _nested(group, stage: int, kw: dict, start, values: dict, rank: int, world: int) -> dict:
    """An inner context (a helper that reads, or discards its own trial change) inside the user's own: the outer one
    stays gathered, the inner discard undoes only the inner change, and the outer writes what it wrote after it."""
    engine = engine_for(copy.deepcopy(start), group, stage, **kw)
    with engine.gathered_params():
        with engine.gathered_params(writeback=False), torch.no_grad():
            engine.module.head.weight.zero_()  # discarded on the inner exit
        full_after_inner = all(p.numel() > 0 for p in engine.module.parameters())
        head_back = engine.module.head.weight.abs().sum().item() > 0
        with engine.gathered_params():  # a helper that only reads
            pass
        _copy_in(engine, values)  # after both inner exits: still gathered, and kept on the outer exit
    res = _same_as(engine, engine_for(copy.deepcopy(target_model()), group, stage, **kw), rank, world)
    return {**res, "full_after_inner": full_after_inner, "head_back": head_back}
