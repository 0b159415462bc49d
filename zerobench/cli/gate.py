"""``zerobench regress``: the stored-baseline gate and the interleaved A/B timing gate."""

from __future__ import annotations

import argparse
import datetime
import sys

from zerobench.cli.types import count, number
from zerobench.config import ConfigError


def cmd_regress(args: argparse.Namespace) -> int:
    from zerobench.bench.regress import _rows, run_gate, write_baseline

    if args.ab:
        return _cmd_ab(args)
    if not args.candidate:
        raise ConfigError("give --candidate RESULTS (or --ab SUITE for an interleaved A/B comparison)")
    if args.write_baseline:
        from zerobench.results.outdir import check_writable_file

        check_writable_file(args.write_baseline, "--write-baseline", "baseline")
        n = write_baseline(_rows(args.candidate), args.write_baseline)
        print(f"baseline written: {args.write_baseline} ({n} rows)")
        return 0
    if not args.baseline:
        raise ConfigError("give --baseline FILE (or --write-baseline FILE to record one)")
    return run_gate(args.baseline, args.candidate, args.timing_tolerance, args.propose, args.timing, strict=args.strict)


def _cmd_ab(args: argparse.Namespace) -> int:
    import contextlib
    from pathlib import Path

    from tabulate import tabulate

    from zerobench.bench.ab import ABConfig, parse_cpus, run_ab, worktree
    from zerobench.results.outdir import check_writable_dir

    if bool(args.baseline_ref) == bool(args.baseline_tree):
        raise ConfigError("--ab needs exactly one of --baseline-ref REF or --baseline-tree DIR")
    here = Path(__file__).resolve().parents[2]
    out = Path(args.out) if args.out else Path("runs") / ("ab-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    check_writable_dir(out)  # before a baseline worktree is checked out
    tol = args.timing_tolerance
    ctx = worktree(args.baseline_ref, here) if args.baseline_ref else contextlib.nullcontext(args.baseline_tree)
    with ctx as base:
        cfg = ABConfig(
            suite=args.ab,
            baseline_tree=base,
            candidate_tree=str(here),
            rounds=args.rounds,
            max_rounds=args.max_rounds,
            only=tuple(args.only),
            tolerance=tol,
            baseline_env=tuple(args.baseline_env),
            candidate_env=tuple(args.candidate_env),
            metric=args.ab_metric,
            concurrent=args.concurrent,
            lockstep=args.lockstep,
            cpus=parse_cpus(args.cpus) if args.cpus else (),
        )
        verdicts = run_ab(cfg, out, say=lambda m: print(m, file=sys.stderr, flush=True))
    print(
        tabulate(
            [
                [v["run"], f"{v['median_ratio']:.3f}", f"{v['min']:.3f}-{v['max']:.3f}", v["rounds"], v["verdict"]]
                for v in verdicts
            ],
            headers=["run", "candidate / baseline (median)", "range", "rounds", "verdict"],
        )
    )
    bad = [v for v in verdicts if v["verdict"] == "REGRESSION"]
    print(f"{len(bad)} regressions (tolerance {tol:.0%}); rows: {out / 'summary'}")
    return 1 if bad else 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to the ``zerobench`` parser."""
    rg = sub.add_parser(
        "regress",
        help="the performance regression gate: candidate rows vs a baseline",
        description="Compare per (configuration, metric) with per-metric rules; exit 1 on a "
        "regression; flag improvements and write a proposed new baseline.",
    )
    rg.add_argument("--baseline", help="baseline rows, e.g. results/baselines/cpu-2core.jsonl")
    rg.add_argument("--candidate", help="candidate results directory or rows file")
    rg.add_argument(
        "--timing-tolerance",
        type=number(above=0),
        default=0.05,
        help="minimum tolerance on step-time ratios (default 0.05; widen across machines)",
    )
    rg.add_argument(
        "--timing",
        choices=["gate", "report"],
        default="gate",
        help="gate: step-time ratio regressions fail; report: shown, not failing (cross-session baselines)",
    )
    rg.add_argument(
        "--strict",
        action="store_true",
        help="also fail on what the baseline lacks: a candidate run or gated metric with nothing to "
        "compare it with (default: listed as 'not in the baseline', not failing)",
    )
    rg.add_argument("--propose", help="where to write the proposed baseline (default next to the candidate)")
    rg.add_argument("--write-baseline", metavar="FILE", help="record the candidate as a baseline and exit")
    ab = rg.add_argument_group("interleaved A/B timing (sees 10 per cent slowdowns on noisy machines)")
    ab.add_argument(
        "--ab",
        metavar="SUITE",
        help="run SUITE's runs alternately with the baseline code and this "
        "checkout, fresh processes, ABBA rounds; gate on the median ratio",
    )
    ab.add_argument(
        "--baseline-ref",
        metavar="REF",
        help="with --ab: git ref of the baseline (checked out into a temporary worktree), e.g. origin/main or HEAD~1",
    )
    ab.add_argument("--baseline-tree", metavar="DIR", help="with --ab: a source tree of the baseline instead")
    ab.add_argument("--rounds", type=count(1), default=6, help="with --ab: measured alternations, even (default 6)")
    ab.add_argument(
        "--max-rounds",
        type=count(0),
        default=0,
        help="with --ab: add AB/BA pairs while a verdict is within noise of the tolerance, up to "
        "this many rounds (default: no extra rounds)",
    )
    ab.add_argument("--only", action="append", default=[], metavar="KEY=VALUE", help="with --ab: only these runs")
    ab.add_argument(
        "--baseline-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --ab: extra environment for the baseline side",
    )
    ab.add_argument(
        "--candidate-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="with --ab: extra environment for the candidate side (e.g. a planted delay)",
    )
    ab.add_argument(
        "--cpus",
        metavar="LIST",
        help="with --ab: pin both sides to these CPUs (taskset syntax, "
        "e.g. 1 or 2-3); leaves the rest for the machine's housekeeping",
    )
    ab.add_argument(
        "--concurrent",
        action="store_true",
        help="with --ab: run both sides at once on disjoint halves of --cpus (default: all usable "
        "CPUs), swapping halves each round; for CPU runs on noisy shared machines",
    )
    ab.add_argument(
        "--lockstep",
        action="store_true",
        help="with --ab: run both sides at once on the same CPUs, their training steps taking turns "
        "one at a time; for noisy shared machines (the sides never compete for a CPU)",
    )
    ab.add_argument(
        "--ab-metric",
        choices=["auto", "step_time_s", "step_cpu_s", "step_time_norm"],
        default="auto",
        help="with --ab: raw step time (auto with --concurrent or --lockstep), process CPU time per "
        "step, or step time over a same-process matmul reference (auto otherwise)",
    )
    ab.add_argument("--out", help="with --ab: directory for both sides' rows and the verdict rows")
    rg.set_defaults(func=cmd_regress)
