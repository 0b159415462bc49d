"""The ZeRO engine: stages 0-3 over one data-parallel group, on a plain model.

Construction moves every parameter into the engine's flat buffers (``p.data`` becomes a view; tied parameters stay
tied), builds this rank's fp32 master partition and Adam states, and installs gradient hooks (and, at stage 3, the
gather/free gatherer). Its surface is closed and documented in docs/engine.md: the training loop is either::

    for x, y in micro_batches:           # step() acts at each window's end, then zeroes
        engine.backward(model(x, y))
        engine.step()

or DDP's: ``loss.backward()`` (``zero/grads/backward.py``), ``engine.no_sync()`` (``zero/grads/accumulation.py``),
``engine.optimizer.step()`` and ``model.zero_grad()`` (``zero/interop/module_zero_grad.py``). Beyond training:
``gathered_params()``, ``clip_grad_norm_()``, ``empty_partition_cache()``, ``destroy()``, and the memory and
communication ledgers (``engine.accounting``, ``engine.ledger``). DeepSpeed's engine names are a layer composed on
top (``zerobench.zero.as_deepspeed``, ``zero/compat/deepspeed/engine.py``), which this module never imports.

Gradients are *averaged* over ranks, as under DDP: ``engine.backward`` multiplies the loss by 1/N (a plain
``loss.backward()`` has its gradients multiplied by 1/N before their collective), and the collectives sum. The
1/loss-scale and the clip coefficient are folded into one scale applied inside the optimizer step.

Under optimizer offload (``zero/offload/host.py``) the master, moments (``zero/optim/states.py``: in memory, 8-bit
or on NVMe) and gradient partition live on the host and the step (``zero/optim/step.py``) runs there; parameter
offload adds stage 3's.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist
from torch import nn

from zerobench.distributed import collectives as C
from zerobench.metrics.comm import CommLedger
from zerobench.zero.accounting import EngineAccounting
from zerobench.zero.build import (
    UnitPlan,
    attach_params,
    build_optimizer,
    chunk_ranges,
    order_params,
    range_edges,
    settle_frozen,
)
from zerobench.zero.config import MAX_INFLIGHT, ZeroConfig
from zerobench.zero.grads.accumulation import AccumulationWindow
from zerobench.zero.grads.backward import BackwardPasses
from zerobench.zero.grads.buckets import GradBucketGroup, SyncMode
from zerobench.zero.grads.stats import clip_coefficient, reduced_grads, window_grad_norm, zero_padding
from zerobench.zero.grads.unused import UnusedCheck, start_unused_check
from zerobench.zero.interop.foreign import install as install_foreign_guards
from zerobench.zero.interop.forward_inputs import cast_forward_inputs
from zerobench.zero.interop.module_zero_grad import route_zero_grad
from zerobench.zero.interop.teardown import check_live, destroy_engine
from zerobench.zero.layout import build_layout
from zerobench.zero.optim.loss_scale import DynamicLossScaler
from zerobench.zero.optim.param_groups import resolve_param_groups
from zerobench.zero.optim.step import check_steppable
from zerobench.zero.optim.torch_optimizer import ZeroOptimizer
from zerobench.zero.param import ZeroParam
from zerobench.zero.registry import register
from zerobench.zero.replicas import sync_replicas
from zerobench.zero.state.gathered import GatheredParams
from zerobench.zero.state.module_state import install_load_hooks
from zerobench.zero.storage.allocator import Allocator, PlainAllocator
from zerobench.zero.storage.params import ParamStorage
from zerobench.zero.storage.placement import Placement


class ZeroEngine:
    """The engine ``apply_zero`` returns; see the module docstring and docs/engine.md."""

    skip_nonfinite: bool = False
    """Outside fp16: skip the step of a window whose gradient holds an inf or NaN on any rank (counted in
    ``scaler.skipped_steps``; ``optimizer.overflow`` says so), as DeepSpeed's ZeRO and bf16 optimizers do, which
    ``initialize`` sets from a DeepSpeed config. Off, the step runs on it, as ``torch.optim``'s does. Under fp16 the
    loss scaler always skips such a step."""
    always_norm: bool = False
    """Compute the global gradient norm at every step (``last_grad_norm``), not only when clipping needs it, as
    DeepSpeed's ZeRO, bf16 and fp16 optimizers do, which ``initialize`` sets from a DeepSpeed config (its
    ``get_global_grad_norm()``). Off, a step without clipping computes none (no extra collective)."""
    cast_forward_inputs: str = "all"
    """Under bf16/fp16, which of the model's floating-point forward arguments are cast to the training dtype, read
    at every forward: "all" (positional and keyword, FSDP's default), "positional" (DeepSpeed's ``fp16.auto_cast``)
    or "none" (DeepSpeed's default: the caller passes tensors of the model's dtype), which ``initialize`` sets from a
    DeepSpeed config. An attribute, not a ``ZeroConfig`` field: it changes no step, and so no run's identity."""
    unused_hint: str = "pass ZeroConfig(find_unused_parameters=True) (--find-unused-parameters)"
    """How the unused-parameter error says to allow them (``initialize`` names its DeepSpeed config key)."""
    _norm_taken = False
    """``clip_grad_norm_`` measured this window's norm (before its clip): the step keeps that one."""

    def __init__(
        self,
        model: nn.Module,
        group: C.Group,
        config: ZeroConfig,
        units: UnitPlan | list[nn.Module],
        ledger: CommLedger | None = None,
        tp_group: C.Group | None = None,
        tp_sharded: frozenset[str] = frozenset(),
        allocator: Allocator | None = None,
        param_groups=None,
        device: torch.device | None = None,
    ):
        config.validate()
        self.destroyed = False  # by destroy()
        self.allocator = allocator if allocator is not None else PlainAllocator()
        self.tp_group = tp_group if tp_group is not None and tp_group.size > 1 else None
        self.module, self.group, self.config, self.stage = model, group, config, config.stage
        self.ledger, self.param_dtype = ledger if ledger is not None else CommLedger(), config.precision.param_dtype
        # 1. Which parameters are trained, in layout order; the partition layout (pure data).
        ordered, groups = self._lay_out(model, units, param_groups, device)
        device, segments = self.device, self.layout.segments(self.rank_in_shards)
        # 2. Parameter storage and the fp32 master partition, from the model's initial values.
        self.placement = placement = Placement.of(config)
        self.storage = st = ParamStorage(self.layout, config, placement, device, self.allocator, self.rank_in_shards)
        st.fill(self.zparams, segments)
        # 3. Point the model's parameters at the engine's storage (stage 3: the gatherer that gathers and frees units).
        self.gatherer = attach_params(
            model, ordered.units, st, self.layout, self.zparams, group, self.ledger, config, self.allocator, device
        )
        self._gathered_open: list = []
        """The ``gathered_params()`` contexts open now, innermost last (``zero/state/gathered.py``)."""
        # 4. Optimizer over this rank's chunks, with weight-decay and param-group ranges per chunk.
        decay, self.replicated_ranges, spans = chunk_ranges(self.layout, segments, self.zparams, frozenset(tp_sharded))
        breaks = None if self.tp_group is None else range_edges(self.replicated_ranges)
        self.adamw = build_optimizer(
            config, self.placement, st.master, decay, group, self.allocator, spans if groups.explicit else None, breaks
        )
        self.optimizer = ZeroOptimizer(self, groups.groups, config.optimizer)
        self._model_hooks = (install_load_hooks(self), cast_forward_inputs(model, self))

        # 5. Gradients: full buffer (stages 0-1) or partition + staging buckets (2-3), reduced by hooks.
        self._wire_backward(model, st, group, device)
        self.window = AccumulationWindow(config.grad_accum_steps)
        self._unused_check: UnusedCheck | None = None
        self.last_grad_norm: float | None = None
        self.micro_steps = self.global_steps = 0  # DeepSpeed's counters
        self._clip = 1.0  # a factor the next step folds into its scale: a torch GradScaler's 1/scale (step() sets it)
        self.grads_sharded = self.stage >= 1 and group.size > 1  # norms and overflow need an all-reduce
        self.dp_world_size, self.mp_world_size = group.size, 1 if self.tp_group is None else self.tp_group.size
        self.global_rank, self.world_size = (
            (dist.get_rank(), dist.get_world_size()) if dist.is_initialized() else (0, 1)
        )
        self.numel = self.layout.unpadded_numel
        self.accounting = EngineAccounting(
            self.grads, self.gatherer, st, self.adamw, config, self.placement, self.numel, group.size
        )
        register(self)  # safe_get_full_fp32_param(p) and the rest find the engine by the parameter
        install_foreign_guards()  # a torch optimizer or clip_grad_norm_ on these parameters is loud, not silent

    # -- construction helpers ------------------------------------------------------------------
    def _lay_out(self, model: nn.Module, units, param_groups, device: torch.device | None):
        """The trained parameters in layout order, their param groups, the device, DP rank 0's values everywhere,
        the partition layout and each parameter's ``ZeroParam``; returns (the ordered parameters, the groups)."""
        config, group = self.config, self.group
        ordered = order_params(model, units, self.stage, self.param_dtype)
        groups = resolve_param_groups(ordered.named, param_groups, config.optimizer, model)  # before any collective
        self.device = device = device if device is not None else ordered.named[0][1].device  # meta-built: given
        sync_replicas(model, [n for n, _ in ordered.named], config, group, device)  # DP rank 0's model everywhere
        self.layout = build_layout(
            ordered.specs, 1 if self.stage == 0 else group.size, config.bucket_numel, config.param_align
        )
        self.zparams = [
            ZeroParam(p, slot, groups.decays(p), groups.of_param[id(p)])
            for (_, p), slot in zip(ordered.named, self.layout.params)
        ]
        self.frozen = settle_frozen(model, ordered.frozen, self.param_dtype, device)  # refused at step() if unfrozen
        self._known_param_ids = frozenset(
            id(p) for p in [*(zp.param for zp in self.zparams), *(p for _, p in self.frozen)]
        )
        """Every parameter the model had when built: one it gains after is refused at ``step()`` (``check_added``)."""
        self.rank_in_shards = 0 if self.stage == 0 else group.rank
        return ordered, groups

    def _wire_backward(self, model: nn.Module, st: ParamStorage, group: C.Group, device: torch.device) -> None:
        """The gradient buckets, the loss scaler, the backward passes and their hooks (``zero/grads/backward.py``), and
        ``model.zero_grad()`` routed to the engine's (``zero/interop/module_zero_grad.py``)."""
        self.grads = GradBucketGroup(
            self.layout,
            self.zparams,
            group,
            self.ledger,
            self.param_dtype,
            device,
            SyncMode.for_stage(self.stage),
            max_inflight=MAX_INFLIGHT if self.config.overlap_comm else 0,
            sink=st.host.grad_ready if st.host is not None else None,
            unused_flags=not self.config.find_unused_parameters,
        )
        self.scaler = DynamicLossScaler(self.config.loss_scale, enabled=self.config.precision.value == "fp16")
        self.passes = BackwardPasses(
            model, self.zparams, self._begin_micro, self._end_micro, scaled=self.scaler.enabled
        )
        if self.gatherer is not None:
            self.gatherer.attach(self.grads, self.passes)
        self._hooks = self.passes.install_hooks(model, self.grads)
        if self.grads.keep_full:
            self.grads.attach_grad_views()
        route_zero_grad(model, self)

    # -- training API ----------------------------------------------------------------------------
    @property
    def loss_scale(self) -> float:
        return self.scaler.scale

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        """Backward of one micro-batch; the window's last one reduces the gradients (overlapped with backward).

        The loss is multiplied by the loss scale / ``grad_accum_steps`` first, and under fp32 and bf16 by 1 / N too;
        under fp16 the 1 / N multiplies each gradient before its collective instead, so a rank's own gradient carries
        the whole loss scale and overflows where DeepSpeed's and torch's (DDP with ``GradScaler``) would: the step is
        skipped, and a static scale is what the gradients carry. Gradients come out averaged over the window and the
        DP group either way. A plain ``loss.backward()`` works too, scaled the same way by hooks
        (``zero/grads/backward.py``).

        Args:
            loss: a scalar of this micro-batch.
            retain_graph: keep the graph for a second loss's backward next (DeepSpeed's).
            scale_wrt_gas: ``False`` leaves out the 1 / ``grad_accum_steps`` (you divide the loss yourself).

        Returns:
            ``loss``, unscaled.
        """
        check_live(self, "backward()")
        gas = self.config.grad_accum_steps if scale_wrt_gas else 1
        self.passes.run(loss * (self.scaler.scale / (gas * self._loss_divisor())), retain_graph)
        return loss

    def scale(self, loss: torch.Tensor, retain_graph: bool = False) -> torch.Tensor:
        """``loss`` times what ``backward`` multiplies it by (the loss scale / ``grad_accum_steps``, and 1 / N under
        fp32 and bf16), for a plain ``.backward()`` that then trains as ``engine.backward(loss)`` would, fp16 included
        (DeepSpeed's ``engine.scale``).

        Args:
            loss: a scalar of this micro-batch.
            retain_graph: DeepSpeed's argument; a retained graph needs nothing more here.
        """
        check_live(self, "scale()")
        scaled = loss * (self.scaler.scale / (self.config.grad_accum_steps * self._loss_divisor()))
        self.passes.mark_scaled(scaled)
        return scaled

    def no_sync(self):
        """Context manager, as DDP's and DeepSpeed's: backward passes inside it accumulate without synchronising; the
        next one outside synchronises them all (``zero/grads/accumulation.py``). Use it with
        ``grad_accum_steps=1``."""
        return self.window.no_sync()

    def _loss_divisor(self) -> int:
        """What ``backward`` and ``scale`` divide the loss by for the DP average: N, or 1 under fp16, where the
        gradients are divided before their collective (``_begin_micro``)."""
        return 1 if self.scaler.enabled else self.group.size

    def _begin_micro(self, plain: bool) -> None:
        mb = self.window.begin(plain)
        if mb.first:
            self._norm_taken = False
        if plain:  # the loss carried nothing: 1 / (N x gas), as DeepSpeed's
            divisor = self.group.size * self.config.grad_accum_steps
        else:  # engine.backward's loss carried all but fp16's 1 / N (``_loss_divisor``)
            divisor = self.group.size if self.scaler.enabled else 1
        pre_scale = 1.0 / divisor if divisor > 1 else None
        self.grads.begin_micro(sync=mb.sync, first_in_window=mb.first, pre_scale=pre_scale)

    def _end_micro(self) -> None:
        self.grads.finish(on_started=self._start_unused_check)

    def _start_unused_check(self, unused: list[int]) -> None:
        if self._unused_check is not None:  # an earlier window's, never stepped on: only the last one counts
            self._unused_check.wait()
        self._unused_check = start_unused_check(self, unused)

    def step(self) -> bool:
        """Once per micro-batch, as DeepSpeed's ``engine.step()``: at a window's end the optimizer step, then
        ``zero_grad()``; before it, nothing. ``engine.optimizer.step()`` is torch's (it does not zero).

        Returns:
            Whether the parameters were updated: not inside a window, not when no gradient came since ``zero_grad()``
            (``.grad`` None; after ``zero_grad(set_to_none=False)`` the zeros step, as torch's), not on an fp16
            overflow.

        Raises:
            LossScaleAtMinimum: an fp16 overflow with the loss scale already at its minimum.
        """
        check_live(self, "step()")
        inside = self.window.open and not self.window.unsynced
        if not inside:  # a step would run: refused before anything counts
            check_steppable(self, "step()")
        self.micro_steps += 1
        if inside:
            self.optimizer.applied = False
            return False
        self.optimizer.step()
        self.zero_grad()
        return self.optimizer.applied

    # -- beyond training: teardown, full parameters, the stage-3 cache
    def destroy(self) -> None:
        """DeepSpeed's: remove every hook the engine installed and hand the model back as a plain module, its
        parameters holding their trained values (stage 3 gathers them: call it on every DP rank);
        ``zero/interop/teardown.py``."""
        destroy_engine(self)

    def gathered_params(self, writeback: bool = True, modifier_rank: int | None = None) -> GatheredParams:
        """Context manager: inside it the module's parameters hold their full values, as FSDP's ``summon_full_params``.

        Stage 3 gathers every unit (a DP collective: enter it on every rank). Changes made inside are kept.

        Args:
            writeback: ``False`` discards changes made inside (``zero/state/gathered.py``).
            modifier_rank: keep DP rank ``modifier_rank``'s changes, on every rank (DeepSpeed's); None keeps each
                rank's own.
        """
        check_live(self, "gathered_params()")
        return GatheredParams(self, writeback, modifier_rank)

    def empty_partition_cache(self) -> None:
        """Stage 3, between steps: free every gathered unit (DeepSpeed's name), e.g. a root gathered on demand."""
        check_live(self, "empty_partition_cache()")
        if self.gatherer is not None:
            self.gatherer.reshard_all()

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Start a new window, as ``torch.optim``'s ``zero_grad``: the engine's gradients are cleared.

        Args:
            set_to_none: stages 0-1 set each trained parameter's ``.grad`` to None (else zero it in place).
        """
        check_live(self, "zero_grad()")
        self.grads.zero(set_to_none)
        self.window.cleared()
        self._norm_taken = False  # whether the discarded window's norm was taken, and its unused-parameter check,
        # go with it
        if self._unused_check is not None:
            self._unused_check.wait()
            self._unused_check = None

    def restart_window(self) -> None:
        """Drop every gradient accumulated so far and start a new window with the next micro-batch: what a checkpoint
        load leaves (``load_sharded``). A checkpoint is saved at a window's boundary, so a load in the middle of one
        (rolling back after a micro-batch whose loss was NaN) must not keep that window's gradients or its count:
        the first window after the load would step on them, or end a micro-batch early."""
        self.zero_grad(set_to_none=True)
        self.window.restart()
        self.window.counted_from = self.micro_steps

    def clip_grad_norm_(
        self, max_norm: float, norm_type: float = 2.0, error_if_nonfinite: bool = False
    ) -> torch.Tensor:
        """Clip this window's gradient to a global norm of ``max_norm`` over every DP and TP partition, as FSDP's
        ``clip_grad_norm_``. Call it on every DP rank after the window's last ``backward()``, before ``step()``. As
        torch's, it scales the stored gradient in place (this rank's reduced partition; at stage 0 that is ``.grad``;
        at stage 1 with the optimizer offloaded, both the host copy the step reads and ``.grad``),
        so whatever follows sees it clipped: ``.grad``, a clip by value, the step, and a next window accumulated onto
        it without ``zero_grad()``. A non-finite norm scales it by NaN (nan) or 0 (inf), as torch's does.

        Args:
            max_norm: the largest norm the averaged gradient may have.
            norm_type: p of the p-norm (any p > 0, or ``inf``); 2 by default.
            error_if_nonfinite: raise, before anything is scaled, where the norm is NaN or infinite (torch's).

        Returns:
            The averaged gradient's norm before clipping, as a tensor.
        """
        check_live(self, "clip_grad_norm_()")
        norm = window_grad_norm(self, max_norm, self.grads_sharded, norm_type)
        if error_if_nonfinite and not math.isfinite(norm):
            raise RuntimeError(f"the total norm of order {norm_type} of the gradients is non-finite: {norm}")
        if not self._norm_taken:  # the window's norm is the first one measured, before any clip
            self.last_grad_norm, self._norm_taken = norm, True
        coef = clip_coefficient(norm, max_norm)
        if coef != 1.0:  # NaN too
            chunks = [c for c in reduced_grads(self, "clip_grad_norm_()") if c.numel()]
            if chunks:
                torch._foreach_mul_(chunks, coef)
            if self.storage.host is not None and self.grads.keep_full:  # stage 1 offloaded: .grad holds it too
                torch._foreach_mul_([v for v in self.grads.shard_views() if v.numel()], coef)
            if math.isnan(coef):  # the chunks' padding too: it must stay 0, or every later window reads NaN
                zero_padding(self)
        return torch.tensor(norm, device=self.device)

    def grad_chunks(self) -> list[torch.Tensor]:
        """This rank's reduced gradient chunks as the optimizer reads them (averaged; times fp16's loss scale)."""
        host = self.storage.host
        return host.chunks(host.grads) if host is not None else self.grads.shard_views()

    @torch.no_grad()
    def params_from_master(self) -> None:
        """Refresh the parameters from the fp32 master (after loading a checkpoint). At stage 3 every gathered unit
        is freed first (a root gathered on demand by a call of a root submodule), as after a step: its gathered
        values predate the load, and the next forward would compute with them."""
        if self.gatherer is not None:
            self.gatherer.check_edits(discard=True)  # what was edited in place is replaced by the loaded values
            self.gatherer.reshard_all()
        self.storage.refresh_from_master()
        self.storage.publish(self.group, self.ledger)
