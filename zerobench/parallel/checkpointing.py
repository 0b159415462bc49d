"""Activation checkpointing per transformer block, with the ZeRO paper's ZeRO-R options (ZeRO §6; their traffic §8).

- checkpointing: each block keeps only its input; its activations are recomputed in backward with the
  RNG state of the forward replayed.
- **P_a** (``partition``): that input is identical on every TP rank in Megatron; each TP rank keeps 1/MP
  of it, and they all-gather it just before the recompute (one all-gather of b*s*h per block).
- **P_a+cpu** (``cpu_offload``): the kept partition lives in host memory (pinned, asynchronous copies on
  GPU) and comes back for the recompute. Without a GPU the same code path runs against a separate host
  buffer pool, so device and host bytes are counted apart.
- **M_D** (``contiguous``): checkpoints are written into one pre-allocated buffer (one slot per block)
  instead of separately allocated tensors, so long-lived checkpoints do not interleave with
  short-lived activations in the allocator.

Applied after TP and before ZeRO. It wraps each block's ``forward`` in place, so parameter names (and
hence checkpoints) are unchanged.

The recompute is what ``torch.utils.checkpoint`` promises: it replays the forward's RNG states and its autocast
state, and a block input changed in place since its forward is refused as autograd refuses it. Like torch's
reentrant checkpoint, it runs its own backward through the block, which accumulates into every parameter of the
block: ``torch.autograd.grad`` and ``backward(inputs=...)`` through it are refused in one line (they would fill
``.grad`` they were not asked for). A block whose input needs no gradient (after frozen embeddings) runs without
checkpointing: its parameters then stay in the loss's own graph, where the engine sees that a backward trains them.
Extra arguments of a block (a mask, a flag, a config, a shared module) reach it at the recompute too. A tensor
argument that needs a gradient is refused in one line (it would get none), and so is an object the recompute would
use a second time with another result: an HF cache (``DynamicCache`` appends the keys again) or a
``torch.Generator`` (it draws other numbers).
"""

from __future__ import annotations

import contextlib
import itertools
import types
import weakref

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from zerobench.distributed import collectives as C
from zerobench.distributed.collectives import Group
from zerobench.metrics.comm import CommLedger
from zerobench.metrics.memory import untracked
from zerobench.parallel.config import ActivationConfig, validate_sp


class CheckpointStore:
    """Keeps each checkpointed block's saved input until that block's backward: partitioned, offloaded, contiguous.

    A saved input belongs to the forward that made it (its autograd node holds it), not to the block: forwards run
    before one backward -- a second micro-batch's loss summed with the first's, or an extra forward with gradients
    whose loss is thrown away -- each recompute from their own input. M_D's pool has one slot per block; a forward
    that finds its block's slot held by one not yet backwarded takes a tensor of its own (the slot frees when its
    holder's backward runs, or its graph is dropped)."""

    def __init__(self, cfg: ActivationConfig, layers: int, tp: Group, ledger: CommLedger | None, rng=None):
        self.cfg, self.layers, self.tp, self.ledger = cfg, layers, tp, ledger
        self.rng = rng  # the TP region RNG tracker, replayed with the default RNG on recompute
        self.partition = (cfg.partition or cfg.cpu_offload) and tp.size > 1
        self.live: weakref.WeakValueDictionary[int, torch.Tensor] = weakref.WeakValueDictionary()
        """Every saved input still held by a forward's node (for ``bytes``), by the order they were saved."""
        self._count = itertools.count()
        self.pool: torch.Tensor | None = None  # M_D buffer [layers, piece]
        self.taken: set[int] = set()
        """M_D slots held by a forward whose backward has not run."""
        self.pinned = False
        self.peak = {"activation_checkpoints": 0, "activation_checkpoints_host": 0}

    @property
    def aliases(self) -> bool:
        """Whether ``save`` keeps the input itself (a detached alias sharing its version counter), not a copy."""
        return not (self.cfg.cpu_offload or self.cfg.contiguous or self.partition)

    def _piece_numel(self, numel: int) -> int:
        return -(-numel // self.tp.size) if self.partition else numel

    def _slot(self, index: int, numel: int, like: torch.Tensor) -> torch.Tensor:
        host = self.cfg.cpu_offload
        device = torch.device("cpu") if host else like.device
        if self.cfg.contiguous:
            if self.pool is None or self.pool.shape[1] != numel or self.pool.dtype != like.dtype:
                self.pinned = host and torch.cuda.is_available()
                self.pool = torch.empty(self.layers, numel, dtype=like.dtype, device=device, pin_memory=self.pinned)
                self.taken = set()
            if index not in self.taken:
                self.taken.add(index)
                view = self.pool[index]
                weakref.finalize(view, self.taken.discard, index)  # freed with the node that holds it
                return view
        pin = host and torch.cuda.is_available()
        return torch.empty(numel, dtype=like.dtype, device=device, pin_memory=pin)

    @torch.no_grad()
    def save(self, index: int, x: torch.Tensor) -> torch.Tensor:
        """Keep block ``index``'s input ``x``: returns what the forward's node holds until its backward."""
        flat = x.detach().reshape(-1)
        piece = self._piece_numel(flat.numel())
        if self.aliases:
            kept = x.detach()
        else:
            part = flat[self.tp.rank * piece : (self.tp.rank + 1) * piece] if self.partition else flat
            # P_a+cpu's slot is host memory, outside a (CPU-emulated) device budget, as optimizer offload's: its
            # allocation and the copies into it are not the device's (a tracker counts every op's output storage)
            with untracked(self.cfg.cpu_offload):
                kept = self._slot(index, piece, flat)
                kept[: part.numel()].copy_(part, non_blocking=kept.is_pinned())
                if part.numel() < piece:
                    kept[part.numel() :].zero_()
        self.live[next(self._count)] = kept
        self._update_peak()
        return kept

    def _update_peak(self) -> None:
        for k, v in self.bytes().items():
            self.peak[k] = max(self.peak[k], v)

    @torch.no_grad()
    def load(self, saved: torch.Tensor, shape: torch.Size, device: torch.device) -> torch.Tensor:
        """The block input ``save`` kept as ``saved``, whole and on ``device`` (P_a: all-gathered over TP)."""
        if saved.shape == shape and saved.device == device and not self.cfg.cpu_offload:
            return saved
        # P_a+cpu: always a copy onto the device, also where the device is the CPU (an emulated one), so that the
        # host slot never becomes a device tensor a budget would count (with M_D, the whole pool)
        piece = saved.to(device, non_blocking=True, copy=self.cfg.cpu_offload)
        numel = shape.numel()
        if self.partition:
            full = torch.empty(piece.numel() * self.tp.size, dtype=piece.dtype, device=device)
            C.all_gather(full, piece, self.tp, self.ledger, "pa")
            return full[:numel].view(shape)
        return piece[:numel].view(shape)

    def bytes(self) -> dict[str, int]:
        """Checkpoint bytes held now, on the device and in the host pool."""
        tensors = list(self.live.values()) + ([self.pool] if self.pool is not None else [])
        seen: dict[int, tuple[int, bool]] = {}
        for t in tensors:
            st = t.untyped_storage()
            seen[st._cdata] = (st.nbytes(), t.device.type == "cpu" and self.cfg.cpu_offload)
        host = sum(n for n, h in seen.values() if h)
        return {
            "activation_checkpoints": sum(n for n, h in seen.values() if not h),
            "activation_checkpoints_host": host,
        }


def _rng_state(device: torch.device):
    return torch.get_rng_state(), (torch.cuda.get_rng_state(device) if device.type == "cuda" else None)


def _set_rng_state(state, device: torch.device) -> None:
    torch.set_rng_state(state[0])
    if state[1] is not None:
        torch.cuda.set_rng_state(state[1], device)


def _autocast_state(device: torch.device) -> list[tuple]:
    """The forward's autocast state for the CPU and the input's device, to re-enter around the recompute."""
    kinds = ["cpu"] + ([device.type] if device.type == "cuda" else [])
    return [
        (k, torch.is_autocast_enabled(k), torch.get_autocast_dtype(k), torch.is_autocast_cache_enabled()) for k in kinds
    ]


def _autocast(state: list[tuple]) -> contextlib.ExitStack:
    stack = contextlib.ExitStack()
    for kind, enabled, dtype, cache in state:
        stack.enter_context(torch.autocast(kind, dtype=dtype, enabled=enabled, cache_enabled=cache))
    return stack


def _versions(tensors) -> list[int]:
    return [t._version for t in tensors]


class _CheckpointFn(torch.autograd.Function):
    """``forward(x, run, store, index, extra)``: ``run(x)`` without keeping its activations. ``extra``: the tensors
    among the block's other arguments, whose versions the backward checks as it checks ``x``'s."""

    @staticmethod
    def forward(ctx, x, run, store: CheckpointStore, index: int, extra: tuple):
        ctx.run, ctx.store, ctx.index = run, store, index
        ctx.shape, ctx.device = x.shape, x.device
        ctx.rng = _rng_state(x.device)
        ctx.tp_rng = store.rng.get_state() if store.rng is not None else None
        ctx.autocast = _autocast_state(x.device)
        ctx.saved = store.save(index, x)  # this forward's own, whatever other forwards run before its backward
        # an alias of x (plain recompute) or of another argument must read at the recompute what the forward read
        ctx.watched = ((ctx.saved,) if store.aliases else ()) + extra
        ctx.versions = _versions(ctx.watched)
        with torch.no_grad():
            return run(x)

    @staticmethod
    def backward(ctx, grad_out):
        if not torch.autograd._is_checkpoint_valid():
            raise RuntimeError(
                f"torch.autograd.grad or backward(inputs=...) through activation-checkpointed block {ctx.index}: "
                "its recompute runs a backward of its own, which would accumulate into every .grad of the block; "
                "call loss.backward(), or turn activation checkpointing off for this gradient"
            )
        saved, ctx.saved = ctx.saved, None  # released as the recompute ends (an M_D slot frees for the next forward)
        if saved is None:
            raise RuntimeError(
                f"block {ctx.index}'s checkpointed backward ran a second time (retain_graph=True): its saved input "
                "is released by the first; run one backward per forward, or turn activation checkpointing off"
            )
        if _versions(ctx.watched) != ctx.versions:
            raise RuntimeError(
                f"one of the variables needed for gradient computation has been modified by an inplace operation: "
                f"an input of activation-checkpointed block {ctx.index} changed in place after its forward; "
                "change a copy (x = x * 0, not x.mul_(0))"
            )
        ctx.watched = ()
        x = ctx.store.load(saved, ctx.shape, ctx.device).detach().requires_grad_(True)
        del saved
        now = _rng_state(ctx.device)
        tracker = ctx.store.rng
        now_tp = tracker.get_state() if tracker is not None else None
        _set_rng_state(ctx.rng, ctx.device)
        if tracker is not None:
            tracker.set_state(ctx.tp_rng)
        try:
            with torch.enable_grad(), _autocast(ctx.autocast):
                y = ctx.run(x)
        finally:
            _set_rng_state(now, ctx.device)
            if tracker is not None:
                tracker.set_state(now_tp)
        torch.autograd.backward(y, grad_out)
        return x.grad, None, None, None, None


def _stateful(a) -> bool:
    """An argument a second call would change or read otherwise: an HF cache (any class deriving from one named
    ``Cache``: ``transformers.cache_utils``' base, not imported here) or a random generator."""
    return isinstance(a, torch.Generator) or any(c.__name__ == "Cache" for c in type(a).__mro__)


def _checked_arguments(index: int, args: tuple, kwargs: dict) -> tuple:
    """The tensors among block ``index``'s other arguments (the backward checks their versions); one line for an
    argument the recompute cannot take again: a tensor that needs a gradient (it would get none), or a stateful
    object, which the recompute would use a second time (an HF ``DynamicCache`` would append the keys twice)."""
    leaves = tree_leaves((args, kwargs), is_leaf=_stateful)  # a cache transformers registers as a pytree stays whole
    odd = next((a for a in leaves if _stateful(a)), None)
    if odd is not None:
        raise ValueError(
            f"activation-checkpointed block {index} got a {type(odd).__name__} argument, which the recompute would "
            "use a second time (a cache appends again, a generator draws other numbers): for an HF model pass "
            "use_cache=False, as HF's own gradient checkpointing sets it"
        )
    tensors = tuple(a for a in leaves if isinstance(a, torch.Tensor))
    if any(a.requires_grad for a in tensors):
        raise ValueError(
            f"activation-checkpointed block {index} got an argument besides its input that needs a gradient: "
            "the recompute differentiates the block's input and parameters only; pass it as the input, or "
            "detach it"
        )
    return tensors


def _checkpointed(block: nn.Module, inner, store: CheckpointStore, index: int):
    """Block ``index``'s forward, checkpointed: ``inner`` is its original bound forward."""

    def forward(self, x, *args, **kwargs):
        if not torch.is_grad_enabled() or not x.requires_grad:
            return inner(x, *args, **kwargs)
        extra = _checked_arguments(index, args, kwargs) if args or kwargs else ()
        run = inner if not (args or kwargs) else (lambda h: inner(h, *args, **kwargs))
        return _CheckpointFn.apply(x, run, store, index, extra)

    return types.MethodType(forward, block)


def apply_activation_checkpointing(
    model: nn.Module, cfg: ActivationConfig, tp: Group | None = None, ledger: CommLedger | None = None, rng=None
) -> CheckpointStore | None:
    """Checkpoint every block of ``model.blocks``; returns the store (None when checkpointing is off).

    ``tp``: the TP group P_a partitions the checkpoints over (a ``Group``, a ``torch.distributed.ProcessGroup``
    or a 1-D ``DeviceMesh``); ``None`` is no TP, so the checkpoints stay whole.

    ``rng``: the ``TPRngTracker`` from ``apply_tp`` (``TPInfo.rng``), so recompute replays dropout exactly.

    P_a (or P_a+cpu) over a model ``apply_tp`` made sequence-parallel is refused in one line, as ``parallelize``
    refuses it (``validate_sp``).
    """
    cfg.validate()
    if not cfg.checkpoint:
        return None
    blocks = model.blocks
    tp = Group(None, "tp", 1, 0) if tp is None else Group.coerce(tp, "tp", "apply_activation_checkpointing's tp")
    validate_sp(cfg, _sequence_parallel(model), tp.size)  # as parallelize refuses it: P_a would gather wrong inputs
    store = CheckpointStore(cfg, len(blocks), tp, ledger, rng)
    for i, block in enumerate(blocks):
        block.forward = _checkpointed(block, block.forward, store, i)  # block.forward: the bound original
    return store


def _sequence_parallel(model: nn.Module) -> bool:
    """Whether ``apply_tp(sequence_parallel=True)`` sharded ``model``: its TP layers carry ``sequence_parallel``."""
    return any(getattr(m, "sequence_parallel", False) is True for m in model.modules())
