"""The construction steps of ``ZeroEngine``, one function each: which parameters are trained and in what
order (pure), where the partitions live, the master partition's initial values, and the optimizer's
per-chunk ranges (pure). ``ZeroEngine.__init__`` calls them in order.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from zerobench.config import ConfigError
from zerobench.distributed import collectives as C
from zerobench.zero.allocator import Allocator
from zerobench.zero.buffer import FullBuffer, LocalBuffer
from zerobench.zero.config import ZeroConfig
from zerobench.zero.layout import ParamSpec, PartitionLayout, Segment
from zerobench.zero.nvme import NvmeStore
from zerobench.zero.offload import HostPartition
from zerobench.zero.optimizer import ShardedAdamW
from zerobench.zero.param import ZeroParam
from zerobench.zero.placement import Placement, Tier
from zerobench.zero.units import assign_units


@dataclass
class Ordered:
    """The trained parameters in layout order, and the stage-3 units that own them."""

    named: list[tuple[str, nn.Parameter]]
    units: list[nn.Module]
    unit_of: dict[int, int]
    specs: list[ParamSpec]


def order_params(model: nn.Module, units: list[nn.Module], stage: int) -> Ordered:
    """Stage 3 groups parameters by unit (last unit first, the root unit last); otherwise reverse
    registration order (the order backward produces gradients), so buckets fill in sequence."""
    assigned = assign_units(model, units)
    named, units, unit_of = list(assigned.named), assigned.units, assigned.unit_of
    if not named:
        raise ConfigError("the model has no parameter that requires a gradient: nothing to train")
    if stage == 3:
        key = {u: i for i, u in enumerate([*range(len(units), 0, -1), 0])}
        named.sort(key=lambda np_: key[unit_of.get(id(np_[1]), 0)])
    else:
        named.reverse()
    specs = [ParamSpec(n, tuple(p.shape), unit_of.get(id(p), 0) if stage == 3 else 0) for n, p in named]
    return Ordered(named, units, unit_of, specs)


@dataclass
class Storage:
    """Where this rank's parameters and master partition live."""

    host: HostPartition | None
    """Offloaded partitions (master, moments' home, gradients; parameters with ``offload_param``)."""
    params_full: FullBuffer | None
    """Stages 0-2: every parameter, replicated."""
    params_local: LocalBuffer | None
    """Stage 3: this rank's parameter partition (on the host with parameter offload)."""
    master_buf: LocalBuffer | None
    """The fp32 master on the device (None: it is the host's, or the parameters themselves in fp32)."""


def build_storage(layout: PartitionLayout, config: ZeroConfig, placement: Placement, device: torch.device,
                  allocator: Allocator) -> Storage:
    dtype = config.precision.param_dtype
    host = None
    if placement.offloaded:
        with allocator.host_region():  # host memory, not the device's
            host = HostPartition(layout, device, dtype, dtype, placement.params is Tier.HOST, allocator)
    if config.stage == 3:
        full, local = None, LocalBuffer(layout, dtype, device, data=host.params_local if host is not None else None)
    else:
        full, local = FullBuffer(layout, dtype, device), None
    master = None
    if host is None and config.precision.has_master:
        master = LocalBuffer(layout, torch.float32, device)
    return Storage(host, full, local, master)


def _copy_segments(dst: torch.Tensor, segments: list[Segment], init: list[torch.Tensor]) -> None:
    for seg in segments:
        dst[seg.local_start : seg.local_start + seg.numel].copy_(init[seg.param][seg.param_start : seg.param_end])


@torch.no_grad()
def fill_initial_values(st: Storage, zparams: list[ZeroParam], segments: list[Segment]) -> None:
    """Copy the model's initial values into the parameter storage and the master partition."""
    init = [zp.param.detach().float().reshape(-1) for zp in zparams]
    if st.params_full is not None:
        for zp, src in zip(zparams, init):
            st.params_full.param_view(zp.slot.index).copy_(src.view(zp.slot.shape))
    else:
        _copy_segments(st.params_local.data, segments, init)
    if st.host is not None and st.host.master is not st.host.params_local:  # (it may be the host params: fp32)
        _copy_segments(st.host.master, segments, init)
    if st.master_buf is not None:
        _copy_segments(st.master_buf.data, segments, init)


def chunk_ranges(layout: PartitionLayout, segments: list[Segment], zparams: list[ZeroParam], tp_sharded: frozenset[str]):
    """Per bucket chunk: the ranges under weight decay, and those of TP-replicated parameters (counted
    once, not per TP rank, in the gradient norm)."""
    decay: list[list[tuple[int, int]]] = [[] for _ in layout.buckets]
    replicated: list[list[tuple[int, int]]] = [[] for _ in layout.buckets]
    for seg in segments:
        base = layout.local_offset(seg.bucket)
        rng = (seg.local_start - base, seg.local_start - base + seg.numel)
        if zparams[seg.param].weight_decay:
            decay[seg.bucket].append(rng)
        if zparams[seg.param].name not in tp_sharded:
            replicated[seg.bucket].append(rng)
    return decay, replicated


def build_optimizer(config: ZeroConfig, placement: Placement, master: list[torch.Tensor], decay, group: C.Group,
                    allocator: Allocator) -> ShardedAdamW:
    nvme = None
    if placement.states is Tier.NVME:
        def nvme(codec, sizes):
            return NvmeStore(codec, sizes, config.nvme_path, group.rank)
    with allocator.host_region(placement.offloaded):
        return ShardedAdamW(config.optimizer, master, decay, config.kernels, config.optim_bits, nvme)
