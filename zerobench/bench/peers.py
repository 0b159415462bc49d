"""``zerobench peers``: zerobench's stages and the peer systems trained side by side, measured alike.

Every candidate trains the same GPT (same init, same synthetic data, same global batch, same AdamW) on the same
number of local processes, as the same plain modules (zerobench's fused model kernels off, so the engines are what
differs; each system keeps its own optimizer kernel: torch's fused AdamW, zerobench's). Candidates are interleaved
round by round, each round starting one candidate later (A B C, B C A, C A B ...), each run a fresh set of
processes, so slow drift of the machine, and whatever the first or last run of a round meets, hits all of them
alike; a candidate's speed is the median over rounds of (its median step time / torch-ddp's in the same round).
Peak memory per rank comes from one extra run per candidate under the same live-tensor tracker (every tensor allocated through torch,
whoever allocates it) and from VmHWM with ``MALLOC_MMAP_THRESHOLD_=65536`` so freed memory returns to the OS;
the same run breaks its highest sampled RSS down by category (tensors, libraries, heap, native buffers;
``metrics/rss.py``), which says where host memory beyond the tensors goes. Only that run sets the malloc
threshold: timing runs keep the allocator users get, since with every block over 64 KiB a fresh ``mmap``
each allocation page-faults, which taxes systems that allocate per step (small4 DP 2: DDP 754 vs 653 ms,
stage 3 1261 vs 814 ms) and would time the setting instead of the engines.
Loss parity is against a single-process torch run of the same global batch. Everything becomes rows.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from zerobench.bench.stats import median_ratio, median_standard_error
from zerobench.config import ConfigError
from zerobench.launch.base import write_status
from zerobench.launch.cancel import Cancellation, Cancelled
from zerobench.launch.local import check_local_world, launch_local
from zerobench.metrics.peak import dense_bf16_peak, mfu
from zerobench.metrics.rss import CATEGORIES
from zerobench.metrics.rss import ENV as RSS_ENV
from zerobench.models.sizes import flops_per_token
from zerobench.models.sizes import preset as get_preset
from zerobench.peers.registry import (
    DEEPSPEED_PEERS,
    SHARDING,
    TORCH_PEERS,
    deepspeed_available,
)
from zerobench.results.rows import RowWriter, read_rows
from zerobench.systems import validate_run
from zerobench.train.config import ProfileConfig, TrainConfig
from zerobench.zero.config import Precision, ZeroConfig

ZEROBENCH = (*(f"zerobench-{s}" for s in range(4)), "zerobench-2-offload", "zerobench-3-offload")
"""zerobench's default candidates; ``-offload`` ones keep the optimizer on the host (ZeRO-Offload)."""
ZEROBENCH_OPTIONAL = (
    "zerobench-2-no-overlap",
    "zerobench-3-no-overlap",
    *(f"zerobench-{s}-compiled" for s in range(4)),
)
"""zerobench candidates run only when named in ``--systems``: ``overlap_comm`` off (``ZeroConfig``), or each block
compiled (``--kernels compiled``; the counterpart of ``fsdp2-compiled``, and like it minutes of compiling on a
CPU, where it also needs ``--no-memory-run``: compiled code does not run under the live-tensor tracker)."""
ZEROBENCH_ALL = ZEROBENCH + ZEROBENCH_OPTIONAL
MEMORY_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536", RSS_ENV: "1"}
COMPARISON_FILE = "comparison.json"
"""The comparison's settings, written before its first run (``bench/peers_stopped.py`` reads them back)."""


@dataclass(frozen=True)
class PeersConfig:
    """One side-by-side comparison."""

    systems: tuple[str, ...] = field(default_factory=tuple)
    """Candidates: ``zerobench-0..3`` and peer names; empty = zerobench 0-3, torch peers, DeepSpeed if installed."""
    dp: int = 2
    """Processes (data-parallel degree)."""
    preset: str = "tiny"
    """Model preset (``zerobench/models/sizes.py``); ``layers``/``hidden`` override it."""
    layers: int | None = None
    """Override the preset's layer count."""
    hidden: int | None = None
    """Override the preset's hidden size (heads stay the preset's)."""
    seq: int | None = None
    """Override the preset's sequence length (fewer tokens per step: model states dominate)."""
    heads: int | None = None
    """Override the preset's attention heads (with ``hidden``: a GPT-3 shape, e.g. 2048 / 16)."""
    vocab: int | None = None
    """Override the preset's vocabulary."""
    precision: str = "fp32"
    """fp32 or bf16: zerobench's recipe (``Precision``), each peer's own mixed precision (``peers/``)."""
    micro_batch: int = 2
    """Sequences per micro-batch per process."""
    steps: int = 6
    """Steps per run (the first ``warmup`` excluded from the median)."""
    warmup: int = 2
    """Warm-up steps per run."""
    rounds: int = 3
    """Interleaved timing rounds."""
    memory_run: bool = True
    """One extra run per candidate under the live-tensor tracker (peak live bytes) and ``MEMORY_ENV`` (peak RSS
    and its breakdown); without it peak RSS comes from round 0, under the default allocator."""
    timeout_s: float = 1800.0
    """Per run."""
    reference_run: bool = True
    """One more run, torch-ddp in one process on the global batch, which every candidate's losses are compared
    with; without it no loss parity is claimed (``--no-reference-run``: a short device budget)."""
    profile: str | None = None
    """Trace the last ``ProfileConfig.steps`` of each round's runs with torch.profiler, under
    ``<profile>/<run id>/`` (``train/profiling.py``): each system exactly as the table runs it. The traced steps
    are left out of the medians; ``None``: no profiler."""

    def candidates(self) -> tuple[str, ...]:
        if self.systems:
            return self.systems
        ds = DEEPSPEED_PEERS if deepspeed_available() else ()
        return ZEROBENCH + TORCH_PEERS + ds

    def not_run(self) -> dict[str, str]:
        """The default set's peers that cannot run here, each with why: recorded as not run, so that a summary
        without them says so instead of leaving them out (and their zerobench stages without a verdict)."""
        if self.systems or deepspeed_available():
            return {}
        why = "not run: DeepSpeed is not installed here (pip install 'zerobench[deepspeed]')"
        return dict.fromkeys(DEEPSPEED_PEERS, why)

    def validate(self) -> None:
        """One line for the first thing the comparison could not run; the world first, before the candidates'
        look-up imports DeepSpeed."""
        check_local_world(self.dp, f"--dp {self.dp}", "every candidate trains on this host: give a smaller --dp")
        known = set(ZEROBENCH_ALL) | set(SHARDING)
        for s in self.candidates():
            if s not in known:
                raise ConfigError(f"unknown system {s!r}: choose from {', '.join(ZEROBENCH_ALL + tuple(SHARDING))}")
        seen = set()
        for s in self.candidates():
            if s in seen:
                raise ConfigError(
                    f"--systems names {s} twice: each system runs once a round (its runs share one directory)"
                )
            seen.add(s)
        if self.dp < 1 or self.rounds < 1 or self.steps <= self.warmup:
            raise ConfigError("need --dp >= 1, --rounds >= 1 and --steps > --warmup")
        traced = ProfileConfig.steps if self.profile else 0
        if self.steps <= self.warmup + traced:
            raise ConfigError(
                f"--profile traces the last {traced} steps, which the medians leave out: give --steps "
                f"{self.warmup + traced + 1} or more with --warmup {self.warmup}"
            )
        if self.precision not in ("fp32", "bf16"):
            raise ConfigError(f"--precision {self.precision}: the comparison runs fp32 or bf16")
        compiled = [s for s in self.candidates() if s.endswith("-compiled")]
        if compiled and self.memory_run and not _cuda():
            raise ConfigError(
                f"{', '.join(compiled)} on a CPU: compiled code does not run under the memory run's live-tensor "
                "tracker, so the candidate would fail after its timed rounds: pass --no-memory-run"
            )


def _cuda() -> bool:
    """Whether this machine's runs go to a GPU (where the memory run reads the CUDA allocator, no tracker)."""
    import torch

    return torch.cuda.is_available()


def train_config(
    p: PeersConfig, system: str, dp: int | None = None, micro_batch: int | None = None, track_memory: bool = False
) -> TrainConfig:
    model = get_preset(p.preset)
    over = {
        k: v
        for k, v in (("layers", p.layers), ("hidden", p.hidden), ("seq", p.seq), ("heads", p.heads), ("vocab", p.vocab))
        if v
    }
    model = dataclasses.replace(model, **over)
    ours = system in ZEROBENCH_ALL
    stage = int(system.split("-")[1]) if ours else 0
    offload = "cpu" if ours and system.endswith("-offload") else "none"
    zero = ZeroConfig(
        stage=stage,
        offload_optimizer=offload,
        overlap_comm=not system.endswith("-no-overlap"),
        precision=Precision(p.precision),
    )
    cfg = TrainConfig(
        model=model,
        zero=zero,
        preset=p.preset,
        dp=dp or p.dp,
        micro_batch=micro_batch or p.micro_batch,
        steps=p.steps,
        warmup_steps=p.warmup,
        system="zerobench" if ours else system,
        track_memory=track_memory,
        # every system trains the same plain model, the comparison being of the engines; the compiled candidates
        # compile its blocks, as fsdp2-compiled does
        kernels="compiled" if ours and system.endswith("-compiled") else "reference",
    )
    validate_run(cfg)
    return cfg


def traced(p: PeersConfig, cfg: TrainConfig) -> TrainConfig:
    """A round's run under the profiler when the comparison asks for traces (``PeersConfig.profile``)."""
    return dataclasses.replace(cfg, profile=ProfileConfig(dir=p.profile)) if p.profile else cfg


def _metric(rows: list[dict], metric: str) -> list[dict]:
    return [r for r in rows if r["metric"] == metric and r.get("status", "ok") == "ok"]


def run_peers(p: PeersConfig, out: Path, say: Callable[[str], None] = print) -> list[dict]:
    """Run the comparison; write every run's rows under ``out`` and a summary to ``out/summary``."""
    p.validate()
    cands = p.candidates()
    out.mkdir(parents=True, exist_ok=True)
    runs: list[tuple[str, str, TrainConfig]] = []
    for r in range(p.rounds):  # each round starts one candidate later: no candidate always runs first (or last)
        k = r % len(cands)
        runs += [(f"r{r}-{c}", c, traced(p, train_config(p, c))) for c in (*cands[k:], *cands[:k])]
    if p.memory_run:
        runs += [(f"mem-{c}", c, train_config(p, c, track_memory=True)) for c in cands]
    if p.reference_run:
        runs.append(("reference", "torch-ddp", train_config(p, "torch-ddp", dp=1, micro_batch=p.micro_batch * p.dp)))
    taken = [run_id for run_id, _, _ in runs if (out / run_id).exists()]
    if taken:
        raise ConfigError(
            f"{out} already holds rows of a comparison (e.g. {taken[0]}/): choose a new --out "
            "(a comparison never mixes its rows with an earlier one's)"
        )
    traces = [run_id for run_id, _, cfg in runs if cfg.profile and any((Path(p.profile) / run_id).glob("rank*"))]
    if traces:  # each run's profiler would refuse them itself, but only once the comparison had spent its runs
        raise ConfigError(
            f"--profile {p.profile} already holds the traces of a run {traces[0]!r}: give another --profile "
            "directory (a run never overwrites another's traces)"
        )
    absent = p.not_run()
    (out / COMPARISON_FILE).write_text(
        json.dumps({"peers": dataclasses.asdict(p), "candidates": list(cands), "not_run": absent}, indent=1)
    )
    for c, why in absent.items():
        say(f"  {c}: {why}")
    failed: dict[str, str] = {}
    with Cancellation() as cancel:  # SIGTERM/SIGINT stop the comparison, not only the run in progress
        for i, (run_id, cand, cfg) in enumerate(runs):
            if cand in failed and run_id != "reference":
                continue
            say(f"[{i + 1}/{len(runs)}] {run_id}")
            res = launch_local(
                cfg,
                out / run_id,
                run_id,
                timeout_s=p.timeout_s,
                extra_env=MEMORY_ENV if run_id.startswith("mem-") else None,
                log_path=out / f"{run_id}.log",
                cancel=cancel,
            )
            write_status(res, out / run_id, run_id, cfg)
            if cancel.requested:
                raise Cancelled(
                    f"cancelled ({cancel.requested}) during {run_id}; the runs so far are under {out} "
                    f"(zerobench peers --summarize {out} tables them)"
                )
            if not res.ok:
                failed[cand] = res.reason
                say(f"  failed: {res.reason}")
    return summarize(p, out, (*cands, *absent), {**failed, **absent})


def summarize(p: PeersConfig, out: Path, cands: tuple[str, ...], failed: dict[str, str]) -> list[dict]:
    @functools.cache  # a run's rows are read once, however many figures come from them
    def rows(run_id):
        path = out / run_id
        return read_rows(path) if path.exists() else []

    ref_losses = [r["value"] for r in sorted(_metric(rows("reference"), "loss"), key=lambda r: r["step"])]
    measured = [r for c in cands for r in rows(f"r0-{c}")[:1]]  # the summary says where the runs ran
    hardware = (measured[0].get("provenance") or {}).get("hardware") if measured else None
    flops = model_flops_per_step(p)
    round_times = {
        c: [(_metric(rows(f"r{r}-{c}"), "step_time_s") or [{"value": None}])[0]["value"] for r in range(p.rounds)]
        for c in cands
    }
    records = []
    for c in cands:
        rec: dict = {
            "candidate": c,
            "sharding_stage": sharding_stage(c, p.dp),
            "status": "failed" if c in failed else "ok",
            "reason": failed.get(c, ""),
        }
        pairs = _same_rounds(round_times[c], round_times.get("torch-ddp", []))
        # the step time is over the rounds torch-ddp also finished, as its ratio is; without torch-ddp (it failed,
        # was cut, or was not asked for) over the candidate's own rounds: a measured time is never dropped
        times = [t for t, _ in pairs] or [t for t in round_times[c] if t is not None]
        if times:
            rec["step_time_s"] = statistics.median(times)
            rec["round_step_time_s"] = round_times[c]
            rec["model_flops_per_step"] = flops
            if (u := mfu(flops, rec["step_time_s"], (hardware or {}).get("device"), p.precision)) is not None:
                rec["mfu"] = u
        if pairs:
            rec["time_vs_torch_ddp"] = median_ratio(*zip(*pairs))  # per-round ratios, then the median
        rec.update(_device_memory([rows(f"r{r}-{c}") for r in range(p.rounds)]))
        mem = rows(f"mem-{c}")
        live = [r["value"] for r in _metric(mem, "peak_memory_bytes") if r["value"] is not None]
        # peak RSS from the memory runs where the comparison has them (a round's run is measured under another
        # allocator setting: one candidate's round figure beside another's memory-run figure is no comparison)
        rss_from = mem if p.memory_run else rows(f"r0-{c}")
        rss = [r["value"] for r in _metric(rss_from, "peak_rss_bytes") if r["value"] is not None]
        if live:
            rec["peak_live_bytes"] = max(live)
        if rss:
            rec["peak_rss_bytes"] = max(rss)
        if by_rank := _rss_breakdowns(mem):  # the rank with the highest sampled RSS, whole
            rec["rss_breakdown"] = max(by_rank.values(), key=lambda b: sum(b.values()))
        losses = [r["value"] for r in sorted(_metric(rows(f"r0-{c}"), "loss"), key=lambda r: r["step"])]
        if losses and ref_losses:
            rec["loss_max_abs_diff"] = max(abs(a - b) for a, b in zip(losses, ref_losses))
        records.append(rec)
    w = RowWriter(
        out / "summary", "peers-summary", {"peers": dataclasses.asdict(p), "candidates": list(cands)}, hardware=hardware
    )
    for rec in records:
        extra = {"candidate": rec["candidate"], "sharding_stage": rec["sharding_stage"]}
        if rec["status"] != "ok":
            w.write("peer_step_time_s", None, "s", status="failed", reason=rec["reason"], **extra)
            continue
        for metric, key, unit in (
            ("peer_step_time_s", "step_time_s", "s"),
            ("peer_time_vs_torch_ddp", "time_vs_torch_ddp", "ratio"),
            ("peer_peak_live_bytes", "peak_live_bytes", "bytes"),
            ("peer_peak_rss_bytes", "peak_rss_bytes", "bytes"),
            ("peer_loss_max_abs_diff", "loss_max_abs_diff", "nats"),
            ("peer_model_flops_per_step", "model_flops_per_step", "FLOP"),
            ("peer_max_memory_allocated_bytes", "max_memory_allocated_bytes", "bytes"),
            ("peer_max_memory_reserved_bytes", "max_memory_reserved_bytes", "bytes"),
        ):
            if key in rec:
                w.write(metric, rec[key], unit, **extra)
        if "mfu" in rec:
            device = hardware["device"]
            w.write("peer_mfu", rec["mfu"], "ratio", peak_flops=dense_bf16_peak(device), device=device, **extra)
        for r, t in enumerate(rec.get("round_step_time_s", [])):
            if t is not None:
                w.write("peer_round_step_time_s", t, "s", round=r, **extra)
        for cat, b in rec.get("rss_breakdown", {}).items():
            w.write(f"peer_rss_{cat}_bytes", b, "bytes", **extra)
    return records


def model_flops_per_step(p: PeersConfig) -> float:
    """Model FLOPs of one device's step: ``flops_per_token`` (Megatron's count) x the tokens of its micro-batch."""
    model = train_config(p, "torch-ddp").model
    return flops_per_token(model) * p.micro_batch * model.seq


def _device_memory(runs: list[list[dict]]) -> dict[str, int]:
    """The highest ``torch.cuda.max_memory_allocated`` / ``max_memory_reserved`` of any rank in the timed runs (only
    runs on CUDA have them: on a CPU ``peak_memory_bytes`` is the live-tensor tracker's, or absent)."""
    alloc = [
        r["value"]
        for rows in runs
        for r in _metric(rows, "peak_memory_bytes")
        if r.get("source") == "torch.cuda.max_memory_allocated" and r["value"] is not None
    ]
    reserved = [r["value"] for rows in runs for r in _metric(rows, "peak_reserved_bytes") if r["value"] is not None]
    out = {}
    if alloc:
        out["max_memory_allocated_bytes"] = max(alloc)
    if reserved:
        out["max_memory_reserved_bytes"] = max(reserved)
    return out


def _rss_breakdowns(rows: list[dict]) -> dict[int, dict[str, int]]:
    """Per rank: its peak RSS by category (``rss_<category>_bytes`` rows of a memory run)."""
    out: dict[int, dict[str, int]] = {}
    for cat in CATEGORIES:
        for r in _metric(rows, f"rss_{cat}_bytes"):
            out.setdefault(r.get("rank", 0), {})[cat] = r["value"]
    return out


def _same_rounds(xs: list[float | None], refs: list[float | None]) -> list[tuple[float, float]]:
    """(x, ref) of every round in which both have a time."""
    return [(x, r) for x, r in zip(xs, refs) if x is not None and r]


def _round_ratios(zb: dict, peer: dict) -> list[float]:
    """zerobench's step time / the peer's in every round both were timed in (side by side)."""
    return [x / r for x, r in _same_rounds(zb.get("round_step_time_s", []), peer.get("round_step_time_s", []))]


def _time_ratio(zb: dict, peer: dict) -> float | None:
    """zerobench's step time / the peer's: the median over rounds of the two times taken in the same round
    (side by side, as every comparison here); records without per-round times go through torch-ddp, and without
    either there is no ratio (None)."""
    if ratios := _round_ratios(zb, peer):
        return statistics.median(ratios)
    if "time_vs_torch_ddp" in zb and "time_vs_torch_ddp" in peer:
        return zb["time_vs_torch_ddp"] / peer["time_vs_torch_ddp"]
    return None


def _time_noise(zb: dict, peer: dict) -> float:
    """Two standard errors of ``_time_ratio`` from the spread of its per-round ratios (infinite with fewer than two
    rounds side by side): a bar nearer the ratio than this is not decided by these rounds."""
    return 2 * median_standard_error(_round_ratios(zb, peer))


def sharding_stage(candidate: str, dp: int) -> int:
    """The ZeRO stage ``candidate`` shards like in a world of ``dp`` ranks: its own, except FSDP1's sharded strategies
    at one rank, which torch switches to ``NO_SHARD`` (a warning in the log): plain data parallelism, stage 0's peer,
    not stage 2's or 3's."""
    if candidate in ZEROBENCH_ALL:
        return int(candidate.split("-")[1])
    return 0 if dp == 1 and candidate.startswith("fsdp1-") else SHARDING[candidate]


def bar(records: list[dict]) -> list[dict]:
    """The issue's bar per zerobench candidate: time <= 0.95x the fastest peer doing the same sharding (and
    offloading alike), and peak memory <= every such peer's. The fastest peer is the one zerobench's
    per-round time ratio is highest against; ``time_noise`` is two standard errors of that ratio, and
    ``speed_decided`` whether the bar lies further from it than that. Offloaded candidates compare peak RSS: on a CPU-only machine
    the live-tensor tracker cannot tell DeepSpeed's host states from its device ones."""
    ok = {
        r["candidate"]: r for r in records if r["status"] == "ok" and ("step_time_s" in r or "time_vs_torch_ddp" in r)
    }
    out = []
    for name in ZEROBENCH_ALL:
        s, off = int(name.split("-")[1]), name.endswith("-offload")
        zb = ok.get(name)
        peers = [
            r
            for c, r in ok.items()
            if c not in ZEROBENCH_ALL and r.get("sharding_stage", SHARDING[c]) == s and c.endswith("-offload") == off
        ]
        timed = [(t, r["candidate"]) for r in peers if zb is not None and (t := _time_ratio(zb, r)) is not None]
        if not timed:
            continue
        mem_key = "peak_rss_bytes" if off else "peak_live_bytes"
        speed, fastest = max(timed)
        noise = _time_noise(zb, next(r for r in peers if r["candidate"] == fastest))
        leanest = min((r for r in peers if r.get(mem_key)), key=lambda r: r[mem_key], default=None)
        mem = zb.get(mem_key, 0) / leanest[mem_key] if leanest and zb.get(mem_key) else None
        out.append(
            {
                "stage": s,
                "candidate": name,
                "memory_metric": mem_key,
                "fastest_peer": fastest,
                "time_vs_fastest": speed,
                "speed_ok": speed <= 0.95,
                "time_noise": noise,
                "speed_decided": abs(speed - 0.95) >= noise,
                "leanest_peer": leanest["candidate"] if leanest else None,
                "memory_vs_leanest": mem,
                "memory_ok": None if mem is None else mem <= 1.0,  # None: nothing measured to judge
            }
        )
    return out
