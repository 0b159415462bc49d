"""In-process measurements of ``zerobench profile``: one TP rank's compute at a configuration's exact shape,
timed in replicates (``ComputeBench``); the engine's own costs are ``measure_engine``'s.

The model is the production one: ``GPT`` -> ``parallelize`` (TP, fused kernels, activation checkpointing;
no ZeRO) on a ``fake`` process group of TP ranks, so TP's collectives cost nothing here (they are profiled
as collectives) and the matmuls have the shapes of one TP rank. A step is split by timestamps taken in
module hooks (forward) and tensor hooks (backward); on CPU autograd runs on the calling thread, so the
stamps bound each piece exactly. On a GPU the stamps are CUDA events on the stream and, in a second
pass, the host's cost to issue each piece (``zerobench.sim.clocks``).
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from functools import partial

import torch

from zerobench.models.config import GPTConfig
from zerobench.sim.clocks import DeviceClock, HostClock, LaunchClock
from zerobench.sim.profile import LAUNCH, op_key
from zerobench.sim.replicates import stalls

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

STATISTIC = "mean"
"""What a profile entry is of its samples. A step is the sum of many pieces (blocks, collectives,
synchronisations), and the median over steps of such a sum sits near the sum of the pieces' *means*, not of
their medians, when the pieces have heavy tails, as scheduling hiccups on a shared host give them: in a TP 2
mini run on the 2-core Xeon VM a 128 KiB all-reduce took, once both ranks had arrived, 0.61 ms at the median
and 1.13 ms on average, and the ranks arrived 0.33 ms apart at the median, 0.68 ms on average. Profiles
recorded before this (rows without ``statistic``) hold medians."""
expected = statistics.fmean


def skew_mean(samples: list[float], cut: int = 8) -> float:
    """The mean of ``samples`` less their largest ``1/cut`` (rounded down): an event rarer than one sample in
    ``cut`` is a stall the median step escapes, not a cost every step pays (``measure._sync_penalty``)."""
    kept = sorted(samples)[: len(samples) - len(samples) // cut]
    return statistics.fmean(kept)


WARM_S = 2.0
"""Seconds of steps a GPU runs before a shape is timed: an idle card starts at a fraction of its clock (an H200
read 345 MHz idle, 1980 MHz under load), and the first steps compile and autotune kernels."""


@dataclass(frozen=True)
class Shape:
    """One compute shape to profile (what ``op_key`` keys on, less the processes and threads)."""

    model: GPTConfig
    micro_batch: int
    tp: int
    precision: str
    kernels: str
    checkpoint: bool


class _Stamps:
    """Timestamps of one forward + backward, from hooks on the blocks and on their activations (marks of
    ``self.clock``, a ``zerobench.sim.clocks`` clock set before each step)."""

    def __init__(self, blocks: list[torch.nn.Module]):
        self.phase = "idle"
        self.clock = HostClock()
        self.fwd_pre: dict[int, float] = {}
        self.fwd_post: dict[int, float] = {}
        self.bwd_start: dict[int, float] = {}
        self.bwd_end: dict[int, float] = {}
        for i, blk in enumerate(blocks):
            blk.register_forward_pre_hook(self._pre(i))
            blk.register_forward_hook(self._post(i))

    def _pre(self, i: int):
        def hook(_mod, args):
            if self.phase != "fwd":
                return
            self.fwd_pre[i] = self.clock.stamp()
            x = args[0]
            if x.requires_grad:
                x.register_hook(lambda g: self.bwd_end.__setitem__(i, self.clock.stamp()))

        return hook

    def _post(self, i: int):
        def hook(_mod, _args, out):
            if self.phase != "fwd":
                return
            self.fwd_post[i] = self.clock.stamp()
            out.register_hook(lambda g: self.bwd_start.__setitem__(i, self.clock.stamp()))

        return hook


def _one_step(model, stamps: _Stamps, x, y, last: int) -> dict[str, float]:
    clock = stamps.clock
    stamps.phase = "fwd"
    t0 = clock.stamp()
    loss = model(x, y)
    t1 = clock.stamp()
    stamps.phase = "bwd"
    loss.backward()
    t2 = clock.stamp()
    stamps.phase = "idle"
    clock.finish()
    for p in model.parameters():
        p.grad = None
    L = last + 1
    sec = clock.seconds
    fpre, fpost = [sec(stamps.fwd_pre[i]) for i in range(L)], [sec(stamps.fwd_post[i]) for i in range(L)]
    bstart, bend = [sec(stamps.bwd_start[i]) for i in range(L)], [sec(stamps.bwd_end[i]) for i in range(L)]
    t0, t1, t2 = sec(t0), sec(t1), sec(t2)
    return {
        "embed_fwd": fpre[0] - t0,
        "block_fwd": expected(fpost[i] - fpre[i] for i in range(L)),
        "head_fwd": t1 - fpost[last],
        "head_bwd": bstart[last] - t1,
        "block_bwd": expected(bend[i] - bstart[i] for i in range(L)),
        "embed_bwd": t2 - bend[0],
    }


class ComputeBench:
    """One shape's production model, timed in replicates (``replicate``): each a warm-up step, then ``steps``
    steps with a ``barrier()`` before each (the host's concurrent profilers step together). On a GPU the card is
    first run up to its working clocks, and each replicate reads the pieces on both clocks (device, then
    launch). ``plant``: test-only (``measure.Plant``): busy waiting in block 0's forward while it has replicates
    left."""

    def __init__(self, shape: Shape, device: torch.device | None = None, plant=None):
        self.device = device or torch.device("cpu")
        self.model, self.x, self.y = shape_model(shape, self.device)
        self.last = len(self.model.blocks) - 1
        self.stamps = _Stamps(list(self.model.blocks))
        self.clocks = (
            [("", HostClock)]
            if self.device.type == "cpu"
            else [("", partial(DeviceClock, self.device)), (LAUNCH, partial(LaunchClock, self.device))]
        )
        self.plant = plant
        if plant:
            self.model.blocks[0].register_forward_pre_hook(self._planted)
        if self.device.type == "cuda":  # the card up to its working clocks, and out of first-use compilation
            t_end = time.perf_counter() + WARM_S
            while time.perf_counter() < t_end:
                self._step()
        for _ in range(2):  # first steps: the allocator's pool, kernels' first use
            self._step()

    def _planted(self, _mod, _args):
        if self.stamps.phase == "fwd" and self.plant.replicates > 0:
            end = time.perf_counter() + self.plant.seconds
            while time.perf_counter() < end:
                pass

    def _step(self) -> dict[str, float]:
        return _one_step(self.model, self.stamps, self.x, self.y, self.last)

    def replicate(self, steps: int, barrier=None) -> dict[str, float]:
        """Each piece's mean over ``steps`` steps less those that stalled (``replicates.stall_free_mean`` on the
        steps' totals: a run's median step never pays a stall fewer than half its steps meet)."""
        out: dict[str, float] = {}
        for suffix, clock in self.clocks:
            self.stamps.clock = clock()
            self._step()  # after other units ran: this shape's working set back in the caches
            got = []
            for _ in range(steps):
                if barrier is not None:
                    barrier()
                self.stamps.clock = clock()
                got.append(self._step())
            drop = stalls([sum(g.values()) for g in got])
            kept = [g for g, d in zip(got, drop) if not d]
            out.update({k + suffix: expected(g[k] for g in kept) for k in got[0]})
        return out


def time_compute(
    shape: Shape, reps: int = 15, warmup: int = 2, barrier=None, device: torch.device | None = None
) -> dict[str, float]:
    """Mean seconds (``STATISTIC``) of each piece of one forward + backward of ``shape``, one replicate of ``reps``
    steps (needs a default process group of ``shape.tp`` ranks, e.g. ``init_fake_world(tp, 0)``; ``warmup`` is
    kept for callers: the bench warms up on its own). On a GPU each piece is read twice: on the device's
    stream (``DeviceClock``) and as the host's cost to issue it (``LaunchClock``, keys ending in ``LAUNCH``)."""
    del warmup
    return ComputeBench(shape, device).replicate(reps, barrier)


def shape_key(op: str, s: Shape, ranks: int, threads: int) -> str:
    """The profile's key of piece ``op`` of shape ``s`` measured with ``ranks`` processes of ``threads`` threads."""
    m = s.model
    return op_key(
        op,
        b=s.micro_batch,
        s=m.seq,
        h=m.hidden,
        heads=m.heads,
        vocab=m.vocab,
        tp=s.tp,
        dtype=s.precision,
        kernels=s.kernels,
        checkpoint=s.checkpoint,
        ranks=ranks,
        threads=threads,
    )


def shape_model(shape: Shape, device: torch.device):
    """The production GPT of ``shape`` (TP-sharded, fused kernels, checkpointing; no ZeRO) and a batch."""
    from zerobench.distributed.mesh import build_mesh
    from zerobench.models.gpt import GPT
    from zerobench.parallel.config import ActivationConfig
    from zerobench.parallel.parallelize import ParallelSpec, parallelize

    torch.manual_seed(0)
    model = GPT(shape.model)
    spec = ParallelSpec(zero=None, kernels=shape.kernels, activation=ActivationConfig(checkpoint=shape.checkpoint))
    parallelize(model, build_mesh(shape.tp), spec)
    model.to(device=device, dtype=DTYPES[shape.precision])
    g = torch.Generator().manual_seed(0)
    x = torch.randint(0, shape.model.vocab, (shape.micro_batch, shape.model.seq), generator=g).to(device)
    y = torch.randint(0, shape.model.vocab, (shape.micro_batch, shape.model.seq), generator=g).to(device)
    return model, x, y


def mean_time(fn, reps: int, barrier=None) -> float:
    """Mean seconds (``STATISTIC``) of ``fn()`` over ``reps`` calls after one warm-up (``barrier()`` before each)."""
    fn()
    ts = []
    for _ in range(reps):
        if barrier is not None:
            barrier()
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return expected(ts)
