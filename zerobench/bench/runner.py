"""The sweep runner: every run of a suite on local processes, failures recorded as rows, resumable.

Each run gets its own directory ``OUT/<run id>/`` with the rows its ranks wrote (``rows.jsonl``), the
ranks' output (``run.log``) and one ``run_status`` row written here: ``ok``, or ``invalid`` / ``oom`` /
``failed`` / ``timeout`` with the reason. A failing run never stops the sweep or touches other runs'
rows. ``resume`` skips runs whose resolved-config hash already has an ``ok`` status row under ``OUT``.
"""

from __future__ import annotations

import dataclasses
import os
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

from zerobench.bench.suite import ResolvedRun, Suite
from zerobench.config import ConfigError, to_dict
from zerobench.results.rows import RowWriter, read_rows, run_hash
from zerobench.train.launch import launch_local

MAX_LOCAL_WORLD = 16
_STEP = re.compile(rb"step\s+(\d+)/(\d+)")


@dataclass
class SweepSummary:
    ran: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)


def completed_hashes(out: Path) -> set[str]:
    if not out.exists():
        return set()
    return {r["config_hash"] for r in read_rows(out) if r.get("metric") == "run_status" and r.get("status") == "ok"}


def check_local(suite: Suite) -> None:
    too_big = [r for r in suite.runs if r.config is not None and r.config.world_size > MAX_LOCAL_WORLD]
    if too_big:
        r = too_big[0]
        raise ConfigError(
            f"{suite.path}: run {r.label!r} needs {r.config.world_size} processes; the local launcher runs at most "
            f"{MAX_LOCAL_WORLD}: submit it to a cluster (slurm/) or plan it (zerobench plan --project {suite.name})"
        )


def should_run(run: ResolvedRun, out: Path, suite: Suite, summary: SweepSummary, bar: _Progress,
               done: set[str] | None) -> bool:
    """False (recording why) for an invalid run, or a completed one when resuming (``done`` hashes)."""
    if run.config is None:
        _status_row(out, suite, run, "invalid", run.error or "invalid configuration", 0.0)
        summary.failed[run.label] = run.error or "invalid"
        bar.advance(run.label, failed=True)
        return False
    if done is not None and run_hash(run.config) in done:
        summary.skipped.append(run.label)
        bar.advance(run.label, skipped=True)
        return False
    return True


def _status_row(out: Path, suite: Suite, run: ResolvedRun, status: str, reason: str, elapsed: float,
                **extra) -> None:
    cfg = run.config if run.config is not None else {"invalid_spec": to_dict(run.spec)}
    w = RowWriter(out / run.run_id, run.run_id, cfg, suite=suite.name)
    w.write("run_status", 1 if status == "ok" else 0, "bool", status=status, reason=reason or None,
            label=run.label, elapsed_s=round(elapsed, 3), **extra)


LAUNCHERS = ("local", "srun", "slurm")


def run_sweep(suite: Suite, out: Path, resume: bool = False, progress: bool = True,
              tensorboard: str | None = None, launcher: str = "local", only: dict | None = None) -> SweepSummary:
    """Run ``suite``'s runs (those matching ``only``: run key -> value) with ``launcher``:
    ``local`` processes, ``srun`` job steps inside an allocation, or one ``slurm`` job per run."""
    if launcher not in LAUNCHERS:
        raise ConfigError(f"unknown launcher {launcher!r}: choose {', '.join(LAUNCHERS)}")
    if only:
        runs = [r for r in suite.runs if all(str(getattr(r.spec, k, None)) == v for k, v in only.items())]
        if not runs:
            raise ConfigError(f"{suite.path}: no run matches {only}")
        suite = dataclasses.replace(suite, runs=runs)
    if launcher == "local":
        check_local(suite)
    if launcher == "srun" and "SLURM_JOB_ID" not in os.environ:
        raise ConfigError("--launcher srun runs inside a Slurm allocation (sbatch/salloc); use --launcher slurm to submit")
    if launcher == "slurm":
        from zerobench.bench.slurm_sweep import run_sweep_sbatch

        return run_sweep_sbatch(suite, out, resume=resume, progress=progress)
    out.mkdir(parents=True, exist_ok=True)
    done = completed_hashes(out) if resume else set()
    summary = SweepSummary()
    bar = _Progress(len(suite.runs), enabled=progress)
    with bar:
        for run in suite.runs:
            if not should_run(run, out, suite, summary, bar, done if resume else None):
                continue
            run_dir = out / run.run_id
            run_dir.mkdir(parents=True, exist_ok=True)
            log = run_dir / "run.log"
            env = {"ZEROBENCH_FAULT": run.spec.fault} if run.spec.fault else {}
            bar.start(run.label, log)
            t0 = time.monotonic()
            cfg = run.config if tensorboard is None else dataclasses.replace(run.config, tensorboard_dir=tensorboard)
            if launcher == "srun":
                from zerobench.launch.slurm import launch_srun

                res = launch_srun(cfg, run_dir, run.run_id, run.spec.timeout, log, suite.name, 29500 + run.index,
                                  fault=run.spec.fault)
            else:
                res = launch_local(cfg, run_dir, run.run_id, timeout_s=run.spec.timeout, extra_env=env,
                                   log_path=log, suite=suite.name, on_poll=bar.poll)
            _status_row(out, suite, run, res.status, res.reason, time.monotonic() - t0)
            summary.ran.append(run.label)
            if not res.ok:
                summary.failed[run.label] = res.reason
            bar.advance(run.label, failed=not res.ok)
    return summary


class _Progress:
    """A rich progress bar: runs done / failed / remaining, and the current run's step."""

    def __init__(self, total: int, enabled: bool):
        self.total, self.enabled = total, enabled
        self.done = self.failed = self.skipped = 0
        self.log: Path | None = None
        self.label = ""
        self._progress = None

    def __enter__(self):
        if self.enabled:
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
            )

            self._progress = Progress(TextColumn("[bold]{task.description}"), BarColumn(), MofNCompleteColumn(),
                                      TextColumn("{task.fields[status]}"), TimeElapsedColumn(), transient=False)
            self._progress.__enter__()
            self._task = self._progress.add_task("sweep", total=self.total, status="")
        return self

    def __exit__(self, *exc):
        if self._progress is not None:
            self._progress.__exit__(*exc)

    def _update(self, step: str = "") -> None:
        if self._progress is None:
            return
        remaining = self.total - self.done - self.failed - self.skipped
        status = (f"ok {self.done}  failed {self.failed}  skipped {self.skipped}  remaining {remaining}"
                  + (f"  | {self.label} {step}" if self.label else ""))
        self._progress.update(self._task, completed=self.done + self.failed + self.skipped, status=status)

    def start(self, label: str, log: Path) -> None:
        self.label, self.log = label, log
        self._update("starting")

    def poll(self) -> None:
        if self.log is None or self._progress is None or not self.log.exists():
            return
        steps = _STEP.findall(self.log.read_bytes()[-4096:])
        if steps:
            self._update(f"step {int(steps[-1][0])}/{int(steps[-1][1])}")

    def advance(self, label: str, failed: bool = False, skipped: bool = False) -> None:
        if skipped:
            self.skipped += 1
        elif failed:
            self.failed += 1
        else:
            self.done += 1
        self.label, self.log = "", None
        self._update()
