"""Kernel rates measured on this card, next to the rates the simulator's replay charges them: GEMMs by shape
and the attention kernels.

The replay builds a GPU step from stated figures (``zerobench.sim.stated``, ``software``): a GEMM model fitted on
published GEMM tables (``gemm``), and a published forward+backward rate per attention kernel, device class and
head dimension (``software.Attention.rates``). Issue 59's held-out H100 rows (llm-foundry's FSDP runs) come out
over their published throughput, and two of the suspected causes are these figures:

- **Attention.** The rows that ran FlashAttention-2 are 12-24% over already at 128 GPUs (the same table's
  runs that are not held out), while the rows that ran FlashAttention in Triton are within 7%. Charged the
  Triton kernel's rate, the FlashAttention-2 rows would land at -4..+8%. The replay charges FlashAttention-2
  its published H100 figure at sequence 2k (265 TFLOP/s forward+backward at head dimension 128).
- **GEMMs.** The GEMM ceilings are the fastest of short benchmark runs; a training step runs GEMMs back to back
  for seconds, under the card's power limit.

``python -m zerobench.sim.card_rates --out DIR`` (``scripts/gpu_check.sh rates``, about two minutes on an H100)
measures both on a card:

- ``gemm``: every GEMM of the published rows of the card's device class (its calibration row and held-out
  rows: each linear's forward, data gradient and weight gradient at the row's tokens per micro-batch; the LM
  head's forward) and of zerobench's 1.3B at TP 1, 2, 4 and 8, bf16, each beside the time the replay charges it (``StatedProfile._gemm`` at
  ``compute_scale`` 1); then one large GEMM run back to back for ``--sustain`` seconds, its rate in the first
  fifth of a second against its last second.
- ``attention``: SDPA's flash (torch's FlashAttention-2 kernels, not flash-attn 2.4.2's build), cuDNN and
  memory-efficient backends, each forced, at the published figures' shapes and at the llm-foundry rows' batch
  and heads, forward and forward+backward, with zerobench's own call (q, k and v viewed out of one projection,
  causal), in the FlashAttention papers' FLOP count, the one the replay charges: a causal forward does half of
  4·b·a·s²·d, 2·b·a·s²·d FLOPs, its backward 2.5 times that.

Rows go to ``--out``, one per (kernel, shape, metric). On a CPU, ``--smoke`` runs both at tiny shapes in fp32:
the plumbing and the FLOP counts, not a rate anyone should read.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

KINDS = ("gemm", "attention")
BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")
"""The fused SDPA backends a GPU may run, each forced in turn (``torch.nn.attention.sdpa_kernel``)."""
CLASSES = {"H100": "h100", "H200": "h100", "GH200": "h100", "A100": "a100", "V100": "v100"}
"""Card name -> the simulator's device class (an H200 is an H100's SMs with more memory)."""
STATED = {"h100": "h100-dgx", "a100": "a100-dgx", "v100": "v100-dgx2"}
"""Device class -> the stated device whose figures the replay charges it (``stated.DEVICES``)."""


def device_class(name: str) -> str | None:
    """The simulator's device class of a card named ``name`` (``torch.cuda.get_device_name``), or None."""
    return next((c for key, c in CLASSES.items() if key in name.upper()), None)


def _timer(device: torch.device):
    """A function that runs ``fn`` and returns its seconds: CUDA events on a GPU, the host clock elsewhere."""
    if device.type == "cuda":

        def timed(fn) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) / 1e3

        return timed

    def timed_host(fn) -> float:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0

    return timed_host


def _dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


# -- GEMMs ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Gemm:
    """One GEMM, C[m, n] = A[m, k] @ B[k, n], and where it comes from (``label``)."""

    label: str
    m: int
    n: int
    k: int

    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k


def _block_gemms(label: str, tokens: int, h: int, tp: int = 1) -> list[Gemm]:
    """A transformer block's GEMMs at ``tokens`` per micro-batch as the replay charges them (``gpu_costs``): QKV,
    the attention projection and the MLP's two, each forward (T x n x k), data gradient (T x k x n) and weight
    gradient (k x n over T)."""
    hp = h // tp
    out = []
    for name, n, k in (("qkv", 3 * hp, h), ("proj", h, hp), ("fc", 4 * hp, h), ("fc2", h, 4 * hp)):
        out += [
            Gemm(f"{label} {name} fwd", tokens, n, k),
            Gemm(f"{label} {name} dgrad", tokens, k, n),
            Gemm(f"{label} {name} wgrad", k, n, tokens),
        ]
    return out


def gemm_shapes(klass: str | None) -> list[Gemm]:
    """The GEMMs to time on a card of ``klass``: those of every published row of that class, the calibration row
    and the held-out ones (blocks and LM head, at the row's TP), and zerobench's 1.3B (h 2048, 8 x 2048 tokens) at TP 1, 2, 4 and 8; each (m, n, k) once."""
    from zerobench.sim.published import load

    out = []
    for row in load():
        if klass is None or not row.device.startswith(klass):
            continue
        tokens, label = row.micro_batch * row.seq, row.id
        out += _block_gemms(label, tokens, row.hidden, row.tp)
        out.append(Gemm(f"{label} head fwd", tokens, row.vocab // row.tp, row.hidden))
    for tp in (1, 2, 4, 8):
        out += _block_gemms(f"zerobench 1.3B tp{tp}", 8 * 2048, 2048, tp)
    seen, unique = set(), []
    for g in out:
        if (g.m, g.n, g.k) not in seen:
            seen.add((g.m, g.n, g.k))
            unique.append(g)
    return unique


SMOKE_GEMMS = (Gemm("smoke square", 64, 64, 64), Gemm("smoke thin", 256, 16, 64))
SUSTAINED = Gemm("sustained: MPT-7b fc forward (mb 6)", 6 * 2048, 4 * 4096, 4096)


def gemm_charged(g: Gemm, klass: str | None) -> float | None:
    """Seconds the replay charges ``g`` in half precision on ``klass`` at ``compute_scale`` 1, or None."""
    from zerobench.sim.gpu_costs import StatedProfile
    from zerobench.sim.stated import DEVICES

    if klass not in STATED:
        return None
    dev = dataclasses.replace(DEVICES[STATED[klass]], compute_scale=1.0)
    return StatedProfile(dev)._gemm(g.m, g.n, g.k, 1, 2, dev.peak_flops)


def _matmul_batch(a: torch.Tensor, b: torch.Tensor, calls: int):
    """``calls`` back-to-back products: a GEMM's time in a stream of them, as a training step runs them (one short
    call alone between two events would add the host's launch gap to it)."""

    def run():
        for _ in range(calls):
            a @ b

    return run


def measure_gemms(gemms, device: torch.device, reps: int, warmup: int, klass: str | None) -> list[dict]:
    """One record per GEMM: the median over ``reps`` samples, per call, beside the replay's charge. A sample is as
    many back-to-back calls (1 to 10) as take about 2 ms, so that the long GEMMs of the 70B rows do not spend
    the card's minutes: one pass over an H100's 150 shapes is about 375 TFLOP."""
    timed, dtype, out = _timer(device), _dtype(device), []
    for g in gemms:
        a = torch.randn(g.m, g.k, device=device, dtype=dtype)
        b = torch.randn(g.k, g.n, device=device, dtype=dtype)
        once = timed(_matmul_batch(a, b, 1))  # the first call also picks cuBLAS's kernel
        calls = max(1, min(10, round(2e-3 / max(timed(_matmul_batch(a, b, 1)), once / 10, 1e-9))))
        run = _matmul_batch(a, b, calls)
        for _ in range(warmup):
            run()
        t = statistics.median(timed(run) for _ in range(reps)) / calls
        rec = {
            "kind": "gemm",
            **asdict(g),
            "seconds": t,
            "tflops": g.flops() / t / 1e12,
            "calls": calls,
            "status": "ok",
        }
        c = gemm_charged(g, klass)
        if c:
            rec.update(charged_tflops=g.flops() / c / 1e12, measured_over_charged=c / t)
        out.append(rec)
    return out


def measure_sustained(g: Gemm, device: torch.device, seconds: float) -> list[dict]:
    """``g`` back to back for ``seconds``, timed in batches of 10: the rate over the first fifth of a second
    against the last second (a card that slows under its power limit shows it here)."""
    timed, dtype = _timer(device), _dtype(device)
    ten = _matmul_batch(
        torch.randn(g.m, g.k, device=device, dtype=dtype), torch.randn(g.k, g.n, device=device, dtype=dtype), 10
    )
    samples, elapsed = [], 0.0
    while elapsed < seconds:
        t = timed(ten)
        samples.append((elapsed, t))
        elapsed += t
    first = [t for at, t in samples if at < 0.2] or [samples[0][1]]
    last = [t for at, t in samples if at >= elapsed - 1.0] or [samples[-1][1]]
    out = []
    for window, ts in (("first 0.2 s", first), ("last 1 s", last)):
        out.append(
            {
                "kind": "gemm_sustained",
                **asdict(g),
                "window": window,
                "seconds": statistics.median(ts) / 10,
                "tflops": 10 * g.flops() / statistics.median(ts) / 1e12,
                "run_s": elapsed,
                "status": "ok",
            }
        )
    return out


# -- attention -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Shape:
    """One attention call: ``batch`` sequences of ``seq`` tokens, ``heads`` heads of ``head_dim``."""

    label: str
    batch: int
    heads: int
    head_dim: int
    seq: int = 2048

    def forward_flops(self) -> float:
        """The causal forward's FLOPs as the FlashAttention papers count them: half of 4·b·a·s²·d."""
        return 2.0 * self.batch * self.heads * self.seq**2 * self.head_dim


SHAPES = (
    Shape("published d64 (16k tokens, hidden 2048)", 8, 32, 64),
    Shape("published d128 (16k tokens, hidden 2048)", 8, 16, 128),
    Shape("llm-foundry MPT-1b (mb 12)", 12, 16, 128),
    Shape("llm-foundry MPT-3b (mb 8)", 8, 20, 128),
    Shape("llm-foundry MPT-7b (mb 6)", 6, 32, 128),
    Shape("llm-foundry MPT-70b (mb 8)", 8, 64, 128),
)
SMOKE_SHAPES = (Shape("smoke", 2, 2, 16, 64),)


def attention_charged(backend: str, shape: Shape, klass: str | None) -> dict[str, float] | None:
    """The (forward, forward+backward) TFLOP/s the replay charges ``backend``'s kernel at ``shape`` on ``klass``:
    FlashAttention-2's figures for flash (``software.SDPA_FLASH2``), torch's SDPA dispatch (``SDPA_2026``, cuDNN
    on H100) for cuDNN there; None where the simulator states no figure for that kernel on that class."""
    from zerobench.sim.software import SDPA_2026, SDPA_FLASH2
    from zerobench.sim.stated import DEVICES

    if klass not in STATED:
        return None
    if backend == "FLASH_ATTENTION" and klass in SDPA_FLASH2.fwd_bwd:
        att = SDPA_FLASH2
    elif backend == "CUDNN_ATTENTION" and klass == "h100":
        att = SDPA_2026
    else:
        return None
    fwd, bwd = att.rates(klass, shape.head_dim, DEVICES[STATED[klass]].peak_flops)
    return {"fwd": fwd / 1e12, "fwd_bwd": 3.5 / (1 / fwd + 2.5 / bwd) / 1e12}


def _attention_inputs(shape: Shape, device: torch.device):
    """q, k and v as zerobench's attention makes them: strided views of one [b, s, 3, heads, d] projection."""
    b, s, a, d = shape.batch, shape.seq, shape.heads, shape.head_dim
    qkv = torch.randn(b, s, 3 * a * d, device=device, dtype=_dtype(device), requires_grad=True)
    q, k, v = qkv.view(b, s, 3, a, d).permute(2, 0, 3, 1, 4).unbind(0)
    return qkv, q, k, v


def measure_attention_one(backend: str, shape: Shape, device: torch.device, reps: int, warmup: int) -> dict:
    """Median forward and forward+backward seconds of one SDPA backend at ``shape``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qkv, q, k, v = _attention_inputs(shape, device)
    grad = torch.randn(shape.batch, shape.heads, shape.seq, shape.head_dim, device=device, dtype=_dtype(device))

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), is_causal=True)

    def fwd_bwd():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
        qkv.grad = None

    timed = _timer(device)
    with sdpa_kernel([getattr(SDPBackend, backend)]):
        for _ in range(warmup):
            fwd()
            fwd_bwd()
        t_fwd = statistics.median(timed(fwd) for _ in range(reps))
        t_both = statistics.median(timed(fwd_bwd) for _ in range(reps))
    f = shape.forward_flops()
    return {
        "fwd_s": t_fwd,
        "fwd_bwd_s": t_both,
        "fwd_tflops": f / t_fwd / 1e12,
        "fwd_bwd_tflops": 3.5 * f / t_both / 1e12,
    }


def measure_attention(shapes, device: torch.device, reps: int, warmup: int, klass: str | None, backends) -> list[dict]:
    """One record per (backend, shape): the measured seconds and rates, the charged rates where the simulator
    states them, and ``status`` ``ok`` or ``skipped`` with the reason a backend did not run."""
    out = []
    for backend in backends:
        for shape in shapes:
            rec = {"kind": "attention", "backend": backend, **asdict(shape)}
            try:
                rec.update(measure_attention_one(backend, shape, device, reps, warmup), status="ok")
            except RuntimeError as e:  # "No available kernel": this card or build does not run that backend here
                rec.update(status="skipped", reason=str(e).strip().splitlines()[0][:200])
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            c = attention_charged(backend, shape, klass)
            if c and rec["status"] == "ok":
                rec.update(
                    charged_fwd_tflops=c["fwd"],
                    charged_fwd_bwd_tflops=c["fwd_bwd"],
                    measured_over_charged=rec["fwd_bwd_tflops"] / c["fwd_bwd"],
                )
            out.append(rec)
    return out


# -- the run -------------------------------------------------------------------------------------------------


def report(records: list[dict]) -> str:
    """The records as ``main`` prints them: GEMMs summarised (all, and the worst and best against the replay),
    the sustained run, and every attention measurement."""
    lines = []
    gemms = [r for r in records if r["kind"] == "gemm"]
    ratios = sorted((r["measured_over_charged"], r) for r in gemms if "measured_over_charged" in r)
    if gemms:
        lines.append(f"GEMMs: {len(gemms)} shapes, measured TFLOP/s (and measured / charged by the replay)")
        if ratios:
            q = [x for x, _ in ratios]
            lines.append(
                f"  measured / charged: median {statistics.median(q):.3f}, from {q[0]:.3f} to {q[-1]:.3f}"
                f" (1 = the replay's GEMM model at compute_scale 1)"
            )
        shown = [r for _, r in ratios[:5] + ratios[-5:]] if len(ratios) > 10 else [r for _, r in ratios] or gemms
        for r in shown:
            ch = f"  x{r['measured_over_charged']:.3f} of {r['charged_tflops']:.1f}" if "charged_tflops" in r else ""
            lines.append(f"  {r['m']:>6} x {r['n']:>6} x {r['k']:>6}  {r['tflops']:9.4g}{ch}   {r['label']}")
    for r in (r for r in records if r["kind"] == "gemm_sustained"):
        lines.append(f"sustained {r['label']}, {r['run_s']:.1f} s: {r['window']} {r['tflops']:.4g} TFLOP/s")
    att = [r for r in records if r["kind"] == "attention"]
    if att:
        lines.append(
            f"  {'attention':<20}{'shape':<44}{'fwd':>8}{'fwd+bwd':>9}{'charged':>9}{'ratio':>7}   (TFLOP/s, causal)"
        )
    for r in att:
        if r["status"] != "ok":
            lines.append(f"  {r['backend']:<20}{r['label']:<44}  skipped: {r['reason']}")
            continue
        ch = (
            f"{r['charged_fwd_bwd_tflops']:9.1f}{r['measured_over_charged']:7.2f}"
            if "charged_fwd_bwd_tflops" in r
            else ""
        )
        lines.append(f"  {r['backend']:<20}{r['label']:<44}{r['fwd_tflops']:>8.4g} {r['fwd_bwd_tflops']:>8.4g}{ch}")
    return "\n".join(lines)


def write_rows(records: list[dict], out_dir, config: dict) -> None:
    """One row per (kernel, shape, metric), with the run's provenance (``results.rows``)."""
    from zerobench.results.rows import RowWriter

    w = RowWriter(out_dir, "card-rates", config)
    for r in records:
        if r["kind"] == "attention":
            extra = {k: r[k] for k in ("backend", "label", "batch", "heads", "head_dim", "seq")}
            if r["status"] != "ok":
                w.write("attention_fwd_bwd_tflops", None, "TFLOP/s", status="skipped", reason=r["reason"], **extra)
                continue
            w.write("attention_fwd_tflops", r["fwd_tflops"], "TFLOP/s", **extra)
            w.write("attention_fwd_bwd_tflops", r["fwd_bwd_tflops"], "TFLOP/s", **extra)
        else:
            extra = {k: r[k] for k in ("label", "m", "n", "k") + (("window",) if "window" in r else ())}
            w.write(f"{r['kind']}_tflops", r["tflops"], "TFLOP/s", **extra)
        if "measured_over_charged" in r:
            w.write(f"{r['kind']}_measured_over_charged", r["measured_over_charged"], "ratio", **extra)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m zerobench.sim.card_rates",
        description="Time GEMMs and SDPA's attention kernels on this GPU at the shapes the simulator's held-out "
        "rows use, each next to the rate the simulator's replay charges it.",
    )
    p.add_argument("--what", nargs="+", choices=KINDS, default=list(KINDS), help="which kernels (default: both)")
    p.add_argument("--out", help="write the results as rows here")
    p.add_argument("--reps", type=int, default=5, help="timed samples per measurement; the median is kept")
    p.add_argument("--sustain", type=float, default=10.0, help="seconds of the back-to-back GEMM (0: skip it)")
    p.add_argument("--smoke", action="store_true", help="on this CPU, tiny shapes in fp32 (the plumbing only)")
    a = p.parse_args(argv)
    if a.reps < 1:
        p.error(f"--reps must be at least 1, not {a.reps}")
    if a.sustain < 0:
        p.error(f"--sustain must be 0 or more seconds, not {a.sustain}")
    if not a.smoke and not torch.cuda.is_available():
        print("card_rates: no CUDA device here; --smoke runs the plumbing on this CPU", file=sys.stderr)
        return 2
    device = torch.device("cpu" if a.smoke else "cuda")
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    klass = device_class(name) if device.type == "cuda" else None
    print(f"kernel rates on {name} (the simulator's class: {klass}), torch {torch.__version__}", flush=True)
    recs: list[dict] = []
    if "gemm" in a.what:
        recs += measure_gemms(SMOKE_GEMMS if a.smoke else gemm_shapes(klass), device, a.reps, 1, klass)
        if a.sustain:
            recs += measure_sustained(SMOKE_GEMMS[0] if a.smoke else SUSTAINED, device, a.sustain)
    if "attention" in a.what:
        shapes, backends = (SMOKE_SHAPES, ("MATH",)) if a.smoke else (SHAPES, BACKENDS)
        recs += measure_attention(shapes, device, a.reps, 1 if a.smoke else 3, klass, backends)
    print(report(recs))
    if a.out:
        config = {"card_rates": {"what": a.what, "reps": a.reps, "sustain_s": a.sustain, "card": name}}
        write_rows(recs, a.out, config)
    return 0


if __name__ == "__main__":
    sys.exit(main())
