"""Users' own models (not the built-in GPT) trained by the engine inside spawned ranks, and compared with
single-process ``torch.optim.AdamW`` training on the same global batch.

The models cover what plain PyTorch code does that a GPT does not: an embedding into an MLP stack,
frozen layers, weights tied across stage-3 units (adjacent and far apart), a unit without parameters,
every parameter inside ``blocks`` (a root without parameters), checkpointing called by the model itself
(``torch.utils.checkpoint``, non-reentrant and re-entrant), one block called twice in a forward (weights shared across
depth: at stage 3 its unit is gathered, freed and re-gathered within one pass), and parameters of very
different sizes (a 0-dim scale, a 2-element vector, a 7200-element matrix). Each rank trains on its slice
of the global batch; the reference takes the mean of the per-slice losses, which is the same objective.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from tests.helpers.ds import ds_apply_zero
from tests.helpers.reference import make_adamw
from zerobench.distributed.collectives import Group
from zerobench.zero import ZeroConfig
from zerobench.zero.config import AdamWConfig
from zerobench.zero.state.shards import full_parameters

VOCAB, WIDTH, HIDDEN, SEQ = 40, 24, 300, 4
ADAM = AdamWConfig(lr=1e-2, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


class Block(nn.Module):
    """Residual MLP block: ``fc1`` has 24 x 300 = 7200 weights."""

    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(WIDTH, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, WIDTH)

    def forward(self, h, skip_fc2: bool = False):
        a = F.gelu(self.fc1(h))
        return h + (a[..., :WIDTH] if skip_fc2 else self.fc2(a))


class MLP(nn.Module):
    """Embedding -> blocks -> head, with a 0-dim scale and a 2-element shift at the root."""

    def __init__(self, variant: str = "mlp"):
        super().__init__()
        self.variant = variant
        self.emb = nn.Embedding(VOCAB, WIDTH)
        blocks: list[nn.Module] = [Block(), Block(), Block()]
        if variant == "paramfree_unit":
            blocks.insert(1, nn.GELU())
        self.blocks = nn.ModuleList(blocks)
        self.scale = nn.Parameter(torch.tensor(1.5))
        self.pair = nn.Parameter(torch.tensor([0.3, -0.2]))
        self.head = nn.Linear(WIDTH, VOCAB)
        self.norm = nn.BatchNorm1d(WIDTH) if variant == "batchnorm" else None  # running statistics: buffers
        if variant == "frozen":
            self.blocks[1].requires_grad_(False)
            self.pair.requires_grad_(False)
        elif variant == "tied_far":
            self.blocks[2].fc1.weight = self.blocks[0].fc1.weight
        elif variant == "tied_adjacent":
            self.blocks[1].fc2.weight = self.blocks[0].fc2.weight
        elif variant == "tied_root":
            self.head.weight = self.emb.weight  # tied at the root, as a language model's head

    def forward(self, x, y, skip: int | None = None):
        h = self.emb(x)
        if self.norm is not None:
            h = self.norm(h.reshape(-1, WIDTH)).view_as(h)
        for i, b in enumerate(self.blocks):
            if i == skip:  # the block runs, its fc2 does not (stage 3 needs every rank to run every unit)
                h = b(h, skip_fc2=True)
                continue
            if self.variant in ("user_ckpt", "user_ckpt_reentrant"):
                h = checkpoint(b, h, use_reentrant=self.variant == "user_ckpt_reentrant")
            else:
                h = b(h)
            if self.variant == "reused" and i == 1:
                h = b(h)
        logits = self.head(h * self.pair[0] + self.pair[1]) * self.scale
        return F.cross_entropy(logits.reshape(-1, VOCAB), y.reshape(-1))


class _Embed(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, WIDTH)

    def forward(self, x):
        return self.emb(x)


class Stack(nn.Module):
    """Every parameter inside ``blocks``: the root unit owns none."""

    def __init__(self):
        super().__init__()
        self.blocks = nn.ModuleList([_Embed(), Block(), nn.Linear(WIDTH, VOCAB)])

    def forward(self, x, y, skip: int | None = None):
        h = x
        for b in self.blocks:
            h = b(h)
        return F.cross_entropy(h.reshape(-1, VOCAB), y.reshape(-1))


def make_model(variant: str) -> nn.Module:
    torch.manual_seed(0)
    return Stack() if variant == "all_in_blocks" else MLP(variant)


def batches(steps: int, global_batch: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    g = torch.Generator().manual_seed(11)
    return [
        (
            torch.randint(0, VOCAB, (global_batch, SEQ), generator=g),
            torch.randint(0, VOCAB, (global_batch, SEQ), generator=g),
        )
        for _ in range(steps)
    ]


def slice_of(t: torch.Tensor, rank: int, world: int) -> torch.Tensor:
    mb = t.shape[0] // world
    return t[rank * mb : (rank + 1) * mb]


def reference_loss(model, x, y, world: int, skip_on_rank0: int | None = None) -> torch.Tensor:
    """The global objective: the mean over DP slices of each slice's mean loss."""
    losses = [
        model(slice_of(x, r, world), slice_of(y, r, world), skip_on_rank0 if r == 0 else None) for r in range(world)
    ]
    return torch.stack(losses).mean()


def reference_params(model, data, world: int, skip_on_rank0: int | None = None, windows: int = 1) -> dict:
    """Train a copy with ``torch.optim.AdamW`` (decay on 2+-dim parameters): one step per entry of
    ``data`` after ``windows`` backward passes of it (accumulated, as torch does without ``zero_grad``)."""
    ref = copy.deepcopy(model)
    opt = make_adamw([p for p in ref.parameters() if p.requires_grad], ADAM)
    for x, y in data:
        for _ in range(windows):
            reference_loss(ref, x, y, world, skip_on_rank0).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return {n: p.detach().clone() for n, p in ref.named_parameters()}


@dataclass(frozen=True)
class UserCase:
    variant: str
    stage: int
    steps: int = 3
    global_batch: int = 6
    bucket_numel: int = 5000

    @property
    def key(self) -> str:
        return f"{self.variant}-s{self.stage}"


def engine_for(model, group: Group, stage: int, bucket_numel: int = 5000, ledger=None, **kw):
    cfg = ZeroConfig(stage=stage, bucket_numel=bucket_numel, **{"optimizer": ADAM, **kw})
    return ds_apply_zero(model, group, cfg, ledger=ledger)


def compare(engine, model_before, ref: dict[str, torch.Tensor]) -> dict:
    """How far the engine's parameters are from the reference: the largest element difference and the
    relative L2 error of the whole update, ||θ - θ_ref|| / ||θ_ref - θ_0||. Trained parameters are read
    from the engine's fp32 master, frozen ones from the module; ``max_update`` shows the reference moved."""
    full = full_parameters(engine)
    frozen = {n: p for n, p in engine.module.named_parameters() if not p.requires_grad}
    init = dict(model_before.named_parameters())
    diff = moved = num = den = 0.0
    for n, r in ref.items():
        got = full[n] if n in full else frozen[n]
        d, u = got.float() - r, r - init[n].detach()
        diff, moved = max(diff, d.abs().max().item()), max(moved, u.abs().max().item())
        num, den = num + d.pow(2).sum().item(), den + u.pow(2).sum().item()
    missing = sorted(set(ref) - set(full) - set(frozen))
    return {"max_diff": diff, "update_rel_err": (num / max(den, 1e-30)) ** 0.5, "max_update": moved, "missing": missing}


def run_user_cases(rank: int, world: int, cases: list[UserCase]) -> dict[str, dict]:
    group = Group.of(torch.distributed.new_group(backend="gloo"), "dp")
    out = {}
    for case in cases:
        model = make_model(case.variant)
        data = batches(case.steps, case.global_batch)
        try:
            engine = engine_for(copy.deepcopy(model), group, case.stage, case.bucket_numel)
            for x, y in data:
                engine.backward(engine.module(slice_of(x, rank, world), slice_of(y, rank, world)))
                engine.step()
                engine.zero_grad()
            out[case.key] = compare(engine, model, reference_params(model, data, world))
        except Exception as e:  # noqa: BLE001 - one case's failure is that case's result, not the grid's
            out[case.key] = {"error": f"{type(e).__name__}: {e}"}
            group.pg and torch.distributed.barrier()
    return out


def error_line(fn) -> str | None:
    """``fn()``'s exception as ``Type: message`` (what the tests compare across ranks), None if it returned."""
    try:
        fn()
    except Exception as e:  # noqa: BLE001 - the test asserts on the message every rank saw
        return f"{type(e).__name__}: {e}"
    return None


def run_api_checks(rank: int, world: int, stage: int) -> dict:
    """The engine's training API against ``torch.optim``'s semantics, on one stage."""
    group = Group.of(None, "dp")
    model = make_model("mlp")
    data = batches(2, 6)
    x, y = (slice_of(t, rank, world) for t in data[0])
    out: dict = {}

    # A step with no gradient since zero_grad() (or ever) changes nothing, as torch.optim skips grad None.
    engine = engine_for(copy.deepcopy(model), group, stage)
    before = full_parameters(engine)
    out["noop_first_returned"] = engine.step()
    engine.backward(engine.module(x, y))
    engine.step()
    engine.zero_grad()
    trained = full_parameters(engine)
    out["noop_again_returned"] = engine.step()
    after = full_parameters(engine)
    out["noop_first_moved"] = max((trained[n] - before[n]).abs().max().item() for n in before)
    out["noop_again_moved"] = max((after[n] - trained[n]).abs().max().item() for n in after)
    out["step_count"] = engine.adamw.step_count

    # Two backward windows without zero_grad() in between accumulate (g_A + g_B), as torch does.
    engine = engine_for(copy.deepcopy(model), group, stage)
    for _ in range(2):
        engine.backward(engine.module(x, y))
    engine.step()
    out["accumulate"] = compare(engine, model, reference_params(model, data[:1], world, windows=2))

    # A parameter unused on one rank only (several buckets): every rank fails with the same clear error...
    engine = engine_for(copy.deepcopy(model), group, stage, bucket_numel=2000)

    def unused_step():
        engine.backward(engine.module(x, y, 1 if rank == 0 else None))
        engine.step()

    out["unused_error"] = error_line(unused_step)
    # A parameter skipped in one micro-batch of a window but used in the other is not unused (the flags are the
    # window's); the step is applied.
    engine = engine_for(copy.deepcopy(model), group, stage, bucket_numel=2000, grad_accum_steps=2)

    def window_step():
        for skip in (1 if rank == 0 else None, None):
            engine.backward(engine.module(x, y, skip))
            applied = engine.step()
        return applied

    out["skipped_in_one_micro"] = error_line(window_step)
    out["skipped_in_one_micro_applied"] = engine.global_steps == 1 and engine.was_step_applied()
    # ...and with find_unused_parameters=True, the skipping rank contributes a zero gradient.
    engine = engine_for(copy.deepcopy(model), group, stage, bucket_numel=2000, find_unused_parameters=True)
    for xs, ys in data:
        engine.backward(engine.module(slice_of(xs, rank, world), slice_of(ys, rank, world), 1 if rank == 0 else None))
        engine.step()
        engine.zero_grad()
    out["unused_supported"] = compare(engine, model, reference_params(model, data, world, skip_on_rank0=1))
    out.update(_read_params(rank, world, stage, model, data))
    return out


def _read_params(rank: int, world: int, stage: int, model, data) -> dict:
    """Reading the module's parameters outside forward: never a crash; at stage 3 gathered on request."""
    group = Group.of(None, "dp")
    engine = engine_for(copy.deepcopy(model), group, stage)
    xs, ys = data[0]
    engine.backward(engine.module(slice_of(xs, rank, world), slice_of(ys, rank, world)))
    engine.step()
    engine.zero_grad()
    w = engine.module.blocks[0].fc1.weight
    out = {"repr": repr(w)[:40], "sum_shape": tuple(w.detach().sum(0).shape)}
    out["deepcopy_params"] = sum(p.numel() for p in copy.deepcopy(engine.module).parameters())
    out["state_dict_error"] = error_line(engine.module.state_dict)
    master = full_parameters(engine)
    with engine.gathered_params():
        sd = {k: v.clone() for k, v in engine.module.state_dict().items()}
        out["gathered_shape"] = tuple(engine.module.blocks[0].fc1.weight.shape)
    out["gathered_diff"] = max((sd[n].float() - master[n]).abs().max().item() for n in master)
    out["after_gather_numel"] = engine.module.blocks[0].fc1.weight.numel()
    # Training goes on unchanged after reading.
    xs, ys = data[1]
    engine.backward(engine.module(slice_of(xs, rank, world), slice_of(ys, rank, world)))
    engine.step()
    out["after_read"] = compare(engine, model, reference_params(model, data, world))
    return out
