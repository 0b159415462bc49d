"""A real Slurm on localhost for the tests marked ``slurm``: started once (installed when missing, as
root), stopped at the end so no daemons are left behind."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
STATE = Path("/tmp/zerobench-slurm-tests")


@pytest.fixture(scope="session")
def slurm_env():
    have = all(shutil.which(c) for c in ("sbatch", "slurmctld", "slurmd", "munged"))
    if not have and (os.geteuid() != 0 or not shutil.which("apt-get")):
        pytest.skip("Slurm is not installed and cannot be installed here (needs root and apt-get)")
    env = {**os.environ, "ZB_SLURM_DIR": str(STATE), "ZB_SLURM_NODES": "2", "ZB_SLURM_CPUS": "8", "ZB_SLURM_GPUS": "2"}
    r = subprocess.run(["bash", str(REPO / "slurm/local/start.sh")], env=env, capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        pytest.fail(f"local Slurm did not start: {r.stderr.strip()[-2000:]}")
    env["SLURM_CONF"] = str(STATE / "slurm.conf")
    pids = [int(p) for p in (STATE / "pids").read_text().split()]
    yield env
    subprocess.run(["bash", str(REPO / "slurm/local/stop.sh")], env=env, capture_output=True, timeout=120)
    alive = [p for p in pids if Path(f"/proc/{p}").exists()]
    assert not alive, f"slurm/local/stop.sh left daemons running: {alive}"
