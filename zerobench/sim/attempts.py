"""Independent attempts at the simulator's quick path, summarised from their rows (issue 62's bar).

An attempt is what a user runs on a machine, once: a fresh profile, the suite's sweep, the validation
(``scripts/sim_attempts.sh N OUTDIR`` runs N of them). A directory of attempts holds ``attempt-K/profile`` and
``attempt-K/runs`` (rows), each attempt validated alone, with the one factor fitted on its own non-ZeRO runs, as
``zerobench simulate --profile P --validate R --fit`` does. ``python -m zerobench.sim.attempts OUTDIR`` prints
each attempt's median and worst |predicted ÷ measured − 1|, how many measured steps fall inside the intervals
the profile's spreads give, and how many attempts meet the bar (median ≤ 10 % and worst ≤ 25 %), beside the
runs' own reproducibility: each attempt's runs predicted by the median of the same runs in the other attempts
(``reproducibility``; ``--floor SWEEP...`` prints it for any sweeps of one suite, e.g. one session's rounds).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

BAR = {"median": 0.10, "worst": 0.25}
"""The CPU simulator's bar on one attempt: median and worst |predicted ÷ measured − 1| over the suite's runs."""


def attempt_dirs(root: str | Path) -> list[Path]:
    """The attempts under ``root`` (``attempt-K``, each with ``profile`` and ``runs``), in order of K."""
    found = [p for p in Path(root).glob("attempt-*") if (p / "profile").is_dir() and (p / "runs").is_dir()]
    return sorted(found, key=lambda p: int(p.name.rsplit("-", 1)[1]))


def summarize_attempt(path: str | Path) -> dict:
    """One attempt validated from its rows: the fitted factor, the runs, median and worst error, the worst run,
    the measured steps inside their intervals (None where the profile carries no spreads) and whether the bar
    holds."""
    from zerobench.results.rows import read_rows
    from zerobench.sim.profile import Profile
    from zerobench.sim.validate import fit_interference, summarize, validate

    path = Path(path)
    rows = read_rows(path / "runs")
    prof = Profile.from_rows(read_rows(path / "profile"))
    prof.interference = fit_interference(rows, prof)
    s = summarize(validate(rows, prof))
    meets = s["runs"] > 0 and s["median_abs_error"] <= BAR["median"] and s["worst_abs_error"] <= BAR["worst"]
    return {
        "attempt": path.name,
        "interference": prof.interference,
        "runs": s["runs"],
        "median_abs_error": s["median_abs_error"],
        "worst_abs_error": s["worst_abs_error"],
        "worst_run": s.get("worst_run"),
        "inside_interval": s.get("inside_interval"),
        "meets_bar": meets,
    }


def reproducibility(sweeps: list[str | Path]) -> list[dict]:
    """``validate.sweep_repeatability`` of these sweeps, each with whether its runs, predicted by the median of the
    same runs in the other sweeps, meet ``BAR``: what issue 62's bar for one sweep asks, asked of the runs."""
    from zerobench.sim.validate import sweep_repeatability

    got = sweep_repeatability(sweeps)
    for g in got:
        g["meets_bar"] = g["median_abs_error"] <= BAR["median"] and g["worst_abs_error"] <= BAR["worst"]
    return got


def trim(path: str | Path) -> int:
    """Keep of each run's rows only what the validation reads (``step_time_s`` and ``run_status``) and drop the
    runs' logs, as the committed recordings under ``results/reference`` do; returns the files rewritten."""
    import json

    from zerobench.files import replace_file

    n = 0
    for rows in Path(path).glob("attempt-*/runs/**/rows.jsonl"):
        kept = [
            line
            for line in rows.read_text().splitlines()
            if json.loads(line).get("metric") in ("step_time_s", "run_status")
        ]
        replace_file(rows, "".join(line + "\n" for line in kept))
        n += 1
    for log in Path(path).glob("attempt-*/runs/**/run.log"):
        log.unlink()
    return n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m zerobench.sim.attempts", description=__doc__.split("\n\n")[0])
    ap.add_argument("root", nargs="+", help="a directory of attempt-K/{profile,runs} (with --floor: the sweeps)")
    ap.add_argument("--trim", action="store_true", help="first keep only the rows the validation reads (to commit)")
    ap.add_argument(
        "--floor",
        action="store_true",
        help="instead: each sweep given against the median of the same runs in the others (needs 2 or more)",
    )
    args = ap.parse_args(argv)
    if args.floor:
        if args.trim:
            ap.error("--trim rewrites a directory of attempts: give it without --floor")
        return print_floor(args.root)
    if len(args.root) != 1:
        ap.error("give one directory of attempts (several directories are for --floor)")
    args.root = args.root[0]
    dirs = attempt_dirs(args.root)
    if not dirs:
        print(
            f"zerobench: error: {args.root}: no attempt-K/profile and attempt-K/runs: run scripts/sim_attempts.sh",
            file=sys.stderr,
        )
        return 2
    if args.trim:
        trim(args.root)
    got = [summarize_attempt(d) for d in dirs]
    try:
        floor = reproducibility([d / "runs" for d in dirs]) if len(dirs) >= 2 else [None] * len(dirs)
    except ValueError as e:  # the attempts share no run: the table above still stands, without the comparison
        print(f"zerobench: note: the attempts' runs cannot be compared with each other: {e}", file=sys.stderr)
        floor = [None] * len(dirs)
    print(
        f"{'attempt':<12} {'runs':>4} {'median':>7} {'worst':>7}  {'inside':>6}  {'factor':>6}  bar  "
        f"{'runs vs the other attempts':>26}  worst run"
    )
    for a, f in zip(got, floor):
        inside = f"{a['inside_interval']}/{a['runs']}" if a["inside_interval"] is not None else "-"
        oracle = f"{f['median_abs_error']:.1%} / {f['worst_abs_error']:.1%}" if f else "-"
        print(
            f"{a['attempt']:<12} {a['runs']:>4} {a['median_abs_error']:>7.1%} {a['worst_abs_error']:>7.1%}  "
            f"{inside:>6}  {a['interference']:>6.2f}  {'yes' if a['meets_bar'] else 'no ':<3}  {oracle:>26}  "
            f"{a['worst_run']}"
        )
    print(
        f"\n{sum(a['meets_bar'] for a in got)} of {len(got)} attempts meet median <= {BAR['median']:.0%} and "
        f"worst <= {BAR['worst']:.0%}"
    )
    if floor[0] is not None:
        print(
            f"{sum(f['meets_bar'] for f in floor)} of {len(floor)} would, predicted by the median of the same runs "
            f"in the other attempts (the runs' own reproducibility)"
        )
        _say_dropped(floor[0]["dropped"])
    return 0


def _say_dropped(dropped: list[str]) -> None:
    if dropped:
        print(f"zerobench: note: runs missing from some sweep, left out: {', '.join(dropped)}", file=sys.stderr)


def print_floor(sweeps: list[str]) -> int:
    """``--floor``: the runs' reproducibility over several sweeps of one suite, one line per sweep."""
    try:
        got = reproducibility(sweeps)
    except ValueError as e:
        print(f"zerobench: error: {e}", file=sys.stderr)
        return 2
    print(f"{'runs':>4} {'median':>7} {'worst':>7}  bar  {'worst run':<24} sweep")
    for f in got:
        print(
            f"{f['runs']:>4} {f['median_abs_error']:>7.1%} {f['worst_abs_error']:>7.1%}  "
            f"{'yes' if f['meets_bar'] else 'no ':<3}  {f['worst_run']:<24} {f['sweep']}"
        )
    print(
        f"\n{sum(f['meets_bar'] for f in got)} of {len(got)} sweeps are predicted within median <= "
        f"{BAR['median']:.0%} and worst <= {BAR['worst']:.0%} by the median of the others"
    )
    _say_dropped(got[0]["dropped"])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
