"""The ``zerobench`` command line: parses arguments into typed configs and hands them on (no logic here)."""

from __future__ import annotations

import argparse
import datetime
import sys

from zerobench.config import ConfigError


# The paper's Table 3 (C_B is --bucket-size, on in every configuration; all use checkpointing).
PAPER_CONFIGS = {
    "C1": ("P_os + C_B + M_D", {"stage": 1, "md": True}),
    "C2": ("P_os + C_B + M_D + P_a", {"stage": 1, "md": True, "pa": True}),
    "C3": ("P_os+g + C_B + M_D", {"stage": 2, "md": True}),
    "C4": ("P_os+g + C_B + M_D + P_a", {"stage": 2, "md": True, "pa": True}),
    "C5": ("P_os+g + C_B + M_D + P_a+cpu", {"stage": 2, "md": True, "pa": True, "pa_cpu": True}),
}


def _add_model_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("model")
    g.add_argument("--preset", default="tiny", help="model preset: tiny, mini, small (default: tiny)")
    for name in ("layers", "hidden", "heads", "vocab", "seq"):
        g.add_argument(f"--{name}", type=int, help=f"override the preset's {name}")


def _add_train_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p)
    g = p.add_argument_group("parallelism and precision")
    g.add_argument("--stage", type=int, default=0, help="ZeRO stage 0 (DP), 1 (P_os), 2 (P_os+g), 3 (P_os+g+p)")
    g.add_argument("--dp", type=int, default=None,
                   help="data-parallel degree = number of processes (default: the world size under "
                        "torchrun/srun, else 1); without torchrun/srun zerobench starts them itself")
    g.add_argument("--system", default="zerobench",
                   help="zerobench (this engine) or megatron (the Megatron-LM baseline: megatron-core's GPTModel, TP, DDP)")
    g.add_argument("--tp", type=int, default=1, help="tensor (model) parallel degree; world = dp * tp")
    g.add_argument("--sp", action="store_true", help="sequence parallelism inside the TP group (Megatron SP)")
    g.add_argument("--precision", default="fp32", help="fp32, bf16 or fp16")
    g.add_argument("--kernels", default="auto", choices=["auto", "fused", "reference"],
                   help="fused kernels (AdamW step, LayerNorm, bias+GeLU; kernels/): auto = where the device "
                        "has them, fused = required, reference = plain PyTorch")
    g = p.add_argument_group("ZeRO-R (paper §6)")
    g.add_argument("--checkpoint-activations", action="store_true", help="recompute each block in backward")
    g.add_argument("--pa", action="store_true", help="P_a: partition activation checkpoints over TP ranks")
    g.add_argument("--pa-cpu", action="store_true", help="P_a+cpu: keep partitioned checkpoints in host memory")
    g.add_argument("--md", action="store_true", help="M_D: checkpoints in one pre-allocated contiguous buffer")
    g.add_argument("--paper-config", choices=sorted(PAPER_CONFIGS),
                   help="the paper's Table 3 configuration (sets --stage and the ZeRO-R switches): "
                        + "; ".join(f"{k} = {v[0]}" for k, v in sorted(PAPER_CONFIGS.items())))
    g.add_argument("--bucket-size", type=int, default=6_250_000, metavar="ELEMENTS",
                   help="gradient/parameter bucket size in elements (C_B)")
    _add_offload_args(p)
    g = p.add_argument_group("batch and schedule")
    g.add_argument("--micro-batch", type=int, default=2, help="sequences per micro-batch per rank")
    g.add_argument("--grad-accum", type=int, default=1, help="micro-batches per optimizer step")
    g.add_argument("--steps", type=int, default=10, help="optimizer steps")
    g.add_argument("--warmup", type=int, default=2, help="steps excluded from timing medians")
    g.add_argument("--lr", type=float, default=1e-3, help="AdamW learning rate")
    g.add_argument("--weight-decay", type=float, default=0.1, help="AdamW decoupled weight decay")
    g.add_argument("--clip", type=float, default=None, help="clip the global gradient norm to this")
    g.add_argument("--seed", type=int, default=1234)
    g = p.add_argument_group("output and runtime")
    g.add_argument("--out", default=None, help="directory for result rows (default: runs/<run id>)")
    g.add_argument("--run-id", default=None, help="run id stored in every row (default: train-<time>)")
    g.add_argument("--no-track-memory", action="store_true", help="skip the CPU live-tensor tracker")
    g.add_argument("--tensorboard", metavar="DIR", help="also write per-step scalars for TensorBoard under DIR")
    g.add_argument("--memory-budget", metavar="BYTES",
                   help="per-device memory budget, e.g. 16GiB (GPU: a smaller card emulated with "
                        "set_per_process_memory_fraction; CPU: the live-tensor tracker); past it the run fails as OOM")
    g.add_argument("--timeout", type=float, default=3600.0, help="wall-clock limit of a local launch (s)")


def _add_offload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("offload and 8-bit optimizer states (ZeRO-Offload / ZeRO-Infinity)")
    g.add_argument("--offload-optimizer", default="none", choices=["none", "cpu", "nvme"],
                   help="stages 1-3: fp32 master + Adam states in host memory, step on the CPU kernel (cpu); "
                        "as cpu with the states swapped to files under --nvme-path (nvme)")
    g.add_argument("--offload-param", default="none", choices=["none", "cpu"],
                   help="stage 3 with optimizer offload: the parameter partition in host memory")
    g.add_argument("--nvme-path", metavar="DIR", help="directory for --offload-optimizer nvme's state files")
    g.add_argument("--optim-bits", type=int, default=32, choices=[32, 8],
                   help="Adam moments in fp32 or blockwise-quantized 8-bit")


def _offload_kwargs(args: argparse.Namespace) -> dict:
    return dict(offload_optimizer=args.offload_optimizer, offload_param=args.offload_param,
                nvme_path=args.nvme_path, optim_bits=args.optim_bits)


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from zerobench.distributed.env import DistEnv, detect
    from zerobench.models.sizes import preset
    from zerobench.train.config import TrainConfig
    from zerobench.train.launch import free_port, launch_local
    from zerobench.train.loop import train
    from zerobench.parallel.checkpointing import ActivationConfig
    from zerobench.zero.config import AdamWConfig, Precision, ZeroConfig

    import dataclasses

    from zerobench.plan.suites import parse_bytes

    if args.paper_config:
        for k, v in PAPER_CONFIGS[args.paper_config][1].items():
            setattr(args, k, v)
        args.checkpoint_activations = True
    model = preset(args.preset)
    overrides = {k: getattr(args, k) for k in ("layers", "hidden", "heads", "vocab", "seq") if getattr(args, k)}
    model = dataclasses.replace(model, **overrides)
    try:
        precision = Precision(args.precision)
    except ValueError:
        raise ConfigError(f"unknown precision {args.precision!r}: choose fp32, bf16 or fp16") from None
    denv = detect()
    if args.tp < 1:
        raise ConfigError(f"--tp must be >= 1, got {args.tp}")
    dp = args.dp if args.dp is not None else max(1, denv.world_size // args.tp)
    cfg = TrainConfig(
        model=model,
        zero=ZeroConfig(
            stage=args.stage, precision=precision, bucket_numel=args.bucket_size,
            grad_accum_steps=args.grad_accum, clip_grad_norm=args.clip,
            optimizer=AdamWConfig(lr=args.lr, weight_decay=args.weight_decay), kernels=args.kernels,
            **_offload_kwargs(args),
        ),
        activation=ActivationConfig(
            checkpoint=args.checkpoint_activations, partition=args.pa or args.pa_cpu,
            cpu_offload=args.pa_cpu, contiguous=args.md,
        ),
        system=args.system, preset=args.preset, dp=dp, tp=args.tp, sequence_parallel=args.sp, micro_batch=args.micro_batch, steps=args.steps,
        warmup_steps=args.warmup, seed=args.seed, track_memory=not args.no_track_memory,
        tensorboard_dir=args.tensorboard, kernels=args.kernels,
        memory_budget_bytes=int(parse_bytes(args.memory_budget)) if args.memory_budget else None,
    )
    cfg.validate(denv.world_size if denv.source != "single" else None)
    run_id = args.run_id or "train-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("runs") / run_id
    if denv.source != "single":  # under torchrun / srun: this process is one rank
        train(cfg, denv, out, run_id)
        return 0
    if cfg.world_size == 1:
        train(cfg, DistEnv(0, 1, 0, "127.0.0.1", free_port(), "single"), out, run_id)
        return 0
    res = launch_local(cfg, out, run_id, timeout_s=args.timeout)
    if not res.ok:
        print(f"zerobench: error: run failed: {res.reason}", file=sys.stderr)
        return 1
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from zerobench.demo import run_demo

    return run_demo(Path(args.out) if args.out else None)


def cmd_sweep(args: argparse.Namespace) -> int:
    from pathlib import Path

    from zerobench.bench import suite as suites
    from zerobench.bench.runner import check_local, run_sweep
    from zerobench.results.show import show

    s = suites.load(args.suite)
    invalid = [r for r in s.runs if r.error]
    for r in invalid:
        print(f"zerobench: warning: {s.path}: run {r.index} ({r.label}) is invalid: {r.error}", file=sys.stderr)
    if args.check:
        if invalid:
            return 2
        check_local(s)
        print(f"{s.path}: {len(s.runs)} runs, all valid")
        return 0
    out = Path(args.out) if args.out else Path("runs") / s.name
    only = {}
    for item in args.only or []:
        key, eq, value = item.partition("=")
        if not eq:
            raise ConfigError(f"--only takes KEY=VALUE, got {item!r}")
        only[key] = value
    summary = run_sweep(s, out, resume=args.resume, progress=not args.no_progress, tensorboard=args.tensorboard,
                        launcher=args.launcher, only=only or None)
    print(show(out))
    print(f"\n{len(summary.ran)} ran, {len(summary.skipped)} skipped (resume), {len(summary.failed)} failed; rows under {out}")
    for label, reason in summary.failed.items():
        print(f"  failed: {label}: {reason}")
    return 1 if summary.failed and not args.allow_failures else 0


def cmd_maxsize(args: argparse.Namespace) -> int:
    import dataclasses
    import json

    from zerobench.bench.maxsize import search_max_layers
    from zerobench.bench.spec import RunSpec

    base = RunSpec(preset=args.preset, hidden=args.hidden, heads=args.heads, vocab=args.vocab, seq=args.seq,
                   dp=args.dp, tp=args.tp, precision=args.precision, micro_batch=args.micro_batch,
                   checkpoint_activations=args.checkpoint_activations, pa=args.pa, pa_cpu=args.pa_cpu,
                   md=args.md, timeout=args.timeout, bucket_size=args.bucket_size, **_offload_kwargs(args))
    results = {}
    for stage in args.stage:
        spec = dataclasses.replace(base, stage=stage)
        res = search_max_layers(spec, args.budget, limit=args.max_layers,
                                on_probe=lambda L, st, s=stage: print(f"  stage {s}: {L:4d} layers -> {st}", flush=True))
        results[stage] = res
        print(f"stage {stage}: at most {res.max_layers} layers = {res.max_params / 1e6:.2f}M params within {args.budget}")
    if len(results) > 1:
        first = results[args.stage[0]]
        for stage, r in results.items():
            if first.max_params:
                print(f"  stage {stage} / stage {args.stage[0]}: {r.max_params / first.max_params:.2f}x parameters")
    if args.out:
        from zerobench.results.rows import RowWriter

        off = "" if args.offload_optimizer == "none" else f"-offload-{args.offload_optimizer}" + (
            "-param" if args.offload_param != "none" else "")
        off += "" if args.optim_bits == 32 else f"-adam{args.optim_bits}"
        for stage, r in results.items():
            w = RowWriter(args.out, f"maxsize-stage{stage}{off}", {**dataclasses.asdict(base), "stage": stage, "budget": args.budget})
            w.write("max_layers", r.max_layers, "layers")
            w.write("max_params", r.max_params, "params", probes=json.dumps(r.probes))
    return 0


def cmd_peers(args: argparse.Namespace) -> int:
    from pathlib import Path

    from tabulate import tabulate

    from zerobench.peers.compare import PeersConfig, bar, run_peers

    p = PeersConfig(systems=tuple(args.systems or ()), dp=args.dp, preset=args.preset, layers=args.layers,
                    hidden=args.hidden, seq=args.seq, micro_batch=args.micro_batch, steps=args.steps, warmup=args.warmup,
                    rounds=args.rounds, memory_run=not args.no_memory_run)
    p.validate()
    out = Path(args.out) if args.out else Path("runs") / ("peers-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    recs = run_peers(p, out, say=lambda m: print(m, file=sys.stderr))
    mib = lambda b: f"{b / 2**20:.1f}" if b is not None else "-"  # noqa: E731
    print(tabulate(
        [[r["candidate"], r["sharding_stage"], f"{r['time_vs_torch_ddp']:.3f}" if "time_vs_torch_ddp" in r else r["status"],
          f"{r['step_time_s'] * 1e3:.1f}" if "step_time_s" in r else "-", mib(r.get("peak_live_bytes")),
          mib(r.get("peak_rss_bytes")), f"{r['loss_max_abs_diff']:.1e}" if "loss_max_abs_diff" in r else "-"]
         for r in recs],
        headers=["system", "shards like stage", "time / torch-ddp", "step ms", "peak live MiB", "peak RSS MiB",
                 "max |Δloss| vs 1 process"]))
    verdicts = bar(recs)
    if verdicts:
        print()
        print(tabulate([[v["candidate"], v["fastest_peer"], f"{v['time_vs_fastest']:.3f}", "yes" if v["speed_ok"] else "NO",
                         v["leanest_peer"] or "-", f"{v['memory_vs_leanest']:.3f}" if v["memory_vs_leanest"] else "-",
                         "yes" if v["memory_ok"] else "NO"] for v in verdicts],
                       headers=["zerobench", "fastest peer", "time / it", "<= 0.95", "leanest peer",
                                "peak / it (offload: RSS)", "<= 1"]))
    print(f"rows: {out}")
    return 0 if all(r["status"] == "ok" for r in recs) else 1


def cmd_bench_kernels(args: argparse.Namespace) -> int:
    import datetime
    from pathlib import Path

    import torch
    from tabulate import tabulate

    from zerobench.bench import kernels as kb

    cfg = kb.KernelBenchConfig(numel=args.numel, rounds=args.rounds, device=args.device,
                               deepspeed=not args.no_deepspeed)
    if args.numel < 1 or args.rounds < 1:
        raise ConfigError("--numel and --rounds must be >= 1")
    if cfg.device not in ("cpu", "cuda") or (cfg.device == "cuda" and not torch.cuda.is_available()):
        raise ConfigError(f"--device {cfg.device!r}: choose cpu, or cuda on a machine with a GPU")
    run_id = "bench-kernels-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    out = Path(args.out) if args.out else Path("runs") / run_id
    total = cfg.warmup + cfg.rounds
    print(f"AdamW over {cfg.numel:,} fp32 elements on {cfg.device}, {cfg.rounds} interleaved rounds", file=sys.stderr)
    recs = kb.run_adamw_bench(cfg, progress=lambda r: print(f"  round {r + 1}/{total}", file=sys.stderr))
    kb.write_rows(recs, cfg, out, run_id)
    print(tabulate([[r["candidate"], f"{r['median_s'] * 1e3:.1f}", f"{r['gbps']:.1f}", f"{r['fraction_of_limit']:.3f}",
                     f"{r.get('time_vs_torch_fused', float('nan')):.3f}"] for r in recs],
                   headers=["AdamW", "median ms", "GB/s (28 B/elem)", "fraction of limit", "time / torch fused"]))
    if args.ops:
        cands = kb.transformer_candidates(cfg.device, args.rows, args.hidden, args.compile)
        times = kb.interleave(cands, cfg.rounds, 2, torch.device(cfg.device))
        ops = kb.summarize_ops(times)
        print()
        print(tabulate([[r["candidate"], f"{r['median_s'] * 1e3:.2f}", f"{r['time_vs_eager']:.3f}"] for r in ops],
                       headers=[f"fwd+bwd [{args.rows}, h={args.hidden}]", "median ms", "time / eager"]))
    print(f"rows: {out}")
    return 0


def cmd_regress(args: argparse.Namespace) -> int:
    from zerobench.bench.regress import _rows, run_gate, write_baseline

    if args.ab:
        return _cmd_ab(args)
    if not args.candidate:
        raise ConfigError("give --candidate RESULTS (or --ab SUITE for an interleaved A/B comparison)")
    if args.write_baseline:
        n = write_baseline(_rows(args.candidate), args.write_baseline)
        print(f"baseline written: {args.write_baseline} ({n} rows)")
        return 0
    if not args.baseline:
        raise ConfigError("give --baseline FILE (or --write-baseline FILE to record one)")
    return run_gate(args.baseline, args.candidate, args.timing_tolerance, args.propose, args.timing)


def _cmd_ab(args: argparse.Namespace) -> int:
    import contextlib
    from pathlib import Path

    from tabulate import tabulate

    from zerobench.bench.ab import ABConfig, parse_cpus, run_ab, worktree

    if bool(args.baseline_ref) == bool(args.baseline_tree):
        raise ConfigError("--ab needs exactly one of --baseline-ref REF or --baseline-tree DIR")
    here = Path(__file__).resolve().parents[1]
    out = Path(args.out) if args.out else Path("runs") / ("ab-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    tol = args.timing_tolerance
    ctx = worktree(args.baseline_ref, here) if args.baseline_ref else contextlib.nullcontext(args.baseline_tree)
    with ctx as base:
        cfg = ABConfig(suite=args.ab, baseline_tree=base, candidate_tree=str(here), rounds=args.rounds,
                       only=tuple(args.only), tolerance=tol, baseline_env=tuple(args.baseline_env),
                       candidate_env=tuple(args.candidate_env), metric=args.ab_metric,
                       cpus=parse_cpus(args.cpus) if args.cpus else ())
        verdicts = run_ab(cfg, out, say=lambda m: print(m, file=sys.stderr, flush=True))
    print(tabulate([[v["run"], f"{v['median_ratio']:.3f}", f"{v['min']:.3f}-{v['max']:.3f}", v["rounds"], v["verdict"]]
                    for v in verdicts], headers=["run", "candidate / baseline (median)", "range", "rounds", "verdict"]))
    bad = [v for v in verdicts if v["verdict"] == "REGRESSION"]
    print(f"{len(bad)} regressions (tolerance {tol:.0%}); rows: {out / 'summary'}")
    return 1 if bad else 0


def cmd_report(args: argparse.Namespace) -> int:
    from zerobench.report.render import render

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


def _add_plan_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to report")
    g.add_argument("--table", type=int, choices=[1, 2], help="print the paper's Table 1 or Table 2, computed")
    g.add_argument("--max-size", action="store_true", help="solve for the largest --layers that fits")
    g.add_argument("--dry-run", action="store_true",
                   help="build the real engine for one rank on the fake backend and compare its bytes")
    g.add_argument("--suite", help="with --dry-run: every zerobench row of a suite (e.g. paper/fig2)")
    g.add_argument("--rank", type=int, default=0, help="with --dry-run: the rank to measure")
    g.add_argument("--project", metavar="SUITE", help="project throughput for a suite's rows (e.g. paper/fig2)")
    g.add_argument("--hardware", default="v100-dgx2", help="v100-dgx2, a100-dgx or h100-dgx (projection)")
    g.add_argument("--efficiency", type=float, default=0.5, help="fraction of peak the matmuls reach (assumed)")
    g.add_argument("--dp-overlap", type=float, default=0.5, help="fraction of backward that can hide DP traffic")
    g.add_argument("--json", action="store_true", help="machine-readable output (keys documented in zerobench.plan.command)")
    g = p.add_argument_group("model")
    g.add_argument("--model", help="a named size from the paper's tables (e.g. 100B, 170B, fig4-13B)")
    g.add_argument("--params", type=float, help="target parameter count (layers solved at --hidden/--heads)")
    g.add_argument("--layers", type=int)
    g.add_argument("--hidden", type=int)
    g.add_argument("--heads", type=int)
    g.add_argument("--seq", type=int, default=1024)
    g.add_argument("--vocab", type=int, default=50257, help="padded to a multiple of 128 x MP, as Megatron does")
    g = p.add_argument_group("cluster and parallelism")
    g.add_argument("--gpus", type=int, default=400)
    g.add_argument("--gpus-per-node", type=int, default=16)
    g.add_argument("--mp", type=int, default=1, help="model (tensor) parallel degree")
    g.add_argument("--gpu-mem", default="32GB", help="memory per GPU, e.g. 32GB (1e9 bytes) or 80GiB")
    g.add_argument("--micro-batch", type=int, default=1, help="sequences per DP replica per micro-batch")
    g.add_argument("--stage", type=int, default=2, help="ZeRO-DP stage 0-3")
    g.add_argument("--checkpoint-activations", action="store_true")
    g.add_argument("--pa", action="store_true", help="P_a")
    g.add_argument("--pa-cpu", action="store_true", help="P_a+cpu")
    g.add_argument("--cb-size", type=int, default=500_000_000, help="C_B bucket size in elements")
    g.add_argument("--md", action="store_true", help="M_D (smaller fragmentation allowance)")
    g.add_argument("--optim-bits", type=int, default=32, choices=[32, 8], help="Adam moments: fp32 (K=12) or 8-bit (K~6)")
    g.add_argument("--offload-optimizer", action="store_true", help="ZeRO-Offload: optimizer states in host memory")
    g.add_argument("--offload-param", action="store_true", help="stage 3: parameter partition in host memory too")


def cmd_plan(args: argparse.Namespace) -> int:
    from zerobench.plan.command import run_plan

    return run_plan(args)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="zerobench",
        description="ZeRO (stages 0-3) training and the harness that reproduces the ZeRO paper's results.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    t = sub.add_parser("train", help="run one training job (spawns --dp processes, or runs under torchrun/srun)",
                       description="Train a GPT with ZeRO on synthetic data; print and record loss, step time, "
                                   "TFLOPs, and the memory and communication ledgers.")
    _add_train_args(t)
    t.set_defaults(func=cmd_train)
    d = sub.add_parser("demo", help="the embedded default: tiny GPT, ZeRO stages 0-3 on local processes",
                       description="Train the tiny GPT at ZeRO stages 0-3 on local CPU processes and print "
                                   "memory, communication, time and loss side by side.")
    d.add_argument("--out", default=None, help="directory for the runs' rows (default runs/demo-<time>)")
    d.set_defaults(func=cmd_demo)
    sw = sub.add_parser("sweep", help="run every configuration of a suite, recording rows (failures included)",
                        description="Expand a suite (base + axes) into runs and run each on local processes; "
                                    "failed, out-of-memory, timed-out and invalid runs become rows with a reason.")
    sw.add_argument("suite", help="a suite YAML file, or a name under suites/ (e.g. cpu/quick)")
    sw.add_argument("--out", help="results directory (default runs/<suite name>)")
    sw.add_argument("--resume", action="store_true", help="skip runs that already have an ok status row in --out")
    sw.add_argument("--launcher", default="local",
                    help="local (processes on this host), srun (job steps inside a Slurm allocation), "
                         "slurm (one sbatch job per run, tracked to its final state)")
    sw.add_argument("--only", action="append", metavar="KEY=VALUE", help="run only runs with this key (repeatable)")
    sw.add_argument("--check", action="store_true", help="validate the suite and exit (non-zero if a run is invalid)")
    sw.add_argument("--no-progress", action="store_true", help="no progress bar")
    sw.add_argument("--tensorboard", metavar="DIR", help="per-step scalars of every run for TensorBoard")
    sw.add_argument("--allow-failures", action="store_true", help="exit 0 even if some runs failed")
    sw.set_defaults(func=cmd_sweep)
    ms = sub.add_parser("maxsize", help="the largest model (layers) that trains within a memory budget",
                        description="Binary search on layers at fixed hidden/heads; each probe is a fresh run "
                                    "with the budget enforced (CPU: live-tensor tracker; GPU: CUDA OOM).")
    ms.add_argument("--budget", required=True, help="per-device memory budget, e.g. 16MiB or 32GB")
    ms.add_argument("--stage", type=int, nargs="+", default=[0, 3], help="stages to search (default 0 3)")
    ms.add_argument("--preset", default="tiny")
    for name in ("hidden", "heads", "vocab", "seq"):
        ms.add_argument(f"--{name}", type=int)
    ms.add_argument("--dp", type=int, default=4)
    ms.add_argument("--tp", type=int, default=1)
    ms.add_argument("--precision", default="fp32")
    ms.add_argument("--micro-batch", type=int, default=1)
    ms.add_argument("--checkpoint-activations", action="store_true")
    ms.add_argument("--pa", action="store_true")
    ms.add_argument("--pa-cpu", action="store_true")
    ms.add_argument("--md", action="store_true")
    ms.add_argument("--bucket-size", type=int, default=6_250_000, metavar="ELEMENTS",
                    help="gradient/parameter bucket size in elements (C_B)")
    _add_offload_args(ms)
    ms.add_argument("--max-layers", type=int, default=256, help="search limit")
    ms.add_argument("--timeout", type=float, default=300.0, help="per-probe wall-clock limit (s)")
    ms.add_argument("--out", help="write max_layers / max_params rows here")
    ms.set_defaults(func=cmd_maxsize)
    pe = sub.add_parser("peers", help="zerobench stages vs torch DDP/ZeRO-1/FSDP1/FSDP2 and DeepSpeed, side by side",
                        description="Every candidate trains the same GPT on the same processes, interleaved round "
                                    "by round; reports step time relative to torch-ddp (median of per-round "
                                    "ratios), peak memory per rank and loss parity, as rows and a table.")
    pe.add_argument("--systems", nargs="+", default=None,
                    help="candidates (default: zerobench-0..3, the torch peers, DeepSpeed 0-3 + offload if installed)")
    pe.add_argument("--dp", type=int, default=2, help="processes")
    pe.add_argument("--preset", default="tiny", help="model preset")
    pe.add_argument("--layers", type=int, default=None, help="override the preset's layers")
    pe.add_argument("--hidden", type=int, default=None, help="override the preset's hidden size")
    pe.add_argument("--seq", type=int, default=None, help="override the preset's sequence length")
    pe.add_argument("--micro-batch", type=int, default=2)
    pe.add_argument("--steps", type=int, default=6)
    pe.add_argument("--warmup", type=int, default=2)
    pe.add_argument("--rounds", type=int, default=3, help="interleaved timing rounds")
    pe.add_argument("--no-memory-run", action="store_true", help="skip the per-candidate live-tensor run")
    pe.add_argument("--out", default=None, help="rows directory (default runs/peers-<time>)")
    pe.set_defaults(func=cmd_peers)
    bk = sub.add_parser("bench-kernels", help="the fused kernels side by side with torch (and DeepSpeed): rows + table",
                        description="AdamW over one flat fp32 partition by every candidate, interleaved round by "
                                    "round, against a bandwidth-limit kernel with AdamW's access pattern; then "
                                    "bias+GeLU and LayerNorm (forward+backward) against eager PyTorch.")
    bk.add_argument("--numel", type=int, default=50_000_000, help="elements of the flat partition (default 50M)")
    bk.add_argument("--rounds", type=int, default=7, help="interleaved rounds; medians over them")
    bk.add_argument("--device", default="cpu", help="cpu or cuda")
    bk.add_argument("--no-deepspeed", action="store_true", help="skip DeepSpeedCPUAdam even when installed")
    bk.add_argument("--ops", action="store_true", help="also bias+GeLU and LayerNorm (rows x hidden below)")
    bk.add_argument("--compile", action="store_true", help="with --ops: add torch.compile candidates")
    bk.add_argument("--rows", type=int, default=8192, help="with --ops: tokens (batch x sequence)")
    bk.add_argument("--hidden", type=int, default=1024, help="with --ops: hidden size")
    bk.add_argument("--out", default=None, help="write result rows here (default runs/bench-kernels-<time>)")
    bk.set_defaults(func=cmd_bench_kernels)
    rg = sub.add_parser("regress", help="the performance regression gate: candidate rows vs a baseline",
                        description="Compare per (configuration, metric) with per-metric rules; exit 1 on a "
                                    "regression; flag improvements and write a proposed new baseline.")
    rg.add_argument("--baseline", help="baseline rows, e.g. results/baselines/cpu-2core.jsonl")
    rg.add_argument("--candidate", help="candidate results directory or rows file")
    rg.add_argument("--timing-tolerance", type=float, default=0.05,
                    help="minimum tolerance on step-time ratios (default 0.05; widen across machines)")
    rg.add_argument("--timing", choices=["gate", "report"], default="gate",
                    help="gate: step-time ratio regressions fail; report: shown, not failing (cross-session baselines)")
    rg.add_argument("--propose", help="where to write the proposed baseline (default next to the candidate)")
    rg.add_argument("--write-baseline", metavar="FILE", help="record the candidate as a baseline and exit")
    ab = rg.add_argument_group("interleaved A/B timing (sees 10 per cent slowdowns on noisy machines)")
    ab.add_argument("--ab", metavar="SUITE", help="run SUITE's runs alternately with the baseline code and this "
                                                  "checkout, fresh processes, ABBA rounds; gate on the median ratio")
    ab.add_argument("--baseline-ref", metavar="REF", help="with --ab: git ref of the baseline (checked out into a "
                                                          "temporary worktree), e.g. origin/main or HEAD~1")
    ab.add_argument("--baseline-tree", metavar="DIR", help="with --ab: a source tree of the baseline instead")
    ab.add_argument("--rounds", type=int, default=6, help="with --ab: measured alternations, even (default 6)")
    ab.add_argument("--only", action="append", default=[], metavar="KEY=VALUE", help="with --ab: only these runs")
    ab.add_argument("--baseline-env", action="append", default=[], metavar="KEY=VALUE",
                    help="with --ab: extra environment for the baseline side")
    ab.add_argument("--candidate-env", action="append", default=[], metavar="KEY=VALUE",
                    help="with --ab: extra environment for the candidate side (e.g. a planted delay)")
    ab.add_argument("--cpus", metavar="LIST", help="with --ab: pin both sides to these CPUs (taskset syntax, "
                                                   "e.g. 1 or 2-3); leaves the rest for the machine's housekeeping")
    ab.add_argument("--ab-metric", choices=["step_time_norm", "step_time_s"], default="step_time_norm",
                    help="with --ab: step time over a same-process matmul reference (default) or raw step time")
    ab.add_argument("--out", help="with --ab: directory for both sides' rows and the verdict rows")
    rg.set_defaults(func=cmd_regress)
    rp = sub.add_parser("report", help="paper-style HTML + Markdown report from result rows",
                        description="Aggregate rows, draw the figures (seaborn) and render report_templates/.")
    rp.add_argument("results", nargs="+", help="results directories or rows files")
    rp.add_argument("--out", required=True, help="report directory (index.html, summary.md, figures)")
    rp.set_defaults(func=cmd_report)
    rs = sub.add_parser("results", help="inspect result rows")
    rsub = rs.add_subparsers(dest="results_command", required=True, metavar="ACTION")
    rshow = rsub.add_parser("show", help="one line per run: status, configuration, headline metrics")
    rshow.add_argument("path", help="a results directory or rows.jsonl file")
    rshow.set_defaults(func=cmd_results)
    pl = sub.add_parser("plan", help="memory/communication analysis, the paper's tables, dry runs, projections",
                        description="Plan a configuration without a cluster: per-GPU memory and communication "
                                    "by the paper's analysis, Tables 1 and 2, the largest model that fits, a dry "
                                    "run of the real engine on the fake backend, and a stated performance model.")
    _add_plan_args(pl)
    pl.set_defaults(func=cmd_plan)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except ConfigError as e:
        print(f"zerobench: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("zerobench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
