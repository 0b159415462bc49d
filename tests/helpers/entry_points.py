"""Workers for ``tests/distributed/test_entry_points.py``: the engine built from torch's own spellings of a
process group, models it must refuse in one line, and stage 3 driven through submodules instead of the model.

Each case trains against single-process ``torch.optim.AdamW`` on the global batch (weight decay 0, so the
engine's "decay 2+-dim parameters only" default and torch's agree) and returns the largest parameter
difference after three steps, or the error's type and message.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses

import torch
import torch.distributed as dist
from torch import nn

from tests.helpers.ds import ds_apply_zero
from zerobench.zero import ZeroConfig
from zerobench.zero.config import AdamWConfig

STEPS = 3


def _config(stage: int) -> ZeroConfig:
    return ZeroConfig(stage=stage, optimizer=AdamWConfig(lr=1e-2, weight_decay=0.0))


def _two_nets() -> tuple[nn.Module, nn.Module]:
    torch.manual_seed(0)
    return (
        nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 4)),
        nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 1)),
    )


def _train(rank: int, world: int, engines, net: nn.Module, ref_net: nn.Module) -> float:
    """``STEPS`` of a PyTorch loop (``loss.backward()``, every engine's optimizer) on ``net``, whose modules the
    engines were applied to, against ``ref_net`` in one process."""
    cfg = _config(0).optimizer
    ref_params = list(ref_net.parameters())
    ref = torch.optim.AdamW(ref_params, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, weight_decay=0.0)
    g = torch.Generator().manual_seed(1)
    per = 2
    for _ in range(STEPS):
        x = torch.randn(per * world, 4, generator=g)
        net(x[rank * per : (rank + 1) * per]).pow(2).mean().backward()
        for e in engines:
            e.optimizer.step()
            e.optimizer.zero_grad()
        ref.zero_grad()
        ref_net(x).pow(2).mean().backward()
        ref.step()
    with _gathered(engines):
        return max((p - q).abs().max().item() for p, q in zip(net.parameters(), ref_params))


def _gathered(engines) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for e in engines:
        stack.enter_context(e.gathered_params())
    return stack


def group_spellings(rank: int, world: int, stage: int) -> dict:
    """The same two-model training with the DP group given as None, ``dist.group.WORLD`` and a 1-D DeviceMesh."""
    from torch.distributed.device_mesh import init_device_mesh

    out = {}
    mesh = init_device_mesh("cpu", (world,))
    for name, group in (("none", None), ("world", dist.group.WORLD), ("mesh", mesh)):
        a, b = _two_nets()
        ra, rb = copy.deepcopy(a), copy.deepcopy(b)
        ea, eb = ds_apply_zero(a, group, _config(stage)), ds_apply_zero(b, group, _config(stage))
        out[name] = _train(rank, world, [ea, eb], nn.Sequential(a, b), nn.Sequential(ra, rb))
        out[name + "_size"] = (ea.group.size, ea.group.rank)
    return out


def submodules_called(rank: int, world: int, stage: int) -> dict:
    """One engine over ``Sequential(a, b)``, trained by calling ``b(a(x))``: the model's own forward never runs.
    With the default units everything is the root's; with ``units=[a, b]`` both are units and the root has none."""
    out = {}
    for name in ("root", "units"):
        a, b = _two_nets()
        ra, rb = copy.deepcopy(a), copy.deepcopy(b)
        model = nn.Sequential(a, b)
        engine = ds_apply_zero(model, None, _config(stage), units=[a, b] if name == "units" else None)
        out[name] = _train(rank, world, [engine], _Calls(a, b), nn.Sequential(ra, rb))
        if name == "root":  # and the model's own forward afterwards, as usual
            before = {k: v.clone() for k, v in _state(engine, model).items()}
            model(torch.ones(2, 4)).sum().backward()
            engine.optimizer.step()
            out["root_then_model_moved"] = max(
                (_state(engine, model)[k] - v).abs().max().item() for k, v in before.items()
            )
    return out


class _Calls(nn.Module):
    """``b(a(x))`` by a plain call of each, not through the engine's model."""

    def __init__(self, a: nn.Module, b: nn.Module):
        super().__init__()
        self.a, self.b = a, b

    def forward(self, x):
        return self.b(self.a(x))


def _state(engine, model) -> dict:
    with engine.gathered_params():
        return {k: v.clone() for k, v in model.state_dict().items()}


def _error(fn) -> tuple[str, str] | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the message is what is tested
        return type(e).__name__, str(e)
    return None


def refusals(rank: int, world: int, stage: int) -> dict:
    """Models the flat buffers cannot hold, and a parameter frozen after the engine was built."""
    cfg = _config(stage)

    def sparse():
        ds_apply_zero(nn.Sequential(nn.Embedding(10, 4, sparse=True), nn.Linear(4, 1)), None, cfg)

    def float64():
        ds_apply_zero(nn.Linear(4, 1).double(), None, cfg)

    def mixed_dtypes():  # a bf16 layer in fp32 training: it would become fp32 under its forward
        ds_apply_zero(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1).bfloat16()), None, cfg)

    def half_model_fp32_precision():  # from_pretrained(torch_dtype=bf16), no precision: fp32 copies beside bf16 ones
        model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1)).bfloat16()
        model[0].requires_grad_(False)
        ds_apply_zero(model, None, cfg)

    def sparse_functional():
        class Lookup(nn.Module):
            def __init__(self):
                super().__init__()
                self.table = nn.Parameter(torch.randn(10, 4))

            def forward(self, idx):
                return nn.functional.embedding(idx, self.table, sparse=True).sum()

        m = Lookup()
        e = ds_apply_zero(m, None, cfg)
        for _ in range(2):  # the second window starts from .grad None at stages 0-1
            e.backward(m(torch.tensor([1, 2])))
            e.step()

    def frozen_after():
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        e = ds_apply_zero(m, None, cfg)
        m[0].weight.requires_grad_(False)
        e.backward(m(torch.ones(2, 4)).sum())
        e.step()

    def frozen_after_unused_allowed():
        """With unused parameters allowed the check used not to run, and the frozen weight went on being stepped
        (momentum, weight decay) where torch.optim skips it."""
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        e = ds_apply_zero(m, None, dataclasses.replace(cfg, find_unused_parameters=True))
        e.backward(m(torch.ones(2, 4)).sum())
        e.step()
        m[0].weight.requires_grad_(False)
        e.backward(m(torch.ones(2, 4)).sum())
        e.step()

    def added_after():
        """A module assigned after apply_zero: before, it trained without a word and its weights never moved."""
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        e = ds_apply_zero(m, None, dataclasses.replace(cfg, find_unused_parameters=True))
        m[1] = nn.Linear(4, 1)
        e.backward(m(torch.ones(2, 4)).sum())
        e.step()

    def tied_after():
        """Weights tied after apply_zero: the dropped weight got no gradient, so the step named it "unused in forward"
        and advised find_unused_parameters=True, under which the engine went on stepping a weight no longer used."""
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
        e = ds_apply_zero(m, None, dataclasses.replace(cfg, find_unused_parameters=True))
        m[1].weight = m[0].weight
        e.backward(m(torch.ones(2, 4)).sum())
        e.step()

    def added_head_over_a_no_grad_backbone():
        """Linear probing as torch users write it: the backward reaches only the new head, so it reduced nothing
        and step() returned False as a no-op; the head never moved."""
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        e = ds_apply_zero(m, None, cfg)
        m.append(nn.Linear(1, 1))
        with torch.no_grad():
            features = m[1](m[0](torch.ones(2, 4)))
        m[2](features).sum().backward()
        e.optimizer.step()

    def frozen_after_plain_backward():
        """A frozen parameter the backward check reached first raised AttributeError (no grad_fn) from inside
        autograd, instead of the one-line refusal."""
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        e = ds_apply_zero(m, None, cfg)
        m.requires_grad_(False)
        m[1].weight.requires_grad_(True)
        m(torch.ones(2, 4)).sum().backward()
        e.step()

    def reshaped_after():
        """.data given another shape (HF's resize_token_embeddings): at stages 0-2 a size mismatch deep in the
        buckets before (stage 3's gather refuses it)."""
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        e = ds_apply_zero(m, None, cfg)
        e.zero_grad()  # as a training loop's last call: .grad is None at every stage
        m[0].weight.data = torch.ones(6, 4)
        m[0].bias.data = torch.ones(6)
        m[1](m[0](torch.ones(2, 4))[:, :4]).sum().backward()
        e.step()

    def reset_while_partitioned():
        """register_parametrization's right_inverse at stage 3 outside gathered_params ran on the empty placeholder:
        the layer then computed f(W) from W never inverted (2W for X / 2), silently."""

        class Halved(nn.Module):
            def forward(self, x):
                return 2 * x

            def right_inverse(self, x):
                return x / 2

        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        e = ds_apply_zero(m, None, cfg)
        torch.nn.utils.parametrize.register_parametrization(m[0], "weight", Halved())  # stages 0-2 take it back
        e.backward(m(torch.ones(2, 4)).sum())
        e.step()

    def unfrozen_after():
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        m[0].requires_grad_(False)
        e = ds_apply_zero(m, None, cfg)
        m[0].requires_grad_(True)
        e.backward(m(torch.ones(2, 4)).sum())
        e.step()

    def applied_twice():
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        e = ds_apply_zero(m, None, cfg)
        try:
            ds_apply_zero(m, None, cfg)
        finally:
            del e

    def wrong_group():
        ds_apply_zero(nn.Linear(4, 1), "dp", cfg)

    def converted_after():
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        ds_apply_zero(m, None, cfg)
        m.half()

    def to_empty_after():
        m = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 1))
        ds_apply_zero(m, None, cfg)
        m.to_empty(device="cpu")

    def submodule_converted():
        m = _CastsItsInput()
        e = ds_apply_zero(m, None, cfg)
        m.fc.half()
        e.backward(m(torch.ones(2, 4)).sum())
        e.step()

    cases = {
        "sparse": sparse,
        "float64": float64,
        "mixed_dtypes": mixed_dtypes,
        "half_model_fp32_precision": half_model_fp32_precision,
        "sparse_functional": sparse_functional,
        "frozen_after": frozen_after,
        "frozen_after_unused_allowed": frozen_after_unused_allowed,
        "added_after": added_after,
        "unfrozen_after": unfrozen_after,
        "added_head_over_a_no_grad_backbone": added_head_over_a_no_grad_backbone,
        "tied_after": tied_after,
        "frozen_after_plain_backward": frozen_after_plain_backward,
        "reshaped_after": reshaped_after,
        "reset_while_partitioned": reset_while_partitioned,
        "wrong_group": wrong_group,
        "applied_twice": applied_twice,
        "converted_after": converted_after,
        "to_empty_after": to_empty_after,
        "submodule_converted": submodule_converted,
    }
    out = {}
    for name, fn in cases.items():
        out[name] = _error(fn)
        dist.barrier()
    return out


class _CastsItsInput(nn.Module):
    """A layer that follows its own weight's dtype, so a converted submodule computes without a dtype error."""

    def __init__(self):
        super().__init__()
        self.fc, self.head = nn.Linear(4, 4), nn.Linear(4, 1)

    def forward(self, x):
        return self.head(self.fc(x.to(self.fc.weight.dtype)).float())


def conversions(rank: int, world: int, stage: int) -> dict:
    """Conversions after ``apply_zero`` that change nothing (torch returns the same tensors) train as one process."""
    a, b = _two_nets()
    ra, rb = copy.deepcopy(a), copy.deepcopy(b)
    model = nn.Sequential(a, b)
    engine = ds_apply_zero(model, None, _config(stage))
    model.float()
    model.cpu()
    model.to("cpu")
    model.to(torch.float32)
    return {"diff": _train(rank, world, [engine], model, nn.Sequential(ra, rb))}


class _Features(nn.Module):
    """fp32 features in a dict beside integer ids, as a user's batch holds them."""

    def __init__(self):
        super().__init__()
        self.table, self.fc = nn.Embedding(10, 4), nn.Linear(8, 1)

    def forward(self, batch, *, scale):
        h = torch.cat([batch["x"], self.table(batch["ids"])], dim=-1) * scale
        return self.fc(h).float().pow(2).mean()


def bf16_fp32_inputs(rank: int, world: int, stage: int) -> dict:
    """A bf16 engine fed fp32 inputs (cast by the engine, as FSDP's mixed precision does) against the same engine
    fed bf16 inputs by hand: the same parameters, bit for bit, after ``STEPS`` steps."""
    from zerobench.zero import Precision

    cfg = ZeroConfig(stage=stage, precision=Precision.BF16, optimizer=AdamWConfig(lr=1e-2, weight_decay=0.0))
    torch.manual_seed(0)
    ours, by_hand = _Features(), _Features()
    by_hand.load_state_dict(ours.state_dict())
    e1, e2 = ds_apply_zero(ours, None, cfg), ds_apply_zero(by_hand, None, cfg)
    g = torch.Generator().manual_seed(rank)
    for _ in range(STEPS):
        x, ids = torch.randn(2, 4, generator=g), torch.randint(0, 10, (2,), generator=g)
        e1.backward(ours({"x": x, "ids": ids}, scale=torch.tensor(0.5)))
        e2.backward(by_hand({"x": x.bfloat16(), "ids": ids}, scale=torch.tensor(0.5, dtype=torch.bfloat16)))
        e1.step()
        e2.step()
    with _gathered([e1, e2]):
        return {
            "diff": max(
                (p.float() - q.float()).abs().max().item() for p, q in zip(ours.parameters(), by_hand.parameters())
            ),
            "dtype": str(next(ours.parameters()).dtype),
        }


class _Layer(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc, self.norm = nn.Linear(4, 4), nn.LayerNorm(4)

    def forward(self, x):
        return self.norm(torch.tanh(self.fc(x)))


class _Stack(nn.Module):
    """Layers in a ModuleList named ``layers``, not ``blocks`` (as most models name theirs)."""

    def __init__(self):
        super().__init__()
        self.layers = nn.ModuleList(_Layer() for _ in range(3))
        self.head = nn.Linear(4, 1)

    def forward(self, x):
        for layer in self.layers:
            x = layer(x)
        return self.head(x)


def units_by_class(rank: int, world: int, stage: int) -> dict:
    """``units=_Layer`` (a class) against one process; and the warning when stage 3 gets no units."""
    import warnings

    torch.manual_seed(0)
    model = _Stack()
    ref = copy.deepcopy(model)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        engine = ds_apply_zero(model, None, _config(stage), units=_Layer)
        ds_apply_zero(_Stack(), None, _config(stage))
    out = {
        "units": len(engine.gatherer.blocks) if engine.gatherer is not None else None,
        "warnings": [str(w.message) for w in caught if "ZeRO stage 3" in str(w.message)],
    }
    out["diff"] = _train(rank, world, [engine], model, ref)
    out["bad_class"] = _error(lambda: ds_apply_zero(_Stack(), None, _config(stage), units=nn.Conv2d))
    return out
