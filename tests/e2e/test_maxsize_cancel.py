"""``zerobench maxsize`` under SIGTERM (Slurm's time limit, ``scancel``): it stops the probe's ranks and exits
143 as ``sweep`` does, in one line that names only files that exist."""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_faults import one_line, ranks_running

pytestmark = pytest.mark.dist


def test_sigterm_during_a_probe_exits_143_citing_its_kept_log(tmp_path):
    probes = tmp_path / "probes"
    p = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "zerobench",
            "maxsize",
            "--budget",
            "64MiB",
            "--stage",
            "0",
            "--dp",
            "2",
            "--max-layers",
            "64",
            "--probes",
            str(probes),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = probes / "stage0" / "probe-1" / "run.log"
    deadline = time.monotonic() + 120
    while not log.exists() and time.monotonic() < deadline and p.poll() is None:
        time.sleep(0.2)
    assert log.exists(), "the first probe never started"
    p.send_signal(signal.SIGTERM)
    _, err = p.communicate(timeout=60)
    line = one_line(err)
    assert p.returncode == 143, err
    assert line.startswith("zerobench: error: maxsize stopped at stage 0: cancelled (SIGTERM)"), line
    cited = [Path(m) for m in re.findall(r"(/[^\s;)]+)", line)]
    assert cited and all(c.exists() for c in cited), line
    assert not ranks_running(str(probes)), "ranks left running after SIGTERM"
