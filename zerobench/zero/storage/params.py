"""This rank's parameter storage, in one object with one vocabulary.

- ``replica`` (stages 0-2): every parameter in one flat buffer; the model's parameters are views of it.
- ``shards``: this rank's shard of the parameters, per bucket — views of the replica at stages 0-2, of
  its own partition at stage 3 (in host memory under parameter offload). The optimizer's low-precision
  output lands here; stages 1-2 all-gather them back into the replica (``publish``).
- ``master``: the fp32 master per bucket, which the optimizer updates — a device buffer under mixed
  precision, the host partition's under offload, or the shards themselves in fp32.
- ``host``: the offloaded partition (``zero/offload/host.py``), None without offload.

Where the optimizer writes and how updated values reach the shards (``step_output``, ``finish_step``,
``refresh_from_master``) is decided here, once, from which of these exist.
"""

from __future__ import annotations

import torch

import kernels
from zerobench.distributed import collectives as C
from zerobench.metrics.comm import CommLedger
from zerobench.zero.config import ZeroConfig
from zerobench.zero.layout import PartitionLayout, Segment
from zerobench.zero.offload.host import HostPartition
from zerobench.zero.param import ZeroParam
from zerobench.zero.storage.allocator import Allocator
from zerobench.zero.storage.buffer import FullBuffer, LocalBuffer
from zerobench.zero.storage.placement import Placement, Tier
from zerobench.zero.storage.signature import changed, signature


def _copy_segments(dst: torch.Tensor, segments: list[Segment], init: list[torch.Tensor]) -> None:
    for seg in segments:
        dst[seg.local_start : seg.local_start + seg.numel].copy_(init[seg.param][seg.param_start : seg.param_end])


class ParamStorage:
    """Replica, shards, master and the host partition of one engine (see the module docstring)."""

    def __init__(
        self,
        layout: PartitionLayout,
        config: ZeroConfig,
        placement: Placement,
        device: torch.device,
        allocator: Allocator,
        rank_in_shards: int,
    ):
        dtype = config.precision.param_dtype
        self.layout = layout
        self.host: HostPartition | None = None
        if placement.offloaded:
            with allocator.host_region():  # host memory, not the device's
                self.host = HostPartition(layout, device, dtype, dtype, placement.params is Tier.HOST, allocator)
        self.replica: FullBuffer | None = None
        self._partition: LocalBuffer | None = None
        if config.stage == 3:
            self._partition = LocalBuffer(
                layout, dtype, device, data=self.host.params if self.host is not None else None
            )
            self.shards = self._partition.bucket_views()
        else:
            self.replica = FullBuffer(layout, dtype, device)
            self.shards = [self.replica.shard_view(b.index, rank_in_shards) for b in layout.buckets]
        self._device_master: LocalBuffer | None = None
        if self.host is not None:
            self.master = self.host.chunks(self.host.master)
        elif config.precision.has_master:
            self._device_master = LocalBuffer(layout, torch.float32, device)
            self.master = self._device_master.bucket_views()
        else:  # fp32 without offload: the parameters are the master
            self.master = self.shards
        self.viewers: list = []
        """Stages 0-2: the ``ZeroParam`` of each trained parameter, whose ``.data`` is a view of the replica
        (``reattach`` checks that it still is); set when the views are attached."""
        self._sums: list[torch.Tensor] | None = None
        """Under optimizer offload at stages 1-2: each device shard's signature (``storage/signature.py``) when shard
        and master last agreed (after the step's copy-back, or an adopt); None when something else wrote them since
        (``rewritten``)."""

    @property
    def shards_on_host(self) -> bool:
        """Parameter offload: the shards live in host memory."""
        return self.host is not None and self.host.params is not None

    @torch.no_grad()
    def fill(self, zparams: list[ZeroParam], segments: list[Segment]) -> None:
        """Copy the model's initial values into the replica or the shards, and into the master (a model built on
        the meta device has none: its storage stays zero until it is initialised, ``parallel/init.py``)."""
        if any(zp.param.is_meta for zp in zparams):
            return
        init = [zp.param.detach().float().reshape(-1) for zp in zparams]
        if self.replica is not None:
            for zp, src in zip(zparams, init):
                self.replica.param_view(zp.slot.index).copy_(src.view(zp.slot.shape))
        else:
            _copy_segments(self._partition.data, segments, init)
        if self.host is not None and self.host.master is not self.host.params:  # (fp32: they are one)
            _copy_segments(self.host.master, segments, init)
        if self._device_master is not None:
            _copy_segments(self._device_master.data, segments, init)
        if self.watches_edits:  # (shards and master agree: a first adopt need not read them)
            self._sums = self._checksums()

    # -- the optimizer step's output -------------------------------------------------------------
    def step_output(self):
        """``(out, on_chunk)`` for ``ShardedAdamW.step``: where the low-precision values go (None: the
        master is the output), and a per-chunk callback (offload: stream each finished chunk up)."""
        if self.host is not None:
            device_shards = None if self.shards_on_host else self.shards
            return self.host.chunks(self.host.param_out), self.host.start_copy_back(device_shards)
        return (self.shards if self._device_master is not None else None), None

    def finish_step(self) -> None:
        if self.host is not None:
            self.host.finish_copy_back()
            if self.watches_edits:
                self._sums = self._checksums()

    def rewritten(self) -> None:
        """The shards and master were written outside the step (a load, ``safe_set_full_fp32_param``, a
        ``gathered_params`` write-back): the next ``adopt_edits`` under offload brings every shard down and compares
        it whole, as a signature taken before the write could match a later change in place back to the step's
        values."""
        self._sums = None

    @torch.no_grad()
    def refresh_from_master(self) -> None:
        """Rewrite the shards from the master (after loading a checkpoint); ``publish`` follows."""
        self.rewritten()
        if self.host is not None:
            out = self.host.chunks(self.host.param_out)
            if out is not None:
                torch._foreach_copy_(out, self.master)
            if not self.shards_on_host:
                for dst, src in zip(self.shards, self.host.updated_chunks()):
                    self.host.transfer.copy(dst, src)
                self.host.finish_copy_back()
        elif self._device_master is not None:
            torch._foreach_copy_(self.shards, self.master)

    @property
    def adopts_edits(self) -> bool:
        """Whether a parameter changed in place between steps can go unseen by the master, which the step then
        takes in (``adopt_edits``): stages 0-2 under bf16/fp16 with the master on the device. In fp32 the
        parameters are the master; at stage 3 they are placeholders outside forward (``gathered_params`` writes
        changes back); under optimizer offload the master is on the host (``watches_edits``: the step adopts
        a change before it runs)."""
        return self.replica is not None and self._device_master is not None

    @property
    def watches_edits(self) -> bool:
        """Stages 1-2 under optimizer offload: the master is on the host and the parameters on the device, so
        ``adopt_edits`` finds a change by each shard's signature (position-weighted sums of its elements) and
        brings only a changed shard down. It costs signing the shard twice per step (after the copy-back, and
        before the next step: each a read of the shard and a few passes over temporaries of about 12.5 MiB), and a
        wait for the device to read the sums back."""
        return self.replica is not None and self.host is not None and not self.shards_on_host

    def _checksums(self) -> list[torch.Tensor]:
        """Each device shard's signature (``storage/signature.py``: position-weighted sums of its bits, computed
        on the device in one read of the shard), so that a permutation in place shows as a change too."""
        return [signature(s) for s in self.shards]

    @torch.no_grad()
    def _adopt_offloaded(self) -> None:
        now = self._checksums()
        for shard, master, moved in zip(self.shards, self.master, changed(self._sums, now)):
            if moved:  # the shard down to the host, where the master is
                here = shard.detach().to(master.device)
                if here.dtype == torch.float32:
                    master.copy_(here)
                else:
                    kernels.reference.adopt_(master, here)
        self._sums = now

    @torch.no_grad()
    def reattach(self, keep: bool = True) -> None:
        """Stages 0-2: take back a parameter whose ``.data`` was assigned since ``apply_zero`` (``p.data = t``,
        ``torch.nn.utils.vector_to_parameters``, an ``_init_weights`` that assigns). It no longer viewed the replica:
        the model read the assigned tensor and never saw another step, while the engine stepped (and checkpointed)
        the buffer's values. Its values are copied into its view and the view put back, as torch's optimizer steps
        whatever tensor the parameter holds; ``adopt_edits`` then takes them into the master. A tensor of another
        shape, dtype or device is refused in one line. One pointer comparison per parameter. ``keep=False``
        (``gathered_params(writeback=False)``'s exit) puts the views back and discards the assigned values."""
        if self.replica is None:
            return
        buf = self.replica.data
        base, size = buf.data_ptr(), buf.element_size()
        for zp in self.viewers:
            s, p = self.layout.params[zp.slot.index], zp.param
            # read on the parameter itself: .data would dispatch an op per parameter per step
            if p.shape == s.shape and (p.numel() == 0 or p.data_ptr() == base + s.start * size):
                continue
            data = p.data
            view = self.replica.param_view(zp.slot.index)
            if keep:
                zp.check_assigned(data, view)
                view.copy_(data)
                self.rewritten()
            zp.param.data = view

    @torch.no_grad()
    def adopt_edits(self) -> None:
        """Take parameters changed in place since the step last wrote them into the fp32 master, as
        ``torch.optim`` steps whatever value a parameter holds: every element of this rank's shard whose bits
        are no longer the master's rounding (``p.mul_(...)``, ``p.data.copy_(...)``, ``model.apply(init_fn)``
        or zeroing a padding row outside ``gathered_params``). Without it the step would recompute the parameter
        from the stale master and silently undo the change (DeepSpeed does).

        The optimizer step does this inside its own pass (``ShardedAdamW.step(adopt=True)``); readers of the
        master between steps (checkpoints, exports, ``safe_get_full_fp32_param``) call this first. At stages
        1-2 each rank takes its own shard's changes, and the step's all-gather gives every rank the owners'
        values: a change made on every rank is kept everywhere. Under optimizer offload (``watches_edits``) the
        step calls this first; a shard whose signature is the one the step left is not read. A parameter whose
        ``.data`` was assigned is taken back first (``reattach``)."""
        self.reattach()
        if self.adopts_edits:
            for shard, master in zip(self.shards, self.master):
                kernels.reference.adopt_(master, shard)
        elif self.watches_edits:
            self._adopt_offloaded()

    def publish(self, group: C.Group, ledger: CommLedger) -> None:
        """Stages 1-2: all-gather every bucket's updated shard into the replica (nothing to do with one shard, or
        at stage 3, which gathers per unit)."""
        if self.replica is None or self.layout.shards == 1:
            return
        works = [
            C.all_gather(self.replica.bucket_view(b.index), shard, group, ledger, "param", async_op=True)
            for b, shard in zip(self.layout.buckets, self.shards)
        ]
        for w in works:
            if w is not None:
                w.wait()

    # -- what it holds (accounting) --------------------------------------------------------------
    def device_params(self) -> list[torch.Tensor]:
        if self.replica is not None:
            return [self.replica.data]
        return [] if self.shards_on_host else [self._partition.data]

    def device_master(self) -> list[torch.Tensor]:
        return [self._device_master.data] if self._device_master is not None else []
