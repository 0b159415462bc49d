"""In-process measurements of ``zerobench profile``: one TP rank's compute at a configuration's exact shape,
and the engine's per-element costs (optimizer step, copy, memset).

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
from zerobench.sim.clocks import DeviceClock, HostClock, LaunchClock, sync
from zerobench.sim.profile import LAUNCH, Linear

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


def time_compute(
    shape: Shape, reps: int = 15, warmup: int = 2, barrier=None, device: torch.device | None = None
) -> dict[str, float]:
    """Mean seconds (``STATISTIC``) of each piece of one forward + backward of ``shape`` (needs a default process group
    of ``shape.tp`` ranks, e.g. ``init_fake_world(tp, 0)``). ``barrier()`` is called before every step so
    that the host's concurrent profilers run their steps together. On a GPU each piece is read twice: on the
    device's stream (``DeviceClock``) and as the host's cost to issue it (``LaunchClock``, keys ending in
    ``LAUNCH``)."""
    device = device or torch.device("cpu")
    model, x, y = shape_model(shape, device)
    stamps = _Stamps(list(model.blocks))
    clocks = (
        [("", HostClock)]
        if device.type == "cpu"
        else [("", partial(DeviceClock, device)), (LAUNCH, partial(LaunchClock, device))]
    )
    out: dict[str, float] = {}
    if device.type == "cuda":  # run the card up to its working clocks (and out of first-use compilation) first
        t_end = time.perf_counter() + WARM_S
        while time.perf_counter() < t_end:
            _one_step(model, stamps, x, y, len(model.blocks) - 1)
    for suffix, clock in clocks:
        samples: dict[str, list[float]] = {}
        for i in range(warmup + reps):
            if barrier is not None:
                barrier()
            stamps.clock = clock()
            got = _one_step(model, stamps, x, y, len(model.blocks) - 1)
            if i >= warmup:
                for k, v in got.items():
                    samples.setdefault(k, []).append(v)
        out.update({k + suffix: expected(v) for k, v in samples.items()})
    return out


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


def _median_difference(a, b, reps: int, barrier=None) -> float:
    """Median over interleaved pairs of (time of ``a`` - time of ``b``): drift cancels within a pair (the median,
    not ``STATISTIC``: a difference's tails are both sides' noise, not the work measured)."""
    a(), b()
    diffs = []
    for _ in range(reps):
        if barrier is not None:
            barrier()
        t0 = time.perf_counter()
        a()
        t1 = time.perf_counter()
        b()
        diffs.append((t1 - t0) - (time.perf_counter() - t1))
    return statistics.median(diffs)


def device_time(fn, reps: int, device: torch.device, barrier=None) -> float:
    """Mean seconds of ``fn()`` on ``device``'s stream, ``reps`` calls issued back to back between two events
    (after one warm-up): what a kernel costs in a stream of work, without a synchronisation per call."""
    fn()
    if barrier is not None:
        barrier()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(reps):
        fn()
    end.record()
    sync(device)
    return start.elapsed_time(end) / 1e3 / reps


def time_per_element(barrier=None, kernels: str = "auto", device: torch.device | None = None) -> dict[str, Linear]:
    """The engine's per-element costs: ``adamw`` (its ``ShardedAdamW`` step, per fp32 partition element),
    ``copy``, ``add`` (autograd accumulating into an existing ``.grad``) and ``memset``, per byte. On a GPU
    the device's time in a stream of such calls (``device_time``), at sizes up to 64 Mi elements."""
    from zerobench.zero.config import AdamWConfig
    from zerobench.zero.optim.adamw import ShardedAdamW

    device = device or torch.device("cpu")
    cpu = device.type == "cpu"
    out: dict[str, list[tuple[float, float]]] = {"adamw": [], "copy": [], "add": [], "memset": []}
    for n in (1 << 14, 1 << 17, 1 << 20, 1 << 22) if cpu else (1 << 18, 1 << 22, 1 << 24, 1 << 26):
        master = torch.randn(n, device=device)
        grad = torch.randn(n, device=device)
        opt = ShardedAdamW(AdamWConfig(), [master], [[(0, n)]], kernel_mode=kernels)
        reps = (3 if n >= 1 << 20 else 10) if cpu else 20

        def timed(fn, reps=reps):
            return mean_time(fn, reps, barrier) if cpu else device_time(fn, reps, device, barrier)

        out["adamw"].append((n, timed(partial(opt.step, [grad], 1.0))))
        src, dst = torch.randn(n, device=device), torch.empty(n, device=device)
        out["copy"].append((4 * n, timed(partial(dst.copy_, src))))
        out["add"].append((4 * n, timed(partial(dst.add_, src))))
        out["memset"].append((4 * n, timed(dst.zero_)))
    return {k: Linear.fit(v) for k, v in out.items()}


def time_engine_overhead(barrier=None, kernels: str = "auto", device: torch.device | None = None) -> dict[str, Linear]:
    """The engine's own host work per step, per stage (``engine_s{stage}``: α per step + β per block): a GPT
    too small to compute anything (hidden 8) at 2 and 8 blocks, trained with the engine and without it,
    the difference fitted through both. It is the per-parameter hooks, stage 3's gather/free
    bookkeeping and the step's checks; on one rank the collectives are copies (they are the collective
    curves' cost). Needs a default process group of one rank (``init_fake_world(1, 0)``). On a GPU both
    steps end by waiting for the device, and both are the host's work (the device idles between kernels)."""
    from zerobench.distributed.mesh import build_mesh
    from zerobench.models.gpt import GPT
    from zerobench.parallel.parallelize import ParallelSpec, parallelize
    from zerobench.zero.config import ZeroConfig

    device = device or torch.device("cpu")
    x = torch.randint(0, 16, (2, 4), device=device)
    out = {}
    for stage in range(4):
        over = []
        for layers in (2, 8):
            cfg = GPTConfig(layers=layers, hidden=8, heads=1, vocab=16, seq=4)
            torch.manual_seed(0)
            plain, model = GPT(cfg).to(device), GPT(cfg).to(device)
            parallelize(plain, build_mesh(1), ParallelSpec(zero=None, kernels=kernels))
            eng = parallelize(model, build_mesh(1), ParallelSpec(zero=ZeroConfig(stage=stage), kernels=kernels)).engine

            def plain_step(plain=plain):
                plain(x, x).backward()
                for p in plain.parameters():
                    p.grad = None
                sync(device)

            def engine_step(model=model, eng=eng):
                eng.backward(model(x, x))
                eng.step()
                eng.zero_grad()
                sync(device)

            over.append(_median_difference(engine_step, plain_step, 60, barrier))
        beta = max((over[1] - over[0]) / 6, 0.0)
        out[f"engine_s{stage}"] = Linear(max(over[0] - 2 * beta, 0.0), beta)
    return out
