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

import json
import os
import subprocess
import time
from pathlib import Path

from zerobench.config import ConfigError, to_dict
from zerobench.launch.base import LaunchResult, describe_exit
from zerobench.train.config import TrainConfig

REPO = Path(__file__).resolve().parents[2]
RUN_ONE = REPO / "slurm" / "run_one.sh"


def _run(cmd: list[str], timeout: float = 60) -> str:
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False)
    except FileNotFoundError:
        raise ConfigError(
            f"{cmd[0]} not found: is this a Slurm login node? (or start one: slurm/local/start.sh)"
        ) from None
    if r.returncode != 0:
        raise ConfigError(f"{' '.join(cmd[:2])} failed: {(r.stderr or r.stdout).strip().splitlines()[-1:]}")
    return r.stdout


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
    port: int,
    env: dict[str, str] | None = None,
) -> LaunchResult:
    """One job step of ``cfg.world_size`` tasks inside the current allocation."""
    total = int(os.environ.get("SLURM_NTASKS", "0"))
    if cfg.world_size > total:
        return LaunchResult(False, f"needs {cfg.world_size} tasks, the allocation has {total}", "invalid", [], 0.0)
    spec = write_spec(out_dir / "run.json", cfg, run_id, out_dir, suite, env)
    env = {**os.environ, "MASTER_ADDR": master_address(), "MASTER_PORT": str(port), "PYTHONUNBUFFERED": "1"}
    cmd = [
        "srun",
        f"--ntasks={cfg.world_size}",
        "--kill-on-bad-exit=1",
        "--exact",
        "python",
        "-m",
        "zerobench.launch.task",
        str(spec),
    ]
    t0 = time.monotonic()
    with open(log_path, "ab") as log:
        try:
            r = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=timeout_s, check=False)
            code = r.returncode
        except subprocess.TimeoutExpired:
            return LaunchResult(False, f"timed out after {timeout_s:.0f}s", "timeout", [], time.monotonic() - t0)
    if code == 0:
        return LaunchResult(True, "", "ok", [0], time.monotonic() - t0)
    status, reason = describe_exit("srun step", code)
    return LaunchResult(False, reason, status, [code], time.monotonic() - t0)


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
        f"--output={run_dir / 'slurm-%j.out'}",
        f"--chdir={REPO}",
    ]
    if gpus_per_task:
        cmd.append(f"--gpus-per-task={gpus_per_task}")
    cmd += [str(RUN_ONE), str(spec)]
    return _run(cmd).strip().split(";")[0]


def job_state(job_id: str) -> tuple[str, str]:
    """(state, exit code) from ``scontrol show job -o``; ('UNKNOWN', '') if Slurm forgot the job."""
    try:
        out = _run(["scontrol", "show", "job", "-o", job_id])
    except ConfigError:
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


def status_of(state: str, exit_code: str) -> tuple[str, str]:
    if state == "COMPLETED" and exit_code.startswith("0:"):
        return "ok", ""
    kind = {"TIMEOUT": "timeout", "CANCELLED": "cancelled", "OUT_OF_MEMORY": "oom"}.get(state, "failed")
    code = exit_code.split(":")[0] if exit_code else ""
    if code == "75":
        kind = "oom"
    return kind, f"Slurm state {state}, exit code {exit_code or 'unknown'}"
