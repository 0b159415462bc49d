"""A real Slurm on localhost for the tests marked ``slurm``: started once, stopped at the end so no daemons
are left behind. Slurm itself is installed by ``tests/setup-tools.sh`` (the README's test command runs it);
without it these tests skip."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def slurm_env(tmp_path_factory):
    state = tmp_path_factory.mktemp("slurm")
    have = all(shutil.which(c) for c in ("sbatch", "slurmctld", "slurmd", "munged"))
    if not have:
        pytest.skip("Slurm is not installed: run tests/setup-tools.sh (as root)")
    env = {**os.environ, "ZB_SLURM_DIR": str(state), "ZB_SLURM_NODES": "2", "ZB_SLURM_CPUS": "8", "ZB_SLURM_GPUS": "2"}
    r = subprocess.run(
        ["bash", str(REPO / "slurm/local/start.sh")], env=env, capture_output=True, text=True, timeout=900
    )
    if r.returncode != 0:
        pytest.fail(f"local Slurm did not start: {r.stderr.strip()[-2000:]}")
    env["SLURM_CONF"] = str(state / "slurm.conf")
    pids = [int(p) for p in (state / "pids").read_text().split()]
    yield env
    subprocess.run(["bash", str(REPO / "slurm/local/stop.sh")], env=env, capture_output=True, timeout=120)
    alive = [p for p in pids if Path(f"/proc/{p}").exists()]
    assert not alive, f"slurm/local/stop.sh left daemons running: {alive}"
