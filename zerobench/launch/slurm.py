"""Slurm launchers for sweeps.

- ``srun`` (inside an allocation, e.g. ``slurm/scale_400gpu.sh``): each run is one job step of
  ``world_size`` tasks; every task is one rank and reads its place from Slurm's variables.
- ``sbatch`` (from a login node, ``zerobench sweep SUITE --launcher slurm``): each run is one job. The job
  script is the fixed, readable ``slurm/run_one.sh``; what to run is a JSON spec file passed as its
  argument, so no shell command is ever built from user strings. Jobs are tracked with ``squeue`` and
  ``scontrol show job -o`` (``sacct`` is not needed); a job's final Slurm state and exit code become the
  run's status row.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import subprocess
import time
from pathlib import Path

from zerobench.config import ConfigError, to_dict
from zerobench.launch import channel
from zerobench.launch.base import EXIT_CONFIG, EXIT_OOM, LaunchResult, describe_exit, first_failure_of
from zerobench.launch.cancel import Cancellation
from zerobench.launch.channel import read_rank_files
from zerobench.train.config import TrainConfig

REPO = Path(__file__).resolve().parents[2]
RUN_ONE = REPO / "slurm" / "run_one.sh"


class SlurmCommandFailed(ConfigError):
    """A Slurm command ran and failed (sbatch refused a job, slurmctld did not answer): one line, Slurm's own."""


def _run(cmd: list[str], timeout: float = 60) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise ConfigError(
            f"{cmd[0]} not found: is this a Slurm login node? (or start one: slurm/local/start.sh)"
        ) from None
    except subprocess.TimeoutExpired:
        raise SlurmCommandFailed(f"{' '.join(cmd[:2])} did not answer within {timeout:.0f}s") from None
    if r.returncode != 0:
        said = (r.stderr or r.stdout).strip().splitlines()
        raise SlurmCommandFailed(f"{' '.join(cmd[:2])} failed: {said[-1] if said else f'exit code {r.returncode}'}")
    return r.stdout


def query(cmd: list[str], tries: int = 5, wait_s: float = 2.0) -> str:
    """``_run`` for a read-only query, retried with a growing wait: a busy or restarting slurmctld answers a moment
    later, and one failed poll must not end a sweep whose jobs are still running."""
    for attempt in range(tries):
        try:
            return _run(cmd)
        except SlurmCommandFailed:
            if attempt == tries - 1:
                raise
            time.sleep(wait_s * (attempt + 1))
    raise AssertionError("unreachable")


def master_address() -> str:
    """Address of the allocation's first node: its NodeAddr (falls back to the host name)."""
    if "MASTER_ADDR" in os.environ:
        return os.environ["MASTER_ADDR"]
    first = _run(["scontrol", "show", "hostnames", os.environ["SLURM_JOB_NODELIST"]]).split()[0]
    for field in _run(["scontrol", "show", "node", first, "-o"]).split():
        if field.startswith("NodeAddr="):
            return field.split("=", 1)[1]
    return first


def write_spec(
    path: Path, cfg: TrainConfig, run_id: str, out_dir: Path, suite: str | None, env: dict[str, str] | None = None
) -> Path:
    """The run as data for ``launch/task.py``: config, ids and extra environment for the ranks (JSON, so
    no user string ever reaches a shell)."""
    spec = {"config": to_dict(cfg), "run_id": run_id, "out": str(out_dir), "suite": suite, "env": env or {}}
    path.write_text(json.dumps(spec, indent=1))
    return path


def launch_srun(
    cfg: TrainConfig,
    out_dir: Path,
    run_id: str,
    timeout_s: float,
    log_path: Path,
    suite: str | None,
    index: int = 0,
    env: dict[str, str] | None = None,
    cancel: Cancellation | None = None,
    on_poll=None,
) -> LaunchResult:
    """One job step of ``cfg.world_size`` tasks inside the current allocation, laid out as torchrun's nnodes x
    nproc-per-node would be (``step_layout``), each task with the allocation's CPUs per task. Stopped (SIGTERM to
    srun, which passes it to the tasks) on ``cancel`` or past ``timeout_s``. How it failed is read from the ranks'
    report files (``channel.RankFile``): the first rank to fail is blamed, with its own exit code and line, since
    srun's exit code is the survivors' SIGTERM whatever the failing task returned."""
    total = int(os.environ.get("SLURM_NTASKS", "0"))
    if cfg.world_size > total:
        return LaunchResult(False, f"needs {cfg.world_size} tasks, the allocation has {total}", "invalid", [], 0.0)
    spec = write_spec(out_dir / "run.json", cfg, run_id, out_dir, suite, env)
    reports = out_dir / "ranks"
    reports.mkdir(parents=True, exist_ok=True)
    for stale in reports.glob("rank*"):
        stale.unlink()
    port = os.environ.get("MASTER_PORT") or str(step_port(index))
    step_env = {
        **os.environ,
        "MASTER_ADDR": master_address(),
        "MASTER_PORT": port,
        "PYTHONUNBUFFERED": "1",
        channel.FILE_ENV: str(reports),
    }
    cmd = ["srun", *step_layout(cfg.world_size), "--kill-on-bad-exit=1", "--exact"]
    cmd += ["python", "-m", "zerobench.launch.task", str(spec)]
    t0 = time.monotonic()
    with open(log_path, "ab") as log:
        proc = subprocess.Popen(cmd, env=step_env, stdout=log, stderr=subprocess.STDOUT)
        stopped = _wait_step(proc, timeout_s, cancel, on_poll)
    elapsed = time.monotonic() - t0
    if stopped == "timeout":
        return LaunchResult(False, f"timed out after {timeout_s:.0f}s", "timeout", [proc.returncode], elapsed)
    if stopped is not None:
        return LaunchResult(False, f"cancelled ({stopped}): the step was stopped", "cancelled", [], elapsed)
    if proc.returncode == 0:
        return LaunchResult(True, "", "ok", [0], elapsed)
    status, reason, code = blame(reports, log_path, proc.returncode)
    return LaunchResult(False, reason, status, [code], elapsed)


def step_port(index: int) -> int:
    """The rendezvous port of a sweep's ``index``-th step, where ``MASTER_PORT`` is not set: derived from the job id
    as ``distributed/env.py`` derives it, so that two jobs sharing a node do not take the same port."""
    job = int(os.environ.get("SLURM_JOB_ID", "0") or 0)
    return 20000 + (job * 97 + index) % 12000  # below Linux's ephemeral ports (32768 up)


def step_layout(world: int) -> list[str]:
    """srun options placing ``world`` tasks as torchrun would place nnodes x nproc-per-node: whole nodes of the
    allocation's tasks per node (a TP group inside a node stays inside one), and the allocation's CPUs per task
    (srun does not take them from the job on Slurm 22.05-23.02)."""
    from zerobench.distributed.env import tasks_per_node

    per_node = tasks_per_node(os.environ.get("SLURM_TASKS_PER_NODE", "")) or tasks_per_node(
        os.environ.get("SLURM_NTASKS_PER_NODE", "")
    )
    opts = [f"--ntasks={world}"]
    if per_node:
        opts += [f"--nodes={-(-world // per_node)}", f"--ntasks-per-node={min(per_node, world)}"]
    cpus = os.environ.get("SLURM_CPUS_PER_TASK")
    if cpus:
        opts.append(f"--cpus-per-task={cpus}")
    return opts


def _wait_step(proc: subprocess.Popen, timeout_s: float, cancel: Cancellation | None, on_poll) -> str | None:
    """Wait for the step; stop it on a cancel request (returns why) or past the timeout (``"timeout"``)."""
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None:
        why = cancel.requested if cancel is not None and cancel.requested else None
        if why is None and time.monotonic() > deadline:
            why = "timeout"
        if why is not None:
            proc.terminate()  # srun passes SIGTERM to every task, then ends the step
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            return why
        if on_poll is not None:
            on_poll()
        time.sleep(0.2)
    # scancel, a time limit or preemption signals srun and the tasks too: the step can end before the request is
    # seen above, and it is still a stop, not a failure (half a second for this process's own handler to run)
    if cancel is not None and not cancel.requested and proc.returncode in (-15, 143, -2, 130):
        time.sleep(0.5)
    return cancel.requested if cancel is not None and cancel.requested else None


_SRUN_TASK = re.compile(r"task (\d+): (?:Exited with exit code (\d+)|(Killed|Segmentation fault|Aborted))")
"""srun's line for a task that ended on its own (``Terminated`` is srun's own SIGTERM to the others)."""


def first_failure(reports: Path, log_path: Path) -> tuple[str, str, int | None] | None:
    """(status, reason, exit code: None where srun saw no code) of the rank a failed step blames, or None where
    nothing names one. A task srun
    saw end (its log's ``task 1: Exited with exit code 17``) that wrote no exit code of its own died abruptly: it is
    the cause, with the code srun saw. Else the rank whose report file says it failed first, with its own code and
    line (a peer's lost connection comes later)."""
    ends = {e.rank: e for e in read_rank_files(reports)}
    with contextlib.suppress(OSError):
        for m in _SRUN_TASK.finditer(log_path.read_text(errors="replace")):
            rank = int(m.group(1))
            if rank in ends and ends[rank].code is not None:
                continue
            if m.group(2) is None:
                return "failed", f"rank {rank} ended: {m.group(3).lower()} (srun)", None
            code = int(m.group(2))
            return (*describe_exit(f"rank {rank}", code), code)
    return first_failure_of(ends.values())


def blame(reports: Path, log_path: Path, srun_code: int) -> tuple[str, str, int]:
    """``first_failure`` (with srun's own code where the rank's is not known), else the step's."""
    found = first_failure(reports, log_path)
    if found is None:
        return (*describe_exit("srun step", srun_code), srun_code)
    status, reason, code = found
    return status, reason, srun_code if code is None else code


def submit(
    cfg: TrainConfig,
    run_dir: Path,
    run_id: str,
    timeout_s: float,
    suite: str | None,
    gpus_per_task: int = 0,
    env: dict[str, str] | None = None,
) -> str:
    """sbatch one run (fixed script + JSON spec); returns the job id."""
    spec = write_spec(run_dir / "run.json", cfg, run_id, run_dir, suite, env)
    minutes = max(1, int(timeout_s // 60) + 1)
    cmd = [
        "sbatch",
        "--parsable",
        f"--job-name=zb-{run_id}"[:64],
        f"--ntasks={cfg.world_size}",
        f"--time={minutes}",
        f"--output={str(run_dir).replace('%', '%%')}/slurm-%j.out",  # a % of the path is not a pattern
        f"--chdir={REPO}",
    ]
    if gpus_per_task:
        cmd.append(f"--gpus-per-task={gpus_per_task}")
    cmd += [str(RUN_ONE), str(spec)]
    return _run(cmd).strip().split(";")[0]


def scancel(job_id: str) -> None:
    """Ask Slurm to stop job ``job_id`` (queued or running); ``SlurmCommandFailed`` if it cannot be asked."""
    _run(["scancel", job_id])


def job_state(job_id: str) -> tuple[str, str]:
    """(state, exit code) from ``scontrol show job -o``, asked again on a failed query (``query``); ('UNKNOWN', '')
    only when Slurm still does not report the job (it forgot it: ``MinJobAge`` passed)."""
    try:
        out = query(["scontrol", "show", "job", "-o", job_id])
    except SlurmCommandFailed:
        return "UNKNOWN", ""
    fields = dict(f.split("=", 1) for f in out.split() if "=" in f)
    return fields.get("JobState", "UNKNOWN"), fields.get("ExitCode", "")


FINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
    "UNKNOWN",
}


def status_of(state: str, exit_code: str, run_dir: Path | None = None, job_id: str = "") -> tuple[str, str]:
    """A finished job's (status, reason). A failed job of ``slurm/run_one.sh`` is its srun step's: the rank blamed
    from the ranks' report files and the job's log (``blame``), where ``run_dir`` holds them; its exit code is the
    step's SIGTERM to the survivors, whatever the failing rank returned."""
    if state == "COMPLETED" and exit_code.startswith("0:"):
        return "ok", ""
    if state == "UNKNOWN":
        return "failed", "Slurm no longer reports the job (scontrol show job failed): how it ended is not known"
    said = f"Slurm state {state}, exit code {exit_code or 'unknown'}"
    kind = {
        "TIMEOUT": "timeout",
        "DEADLINE": "timeout",
        "CANCELLED": "cancelled",
        "PREEMPTED": "cancelled",
        "OUT_OF_MEMORY": "oom",
    }.get(state, "failed")
    code = exit_code.split(":")[0] if exit_code else ""
    if kind == "failed" and run_dir is not None and (run_dir / "ranks").is_dir():
        found = first_failure(run_dir / "ranks", run_dir / f"slurm-{job_id}.out")
        if found is not None:
            return found[0], f"{found[1]} ({said})"
    if code == str(EXIT_OOM):
        kind = "oom"
    elif code == str(EXIT_CONFIG):
        kind = "invalid"
    return kind, said
