"""A ``python`` child process as a user starts one by hand: no launcher's (torchrun's or Slurm's) variables, so
``zerobench.zero.initialize`` finds a world of one."""

from __future__ import annotations

import os
import subprocess
import sys

LAUNCHER_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT")


def run_plain_python(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python *args`` without the launcher's variables; its output captured as text."""
    env = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS and not k.startswith("SLURM")}
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env)
