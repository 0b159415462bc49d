"""``zerobench train``, ``demo`` and ``maxsize``: training arguments into a TrainConfig / RunSpec."""

from __future__ import annotations

import argparse
import contextlib
import datetime
import sys

from zerobench.cli.types import byte_size, count, number, path, seed
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
        g.add_argument(f"--{name}", type=count(1), help=f"override the preset's {name}")


def _add_train_args(p: argparse.ArgumentParser) -> None:
    _add_model_args(p)
    g = p.add_argument_group("parallelism and precision")
    g.add_argument(  # default None: --paper-config tells an explicit --stage from the default
        "--stage", type=int, default=None, help="ZeRO stage 0 (DP), 1 (P_os), 2 (P_os+g), 3 (P_os+g+p); default 0"
    )
    g.add_argument(
        "--dp",
        type=count(1),
        default=None,
        help="data-parallel degree = number of processes (default: the world size under "
        "torchrun/srun, else 1); without torchrun/srun zerobench starts them itself",
    )
    g.add_argument(
        "--system",
        default="zerobench",
        help="zerobench (this engine) or megatron (the Megatron-LM baseline: megatron-core's GPTModel, TP, DDP)",
    )
    g.add_argument("--tp", type=count(1), default=1, help="tensor (model) parallel degree; world = dp * tp")
    g.add_argument("--sp", action="store_true", help="sequence parallelism inside the TP group (Megatron SP)")
    g.add_argument("--precision", default="fp32", help="fp32, bf16 or fp16")
    g.add_argument(
        "--kernels",
        default="auto",
        choices=["auto", "fused", "reference", "compiled"],
        help="fused kernels (AdamW step, LayerNorm, bias+GeLU; kernels/): auto = where the device "
        "has them, fused = required, reference = plain PyTorch, compiled = each block through torch.compile "
        "(the optimizer's as auto)",
    )
    g = p.add_argument_group("ZeRO-R (paper §6)")
    g.add_argument("--checkpoint-activations", action="store_true", help="recompute each block in backward")
    g.add_argument("--pa", action="store_true", help="P_a: partition activation checkpoints over TP ranks")
    g.add_argument("--pa-cpu", action="store_true", help="P_a+cpu: keep partitioned checkpoints in host memory")
    g.add_argument("--md", action="store_true", help="M_D: checkpoints in one pre-allocated contiguous buffer")
    g.add_argument(
        "--paper-config",
        choices=sorted(PAPER_CONFIGS),
        help="the paper's Table 3 configuration (sets --stage and the ZeRO-R switches; one given with it that "
        "says otherwise is refused): " + "; ".join(f"{k} = {v[0]}" for k, v in sorted(PAPER_CONFIGS.items())),
    )
    g.add_argument(
        "--bucket-size",
        type=count(1),
        default=6_250_000,
        metavar="ELEMENTS",
        help="gradient/parameter bucket size in elements (C_B)",
    )
    g.add_argument(
        "--no-overlap-comm",
        dest="overlap_comm",
        action="store_false",
        help="wait for each gradient bucket's collective before backward goes on (DeepSpeed's "
        "overlap_comm off): stages 2-3 then hold one staging bucket at a time",
    )
    _add_offload_args(p)
    g = p.add_argument_group("batch and schedule")
    g.add_argument("--micro-batch", type=count(1), default=2, help="sequences per micro-batch per rank")
    g.add_argument("--grad-accum", type=count(1), default=1, help="micro-batches per optimizer step")
    g.add_argument("--steps", type=count(1), default=10, help="optimizer steps")
    g.add_argument("--warmup", type=count(0), default=2, help="steps excluded from timing medians")
    g.add_argument("--lr", type=number(above=0), default=1e-3, help="AdamW learning rate")
    g.add_argument("--weight-decay", type=number(minimum=0), default=0.1, help="AdamW decoupled weight decay")
    g.add_argument("--clip", type=number(above=0), default=None, help="clip the global gradient norm to this")
    g.add_argument("--seed", type=seed, default=1234)
    g = p.add_argument_group("output and runtime")
    g.add_argument("--out", type=path, default=None, help="directory for result rows (default: runs/<run id>)")
    g.add_argument("--run-id", default=None, help="run id stored in every row (default: train-<time>)")
    g.add_argument("--no-track-memory", action="store_true", help="skip the CPU live-tensor tracker")
    g.add_argument(
        "--tensorboard", type=path, metavar="DIR", help="also write per-step scalars for TensorBoard under DIR"
    )
    g.add_argument(
        "--profile",
        type=path,
        metavar="DIR",
        help="trace the last steps with torch.profiler: DIR/<run id>/rank<r>.trace.json (Perfetto) and "
        "rank<r>.ops.txt (operators by self time) per rank; the traced steps are left out of the medians",
    )
    g.add_argument("--profile-steps", type=count(1), metavar="N", help="steps --profile traces (default 2)")
    g.add_argument(
        "--memory-budget",
        metavar="BYTES",
        type=byte_size,
        help="per-device memory budget, e.g. 16GiB (GPU: a smaller card emulated with "
        "set_per_process_memory_fraction; CPU: the live-tensor tracker); past it the run fails as OOM",
    )
    g.add_argument(
        "--timeout",
        type=number(above=0),
        default=3600.0,
        help="wall-clock limit of a launch of several local processes (s); a one-process run trains in this "
        "process and has none (sweeps launch every run, and limit it)",
    )
    g.add_argument(
        "--collective-timeout",
        type=number(above=0),
        default=300.0,
        metavar="SECONDS",
        help="a collective waiting longer fails the run, naming the stuck rank (default 300)",
    )
    g.add_argument(
        "--backend",
        default="auto",
        choices=["auto", "nccl", "gloo"],
        help="process-group backend: auto = NCCL where each rank has a GPU of its own, gloo on CPU or "
        "where ranks share a GPU (gloo runs several ranks on one card)",
    )


def _add_offload_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("offload and 8-bit optimizer states (ZeRO-Offload / ZeRO-Infinity)")
    g.add_argument(
        "--offload-optimizer",
        default="none",
        choices=["none", "cpu", "nvme"],
        help="stages 1-3: fp32 master + Adam states in host memory, step on the CPU kernel (cpu); "
        "as cpu with the states swapped to files under --nvme-path (nvme)",
    )
    g.add_argument(
        "--offload-param",
        default="none",
        choices=["none", "cpu"],
        help="stage 3 with optimizer offload: the parameter partition in host memory",
    )
    g.add_argument("--nvme-path", type=path, metavar="DIR", help="directory for --offload-optimizer nvme's state files")
    g.add_argument(
        "--optim-bits", type=int, default=32, choices=[32, 8], help="Adam moments in fp32 or blockwise-quantized 8-bit"
    )


def _offload_kwargs(args: argparse.Namespace) -> dict:
    return dict(
        offload_optimizer=args.offload_optimizer,
        offload_param=args.offload_param,
        nvme_path=args.nvme_path,
        optim_bits=args.optim_bits,
    )


def _apply_paper_config(args: argparse.Namespace) -> None:
    """``--paper-config``'s settings into ``args`` (``--stage`` 0 without one). A flag given with it that agrees is
    kept; one that says otherwise is refused in one line, where it was overwritten without a word (``--paper-config
    C1 --stage 3`` ran stage 1) or kept into another configuration (``C1 --pa`` ran C2)."""
    name = args.paper_config
    if not name:
        args.stage = 0 if args.stage is None else args.stage
        return
    label, settings = PAPER_CONFIGS[name]
    if args.stage is not None and args.stage != settings["stage"]:
        raise ConfigError(
            f"--stage {args.stage} conflicts with --paper-config {name} ({label}), which is stage "
            f"{settings['stage']}: drop --stage, or drop --paper-config"
        )
    for key, flag, what in (("pa", "--pa", "P_a"), ("pa_cpu", "--pa-cpu", "P_a+cpu")):
        if getattr(args, key) and not settings.get(key):
            with_it = [
                c for c, (_, s) in sorted(PAPER_CONFIGS.items()) if s["stage"] == settings["stage"] and s.get(key)
            ]
            instead = f", or choose {' or '.join(with_it)}, which has it" if with_it else ""
            raise ConfigError(
                f"{flag} conflicts with --paper-config {name} ({label}), which runs without {what}: drop {flag}{instead}"
            )
    for key, value in settings.items():
        setattr(args, key, value)
    args.checkpoint_activations = True  # every configuration of Table 3 checkpoints activations


def cmd_train(args: argparse.Namespace) -> int:
    from pathlib import Path

    from zerobench.bench.spec import RunSpec, to_train_config
    from zerobench.distributed.env import detect
    from zerobench.launch.local import check_local_world
    from zerobench.results.lock import claim
    from zerobench.results.outdir import check_name, check_writable_dir

    _apply_paper_config(args)
    if args.profile_steps is not None and not args.profile:
        raise ConfigError("--profile-steps needs --profile DIR (where the traces go)")
    denv = detect()
    dp = args.dp if args.dp is not None else max(1, denv.world_size // args.tp)
    # The same RunSpec a suite row is, resolved by the same to_train_config (bench/spec.py).
    spec = RunSpec(
        system=args.system,
        preset=args.preset,
        layers=args.layers,
        hidden=args.hidden,
        heads=args.heads,
        vocab=args.vocab,
        seq=args.seq,
        stage=args.stage,
        dp=dp,
        tp=args.tp,
        sp=args.sp,
        kernels=args.kernels,
        precision=args.precision,
        micro_batch=args.micro_batch,
        grad_accum=args.grad_accum,
        steps=args.steps,
        warmup=args.warmup,
        lr=args.lr,
        weight_decay=args.weight_decay,
        clip=args.clip,
        bucket_size=args.bucket_size,
        overlap_comm=args.overlap_comm,
        checkpoint_activations=args.checkpoint_activations,
        pa=args.pa,
        pa_cpu=args.pa_cpu,
        md=args.md,
        seed=args.seed,
        memory_budget=args.memory_budget,
        collective_timeout=args.collective_timeout,
        backend=args.backend,
        track_memory=not args.no_track_memory,
        tensorboard=args.tensorboard,
        profile=args.profile,
        profile_steps=args.profile_steps or 2,
        **_offload_kwargs(args),
    )
    cfg = to_train_config(spec, denv.world_size if denv.source != "single" else None)
    if denv.source == "single":  # this process starts the ranks: under torchrun/srun each node starts its own
        check_local_world(
            cfg.world_size,
            _world_flags(cfg.dp, cfg.tp),
            "run it under torchrun or srun, which start each node's ranks (docs/cluster.md), or plan its memory "
            "and time with zerobench plan",
        )
    run_id = args.run_id if args.run_id is not None else "train-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    check_name(run_id, "--run-id", ": give e.g. --run-id my-run (a directory name under runs/)")
    for flag, where, what in (
        ("--tensorboard", args.tensorboard, "TensorBoard scalars"),
        ("--profile", args.profile, "profiler traces"),
    ):
        if where:
            check_writable_dir(where, flag, what)
    if args.run_id is None and denv.source != "single":
        run_id = _shared_run_id(denv, run_id, cfg.collective_timeout_s)
    if args.tensorboard and denv.rank == 0:  # before any rank starts; rank 0 checks again as it opens its writer
        from zerobench.train.hooks import refuse_held_events

        refuse_held_events(args.tensorboard, run_id)
    out = Path(args.out) if args.out else Path("runs") / run_id
    # The directory is this run's alone: locked by the launcher, or under torchrun/srun by global rank 0 (every
    # rank writes into it under that one lock); its rows are checked once the lock is held.
    with claim(out) if denv.rank == 0 else contextlib.nullcontext():
        return _train_into(cfg, denv, out, run_id, args.timeout)


def _world_flags(dp: int, tp: int | None) -> str:
    """The flags a local world comes from, as the refusal of a too large one names them."""
    return f"--dp {dp}" + (f" x --tp {tp}" if tp and tp > 1 else "")


def _shared_run_id(denv, run_id: str, timeout_s: float) -> str:
    """Under torchrun or srun every rank names the run by its own clock, and ranks started a second apart wrote the
    rows of one run under two ids (and, without ``--out``, into two directories): rank 0's is taken, through the
    job's store. A rendezvous that fails here is left to the run, which reports it as its own (at once: the failure
    is kept, not waited out again)."""
    from zerobench.distributed.rendezvous import RendezvousError, agree_value

    try:
        return agree_value(
            denv.rank, denv.world_size, denv.master_addr, denv.master_port, timeout_s, "run_id", run_id, denv.launch_id
        )
    except RendezvousError:
        return run_id


def _train_into(cfg, denv, out, run_id: str, timeout: float) -> int:
    # Only a valid run pays for importing torch: a bad flag was refused above in a fraction of a second.
    from zerobench.distributed.env import DistEnv
    from zerobench.launch.base import EXIT_IO, EXIT_OOM, write_status
    from zerobench.launch.cancel import EXIT_CANCELLED
    from zerobench.launch.local import free_port, launch_local
    from zerobench.launch.worker import run_rank
    from zerobench.results.outdir import check_fresh_run_dir
    from zerobench.results.rows import RowWriteError

    check_fresh_run_dir(out)
    if denv.source != "single":  # under torchrun / srun: this process is one rank
        return run_rank(cfg, denv, out, run_id)
    if cfg.world_size == 1:
        return run_rank(cfg, DistEnv(0, 1, 0, "127.0.0.1", free_port(), "single"), out, run_id)
    log = out / "run.log"
    res = launch_local(cfg, out, run_id, timeout_s=timeout, log_path=log, echo=True)
    unrecorded = ""
    try:
        write_status(res, out, run_id, cfg)  # ok too: a run without its status row reads as incomplete
    except RowWriteError as e:  # the disk that failed the run: its cause still reaches the one line
        unrecorded = f"; its status row could not be written either ({e})"
    if not res.ok:
        print(f"zerobench: error: run failed: {res.reason} (every rank's output: {log}){unrecorded}", file=sys.stderr)
        return {"oom": EXIT_OOM, "cancelled": EXIT_CANCELLED}.get(res.status, 1)
    if unrecorded:  # the run trained, but its rows would read as incomplete: say so, and fail
        print(f"zerobench: error: the run finished{unrecorded}", file=sys.stderr)
        return EXIT_IO
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    from pathlib import Path

    from zerobench.demo import run_demo

    return run_demo(Path(args.out) if args.out else None)


def cmd_maxsize(args: argparse.Namespace) -> int:
    from pathlib import Path

    from zerobench.launch.local import check_local_world
    from zerobench.results.lock import claim

    check_local_world(  # before --out and --probes are created, and before the first probe
        args.dp * args.tp,
        _world_flags(args.dp, args.tp),
        "every probe runs on this host: give a smaller world, or solve for the size with zerobench plan --max-size",
    )
    with contextlib.ExitStack() as held:  # --out and --probes are this search's alone while it runs
        claimed = set()
        for flag, d in (("--out", args.out), ("--probes", args.probes)):
            if d and Path(d).resolve() not in claimed:
                claimed.add(Path(d).resolve())
                held.enter_context(claim(d, flag))
        return _maxsize(args)


def _maxsize(args: argparse.Namespace) -> int:
    import dataclasses
    from pathlib import Path

    from zerobench.bench.maxsize import search_max_layers
    from zerobench.bench.spec import RunSpec, to_train_config
    from zerobench.launch.cancel import EXIT_CANCELLED, Cancellation, Cancelled
    from zerobench.results.outdir import check_writable_dir

    base = RunSpec(
        preset=args.preset,
        hidden=args.hidden,
        heads=args.heads,
        vocab=args.vocab,
        seq=args.seq,
        dp=args.dp,
        tp=args.tp,
        precision=args.precision,
        micro_batch=args.micro_batch,
        checkpoint_activations=args.checkpoint_activations,
        pa=args.pa,
        pa_cpu=args.pa_cpu,
        md=args.md,
        timeout=args.timeout,
        bucket_size=args.bucket_size,
        **_offload_kwargs(args),
    )
    if args.start_layers > args.max_layers:
        raise ConfigError(
            f"--start-layers {args.start_layers} is above --max-layers {args.max_layers}: start the search "
            "inside it, or raise --max-layers"
        )
    if args.out:
        _check_search_dir(Path(args.out), args.probes)
    if args.probes:
        check_writable_dir(args.probes, "--probes", "probe logs")
    for stage in args.stage:  # every stage's configuration checked before the first probe, not when its turn comes
        to_train_config(dataclasses.replace(base, stage=stage, layers=1, memory_budget=args.budget))
    results = {}
    with Cancellation() as cancel:  # SIGTERM/SIGINT stop the search, not only the probe in progress
        for stage in args.stage:
            spec = dataclasses.replace(base, stage=stage)
            work = Path(args.probes) / f"stage{stage}" if args.probes else None
            try:
                res = search_max_layers(
                    spec,
                    args.budget,
                    limit=args.max_layers,
                    start=args.start_layers,
                    work_dir=work,
                    cancel=cancel,
                    on_probe=lambda L, st, s=stage: print(f"  stage {s}: {L:4d} layers -> {st}", flush=True),
                )
            except Cancelled as e:
                done = (
                    f"; the rows of stage(s) {', '.join(map(str, results))} are in {args.out}"
                    if (results and args.out)
                    else ""
                )
                print(f"zerobench: error: maxsize stopped at stage {stage}: {e}{done}", file=sys.stderr)
                return EXIT_CANCELLED
            world = f"dp {base.dp} x tp {base.tp or 1}: {base.dp * (base.tp or 1)} process(es) on this host"
            if res.max_layers == 0:  # no row: a maximum of 0 parameters would read as a measurement
                print(
                    f"zerobench: error: stage {stage}: even 1 layer exceeds {args.budget} per process ({world}); "
                    "no row written: give a larger --budget, more processes or a smaller model",
                    file=sys.stderr,
                )
                continue
            results[stage] = res
            capped = res.max_layers == args.max_layers  # the limit itself fits: the maximum is beyond it
            print(
                f"stage {stage}: {'at least' if capped else 'at most'} {res.max_layers} layers = "
                f"{res.max_params / 1e6:.2f}M params within {args.budget} per process ({world})"
                + (" (the --max-layers limit fits: raise it to find the maximum)" if capped else "")
            )
            if args.out:  # each stage's rows as soon as it is found: a cancel later loses none
                _write_maxsize_rows(args, dataclasses.replace(base, stage=stage), res)
    if len(results) > 1:
        first = results[next(iter(results))]
        for stage, r in results.items():
            print(f"  stage {stage} / stage {next(iter(results))}: {r.max_params / first.max_params:.2f}x parameters")
    return 0 if len(results) == len(args.stage) else 1


SEARCH_METRICS = ("max_layers", "max_params")


def _check_search_dir(out, probes: str | None) -> None:
    """``maxsize --out``: a directory of max-size searches' rows (repeats of a search may share one: the report takes
    their median), never one holding other rows (a sweep's runs, a training run's; ``probes``' own aside), nor one in
    a sweep, where the search's rows would read as one of its runs'."""
    from pathlib import Path

    from zerobench.results.outdir import check_outside_sweep, check_writable_dir
    from zerobench.results.rows import files_below, read_rows

    check_writable_dir(out, "--out", "max-size rows")
    check_outside_sweep(out)
    probes = Path(probes).resolve() if probes else None
    for f in files_below(out):
        if probes is not None and f.resolve().is_relative_to(probes):
            continue  # the probes' own training runs (--probes inside --out)
        other = next((r for r in read_rows(f) if r.get("metric") not in SEARCH_METRICS), None)
        if other is not None:
            raise ConfigError(
                f"--out {out} holds rows other than max-size searches' ({f}: run {other.get('run_id')}'s "
                f"{other.get('metric')}): give the search a directory of its own (repeats of a search may share one)"
            )


def _write_maxsize_rows(args: argparse.Namespace, spec, res) -> None:
    """A stage's max_layers and max_params rows in ``--out`` (the run id names the stage and any offload)."""
    import dataclasses
    import json

    from zerobench.results.rows import RowWriter

    off = (
        ""
        if args.offload_optimizer == "none"
        else f"-offload-{args.offload_optimizer}" + ("-param" if args.offload_param != "none" else "")
    )
    off += "" if args.optim_bits == 32 else f"-adam{args.optim_bits}"
    from zerobench.bench.maxsize import PROBE_STEPS

    # the configuration each probe ran: PROBE_STEPS steps from the first, not the spec's steps and warm-up
    ran = {**dataclasses.asdict(spec), "steps": PROBE_STEPS, "warmup": 0, "budget": args.budget}
    tags = {"kernels_ran": res.kernels} if res.kernels else None  # the path the probes' kernels took
    w = RowWriter(args.out, f"maxsize-stage{spec.stage}{off}", ran, tags=tags)
    bound = {"bound": "at least"} if res.max_layers == args.max_layers else {}  # the search limit fits
    w.write("max_layers", res.max_layers, "layers", **bound)
    w.write("max_params", res.max_params, "params", probes=json.dumps(res.probes), **bound)


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to the ``zerobench`` parser."""
    t = sub.add_parser(
        "train",
        help="run one training job (spawns --dp processes, or runs under torchrun/srun)",
        description="Train a GPT with ZeRO on synthetic data; print and record loss, step time, "
        "TFLOPs, and the memory and communication ledgers.",
    )
    _add_train_args(t)
    t.set_defaults(func=cmd_train)
    d = sub.add_parser(
        "demo",
        help="the embedded default: tiny GPT, ZeRO stages 0-3 on local processes",
        description="Train the tiny GPT at ZeRO stages 0-3 on local CPU processes and print "
        "memory, communication, time and loss side by side.",
    )
    d.add_argument("--out", type=path, default=None, help="directory for the runs' rows (default runs/demo-<time>)")
    d.set_defaults(func=cmd_demo)
    ms = sub.add_parser(
        "maxsize",
        help="the largest model (layers) that trains within a memory budget",
        description="Binary search on layers at fixed hidden/heads; each probe is a fresh run "
        "with the budget enforced (CPU: live-tensor tracker; GPU: CUDA OOM).",
    )
    ms.add_argument("--budget", required=True, type=byte_size, help="per-device memory budget, e.g. 16MiB or 32GB")
    ms.add_argument("--stage", type=int, nargs="+", default=[0, 3], help="stages to search (default 0 3)")
    ms.add_argument("--preset", default="tiny")
    for name in ("hidden", "heads", "vocab", "seq"):
        ms.add_argument(f"--{name}", type=count(1))
    ms.add_argument(
        "--dp",
        type=count(1),
        default=4,
        help="data-parallel ranks, each with the budget (default 4; "
        "on one GPU they share the card: give --dp 1 for one)",
    )
    ms.add_argument("--tp", type=count(1), default=1)
    ms.add_argument("--precision", default="fp32")
    ms.add_argument("--micro-batch", type=count(1), default=1)
    ms.add_argument("--checkpoint-activations", action="store_true")
    ms.add_argument("--pa", action="store_true")
    ms.add_argument("--pa-cpu", action="store_true")
    ms.add_argument("--md", action="store_true")
    ms.add_argument(
        "--bucket-size",
        type=count(1),
        default=6_250_000,
        metavar="ELEMENTS",
        help="gradient/parameter bucket size in elements (C_B)",
    )
    _add_offload_args(ms)
    ms.add_argument("--max-layers", type=count(1), default=256, help="search limit")
    ms.add_argument(
        "--start-layers",
        type=count(1),
        default=1,
        help="start the search here, e.g. at `zerobench plan --max-size --profile`'s answer: a right "
        "guess costs two probes (default 1: double from one layer)",
    )
    ms.add_argument("--timeout", type=number(above=0), default=300.0, help="per-probe wall-clock limit (s)")
    ms.add_argument("--out", type=path, help="write max_layers / max_params rows here")
    ms.add_argument(
        "--probes",
        type=path,
        metavar="DIR",
        help="keep every probe's log and rows (status, peak allocated and "
        "reserved bytes) under DIR/stageN/probe-L (default: discarded)",
    )
    ms.set_defaults(func=cmd_maxsize)
