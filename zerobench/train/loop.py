"""One training run on this rank: build the system, train on synthetic data, time and measure each step.

Everything around a step — console lines, TensorBoard, lockstep A/B turns, test-only plantings — is a hook
(``train/hooks.py``) the loop is handed through ``RankSettings``; the system comes in as a registered
``SystemEntry``. After the last step every rank's figures are gathered (over the default group) and rank 0
prints the ledgers and writes the rows (``train/summary.py``). A run that did not train (every step skipped
on fp16 overflow, a loss that is not finite at the end: ``train/outcome.py``), or one a step halted
(``TrainingHalted``: the loss scale at its minimum), raises ``RunFailed`` on every rank once its rows, the
halting step's included, are written.
"""

from __future__ import annotations

import contextlib
import functools
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from zerobench.config import ConfigError, RunFailed, TrainingHalted
from zerobench.distributed.env import DistEnv, init_distributed
from zerobench.distributed.mesh import Mesh, build_mesh
from zerobench.metrics.comm import CommLedger
from zerobench.metrics.memory import LiveTensorTracker, peak_rss_bytes, reset_peak_rss, untracked
from zerobench.models.sizes import flops_per_token, num_params
from zerobench.results.rows import RowWriter
from zerobench.train.config import TrainConfig
from zerobench.train.data import data_source
from zerobench.train.entry import SystemEntry
from zerobench.train.hooks import LoopHooks, RankSettings, StepRecord, build_hooks
from zerobench.train.outcome import failure, timed_steps
from zerobench.train.probes import PHASES, StepProbe, counted_step
from zerobench.train.summary import report, robust, write_rows


@dataclass
class _Run:
    """What one rank's run is made of, once set up."""

    cfg: TrainConfig
    device: torch.device
    mesh: Mesh
    ledger: CommLedger
    system: object
    tracker: LiveTensorTracker | None

    @property
    def cpu(self) -> bool:
        return self.device.type == "cpu"

    @property
    def tokens_per_rank(self) -> float:
        # Every TP rank of a replica processes the replica's tokens; per GPU that is 1/tp of its FLOPs.
        c = self.cfg
        return c.micro_batch * c.zero.grad_accum_steps * c.model.seq / c.tp


def train(
    cfg: TrainConfig,
    denv: DistEnv,
    entry: SystemEntry,
    out_dir: str | Path | None,
    run_id: str = "train",
    log=print,
    suite: str | None = None,
    settings: RankSettings | None = None,
) -> dict:
    """Train ``cfg`` with the registered system ``entry`` on this rank; returns the gathered summary.

    Raises ``RunFailed`` (on every rank alike, after rank 0 wrote the rows) when the run did not train."""
    cfg.validate(denv.world_size)
    entry.validate(cfg)
    settings = settings or RankSettings()
    run = _setup(cfg, denv, entry, settings.native_collectives, settings.rss_breakdown)
    rank = dist.get_rank()
    say = log if rank == 0 else (lambda *a, **k: None)
    say(
        f"zerobench train [{cfg.system}]: GPT {num_params(cfg.model) / 1e6:.2f}M params, {entry.describe(cfg)}, "
        f"dp {cfg.dp}, tp {cfg.tp}, {cfg.zero.precision.value}, global batch {cfg.global_batch} x {cfg.model.seq} "
        f"tokens, device {run.device.type}"
    )
    barrier = dist.barrier if dist.get_world_size() > 1 else (lambda: None)
    hooks = build_hooks(cfg, settings, rank, say, run_id, barrier, run.device)
    probe = _probe(run, hooks, settings.callgrind, rank)
    # under callgrind the run ends with its counted step: later steps would only be timed, and nothing is timed
    n_steps = cfg.steps if settings.callgrind is None else probe.counted + 1
    with contextlib.ExitStack() as stack:
        stack.callback(hooks.close)
        records, series, halted = _steps(run, hooks, stack, probe, n_steps)
    if probe.marks is not None:
        probe.read_instructions()
    summary = _summarize(run, entry, records, series, probe, halted)
    summary["instrumented"] = settings.callgrind is not None
    if rank == 0:
        report(summary, cfg, say)
        if out_dir is not None:
            tags = {"instrumented": "callgrind"} if settings.callgrind is not None else {}
            if summary["kernels"] is not None:  # what "auto" resolved to on these ranks: part of what was measured
                tags["kernels_ran"] = summary["kernels"]
            tags["backend_ran"] = dist.get_backend()  # and what --backend auto resolved to (gloo or nccl)
            write_rows(RowWriter(out_dir, run_id, cfg, suite=suite, tags=tags), summary, cfg, summary["n_measured"])
            say(f"rows written to {Path(out_dir) / 'rows.jsonl'}")
    dist.barrier()
    if summary["failure"] is not None:
        raise RunFailed(summary["failure"])
    return summary


def _setup(cfg: TrainConfig, denv: DistEnv, entry: SystemEntry, native_collectives: bool, rss: bool) -> _Run:
    device = init_distributed(denv, cfg.collective_timeout_s, cfg.backend)
    mesh = build_mesh(cfg.tp, cfg.dp, timeout_s=cfg.collective_timeout_s, native_collectives=native_collectives)
    ledger = CommLedger()
    system = entry.build(cfg, mesh, ledger, device)
    cpu, budget = device.type == "cpu", cfg.memory_budget_bytes
    if budget is not None and not cpu:  # emulate a smaller card, e.g. a 32 GB V100 on an 80 GB H100
        total = torch.cuda.get_device_properties(device).total_memory
        torch.cuda.set_per_process_memory_fraction(min(1.0, budget / total), device)
    tracker = LiveTensorTracker(budget if cpu else None, rss) if cpu and (cfg.track_memory or budget) else None
    if tracker is not None and not getattr(system, "op_counting", True):
        raise ConfigError(
            f"{cfg.system}: compiled code (torch.compile) does not run under the CPU's live-tensor tracker, a "
            "dispatch mode: pass --no-track-memory and no --memory-budget, or use uncompiled kernels"
        )
    if tracker is not None:
        for t in system.tensors():
            tracker.track(t)
    return _Run(cfg, device, mesh, ledger, system, tracker)


def _probe(run: _Run, hooks: LoopHooks, callgrind: str | None, rank: int) -> StepProbe:
    """The step probe (``train/probes.py``). In an instrumented run (``callgrind``: where the dumps go; every
    rank is told) the ranks that run under callgrind (rank 0 at least) also mark the counted step's phases
    for the instruction counts. A system whose ``op_counting`` is False (``torch.compile``'d code, which refuses to
    run under a dispatch mode) has no counted step."""
    counted, marks, read = counted_step(run.cfg.warmup_steps), None, None
    if not getattr(run.system, "op_counting", True):  # compiled code cannot run under the operator counter
        counted = None
    if callgrind is not None:
        from zerobench.metrics.callgrind import CallgrindUnavailable, Marks, read_counts

        if counted is None:
            raise ConfigError(
                "counting instructions needs a warm-up step (warmup >= 1): the counted step is the last warm-up step"
            )
        try:
            marks = Marks()
        except CallgrindUnavailable as e:
            raise ConfigError(str(e)) from None
        if not marks.running:
            if rank == 0:
                raise ConfigError(
                    "asked to count instructions (ZEROBENCH_CALLGRIND) but rank 0 does not run under "
                    "valgrind: start the run with zerobench sweep --instructions"
                )
            marks = None
        read = functools.partial(read_counts, callgrind, f"rank{rank}")
    return StepProbe(counted, run.ledger, run.tracker, run.device, marks, read, hooks.after_phase)


def _steps(
    run: _Run, hooks: LoopHooks, stack: contextlib.ExitStack, probe: StepProbe, n_steps: int
) -> tuple[list[StepRecord], dict[str, list[float]], str | None]:
    """Train ``n_steps`` steps, each in ``probe``'s phases; each step's record (loss, whether the optimizer
    stepped), the timing series (wall, normalised, CPU) and why a step halted training (None: every step ran).
    A halting step (``TrainingHalted``, raised on every rank alike) applied no update: it is recorded as skipped
    and is the last."""
    cfg, device, system = run.cfg, run.device, run.system
    data = data_source(cfg)
    fpt = flops_per_token(cfg.model)
    planted = torch.empty(hooks.extra_buffer_bytes, dtype=torch.uint8, device=device)
    if run.tracker is not None:
        run.tracker.track(planted)
        stack.enter_context(run.tracker)
    records: list[StepRecord] = []
    series: dict[str, list[float]] = {"step_time_s": [], "step_time_norm": [], "step_cpu_s": []}
    for step in range(n_steps):
        if step == cfg.warmup_steps:
            _reset_peaks(run)
        hooks.before_step(step)
        run.ledger.reset()
        # The step's samples are made before the clock starts, as a prefetching loader has them ready: the
        # synthetic generator is a Python loop over the sequence (0.5 ms a micro-batch at the tiny preset, 12%
        # of its step on a 2-core host), not the training being measured.
        batches = [
            data.micro_batch(step, run.mesh.dp_rank, cfg.dp, micro, cfg.micro_batch)
            for micro in range(cfg.zero.grad_accum_steps)
        ]
        _sync(device)
        t0, c0 = time.perf_counter(), time.process_time()
        total = torch.zeros(1, device=device)
        halted = None
        with probe.step(step):
            with probe.phase("forward_backward"):
                for x, y in batches:
                    total += system.forward_backward(x.to(device), y.to(device)).float() / cfg.zero.grad_accum_steps
            with probe.phase("optimizer"):
                try:
                    stepped = system.step()
                except TrainingHalted as e:
                    stepped, halted = False, str(e)
            with probe.phase("zero_grad"):
                system.zero_grad()
        _sync(device)
        hooks.after_compute(step, time.perf_counter() - t0)
        dt = time.perf_counter() - t0
        series["step_cpu_s"].append(time.process_time() - c0)
        series["step_time_norm"].append(dt / _reference_seconds(device))
        dist.all_reduce(total, group=run.mesh.dp.pg)
        series["step_time_s"].append(dt)
        records.append(StepRecord(step + 1, total.item() / cfg.dp, dt, fpt * run.tokens_per_rank / dt / 1e12, stepped))
        hooks.after_step(records[-1])
        if halted is not None:
            return records, series, halted
    return records, series, None


def _sync(device: torch.device) -> None:
    if device.type != "cpu":
        torch.cuda.synchronize(device)


def _reset_peaks(run: _Run) -> None:
    """Peaks are measured after warm-up."""
    if run.tracker is not None:
        run.tracker.reset_peak()
    if not run.cpu:
        torch.cuda.reset_peak_memory_stats(run.device)
    reset_peak_rss()


def _summarize(
    run: _Run,
    entry: SystemEntry,
    records: list[StepRecord],
    series: dict[str, list[float]],
    probe: StepProbe,
    halted: str | None,
) -> dict:
    """This rank's figures gathered from every rank, with the run's medians and FLOP rates (None where every
    timed step was skipped) and why the run failed (None: it trained; ``halted``, a step's reason, first)."""
    cfg, device, system, ledger = run.cfg, run.device, run.system, run.ledger
    traced = cfg.profile.steps if cfg.profile else 0  # the profiler's steps ran slower: left out
    losses, skipped = [r.loss for r in records], [r.step for r in records if not r.stepped]
    timed = timed_steps(len(records), cfg.warmup_steps, traced, set(skipped))
    timing = {name: robust([xs[i] for i in timed]) for name, xs in series.items()}
    step_time = timing["step_time_s"]["median"]
    peak = (
        (run.tracker.peak if run.tracker is not None else None) if run.cpu else torch.cuda.max_memory_allocated(device)
    )
    mine = {
        "rank": dist.get_rank(),
        "tp_rank": run.mesh.tp_rank,
        "dp_rank": run.mesh.dp_rank,
        "ledger": system.memory_ledger(),
        "model_state_bytes": system.model_state_bytes(),
        "analytic": system.model_state_bytes_analytic(),
        "host": system.host_state_bytes() if hasattr(system, "host_state_bytes") else None,
        "kernels": system.kernel_paths() if hasattr(system, "kernel_paths") else None,
        "comm_volume": ledger.volume_elements(group="dp") if entry.records_dp_comm else None,
        "mp_volume": ledger.volume_elements(group="tp", tag="mp"),
        "pa_volume": ledger.volume_elements(group="tp", tag="pa"),
        "comm_summary": ledger.summary(),
        "peak": peak,
        "peak_rss": peak_rss_bytes(),
        "rss_breakdown": run.tracker.rss.breakdown if run.tracker is not None and run.tracker.rss else None,
        "reserved": None if run.cpu else torch.cuda.max_memory_reserved(device),
        # M_D on GPU: fragmentation as reserved - allocated at peak, and the caching allocator's retries
        "alloc_retries": None if run.cpu else torch.cuda.memory_stats(device).get("num_alloc_retries", 0),
        "failure": halted or failure(losses, skipped, len(timed)),
        "host_work": _host(probe, series["step_cpu_s"], timed),
    }
    everyone: list = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    per_token = run.tokens_per_rank / step_time / 1e12 if step_time is not None else None
    return {
        "losses": losses,
        "skipped": skipped,
        "step_time_s": step_time,
        "timing": timing,
        "n_measured": len(timed),
        "tflops_per_gpu": flops_per_token(cfg.model) * per_token if per_token is not None else None,
        "hw_tflops_per_gpu": (
            flops_per_token(cfg.model, recompute=cfg.activation.checkpoint) * per_token
            if per_token is not None
            else None
        ),
        "ranks": everyone,
        "kernels": _kernels_ran(everyone),
        "psi": num_params(cfg.model),
        # every rank judged its own figures; the first failure any rank saw is the run's, on every rank
        "failure": next((r["failure"] for r in everyone if r["failure"] is not None), None),
    }


def _kernels_ran(ranks: list[dict]) -> dict[str, str] | None:
    """The kernels' paths of the run (``kernel_paths``): each part's path where every rank took it, else "mixed"
    (a node whose fused kernels did not load); None for a system without them."""
    paths = [r["kernels"] for r in ranks if r["kernels"] is not None]
    if not paths:
        return None
    return {part: paths[0][part] if len({p[part] for p in paths}) == 1 else "mixed" for part in paths[0]}


def _host(probe: StepProbe, step_cpu: list[float], timed: list[int]) -> dict:
    """This rank's host-work figures: median CPU time per phase and per step over the timed steps (None when
    none was timed), the counted step's counts and instructions."""
    cpu = {p: robust([probe.cpu[p][i] for i in timed])["median"] for p in PHASES}
    cpu["step"] = robust([step_cpu[i] for i in timed])["median"]
    return {
        "cpu_s": cpu,
        "counts": probe.counts if "step" in probe.counts else {},
        "step": probe.counted,
        "instructions": probe.instructions,
    }


@functools.lru_cache(maxsize=4)
def _reference_matrix(device: torch.device) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    return (torch.randn(256, 256, generator=g) / 16).to(device)


def _reference_seconds(device: torch.device) -> float:
    """Time a fixed workload (a 256x256 fp32 matmul chain) right after each step: step / reference is a
    speed ratio measured side by side in the same process, so machine drift (clock, contention) cancels. The
    harness's own tensors are not the run's: they are made outside the live-tensor tracker (its peak, and a
    memory budget, count the training's tensors only)."""
    with untracked():
        a = _reference_matrix(device)
        _sync(device)
        t0 = time.perf_counter()
        x = a
        for _ in range(8):
            x = x @ a
        _sync(device)
        return time.perf_counter() - t0
