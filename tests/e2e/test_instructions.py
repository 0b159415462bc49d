"""Instruction counts of a step's host work under valgrind's callgrind (``zerobench sweep --instructions``) and the
gate that judges them against the noise of unchanged runs: unchanged code passes, a planted host-work slowdown is
caught. Needs valgrind and a C compiler (``tests/setup-tools.sh`` installs valgrind); without them these skip,
except the one-line refusal."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.e2e.test_cli_train import zb

REPO = Path(__file__).resolve().parents[2]
needs_valgrind = pytest.mark.skipif(
    shutil.which("valgrind") is None or shutil.which("cc") is None,
    reason="needs valgrind and cc: bash tests/setup-tools.sh installs them",
)

SUITE = """
name: counted
base: {preset: tiny, dp: 1, steps: 6, warmup: 3, precision: fp32, timeout: 120}
runs:
  - {stage: 2}
"""
PROGRAM = """
from zerobench.metrics.callgrind import Marks, read_counts
import sys
m = Marks()
assert m.running
m.start(); m.zero()
sum(range(100_000)); m.dump("one")
sum(range(200_000)); m.dump("two")
m.stop()
print(read_counts(sys.argv[1], "probe"))
"""


@needs_valgrind
@pytest.mark.slow  # two Python processes under valgrind: about a minute
def test_marks_count_the_instructions_between_them(tmp_path):
    from zerobench.metrics import callgrind

    callgrind.library()
    got = []
    for _ in range(2):
        cmd = callgrind.valgrind_command([sys.executable, "-c", PROGRAM, str(tmp_path)], tmp_path, "probe")
        r = subprocess.run(
            cmd, capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": str(REPO)}
        )
        assert r.returncode == 0, r.stderr
        got.append(eval(r.stdout.strip().splitlines()[-1]))  # our own program's dict
    for counts in got:
        assert counts["two"] == pytest.approx(2 * counts["one"], rel=0.05), counts
    assert got[1]["two"] == pytest.approx(got[0]["two"], rel=0.01), got  # another process: the same count


def test_instructions_without_valgrind_is_one_line(tmp_path):
    (tmp_path / "s.yaml").write_text(SUITE)
    r = zb(
        "sweep", str(tmp_path / "s.yaml"), "--out", str(tmp_path / "o"), "--instructions", env={"PATH": str(tmp_path)}
    )  # neither valgrind nor cc on the PATH
    assert r.returncode == 2 and "counting instructions needs valgrind" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.fixture(scope="module")
def counted(tmp_path_factory):
    """Seven instrumented sweeps of one tiny run, two at a time (instruction counts do not depend on load): five
    unchanged ones for the noise model, one more unchanged, one with half again as much host work in every phase.
    Five, because a noise model of three allows 52 sigmas at the gate's false-alarm rate: a phase whose count moves
    2% between unchanged runs (``zero_grad``, about 200,000 instructions) is then too noisy to judge, which is the
    gate's right answer and not the one this test is after (``--write-baseline`` says so below five runs)."""
    d = tmp_path_factory.mktemp("counted")
    (d / "s.yaml").write_text(SUITE)
    plans = [*((f"b{i}", {}) for i in range(1, 6)), ("same", {}), ("planted", {"ZEROBENCH_PLANT_CPU": "0.5"})]
    procs: list = []
    try:
        for name, env in plans:
            while len([p for p in procs if p[1].poll() is None]) >= 2:
                procs[next(i for i, p in enumerate(procs) if p[1].poll() is None)][1].wait(timeout=1200)
            cmd = [
                sys.executable,
                "-m",
                "zerobench",
                "sweep",
                str(d / "s.yaml"),
                "--out",
                str(d / name),
                "--no-progress",
                "--instructions",
            ]
            with open(d / f"{name}.log", "w") as log:  # a file, not a pipe nobody reads while waiting
                procs.append(
                    (name, subprocess.Popen(cmd, env={**os.environ, **env}, stdout=log, stderr=subprocess.STDOUT))
                )
        for name, p in procs:
            p.wait(timeout=1200)
            assert p.returncode == 0, f"{name}: {(d / f'{name}.log').read_text()[-3000:]}"
    finally:
        for _, p in procs:  # nothing left running when a sweep failed or hung
            if p.poll() is None:
                p.kill()
                p.wait()
    return d


@needs_valgrind
@pytest.mark.gate
@pytest.mark.timeout(1500)
def test_instruction_counts_pass_unchanged_code_and_catch_planted_host_work(counted, tmp_path):
    rows = [json.loads(line) for f in (counted / "same").rglob("rows.jsonl") for line in f.read_text().splitlines()]
    instr = {r["phase"]: r["value"] for r in rows if r["metric"] == "instructions"}
    assert set(instr) == {"forward_backward", "optimizer", "zero_grad", "step"} and instr["step"] > 1e6, instr
    assert all(r.get("instrumented") == "callgrind" for r in rows)  # the sweep's status row too
    assert not [r for r in rows if r["metric"] in ("step_time_s", "host_cpu_s")]  # nothing under callgrind is timed
    base = tmp_path / "base.jsonl"
    r = zb("regress", "--write-baseline", str(base), "--candidate", *(str(counted / f"b{i}") for i in range(1, 6)))
    assert r.returncode == 0 and "noise model from 5 unchanged runs" in r.stdout, r.stdout + r.stderr
    r = zb(
        "regress",
        "--baseline",
        str(base),
        "--candidate",
        str(counted / "same"),
        "--timing",
        "report",
        "--propose",
        str(tmp_path / "p1.jsonl"),
    )
    judged = [line for line in r.stdout.splitlines() if " instructions" in line]
    assert r.returncode == 0 and len(judged) == 4, r.stdout
    assert all("noise: 5 runs" in line or "floor" in line or "exact" in line for line in judged), r.stdout
    r = zb(
        "regress",
        "--baseline",
        str(base),
        "--candidate",
        str(counted / "planted"),
        "--timing",
        "report",
        "--propose",
        str(tmp_path / "p2.jsonl"),
    )
    caught = {line.split()[1] for line in r.stdout.splitlines() if "REGRESSION" in line}
    assert r.returncode == 1 and {"instructions", "instructions.forward_backward"} <= caught, r.stdout


def test_a_percent_in_the_output_directory_is_no_valgrind_pattern(tmp_path):
    """valgrind expands ``%p`` and ``%q{VAR}`` in ``--callgrind-out-file``: an --out holding ``%q{VAR}`` sent the
    dumps where the variable pointed (a helper's review); the path's ``%`` is doubled, the pid pattern kept."""
    from zerobench.metrics import callgrind

    cmd = callgrind.valgrind_command(["true"], tmp_path / "out100%q{HOME}", "probe")
    (arg,) = [a for a in cmd if a.startswith("--callgrind-out-file=")]
    assert arg == f"--callgrind-out-file={tmp_path}/out100%%q{{HOME}}/callgrind.out.probe.%p"
