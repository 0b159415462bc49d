"""``zerobench sweep SUITE --launcher slurm``: one sbatch job per run, tracked to its final state.

All runs are submitted at once (Slurm queues them); the sweep then polls ``squeue`` for the jobs still
queued or running and asks ``scontrol show job -o`` for the final state of each one that left the queue
(``sbatch --wait`` would report success for a job cancelled while pending). Every job's outcome becomes
a ``run_status`` row with the Slurm job id, state and exit code; rows the job's ranks wrote stay in the
run's directory. ``--resume`` resubmits only runs without an ``ok`` status.

The jobs are the sweep's: SIGINT or SIGTERM to the sweep scancels every job it still tracks and records each
as ``cancelled`` (a job left queued would run unobserved, and ``--resume`` would submit its run a second time).
A job still pending after ``pending_limit_s`` (Slurm's reason for the wait is in the row) is scancelled and
recorded as ``timeout``; without a limit a job waits as long as Slurm keeps it queued, as sbatch's own jobs do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from zerobench.bench.progress import Progress
from zerobench.bench.suite import Suite
from zerobench.bench.sweep_state import SweepSummary, attempt_id, completed_runs, should_run, status_row
from zerobench.launch.cancel import Cancellation
from zerobench.launch.slurm import FINAL, SlurmCommandFailed, job_state, query, scancel, status_of, submit

STOP_WAIT_S = 30.0
"""How long a scancelled job is given to reach a final state before it is recorded as it then stands."""


@dataclass
class _Job:
    run: object
    run_id: str
    t0: float
    pending_since: float | None = None


def run_sweep_sbatch(
    suite: Suite,
    out: Path,
    resume: bool = False,
    progress: bool = True,
    poll_s: float = 1.0,
    gpus_per_task: int = 0,
    pending_limit_s: float | None = None,
) -> SweepSummary:
    out.mkdir(parents=True, exist_ok=True)
    done = completed_runs(out) if resume else None
    summary = SweepSummary()
    jobs: dict[str, _Job] = {}
    with Progress(len(suite.runs), enabled=progress) as bar, Cancellation() as cancel:
        for run in suite.runs:
            if cancel.requested:
                break
            if not should_run(run, out, suite, summary, bar, done):
                continue
            _submit(run, out, suite, summary, bar, jobs, gpus_per_task)
        while jobs and not cancel.requested:
            _poll(jobs, out, suite, summary, bar, pending_limit_s)
            if jobs:
                time.sleep(poll_s)
        if cancel.requested:
            summary.stopped = f"cancelled ({cancel.requested}): {len(jobs)} job(s) scancelled"
            why = f"cancelled ({cancel.requested}): job scancelled"
            _end(jobs, list(jobs), out, suite, summary, bar, "cancelled", why)
    return summary


def _submit(run, out: Path, suite: Suite, summary: SweepSummary, bar: Progress, jobs: dict, gpus_per_task: int) -> None:
    run_id = attempt_id(out, run)
    run_dir = (out / run_id).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    try:
        job_id = submit(run.config, run_dir, run_id, run.spec.timeout, suite.name, gpus_per_task, run.spec.rank_env())
    except SlurmCommandFailed as e:  # sbatch refused this job: a row of its own, and the sweep goes on
        status_row(out, run_id, suite, run, "invalid", str(e), 0.0)
        summary.failed[run.label] = str(e)
        summary.failed_status[run.label] = "invalid"
        bar.advance(run.label, failed=True)
        return
    jobs[job_id] = _Job(run, run_id, time.monotonic())


def _poll(jobs: dict, out: Path, suite: Suite, summary: SweepSummary, bar: Progress, pending_limit_s) -> None:
    """One look at the queue: record the jobs that ended, and scancel those pending past the limit."""
    listed = query(["squeue", "-h", "-t", "all", "-j", ",".join(jobs), "-o", "%i|%T|%r"])
    active = {}
    for line in listed.splitlines():
        jid, state, reason = ([*line.split("|", 2), "", ""])[:3]
        active[jid.strip()] = (state.strip(), reason.strip())
    now = time.monotonic()
    for jid in list(jobs):
        state, reason = active.get(jid, (None, ""))
        job = jobs[jid]
        if state == "PENDING":
            job.pending_since = job.pending_since or now
            if pending_limit_s is not None and now - job.pending_since > pending_limit_s:
                why = f"still pending after {pending_limit_s:g}s (Slurm reason: {reason or 'none given'}): scancelled"
                _end(
                    jobs, [jid], out, suite, summary, bar, "timeout", f"{why}; raise --pending-limit or free the nodes"
                )
            continue
        job.pending_since = None  # a requeued job waits its limit again
        if state is not None and state not in FINAL:
            continue
        final, exit_code = job_state(jid)
        if final not in FINAL:
            continue
        status, why = status_of(final, exit_code, out / job.run_id, jid)
        _record(jobs.pop(jid), jid, out, suite, summary, bar, status, why, final, exit_code)


def _end(jobs: dict, jids: list[str], out: Path, suite, summary: SweepSummary, bar: Progress, status: str, why: str):
    """Stop jobs the sweep gives up on: scancel every one first, then record each as ``status`` once Slurm reports it
    ended, all waited for together (up to ``STOP_WAIT_S`` in all). A job that ended on its own before the request
    reached it is recorded as it ended."""
    said = dict.fromkeys(jids, why)
    for jid in jids:
        try:
            scancel(jid)
        except SlurmCommandFailed as e:
            said[jid] = f"{why}, but scancel failed ({e}): check squeue for job {jid}"
    deadline = time.monotonic() + STOP_WAIT_S
    waiting = list(jids)
    while waiting:
        for jid in list(waiting):
            final, exit_code = job_state(jid)
            if final not in FINAL and time.monotonic() < deadline:
                continue
            waiting.remove(jid)
            kind, reason = status, said[jid]
            if final in FINAL and final not in ("CANCELLED", "UNKNOWN"):
                kind, reason = status_of(final, exit_code, out / jobs[jid].run_id, jid)
            _record(jobs.pop(jid), jid, out, suite, summary, bar, kind, reason, final, exit_code)
        if waiting:
            time.sleep(0.5)


def _record(job: _Job, jid, out, suite, summary: SweepSummary, bar: Progress, status, why, final, exit_code) -> None:
    status_row(
        out,
        job.run_id,
        suite,
        job.run,
        status,
        why,
        time.monotonic() - job.t0,
        slurm_job_id=jid,
        slurm_state=final,
        slurm_exit_code=exit_code,
    )
    summary.ran.append(job.run.label)
    if status != "ok":
        summary.failed[job.run.label] = why
        summary.failed_status[job.run.label] = status
    bar.advance(job.run.label, failed=status != "ok")
