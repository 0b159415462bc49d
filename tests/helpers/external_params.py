"""Stage-3 parameters read outside the forward of the unit that holds them, declared with ``ds_apply_zero(...,
external_params=...)`` (DeepSpeed's ``register_external_parameter``): a parent's forward using a child unit's
weight, a unit called through a method other than ``forward`` (FSDP2's ``register_fsdp_forward_method`` case),
and a unit returning its own bias for its caller to add (Megatron's ``skip_bias_add``; DeepSpeed's
``DanglingBias`` test). Trained at stages 0-3 against single-process ``torch.optim.AdamW`` on the same global
batch; undeclared or wrongly declared, each is one line."""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from tests.helpers.ds import ds_apply_zero
from tests.helpers.user_models import ADAM, VOCAB, WIDTH, batches, compare, reference_params, slice_of
from zerobench.distributed.collectives import Group
from zerobench.zero import ZeroConfig, initialize


class Projector(nn.Linear):
    def project(self, h):  # called instead of forward: no module hook sees it
        return F.linear(h, self.weight, self.bias)


class BiasOut(nn.Linear):
    def forward(self, h):
        return F.linear(h, self.weight), self.bias


class Net(nn.Module):
    """Embedding -> ``a`` -> ``b`` -> head, every linear layer a stage-3 unit; ``variant`` says how ``a``'s
    parameters escape its forward."""

    def __init__(self, variant: str):
        super().__init__()
        torch.manual_seed(0)
        self.variant = variant
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.a = {"parent_reads": nn.Linear, "method": Projector, "returned": BiasOut}[variant](WIDTH, WIDTH)
        self.b = nn.Linear(WIDTH, WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, x, y, skip=None):
        h = self.emb(x)
        if self.variant == "method":
            h = torch.tanh(self.a.project(h))
        elif self.variant == "returned":
            out, bias = self.a(h)
            h = torch.tanh(out + bias)
        else:
            h = torch.tanh(self.a(h))
        h = self.b(h)
        if self.variant == "parent_reads":
            h = h + F.linear(torch.tanh(h), self.a.weight)  # a's weight after a's forward, and in backward
        return F.cross_entropy(self.head(h).reshape(-1, VOCAB), y.reshape(-1))


EXTERNAL = {"parent_reads": ["a.weight"], "method": ["a.weight", "a.bias"], "returned": ["a.bias"]}


def _engine(model: Net, group: Group, stage: int, external):
    cfg = ZeroConfig(stage=stage, bucket_numel=5000, optimizer=ADAM)
    return ds_apply_zero(model, group, cfg, units=[model.a, model.b, model.head], external_params=external)


def train_declared(rank: int, world: int, stage: int) -> dict:
    """Each variant with its external parameters declared (by name; ``parent_reads`` by the parameter itself):
    parity with the reference, and which unit owns each declared parameter (0: the root)."""
    group, out = Group.of(torch.distributed.new_group(backend="gloo"), "dp"), {}
    for variant, names in EXTERNAL.items():
        model = Net(variant)
        data = batches(3, 4)
        ref = reference_params(model, data, world)
        mine = copy.deepcopy(model)
        external = [mine.a.weight] if variant == "parent_reads" else names
        engine = _engine(mine, group, stage, external)
        for x, y in data:
            engine.backward(mine(slice_of(x, rank, world), slice_of(y, rank, world)))
            engine.step()
            engine.zero_grad()
        owner = {zp.name: engine.layout.buckets[zp.slot.bucket].unit for zp in engine.zparams}
        out[variant] = {
            **compare(engine, model, ref),
            "owner": {n: owner[n] for n in names},
            "units": sorted(set(owner.values())),
        }
    return out


def _line(fn) -> str | None:
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the message is what is tested
        return f"{type(e).__name__}: {e}"
    return None


def refusals(rank: int, world: int) -> dict:
    """Stage 3: a returned parameter left undeclared (at the first forward); ``external_params`` naming something
    that is not a trained parameter of the model (at ``apply_zero``)."""
    group = Group.of(torch.distributed.new_group(backend="gloo"), "dp")

    def undeclared():
        model = Net("returned")
        x, y = batches(1, 2 * world)[0]
        _engine(model, group, 3, None)(slice_of(x, rank, world), slice_of(y, rank, world))

    def frozen():
        model = Net("parent_reads")
        model.b.bias.requires_grad_(False)
        _engine(model, group, 3, ["b.bias"])

    def via_initialize():  # DeepSpeed's entry point takes them too
        model = Net("returned")
        config = {
            "train_micro_batch_size_per_gpu": 2,
            "zero_optimization": {"stage": 3},
            "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        }
        engine, *_ = initialize(
            model=model, config=config, units=[model.a, model.b, model.head], external_params=["a.bias"]
        )
        x, y = batches(1, 2 * world)[0]
        engine.backward(engine(slice_of(x, rank, world), slice_of(y, rank, world)))
        engine.step()

    def undeclared_read(variant):  # a read the engine cannot refuse: the op fails, a note names the parameter
        model = Net(variant)
        x, y = batches(1, 2 * world)[0]
        try:
            _engine(model, group, 3, None)(slice_of(x, rank, world), slice_of(y, rank, world))
        except RuntimeError as e:
            return getattr(e, "__notes__", [])
        return None

    out = {
        "undeclared": _line(undeclared),
        "read_parent": undeclared_read("parent_reads"),
        "read_method": undeclared_read("method"),
        "via_initialize": _line(via_initialize),
        "unknown_name": _line(lambda: _engine(Net("method"), group, 3, "a.wieght")),
        "foreign": _line(lambda: _engine(Net("method"), group, 3, [nn.Linear(2, 2).weight])),
        "frozen": _line(frozen),
    }
    torch.distributed.barrier()
    return out


def engine_from_a_list(rank: int, world: int) -> int:
    """``ZeroEngine`` built directly with a list of units, as before ``UnitPlan``: it trains, one unit per module."""
    from zerobench.zero import ZeroEngine

    model = Net("parent_reads")
    group = Group.of(torch.distributed.new_group(backend="gloo"), "dp")
    engine = ZeroEngine(model, group, ZeroConfig(stage=3, optimizer=ADAM), [model.b, model.head])
    x, y = batches(1, 2 * world)[0]
    engine.backward(model(slice_of(x, rank, world), slice_of(y, rank, world)))  # a stays in the root: read anywhere
    engine.step()
    return len(engine.gatherer.blocks)
