"""What a sweep's results directory already holds, and where each run's next attempt goes.

A run is identified by its label within the suite (labels are made unique when the suite loads) and its
resolved config hash: ``--resume`` skips it only if an ``ok`` status row carries both. Every attempt of a
run writes its own directory and run id (``007-label``, then ``007-label-r2``, ...), so a retry never
merges its rows with an earlier attempt's, and nothing an earlier attempt wrote is lost.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from zerobench.bench.progress import Progress
from zerobench.bench.suite import ResolvedRun, Suite
from zerobench.config import ConfigError, to_dict
from zerobench.files import replace_file
from zerobench.results.outdir import SWEEP_PLAN_FILE, check_outside_run
from zerobench.results.provenance import code_version, describe_version, source_version
from zerobench.results.rows import RowWriter, files_below, read_rows, run_hash

PLAN_FILE = SWEEP_PLAN_FILE
"""The runs a sweep set out to measure (label and config hash), written when it starts, so that what an
interrupted sweep never ran is known: a baseline recorded from it would leave those configurations ungated."""


@dataclass
class SweepSummary:
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)
    failed_status: dict[str, str] = field(default_factory=dict)
    """Each failed run's status (``oom``, ``invalid``, ``failed``, ``timeout``, ...), by label."""
    stopped: str | None = None
    """Why the sweep ended before its last run (cancelled, disk full), or None."""


def check_out(out: Path, resume: bool, suite: str) -> None:
    """Without ``--resume`` a sweep starts in a directory holding no rows (else two sweeps' runs mix); with it,
    the rows there must be suite ``suite``'s (its definition may have changed: changed runs are new runs), else
    another suite's runs would read as this one's, and its completed runs must have been measured at this
    checkout's commit, else the directory would hold two commits' measurements as one sweep's (a report or the
    regression gate reading it would compare them as one). A sweep inside another sweep's directory is refused
    outright: every reader takes a directory's rows recursively, so its runs would read as the outer sweep's.
    Called with the directory locked."""
    outer = next((d for d in out.resolve().parents if (d / PLAN_FILE).is_file()), None)
    if outer is not None:
        raise ConfigError(
            f"--out {out} is inside the sweep {outer} (it holds {PLAN_FILE}): its runs would read as that sweep's in "
            "reports, results show and the regression gate; give this sweep a directory of its own outside it"
        )
    check_outside_run(out)
    if not out.exists():
        return
    if resume:
        rows = read_rows(out)
        others = {r.get("suite") for r in rows} - {suite}
        if others:
            other = min(others, key=str)
            whose = f"suite {other!r}" if other is not None else "a run of no suite (zerobench train)"
            raise ConfigError(
                f"--out {out} holds the rows of {whose}, not of suite {suite!r}: --resume continues "
                "the same suite; choose another --out for this one"
            )
        _check_commit(out, rows)
        return
    held = next(iter(files_below(out)), None)
    if held is not None:
        raise ConfigError(
            f"--out {out} already holds result rows ({held}): pass --resume to continue that sweep, "
            "or choose another --out"
        )


def _check_commit(out: Path, rows: list[dict]) -> None:
    """The completed runs must have been measured with this checkout's code: its commit and, with uncommitted
    changes, the same changes (``provenance.code_version``: the diff's hash), else the sweep would hold two code
    versions' measurements as one's."""
    mine = source_version()
    done = {
        code_version(r.get("provenance"))
        for r in rows
        if r.get("metric") == "run_status" and r.get("status") == "ok" and isinstance(r.get("provenance"), dict)
    }
    other = min(done - {mine, None}, default=None)
    if mine is not None and other is not None:
        raise ConfigError(
            f"--out {out} holds runs measured at commit {describe_version(other)} and this checkout is at "
            f"{describe_version(mine)}: resuming would mix two code versions' measurements in one sweep; resume "
            f"from a checkout of {describe_version(other)} (its commit, with the same uncommitted changes), or sweep into another --out"
        )


def check_held(out: Path, suite: Suite, resume: bool, instructions: bool = False) -> list[str]:
    """Everything a sweep of ``suite`` (its selected runs) checks of what ``out`` holds before writing there:
    ``check_out``, with ``resume`` also ``check_resumed`` and that the plan it joins is readable and this suite's
    (``_earlier_plan``). It only reads, so ``sweep --check`` runs it too. Returns ``check_resumed``'s changed
    labels (for a note)."""
    check_out(out, resume, suite.name)
    if not resume:
        return []
    changed = check_resumed(suite, completed_runs(out, instructions))
    if (out / PLAN_FILE).is_file():
        _earlier_plan(out / PLAN_FILE, suite.name)
    return changed


def completed_runs(out: Path, instructions: bool = False) -> set[tuple[str, str]]:
    """(label, config hash) of every run with an ``ok`` status row under ``out`` of the sweep's kind: run under
    callgrind (``instructions``; its rows are tagged ``instrumented``) or timed. A directory may hold both sweeps
    of a suite, and one kind's runs are not the other's measurements."""
    if not out.exists():
        return set()
    return {
        (r.get("label"), r["config_hash"])
        for r in read_rows(out)
        if r.get("metric") == "run_status" and r.get("status") == "ok" and bool(r.get("instrumented")) == instructions
    }


def check_resumed(suite: Suite, done: set[tuple[str, str]]) -> list[str]:
    """Before a resumed sweep runs anything: refuse a run whose configuration this directory already holds
    measured under another label (a label renamed: measured again, the sweep would hold two completed runs of
    one configuration, which the regression gate refuses as a baseline); return, for a note, the labels measured
    here under another definition than the suite's now (changed runs are new runs: both stay in the rows)."""
    current = {(run.label, run_hash(run.config)) for run in suite.runs if run.config is not None}
    by_hash: dict[str, str] = {}
    for label, h in sorted(done - current):  # measured under a label the suite no longer gives that configuration
        by_hash.setdefault(h, label)
    changed = []
    for run in suite.runs:
        if run.config is None:
            continue
        h = run_hash(run.config)
        if (run.label, h) in done:
            continue
        if h in by_hash:
            raise ConfigError(
                f"run {run.label!r} is the configuration this sweep measured as {by_hash[h]!r}: measured again under "
                f"a new label, the sweep would hold it twice; give it its label back, or sweep into another --out"
            )
        if any(label == run.label for label, _ in done):
            changed.append(run.label)
    return changed


def attempt_id(out: Path, run: ResolvedRun) -> str:
    """The run id (and directory name) of this run's next attempt: the first with no directory. A directory
    without rows is an attempt too: a job that an interrupted sweep left queued or running under Slurm (nothing
    cancels it) writes its rows there later, and must not write them into a retry's."""
    k = 1
    while True:
        rid = run.run_id if k == 1 else f"{run.run_id}-r{k}"
        if not (out / rid).exists():
            return rid
        k += 1


def should_run(
    run: ResolvedRun, out: Path, suite: Suite, summary: SweepSummary, bar: Progress, done: set[tuple[str, str]] | None
) -> bool:
    """False (recording why) for an invalid run, or a completed one when resuming (``done``)."""
    if run.config is None:
        if done is not None and any(label == run.label for label, _ in done):
            return False
        if done is None or not _recorded_invalid(out, run):  # resumed: its invalid row is there already
            status_row(out, attempt_id(out, run), suite, run, "invalid", run.error or "invalid configuration", 0.0)
        summary.failed[run.label] = run.error or "invalid"
        summary.failed_status[run.label] = "invalid"
        bar.advance(run.label, failed=True)
        return False
    if done is not None and (run.label, run_hash(run.config)) in done:
        summary.skipped.append(run.label)
        bar.advance(run.label, skipped=True)
        return False
    return True


def _recorded_invalid(out: Path, run: ResolvedRun) -> bool:
    """Whether ``out`` holds this invalid run's ``invalid`` status row, for the same definition: a resume would
    otherwise add one more attempt (``-r2``, ``-r3``, ...) of a run that never starts, on every resume."""
    h = run_hash({"invalid_spec": to_dict(run.spec)})
    return out.exists() and any(
        r.get("metric") == "run_status"
        and r.get("status") == "invalid"
        and (r.get("label"), r.get("config_hash")) == (run.label, h)
        for r in read_rows(out)
    )


def status_row(
    out: Path, run_id: str, suite: Suite, run: ResolvedRun, status: str, reason: str, elapsed: float, **extra
) -> None:
    """The attempt's one ``run_status`` row: ``ok``, or the failure and its reason."""
    cfg = run.config if run.config is not None else {"invalid_spec": to_dict(run.spec)}
    w = RowWriter(out / run_id, run_id, cfg, suite=suite.name)
    w.write(
        "run_status",
        1 if status == "ok" else 0,
        "bool",
        status=status,
        reason=reason or None,
        label=run.label,
        elapsed_s=round(elapsed, 3),
        **extra,
    )


def record_plan(out: Path, suite: Suite, resume: bool) -> None:
    """Write ``out/sweep-plan.json``: the suite's runs with a configuration (an invalid one has its status row at
    once); resumed, joined to the runs planned before (a resume with ``--only`` runs a part of them)."""
    planned = [
        {"label": r.label, "config_hash": run_hash(r.config), "run_id": r.run_id}
        for r in suite.runs
        if r.config is not None
    ]
    path = out / PLAN_FILE
    if resume and path.is_file():
        earlier = _earlier_plan(path, suite.name)
        seen = {(r["label"], r["config_hash"]) for r in planned}
        planned = [
            r for r in earlier if isinstance(r, dict) and (r.get("label"), r.get("config_hash")) not in seen
        ] + planned
    replace_file(path, json.dumps({"suite": suite.name, "runs": planned}, indent=1) + "\n")


def _earlier_plan(path: Path, suite: str) -> list:
    """The runs a resumed sweep's earlier plan lists; one line, before it is replaced, where the plan cannot be read
    (rewriting it would lose which runs the sweep set out to measure) or is another suite's."""
    try:
        plan = json.loads(path.read_text())
        runs, whose = plan["runs"], plan.get("suite")
        if not isinstance(runs, list):
            raise TypeError("runs is not a list")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(
            f"{path} is damaged ({type(e).__name__}): the runs this sweep set out to measure cannot be read; restore "
            "it, or sweep into another --out"
        ) from None
    if whose != suite:
        raise ConfigError(
            f"{path} is the plan of suite {whose!r}, not of suite {suite!r}: --resume continues the same suite; "
            "choose another --out for this one"
        )
    return runs
