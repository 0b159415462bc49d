"""The attention kernels' rates on this device, next to the rates the simulator charges them.

The replay charges a ``flash`` attention kernel a published forward+backward rate per device class and head
dimension (``software.Attention.rates``): FlashAttention-2's on A100 and H100, cuDNN's on H100 for torch's own
SDPA. Those figures come from papers' benchmarks at one shape (causal, sequence 2k, 16k tokens). Issue 59's
held-out llm-foundry rows that run FlashAttention-2 on H100 come out 15-24% over their published throughput at
128 GPUs, while the same table's rows that run FlashAttention in Triton land within 7%; charging the
FlashAttention-2 rows the Triton kernel's rate would bring them to -4..+8%. Whether the kernel is slower at
those shapes than its published figure is a question for a card, and this is the measurement that answers it:
``python -m zerobench.sim.measure_attention --out DIR`` (``scripts/gpu_check.sh attention``).

For each SDPA backend the card runs (flash, which is FlashAttention-2's kernels in torch; cuDNN; the
memory-efficient one) and each shape, it times the forward alone and the forward with the backward, with
zerobench's own call (``F.scaled_dot_product_attention`` on q, k, v viewed out of one projection, causal, bf16),
and reports TFLOP/s in the FlashAttention papers' convention, the one the replay charges: a causal forward does
half of 4·b·a·s²·d, 2·b·a·s²·d FLOPs, and its backward 2.5 times that. The shapes are the published figures'
(16k tokens of hidden 2048 at head dimensions 64 and 128) and the llm-foundry rows' (batch and heads of MPT 1b,
3b, 7b and 70b at sequence 2048). On a CPU (``--smoke``) the math backend runs at a tiny shape: the plumbing and
the FLOP count, not a rate anyone should read.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

BACKENDS = ("FLASH_ATTENTION", "CUDNN_ATTENTION", "EFFICIENT_ATTENTION")
"""The fused SDPA backends a GPU may run, each forced in turn (``torch.nn.attention.sdpa_kernel``)."""


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

CLASSES = {"H100": "h100", "H200": "h100", "GH200": "h100", "A100": "a100", "V100": "v100"}
"""Card name -> the simulator's device class (an H200 is an H100's SMs with more memory)."""


def device_class(name: str) -> str | None:
    """The simulator's device class of a card named ``name`` (``torch.cuda.get_device_name``), or None."""
    return next((c for key, c in CLASSES.items() if key in name.upper()), None)


def charged(backend: str, shape: Shape, klass: str | None) -> dict[str, float] | None:
    """The (forward, forward+backward) TFLOP/s the replay charges ``backend``'s kernel at ``shape`` on ``klass``:
    FlashAttention-2's figures for flash (``software.SDPA_FLASH2``), torch's SDPA dispatch (``SDPA_2026``, cuDNN
    on H100) for cuDNN there; None where the simulator states no figure for that kernel on that class."""
    from zerobench.sim.software import SDPA_2026, SDPA_FLASH2
    from zerobench.sim.stated import DEVICES

    devices = {"h100": "h100-dgx", "a100": "a100-dgx", "v100": "v100-dgx2"}
    if klass not in devices:
        return None
    if backend == "FLASH_ATTENTION" and klass in SDPA_FLASH2.fwd_bwd:
        att = SDPA_FLASH2
    elif backend == "CUDNN_ATTENTION" and klass == "h100":
        att = SDPA_2026
    else:
        return None
    fwd, bwd = att.rates(klass, shape.head_dim, DEVICES[devices[klass]].peak_flops)
    return {"fwd": fwd / 1e12, "fwd_bwd": 3.5 / (1 / fwd + 2.5 / bwd) / 1e12}


def _inputs(shape: Shape, device: torch.device, dtype: torch.dtype):
    """q, k and v as zerobench's attention makes them: strided views of one [b, s, 3, heads, d] projection."""
    b, s, a, d = shape.batch, shape.seq, shape.heads, shape.head_dim
    qkv = torch.randn(b, s, 3 * a * d, device=device, dtype=dtype, requires_grad=True)
    q, k, v = qkv.view(b, s, 3, a, d).permute(2, 0, 3, 1, 4).unbind(0)
    return qkv, q, k, v


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


def measure_one(backend: str | None, shape: Shape, device: torch.device, reps: int, warmup: int) -> dict:
    """Median forward and forward+backward seconds of one backend (None: whatever SDPA picks) at ``shape``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    qkv, q, k, v = _inputs(shape, device, dtype)
    grad = torch.randn(shape.batch, shape.heads, shape.seq, shape.head_dim, device=device, dtype=dtype)

    def fwd():
        with torch.no_grad():
            F.scaled_dot_product_attention(q.detach(), k.detach(), v.detach(), is_causal=True)

    def fwd_bwd():
        F.scaled_dot_product_attention(q, k, v, is_causal=True).backward(grad)
        qkv.grad = None

    timed = _timer(device)
    ctx = sdpa_kernel([getattr(SDPBackend, backend)]) if backend else _nothing()
    with ctx:
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


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def measure(shapes=SHAPES, device: str = "cuda", reps: int = 20, warmup: int = 3, backends=None) -> list[dict]:
    """One record per (backend, shape): the measured seconds and rates, the charged rates where the simulator
    states them, and ``status`` ``ok`` or ``skipped`` with the reason a backend did not run."""
    dev = torch.device(device)
    if backends is None:
        backends = BACKENDS if dev.type == "cuda" else ("MATH",)
    klass = device_class(torch.cuda.get_device_name(dev)) if dev.type == "cuda" else None
    out = []
    for backend in backends:
        for shape in shapes:
            rec = {"backend": backend, **asdict(shape), "device_class": klass}
            try:
                rec.update(measure_one(backend, shape, dev, reps, warmup), status="ok")
            except RuntimeError as e:  # "No available kernel": this card or build does not run that backend here
                rec.update(status="skipped", reason=str(e).strip().splitlines()[0][:200])
                if dev.type == "cuda":
                    torch.cuda.empty_cache()
            c = charged(backend, shape, klass)
            if c and rec["status"] == "ok":
                rec.update(
                    charged_fwd_tflops=c["fwd"],
                    charged_fwd_bwd_tflops=c["fwd_bwd"],
                    measured_over_charged=rec["fwd_bwd_tflops"] / c["fwd_bwd"],
                )
            out.append(rec)
    return out


def table(records: list[dict]) -> str:
    """The records as the lines ``main`` prints."""
    lines = [f"  {'backend':<20}{'shape':<44}{'fwd':>8}{'fwd+bwd':>9}{'charged':>9}{'ratio':>7}   (TFLOP/s, causal)"]
    for r in records:
        if r["status"] != "ok":
            lines.append(f"  {r['backend']:<20}{r['label']:<44}  skipped: {r['reason']}")
            continue
        ch = (
            f"{r['charged_fwd_bwd_tflops']:9.1f}{r['measured_over_charged']:7.2f}"
            if "charged_fwd_bwd_tflops" in r
            else ""
        )
        lines.append(f"  {r['backend']:<20}{r['label']:<44}{r['fwd_tflops']:8.4g}{r['fwd_bwd_tflops']:9.4g}{ch}")
    return "\n".join(lines)


def write_rows(records: list[dict], out_dir, config: dict) -> None:
    """One row per (backend, shape, metric), with the run's provenance (``results.rows``)."""
    from zerobench.results.rows import RowWriter

    w = RowWriter(out_dir, "attention-kernels", config)
    for r in records:
        extra = {k: r[k] for k in ("backend", "label", "batch", "heads", "head_dim", "seq", "device_class")}
        if r["status"] != "ok":
            w.write("attention_fwd_bwd_tflops", None, "TFLOP/s", status="skipped", reason=r["reason"], **extra)
            continue
        w.write("attention_fwd_tflops", r["fwd_tflops"], "TFLOP/s", **extra)
        w.write("attention_fwd_bwd_tflops", r["fwd_bwd_tflops"], "TFLOP/s", **extra)
        if "measured_over_charged" in r:
            w.write("attention_measured_over_charged", r["measured_over_charged"], "ratio", **extra)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m zerobench.sim.measure_attention",
        description="Time SDPA's attention kernels on this GPU at the shapes the simulator's figures and the "
        "held-out llm-foundry rows use, next to the rates the simulator charges them.",
    )
    p.add_argument("--out", help="write the results as rows here")
    p.add_argument("--reps", type=int, default=20, help="timed calls per measurement; the median is kept")
    p.add_argument("--smoke", action="store_true", help="on this CPU, the math backend at a tiny shape (plumbing)")
    a = p.parse_args(argv)
    if a.reps < 1:
        p.error(f"--reps must be at least 1, not {a.reps}")
    if not a.smoke and not torch.cuda.is_available():
        print("measure_attention: no CUDA device here; --smoke runs the plumbing on this CPU", file=sys.stderr)
        return 2
    device = "cpu" if a.smoke else "cuda"
    shapes = SMOKE_SHAPES if a.smoke else SHAPES
    name = torch.cuda.get_device_name() if device == "cuda" else "cpu"
    print(
        f"SDPA attention kernels on {name} (class {device_class(name) if device == 'cuda' else None}), torch {torch.__version__}"
    )
    recs = measure(shapes, device, a.reps, warmup=1 if a.smoke else 3)
    print(table(recs))
    if a.out:
        write_rows(
            recs, a.out, {"attention_bench": {"reps": a.reps, "shapes": [asdict(s) for s in shapes], "device": name}}
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
