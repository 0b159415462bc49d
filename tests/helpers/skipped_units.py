"""Rank-dependent unit skipping (LayerDrop, a rank-dependent branch) inside spawned ranks, against single-process
``torch.optim.AdamW`` training on the same global batch with the same skips.

Each case gives, per step and rank, the blocks that rank's forward skips; the reference runs every rank's slice with
that rank's skips and averages the losses. Each rank records the collectives it issued (op and size, in order), so
the test can tell a matched schedule from one that only happened not to hang.
"""

from __future__ import annotations

import copy
import random
import warnings
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tests.helpers.ds import ds_apply_zero
from tests.helpers.reference import make_adamw
from tests.helpers.user_models import ADAM, SEQ, VOCAB, WIDTH, Block, compare, error_line, slice_of
from zerobench.distributed.collectives import Group
from zerobench.metrics.comm import CommLedger
from zerobench.zero import ZeroConfig

BLOCKS, STEPS = 5, 3


class LayerDrop(nn.Module):
    """Embedding -> five residual blocks, each skipped where ``skip`` names it -> head."""

    def __init__(self, ckpt: bool = False, reverse: bool = False):
        super().__init__()
        self.ckpt, self.reverse = ckpt, reverse
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block() for _ in range(BLOCKS)])
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, x, y, skip=frozenset()):
        h = self.emb(x)
        for i, b in reversed(list(enumerate(self.blocks))) if self.reverse else enumerate(self.blocks):
            if i not in skip:
                h = checkpoint(b, h, use_reentrant=False) if self.ckpt else b(h)
        return F.cross_entropy(self.head(h).reshape(-1, VOCAB), y.reshape(-1))


class Expert(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(WIDTH, 48), nn.Linear(48, WIDTH)

    def forward(self, h):
        return self.fc2(F.gelu(self.fc1(h)))


class MoE(nn.Module):
    """Embedding -> a top-1 mixture of four experts -> head. Each expert is a stage-3 unit, and an expert that no token
    of this rank's batch is routed to is not called (the loop of Mixtral-style MoE layers): which experts run differs
    by rank and step, the case DeepSpeed answers with leaf modules (``set_z3_leaf_modules``)."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)
        self.gate = nn.Linear(WIDTH, 4)
        self.experts = nn.ModuleList([Expert() for _ in range(4)])
        self.head = nn.Linear(WIDTH, VOCAB)
        self.skipped: list[frozenset[int]] = []
        """The experts each forward skipped."""

    def forward(self, x, y, skip=frozenset()):
        flat = self.emb(x).reshape(-1, WIDTH)
        probs = F.softmax(self.gate(flat), -1)
        choice = probs.argmax(-1)
        out, skipped = torch.zeros_like(flat), set()
        for e, expert in enumerate(self.experts):
            idx = (choice == e).nonzero().squeeze(-1)
            if idx.numel() == 0:
                skipped.add(e)
                continue
            out = out.index_add(0, idx, expert(flat[idx]) * probs[idx, e, None])
        self.skipped.append(frozenset(skipped))
        return F.cross_entropy(self.head(flat + out), y.reshape(-1))


def skips_for(pattern: str, world: int, micro_batches: int = STEPS) -> list[list[frozenset[int]]]:
    """``[micro-batch][rank]`` -> the blocks that rank skips in that micro-batch."""
    fixed = {
        "last": [{BLOCKS - 1}],
        "first": [{0}],
        "middle_runs": [{1, 2}, {3}, {0, 4}],  # rank r takes entry r; different units skipped on different ranks
        "all_blocks": [set(range(BLOCKS))],  # rank 0 runs none of them
        "none": [set()],
        "moe": [set()],  # the MoE model's routing decides
    }
    if pattern in fixed:
        per_rank = [frozenset(fixed[pattern][r]) if r < len(fixed[pattern]) else frozenset() for r in range(world)]
        return [per_rank for _ in range(micro_batches)]
    rng = random.Random(7)  # "random": each block dropped with p 0.4, but every block runs on some rank each step
    out = []
    for step in range(micro_batches):
        per_rank = [frozenset(i for i in range(BLOCKS) if rng.random() < 0.4) for _ in range(world)]
        keeper = step % world
        out.append(
            [
                s if r != keeper else frozenset(set(s) - set.intersection(*map(set, per_rank)))
                for r, s in enumerate(per_rank)
            ]
        )
    return out


@dataclass(frozen=True)
class SkipCase:
    pattern: str
    stage: int = 3
    prefetch: bool = True
    plain_backward: bool = False
    """``loss.backward()`` (DDP's loop) instead of ``engine.backward(loss)``."""
    ckpt: bool = False
    """The model checkpoints each block itself (``torch.utils.checkpoint``, non-reentrant)."""
    find_unused: bool = True
    reverse: bool = False
    eval_between: bool = False
    """A forward under ``torch.no_grad()`` (evaluation, no skips) after every step."""
    config: tuple[tuple[str, object], ...] = ()
    """More ``ZeroConfig`` fields (parameter offload, overlap off)."""
    """The forward runs the blocks last to first, out of the units' (registration) order."""

    @property
    def key(self) -> str:
        return "-".join(
            [
                self.pattern,
                f"s{self.stage}",
                *(
                    k
                    for k, on in (
                        ("nopf", not self.prefetch),
                        ("plain", self.plain_backward),
                        ("ckpt", self.ckpt),
                        ("strict", not self.find_unused),
                        ("reverse", self.reverse),
                        ("eval", self.eval_between),
                    )
                    if on
                ),
                *(f"{k}={v}" for k, v in self.config),
            ]
        )


def batches(world: int, micro_batches: int = STEPS) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(3)
    return [
        (torch.randint(0, VOCAB, (2 * world, SEQ), generator=g), torch.randint(0, VOCAB, (2 * world, SEQ), generator=g))
        for _ in range(micro_batches)
    ]


def reference(model: nn.Module, data, skips, world: int, accum: int = 1) -> dict[str, torch.Tensor]:
    """One AdamW step per ``accum`` micro-batches, on the mean of their losses (each the mean over ranks' slices)."""
    ref = copy.deepcopy(model)
    opt = make_adamw(list(ref.parameters()), ADAM)
    for k, ((x, y), per_rank) in enumerate(zip(data, skips)):
        losses = [ref(slice_of(x, r, world), slice_of(y, r, world), per_rank[r]) for r in range(world)]
        (torch.stack(losses).mean() / accum).backward()
        if (k + 1) % accum == 0:
            for (
                p
            ) in ref.parameters():  # unused on every rank: the engine steps on a zero gradient (zero/grads/unused.py)
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            opt.step()
            opt.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in ref.named_parameters()}


def run_skip_cases(rank: int, world: int, cases: list[SkipCase]) -> dict[str, dict]:
    group = Group.of(torch.distributed.new_group(backend="gloo"), "dp")
    out = {}
    for case in cases:
        torch.manual_seed(0)
        model = MoE() if case.pattern == "moe" else LayerDrop(case.ckpt, case.reverse)
        accum = dict(case.config).get("grad_accum_steps", 1)
        data, skips = batches(world, STEPS * accum), skips_for(case.pattern, world, STEPS * accum)
        ledger = CommLedger()
        cfg = ZeroConfig(
            stage=case.stage,
            bucket_numel=2000,
            optimizer=ADAM,
            prefetch=case.prefetch,
            find_unused_parameters=case.find_unused,
            **dict(case.config),
        )
        mine = copy.deepcopy(model)
        engine = ds_apply_zero(
            mine, group, cfg, ledger=ledger, units=list(mine.experts) if case.pattern == "moe" else None
        )

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            res = {"error": error_line(lambda: _train(engine, case, data, skips, rank, world))}  # noqa: B023
        res["warnings"] = [str(w.message) for w in caught if "out of the units' order" in str(w.message)]
        res["collectives"] = [(r.op, r.numel, r.tag) for r in ledger.records]
        res["experts_skipped"] = getattr(engine.module, "skipped", [])
        if res["error"] is None:
            res.update(compare(engine, model, reference(model, data, skips, world, accum)))
        out[case.key] = res
    return out


def _train(engine, case: SkipCase, data, skips, rank: int, world: int) -> None:
    for (x, y), per_rank in zip(data, skips):
        loss = engine.module(slice_of(x, rank, world), slice_of(y, rank, world), per_rank[rank])
        loss.backward() if case.plain_backward else engine.backward(loss)
        engine.step()  # at a window's end: the optimizer step, then zero_grad()
        if case.eval_between:
            with torch.no_grad():
                engine.module(slice_of(x, rank, world), slice_of(y, rank, world))
