"""``zerobench sweep SUITE --launcher slurm``: one sbatch job per run, tracked to its final state.

All runs are submitted at once (Slurm queues them); the sweep then polls ``squeue`` for the jobs still
queued or running and asks ``scontrol show job -o`` for the final state of each one that left the queue
(``sbatch --wait`` would report success for a job cancelled while pending). Every job's outcome becomes
a ``run_status`` row with the Slurm job id, state and exit code; rows the job's ranks wrote stay in the
run's directory. ``--resume`` resubmits only runs without an ``ok`` status.
"""

from __future__ import annotations

import time
from pathlib import Path

from zerobench.bench.progress import Progress
from zerobench.bench.suite import Suite
from zerobench.bench.sweep_state import SweepSummary, attempt_id, completed_runs, should_run, status_row
from zerobench.launch.slurm import FINAL, SlurmCommandFailed, job_state, query, status_of, submit


def run_sweep_sbatch(
    suite: Suite, out: Path, resume: bool = False, progress: bool = True, poll_s: float = 1.0, gpus_per_task: int = 0
) -> SweepSummary:
    out.mkdir(parents=True, exist_ok=True)
    done = completed_runs(out) if resume else None
    summary = SweepSummary()
    jobs: dict[str, tuple] = {}
    bar = Progress(len(suite.runs), enabled=progress)
    with bar:
        for run in suite.runs:
            if not should_run(run, out, suite, summary, bar, done):
                continue
            run_id = attempt_id(out, run)
            run_dir = (out / run_id).resolve()
            run_dir.mkdir(parents=True, exist_ok=True)
            try:
                job_id = submit(
                    run.config, run_dir, run_id, run.spec.timeout, suite.name, gpus_per_task, run.spec.rank_env()
                )
            except SlurmCommandFailed as e:  # sbatch refused this job: a row of its own, and the sweep goes on
                status_row(out, run_id, suite, run, "invalid", str(e), 0.0)
                summary.failed[run.label] = str(e)
                bar.advance(run.label, failed=True)
                continue
            jobs[job_id] = (run, run_id, time.monotonic())
        while jobs:
            listed = query(["squeue", "-h", "-t", "all", "-j", ",".join(jobs), "-o", "%i|%T"])
            active = {}
            for line in listed.splitlines():
                jid, _, state = line.partition("|")
                active[jid.strip()] = state.strip()
            for jid in list(jobs):
                state = active.get(jid)
                if state is not None and state not in FINAL:
                    continue
                final, exit_code = job_state(jid)
                if final not in FINAL:
                    continue
                run, run_id, t0 = jobs.pop(jid)
                status, reason = status_of(final, exit_code, out / run_id, jid)
                status_row(
                    out,
                    run_id,
                    suite,
                    run,
                    status,
                    reason,
                    time.monotonic() - t0,
                    slurm_job_id=jid,
                    slurm_state=final,
                    slurm_exit_code=exit_code,
                )
                summary.ran.append(run.label)
                if status != "ok":
                    summary.failed[run.label] = reason
                bar.advance(run.label, failed=status != "ok")
            if jobs:
                time.sleep(poll_s)
    return summary
