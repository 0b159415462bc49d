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
  head's forward) and of zerobench's 1.3B at TP 1, 2, 4 and 8, bf16, each beside the time the replay charges
  it (``StatedProfile._gemm`` at ``compute_scale`` 1); then one large GEMM run back to back for ``--sustain``
  seconds, its rate in the first fifth of a second against its last second.
- ``attention``: SDPA's flash (torch's FlashAttention-2 kernels, not flash-attn 2.4.2's build), cuDNN and
  memory-efficient backends, each forced, at the published figures' shapes and at the llm-foundry rows' batch
  and heads, forward and forward+backward, with zerobench's own call (q, k and v viewed out of one projection,
  causal), in the FlashAttention papers' FLOP count, the one the replay charges: a causal forward does half of
  4·b·a·s²·d, 2·b·a·s²·d FLOPs, its backward 2.5 times that.

Each measurement is printed and written as soon as it is made, so a run cut short keeps what it measured, and
one kernel that fails is a ``skipped`` record with its reason, not the end of the run. The sustained GEMM runs
first, on a card that has been idle. Rows go to ``--out``, one per (kernel, shape, metric). On a CPU,
``--smoke`` runs both at tiny shapes in fp32: the plumbing and the FLOP counts, not a rate anyone should read.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import statistics
import sys
import warnings
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from zerobench.sim.clocks import DeviceClock, HostClock

KINDS = ("gemm", "attention")
BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")
"""The fused SDPA backends a GPU may run, each forced in turn (``torch.nn.attention.sdpa_kernel``)."""
CLASSES = {"H100": "h100", "H200": "h100", "GH200": "h100", "A100": "a100", "V100": "v100"}
"""Card name -> the simulator's device class (an H200 is an H100's SMs with more memory)."""
STATED = {"h100": "h100-dgx", "a100": "a100-dgx", "v100": "v100-dgx2"}
"""Device class -> the stated device whose figures the replay charges it (``stated.DEVICES``)."""
SAMPLE_S = 2e-3
"""About how long one timed sample of a GEMM lasts: as many back-to-back calls as take this long."""
MAX_CALLS = 200


def device_class(name: str) -> str | None:
    """The simulator's device class of a card named ``name`` (``torch.cuda.get_device_name``), or None."""
    return next((c for key, c in CLASSES.items() if key in name.upper()), None)


def _timer(device: torch.device) -> Callable[[Callable[[], None]], float]:
    """A function that runs ``fn`` and returns its seconds on the profiler's clock for ``device``
    (``sim.clocks``: CUDA events on a GPU, the host clock on a CPU). On a GPU a spin kernel is queued first, so
    that the host has issued all of ``fn``'s kernels before the start event is reached and the time is the
    device's alone (from an idle stream it would include the host's launch of the first one)."""
    clock = DeviceClock(device) if device.type == "cuda" else HostClock()

    def timed(fn) -> float:
        if device.type == "cuda":
            torch.cuda._sleep(2_000_000)  # about a millisecond at an H100's clocks
        start = clock.stamp()
        fn()
        end = clock.stamp()
        clock.finish()
        return clock.seconds(end) - clock.seconds(start)

    return timed


def _dtype(device: torch.device) -> torch.dtype:
    return torch.bfloat16 if device.type == "cuda" else torch.float32


def _failed(rec: dict, e: BaseException, device: torch.device) -> dict:
    """``rec`` as a skipped measurement: its one-line reason, the memory it held given back."""
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return {**rec, "status": "skipped", "reason": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200]}"}


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
    and the held-out ones (blocks and LM head, at the row's TP), and zerobench's 1.3B (h 2048, 8 x 2048 tokens)
    at TP 1, 2, 4 and 8; each (m, n, k) once."""
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


@functools.cache
def _charging(klass: str):
    """The stated profile the replay charges ``klass``'s GEMMs with, at ``compute_scale`` 1 (built once)."""
    from zerobench.sim.gpu_costs import StatedProfile
    from zerobench.sim.stated import DEVICES

    return StatedProfile(dataclasses.replace(DEVICES[STATED[klass]], compute_scale=1.0))


def gemm_charged(g: Gemm, klass: str | None) -> tuple[float, float] | None:
    """(seconds, of which the launch) the replay charges ``g`` in half precision on ``klass`` at
    ``compute_scale`` 1, or None where it states no such device."""
    if klass not in STATED:
        return None
    prof = _charging(klass)
    return prof._gemm(g.m, g.n, g.k, 1, 2, prof.dev.peak_flops), prof.gemm.launch_s


def _matmul_batch(a: torch.Tensor, b: torch.Tensor, calls: int) -> Callable[[], None]:
    """``calls`` back-to-back products: a GEMM's time in a stream of them, as a training step runs them."""

    def run():
        for _ in range(calls):
            a @ b

    return run


def _gemm_record(g: Gemm, t: float, klass: str | None, **extra) -> dict:
    """A GEMM's measured ``t`` seconds a call, beside the replay's charge: ``measured_over_charged`` against the
    whole charge, ``..._without_launch`` against it less the launch, which back-to-back calls hide."""
    rec = {"kind": "gemm", **asdict(g), "seconds": t, "tflops": g.flops() / t / 1e12, "status": "ok", **extra}
    c = gemm_charged(g, klass)
    if c:
        charge, launch = c
        rec.update(
            charged_tflops=g.flops() / charge / 1e12,
            measured_over_charged=charge / t,
            measured_over_charged_without_launch=(charge - launch) / t,
        )
    return rec


def measure_gemms(gemms, device: torch.device, reps: int, warmup: int, klass: str | None) -> Iterator[dict]:
    """One record per GEMM: the median over ``reps`` samples, per call, beside the replay's charge. A sample is as
    many back-to-back calls (up to ``MAX_CALLS``) as take about ``SAMPLE_S``, so that short GEMMs are timed
    over many calls and the long ones of the 70B rows do not spend the card's minutes (one pass over an H100's
    150 shapes is about 375 TFLOP)."""
    timed, dtype = _timer(device), _dtype(device)
    for g in gemms:
        try:
            a = torch.randn(g.m, g.k, device=device, dtype=dtype)
            b = torch.randn(g.k, g.n, device=device, dtype=dtype)
            one = _matmul_batch(a, b, 1)
            one()  # the first call also picks cuBLAS's kernel
            calls = max(1, min(MAX_CALLS, round(SAMPLE_S / max(timed(one), 1e-9))))
            run = _matmul_batch(a, b, calls)
            for _ in range(warmup):
                run()
            t = statistics.median(timed(run) for _ in range(reps)) / calls
            del a, b
            yield _gemm_record(g, t, klass, calls=calls)
        except Exception as e:  # noqa: BLE001 (one shape that fails is a skipped record; the run goes on)
            yield _failed({"kind": "gemm", **asdict(g)}, e, device)


def sustained_windows(samples: list[tuple[float, float]], calls: int) -> dict[str, float]:
    """Seconds a call over the first 0.2 s and over the last second of a run, from its samples (start, seconds of
    ``calls`` calls) laid end to end."""
    end = samples[-1][0] + samples[-1][1]
    first = [t for at, t in samples if at < 0.2] or [samples[0][1]]
    last = [t for at, t in samples if at >= end - 1.0] or [samples[-1][1]]
    return {"first 0.2 s": statistics.median(first) / calls, "last 1 s": statistics.median(last) / calls}


def measure_sustained(g: Gemm, device: torch.device, seconds: float) -> Iterator[dict]:
    """``g`` back to back for ``seconds``, timed in samples of 10 calls: its rate over the first fifth of a second
    against the last second (a card that slows under its power limit shows it here), with the SM clock where
    torch can read it (``torch.cuda.clock_rate``, through pynvml)."""
    rec = {"kind": "gemm_sustained", **asdict(g)}
    try:
        timed, dtype = _timer(device), _dtype(device)
        ten = _matmul_batch(
            torch.randn(g.m, g.k, device=device, dtype=dtype), torch.randn(g.k, g.n, device=device, dtype=dtype), 10
        )
        ten()
        clocks, samples, elapsed = [], [], 0.0
        while elapsed < seconds:
            t = timed(ten)
            samples.append((elapsed, t))
            elapsed += t
            if device.type == "cuda" and len(samples) % 50 == 1:
                clocks.append(_clock_mhz())
        for window, t in sustained_windows(samples, 10).items():
            yield {
                **rec,
                "window": window,
                "seconds": t,
                "tflops": g.flops() / t / 1e12,
                "run_s": elapsed,
                "sm_clock_mhz": [c for c in clocks if c is not None],
                "status": "ok",
            }
    except Exception as e:  # noqa: BLE001
        yield _failed({**rec, "window": "both"}, e, device)


def _clock_mhz() -> float | None:
    try:
        return float(torch.cuda.clock_rate())
    except Exception:  # noqa: BLE001 (no pynvml on the machine: the clock is optional)
        return None


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
    from zerobench.sim.software import SDPA_2026, SDPA_FLASH2, fwd_bwd_rate
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
    return {"fwd": fwd / 1e12, "fwd_bwd": fwd_bwd_rate(fwd, bwd) / 1e12}


def _attention_inputs(shape: Shape, device: torch.device):
    """q, k and v as zerobench's attention makes them (strided views of one [b, s, 3, heads, d] projection), and
    an output gradient laid out as its backward gets one ([b, s, heads, d] seen as [b, heads, s, d])."""
    b, s, a, d = shape.batch, shape.seq, shape.heads, shape.head_dim
    qkv = torch.randn(b, s, 3 * a * d, device=device, dtype=_dtype(device), requires_grad=True)
    q, k, v = qkv.view(b, s, 3, a, d).permute(2, 0, 3, 1, 4).unbind(0)
    grad = torch.randn(b, s, a, d, device=device, dtype=_dtype(device)).transpose(1, 2)
    return qkv, q, k, v, grad


def attention_rates(shape: Shape, t_fwd: float, t_both: float) -> dict[str, float]:
    """Forward and forward+backward TFLOP/s from their seconds, in the FlashAttention papers' count."""
    f = shape.forward_flops()
    return {
        "fwd_s": t_fwd,
        "fwd_bwd_s": t_both,
        "fwd_tflops": f / t_fwd / 1e12,
        "fwd_bwd_tflops": 3.5 * f / t_both / 1e12,
    }


def measure_attention_one(backend: str, shape: Shape, device: torch.device, reps: int, warmup: int) -> dict:
    """Median forward and forward+backward seconds of one SDPA backend at ``shape``, both as training runs them
    (the forward on inputs that require gradients, so a kernel that saves statistics for the backward saves
    them)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    qkv, q, k, v, grad = _attention_inputs(shape, device)

    def fwd():
        F.scaled_dot_product_attention(q, k, v, is_causal=True)

    def fwd_bwd():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
        qkv.grad = None

    timed = _timer(device)
    with sdpa_kernel([getattr(SDPBackend, backend)]), warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        try:
            for _ in range(warmup):
                fwd()
                fwd_bwd()
        except RuntimeError as e:  # "No available kernel": torch says why in its warnings
            why = "; ".join(str(w.message).strip().splitlines()[0] for w in said)[:300]
            raise RuntimeError(f"{str(e).strip().splitlines()[0]} ({why})" if why else str(e)) from None
        t_fwd = statistics.median(timed(fwd) for _ in range(reps))
        t_both = statistics.median(timed(fwd_bwd) for _ in range(reps))
    return attention_rates(shape, t_fwd, t_both)


def measure_attention(
    shapes, device: torch.device, reps: int, warmup: int, klass: str | None, backends
) -> Iterator[dict]:
    """One record per (backend, shape): the measured seconds and rates, the charged rates where the simulator
    states them, and ``status`` ``ok`` or ``skipped`` with the reason a backend did not run."""
    for backend in backends:
        for shape in shapes:
            rec = {"kind": "attention", "backend": backend, **asdict(shape)}
            try:
                rec.update(measure_attention_one(backend, shape, device, reps, warmup), status="ok")
            except Exception as e:  # noqa: BLE001 (a backend this card or build does not run: skipped, with why)
                yield _failed(rec, e, device)
                continue
            c = attention_charged(backend, shape, klass)
            if c:
                rec.update(
                    charged_fwd_tflops=c["fwd"],
                    charged_fwd_bwd_tflops=c["fwd_bwd"],
                    measured_over_charged=rec["fwd_bwd_tflops"] / c["fwd_bwd"],
                )
            yield rec


# -- the run -------------------------------------------------------------------------------------------------


def line(r: dict) -> str:
    """One record as the line ``main`` prints when it is measured."""
    what = r.get("backend") or r.get("window") or ""
    head = f"  {r['kind']:<15}{what:<20}{r['label'][:44]:<45}"
    if r["status"] != "ok":
        return f"{head}skipped: {r['reason']}"
    if r["kind"] == "attention":
        ch = (
            f"   x{r['measured_over_charged']:.3f} of {r['charged_fwd_bwd_tflops']:.1f}"
            if "measured_over_charged" in r
            else ""
        )
        return f"{head}fwd {r['fwd_tflops']:.4g}  fwd+bwd {r['fwd_bwd_tflops']:.4g} TFLOP/s{ch}"
    ch = f"   x{r['measured_over_charged']:.3f} of {r['charged_tflops']:.1f}" if "measured_over_charged" in r else ""
    shape = f"{r['m']} x {r['n']} x {r['k']}"
    return f"{head}{shape:<24}{r['tflops']:.4g} TFLOP/s{ch}"


def summary(records: list[dict]) -> str:
    """The GEMMs' measured / charged over all shapes (median and range), and how many records were skipped."""
    lines = []
    ratios = sorted(r["measured_over_charged"] for r in records if r["kind"] == "gemm" and "measured_over_charged" in r)
    if ratios:
        lines.append(
            f"GEMMs, measured / charged by the replay (compute_scale 1) over {len(ratios)} shapes: median "
            f"{statistics.median(ratios):.3f}, from {ratios[0]:.3f} to {ratios[-1]:.3f}"
        )
    skipped = sum(r["status"] != "ok" for r in records)
    lines.append(f"{len(records)} measurements, {skipped} skipped")
    return "\n".join(lines)


class RowSink:
    """Writes each record's rows as it is made (``results.rows``): one per (kernel, shape, metric)."""

    def __init__(self, out_dir, config: dict):
        from zerobench.results.rows import RowWriter

        self.w = RowWriter(out_dir, "card-rates", config)

    def __call__(self, r: dict) -> None:
        keys = {
            "attention": ("backend", "label", "batch", "heads", "head_dim", "seq"),
            "gemm": ("label", "m", "n", "k"),
            "gemm_sustained": ("label", "m", "n", "k", "window"),
        }[r["kind"]]
        extra = {k: r[k] for k in keys}
        metric = "attention_fwd_bwd_tflops" if r["kind"] == "attention" else f"{r['kind']}_tflops"
        if r["status"] != "ok":
            self.w.write(metric, None, "TFLOP/s", status="skipped", reason=r["reason"], **extra)
            return
        if r["kind"] == "attention":
            self.w.write("attention_fwd_tflops", r["fwd_tflops"], "TFLOP/s", **extra)
            self.w.write(metric, r["fwd_bwd_tflops"], "TFLOP/s", **extra)
        else:
            more = {"sm_clock_mhz": r["sm_clock_mhz"]} if r.get("sm_clock_mhz") else {}
            self.w.write(metric, r["tflops"], "TFLOP/s", **extra, **more)
        for ratio in ("measured_over_charged", "measured_over_charged_without_launch"):
            if ratio in r:
                self.w.write(f"{r['kind']}_{ratio}", r[ratio], "ratio", **extra)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m zerobench.sim.card_rates",
        description="Time GEMMs and SDPA's attention kernels on this GPU at the shapes the simulator's published "
        "rows use, each next to the rate the simulator's replay charges it.",
    )
    p.add_argument("--what", nargs="+", choices=KINDS, default=list(KINDS), help="which kernels (default: both)")
    p.add_argument("--out", help="write the results as rows here, each as it is measured")
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
    config = {"card_rates": {"what": a.what, "reps": a.reps, "sustain_s": a.sustain, "card": name}}
    sink = RowSink(a.out, config) if a.out else None
    runs: list[Iterator[dict]] = []
    if "gemm" in a.what and a.sustain:  # first, on a card that has been idle
        runs.append(measure_sustained(SMOKE_GEMMS[0] if a.smoke else SUSTAINED, device, a.sustain))
    if "gemm" in a.what:
        runs.append(measure_gemms(SMOKE_GEMMS if a.smoke else gemm_shapes(klass), device, a.reps, 1, klass))
    if "attention" in a.what:
        shapes, backends = (SMOKE_SHAPES, ("MATH",)) if a.smoke else (SHAPES, BACKENDS)
        runs.append(measure_attention(shapes, device, a.reps, 1 if a.smoke else 3, klass, backends))
    records = []
    for run in runs:
        for r in run:
            records.append(r)
            print(line(r), flush=True)
            if sink:
                sink(r)
    print(summary(records))
    return 0


if __name__ == "__main__":
    sys.exit(main())
