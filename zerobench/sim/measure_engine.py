"""The profiler's measurements of the engine itself: its per-element costs (optimizer step, copy, add, memset)
and its own host work per step and per block at each stage, each as a bench timed in replicates.
"""

from __future__ import annotations

import statistics
import time
from functools import partial

import torch

from zerobench.models.config import GPTConfig
from zerobench.sim.clocks import sync
from zerobench.sim.costs import Linear
from zerobench.sim.measure_compute import mean_time


def median_difference(a, b, reps: int, barrier=None) -> float:
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


ELEMENT_SIZES = {"cpu": (1 << 14, 1 << 17, 1 << 20, 1 << 22), "cuda": (1 << 18, 1 << 22, 1 << 24, 1 << 26)}
"""Elements at which the per-element costs are timed (a Linear through them)."""
ENGINE_LAYERS = (2, 8)
"""Blocks of the two engine models whose difference gives the engine's host work per block."""


class ElementBench:
    """The engine's per-element costs at ``n`` elements: ``adamw`` (its ``ShardedAdamW`` step, per fp32 partition
    element), ``copy``, ``add`` (autograd accumulating into an existing ``.grad``) and ``memset``, per byte. On a
    GPU the device's time in a stream of such calls (``device_time``)."""

    def __init__(self, n: int, kernels: str = "auto", device: torch.device | None = None):
        from zerobench.zero.config import AdamWConfig
        from zerobench.zero.optim.adamw import ShardedAdamW

        self.n, self.device = n, device or torch.device("cpu")
        master, self.grad = torch.randn(n, device=self.device), torch.randn(n, device=self.device)
        self.opt = ShardedAdamW(AdamWConfig(), [master], [[(0, n)]], kernel_mode=kernels)
        self.src, self.dst = torch.randn(n, device=self.device), torch.empty(n, device=self.device)
        cpu = self.device.type == "cpu"
        self.reps = (2 if n >= 1 << 20 else 5) if cpu else 10

    def replicate(self, barrier=None) -> dict[str, float]:
        """Seconds of each call at ``n`` elements, a mean over a few calls."""

        def timed(fn):
            if self.device.type == "cpu":
                return mean_time(fn, self.reps, barrier)
            return device_time(fn, self.reps, self.device, barrier)

        return {
            "adamw": timed(partial(self.opt.step, [self.grad], 1.0)),
            "copy": timed(partial(self.dst.copy_, self.src)),
            "add": timed(partial(self.dst.add_, self.src)),
            "memset": timed(self.dst.zero_),
        }


def element_lines(points: dict[int, dict[str, float]]) -> dict[str, Linear]:
    """The per-element lines from each size's costs (``ElementBench.replicate`` values by ``n``): ``adamw`` per
    element, the others per byte (fp32)."""
    names = next(iter(points.values())).keys()
    return {k: Linear.fit([(n if k == "adamw" else 4 * n, v[k]) for n, v in sorted(points.items())]) for k in names}


def time_per_element(barrier=None, kernels: str = "auto", device: torch.device | None = None) -> dict[str, Linear]:
    """The engine's per-element costs (``ElementBench``) as lines, one replicate at each size."""
    device = device or torch.device("cpu")
    sizes = ELEMENT_SIZES["cpu" if device.type == "cpu" else "cuda"]
    return element_lines({n: ElementBench(n, kernels, device).replicate(barrier) for n in sizes})


class EngineBench:
    """The engine's own host work per step at one stage and depth: a GPT too small to compute anything (hidden 8)
    trained with the engine and without it, the difference (``replicate``). It is the per-parameter hooks,
    stage 3's gather/free bookkeeping and the step's checks; on one rank the collectives are copies (they are
    the collective curves' cost). Needs a default process group of one rank (``init_fake_world(1, 0)``). On a
    GPU both steps end by waiting for the device, and both are the host's work (the device idles between
    kernels)."""

    def __init__(self, stage: int, layers: int, kernels: str = "auto", device: torch.device | None = None):
        from zerobench.distributed.mesh import build_mesh
        from zerobench.models.gpt import GPT
        from zerobench.parallel.parallelize import ParallelSpec, parallelize
        from zerobench.zero.config import ZeroConfig

        self.device = device = device or torch.device("cpu")
        self.x = torch.randint(0, 16, (2, 4), device=device)
        cfg = GPTConfig(layers=layers, hidden=8, heads=1, vocab=16, seq=4)
        torch.manual_seed(0)
        self.plain, self.model = GPT(cfg).to(device), GPT(cfg).to(device)
        parallelize(self.plain, build_mesh(1), ParallelSpec(zero=None, kernels=kernels))
        self.eng = parallelize(
            self.model, build_mesh(1), ParallelSpec(zero=ZeroConfig(stage=stage), kernels=kernels)
        ).engine

    def _plain(self):
        self.plain(self.x, self.x).backward()
        for p in self.plain.parameters():
            p.grad = None
        sync(self.device)

    def _engine(self):
        self.eng.backward(self.model(self.x, self.x))
        self.eng.step()
        self.eng.zero_grad()
        sync(self.device)

    def replicate(self, pairs: int = 20, barrier=None) -> float:
        """The median over ``pairs`` interleaved pairs of (engine step - plain step), seconds."""
        return median_difference(self._engine, self._plain, pairs, barrier)


def engine_line(per_layers: dict[int, float]) -> Linear:
    """α per step + β per block through the engine's host work at ``ENGINE_LAYERS`` blocks."""
    (l0, o0), (l1, o1) = sorted(per_layers.items())
    beta = max((o1 - o0) / (l1 - l0), 0.0)
    return Linear(max(o0 - l0 * beta, 0.0), beta)


def time_engine_overhead(barrier=None, kernels: str = "auto", device: torch.device | None = None) -> dict[str, Linear]:
    """The engine's own host work per step, per stage (``engine_s{stage}``: α per step + β per block), one
    replicate of 60 pairs at each depth (``EngineBench``)."""
    return {
        f"engine_s{stage}": engine_line(
            {n: EngineBench(stage, n, kernels, device).replicate(60, barrier) for n in ENGINE_LAYERS}
        )
        for stage in range(4)
    }
