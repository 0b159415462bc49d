"""The C++ kernels' build cache. A cached library that does not load (truncated by a full disk or a killed copy)
made every later process fall back to the reference path, loudly, but for good: nothing rebuilt it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

from kernels import cpu

LOAD = "from kernels import cpu, ops; cpu.library(); print('loaded', cpu.available())"


def test_a_cached_build_that_does_not_load_is_built_again(tmp_path):
    env = {**os.environ, "ZEROBENCH_KERNEL_CACHE": str(tmp_path)}
    built = cpu.build()  # this process's cache: copied, so that only the rebuild below compiles
    shutil.copy(built, tmp_path / built.name)
    (tmp_path / built.name).write_bytes(b"\x7fELF truncated")
    r = subprocess.run([sys.executable, "-c", LOAD], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "loaded True" in r.stdout, r.stderr
    assert "does not load" in r.stderr and "building it again" in r.stderr, r.stderr
    assert (tmp_path / built.name).stat().st_size == built.stat().st_size
