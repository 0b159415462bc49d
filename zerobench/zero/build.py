"""The construction steps of ``ZeroEngine``, one function each: which parameters are trained and in what
order (pure), the model's parameters pointed at the engine's storage, the optimizer's per-chunk ranges
(pure), and the optimizer over this rank's chunks. Where the parameters and the master live is
``zero/storage/params.py``. ``ZeroEngine.__init__`` calls them in order.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import torch
from torch import nn

from zerobench.config import ConfigError
from zerobench.distributed import collectives as C
from zerobench.metrics.comm import CommLedger
from zerobench.zero.config import ZeroConfig
from zerobench.zero.layout import ParamSpec, PartitionLayout, Segment
from zerobench.zero.offload.nvme import NvmeStore
from zerobench.zero.optim.adamw import ShardedAdamW
from zerobench.zero.param import ParamState, ZeroParam
from zerobench.zero.stage3.gatherer import Stage3Gatherer
from zerobench.zero.storage.allocator import Allocator
from zerobench.zero.storage.params import ParamStorage
from zerobench.zero.storage.placement import Placement, Tier
from zerobench.zero.units import UnitPlan, assign_units


@dataclass
class Ordered:
    """The trained parameters in layout order, and the stage-3 units that own them."""

    named: list[tuple[str, nn.Parameter]]
    units: list[nn.Module]
    unit_of: dict[int, int]
    specs: list[ParamSpec]
    frozen: list[tuple[str, nn.Parameter]]
    """The model's parameters not trained (``requires_grad=False`` when the engine was built)."""


def order_params(model: nn.Module, plan: UnitPlan, stage: int, dtype: torch.dtype = torch.float32) -> Ordered:
    """Reverse registration order (the order backward produces gradients), so buckets fill in sequence;
    stage 3 groups them by unit (last unit first, the root unit last), each unit's in that order. ``dtype``: the
    training dtype (``Precision.param_dtype``)."""
    plan = plan if isinstance(plan, UnitPlan) else UnitPlan(list(plan))  # ZeroEngine built directly: a list of units
    assigned = assign_units(model, plan.modules, plan.external)
    named, units, unit_of = list(assigned.named), assigned.units, assigned.unit_of
    if not named:
        raise ConfigError("the model has no parameter that requires a gradient: nothing to train")
    refuse_unsupported(model, named, dtype)
    named.reverse()
    if stage == 3:
        key = {u: i for i, u in enumerate([*range(len(units), 0, -1), 0])}
        named.sort(key=lambda np_: key[unit_of.get(id(np_[1]), 0)])
    specs = [ParamSpec(n, tuple(p.shape), unit_of.get(id(p), 0) if stage == 3 else 0) for n, p in named]
    trained = {id(p) for _, p in named}
    frozen = [(n, p) for n, p in model.named_parameters() if id(p) not in trained]
    return Ordered(named, units, unit_of, specs, frozen)


TRAINABLE_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def materialize(p: nn.Parameter, value: torch.Tensor) -> None:
    """Give a parameter on the meta device the tensor ``value`` (another device), keeping the parameter object
    (ties, the model's references) and the gradient hooks registered on it (sequence parallelism's): torch
    refuses ``p.data = value`` across the meta device, so the two are swapped and the hooks registered again."""
    hooks = p._backward_hooks
    torch.utils.swap_tensors(p, nn.Parameter(value, requires_grad=p.requires_grad))
    if hooks:
        p._backward_hooks = hooks


@torch.no_grad()
def settle_frozen(
    model: nn.Module, frozen: list[tuple[str, nn.Parameter]], dtype: torch.dtype, device: torch.device
) -> list[tuple[str, nn.Parameter]]:
    """What the engine does not hold, made ready to run: under bf16/fp16, frozen fp32/bf16/fp16 parameters and
    floating-point buffers in the training dtype, as the trained parameters are (DeepSpeed's ``module.bfloat16()``
    converts the whole module likewise), so that a frozen layer or a BatchNorm's running statistics meet the
    activations in the dtype they compute in; fp32 training leaves them, and other dtypes, as they are. A model
    built on the meta device gets its frozen parameters and buffers on ``device``, zeroed (to be initialised as the
    trained parameters are: ``engine.gathered_params()``, ``load_state_dict``)."""
    real = device.type != "meta"

    def converts(t: torch.Tensor) -> bool:
        return dtype != torch.float32 and t.dtype in TRAINABLE_DTYPES and t.dtype != dtype

    def settled(b: torch.Tensor) -> torch.Tensor:
        b = torch.zeros_like(b, device=device) if b.is_meta and real else b
        return b.to(dtype) if converts(b) else b

    for _, p in frozen:
        if p.is_meta and real:
            materialize(p, torch.zeros_like(p, device=device))
        if converts(p):
            p.data = p.data.to(dtype)
    for mod in model.modules():
        for name, b in list(mod._buffers.items()):
            if b is not None:
                mod._buffers[name] = settled(b)
    return frozen


def refuse_unsupported(model: nn.Module, named: list[tuple[str, nn.Parameter]], dtype: torch.dtype) -> None:
    """One-line ``ConfigError`` for trained parameters the flat buffers cannot hold: sparse gradients
    (``nn.Embedding(sparse=True)``), dtypes other than fp32/bf16/fp16 (float64 would be cast down silently),
    parameters on several devices, and, in fp32 training, a model that mixes dtypes: its bf16/fp16 layers would
    silently become fp32 and meet the activations its forward casts for them (bf16/fp16 training casts every
    parameter); or one whose trained parameters are all bf16/fp16 (``from_pretrained(torch_dtype=torch.bfloat16)``
    with a config that names no precision): they would silently train as fp32 copies, at twice the memory, beside
    frozen parameters and buffers left in bf16/fp16. (The meta device is fine: dry runs and the simulator build the engine there.)"""
    trained = {id(p): n for n, p in named}
    for mname, mod in model.named_modules():
        if getattr(mod, "sparse", False) is True and id(getattr(mod, "weight", None)) in trained:
            raise ConfigError(
                f"module {mname or type(mod).__name__!r} ({type(mod).__name__}) has sparse=True: ZeRO "
                "keeps gradients in dense flat buffers; build it with sparse=False"
            )
    devices, dtypes = {}, {}
    for n, p in named:
        if p.dtype not in TRAINABLE_DTYPES:
            raise ConfigError(
                f"parameter {n!r} is {str(p.dtype).removeprefix('torch.')}: the engine trains "
                "float32, bfloat16 or float16 parameters (ZeroConfig.precision picks the training "
                "dtype); convert the model first, e.g. model.float()"
            )
        devices.setdefault(p.device, n)
        dtypes.setdefault(p.dtype, n)
    if dtype == torch.float32 and dtypes and torch.float32 not in dtypes:
        (t0, n0), *_ = dtypes.items()
        half = str(t0).removeprefix("torch.")
        raise ConfigError(
            f"the trained parameters are {half} ({n0!r}) but the precision is fp32, which would train them as "
            f"float32 copies beside {half} frozen ones and buffers: train in {half} (ZeroConfig.precision; a "
            f"DeepSpeed config's {'bf16' if t0 == torch.bfloat16 else 'fp16'} section) or convert the model "
            "first (model.float())"
        )
    if dtype == torch.float32 and len(dtypes) > 1:
        (t0, n0), (t1, n1) = sorted(dtypes.items(), key=lambda tn: tn[0] != torch.float32)[:2]
        raise ConfigError(
            f"the trained parameters mix dtypes ({n0!r} is {str(t0).removeprefix('torch.')}, {n1!r} {str(t1).removeprefix('torch.')}) in "
            f"fp32 training, which would make {n1!r} float32 under your forward: convert the model to one "
            "dtype (model.float()) or train in bf16/fp16 (ZeroConfig.precision), which casts every parameter"
        )
    if len(devices) > 1:
        (d0, n0), (d1, n1) = list(devices.items())[:2]
        raise ConfigError(
            f"the trained parameters are on several devices ({n0!r} on {d0}, {n1!r} on {d1}): "
            "move the model to one device before apply_zero"
        )


def attach_params(
    model: nn.Module,
    units: list[nn.Module],
    st: ParamStorage,
    layout: PartitionLayout,
    zparams: list[ZeroParam],
    group: C.Group,
    ledger: CommLedger,
    config: ZeroConfig,
    allocator: Allocator,
    device: torch.device,
) -> Stage3Gatherer | None:
    """Stages 0-2: every parameter becomes a view of the full buffer (None). Stage 3: the gatherer that
    gathers and frees each unit's parameters."""
    for zp in zparams:  # a model built on the meta device, for storage on a real one
        if zp.param.is_meta and device.type != "meta":
            materialize(zp.param, torch.empty(0, dtype=zp.param.dtype, device=device))
    if st.replica is not None:
        for zp in zparams:
            zp.param.data = st.replica.param_view(zp.slot.index)
            zp.state = ParamState.REPLICATED
        st.viewers = list(zparams)
        return None
    transfer = st.host.transfer if st.shards_on_host else None
    return Stage3Gatherer.build(
        model, units, layout, zparams, st.shards, group, ledger, device, transfer, config.prefetch, allocator
    )


def tp_marked(model: nn.Module) -> list[str]:
    """Names of the parameters marked as tensor-parallel shards (``tensor_model_parallel``, as Megatron's layers and
    ``zerobench.parallel``'s ``apply_tp`` mark them, and as DeepSpeed reads them)."""
    return [n for n, p in model.named_parameters() if getattr(p, "tensor_model_parallel", False)]


def check_tp_marks(model: nn.Module, tp_group, names) -> Collection[str]:
    """``tp_sharded`` as given, or, where none are given beside a TP group, the marked shards (``tp_marked``). Marked
    shards with no TP group are one line: the gradient norm and the overflow check would span this rank's shard
    alone, each TP rank would clip by another norm, and the replicated parameters would drift apart."""
    marked = tp_marked(model)
    if marked and tp_group is None:
        raise ConfigError(
            f"apply_zero: {len(marked)} parameters ({marked[0]!r}, ...) are tensor-parallel shards (marked "
            "tensor_model_parallel) but no tp_group was given: the gradient norm and overflow check would count only "
            "this rank's shard; pass tp_group= (initialize: mpu=), or apply TP and ZeRO with "
            "zerobench.parallel.parallelize"
        )
    return names if names or tp_group is None or tp_group.size == 1 else marked


def tp_sharded_names(model: nn.Module, names) -> frozenset[str]:
    """``tp_sharded`` (``TPInfo.sharded``) as the names the engine gives those parameters: each one's first name in
    ``model.named_parameters()``, a tied weight's other names included. A name of no parameter of ``model`` is one line
    before anything is built: the engine would count that parameter as replicated across TP ranks, and the gradient
    norm, and every clip by it, would come out wrong without a word (names relative to another module than the one
    given to ``apply_zero``, a typo)."""
    first = {id(p): n for n, p in model.named_parameters()}
    every = dict(model.named_parameters(remove_duplicate=False))
    unknown = sorted(n for n in names if n not in every)
    if unknown:
        like = next(iter(first.values()), None)
        raise ConfigError(
            f"apply_zero(tp_sharded=...): {unknown[0]!r}"
            + (f" and {len(unknown) - 1} more" if len(unknown) > 1 else "")
            + f" name no parameter of the model given to apply_zero (its parameters are named like {like!r}): give "
            "the names relative to that model, as apply_tp's TPInfo.sharded does when apply_tp is given the same module"
        )
    return frozenset(first[id(every[n])] for n in names)


def chunk_ranges(
    layout: PartitionLayout, segments: list[Segment], zparams: list[ZeroParam], tp_sharded: frozenset[str]
):
    """Per bucket chunk: the ranges under weight decay, those of TP-replicated parameters (counted once, not
    per TP rank, in the gradient norm), and each param group's ranges (``{group: ranges}``)."""
    decay: list[list[tuple[int, int]]] = [[] for _ in layout.buckets]
    replicated: list[list[tuple[int, int]]] = [[] for _ in layout.buckets]
    spans: list[dict[int, list[tuple[int, int]]]] = [{} for _ in layout.buckets]
    for seg in segments:
        base = layout.local_offset(seg.bucket)
        rng = (seg.local_start - base, seg.local_start - base + seg.numel)
        zp = zparams[seg.param]
        if zp.decays:
            decay[seg.bucket].append(rng)
        if zp.name not in tp_sharded:
            replicated[seg.bucket].append(rng)
        spans[seg.bucket].setdefault(zp.group, []).append(rng)
    return decay, replicated, spans


def range_edges(ranges_by_chunk: list[list[tuple[int, int]]]) -> list[list[int]]:
    """Per chunk, the sorted offsets where its ranges (adjacent ones merged) start and end: where 8-bit blocks start
    afresh under TP, so that the TP-replicated ranges are quantized alike on every TP rank (``Int8Codec``)."""
    out = []
    for ranges in ranges_by_chunk:
        edges: list[int] = []
        for a, b in sorted(ranges):
            if edges and edges[-1] == a:
                edges[-1] = b  # adjacent: one range
            else:
                edges += [a, b]
        out.append(edges)
    return out


def build_optimizer(
    config: ZeroConfig,
    placement: Placement,
    master: list[torch.Tensor],
    decay,
    group: C.Group,
    allocator: Allocator,
    spans=None,
    quant_breaks=None,
) -> ShardedAdamW:
    """The step over this rank's chunks; ``spans``: each chunk's ranges per param group (None: one group);
    ``quant_breaks``: ``range_edges`` of the TP-replicated ranges under TP (None without)."""
    nvme = None
    if placement.states is Tier.NVME:

        def nvme(codec, sizes):
            return NvmeStore(codec, sizes, config.nvme_path, group.rank)

    with allocator.host_region(placement.offloaded):
        return ShardedAdamW(
            config.optimizer, master, decay, config.kernels, config.optim_bits, nvme, spans, quant_breaks
        )
