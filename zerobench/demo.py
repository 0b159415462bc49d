"""The embedded default job: the quick CPU suite (tiny GPT, ZeRO stages 0-3 x DP 1/2/4), its summary, and
the HTML report (whose path is the last line printed).

Runs ``suites/cpu/quick.yaml`` on local processes, then prints one line per run from the rows it wrote,
and the stages side by side at the largest DP degree: memory per rank (measured vs the paper's formula),
communication per step, step time and final loss.
"""

from __future__ import annotations

import datetime
import json
import signal
import sys
from pathlib import Path

from zerobench.bench import suite as suites
from zerobench.bench.runner import run_sweep
from zerobench.config import ConfigError
from zerobench.launch.cancel import EXIT_CANCELLED
from zerobench.results.outdir import SWEEP_PLAN_FILE, check_writable_dir
from zerobench.results.rows import files_below
from zerobench.results.show import show

SUITE = "cpu/quick"


def run_demo(out: Path | None) -> int:
    out = out or Path("runs") / ("demo-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    check_writable_dir(out)
    s = suites.load(SUITE)
    if out.is_dir() and files_below(out):
        mine = _plan_suite(out) == s.name  # an earlier demo's sweep (or one of its suite): it can be continued
        raise ConfigError(
            f"--out {out} already holds result rows: the demo sweeps into a directory of its own; "
            + (f"continue that sweep with zerobench sweep {SUITE} --out {out} --resume, or " if mine else "")
            + "choose another --out"
        )
    print(f"zerobench demo: {s.description}\n{len(s.runs)} runs -> {out}")
    summary = run_sweep(s, out)
    if summary.stopped:  # a half sweep's table and report would read as the demo's result
        cancelled = summary.stopped.startswith("cancelled")  # the sweep said why it stopped otherwise (a full disk)
        print(
            f"zerobench: {'error: demo stopped: ' + summary.stopped + '; ' if cancelled else 'note: '}its rows so far "
            f"are under {out}: finish it with zerobench sweep {SUITE} --out {out} --resume",
            file=sys.stderr,
        )
        return _stopped_exit(summary.stopped)
    print(show(out))
    print_stage_table(out)
    if summary.failed:
        print("failed runs: " + "; ".join(f"{k}: {v}" for k, v in summary.failed.items()))
        return 1
    from zerobench.report.render import render

    html = render([str(out)], str(out / "report"))
    print(f"\nrows: {out}/*/rows.jsonl")
    print(f"report: {html.resolve()}")
    return 0


def _plan_suite(out: Path) -> str | None:
    """The suite whose sweep ``out`` holds (its ``sweep-plan.json``), or None."""
    try:
        return json.loads((out / SWEEP_PLAN_FILE).read_text()).get("suite")
    except (OSError, ValueError, AttributeError):
        return None


def _stopped_exit(why: str) -> int:
    """128 + the signal that stopped the sweep (what a shell or Slurm reports for it), 1 for a full disk."""
    if why.startswith("cancelled (SIGINT)"):
        return 128 + signal.SIGINT
    return EXIT_CANCELLED if why.startswith("cancelled") else 1


def print_stage_table(out: Path) -> None:
    from zerobench.results import load
    from zerobench.results.status import counted_rows, with_run_key

    every = with_run_key(load(out))
    df = counted_rows(every)  # a failed or incomplete run has no figures to print
    if "config.dp" not in every or every["config.dp"].isna().all():
        print("\nno run of the suite wrote rows: no stages to compare")
        return
    dp = every["config.dp"].max()
    sel = df[(df["config.dp"] == dp) & ((df["rank"].isna()) | (df["rank"] == 0))]
    print(f"\nZeRO stages side by side at DP={dp} (rank 0; bytes measured from the engine's tensors):")
    print(
        f"  {'stage':>5} {'model states':>14} {'paper formula':>14} {'comm/step (elem)':>17} {'step time':>10} {'final loss':>10}"
    )
    for stage in sorted(
        set(every[every["config.dp"] == dp]["config.zero.stage"].dropna()) - set(sel["config.zero.stage"])
    ):
        print(f"  {int(stage):>5}  did not complete (its status is above)")
    for stage, g in sorted(sel.groupby("config.zero.stage")):
        v = {m: g[g["metric"] == m]["value"].iloc[-1] for m in g["metric"].unique()}
        losses = g[g["metric"] == "loss"].sort_values("step")["value"]
        print(
            f"  {stage:>5} {v.get('model_state_bytes', 0) / 2**20:11.3f} MiB {v.get('model_state_bytes_analytic', 0) / 2**20:11.3f} MiB "
            f"{v.get('comm_volume_elements_per_step', 0):17.0f} {v.get('step_time_s', 0) * 1e3:8.1f}ms {losses.iloc[-1]:10.4f}"
        )
