"""``zerobench sweep``, ``peers``, ``bench-kernels``, ``report`` and ``results``: the harness commands."""

from __future__ import annotations

import argparse
import datetime
import math
import sys

from zerobench.cli.types import count, path
from zerobench.config import ConfigError


def cmd_sweep(args: argparse.Namespace) -> int:
    from pathlib import Path

    from zerobench.bench import suite as suites
    from zerobench.bench.runner import (
        check_sweep,
        check_sweep_dirs,
        parse_only,
        run_sweep,
        selected,
        warn_same_configurations,
    )
    from zerobench.launch.cancel import EXIT_CANCELLED
    from zerobench.results.outdir import check_writable_dir
    from zerobench.results.rows import files_below
    from zerobench.results.show import show

    s = suites.load(args.suite)
    only = parse_only(args.only)
    chosen = selected(s, only)  # what this sweep runs: the warnings and the check are about these runs
    invalid = [r for r in chosen.runs if r.error]
    for r in invalid:
        print(f"zerobench: warning: {s.path}: run {r.index} ({r.label}) is invalid: {r.error}", file=sys.stderr)
    warn_same_configurations(chosen)
    out = Path(args.out) if args.out else Path("runs") / s.name
    if args.check:  # the sweep's own checks, with its options: a check passes where the sweep would start
        if invalid:
            return 2
        chosen = check_sweep(
            s,
            out,
            launcher=args.launcher,
            only=only,
            instructions=args.instructions,
            gpus_per_task=args.gpus_per_task,
            pending_limit_s=args.pending_limit,
        )
        check_sweep_dirs(chosen, out, args.resume, args.tensorboard, args.instructions)
        runs = f"{len(chosen.runs)} of {len(s.runs)} runs (selected by --only)" if only else f"{len(s.runs)} runs"
        print(f"{s.path}: {runs}, all valid")
        return 0
    check_writable_dir(out)
    if args.tensorboard:
        check_writable_dir(args.tensorboard, "--tensorboard", "TensorBoard scalars")
    if args.instructions:
        from zerobench.metrics.callgrind import CallgrindUnavailable, library

        try:
            library()  # built here once, not by every run's rank
        except CallgrindUnavailable as e:
            raise ConfigError(str(e)) from None
    summary = run_sweep(
        s,
        out,
        resume=args.resume,
        progress=not args.no_progress,
        tensorboard=args.tensorboard,
        launcher=args.launcher,
        only=only or None,
        instructions=args.instructions,
        gpus_per_task=args.gpus_per_task,
        pending_limit_s=args.pending_limit,
    )
    if out.is_dir() and files_below(out):
        try:
            print(show(out))
        except ValueError as e:  # a sweep stopped by a full disk can leave no readable row: its line says why
            print(f"zerobench: note: no table of the runs: {e}", file=sys.stderr)
    print(
        f"\n{len(summary.ran)} ran, {len(summary.skipped)} skipped (resume), {len(summary.failed)} failed; rows under {out}"
    )
    for label, reason in summary.failed.items():
        print(f"  failed: {label}: {reason}")
    if summary.stopped:
        print(f"zerobench: error: sweep stopped: {summary.stopped}; continue with --resume", file=sys.stderr)
        return EXIT_CANCELLED if summary.stopped.startswith("cancelled") else 1
    if args.allow_failures:
        return 0
    if args.allow_oom:  # runs that do not fit are measurements (the baseline's limit); a crash or a timeout is not
        crashed = {k: v for k, v in summary.failed_status.items() if v not in ("oom", "invalid")}
        if crashed:
            print(
                f"zerobench: error: {len(crashed)} run(s) failed other than by not fitting "
                f"({', '.join(f'{k}: {v}' for k, v in list(crashed.items())[:4])}); their rows say why",
                file=sys.stderr,
            )
        return 1 if crashed else 0
    return 1 if summary.failed else 0


def cmd_peers(args: argparse.Namespace) -> int:
    from pathlib import Path

    from zerobench.bench.peers import PeersConfig, bar, run_peers
    from zerobench.launch.cancel import EXIT_CANCELLED, Cancelled
    from zerobench.results.outdir import check_writable_dir

    if args.summarize:
        from zerobench.bench.peers_stopped import summarize_stopped

        out = Path(args.summarize)
        recs = summarize_stopped(out)
        return _print_peers(recs, bar(recs), out)
    p = PeersConfig(
        systems=tuple(args.systems or ()),
        dp=args.dp,
        preset=args.preset,
        layers=args.layers,
        hidden=args.hidden,
        seq=args.seq,
        heads=args.heads,
        vocab=args.vocab,
        precision=args.precision,
        micro_batch=args.micro_batch,
        steps=args.steps,
        warmup=args.warmup,
        rounds=args.rounds,
        memory_run=not args.no_memory_run,
        reference_run=not args.no_reference_run,
        profile=args.profile,
    )
    p.validate()
    out = Path(args.out) if args.out else Path("runs") / ("peers-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    check_writable_dir(out)
    if args.profile:
        check_writable_dir(Path(args.profile), "--profile", "profiler traces")
    try:
        recs = run_peers(p, out, say=lambda m: print(m, file=sys.stderr))
    except Cancelled as e:
        print(f"zerobench: error: peers stopped: {e}", file=sys.stderr)
        return EXIT_CANCELLED
    return _print_peers(recs, bar(recs), out)


def _print_peers(recs: list[dict], verdicts: list[dict], out) -> int:
    """The comparison's tables: every candidate, the RSS breakdown, the issue's bar; exit 1 if a candidate failed."""
    from tabulate import tabulate

    mib = lambda b: f"{b / 2**20:.1f}" if b is not None else "-"  # noqa: E731
    print(
        tabulate(
            [
                [
                    r["candidate"],
                    r["sharding_stage"],
                    f"{r['time_vs_torch_ddp']:.3f}"
                    if "time_vs_torch_ddp" in r
                    else ("-" if r["status"] == "ok" else r["status"]),
                    f"{r['step_time_s'] * 1e3:.1f}" if "step_time_s" in r else "-",
                    mib(r.get("peak_live_bytes")),
                    mib(r.get("peak_rss_bytes")),
                    f"{r['loss_max_abs_diff']:.1e}" if "loss_max_abs_diff" in r else "-",
                    f"{r['mfu']:.1%}" if "mfu" in r else "-",
                    mib(r.get("max_memory_allocated_bytes")),
                    mib(r.get("max_memory_reserved_bytes")),
                ]
                for r in recs
            ],
            headers=[
                "system",
                "shards like stage",
                "time / torch-ddp",
                "step ms",
                "peak live MiB",
                "peak RSS MiB",
                "max |Δloss| vs 1 process",
                "MFU",
                "max allocated MiB",
                "max reserved MiB",
            ],
        )
    )
    rss = [r for r in recs if r.get("rss_breakdown")]
    if rss:
        print("\nhighest sampled RSS by category, MiB (zerobench/metrics/rss.py):")
        cats = list(rss[0]["rss_breakdown"])
        print(
            tabulate(
                [
                    [r["candidate"], *(mib(r["rss_breakdown"][c]) for c in cats), mib(sum(r["rss_breakdown"].values()))]
                    for r in rss
                ],
                headers=["system", *cats, "sum"],
            )
        )
    if verdicts:
        print()
        print(
            tabulate(
                [
                    [
                        v["candidate"],
                        v["fastest_peer"],
                        f"{v['time_vs_fastest']:.3f}",
                        _speed_verdict(v),
                        v["leanest_peer"] or "-",
                        f"{v['memory_vs_leanest']:.3f}" if v["memory_vs_leanest"] else "-",
                        "-" if v["memory_ok"] is None else "yes" if v["memory_ok"] else "NO",
                    ]
                    for v in verdicts
                ],
                headers=[
                    "zerobench",
                    "fastest peer",
                    "time / it",
                    "<= 0.95",
                    "leanest peer",
                    "peak / it (offload: RSS)",
                    "<= 1",
                ],
            )
        )
    print(f"rows: {out}")
    return 0 if all(r["status"] == "ok" for r in recs) else 1


def _speed_verdict(v: dict) -> str:
    """yes/NO against the time bar, and where the rounds' spread cannot place the ratio against it, by how much."""
    verdict = "yes" if v["speed_ok"] else "NO"
    if v["speed_decided"]:
        return verdict
    if math.isinf(v["time_noise"]):  # one round side by side: no spread to place the ratio against the bar by
        return f"{verdict}, one round: spread unknown"
    return f"{verdict}, within noise (±{v['time_noise']:.3f})"


def cmd_bench_kernels(args: argparse.Namespace) -> int:
    import datetime
    from pathlib import Path

    import torch
    from tabulate import tabulate

    from zerobench.bench import kernels as kb
    from zerobench.results.outdir import check_writable_dir

    cfg = kb.KernelBenchConfig(
        numel=args.numel, rounds=args.rounds, device=args.device, deepspeed=not args.no_deepspeed
    )
    if args.numel < 1 or args.rounds < 1:
        raise ConfigError("--numel and --rounds must be >= 1")
    if not args.ops:
        given = [
            f
            for f, v, d in (
                ("--compile", args.compile, False),
                ("--rows", args.rows, 8192),
                ("--hidden", args.hidden, 1024),
            )
            if v != d
        ]
        if given:
            raise ConfigError(f"{given[0]} is for --ops (the bias+GeLU and LayerNorm kernels): add --ops, or drop it")
    if cfg.device not in ("cpu", "cuda") or (cfg.device == "cuda" and not torch.cuda.is_available()):
        raise ConfigError(f"--device {cfg.device!r}: choose cpu, or cuda on a machine with a GPU")
    run_id = "bench-kernels-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("runs") / run_id
    check_writable_dir(out)
    total = cfg.warmup + cfg.rounds
    print(f"AdamW over {cfg.numel:,} fp32 elements on {cfg.device}, {cfg.rounds} interleaved rounds", file=sys.stderr)
    recs = kb.run_adamw_bench(cfg, progress=lambda r: print(f"  round {r + 1}/{total}", file=sys.stderr))
    kb.write_rows(recs, cfg, out, run_id)
    print(
        tabulate(
            [
                [
                    r["candidate"],
                    f"{r['median_s'] * 1e3:.1f}",
                    f"{r['gbps']:.1f}",
                    f"{r['fraction_of_limit']:.3f}",
                    f"{r.get('time_vs_torch_fused', float('nan')):.3f}",
                ]
                for r in recs
            ],
            headers=["AdamW", "median ms", "GB/s (28 B/elem)", "fraction of limit", "time / torch fused"],
        )
    )
    if args.ops:
        cands = kb.transformer_candidates(cfg.device, args.rows, args.hidden, args.compile)
        times = kb.interleave(cands, cfg.rounds, 2, torch.device(cfg.device))
        ops = kb.summarize_ops(times)
        print()
        print(
            tabulate(
                [[r["candidate"], f"{r['median_s'] * 1e3:.2f}", f"{r['time_vs_eager']:.3f}"] for r in ops],
                headers=[f"fwd+bwd [{args.rows}, h={args.hidden}]", "median ms", "time / eager"],
            )
        )
    print(f"rows: {out}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from zerobench.report.render import render
    from zerobench.results.lock import claim
    from zerobench.results.outdir import check_writable_dir

    check_writable_dir(args.out, what="the report")
    with claim(args.out):  # two reports into one directory would each remove the other's figures
        html = render(args.results, args.out)
    print(f"report: {html}")
    print(f"summary: {html.parent / 'summary.md'}")
    return 0


def cmd_results(args: argparse.Namespace) -> int:
    from zerobench.results.show import show

    try:
        print(show(args.path))
    except ValueError as e:
        raise ConfigError(str(e)) from None
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to the ``zerobench`` parser."""
    sw = sub.add_parser(
        "sweep",
        help="run every configuration of a suite, recording rows (failures included)",
        description="Expand a suite (base + axes) into runs and run each on local processes; "
        "failed, out-of-memory, timed-out and invalid runs become rows with a reason.",
    )
    sw.add_argument("suite", type=path, help="a suite YAML file, or a name under suites/ (e.g. cpu/quick)")
    sw.add_argument("--out", type=path, help="results directory (default runs/<suite name>)")
    sw.add_argument("--resume", action="store_true", help="skip runs that already have an ok status row in --out")
    sw.add_argument(
        "--launcher",
        default="local",
        help="local (processes on this host), srun (job steps inside a Slurm allocation), "
        "slurm (one sbatch job per run, tracked to its final state)",
    )
    sw.add_argument(
        "--gpus-per-task",
        type=int,
        metavar="N",
        help="GPUs each task of a --launcher slurm job requests (sbatch --gpus-per-task; default none: CPU jobs)",
    )
    sw.add_argument(
        "--pending-limit",
        type=float,
        metavar="SECONDS",
        help="with --launcher slurm: scancel a job still queued after this long and record it as timed out, with "
        "Slurm's reason for the wait (default: wait as long as Slurm keeps it queued)",
    )
    sw.add_argument(
        "--only",
        action="append",
        metavar="KEY=VALUE",
        help="run only the runs whose KEY (a suite field: stage, dp, label, ...) is VALUE; repeat it for more keys, "
        "or the same key for alternatives (--only stage=1 --only stage=2)",
    )
    sw.add_argument("--check", action="store_true", help="validate the suite and exit (non-zero if a run is invalid)")
    sw.add_argument("--no-progress", action="store_true", help="no progress bar")
    sw.add_argument("--tensorboard", type=path, metavar="DIR", help="per-step scalars of every run for TensorBoard")
    sw.add_argument("--allow-failures", action="store_true", help="exit 0 even if some runs failed")
    sw.add_argument(
        "--allow-oom",
        action="store_true",
        help="exit 0 where every run that did not complete ran out of memory or did not fit the allocation "
        "(invalid), 1 where any crashed or timed out (what slurm/scale_400gpu.sh passes)",
    )
    sw.add_argument(
        "--instructions",
        action="store_true",
        help="run each run's rank 0 under valgrind's callgrind and record the instructions of its counted "
        "step (the last warm-up step) by phase; its timings are not measurements (rows tagged "
        "instrumented); timeouts x10. Needs valgrind and cc",
    )
    sw.set_defaults(func=cmd_sweep)
    pe = sub.add_parser(
        "peers",
        help="zerobench stages vs torch DDP/ZeRO-1/FSDP1/FSDP2 and DeepSpeed, side by side",
        description="Every candidate trains the same GPT on the same processes, interleaved round "
        "by round; reports step time relative to torch-ddp (median of per-round "
        "ratios), peak memory per rank and loss parity, as rows and a table.",
    )
    pe.add_argument(
        "--systems",
        nargs="+",
        default=None,
        help="candidates (default: zerobench-0..3 and -2/-3-offload, the torch peers, DeepSpeed 0-3 + offload if "
        "installed; also zerobench-2-no-overlap, zerobench-3-no-overlap, zerobench-0..3-compiled, fsdp2-compiled, "
        "megatron-core)",
    )
    pe.add_argument("--dp", type=count(1), default=2, help="processes")
    pe.add_argument("--preset", default="tiny", help="model preset")
    pe.add_argument("--layers", type=count(1), default=None, help="override the preset's layers")
    pe.add_argument("--hidden", type=count(1), default=None, help="override the preset's hidden size")
    pe.add_argument("--seq", type=count(1), default=None, help="override the preset's sequence length")
    pe.add_argument("--heads", type=count(1), default=None, help="override the preset's attention heads")
    pe.add_argument("--vocab", type=count(1), default=None, help="override the preset's vocabulary")
    pe.add_argument(
        "--precision",
        choices=("fp32", "bf16"),
        default="fp32",
        help="fp32, or bf16: zerobench's bf16 recipe and each peer's own mixed precision",
    )
    pe.add_argument("--micro-batch", type=count(1), default=2)
    pe.add_argument("--steps", type=count(1), default=6)
    pe.add_argument("--warmup", type=count(0), default=2)
    pe.add_argument("--rounds", type=count(1), default=3, help="interleaved timing rounds")
    pe.add_argument("--no-memory-run", action="store_true", help="skip the per-candidate live-tensor run")
    pe.add_argument(
        "--no-reference-run",
        action="store_true",
        help="skip the one-process torch-ddp run the losses are compared with (no loss parity is then reported)",
    )
    pe.add_argument(
        "--profile",
        type=path,
        metavar="DIR",
        default=None,
        help="trace each round's runs' last 2 steps with torch.profiler: DIR/<run id>/rank<r>.trace.json and "
        ".ops.txt, each system as the comparison runs it; the traced steps are left out of the medians",
    )
    pe.add_argument("--out", type=path, default=None, help="rows directory (default runs/peers-<time>)")
    pe.add_argument(
        "--summarize",
        type=path,
        metavar="DIR",
        default=None,
        help="table a comparison that stopped before its summary (time limit, cancel) from the runs it "
        "finished under DIR, instead of running one",
    )
    pe.set_defaults(func=cmd_peers)
    bk = sub.add_parser(
        "bench-kernels",
        help="the fused kernels side by side with torch (and DeepSpeed): rows + table",
        description="AdamW over one flat fp32 partition by every candidate, interleaved round by "
        "round, against a bandwidth-limit kernel with AdamW's access pattern; then "
        "bias+GeLU and LayerNorm (forward+backward) against eager PyTorch.",
    )
    bk.add_argument("--numel", type=count(1), default=50_000_000, help="elements of the flat partition (default 50M)")
    bk.add_argument("--rounds", type=count(1), default=7, help="interleaved rounds; medians over them")
    bk.add_argument("--device", default="cpu", help="cpu or cuda")
    bk.add_argument("--no-deepspeed", action="store_true", help="skip DeepSpeedCPUAdam even when installed")
    bk.add_argument("--ops", action="store_true", help="also bias+GeLU and LayerNorm (rows x hidden below)")
    bk.add_argument("--compile", action="store_true", help="with --ops: add torch.compile candidates")
    bk.add_argument("--rows", type=count(1), default=8192, help="with --ops: tokens (batch x sequence)")
    bk.add_argument("--hidden", type=count(1), default=1024, help="with --ops: hidden size")
    bk.add_argument("--out", type=path, default=None, help="write result rows here (default runs/bench-kernels-<time>)")
    bk.set_defaults(func=cmd_bench_kernels)
    rp = sub.add_parser(
        "report",
        help="paper-style HTML + Markdown report from result rows",
        description="Aggregate rows, draw the figures (seaborn) and render report_templates/.",
    )
    rp.add_argument("results", type=path, nargs="+", help="results directories or rows files")
    rp.add_argument("--out", type=path, required=True, help="report directory (index.html, summary.md, figures)")
    rp.set_defaults(func=cmd_report)
    rs = sub.add_parser("results", help="inspect result rows")
    rsub = rs.add_subparsers(dest="results_command", required=True, metavar="ACTION")
    rshow = rsub.add_parser("show", help="one line per run: status, configuration, headline metrics")
    rshow.add_argument("path", type=path, help="a results directory or rows.jsonl file")
    rshow.set_defaults(func=cmd_results)
