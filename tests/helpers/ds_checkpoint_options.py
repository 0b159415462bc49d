"""Rank workers for DeepSpeed's checkpoint options on the engine: ``load_checkpoint(..., load_optimizer_states=False)``,
``load_module_only=True``, ``load_module_strict=False``, ``load_lr_scheduler_states``, and ``save_checkpoint(...,
save_latest=False, exclude_frozen_parameters=True)``, called as DeepSpeed's tests call them.

Engine A trains and saves. Engines B, C and D start from another initialisation, take one step of their own (their
own moments, step count and learning rate), then load A's checkpoint with an option: what the option loads must be
A's, what it leaves must be their own, bit for bit.
"""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from tests.helpers.ds import ds_apply_zero
from tests.helpers.ds_checkpoint import ADAM, BNNet, _bn_state, _bn_train
from tests.helpers.scenarios import dp_groups
from zerobench.zero import Precision, ZeroConfig
from zerobench.zero.state.shards import full_parameters


def _engine(group, stage: int, seed: int):
    torch.manual_seed(seed)
    return ds_apply_zero(BNNet(), group, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=200))


def _moments(engine) -> list[torch.Tensor]:
    ms, vs = engine.adamw.moments()
    return [t.detach().clone() for t in (*ms, *vs)]


def _diff(a: dict, b: dict) -> float:
    return max((a[k].float() - b[k].float()).abs().max().item() for k in a)


def _own_state(engine) -> dict:
    """What a module-only load must leave alone: moments, step count, counters, learning rate."""
    return {
        "moments": _moments(engine),
        "step": engine.adamw.step_count,
        "global": engine.global_steps,
        "skipped": engine.skipped_steps,
        "lr": engine.get_lr(),
    }


def _kept(engine, own: dict) -> dict:
    return {
        "moments_kept": all(torch.equal(x, y) for x, y in zip(_moments(engine), own["moments"])),
        "step": (engine.adamw.step_count, own["step"]),
        "global": (engine.global_steps, own["global"]),
        "skipped": (engine.skipped_steps, own["skipped"]),
        "lr": (engine.get_lr(), own["lr"]),
    }


def _after_one_step(group, stage: int, rank: int):
    engine = _engine(group, stage, seed=1)
    _bn_train(engine, rank, range(7, 8))
    engine.optimizer.param_groups[0]["lr"] = 2e-3
    return engine


def ds_load_options(rank: int, world: int, stage: int, save_dir: str) -> dict:
    group = dp_groups(rank, world, [world])[world]
    a = _engine(group, stage, seed=0)
    _bn_train(a, rank, range(3))
    a.optimizer.param_groups[0]["lr"] = 5e-3
    a.scaler.skipped_steps = 2  # as if two of its fp16 steps had overflowed: DeepSpeed's counter, saved with it
    a.save_checkpoint(save_dir, tag="full")
    a.save_checkpoint(save_dir, tag="nofrozen", save_latest=False, exclude_frozen_parameters=True)
    saved_master = full_parameters(a)
    with a.gathered_params():
        saved_state = _bn_state(a.module)  # this rank's own: BatchNorm statistics evolve per rank, and come back so
    with open(f"{save_dir}/latest") as f:
        out: dict = {"latest": f.read()}  # save_latest=False left it at "full"

    for key, kwargs in (
        ("no_optimizer", {"load_optimizer_states": False, "load_lr_scheduler_states": False}),
        ("module_only", {"load_module_only": True}),
    ):
        b = _after_one_step(group, stage, rank)
        own = _own_state(b)
        path, client = b.load_checkpoint(save_dir, **kwargs)
        with b.gathered_params():
            state = _bn_state(b.module)
        out[key] = {
            "master": _diff(full_parameters(b), saved_master),
            "module": _diff(state, saved_state),
            "path": path.rsplit("/", 1)[-1],
            "client": client,
            **_kept(b, own),
        }

    d = _after_one_step(group, stage, rank)
    with d.gathered_params():
        frozen_before = {k: v for k, v in _bn_state(d.module).items() if k.startswith("frozen.")}
    try:
        d.load_checkpoint(save_dir, tag="nofrozen")
        out["strict_error"] = None
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        out["strict_error"] = f"{type(e).__name__}: {e}"
    d.load_checkpoint(save_dir, tag="nofrozen", load_module_strict=False)
    with d.gathered_params():
        state = _bn_state(d.module)
    out["not_strict"] = {
        "master": _diff(full_parameters(d), saved_master),
        "frozen_kept": _diff({k: state[k] for k in frozen_before}, frozen_before),
        "buffers": _diff(
            {k: state[k] for k in state if k.startswith("bn.")},
            {k: saved_state[k] for k in state if k.startswith("bn.")},
        ),
        "step": d.adamw.step_count,
        "lr": d.get_lr(),
    }
    return out


class _WiderNet(BNNet):
    """BNNet and a layer of its own that a checkpoint of BNNet lacks (a warm start)."""

    def __init__(self):
        super().__init__()
        self.extra = nn.Linear(16, 16)

    def forward(self, x):
        return self.out(self.extra(self.frozen(torch.relu(self.bn(self.inp(x)))))).pow(2).mean()


class _NarrowerNet(nn.Module):
    """BNNet without its frozen layer: a checkpoint of BNNet holds keys this model lacks."""

    def __init__(self):
        super().__init__()
        self.inp, self.bn, self.out = nn.Linear(6, 16), nn.BatchNorm1d(16), nn.Linear(16, 1)

    def forward(self, x):
        return self.out(torch.relu(self.bn(self.inp(x)))).pow(2).mean()


def _model(kind: str) -> nn.Module:
    model = {"wider": _WiderNet, "narrower": _NarrowerNet}.get(kind, BNNet)()
    if kind == "unfrozen":  # the layer frozen when the checkpoint was saved trains here
        model.frozen.requires_grad_(True)
    if kind == "frozen_now":  # a layer trained when it was saved is frozen here
        model.out.requires_grad_(False)
    return model


def _by_name_engine(group, stage: int, kind: str, rank: int):
    torch.manual_seed(1)
    model = _model(kind)
    groups = None
    if kind == "groups":  # two param groups where the checkpoint has one
        first = [*model.inp.parameters(), *model.bn.parameters()]
        groups = [{"params": first}, {"params": list(model.out.parameters()), "lr": 3e-3}]
    engine = ds_apply_zero(model, group, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=200), param_groups=groups)
    _bn_train(engine, rank, range(7, 8))
    return engine


def _state(engine) -> dict[str, torch.Tensor]:
    with engine.gathered_params():
        return {k: v.detach().clone() for k, v in engine.module.state_dict().items()}


def _attempt(fn, *args, **kwargs) -> str | None:
    try:
        fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        return f"{type(e).__name__}: {e}"
    return None


def _diff_on(a: dict, b: dict, keys) -> float:
    return _diff({k: a[k] for k in keys}, {k: b[k] for k in keys}) if keys else 0.0


CASES = (
    ("unfrozen", {"load_module_only": True}),
    ("frozen_now", {"load_module_only": True}),
    ("groups", {"load_optimizer_states": False, "load_lr_scheduler_states": False}),
    ("wider", {"load_module_only": True, "load_module_strict": False}),
    ("narrower", {"load_module_only": True, "load_module_strict": False}),
)


def _load_case(b, kind: str, kwargs: dict, saved: dict, save_dir: str, rank: int) -> dict:
    before, own = _state(b), _own_state(b)
    res: dict = {"strict": None, "full_load": None, "unchanged_after_refusal": True}
    if kind in ("wider", "narrower"):
        res["strict"] = _attempt(b.load_checkpoint, save_dir, load_module_only=True)
        res["unchanged_after_refusal"] = _diff(_state(b), before) == 0.0
    if kind == "groups":
        res["full_load"] = _attempt(b.load_checkpoint, save_dir)
        res["unchanged_after_refusal"] = _diff(_state(b), before) == 0.0
    b.load_checkpoint(save_dir, **kwargs)
    after = _state(b)
    common = sorted(set(after) & set(saved))
    masters = full_parameters(b)
    res.update(
        loaded=_diff_on(after, saved, common),
        moved=_diff_on(after, before, common),
        own_kept=_diff_on(after, before, sorted(set(after) - set(saved))),
        master_vs_module=max((masters[n] - after[n]).abs().max().item() for n in masters),
        **_kept(b, own),
    )
    _bn_train(b, rank, range(8, 9))  # trains on from the loaded weights
    res["trains"] = _diff(_state(b), after) > 0.0
    return res


def ds_load_by_name(rank: int, world: int, stage: int, save_dir: str) -> dict:
    """The weights-only loads read the weights by name, as DeepSpeed loads the module's state dict for them: a
    trained set or param groups changed since the save, a warm start with a new layer (``load_module_strict=False``),
    a model lacking a saved layer. Per case: how far the loaded state is from the saved one, and what the engine
    kept of its own."""
    group = dp_groups(rank, world, [world])[world]
    a = _engine(group, stage, seed=0)
    _bn_train(a, rank, range(3))
    a.save_checkpoint(save_dir, tag="a")
    saved = _state(a)  # this rank's own buffers, as the load gives them back
    return {
        kind: _load_case(_by_name_engine(group, stage, kind, rank), kind, kwargs, saved, save_dir, rank)
        for kind, kwargs in CASES
    }


class _Tied(nn.Module):
    """An embedding-like layer and a head that may share one weight (GPT-2's ``lm_head.weight``)."""

    def __init__(self, tied: bool, head_first: bool = False, frozen: tuple[str, ...] = ()):
        super().__init__()
        layers = {"emb": nn.Linear(8, 8, bias=False), "head": nn.Linear(8, 8, bias=False)}
        for name in ("head", "emb") if head_first else ("emb", "head"):
            setattr(self, name, layers[name])
        self.mid = nn.Linear(8, 8)
        if tied:
            self.head.weight = self.emb.weight
        for name in frozen:
            getattr(self, name).requires_grad_(False)

    def forward(self, x):
        return self.head(torch.relu(self.mid(self.emb(x)))).pow(2).mean()


TIES = {"same": ({"tied": True}, {"tied": True, "head_first": True}), "untie": ({"tied": True}, {"tied": False})}
TIES["tie"] = ({"tied": False}, {"tied": True})
TIES["tie_frozen"] = ({"tied": False, "frozen": ("head",)}, {"tied": True, "frozen": ("emb", "head")})


def ds_load_tied(rank: int, world: int, stage: int, save_dir: str) -> dict:
    """Weights tied otherwise than when saved load as ``model.load_state_dict`` takes them from the saved state dict
    (of a tied parameter's keys, the last one saved wins); the same tie registered in another order loads as is.
    Per case: whether every key holds what torch's ``load_state_dict`` gives."""
    group = dp_groups(rank, world, [world])[world]
    out = {}
    for case, (saved_kw, here_kw) in TIES.items():
        torch.manual_seed(0)
        a = ds_apply_zero(_Tied(**saved_kw), group, ZeroConfig(stage=stage, optimizer=ADAM))
        a.save_checkpoint(f"{save_dir}/{case}", tag="a")
        saved = _state(a)
        torch.manual_seed(1)
        b = ds_apply_zero(_Tied(**here_kw), group, ZeroConfig(stage=stage, optimizer=ADAM))
        b.load_checkpoint(f"{save_dir}/{case}", load_module_only=True)
        after = _state(b)
        torch.manual_seed(1)
        ref = _Tied(**here_kw)
        ref.load_state_dict(saved)
        out[case] = {
            "vs_torch": _diff(after, ref.state_dict()),
            "head_is_saved_head": torch.equal(after["head.weight"], saved["head.weight"]),
        }
    return out


def ds_load_edited_and_scheduled(rank: int, world: int, stage: int, save_dir: str) -> dict:
    """A warm start in bf16 keeps the new layer's init made in place after the engine was built (the module's value,
    not the master's rounding of the old one); a schedule saved for one param group is refused, in one line, by a
    load that would drive two with it."""
    group = dp_groups(rank, world, [world])[world]
    torch.manual_seed(0)
    a = ds_apply_zero(BNNet(), group, ZeroConfig(stage=stage, optimizer=ADAM, precision=Precision.BF16))
    a.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(a.optimizer, lambda s: 0.5**s)
    _bn_train(a, rank, range(2))
    a.save_checkpoint(save_dir, tag="a")
    torch.manual_seed(1)
    b = ds_apply_zero(_WiderNet(), group, ZeroConfig(stage=stage, optimizer=ADAM, precision=Precision.BF16))
    # the user's own init of the new layer, in place (at stage 3 inside a gather: the module holds placeholders)
    with b.gathered_params(modifier_rank=0) if stage == 3 else contextlib.nullcontext(), torch.no_grad():
        b.module.extra.weight.fill_(0.25)
    b.load_checkpoint(save_dir, load_module_only=True, load_module_strict=False)
    with b.gathered_params():
        kept = (b.module.extra.weight.float() - 0.25).abs().max().item()
    c = _by_name_engine(group, stage, "groups", rank)
    c.lr_scheduler = torch.optim.lr_scheduler.LambdaLR(c.optimizer, lambda s: 0.5**s)
    before = _state(c)
    refused = _attempt(c.load_checkpoint, save_dir, load_optimizer_states=False)
    return {"kept": kept, "refused": refused, "unchanged": _diff(_state(c), before) == 0.0}
