"""``zerobench train --profile DIR``: torch.profiler traces of a run's last steps, one trace per rank.

The profiler starts with the run and records nothing until the steps it traces: a schedule of waiting steps,
one warm-up step (the profiler's own, which it discards), then ``ProfileConfig.steps`` active ones, the run's
last. When they end each rank writes its trace (CPU operators, and CUDA kernels on a GPU) and a table of
operators by self time (``key_averages``), which is where the step's time goes that is neither compute nor
communication: hooks, bookkeeping, copies into and out of staging buffers.
"""

from __future__ import annotations

from pathlib import Path

import torch

from zerobench.config import ConfigError
from zerobench.train.config import ProfileConfig

TABLE_ROWS = 40
"""Operators in each rank's table."""


class ProfilerHook:
    """A loop hook (``train/hooks.py``): starts the profiler, steps its schedule after every step, writes the files."""

    def __init__(self, cfg: ProfileConfig, total_steps: int, run_id: str, rank: int, device: torch.device, say):
        self.dir, self.rank, self.say = Path(cfg.dir) / run_id, rank, say
        held = sorted(self.dir.glob("rank*.trace.json")) if self.dir.is_dir() else []
        if held:  # checked on every rank before any writes: a run's ranks write only once all are past this
            raise ConfigError(
                f"--profile {cfg.dir}: {self.dir} already holds the traces of a run {run_id!r} ({held[0].name}); a run "
                "never overwrites another's: give another --profile directory, or move them away"
            )
        self.cuda = device.type == "cuda"
        self.first = total_steps - cfg.steps  # 0-based index of the first traced step (>= 1: validated)
        self.steps = cfg.steps
        activities = [torch.profiler.ProfilerActivity.CPU]
        if self.cuda:
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.prof = torch.profiler.profile(
            activities=activities,
            schedule=torch.profiler.schedule(wait=self.first - 1, warmup=1, active=cfg.steps, repeat=1),
            on_trace_ready=self._write,
        )
        self.prof.start()

    def before_step(self, step: int) -> None:
        pass

    def after_phase(self, phase: str, cpu_seconds: float, meter=None) -> None:
        pass

    def after_compute(self, step: int, seconds: float) -> None:
        pass

    def after_step(self, rec) -> None:
        self.prof.step()

    def close(self) -> None:
        self.prof.stop()

    def _write(self, prof: torch.profiler.profile) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        trace = self.dir / f"rank{self.rank}.trace.json"
        prof.export_chrome_trace(str(trace))
        by = "self_cuda_time_total" if self.cuda else "self_cpu_time_total"
        table = prof.key_averages().table(sort_by=by, row_limit=TABLE_ROWS)
        head = (
            f"zerobench train: steps {self.first + 1}-{self.first + self.steps} traced on rank {self.rank} "
            f"(operators by {by.replace('_', ' ')})\n"
        )
        (self.dir / f"rank{self.rank}.ops.txt").write_text(head + table + "\n")
        self.say(
            f"profile of steps {self.first + 1}-{self.first + self.steps}: {trace} (Perfetto or "
            f"chrome://tracing) and {trace.with_name(f'rank{self.rank}.ops.txt').name} beside it"
        )


KERNEL_CLASSES = (  # first match wins; CUDA kernel names as torch.profiler records them (lower-cased)
    ("communication", ("nccl",)),
    ("attention", ("flash", "fmha", "attention", "sdpa")),
    ("matmul", ("gemm", "cutlass", "xmma", "nvjet", "cublas", "sm90_", "sm80_")),
    ("compiled (triton)", ("triton",)),
    ("optimizer", ("multi_tensor", "adam", "foreach")),
    ("norm / softmax / reduce", ("norm", "softmax", "reduce", "welford")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "copy", "fill", "cat", "index")),
)
GPU_EVENT_CATS = {"kernel": None, "gpu_memcpy": "memcpy / memset", "gpu_memset": "memcpy / memset"}


def kernel_class(name: str) -> str:
    low = name.lower()
    return next((c for c, keys in KERNEL_CLASSES if any(k in low for k in keys)), "other")


def kernel_summary(trace: dict, top: int = 15) -> dict:
    """Where a traced step's device time goes, from a chrome trace (``export_chrome_trace``) of a GPU run.

    Per traced step: the wall time of the profiler's steps (``ProfilerStep#N`` on the host, and as the device
    ran them: the profiler's own overhead is in the host's), the time some kernel ran (the union of kernel
    intervals: what is left of the step is the device waiting on the host), and the kernels' summed time by class
    (``KERNEL_CLASSES``) and by name. Two systems' summaries side by side name the
    kernels, or the host work, that one spends and the other does not."""
    events = [e for e in trace.get("traceEvents", []) if e.get("ph") == "X"]
    marks = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
    steps = [e for e in marks if e.get("cat") == "user_annotation"]  # the host's; a GPU trace repeats each step
    on_device = [e for e in marks if e.get("cat") == "gpu_user_annotation"]  # as the device ran it
    gpu = [e for e in events if e.get("cat") in GPU_EVENT_CATS]
    if not steps or not gpu:
        raise ValueError("kernel_summary needs a GPU trace with profiler steps: this one has no kernels or no steps")
    n = len(steps)
    by_class: dict[str, float] = {}
    by_name: dict[str, list] = {}
    for e in gpu:
        cls = GPU_EVENT_CATS[e["cat"]] or kernel_class(e["name"])
        by_class[cls] = by_class.get(cls, 0.0) + e["dur"]
        entry = by_name.setdefault(e["name"], [cls, 0, 0.0])
        entry[1] += 1
        entry[2] += e["dur"]
    busy, end = 0.0, float("-inf")
    for e in sorted(gpu, key=lambda e: e["ts"]):  # union of intervals over every stream
        s, f = e["ts"], e["ts"] + e["dur"]
        busy += max(0.0, f - max(s, end))
        end = max(end, f)
    ms = 1e-3 / n  # microseconds over all traced steps -> milliseconds a step
    names = sorted(by_name.items(), key=lambda kv: -kv[1][2])[:top]
    return {
        "steps": n,
        "step_ms": sum(e["dur"] for e in steps) * ms,
        "device_step_ms": sum(e["dur"] for e in on_device) / len(on_device) * 1e-3 if on_device else None,
        "device_busy_ms": busy * ms,
        "kernel_ms": sum(by_class.values()) * ms,
        "by_class_ms": {c: v * ms for c, v in sorted(by_class.items(), key=lambda kv: -kv[1])},
        "top_kernels": [
            {"name": k[:120], "class": c, "calls_per_step": cnt / n, "ms": t * ms} for k, (c, cnt, t) in names
        ],
    }
