"""A finished run's summary as output: rank 0's console report (memory and communication ledgers) and the
result rows (one per metric, and per rank for the per-rank figures)."""

from __future__ import annotations

import statistics

from zerobench.models.sizes import params_per_mp_rank
from zerobench.results.rows import RowWriter
from zerobench.train.config import TrainConfig


def _fmt_bytes(n: float | None) -> str:
    return f"{'n/a':>14}" if n is None else f"{n / 2**20:10.2f} MiB"


def robust(xs: list[float]) -> dict:
    """Median and median absolute deviation of the timed steps ``xs`` (``train/outcome.py`` picks them); both
    None when there is none (every timed step was skipped)."""
    if not xs:
        return {"median": None, "mad": None, "samples": []}
    med = statistics.median(xs)
    return {"median": med, "mad": statistics.median(abs(t - med) for t in xs), "samples": list(xs)}


def report(s: dict, cfg: TrainConfig, say) -> None:
    n_skipped, n = len(s["skipped"]), len(s["losses"])
    skipped = f"; {n_skipped} of {n} steps skipped (fp16 overflow), left out" if n_skipped else ""
    if s["step_time_s"] is None:
        say(f"\nno median step time: every timed step was skipped (fp16 overflow; {n_skipped} of {n} steps)")
    else:
        say(
            f"\nmedian step time {s['step_time_s'] * 1e3:.1f} ms, {s['tflops_per_gpu']:.4f} TFLOPs/GPU "
            f"(model FLOPs, Megatron count), {s['tflops_per_gpu'] * cfg.world_size / 1e3:.6f} PFLOPs aggregate"
            + skipped
        )
    say("\nmemory ledger per rank (measured from the engine's tensors):")
    say(
        f"  {'rank':>4} {'params':>14} {'grads':>14} {'master':>14} {'optim states':>14} "
        f"{'model states':>14} {'analytic':>14} {'peak live':>14}"
    )
    for r in s["ranks"]:
        L = r["ledger"]
        peak = _fmt_bytes(r["peak"]) if r["peak"] is not None else f"{'n/a':>14}"
        say(
            f"  {r['rank']:>4} {_fmt_bytes(L['params'])} {_fmt_bytes(L['grads'])} {_fmt_bytes(L['master'])} "
            f"{_fmt_bytes(L['optimizer_states'])} {_fmt_bytes(r['model_state_bytes'])} {_fmt_bytes(r['analytic'])} {peak}"
        )
    if s["ranks"][0].get("host"):
        say("  offloaded, per rank (host memory; NVMe files):")
        for r in s["ranks"]:
            L, h = r["ledger"], r["host"]
            say(
                f"  {r['rank']:>4} {_fmt_bytes(L['host_params'])} {_fmt_bytes(L['host_grads'])} {_fmt_bytes(L['host_master'])} "
                f"{_fmt_bytes(L['host_optimizer_states'])} {_fmt_bytes(h['measured'])} {_fmt_bytes(h['analytic'])}"
                + (f"  NVMe {_fmt_bytes(L['nvme_optimizer_states'])}" if L["nvme_optimizer_states"] else "")
            )
    if s["ranks"][0]["comm_volume"] is None:  # the system's collectives are not in zerobench's ledger
        say("\n(communication of baseline systems is not recorded in zerobench's ledger)")
        return
    say("\ncommunication ledger per step, rank 0 (volume = paper §7 accounting, elements):")
    for c in s["ranks"][0]["comm_summary"]:
        say(
            f"  {c['group']:>3} {c['op']:<15} {c['tag']:<10} calls {c['calls']:5d}  "
            f"elements {c['numel']:12d}  volume {c['volume_elements']:14.0f}"
        )
    n, (factor, formula) = cfg.dp, dp_volume_factor(cfg.zero.stage, cfg.zero.grad_accum_steps)
    psi_local = params_per_mp_rank(cfg.model, cfg.tp)  # Ψ of this TP rank: the replicated parameters whole
    say(
        f"  DP volume {s['ranks'][0]['comm_volume']:.0f} elements; paper: {formula}(N-1)/N"
        + (f" at A = {cfg.zero.grad_accum_steps} micro-batches" if "A" in formula else "")
        + f" = {factor * psi_local * (n - 1) / n:.0f}"
        + (" (Ψ of one TP rank)" if cfg.tp > 1 else "")
    )
    if cfg.tp > 1:
        r0 = s["ranks"][0]
        say(f"  MP volume in blocks {r0['mp_volume']:.0f} elements; P_a all-gathers {r0['pa_volume']:.0f}")


def dp_volume_factor(stage: int, accum: int) -> tuple[int, str]:
    """The data-parallel volume of one optimizer step in units of Ψ(N-1)/N, and its formula (paper §7): 2Ψ at
    stages 0-1, which reduce once per window; stages 2 and 3 reduce-scatter every micro-batch's gradients into the
    partition (as DeepSpeed's stage 2 does), so A micro-batches cost (A+1)Ψ at stage 2 (and one all-gather of the
    updated parameters) and 3AΨ at stage 3 (each micro-batch gathers the parameters twice)."""
    if stage <= 1:
        return 2, "2Ψ"
    if stage == 2:
        return accum + 1, "2Ψ" if accum == 1 else "(A+1)Ψ"
    return 3 * accum, "3Ψ" if accum == 1 else "3AΨ"


_TIMINGS = (
    ("step_time_s", "s", "median over steps of the wall-clock step time (forward, backward, optimizer step)"),
    (
        "step_time_norm",
        "ratio",
        (
            "median over steps of step time / a fixed 256x256 matmul chain timed right "
            "after the step in the same process"
        ),
    ),
    (
        "step_cpu_s",
        "s",
        (
            "median over steps of the rank's process CPU time (all threads) during the step: time "
            "the rank was not running (other processes, VM steal) is not counted"
        ),
    ),
)


def write_rows(w: RowWriter, s: dict, cfg: TrainConfig, n_measured: int) -> None:
    """The run's rows: per-step losses, the skipped steps, the timing medians (none where every timed step was
    skipped), then the per-rank memory and communication figures."""
    for i, loss in enumerate(s["losses"]):
        w.write("loss", loss, "nats", step=i + 1)
    w.write(
        "skipped_steps",
        len(s["skipped"]),
        "steps",
        steps=s["skipped"],
        of=len(s["losses"]),
        definition="optimizer steps skipped on fp16 overflow (no update applied, the loss scale lowered); "
        "left out of the timing medians",
    )
    agg = f"median of {n_measured} steps after {cfg.warmup_steps} warm-up"
    if s["skipped"]:
        agg += ", the skipped ones (fp16 overflow) left out"
    if cfg.profile:
        agg += f", the last {cfg.profile.steps} (traced by the profiler) left out"
    if s["step_time_s"] is not None and not s.get("instrumented"):  # under callgrind nothing was timed
        _write_timings(w, s, cfg, agg)
    w.write("num_params", s["psi"], "params")
    for r in s["ranks"]:
        _write_rank(w, r, cfg, bool(s.get("instrumented")))


def _write_timings(w: RowWriter, s: dict, cfg: TrainConfig, agg: str) -> None:
    for metric, unit, definition in _TIMINGS:
        t = s["timing"][metric]
        # samples: the measured steps in order, so an A/B comparison can pair step k of one side with step k
        # of the other (taken right after it in lockstep)
        w.write(
            metric,
            t["median"],
            unit,
            aggregate=agg,
            mad=t["mad"],
            n=len(t["samples"]),
            samples=t["samples"],
            definition=definition,
        )
    w.write("tflops_per_gpu", s["tflops_per_gpu"], "TFLOP/s", aggregate=agg, flops="model")
    w.write("hw_tflops_per_gpu", s["hw_tflops_per_gpu"], "TFLOP/s", aggregate=agg, flops="hardware (with recompute)")
    w.write("pflops_aggregate", s["tflops_per_gpu"] * cfg.world_size / 1e3, "PFLOP/s", aggregate=agg)
    w.write(
        "tokens_per_s_per_gpu",
        cfg.micro_batch * cfg.zero.grad_accum_steps * cfg.model.seq / cfg.tp / s["step_time_s"],
        "tokens/s",
    )


def _write_rank(w: RowWriter, r: dict, cfg: TrainConfig, instrumented: bool = False) -> None:
    rk = r["rank"]
    w.write("model_state_bytes", r["model_state_bytes"], "bytes", rank=rk)
    if r["analytic"] is not None:
        w.write("model_state_bytes_analytic", r["analytic"], "bytes", rank=rk)
    for cat, b in r["ledger"].items():
        w.write(f"memory_{cat}_bytes", b, "bytes", rank=rk)
    if r.get("host"):
        w.write(
            "host_model_state_bytes",
            r["host"]["measured"],
            "bytes",
            rank=rk,
            definition="model states in host memory under offload (NVMe files excluded)",
        )
        if r["host"]["analytic"] is not None:
            w.write("host_model_state_bytes_analytic", r["host"]["analytic"], "bytes", rank=rk)
    if r["comm_volume"] is not None:
        w.write("comm_volume_elements_per_step", r["comm_volume"], "elements", rank=rk, group="dp")
    if cfg.tp > 1 and r["comm_volume"] is not None:
        w.write("mp_comm_volume_elements_per_step", r["mp_volume"], "elements", rank=rk, group="tp")
        w.write("pa_comm_volume_elements_per_step", r["pa_volume"], "elements", rank=rk, group="tp")
    w.write(
        "peak_memory_bytes",
        r["peak"],
        "bytes",
        rank=rk,
        source="live-tensor tracker" if r["reserved"] is None else "torch.cuda.max_memory_allocated",
    )
    if r["reserved"] is not None:
        w.write("peak_reserved_bytes", r["reserved"], "bytes", rank=rk)
        w.write(
            "fragmentation_bytes",
            r["reserved"] - r["peak"],
            "bytes",
            rank=rk,
            definition="max reserved - max allocated",
        )
        w.write("alloc_retries", r["alloc_retries"], "count", rank=rk)
    if r["peak"] is not None:
        ckpt = r["ledger"].get("activation_checkpoints", 0)
        w.write(
            "memory_working_peak_bytes",
            r["peak"] - r["model_state_bytes"] - ckpt,
            "bytes",
            rank=rk,
            definition="peak live bytes - model states - activation checkpoints: working activations "
            "and transient buffers at the peak",
        )
    w.write("peak_rss_bytes", r["peak_rss"], "bytes", rank=rk)
    _write_host(w, r["host_work"], rk, instrumented)
    for cat, b in (r.get("rss_breakdown") or {}).items():
        w.write(
            f"rss_{cat}_bytes",
            b,
            "bytes",
            rank=rk,
            definition="resident bytes of this kind at the highest RSS sampled between operators "
            "(zerobench/metrics/rss.py)",
        )


_COUNTS = {
    "py_calls": ("calls", "Python functions and builtins called on the training thread (sys.setprofile)"),
    "ops_dispatched": ("ops", "operators dispatched (aten calls, each once)"),
    "allocations": (
        "allocations",
        (
            "storages allocated: the live-tensor tracker's new and regrown storages on "
            "CPU, the caching allocator's allocation count on a GPU"
        ),
    ),
    "allocated_bytes": ("bytes", "bytes those allocations added"),
    "collective_calls": ("calls", "collectives issued (the communication ledger)"),
    "collective_bytes": ("bytes", "bytes of the full tensors those collectives were given"),
}
_PHASES = "forward_backward (forward and the engine's backward), optimizer (the optimizer call), zero_grad, or step"


def _write_host(w: RowWriter, h: dict, rk: int, instrumented: bool) -> None:
    """A rank's host-work rows (``train/probes.py``): CPU time per phase (not in an ``instrumented`` run: nothing
    was timed), the counted step's counts and, under callgrind, its instructions; each with its ``phase``."""
    for phase, v in h["cpu_s"].items():
        if v is not None and not instrumented:
            w.write(
                "host_cpu_s",
                v,
                "s",
                rank=rk,
                phase=phase,
                definition=f"median over the timed steps of the rank's process CPU time (user + system, every "
                f"thread) in this phase: {_PHASES}",
            )
    counted = h["step"] + 1 if h["step"] is not None else None
    for phase, counts in h["counts"].items():
        for metric, v in counts.items():
            if v is not None:
                unit, definition = _COUNTS[metric]
                w.write(
                    metric,
                    v,
                    unit,
                    rank=rk,
                    phase=phase,
                    counted_step=counted,
                    definition=f"{definition}, in this phase of the counted step (the last warm-up step)",
                )
    for phase, v in (h["instructions"] or {}).items():
        w.write(
            "instructions",
            v,
            "instructions",
            rank=rk,
            phase=phase,
            counted_step=counted,
            definition="instructions executed by the rank's process (every thread) in this phase of the counted "
            "step, counted by valgrind's callgrind",
        )
