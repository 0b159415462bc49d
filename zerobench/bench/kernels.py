"""``zerobench bench-kernels``: the optimizer kernels measured side by side, as result rows.

AdamW over one flat fp32 partition (ZeRO's optimizer step; ZeRO-Offload's host step) by every candidate,
interleaved round by round in one process (A B C ... A B C ...) so drifting clocks and neighbours hit all
of them alike, with preallocated state. Each round also times a *bandwidth-limit kernel* with AdamW's exact
access pattern (read p, g, m, v; write p, m, v in place: 28 bytes per element) and trivial arithmetic; a
candidate's figure is the median over rounds of (limit time / candidate time) — its fraction of what the
memory system allows — and of its time relative to torch's fused AdamW.

CPU candidates: torch AdamW (foreach and fused), zerobench's C++ kernel, DeepSpeed's ``DeepSpeedCPUAdam``
when importable (never required). CUDA: torch fused AdamW, zerobench's Triton kernel, and the device-copy
bandwidth of the same 28 B/element; plus bias+GeLU and LayerNorm against eager and ``torch.compile``.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

import torch

import kernels
from kernels import cpu as kcpu
from zerobench.bench.stats import median_ratio

BYTES_PER_ELEMENT = 28  # 4 fp32 reads + 3 fp32 writes


@dataclass(frozen=True)
class KernelBenchConfig:
    """What ``bench-kernels`` measures."""

    numel: int = 50_000_000
    """Elements of the flat fp32 partition."""
    rounds: int = 7
    """Interleaved rounds (each runs every candidate once); the medians are over rounds."""
    warmup: int = 1
    """Untimed rounds first (page faults, JIT builds, caches)."""
    device: str = "cpu"
    """``cpu`` or ``cuda``."""
    deepspeed: bool = True
    """Include DeepSpeed's CPUAdam when it is importable."""


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _torch_adamw(p: torch.Tensor, fused: bool) -> Callable[[], None]:
    p = p.clone().requires_grad_()
    p.grad = torch.randn_like(p) * 1e-3
    opt = torch.optim.AdamW([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, fused=fused, foreach=not fused)
    return opt.step


def _zerobench_adamw(p: torch.Tensor) -> Callable[[], None]:
    p = p.clone()
    g, m, v = torch.randn_like(p) * 1e-3, torch.zeros_like(p), torch.zeros_like(p)
    blocks = kernels.adamw_blocks(p.numel(), [(0, p.numel())], p.device)
    state = {"step": 0}

    def step() -> None:
        state["step"] += 1
        kernels.fused_adamw_(
            p, g, m, v, blocks=blocks, lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, step=state["step"]
        )

    return step


def _deepspeed_adamw(p: torch.Tensor) -> Callable[[], None] | None:
    try:
        from deepspeed.ops.adam import DeepSpeedCPUAdam
    except Exception:  # noqa: BLE001 - not installed, or its op cannot build here
        return None
    p = p.clone().requires_grad_()
    p.grad = torch.randn_like(p) * 1e-3
    opt = DeepSpeedCPUAdam([p], lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1, adamw_mode=True)
    return opt.step


def _limit(p: torch.Tensor) -> Callable[[], None]:
    """Four streams read, three written in place: AdamW's traffic with no arithmetic to speak of."""
    q, g, m, v = p.clone(), torch.randn_like(p), torch.zeros_like(p), torch.zeros_like(p)
    if p.device.type == "cpu":
        lib, threads = kcpu.library(), kcpu.threads()
        return lambda: lib.zb_adamw_bandwidth_probe(
            q.data_ptr(), g.data_ptr(), m.data_ptr(), v.data_ptr(), q.numel(), threads
        )
    return lambda: torch._foreach_add_([q, m, v], [g, g, g])  # one fused multi-tensor launch per list


def adamw_candidates(cfg: KernelBenchConfig) -> dict[str, Callable[[], None]]:
    dev = torch.device(cfg.device)
    p = torch.randn(cfg.numel, device=dev)
    cands: dict[str, Callable[[], None]] = {"bandwidth_limit": _limit(p)}
    cands["torch_adamw_foreach"] = _torch_adamw(p, fused=False)
    cands["torch_adamw_fused"] = _torch_adamw(p, fused=True)
    cands["zerobench_adamw"] = _zerobench_adamw(p)
    if dev.type == "cpu" and cfg.deepspeed:
        ds = _deepspeed_adamw(p)
        if ds is not None:
            cands["deepspeed_cpu_adam"] = ds
    return cands


def interleave(
    cands: dict[str, Callable[[], None]],
    rounds: int,
    warmup: int,
    device: torch.device,
    progress: Callable[[int], None] | None = None,
) -> dict[str, list[float]]:
    """Seconds per call of every candidate, one call each per round, in the same order every round."""
    times: dict[str, list[float]] = {k: [] for k in cands}
    for r in range(warmup + rounds):
        for name, fn in cands.items():
            _sync(device)
            t0 = time.perf_counter()
            fn()
            _sync(device)
            if r >= warmup:
                times[name].append(time.perf_counter() - t0)
        if progress:
            progress(r)
    return times


def summarize(times: dict[str, list[float]], numel: int) -> list[dict]:
    """One record per candidate: median time, GB/s at 28 B/element, and medians of per-round ratios."""
    limit = times["bandwidth_limit"]
    ref = times.get("torch_adamw_fused")
    out = []
    for name, ts in times.items():
        rec = {
            "candidate": name,
            "median_s": statistics.median(ts),
            "gbps": BYTES_PER_ELEMENT * numel / statistics.median(ts) / 1e9,
            "fraction_of_limit": median_ratio(limit, ts),
        }
        if ref is not None:
            rec["time_vs_torch_fused"] = median_ratio(ts, ref)
        out.append(rec)
    return out


def run_adamw_bench(cfg: KernelBenchConfig, progress=None) -> list[dict]:
    if cfg.numel < 1 or cfg.rounds < 1 or cfg.warmup < 0:
        raise ValueError("numel and rounds must be >= 1 and warmup >= 0")
    cands = adamw_candidates(cfg)
    return summarize(interleave(cands, cfg.rounds, cfg.warmup, torch.device(cfg.device), progress), cfg.numel)


def write_rows(records: list[dict], cfg: KernelBenchConfig, out_dir, run_id: str) -> None:
    from zerobench.results.rows import RowWriter

    w = RowWriter(out_dir, run_id, {"kernel_bench": asdict(cfg), "threads": torch.get_num_threads()})
    for rec in records:
        extra = {"candidate": rec["candidate"]}
        w.write("adamw_step_time", rec["median_s"], "s", **extra)
        w.write("adamw_bandwidth", rec["gbps"], "GB/s", **extra)
        w.write("adamw_fraction_of_bandwidth_limit", rec["fraction_of_limit"], "ratio", **extra)
        if "time_vs_torch_fused" in rec:
            w.write("adamw_time_vs_torch_fused", rec["time_vs_torch_fused"], "ratio", **extra)


def transformer_candidates(device: str, rows: int, hidden: int, compile: bool) -> dict[str, Callable[[], None]]:
    """bias+GeLU and LayerNorm, forward + backward, on [rows, 4h] / [rows, h]: eager, fused, compiled."""
    import torch.nn.functional as F

    dev = torch.device(device)
    x4 = torch.randn(rows, 4 * hidden, device=dev, requires_grad=True)
    b4 = torch.zeros(4 * hidden, device=dev, requires_grad=True)
    x = torch.randn(rows, hidden, device=dev, requires_grad=True)
    w = torch.ones(hidden, device=dev, requires_grad=True)
    b = torch.zeros(hidden, device=dev, requires_grad=True)
    dy4, dy = torch.randn_like(x4), torch.randn_like(x)

    def gelu_eager(x, b):
        return F.gelu(x + b)

    def ln_eager(x, w, b):
        return F.layer_norm(x, (hidden,), w, b)

    def fwd_bwd(fn, args, grad):
        return lambda: fn(*args).backward(grad)

    cands = {
        "bias_gelu_eager": fwd_bwd(gelu_eager, (x4, b4), dy4),
        "bias_gelu_fused": fwd_bwd(lambda x, b: kernels.bias_gelu(x, b, mode="fused"), (x4, b4), dy4),
        "layer_norm_eager": fwd_bwd(ln_eager, (x, w, b), dy),
        "layer_norm_fused": fwd_bwd(lambda x, w, b: kernels.layer_norm(x, w, b, mode="fused"), (x, w, b), dy),
    }
    if compile:
        cands["bias_gelu_compiled"] = fwd_bwd(torch.compile(gelu_eager), (x4, b4), dy4)
        cands["layer_norm_compiled"] = fwd_bwd(torch.compile(ln_eager), (x, w, b), dy)
    return cands


def summarize_ops(times: dict[str, list[float]]) -> list[dict]:
    """Median time per candidate and the median per-round ratio to the eager version of the same op."""
    out = []
    for name, ts in times.items():
        eager = times[name.rsplit("_", 1)[0] + "_eager"]
        out.append(
            {
                "candidate": name,
                "median_s": statistics.median(ts),
                "time_vs_eager": statistics.median(t / e for t, e in zip(ts, eager)),
            }
        )
    return out
