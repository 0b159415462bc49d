"""ZeRO-Offload and ZeRO-Infinity's CPU tier: the host side of a rank's partition.

Under optimizer offload the fp32 master partition and Adam's moments live in host memory and the step
runs on the CPU kernel (``kernels``' C++ AdamW, the same contract as the device kernel). Per step:

1. backward: as each bucket's gradient shard is reduced, it is copied device -> host (``grad_ready``) on
   a side stream, overlapping the rest of backward (micro-batches after the first of a window add on
   the host);
2. ``step``: wait for those copies; the CPU kernel updates chunk by chunk, writing the low-precision
   parameter copy into a pinned host buffer in the same pass; each finished chunk is copied host ->
   device at once (``start_copy_back``), overlapping the update of the next chunk;
3. the engine all-gathers the parameters as usual.

Under parameter offload (stage 3) the rank's parameter partition itself lives on the host; each gather
first copies the unit's shard host -> device (prefetched with the gather), and the optimizer writes the
partition directly, so nothing is copied back.

On a CUDA device host buffers are pinned and copies are asynchronous on one side stream, ordered with
the compute stream by events. On a CPU-only machine host and device are the same memory, but the
buffers are still separate and every copy still happens, so the paths run and are tested there.
"""

from __future__ import annotations

import torch

from zerobench.metrics.memory import storage_bytes
from zerobench.zero.layout import PartitionLayout
from zerobench.zero.storage.allocator import Allocator, PlainAllocator

HOST = torch.device("cpu")


class Transfer:
    """Asynchronous copies between the device and pinned host memory on one side stream."""

    def __init__(self, device: torch.device):
        self.device = device
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device) if self.cuda else None
        self.pending: list[tuple[object, tuple[torch.Tensor, ...]]] = []

    def host_zeros(self, numel: int, dtype: torch.dtype) -> torch.Tensor:
        return torch.zeros(numel, dtype=dtype, device=HOST, pin_memory=self.cuda)

    def copy(self, dst: torch.Tensor, src: torch.Tensor, track: bool = True):
        """``dst.copy_(src)`` after the work already queued on the current stream; returns an event.

        ``track=False``: the caller orders the copy itself with ``wait_event`` (the ``wait_*`` calls will
        not cover it, and it holds no reference to the tensors beyond the allocator's stream record)."""
        if not self.cuda:
            dst.copy_(src)
            return None
        cur = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(cur)
        with torch.cuda.stream(self.stream):
            dst.copy_(src, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self.stream)
        for t in (dst, src):  # the caching allocator must not reuse device memory mid-copy
            if t.is_cuda:
                t.record_stream(self.stream)
        if track:  # hold only the host side: holding device tensors here would keep every gradient
            self.pending.append((ev, tuple(t for t in (dst, src) if not t.is_cuda)))  # shard alive all backward
        return ev

    def wait_host(self) -> None:
        """Block the host until every queued copy is done (before the CPU reads what came down)."""
        for ev, _ in self.pending:
            ev.synchronize()
        self.pending.clear()

    def wait_device(self) -> None:
        """Make the current stream wait for every queued copy (before the device reads what went up)."""
        if self.cuda:
            torch.cuda.current_stream(self.device).wait_stream(self.stream)
        self.pending.clear()

    def wait_event(self, ev) -> None:
        if ev is not None:
            torch.cuda.current_stream(self.device).wait_event(ev)


class HostPartition:
    """A rank's host-resident partition under offload: fp32 master, gradients, parameter copy-out.

    ``chunks`` of each buffer are its per-bucket shards (the optimizer's chunks). ``params`` is the
    host parameter partition under parameter offload (then it also receives the copy-out)."""

    def __init__(
        self,
        layout: PartitionLayout,
        device: torch.device,
        param_dtype: torch.dtype,
        grad_dtype: torch.dtype,
        offload_params: bool,
        allocator: Allocator | None = None,
    ):
        self.layout = layout
        self.allocator = allocator if allocator is not None else PlainAllocator()
        self.transfer = Transfer(device)
        n = layout.shard_numel
        fp32 = param_dtype == torch.float32
        self.params = self.transfer.host_zeros(n, param_dtype) if offload_params else None
        # fp32 with the parameters on the host: those are the master weights themselves.
        self.master = self.params if fp32 and offload_params else self.transfer.host_zeros(n, torch.float32)
        self.grads = self.transfer.host_zeros(n, grad_dtype)
        if offload_params:
            self.param_out = None if fp32 else self.params
        else:  # mixed precision: a pinned low-precision copy to stream up; fp32: stream the master itself
            self.param_out = None if fp32 else self.transfer.host_zeros(n, param_dtype)
        # Chunk views made once, here: views taken later inside a live-tensor tracker would be counted
        # as device memory on CPU-only machines.
        self._chunks: dict[int, list[torch.Tensor]] = {}
        for t in (self.params, self.master, self.grads, self.param_out):
            if t is not None and id(t) not in self._chunks:
                self._chunks[id(t)] = self._split(t)

    def _split(self, flat: torch.Tensor) -> list[torch.Tensor]:
        return [
            flat[self.layout.local_offset(b.index) : self.layout.local_offset(b.index) + b.shard_numel]
            for b in self.layout.buckets
        ]

    def chunks(self, flat: torch.Tensor | None) -> list[torch.Tensor] | None:
        """Per-bucket chunks of one of this partition's host buffers (None for None)."""
        if flat is None:
            return None
        return self._chunks[id(flat)]

    # -- gradients down --------------------------------------------------------------------------
    def grad_ready(self, bucket: int, shard: torch.Tensor, accumulate: bool) -> None:
        """A bucket's reduced gradient shard (on the device) is final for this micro-batch: bring it down."""
        dst = self._chunks[id(self.grads)][bucket]
        with self.allocator.host_region():  # host memory: outside the device's budget
            if not accumulate:
                self.transfer.copy(dst, shard)
                return
            # Later micro-batches of a window add on the host (synchronously: correctness over speed).
            tmp = torch.empty(shard.numel(), dtype=dst.dtype, device=HOST, pin_memory=self.transfer.cuda)
            self.transfer.copy(tmp, shard)
            self.transfer.wait_host()
            dst.add_(tmp)

    def finish_grad_copies(self) -> None:
        self.transfer.wait_host()

    # -- parameters up ---------------------------------------------------------------------------
    def updated_chunks(self) -> list[torch.Tensor]:
        """What the step leaves to send up: the low-precision copy-out, else the fp32 master."""
        return self.chunks(self.param_out if self.param_out is not None else self.master)

    def start_copy_back(self, device_shards: list[torch.Tensor] | None):
        """``on_chunk`` callback for the optimizer: chunk i is updated, start its copy to the device."""
        if device_shards is None:  # parameter offload: the step wrote the host partition directly
            return None
        src = self.updated_chunks()

        def on_chunk(i: int) -> None:
            self.transfer.copy(device_shards[i], src[i])

        return on_chunk

    def finish_copy_back(self) -> None:
        self.transfer.wait_device()

    # -- accounting ------------------------------------------------------------------------------
    def ledger(self, optimizer_tensors: list[torch.Tensor], nvme_bytes: int) -> dict[str, int]:
        params = [self.params] if self.params is not None else []
        if self.param_out is not None and self.param_out is not self.params:
            params.append(self.param_out)
        master = [] if self.master is self.params else [self.master]
        return {
            "host_params": storage_bytes(params),
            "host_grads": storage_bytes([self.grads]),
            "host_master": storage_bytes(master),
            "host_optimizer_states": storage_bytes(optimizer_tensors),
            "nvme_optimizer_states": nvme_bytes,
        }

    def tensors(self) -> list[torch.Tensor]:
        out = [self.master, self.grads]
        for t in (self.params, self.param_out):
            if t is not None:
                out.append(t)
        return out
