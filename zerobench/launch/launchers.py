"""The launchers behind one interface (``launch.base.Launcher``): ``local`` starts the ranks on this host,
``srun`` runs them as one job step of the current Slurm allocation. (Submitting whole runs with ``sbatch``
from a login node is asynchronous — ``launch/slurm.py``'s ``submit`` and ``job_state``, driven by
``bench/slurm_sweep.py``.)"""

from __future__ import annotations

from zerobench.config import ConfigError
from zerobench.launch.base import Launcher, LaunchRequest, LaunchResult
from zerobench.launch.local import launch_local
from zerobench.train.faults import FAULT_ENV


class LocalLauncher:
    name = "local"

    def launch(self, req: LaunchRequest) -> LaunchResult:
        return launch_local(req.cfg, req.out_dir, req.run_id, timeout_s=req.timeout_s,
                            extra_env={**({FAULT_ENV: req.fault} if req.fault else {}), **req.extra_env}, log_path=req.log_path,
                            suite=req.suite, on_poll=req.on_poll, cancel=req.cancel)


class SrunLauncher:
    name = "srun"

    def launch(self, req: LaunchRequest) -> LaunchResult:
        from zerobench.launch.slurm import launch_srun

        return launch_srun(req.cfg, req.out_dir, req.run_id, req.timeout_s, req.log_path, req.suite,
                           29500 + req.index, fault=req.fault)


LAUNCHERS: dict[str, Launcher] = {"local": LocalLauncher(), "srun": SrunLauncher()}


def get_launcher(name: str) -> Launcher:
    if name not in LAUNCHERS:
        raise ConfigError(f"unknown launcher {name!r}: choose {', '.join(LAUNCHERS)}")
    return LAUNCHERS[name]
