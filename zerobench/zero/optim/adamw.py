"""AdamW over flat fp32 partitions: the optimizer step of every ZeRO stage.

The optimizer sees a list of *chunks* (this rank's shard of each bucket; the whole bucket at stage 0):
fp32 master chunks, gradient chunks (any dtype; averaged over ranks), and the weight-decay ranges inside
each chunk (by default parameters of 2+ dims decay, biases and norms do not; the ranges are fixed, the rate
is each step's, so a schedule may start it from 0). With several param groups, each chunk also knows each
group's ranges, and the step runs once per group present in the chunk, with that group's hyperparameters,
over its ranges only (``zero/optim/param_groups.py``). The arithmetic is exactly ``torch.optim.AdamW``'s,
with the gradient scale (1 / loss scale, times the clip coefficient) folded into the gradient read.

Two paths: the fused kernel (``kernels.fused_adamw_``: one pass per chunk reading p, g, m, v and writing p, m, v and
the low-precision parameter copy) and the reference (``torch._foreach_*`` ops, then a separate copy-out). Both go a
chunk at a time, so the reference's temporaries (scaled gradient, denominator) are one chunk's size, not the
partition's. ``kernels`` mode ``"auto"`` takes the fused one wherever the device has it.

The moments are kept by a *store* in a *codec* (``zero/optim/states.py``): fp32 in memory (the default: two flat
buffers), blockwise 8-bit, and/or swapped to NVMe; the step acquires, decodes, updates, encodes and releases one
chunk at a time. Under ZeRO-Offload all of this lives in host memory and runs on the CPU kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

import kernels
from zerobench.zero.config import AdamWConfig
from zerobench.zero.optim.states import MemoryStore, make_codec


@dataclass(frozen=True)
class _Part:
    """One param group's share of a chunk; the step updates it with that group's hyperparameters."""

    group: int
    spans: list[tuple[int, int]] | None
    """Its ranges in the chunk; None: the whole chunk (one group)."""
    decay: list[tuple[int, int]]
    blocks: torch.Tensor | None
    """The fused kernel's table over ``spans`` (None on the reference path)."""


class ShardedAdamW:
    """AdamW on a rank's partition; ``step(grads, grad_scale)`` updates ``master`` chunks in place."""

    def __init__(
        self,
        cfg: AdamWConfig,
        master: list[torch.Tensor],
        decay_ranges: list[list[tuple[int, int]]],
        kernel_mode: str = "auto",
        state_bits: int = 32,
        store_factory=None,
        group_spans: list[dict[int, list[tuple[int, int]]]] | None = None,
        quant_breaks: list[list[int]] | None = None,
    ):
        """``store_factory(codec, sizes)`` builds the state store (default: in memory on the master's
        device); ``state_bits`` 32 or 8 picks the codec; ``group_spans``: per chunk, each param group's
        ranges (None: one group over every chunk); ``quant_breaks``: per chunk, where 8-bit blocks start afresh
        (``Int8Codec``)."""
        self.cfg = cfg
        self.master = master
        device = master[0].device if master else torch.device("cpu")
        self.codec = make_codec(state_bits, quant_breaks)
        sizes = [m.numel() for m in master]
        self.store = store_factory(self.codec, sizes) if store_factory else MemoryStore(self.codec, sizes, device)
        self.step_count = 0
        self.path = kernels.resolve(kernel_mode, device)
        self.parts = [
            self._parts(m.numel(), decay_ranges[i], None if group_spans is None else group_spans[i], device)
            for i, m in enumerate(master)
        ]

    def _parts(self, numel: int, decay, spans_by_group, device) -> list[_Part]:
        fused = self.path == "fused"
        if spans_by_group is None:
            return [_Part(0, None, decay, kernels.adamw_blocks(numel, decay, device) if fused else None)]
        parts = []
        for group, ranges in sorted(spans_by_group.items()):
            spans = sorted(ranges)
            mine = set(spans)
            dec = [r for r in decay if r in mine]
            parts.append(_Part(group, spans, dec, kernels.adamw_blocks(numel, dec, device, spans) if fused else None))
        return parts

    # -- moments as fp32 chunks (checkpoints, tests) ---------------------------------------------
    def moments(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """fp32 ``(m chunks, v chunks)``: views of the state when resident fp32, decoded copies otherwise."""
        ms, vs = [], []
        for i in range(len(self.master)):
            m, v = self.codec.decode(self.store.acquire(i), chunk=i)
            ms.append(m)
            vs.append(v)
        self.store.flush()
        return ms, vs

    def load_moments(self, ms: list[torch.Tensor], vs: list[torch.Tensor]) -> None:
        """Store fp32 moment chunks (after filling the chunks ``moments`` returned)."""
        for i, (m, v) in enumerate(zip(ms, vs)):
            enc = self.store.acquire(i)
            self.codec.encode(m, v, enc, chunk=i)
            self.store.release(i, enc)
        self.store.flush()

    @torch.no_grad()
    def flag_nonfinite(self, grads: list[torch.Tensor], flag: torch.Tensor) -> None:
        """Raise ``flag`` (one fp32 element) when any gradient chunk holds inf or NaN."""
        for g in grads:
            if self.path == "fused":
                kernels.nonfinite_(g, flag)
            elif not torch.isfinite(g).all():
                flag.fill_(1.0)
                return

    @torch.no_grad()
    def step(
        self,
        grads: list[torch.Tensor],
        grad_scale: float,
        out: list[torch.Tensor] | None = None,
        on_chunk=None,
        hyper: AdamWConfig | list[AdamWConfig] | None = None,
        adopt: bool = False,
    ) -> None:
        """One step; ``out`` (optional) receives the updated chunks in their dtype (the parameter copy);
        ``adopt``: ``out`` is the parameter copy this step wrote last time, and an element changed there since is
        where the step starts from (``kernels.fused_adamw_``);
        ``on_chunk(i)`` is called as soon as chunk ``i`` is final (offload streams it back meanwhile);
        ``hyper``: this step's hyperparameters per param group (a learning-rate schedule's; one config for
        one group), the construction's if None."""
        self.step_count += 1
        if not self.master:
            return
        hypers = [self.cfg] if hyper is None else [hyper] if isinstance(hyper, AdamWConfig) else hyper
        for i, (p, g) in enumerate(zip(self.master, grads)):
            enc = self.store.acquire(i)
            m, v = self.codec.decode(enc, chunk=i)
            o = out[i] if out is not None else None
            fused_adopt = adopt and o is not None
            if fused_adopt and self.path != "fused":
                kernels.reference.adopt_(p, o)
                fused_adopt = False
            for part in self.parts[i]:
                self._update(part, hypers[part.group], p, g, m, v, o, grad_scale, fused_adopt)
            self.codec.encode(m, v, enc, chunk=i)
            self.store.release(i, enc)
            if on_chunk is not None:
                on_chunk(i)
        self.store.flush()

    def _update(self, part: _Part, cfg: AdamWConfig, p, g, m, v, o, grad_scale: float, adopt: bool) -> None:
        """One group's share of one chunk; ``adopt`` (fused path only) as ``kernels.fused_adamw_``'s."""
        if self.path == "fused":
            kernels.fused_adamw_(
                p,
                g,
                m,
                v,
                blocks=part.blocks,
                lr=cfg.lr,
                betas=cfg.betas,
                eps=cfg.eps,
                weight_decay=cfg.weight_decay,
                step=self.step_count,
                grad_scale=grad_scale,
                out=o,
                adopt=adopt,
            )
        elif part.spans is None:
            self._reference(cfg, [p], [g], [m], [v], [part.decay], grad_scale, None if o is None else [o])
        else:
            views = [[t[lo:hi] for lo, hi in part.spans] for t in (p, g, m, v)]
            decays = set(part.decay)
            dec = [[(0, hi - lo)] if (lo, hi) in decays else [] for lo, hi in part.spans]
            outs = None if o is None else [o[lo:hi] for lo, hi in part.spans]
            self._reference(cfg, *views, dec, grad_scale, outs)

    def _reference(self, cfg: AdamWConfig, ps, grads, ms, vs, decay_ranges, grad_scale, out) -> None:
        b1, b2 = cfg.betas
        g32 = [g.to(torch.float32) if g.dtype != torch.float32 else g for g in grads]
        g32 = torch._foreach_mul(g32, grad_scale)
        if cfg.weight_decay:
            keep = 1.0 - cfg.lr * cfg.weight_decay
            for chunk, ranges in zip(ps, decay_ranges):
                for lo, hi in ranges:
                    chunk[lo:hi].mul_(keep)
        torch._foreach_lerp_(ms, g32, 1.0 - b1)
        torch._foreach_mul_(vs, b2)
        torch._foreach_addcmul_(vs, g32, g32, value=1.0 - b2)
        bc1 = 1.0 - b1**self.step_count
        bc2_sqrt = math.sqrt(1.0 - b2**self.step_count)
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, cfg.eps)
        torch._foreach_addcdiv_(ps, ms, denom, value=-cfg.lr / bc1)
        if out is not None:
            torch._foreach_copy_(out, ps)

    def tensors(self) -> list[torch.Tensor]:
        """The resident state tensors (none for the NVMe store)."""
        return self.store.tensors()
