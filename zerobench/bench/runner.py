"""The sweep runner: every run of a suite on local processes, failures recorded as rows, resumable.

Each run gets its own directory ``OUT/<run id>/`` with the rows its ranks wrote (``rows.jsonl``), the
ranks' output (``run.log``) and one ``run_status`` row written here: ``ok``, or ``invalid`` / ``oom`` /
``failed`` / ``timeout`` / ``cancelled`` with the reason. A failing run never stops the sweep or touches
other runs' rows. ``resume`` skips runs (label and config hash) that already have an ``ok`` status row
under ``OUT`` and retries the others as new attempts (``bench.sweep_state``); without it ``OUT`` must hold
no rows, and with it only this suite's. ``OUT`` is the sweep's alone while it runs (``results/lock.py``): a
second sweep, train or maxsize into it is refused, naming this one's pid. SIGTERM/SIGINT (Slurm's time limit,
``scancel``) stop the current run's ranks, record it as ``cancelled`` and end the sweep; so does a full disk,
after recording what it can.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time
from pathlib import Path

from zerobench.bench.progress import Progress
from zerobench.bench.spec import RunSpec
from zerobench.bench.suite import Suite
from zerobench.bench.sweep_state import (
    SweepSummary,
    attempt_id,
    check_held,
    completed_runs,
    record_plan,
    should_run,
    status_row,
)
from zerobench.config import ConfigError
from zerobench.launch.base import EXIT_IO, LaunchRequest
from zerobench.launch.cancel import Cancellation
from zerobench.launch.launchers import get_launcher
from zerobench.launch.local import check_local_world
from zerobench.results.lock import check_unclaimed, claim
from zerobench.results.outdir import check_writable_dir
from zerobench.results.rows import RowWriteError, run_hash


def parse_only(items: list[str] | tuple[str, ...] | None) -> dict[str, frozenset[str]]:
    """``--only KEY=VALUE`` items as key -> the values it may take: a key given twice names alternatives
    (``--only stage=1 --only stage=2`` runs both stages), where a dict of single values kept the last one only."""
    only: dict[str, set[str]] = {}
    for item in items or ():
        key, eq, value = item.partition("=")
        if not eq or not key:
            raise ConfigError(f"--only takes KEY=VALUE, got {item!r}")
        only.setdefault(key, set()).add(value)
    return {k: frozenset(v) for k, v in only.items()}


def _describe(only: dict[str, frozenset[str]]) -> str:
    return " ".join(f"{k}={'|'.join(sorted(v))}" for k, v in only.items())


RESOLVED_KEYS = {
    "dp": lambda c: c.dp,
    "tp": lambda c: c.tp,
    "gpus": lambda c: c.world_size,
    **{k: (lambda c, k=k: getattr(c.model, k)) for k in ("layers", "hidden", "heads", "seq")},
    "vocab": lambda c: c.data_vocab if c.data_vocab is not None else c.model.vocab,  # before TP's padding
}
"""Run keys whose default (None) resolves to a value, and where in the resolved ``TrainConfig`` it is: ``--only``
matches a run that leaves one out by the value it runs at (``--only dp=1`` takes every run at dp 1, the default's
too), where it matched only the runs that spelled it out."""


def only_value(run, key: str) -> set[str]:
    """What ``--only KEY=...`` compares with for ``run``: its labels for ``label``; else the run's own value of the
    field, or where it leaves it to the default the value it resolves to (``RESOLVED_KEYS``; an invalid run has
    none, and keeps the field's)."""
    if key == "label":
        return {str(run.label), str(run.spec.label)}
    value = getattr(run.spec, key, None)
    if value is None and key in RESOLVED_KEYS and run.config is not None:
        value = RESOLVED_KEYS[key](run.config)
    return {str(value)}


def matching_runs(suite: Suite, only: dict[str, frozenset[str]]) -> list:
    """The runs of ``suite`` each of whose ``only`` keys (a run's fields, as ``--only`` names them) holds one of
    its values (``only_value``), or one line if none does, naming a key no run has."""
    fields = {f.name for f in dataclasses.fields(RunSpec)}
    runs = [r for r in suite.runs if all(only_value(r, k) & v for k, v in only.items())]
    if not runs:
        unknown = sorted(set(only) - fields)
        why = f": a run has no key {unknown[0]!r} (its keys are {', '.join(sorted(fields))})" if unknown else ""
        raise ConfigError(f"{suite.path}: no run matches {_describe(only)}{why}")
    return runs


def same_configurations(suite: Suite) -> list[list[str]]:
    """Labels of the suite's runs that resolve to one configuration (the same config hash), each group in suite
    order: the entries differ in a field resolution overrides (P_a implies activation checkpointing, the warm-up is
    clamped to the steps) or in none that reaches the run. Such a run measures another again, and the regression
    gate, which matches runs by configuration, refuses a baseline holding both."""
    groups: dict[str, list[str]] = {}
    for r in suite.runs:
        if r.config is not None:
            groups.setdefault(run_hash(r.config), []).append(r.label)
    return [labels for labels in groups.values() if len(labels) > 1]


def warn_same_configurations(suite: Suite) -> None:
    for labels in same_configurations(suite):
        print(
            f"zerobench: warning: {suite.path}: runs {', '.join(map(repr, labels))} resolve to one configuration: "
            "each measures the first again, and the regression gate refuses a baseline holding them; make them "
            "differ in a field that reaches the run, or drop all but one",
            file=sys.stderr,
        )


def selected(suite: Suite, only: dict[str, frozenset[str]] | None) -> Suite:
    """``suite`` with only the runs ``only`` selects (all of them without it); a key's one value may be a string."""
    if not only:
        return suite
    only = {k: frozenset([v]) if isinstance(v, str) else frozenset(v) for k, v in only.items()}
    return dataclasses.replace(suite, runs=matching_runs(suite, only))


def check_local(suite: Suite) -> None:
    """Refuse in one line a suite with a run past the local launcher's world (``check_local_world``), before any
    of its runs starts: ``sweep`` on the local launcher, ``regress --ab`` (each side sweeps locally)."""
    for r in suite.runs:
        if r.config is not None:
            check_local_world(
                r.config.world_size,
                f"{suite.path}: run {r.label!r}",
                f"submit it to a cluster (sbatch slurm/scale_400gpu.sh with SUITE={suite.path}), or plan it "
                f"(zerobench plan --dry-run --suite {suite.path}; zerobench simulate --profile v100-dgx2 --suite "
                f"{suite.path})",
            )


CALLGRIND_TIMEOUT_FACTOR = 10
"""A run whose rank 0 counts instructions under callgrind (``instructions``) gets this many times its timeout:
valgrind runs the process about 5-10 times slower uncounted (torch's import: ~25 s instead of ~3 s), and the
counted step 50-100 times slower."""
SWEEP_LAUNCHERS = ("local", "srun", "slurm")
"""local and srun run each run in turn (launch/launchers.py); slurm submits every run with sbatch."""


def check_sweep(
    suite: Suite,
    out: Path | None,
    launcher: str = "local",
    only: dict | None = None,
    instructions: bool = False,
    gpus_per_task: int | None = None,
    pending_limit_s: float | None = None,
) -> Suite:
    """The runs ``run_sweep`` would run (``selected``), or one line saying which option cannot be: the launcher and
    its options, ``--only``, the local launcher's world limit. ``sweep --check`` calls it with the sweep's options
    (then ``check_sweep_dirs``), so a check passes only where the sweep itself would start."""
    if launcher not in SWEEP_LAUNCHERS:
        raise ConfigError(f"unknown launcher {launcher!r}: choose {', '.join(SWEEP_LAUNCHERS)}")
    if instructions and launcher != "local":
        raise ConfigError("--instructions starts ranks under valgrind with the local launcher only: drop --launcher")
    suite = selected(suite, only)
    if launcher == "local":
        check_local(suite)
    if gpus_per_task is not None and gpus_per_task < 0:
        raise ConfigError(f"--gpus-per-task must be 0 or more, got {gpus_per_task}")
    if gpus_per_task is not None and launcher != "slurm":
        raise ConfigError(
            "--gpus-per-task is what each job of --launcher slurm requests; under srun a run uses the allocation's "
            "GPUs (sbatch --gpus-per-node), locally this host's"
        )
    if pending_limit_s is not None and (launcher != "slurm" or not pending_limit_s > 0):
        raise ConfigError(
            f"--pending-limit must be a positive number of seconds, got {pending_limit_s:g}"
            if launcher == "slurm"
            else "--pending-limit is how long a job of --launcher slurm may wait in Slurm's queue: add --launcher slurm"
        )
    # sbatch --output: a backslash turns off %j, and is dropped
    if out is not None and launcher == "slurm" and "\\" in str(out.resolve()):
        raise ConfigError(
            f"--out {out}: a backslash in the path turns off Slurm's log file patterns, and Slurm drops it (the job's "
            "log would go to another directory): choose an --out without one"
        )
    if launcher == "srun" and "SLURM_JOB_ID" not in os.environ:
        raise ConfigError(
            "--launcher srun runs inside a Slurm allocation (sbatch/salloc); use --launcher slurm to submit"
        )
    return suite


def check_sweep_dirs(
    suite: Suite, out: Path, resume: bool = False, tensorboard: str | None = None, instructions: bool = False
) -> None:
    """What a sweep of ``suite`` (``check_sweep``'s selected runs) checks of its directories before its first run,
    with nothing created and no lock taken: ``sweep --check`` runs it, so that a check passes only where the sweep
    would start. ``out`` and ``tensorboard`` can be written (``check_writable_dir``: a file is refused), no other
    zerobench is writing ``out`` (``claim``'s refusal), and what ``out`` holds may take this sweep (``check_held``:
    not inside another sweep, no rows without ``resume``, with it only this suite's, at this commit)."""
    check_writable_dir(out, create=False)
    if tensorboard:
        check_writable_dir(tensorboard, "--tensorboard", "TensorBoard scalars", create=False)
    check_unclaimed(out)
    check_held(out, suite, resume, instructions)


def run_sweep(
    suite: Suite,
    out: Path,
    resume: bool = False,
    progress: bool = True,
    tensorboard: str | None = None,
    launcher: str = "local",
    only: dict | None = None,
    instructions: bool = False,
    gpus_per_task: int | None = None,
    pending_limit_s: float | None = None,
) -> SweepSummary:
    """Run ``suite``'s runs (those matching ``only``: run key -> value) with ``launcher``:
    ``local`` processes, ``srun`` job steps inside an allocation, or one ``slurm`` job per run, each task of which
    requests ``gpus_per_task`` GPUs and is given up on (scancelled, a ``timeout`` row) when still pending after
    ``pending_limit_s``. ``instructions``: rank 0 of each run runs under callgrind and records its
    counted step's instructions (local launcher). ``only``: ``parse_only``'s key -> values."""
    suite = check_sweep(suite, out, launcher, only, instructions, gpus_per_task, pending_limit_s)
    with claim(out):  # the directory is this sweep's alone; what it holds is checked only now
        changed = check_held(out, suite, resume, instructions)
        record_plan(out, suite, resume)
        if changed:
            print(
                f"zerobench: note: {', '.join(map(repr, changed[:4]))}{' ...' if len(changed) > 4 else ''} measured "
                f"here under another definition: the changed runs are measured as new runs, and both stay in {out}",
                file=sys.stderr,
            )
        if launcher == "slurm":
            from zerobench.bench.slurm_sweep import run_sweep_sbatch

            if not gpus_per_task:
                print(
                    "zerobench: note: the jobs request no GPUs and run on CPU; on a GPU cluster pass --gpus-per-task 1",
                    file=sys.stderr,
                )
            return run_sweep_sbatch(
                suite,
                out,
                resume=resume,
                progress=progress,
                gpus_per_task=gpus_per_task or 0,
                pending_limit_s=pending_limit_s,
            )
        return _run_all(suite, out, resume, progress, tensorboard, launcher, instructions)


def _run_all(
    suite: Suite,
    out: Path,
    resume: bool,
    progress: bool,
    tensorboard: str | None,
    launcher: str,
    instructions: bool = False,
) -> SweepSummary:
    """Each run in turn on ``launcher`` (local or srun), until the last or a stop (cancel, disk full)."""
    done = completed_runs(out, instructions) if resume else None
    summary = SweepSummary()
    with Progress(len(suite.runs), enabled=progress) as bar, Cancellation() as cancel:
        try:
            for run in suite.runs:
                if cancel.requested:
                    summary.stopped = f"cancelled ({cancel.requested}) before {run.label!r}"
                    break
                if not should_run(run, out, suite, summary, bar, done):
                    continue
                _run_one(run, out, suite, summary, bar, cancel, tensorboard, launcher, instructions)
                if cancel.requested:
                    summary.stopped = f"cancelled ({cancel.requested}) during {run.label!r}"
                    break
        except RowWriteError as e:
            summary.stopped = f"results could not be written, the sweep stopped: {e}"
            print(f"zerobench: error: {summary.stopped}", file=sys.stderr)
    return summary


def _run_one(
    run,
    out: Path,
    suite: Suite,
    summary: SweepSummary,
    bar: Progress,
    cancel: Cancellation,
    tensorboard: str | None,
    launcher: str,
    instructions: bool = False,
) -> None:
    run_id = attempt_id(out, run)
    if tensorboard is not None:  # another sweep's run of this id wrote there: refused before anything starts
        from zerobench.train.hooks import refuse_held_events

        try:
            refuse_held_events(tensorboard, run_id)
        except ConfigError as e:
            summary.failed[run.label] = str(e)
            summary.failed_status[run.label] = "invalid"
            bar.advance(run.label, failed=True)
            status_row(out, run_id, suite, run, "invalid", str(e), 0.0)
            return
    run_dir = out / run_id
    run_dir.mkdir(parents=True, exist_ok=True)
    log = run_dir / "run.log"
    bar.start(run.label, log)
    t0 = time.monotonic()
    cfg = run.config if tensorboard is None else dataclasses.replace(run.config, tensorboard_dir=tensorboard)
    timeout = run.spec.timeout * (CALLGRIND_TIMEOUT_FACTOR if instructions else 1)
    req = LaunchRequest(
        cfg,
        run_dir,
        run_id,
        timeout,
        log,
        suite.name,
        index=run.index,
        on_poll=bar.poll,
        cancel=cancel,
        extra_env=run.spec.rank_env(),
        callgrind_ranks=(0,) if instructions else (),
    )
    res = get_launcher(launcher).launch(req)
    summary.ran.append(run.label)
    if not res.ok:
        summary.failed[run.label] = res.reason
        summary.failed_status[run.label] = res.status
    bar.advance(run.label, failed=not res.ok)
    tool = {"instrumented": "callgrind"} if instructions else {}  # as the run's own rows are tagged
    status_row(out, run_id, suite, run, res.status, res.reason, time.monotonic() - t0, **tool)
    if EXIT_IO in res.returncodes:  # the disk is full: the next runs would fail the same way
        raise RowWriteError(f"{run.label}: {res.reason}")
