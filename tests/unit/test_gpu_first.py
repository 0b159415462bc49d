"""``scripts/gpu_first.sh`` (issue 61's prepared command for a lent GPU) checked on a CPU: its bash, the one-line
refusal of an unknown section, and its ``tests`` section's smoke path (``GPU_FIRST_SMOKE=1``): the ``-k`` cut
collects the five CUDA-path cases, the section ends as one archive with its logs, and summary.txt records it.
The other sections' smoke paths run in tests/e2e/test_gpu_first.py (slow, slurm)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "gpu_first.sh"


def run_smoke(out: Path, *sections: str, timeout: int = 120, **extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "GPU_FIRST_SMOKE": "1", "OUT": str(out), "PY": sys.executable, "PYTHONPATH": str(REPO)}
    env.update(extra)
    return subprocess.run(
        ["bash", str(SCRIPT), *sections], cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout
    )


def test_the_script_parses_and_refuses_an_unknown_section_in_one_line(tmp_path):
    assert subprocess.run(["bash", "-n", str(SCRIPT)]).returncode == 0
    r = run_smoke(tmp_path, "tests", "bench")
    assert (
        r.returncode == 2
        and r.stderr == "gpu_first.sh: unknown section 'bench': choose from tests torchrun slurm table trace\n"
    )
    assert not (tmp_path / "summary.txt").exists()  # nothing ran


@pytest.mark.slow  # a pytest collection and the section's archive in subprocesses: about 13 s
def test_tests_section_smoke_collects_the_cuda_path_cut_and_archives_it(tmp_path):
    r = run_smoke(tmp_path, "tests")
    assert r.returncode == 0, r.stdout + r.stderr
    assert (tmp_path / "summary.txt").read_text().startswith("tests: ok in ")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["console.log", "summary.txt", "tests.tgz"]
    with tarfile.open(tmp_path / "tests.tgz") as tar:
        names = set(tar.getnames())
        collected = tar.extractfile("tests/collected.txt").read().decode()
    assert {"tests/collected.txt", "tests/pytest.log", "tests/junit.xml"} <= names
    cases = sorted(line.split("[")[1].rstrip("]") for line in collected.splitlines() if "::" in line)
    assert cases == ["2-bf16-offload", "2-bf16-plain", "2-fp16-accum", "3-bf16-plain", "pa-cpu-bf16"]
    assert "5 cases" in (tmp_path / "console.log").read_text()


@pytest.mark.slow  # a two-system comparison under the profiler in subprocesses: about 20 s
def test_trace_section_smoke_profiles_each_system_as_the_table_runs_it(tmp_path):
    # no torch-ddp: a comparison without it still tables its times
    r = run_smoke(tmp_path, "trace", timeout=300, TRACE_SYSTEMS="zerobench-3 fsdp2")
    assert r.returncode == 0, r.stdout + r.stderr
    with tarfile.open(tmp_path / "trace.tgz") as tar:
        names = set(tar.getnames())
        config = json.loads(tar.extractfile("trace/1.3b-smoke/r0-zerobench-3/rows.jsonl").readline())["config"]
        summary = [json.loads(x) for x in tar.extractfile("trace/1.3b-smoke/summary/rows.jsonl").read().splitlines()]
    for sys_ in ("zerobench-3", "fsdp2"):  # each trace gzipped, its operator table beside it
        prof = f"trace/1.3b-smoke/prof/r0-{sys_}"
        assert {f"{prof}/rank0.trace.json.gz", f"{prof}/rank0.ops.txt"} <= names
        assert [x["value"] > 0 for x in summary if x["metric"] == "peer_step_time_s" and x["candidate"] == sys_] == [
            True
        ]
    # as the table runs zerobench: its stage, bf16, the plain model's kernels, and the profiler on
    assert (config["zero"]["stage"], config["zero"]["precision"], config["kernels"]) == (3, "bf16", "reference")
    assert config["profile"]["steps"] == 2


@pytest.mark.parametrize("mib, mb", [("143771", "8"), ("81559", "4"), (None, "4")])
def test_2_7b_micro_batch_follows_the_cards_memory(tmp_path, mib, mb):
    """The H200 ran 2.7B at micro-batch 8 (106 GB at its peak, DDP); an 80 GB card keeps 4; no card, 4."""
    if mib is not None:
        fake = tmp_path / "nvidia-smi"
        fake.write_text(f"#!/bin/sh\necho {mib}\n")
        fake.chmod(0o755)
    fn = 'source <(sed -n "/^mb_2p7b()/,/^}/p" "$0"); mb_2p7b'
    env = {"PATH": f"{tmp_path}:/usr/bin:/bin"}
    r = subprocess.run(["bash", "-c", fn, str(SCRIPT)], env=env, capture_output=True, text=True, timeout=30)
    assert (r.returncode, r.stdout) == (0, mb + "\n")
