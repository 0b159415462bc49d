"""``zerobench simulate --validate RESULTS``: each measured run next to its prediction on a profile, the summary,
how closely the measured sweeps repeat, and what was not predicted; ``--fit`` first fits the profile's one factor."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from zerobench.config import ConfigError


def run_validate(args: argparse.Namespace, prof) -> int:
    """``simulate --validate RESULTS``: each measured run next to its prediction, the summary, and what was not
    predicted; ``--fit`` first fits the profile's one factor."""
    from zerobench.results.rows import read_rows
    from zerobench.sim.validate import check_profile_machine, fit_interference, not_predicted, summarize, validate

    try:
        rows = read_rows(args.validate)
        for note in check_profile_machine(prof, rows):
            print(f"note: {note}", file=sys.stderr)
        if args.fit:
            prof.interference = fit_interference(rows, prof)
            print(
                f"fitted on the non-ZeRO runs (stage 0, more than one process): interference {prof.interference:.2f}",
                file=sys.stderr,
            )
        recs = validate(rows, prof)
        if args.out:
            from zerobench.results.lock import claim
            from zerobench.results.outdir import check_fresh_run_dir
            from zerobench.sim.validate import write_rows

            with claim(args.out):
                check_fresh_run_dir(Path(args.out))
                write_rows(args.out, recs, prof, args.validate)
    except (KeyError, ValueError) as e:
        raise ConfigError(str(e.args[0])) from None
    summary, memory = summarize(recs), summarize(recs, "memory_ratio")
    if args.json:
        print(
            json.dumps(
                {
                    "profile": prof.device,
                    "interference": prof.interference,
                    "summary": summary,
                    "memory_summary": memory,
                    "sweeps_repeat": _repeatability(Path(args.validate))[1],
                    "runs": recs,
                },
                indent=1,
            )
        )
        return 0
    spans = "inside_interval" in summary
    span_head = f" {'interval ms':>17} {'in':>3}" if spans else ""
    print(f"{'run':<28} {'predicted ms':>12}{span_head} {'measured ms':>12} {'ratio':>6}  critical path (ms)")
    for r in recs:
        parts = ", ".join(f"{k} {v * 1e3:.1f}" for k, v in sorted(r["breakdown_s"].items(), key=lambda kv: -kv[1]))
        fit = "*" if r["in_fit"] and args.fit else " "
        mem = (
            (
                f"  memory {r['predicted_peak_bytes'] / 2**20:.0f} / {r['measured_peak_bytes'] / 2**20:.0f} MiB = "
                f"{r['memory_ratio']:.3f}"
            )
            if "memory_ratio" in r
            else ""
        )
        span = (
            (
                f" {r['predicted_low_s'] * 1e3:8.2f}-{r['predicted_high_s'] * 1e3:<8.2f} "
                f"{'yes' if r['inside'] else 'no':>3}"
            )
            if spans
            else ""
        )
        print(
            f"{r['run_id']:<27}{fit} {r['predicted_s'] * 1e3:12.2f}{span} {r['measured_s'] * 1e3:12.2f} "
            f"{r['ratio']:6.2f}  {parts}{mem}"
        )
    if summary["runs"]:
        print(
            f"\n{summary['runs']} runs: median |predicted/measured - 1| = {summary['median_abs_error']:.1%}, "
            f"worst {summary['worst_abs_error']:.1%} ({summary['worst_run']})"
        )
        if spans:
            print(
                f"{summary['inside_interval']} of {summary['runs']} measured steps inside the interval the "
                f"profile's spreads give"
            )
        if memory["runs"]:
            print(
                f"{memory['runs']} runs' peak memory (max_memory_allocated): median |predicted/measured - 1| = "
                f"{memory['median_abs_error']:.1%}, worst {memory['worst_abs_error']:.1%} ({memory['worst_run']})"
            )
        zero = summarize([r for r in recs if not r["in_fit"]])
        if args.fit and zero["runs"]:
            print(
                f"{zero['runs']} runs outside the fit (*): median {zero['median_abs_error']:.1%}, "
                f"worst {zero['worst_abs_error']:.1%} ({zero['worst_run']})"
            )
        print(_repeatability(Path(args.validate))[0])
    for rid, what in not_predicted(rows).items():
        print(f"not predicted: {rid} (the simulator does not describe {what})")
    return 0


def _sweeps(results: Path) -> list[Path]:
    """The sweeps under ``results``: every directory whose subdirectories hold run rows (``*/rows.jsonl``)."""
    if not results.is_dir():
        return []
    from zerobench.results.rows import files_below

    return sorted({rows.parent.parent for rows in files_below(results)} - {results, results.parent})


def _repeatability(results: Path) -> tuple[str, list[dict] | None]:
    """One line on how closely the measured sweeps repeat, and the figures: each sweep predicted by the median of
    the same runs in the others (``validate.sweep_repeatability``), which is what the runs' own variation costs a
    prediction judged against one of them; for a single sweep, how to find out."""
    from zerobench.sim.validate import sweep_repeatability

    sweeps = _sweeps(results)
    if len(sweeps) < 2:
        line = (
            "one sweep: how closely its runs repeat is unknown (sweep again into sibling directories and validate "
            "their parent, or compare them with `python -m zerobench.sim.attempts --floor SWEEP SWEEP...`)"
        )
        return line, None
    try:
        got = sweep_repeatability(sweeps)
    except ValueError as e:
        return f"how closely the sweeps repeat is unknown: {e}", None
    medians = [g["median_abs_error"] for g in got]
    worst = max(got, key=lambda g: g["worst_abs_error"])
    left = f"; {len(got[0]['dropped'])} runs missing from some sweep left out" if got[0]["dropped"] else ""
    line = (
        f"the {len(got)} sweeps, each predicted by the median of the others over {got[0]['runs']} runs: median "
        f"{min(medians):.1%}-{max(medians):.1%}, worst {worst['worst_abs_error']:.1%} ({worst['worst_run']}), "
        f"what the runs' own variation costs a prediction of one sweep (the table above is scored against each "
        f"run's median over all of them){left}"
    )
    return line, got
