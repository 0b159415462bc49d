"""One training run on this rank: build, apply ZeRO, train on synthetic data, measure, write rows.

Rank 0 prints per-step loss, step time and TFLOPs, then the memory and communication ledgers, and
writes every rank's figures as rows (gathered over the default group, so one process writes).
"""

from __future__ import annotations

import contextlib
import statistics
import time
from pathlib import Path

import torch
import torch.distributed as dist

from zerobench.config import ConfigError
from zerobench.distributed.env import DistEnv, init_distributed
from zerobench.distributed.mesh import build_mesh
from zerobench.metrics.comm import CommLedger
from zerobench.metrics.memory import LiveTensorTracker, peak_rss_bytes, reset_peak_rss
from zerobench.models.sizes import flops_per_token, num_params
from zerobench.results.rows import RowWriter
from zerobench.train import faults, turnstile
from zerobench.train.config import TrainConfig
from zerobench.train.data import SyntheticTokens
from zerobench.train.entry import SystemEntry


def _fmt_bytes(n: float | None) -> str:
    return f"{'n/a':>14}" if n is None else f"{n / 2**20:10.2f} MiB"


def train(cfg: TrainConfig, denv: DistEnv, entry: SystemEntry, out_dir: str | Path | None, run_id: str = "train",
          log=print, suite: str | None = None) -> dict:
    """Train ``cfg`` with the registered system ``entry`` on this rank; returns rank 0's summary."""
    cfg.validate(denv.world_size)
    entry.validate(cfg)
    device = init_distributed(denv, cfg.collective_timeout_s)
    rank = dist.get_rank()
    say = log if rank == 0 else (lambda *a, **k: None)
    mesh = build_mesh(cfg.tp, cfg.dp, timeout_s=cfg.collective_timeout_s)
    ledger = CommLedger()
    system = entry.build(cfg, mesh, ledger, device)
    data = SyntheticTokens(cfg.model.vocab, cfg.model.seq, seed=cfg.seed)
    psi = num_params(cfg.model)
    # Every TP rank of a replica processes the replica's tokens; per GPU that is 1/tp of its FLOPs.
    tokens_per_rank = cfg.micro_batch * cfg.zero.grad_accum_steps * cfg.model.seq / cfg.tp
    fpt = flops_per_token(cfg.model)
    hw_fpt = flops_per_token(cfg.model, recompute=cfg.activation.checkpoint)
    cpu = device.type == "cpu"
    budget = cfg.memory_budget_bytes
    if budget is not None and not cpu:  # emulate a smaller card, e.g. a 32 GB V100 on an 80 GB H100
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), device)
    tracker = LiveTensorTracker(budget if cpu else None) if cpu and (cfg.track_memory or budget) else None
    if tracker is not None:
        for t in system.tensors():
            tracker.track(t)
    stage = entry.describe(cfg)  # a peer's sharding is in its name (deepspeed-2-offload: stage 2)
    say(
        f"zerobench train [{cfg.system}]: GPT {psi / 1e6:.2f}M params, {stage}, dp {cfg.dp}, tp {cfg.tp}, "
        f"{cfg.zero.precision.value}, global batch {cfg.global_batch} x {cfg.model.seq} tokens, device {device.type}"
    )
    tb = _tensorboard(cfg, run_id) if rank == 0 else None
    losses, times, norm, cpu_times = [], [], [], []
    lockstep = turnstile.enabled()  # interleaved A/B timing: steps alternate with the other side's
    turn = turnstile.from_env() if lockstep and rank == 0 else None
    planted = torch.empty(faults.planted_buffer_bytes(), dtype=torch.uint8, device=device)
    if tracker is not None:
        tracker.track(planted)
    with contextlib.ExitStack() as stack:
        if tracker is not None:
            stack.enter_context(tracker)
        if turn is not None:
            stack.callback(turn.close)
        for step in range(cfg.steps):
            if step == cfg.warmup_steps:
                if tracker is not None:
                    tracker.reset_peak()
                if not cpu:
                    torch.cuda.reset_peak_memory_stats(device)
                reset_peak_rss()
            faults.maybe_fail(rank, step)
            ledger.reset()
            if not cpu:
                torch.cuda.synchronize(device)
            if turn is not None:
                turn.acquire()
            if lockstep and dist.get_world_size() > 1:
                dist.barrier()
            t0, c0 = time.perf_counter(), time.process_time()
            total = torch.zeros(1, device=device)
            for micro in range(cfg.zero.grad_accum_steps):
                x, y = data.micro_batch(step, mesh.dp_rank, cfg.dp, micro, cfg.micro_batch)
                loss = system.forward_backward(x.to(device), y.to(device))
                total += loss.float() / cfg.zero.grad_accum_steps
            stepped = system.step()
            system.zero_grad()
            if not cpu:
                torch.cuda.synchronize(device)
            faults.planted_delay(cfg.zero.stage, time.perf_counter() - t0)
            dt = time.perf_counter() - t0
            cpu_times.append(time.process_time() - c0)
            norm.append(dt / _reference_seconds(device))
            dist.all_reduce(total, group=mesh.dp.pg)
            losses.append(total.item() / cfg.dp)
            if turn is not None:
                turn.release()
            times.append(dt)
            tflops = fpt * tokens_per_rank / dt / 1e12
            if tb is not None:
                tb.add_scalar("loss", losses[-1], step + 1)
                tb.add_scalar("step_time_s", dt, step + 1)
                tb.add_scalar("tflops_per_gpu", tflops, step + 1)
            say(
                f"step {step + 1:4d}/{cfg.steps}  loss {losses[-1]:.4f}  step {dt * 1e3:8.1f} ms  "
                f"{tflops:7.4f} TFLOPs/GPU" + ("" if stepped else "  (skipped: fp16 overflow)")
            )
    if tb is not None:
        tb.close()
    timing = {name: _robust(xs, cfg.warmup_steps) for name, xs in
              (("step_time_s", times), ("step_time_norm", norm), ("step_cpu_s", cpu_times))}
    step_time = timing["step_time_s"]["median"]
    if cpu:
        peak = tracker.peak if tracker is not None else None
    else:
        peak = torch.cuda.max_memory_allocated(device)
    led = system.memory_ledger()
    mine = {
        "rank": rank,
        "tp_rank": mesh.tp_rank,
        "dp_rank": mesh.dp_rank,
        "ledger": led,
        "model_state_bytes": system.model_state_bytes(),
        "analytic": system.model_state_bytes_analytic(),
        "host": system.host_state_bytes() if hasattr(system, "host_state_bytes") else None,
        "comm_volume": ledger.volume_elements(group="dp") if entry.records_dp_comm else None,
        "mp_volume": ledger.volume_elements(group="tp", tag="mp"),
        "pa_volume": ledger.volume_elements(group="tp", tag="pa"),
        "comm_summary": ledger.summary(),
        "peak": peak,
        "peak_rss": peak_rss_bytes(),
        "reserved": None if cpu else torch.cuda.max_memory_reserved(device),
        # M_D on GPU: fragmentation as reserved - allocated at peak, and the caching allocator's retries
        "alloc_retries": None if cpu else torch.cuda.memory_stats(device).get("num_alloc_retries", 0),
    }
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    summary = {
        "losses": losses, "step_time_s": step_time, "timing": timing, "n_measured": len(timing["step_time_s"]["samples"]),
        "tflops_per_gpu": fpt * tokens_per_rank / step_time / 1e12,
        "hw_tflops_per_gpu": hw_fpt * tokens_per_rank / step_time / 1e12, "ranks": everyone, "psi": psi,
    }
    if rank == 0:
        _report(summary, cfg, say)
        if out_dir is not None:
            _write_rows(RowWriter(out_dir, run_id, cfg, suite=suite), summary, cfg, summary["n_measured"])
            say(f"rows written to {Path(out_dir) / 'rows.jsonl'}")
    dist.barrier()
    return summary


_REF_A = None


def _reference_seconds(device: torch.device) -> float:
    """Time a fixed workload (a 256x256 fp32 matmul chain) right after each step: step / reference is a
    speed ratio measured side by side in the same process, so machine drift (clock, contention) cancels."""
    global _REF_A  # noqa: PLW0603 - a per-process constant, made once per device
    if _REF_A is None or _REF_A.device != device:
        g = torch.Generator().manual_seed(0)
        _REF_A = (torch.randn(256, 256, generator=g) / 16).to(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    x = _REF_A
    for _ in range(8):
        x = x @ _REF_A
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t0


def _tensorboard(cfg: TrainConfig, run_id: str):
    if not cfg.tensorboard_dir:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:
        raise ConfigError("--tensorboard needs the tensorboard package: pip install 'zerobench[tensorboard]'") from None
    return SummaryWriter(str(Path(cfg.tensorboard_dir) / run_id))


def _report(s: dict, cfg: TrainConfig, say) -> None:
    say(f"\nmedian step time {s['step_time_s'] * 1e3:.1f} ms, {s['tflops_per_gpu']:.4f} TFLOPs/GPU "
        f"(model FLOPs, Megatron count), {s['tflops_per_gpu'] * cfg.world_size / 1e3:.6f} PFLOPs aggregate")
    say("\nmemory ledger per rank (measured from the engine's tensors):")
    say(f"  {'rank':>4} {'params':>14} {'grads':>14} {'master':>14} {'optim states':>14} "
        f"{'model states':>14} {'analytic':>14} {'peak live':>14}")
    for r in s["ranks"]:
        L = r["ledger"]
        peak = _fmt_bytes(r["peak"]) if r["peak"] is not None else f"{'n/a':>14}"
        say(f"  {r['rank']:>4} {_fmt_bytes(L['params'])} {_fmt_bytes(L['grads'])} {_fmt_bytes(L['master'])} "
            f"{_fmt_bytes(L['optimizer_states'])} {_fmt_bytes(r['model_state_bytes'])} {_fmt_bytes(r['analytic'])} {peak}")
    if s["ranks"][0].get("host"):
        say("  offloaded, per rank (host memory; NVMe files):")
        for r in s["ranks"]:
            L, h = r["ledger"], r["host"]
            say(f"  {r['rank']:>4} {_fmt_bytes(L['host_params'])} {_fmt_bytes(L['host_grads'])} {_fmt_bytes(L['host_master'])} "
                f"{_fmt_bytes(L['host_optimizer_states'])} {_fmt_bytes(h['measured'])} {_fmt_bytes(h['analytic'])}"
                + (f"  NVMe {_fmt_bytes(L['nvme_optimizer_states'])}" if L["nvme_optimizer_states"] else ""))
    if s["ranks"][0]["comm_volume"] is None:  # the system's collectives are not in zerobench's ledger
        say("\n(communication of baseline systems is not recorded in zerobench's ledger)")
        return
    say("\ncommunication ledger per step, rank 0 (volume = paper §7 accounting, elements):")
    for c in s["ranks"][0]["comm_summary"]:
        say(f"  {c['group']:>3} {c['op']:<15} {c['tag']:<10} calls {c['calls']:5d}  "
            f"elements {c['numel']:12d}  volume {c['volume_elements']:14.0f}")
    psi, n = s["psi"], cfg.dp
    factor = 3 if cfg.zero.stage == 3 else 2
    psi_local = psi / cfg.tp  # approximately: the TP-replicated parameters are a small part
    say(f"  DP volume {s['ranks'][0]['comm_volume']:.0f} elements; paper: {factor}Ψ(N-1)/N = "
        f"{factor * psi_local * (n - 1) / n:.0f}" + (" (Ψ per TP rank ≈ Ψ/MP)" if cfg.tp > 1 else ""))
    if cfg.tp > 1:
        r0 = s["ranks"][0]
        say(f"  MP volume in blocks {r0['mp_volume']:.0f} elements; P_a all-gathers {r0['pa_volume']:.0f}")


_TIMINGS = (
    ("step_time_s", "s", "median over steps of the wall-clock step time (forward, backward, optimizer step)"),
    ("step_time_norm", "ratio", ("median over steps of step time / a fixed 256x256 matmul chain timed right "
                                 "after the step in the same process")),
    ("step_cpu_s", "s", ("median over steps of the rank's process CPU time (all threads) during the step: time "
                         "the rank was not running (other processes, VM steal) is not counted")),
)


def _robust(xs: list[float], warmup: int) -> dict:
    """Median and median absolute deviation of the steps after warm-up (all steps if there are no others)."""
    m = xs[warmup:] or xs
    med = statistics.median(m)
    return {"median": med, "mad": statistics.median(abs(t - med) for t in m), "samples": m}


def _write_rows(w: RowWriter, s: dict, cfg: TrainConfig, n_measured: int) -> None:
    for i, loss in enumerate(s["losses"]):
        w.write("loss", loss, "nats", step=i + 1)
    agg = f"median of {n_measured} steps after {cfg.warmup_steps} warm-up"
    for metric, unit, definition in _TIMINGS:
        t = s["timing"][metric]
        # samples: the measured steps in order, so an A/B comparison can pair step k of one side with step k
        # of the other (taken right after it in lockstep)
        w.write(metric, t["median"], unit, aggregate=agg, mad=t["mad"], n=len(t["samples"]), samples=t["samples"],
                definition=definition)
    w.write("tflops_per_gpu", s["tflops_per_gpu"], "TFLOP/s", aggregate=agg, flops="model")
    w.write("hw_tflops_per_gpu", s["hw_tflops_per_gpu"], "TFLOP/s", aggregate=agg, flops="hardware (with recompute)")
    w.write("pflops_aggregate", s["tflops_per_gpu"] * cfg.world_size / 1e3, "PFLOP/s", aggregate=agg)
    w.write("tokens_per_s_per_gpu", cfg.micro_batch * cfg.zero.grad_accum_steps * cfg.model.seq / cfg.tp / s["step_time_s"], "tokens/s")
    w.write("num_params", s["psi"], "params")
    for r in s["ranks"]:
        rk = r["rank"]
        w.write("model_state_bytes", r["model_state_bytes"], "bytes", rank=rk)
        if r["analytic"] is not None:
            w.write("model_state_bytes_analytic", r["analytic"], "bytes", rank=rk)
        for cat, b in r["ledger"].items():
            w.write(f"memory_{cat}_bytes", b, "bytes", rank=rk)
        if r.get("host"):
            w.write("host_model_state_bytes", r["host"]["measured"], "bytes", rank=rk,
                    definition="model states in host memory under offload (NVMe files excluded)")
            if r["host"]["analytic"] is not None:
                w.write("host_model_state_bytes_analytic", r["host"]["analytic"], "bytes", rank=rk)
        if r["comm_volume"] is not None:
            w.write("comm_volume_elements_per_step", r["comm_volume"], "elements", rank=rk, group="dp")
        if cfg.tp > 1 and r["comm_volume"] is not None:
            w.write("mp_comm_volume_elements_per_step", r["mp_volume"], "elements", rank=rk, group="tp")
            w.write("pa_comm_volume_elements_per_step", r["pa_volume"], "elements", rank=rk, group="tp")
        w.write("peak_memory_bytes", r["peak"], "bytes", rank=rk,
                source="live-tensor tracker" if r["reserved"] is None else "torch.cuda.max_memory_allocated")
        if r["reserved"] is not None:
            w.write("peak_reserved_bytes", r["reserved"], "bytes", rank=rk)
            w.write("fragmentation_bytes", r["reserved"] - r["peak"], "bytes", rank=rk,
                    definition="max reserved - max allocated")
            w.write("alloc_retries", r["alloc_retries"], "count", rank=rk)
        if r["peak"] is not None:
            ckpt = r["ledger"].get("activation_checkpoints", 0)
            w.write("memory_working_peak_bytes", r["peak"] - r["model_state_bytes"] - ckpt, "bytes", rank=rk,
                    definition="peak live bytes - model states - activation checkpoints: working activations "
                               "and transient buffers at the peak")
        w.write("peak_rss_bytes", r["peak_rss"], "bytes", rank=rk)
