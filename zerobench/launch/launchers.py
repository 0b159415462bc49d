"""The launchers behind one interface (``launch.base.Launcher``): ``local`` starts the ranks on this host,
``srun`` runs them as one job step of the current Slurm allocation, ``sbatch`` submits the run as a job
from a login node and waits for it. (A sweep over sbatch submits every run at once and polls them:
``bench/slurm_sweep.py``, with the same ``submit`` / ``job_state`` / ``status_of`` as ``SbatchLauncher``.)"""

from __future__ import annotations

import time

from zerobench.config import ConfigError
from zerobench.launch.base import Launcher, LaunchRequest, LaunchResult
from zerobench.launch.local import launch_local


class LocalLauncher:
    name = "local"

    def launch(self, req: LaunchRequest) -> LaunchResult:
        return launch_local(
            req.cfg,
            req.out_dir,
            req.run_id,
            timeout_s=req.timeout_s,
            extra_env=req.extra_env,
            log_path=req.log_path,
            suite=req.suite,
            on_poll=req.on_poll,
            cancel=req.cancel,
            callgrind_ranks=req.callgrind_ranks,
        )


class SrunLauncher:
    name = "srun"

    def launch(self, req: LaunchRequest) -> LaunchResult:
        from zerobench.launch.slurm import launch_srun

        return launch_srun(
            req.cfg,
            req.out_dir,
            req.run_id,
            req.timeout_s,
            req.log_path,
            req.suite,
            req.index,
            req.extra_env,
            cancel=req.cancel,
            on_poll=req.on_poll,
        )


class SbatchLauncher:
    name = "sbatch"

    def __init__(self, poll_s: float = 2.0):
        self.poll_s = poll_s

    def launch(self, req: LaunchRequest) -> LaunchResult:
        from zerobench.launch.slurm import FINAL, job_state, scancel, status_of, submit

        t0 = time.monotonic()
        job = submit(req.cfg, req.out_dir, req.run_id, req.timeout_s, req.suite, env=req.extra_env)
        while True:
            state, code = job_state(job)
            if state in FINAL:
                status, reason = status_of(state, code, req.out_dir, job)
                return LaunchResult(status == "ok", reason, status, [], time.monotonic() - t0)
            if req.cancel is not None and req.cancel.requested:
                scancel(job)
                return LaunchResult(False, f"cancelled (job {job} scancelled)", "cancelled", [], time.monotonic() - t0)
            if req.on_poll is not None:
                req.on_poll()
            time.sleep(self.poll_s)


LAUNCHERS: dict[str, Launcher] = {"local": LocalLauncher(), "srun": SrunLauncher(), "sbatch": SbatchLauncher()}


def get_launcher(name: str) -> Launcher:
    if name not in LAUNCHERS:
        raise ConfigError(f"unknown launcher {name!r}: choose {', '.join(LAUNCHERS)}")
    return LAUNCHERS[name]
