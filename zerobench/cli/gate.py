"""``zerobench regress``: the stored-baseline gate and the interleaved A/B timing gate."""

from __future__ import annotations

import argparse
import datetime
import sys

from zerobench.cli.types import count, number, path
from zerobench.config import ConfigError

MIN_FALSE_ALARM = 1e-12
"""The smallest false-alarm rate the gate takes: the noise model's Student-t bound is at 1 - rate / comparisons,
which rounds to 1 in double precision well before 1e-16."""


def cmd_regress(args: argparse.Namespace) -> int:
    from zerobench.bench.regress import run_gate

    if not MIN_FALSE_ALARM <= args.false_alarm < 1:
        raise ConfigError(
            f"--false-alarm is a probability from {MIN_FALSE_ALARM:g} to below 1, got {args.false_alarm:g} (below "
            f"{MIN_FALSE_ALARM:g} no bound can be computed in double precision)"
        )
    if args.ab and args.history:
        raise ConfigError("choose one of --ab SUITE (an A/B timing) and --history DIR... (a history plot)")
    _check_mode_flags(args)
    if args.ab:
        return _cmd_ab(args)
    if args.out:  # before any check that creates it
        inputs = [("--history", d) for d in args.history or []] + [("--candidate", c) for c in args.candidate or []]
        _check_out_outside(args.out, [*inputs, ("--baseline", args.baseline)])
    if args.history:
        return _cmd_history(args)
    if not args.candidate:
        raise ConfigError(
            "give --candidate RESULTS (or --ab SUITE for an interleaved A/B comparison, or --history "
            "DIR... for a history)"
        )
    if args.write_baseline:
        return _cmd_write_baseline(args)
    if not args.baseline:
        raise ConfigError("give --baseline FILE (or --write-baseline FILE to record one)")
    if len(args.candidate) > 1:
        raise ConfigError(
            f"the gate compares one candidate, got {len(args.candidate)}: several --candidate results "
            f"go with --write-baseline (a noise model from unchanged runs)"
        )
    if args.out:  # one gate run's verdicts per directory: a second run's rows would make its verdict ambiguous
        from pathlib import Path

        from zerobench.results.outdir import check_fresh_run_dir

        check_fresh_run_dir(Path(args.out))
    return run_gate(
        args.baseline,
        args.candidate[0],
        args.timing_tolerance,
        args.propose,
        args.timing,
        strict=args.strict,
        false_alarm=args.false_alarm,
        out=args.out,
    )


GATE, AB, HISTORY = "the gate", "--ab", "--history"
MODE_FLAGS = {  # flag: the modes that read it (--false-alarm and --out are every mode's)
    **dict.fromkeys(("--candidate", "--write-baseline", "--propose", "--timing", "--strict"), (GATE,)),
    **{"--baseline": (GATE, HISTORY), "--timing-tolerance": (GATE, AB), "--metrics": (HISTORY,)},
    **dict.fromkeys(("--baseline-ref", "--baseline-tree", "--rounds", "--max-rounds", "--only"), (AB,)),
    **dict.fromkeys(
        ("--baseline-env", "--candidate-env", "--cpus", "--concurrent", "--lockstep", "--ab-metric"), (AB,)
    ),
}


def _check_mode_flags(args: argparse.Namespace) -> None:
    """Refuse, in one line, a flag the chosen mode does not read (before, e.g. ``--rounds`` or ``--concurrent``
    without ``--ab`` was dropped without a word and the stored-baseline gate ran as if it were not given)."""
    mode = AB if args.ab else HISTORY if args.history else GATE
    defaults = args.mode_defaults
    for flag, modes in MODE_FLAGS.items():
        dest = flag[2:].replace("-", "_")
        if mode not in modes and getattr(args, dest) not in (defaults[dest], []):
            add = " or ".join({AB: "--ab SUITE", HISTORY: "--history DIR..."}[m] for m in modes if m != GATE)
            raise ConfigError(
                f"{flag} is for {' and '.join(modes)}; {mode} does not read it: drop it"
                + (f" (or add {add})" if mode == GATE else "")
            )


def _check_out_outside(out: str, inputs: list[tuple[str, str | None]]) -> None:
    """Refuse, in one line, an ``--out`` at or inside an input directory (``(flag, path)``): every reader takes a
    directory's rows recursively, so the verdict or history rows written there would be read as that input's rows
    the next time it is given. (Inside a sweep's directory ``check_fresh_run_dir`` refuses it; a directory of
    several sweeps, as CI's ``pr/timed`` and ``pr/counted``, is no sweep's.)"""
    from pathlib import Path

    where = Path(out).resolve()
    for flag, given in inputs:
        src = Path(given).resolve() if given else None
        if src is not None and src.is_dir() and (where == src or src in where.parents):
            raise ConfigError(
                f"--out {out} is inside {flag} {given}: the rows written there would be read as that input's the next "
                "time it is given; give --out a directory outside it"
            )


def _cmd_write_baseline(args: argparse.Namespace) -> int:
    from zerobench.bench.baseline_file import check_baseline_path
    from zerobench.bench.gate_inputs import check_planned
    from zerobench.bench.regress import _rows, noise_rows, write_baseline

    check_baseline_path(args.write_baseline, "--write-baseline", "baseline")
    samples = [_rows(c) for c in args.candidate]
    check_planned(args.candidate[0], samples[0])
    n = write_baseline(samples[0], args.write_baseline, more=samples[1:], whole=True)
    print(f"baseline written: {args.write_baseline} ({n} rows)")
    if len(samples) > 1:
        rows, gaps = noise_rows(samples)
        moved = sum(r["value"] > 0 for r in rows)
        print(
            f"noise model from {len(samples)} unchanged runs: {len(rows)} metrics, {moved} of them moved "
            f"(the rest are compared exactly)"
        )
        for gap in gaps:
            print(f"  no noise model: {gap}")
        if len(samples) < 5:
            print(
                f"  {len(samples)} runs give wide tolerances at the gate's false-alarm rate, and a comparison whose "
                "noise allows over 100% is reported as too noisy, not judged: 5 or more unchanged runs for counts and "
                "instructions, about 10 for CPU time on a busy machine"
            )
    return 0


def _cmd_history(args: argparse.Namespace) -> int:
    from zerobench.report.history import run_history

    if not args.out:
        raise ConfigError("--history needs --out DIR (where the plots and the flagged commits go)")
    return run_history(
        args.history, args.out, baseline=args.baseline, metrics=args.metrics, false_alarm=args.false_alarm
    )


def _cmd_ab(args: argparse.Namespace) -> int:
    import contextlib
    from pathlib import Path

    from zerobench.bench.ab_sources import worktree
    from zerobench.launch.cancel import EXIT_CANCELLED, Cancelled, sigterm_raises
    from zerobench.results.outdir import check_fresh_run_dir

    if bool(args.baseline_ref) == bool(args.baseline_tree):
        raise ConfigError("--ab needs exactly one of --baseline-ref REF or --baseline-tree DIR")
    from zerobench.bench import suite as suites
    from zerobench.bench.runner import RESOLVED_KEYS, check_local, parse_only, selected

    suite = suites.load(args.ab)  # a bad suite is one line before a worktree is checked out and sides launched
    only = parse_only(args.only)
    twice = next((k for k, v in only.items() if len(v) > 1), None)
    if twice is not None:  # each side sweeps with its own code: a baseline from before alternatives keeps the last
        raise ConfigError(
            f"--ab --only {twice}: one value per key (the baseline side sweeps with its own zerobench, which may "
            f"take a repeated key as its last value only, so the sides would run different runs): run one A/B per value"
        )
    chosen = selected(suite, only)  # the sweep each side runs would refuse it only after the checkout
    check_local(chosen)
    defaulted = next(
        ((k, r) for k in only if k in RESOLVED_KEYS for r in chosen.runs if getattr(r.spec, k) is None), None
    )
    if defaulted:  # as with alternatives: a baseline from before resolved matching would leave these runs out
        key, run = defaulted
        raise ConfigError(
            f"--ab --only {key}: run {run.label!r} takes {key} from the default, which the baseline side's zerobench "
            f"may not match (it once matched only the values a suite spelled out), so the sides would run different "
            f"runs: give {key} in the suite, or select by label"
        )
    here = Path(__file__).resolve().parents[2]
    out = Path(args.out) if args.out else Path("runs") / ("ab-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    # before a baseline worktree is checked out: an earlier A/B's rounds there would be refused only at the first round
    check_fresh_run_dir(out, fix="give each A/B its own directory")
    tol = args.timing_tolerance
    ctx = worktree(args.baseline_ref, here) if args.baseline_ref else contextlib.nullcontext(args.baseline_tree)
    try:
        with sigterm_raises(), ctx as base:
            verdicts = _ab_rounds(args, base, here, out, tol)
    except Cancelled as e:  # the worktree is removed and both sides are stopped on the way out
        print(f"zerobench: error: A/B {e}; its rounds so far are under {out}", file=sys.stderr)
        return EXIT_CANCELLED
    return _print_verdicts(verdicts, tol, out, args.false_alarm)


def _ab_rounds(args: argparse.Namespace, base, here, out, tol: float) -> list[dict]:
    from zerobench.bench.ab import ABConfig, run_ab
    from zerobench.bench.ab_sources import parse_cpus

    cfg = ABConfig(
        suite=args.ab,
        baseline_tree=base,
        candidate_tree=str(here),
        rounds=args.rounds,
        max_rounds=args.max_rounds,
        false_alarm=args.false_alarm,
        only=tuple(args.only),
        tolerance=tol,
        baseline_env=tuple(args.baseline_env),
        candidate_env=tuple(args.candidate_env),
        metric=args.ab_metric,
        concurrent=args.concurrent,
        lockstep=args.lockstep,
        cpus=parse_cpus(args.cpus) if args.cpus else (),
    )
    return run_ab(cfg, out, say=lambda m: print(m, file=sys.stderr, flush=True))


def _print_verdicts(verdicts: list[dict], tol: float, out, false_alarm: float) -> int:
    from tabulate import tabulate

    def f(x) -> str:
        return "-" if x is None else f"{x:.3f}"

    print(
        tabulate(
            [
                [
                    v["run"],
                    f(v["median_ratio"]),
                    f"{f(v['lower'])}-{f(v['upper'])}",
                    f"{f(v['min'])}-{f(v['max'])}",
                    f"{v['pairs_above']}/{v['rounds'] // 2} (>= {v['critical']})",
                    v["rounds"],
                    v["verdict"],
                ]
                for v in verdicts
            ],
            headers=["run", "candidate / baseline (median)", "bounds", "range", "pairs above 1", "rounds", "verdict"],
        )
    )
    bad = [v for v in verdicts if v["verdict"] == "REGRESSION"]
    unjudged = [v for v in verdicts if v["verdict"] in ("missing", "NOT FINITE")]
    undecided = [v["run"] for v in verdicts if v["verdict"] == "undecided"]
    rate = max(v["false_alarm"] for v in verdicts)
    print(f"{len(bad)} regressions (tolerance {tol:.0%}; false-alarm rate {rate:.2g} per run); rows: {out / 'summary'}")
    if unjudged:
        print(
            "zerobench: error: not compared: "
            + ", ".join(f"{v['run']} ({v['verdict']})" for v in unjudged)
            + f": a side failed the run or measured no finite time in every AB/BA pair; see each side's logs under {out}",
            file=sys.stderr,
        )
    if undecided:
        print(
            f"zerobench: error: undecided: {', '.join(undecided)} lost rounds and kept too few AB/BA pairs for the "
            f"sign test at --false-alarm {false_alarm:g}; see each side's logs under {out}",
            file=sys.stderr,
        )
    return 1 if bad or undecided or unjudged else 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to the ``zerobench`` parser."""
    rg = sub.add_parser(
        "regress",
        help="the performance regression gate: candidate rows vs a baseline",
        description="Compare per (configuration, metric) with per-metric rules; exit 1 on a "
        "regression; flag improvements and write a proposed new baseline.",
    )
    rg.add_argument("--baseline", type=path, help="baseline rows, e.g. results/baselines/cpu-2core.jsonl")
    rg.add_argument(
        "--candidate",
        type=path,
        nargs="+",
        help="candidate results directory or rows file; with --write-baseline "
        "several: unchanged runs whose spread is the noise model",
    )
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
        help="also fail on what was not judged: a candidate run or gated metric the baseline lacks, a comparison "
        "too noisy to judge, a host-work metric without a noise model (default: listed, not failing)",
    )
    rg.add_argument("--propose", type=path, help="where to write the proposed baseline (default next to the candidate)")
    rg.add_argument(
        "--write-baseline",
        type=path,
        metavar="FILE",
        help="record the candidate as a baseline and exit; with several --candidate results, with their noise model",
    )
    rg.add_argument(
        "--false-alarm",
        type=number(above=0),
        default=0.001,
        help="the probability that unchanged code fails: for the gate's noise-modelled metrics "
        "together, and per run for --ab (default 0.001)",
    )
    rg.add_argument(
        "--out",
        type=path,
        help="the gate: also write its verdicts as rows here; --ab: both sides' rows and the "
        "verdict rows; --history: the plots and the flagged commits",
    )
    hi = rg.add_argument_group("history (gated metrics over commits, with the noise band and flagged commits)")
    hi.add_argument(
        "--history",
        type=path,
        nargs="+",
        metavar="DIR",
        help="results of the same suite at several commits (rows carry the commit and its parent)",
    )
    hi.add_argument(
        "--metrics",
        help="with --history: comma-separated metrics to plot (default: every gated metric of the step, not per phase)",
    )
    ab = rg.add_argument_group("interleaved A/B timing (sees 10 per cent slowdowns on noisy machines)")
    ab.add_argument(
        "--ab",
        type=path,
        metavar="SUITE",
        help="run SUITE's runs alternately with the baseline code and this "
        "checkout, fresh processes, ABBA rounds; a sign test on the round pairs",
    )
    ab.add_argument(
        "--baseline-ref",
        metavar="REF",
        help="with --ab: git ref of the baseline (checked out into a temporary worktree), e.g. origin/main or HEAD~1",
    )
    ab.add_argument(
        "--baseline-tree", type=path, metavar="DIR", help="with --ab: a source tree of the baseline instead"
    )
    ab.add_argument(
        "--rounds",
        type=count(1),
        default=28,
        help="with --ab: measured alternations, even (default 28: 14 AB/BA pairs, 13 of which must lie "
        "above 1 at --false-alarm 0.001; 20 is the fewest, needing all 10)",
    )
    ab.add_argument(
        "--max-rounds",
        type=count(0),
        default=0,
        help="with --ab: add AB/BA pairs while a median lies beyond the tolerance but not yet beyond "
        "chance, up to this many rounds (default: no extra rounds); the false-alarm rate holds",
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
    dests = [f[2:].replace("-", "_") for f in MODE_FLAGS]
    rg.set_defaults(func=cmd_regress, mode_defaults={d: rg.get_default(d) for d in dests})
