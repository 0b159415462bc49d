"""The regression gate on real sweeps: planted regressions are caught, unchanged runs pass, bad input
is one line, and the committed CPU baseline gates the CI suite.

Tests in the full grid (``slow``) cannot fail on unchanged code: they judge deterministic metrics exactly,
instruction counts at the tolerance their recorded noise gives, and the A/B timing at a stated false-alarm rate
below 1 in 1,000. Wall-clock judgements against a stored baseline are in the ``timing`` tier."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.e2e.test_cli_train import zb

pytestmark = pytest.mark.dist
TIMING_TOL = "1.0"  # a factor of 2: the measured between-process timing noise here (see the sweeps fixture)
REPO = Path(__file__).resolve().parents[2]

SUITE = """
name: gate
base: {preset: tiny, dp: 1, steps: 20, warmup: 4, precision: fp32, timeout: 120}
axes: {stage: [0, 2]}
"""


@pytest.fixture(scope="module")
def gate_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("gate")
    (d / "gate.yaml").write_text(SUITE)
    return d


def _sweep(d, name, env=None, *extra, timeout=300):
    r = zb("sweep", str(d / "gate.yaml"), "--out", str(d / name), "--no-progress", *extra, env=env, timeout=timeout)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    return str(d / name)


@pytest.fixture(scope="module")
def sweeps(gate_dir):
    return {
        "base": _sweep(gate_dir, "base"),
        "same": _sweep(gate_dir, "same"),
        "fat": _sweep(gate_dir, "fat", {"ZEROBENCH_PLANT_BUFFER": str(1 << 20)}),
    }


@pytest.fixture(scope="module")
def slow_sweep(gate_dir):
    # 8x step time: well above this machine's measured noise between processes (unchanged tiny runs
    # moved the stage-2/stage-0 ratio by up to +45..70% on the 2-core VM, see README, and once by +85%:
    # 26.2 vs 14.2 ms in a clean-clone CI run, where a 4x plant then read as only +58%), which is also
    # why the timing tolerance below is a factor of 2 (--timing-tolerance 1.0)
    return _sweep(gate_dir, "slow", {"ZEROBENCH_PLANT_DELAY": "7.0:2"}, timeout=600)


@pytest.mark.slow
def test_unchanged_run_passes(sweeps):
    """Unchanged code against itself, step-time ratios reported (``--timing report``): what is judged is
    deterministic (model states, communication volume, peak tracked memory, fp32 loss, and the counted step's
    operators, allocations and collectives, each exactly), so this cannot fail on a busy machine."""
    verdicts = Path(sweeps["same"]).parent / "unchanged-verdicts"
    r = zb(
        "regress", "--baseline", sweeps["base"], "--candidate", sweeps["same"], "--timing", "report", "--out", verdicts
    )
    assert r.returncode == 0, r.stdout
    assert "0 regressions" in r.stdout and (Path(sweeps["same"]) / "proposed-baseline.jsonl").exists()
    # from the verdict rows: the printed table lists only what moved when a reported step-time ratio did
    rows = [json.loads(line) for line in (verdicts / "rows.jsonl").read_text().splitlines()]
    exact = {
        v["of"] for v in rows if v["metric"] == "gate_comparison" and v["basis"] == "exact" and v["verdict"] == "ok"
    }
    assert {
        "model_state_bytes",
        "ops_dispatched",
        "allocations",
        "allocated_bytes",
        "ops_dispatched.optimizer",
    } <= exact
    assert "host-work metrics have no noise model" in r.stdout  # CPU time and Python calls: reported, not judged


@pytest.mark.timing
def test_unchanged_run_passes_the_timing_gate(sweeps):
    """The same comparison with the step-time ratio gated at a factor of 2: a wall-clock judgement between
    processes run at different times, which a busy machine can fail."""
    r = zb("regress", "--baseline", sweeps["base"], "--candidate", sweeps["same"], "--timing-tolerance", TIMING_TOL)
    assert r.returncode == 0, r.stdout
    assert "0 regressions" in r.stdout and (Path(sweeps["same"]) / "proposed-baseline.jsonl").exists()


@pytest.mark.slow
def test_planted_memory_increase_is_caught(sweeps):
    r = zb("regress", "--baseline", sweeps["base"], "--candidate", sweeps["fat"], "--timing-tolerance", TIMING_TOL)
    assert r.returncode == 1
    assert "peak_memory_bytes" in r.stdout and "REGRESSION" in r.stdout
    assert "model_state_bytes" not in [line.split()[1] for line in r.stdout.splitlines() if "REGRESSION" in line]


@pytest.mark.timing
def test_planted_slowdown_is_caught(sweeps, slow_sweep):
    r = zb("regress", "--baseline", sweeps["base"], "--candidate", slow_sweep, "--timing-tolerance", TIMING_TOL)
    assert r.returncode == 1
    lines = [line for line in r.stdout.splitlines() if "REGRESSION" in line]
    assert lines and all("step_time_ratio" in line for line in lines), r.stdout


@pytest.mark.timing
def test_improvement_is_flagged_not_failed(sweeps, slow_sweep):
    r = zb("regress", "--baseline", slow_sweep, "--candidate", sweeps["base"], "--timing-tolerance", TIMING_TOL)
    assert r.returncode == 0 and "update the baseline?" in r.stdout


@pytest.mark.slow
@pytest.mark.parametrize(
    "content,msg",
    [
        ("", "no result rows"),
        ("{not json\n", "not a JSON row"),
        ('{"value": 1}\n', "not a zerobench result row"),
    ],
)
def test_malformed_inputs_are_one_line(tmp_path, sweeps, content, msg):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(content)
    for args in (
        ["--baseline", str(bad), "--candidate", sweeps["base"]],
        ["--baseline", sweeps["base"], "--candidate", str(bad)],
    ):
        r = zb("regress", *args)
        assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.slow
def test_hardware_class_mismatch(tmp_path, sweeps):
    rows = [json.loads(line) for line in (Path(sweeps["base"]) / "000-stage-0" / "rows.jsonl").read_text().splitlines()]
    for row in rows:
        row["provenance"]["hardware"]["class"] = "nvidia-h100-80gb-hbm3"
    other = tmp_path / "gpu.jsonl"
    other.write_text("".join(json.dumps(row) + "\n" for row in rows))
    r = zb("regress", "--baseline", str(other), "--candidate", sweeps["base"])
    assert r.returncode == 2 and "baseline is for nvidia-h100" in r.stderr


@pytest.mark.slow  # trains the whole cpu/ci suite (~45 s on 2 cores)
@pytest.mark.skipif((os.cpu_count() or 0) != 2, reason="the committed CPU baseline is for 2-core machines (cpu-2core)")
def test_ci_suite_against_the_committed_baseline(tmp_path):
    out = tmp_path / "ci"
    r = zb("sweep", "cpu/ci", "--out", str(out), "--no-progress", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    # Deterministic metrics (model-state bytes, communication volume, peak tracked memory, fp32 loss) gate
    # exactly; step-time ratios of these tiny 2-process runs moved 80-90% between sessions on this machine
    # class, so against a baseline from another session they are reported, not gated.
    r = zb(
        "regress",
        "--baseline",
        str(REPO / "results/baselines/cpu-2core.jsonl"),
        "--candidate",
        str(out),
        "--timing",
        "report",
    )
    assert r.returncode == 0, r.stdout


AB_SUITE = """
name: ab
base: {preset: mini, dp: 1, steps: 30, warmup: 5, precision: fp32, timeout: 120}
runs:
  - {label: unchanged, stage: 1}
  - {label: planted, stage: 2}
"""


@pytest.fixture(scope="module")
def ab_suite(tmp_path_factory):
    d = tmp_path_factory.mktemp("ab")
    (d / "ab.yaml").write_text(AB_SUITE)
    return d / "ab.yaml"


@pytest.mark.timing
@pytest.mark.timeout(2000)
def test_ab_catches_a_planted_ten_percent_slowdown_and_passes_unchanged_code(ab_suite, tmp_path):
    """The issue's bar for timings: a 10% step-time slowdown is caught and an unchanged run passes, in
    one interleaved comparison (this checkout against itself): the candidate side spends an extra 10% of
    every stage-2 step (the test-only delay hook); its stage-1 run is unchanged. Lockstep: both sides run
    at once and their steps take turns, each round's ratio is the median of step-k-vs-step-k ratios, so
    noise bursts of the shared VM land on both sides (docs/results.md says what the other modes measured)."""
    out = tmp_path / "ab"
    r = zb(
        "regress",
        "--ab",
        str(ab_suite),
        "--baseline-tree",
        str(REPO),
        "--rounds",
        "28",
        "--out",
        str(out),
        "--lockstep",
        "--candidate-env",
        "ZEROBENCH_PLANT_DELAY=0.10:2",
        timeout=1900,
    )
    rows = {row["run"]: row for row in map(json.loads, (out / "summary" / "rows.jsonl").read_text().splitlines())}
    assert r.returncode == 1, r.stdout + r.stderr
    assert rows.keys() == {"000-unchanged", "001-planted"}, rows.keys()
    assert {row["config"]["metric"] for row in rows.values()} == {"step_time_s"}, rows
    assert rows["001-planted"]["verdict"] == "REGRESSION" and 1.05 < rows["001-planted"]["value"] < 1.2, rows
    assert rows["000-unchanged"]["verdict"] == "ok" and abs(rows["000-unchanged"]["value"] - 1) <= 0.05, rows
    assert "1 regressions" in r.stdout


AB_FAST_SUITE = """
name: ab-fast
base: {preset: tiny, dp: 1, steps: 10, warmup: 2, precision: fp32, timeout: 300}
runs:
  - {label: unchanged, stage: 1}
  - {label: planted, stage: 2}
"""


@pytest.mark.gate
@pytest.mark.timeout(2400)
def test_ab_cannot_fail_unchanged_code_and_catches_a_planted_slowdown(tmp_path):
    """The A/B gate at its stated false-alarm rate: 28 lockstep rounds, a sign test that calls a regression only
    when 13 of the 14 AB/BA pairs lie above 1, which unchanged code does with probability 15/2^14 (under 1 in
    1,000), whatever the machine's noise: each pair's orientation is a coin's. The candidate spends an extra 50%
    of every stage-2 step (the delay plant): caught, and one pair turned over by a burst does not hide it. Both sides are pinned to one CPU (one intra-op thread: two threads per rank on a busy 2-core machine
    spin at their barriers)."""
    (tmp_path / "ab.yaml").write_text(AB_FAST_SUITE)
    out = tmp_path / "ab"
    cpu = str(min(os.sched_getaffinity(0)))
    r = zb(
        "regress",
        "--ab",
        str(tmp_path / "ab.yaml"),
        "--baseline-tree",
        str(REPO),
        "--rounds",
        "28",
        "--lockstep",
        "--cpus",
        cpu,
        "--out",
        str(out),
        "--candidate-env",
        "ZEROBENCH_PLANT_DELAY=0.5:2",
        timeout=2300,  # a hang guard: about 8 minutes on a quiet 2-core machine
    )
    rows = {row["run"]: row for row in map(json.loads, (out / "summary" / "rows.jsonl").read_text().splitlines())}
    assert rows.keys() == {"000-unchanged", "001-planted"}, r.stdout + r.stderr
    for row in rows.values():
        assert row["false_alarm"] == 15 / 2**14 and row["critical"] == 13 and row["rounds"] == 28, row
    assert rows["000-unchanged"]["verdict"] != "REGRESSION", rows
    assert rows["001-planted"]["verdict"] == "REGRESSION" and rows["001-planted"]["lower"] > 1, rows
    assert r.returncode == 1 and "1 regressions" in r.stdout, r.stdout


def test_ab_baseline_from_a_git_ref(tmp_path):
    """``--baseline-ref`` checks the ref out into a temporary worktree and removes it afterwards."""
    from zerobench.bench.ab_sources import worktree

    with worktree("HEAD", REPO) as tree:
        assert (Path(tree) / "zerobench" / "__init__.py").exists()
    assert not Path(tree).exists()


@pytest.mark.slow
def test_ab_bad_input_is_one_line(ab_suite, tmp_path):
    for args, msg in [
        (["--baseline-ref", "no-such-ref"], "cannot check out 'no-such-ref'"),
        (["--baseline-tree", str(tmp_path)], "not a zerobench source tree"),
        (["--baseline-tree", str(REPO), "--rounds", "3"], "--rounds must be even"),
        (["--baseline-tree", str(REPO), "--max-rounds", "9"], "--max-rounds must be even"),
        (["--baseline-tree", str(REPO), "--rounds", "6"], "cannot reach a false-alarm rate of 0.001"),
        (["--baseline-tree", str(REPO), "--false-alarm", "1.5"], "is a probability from 1e-12 to below 1"),
        (["--baseline-tree", str(REPO), "--cpus", "9999"], "may only use CPUs"),
        (["--baseline-tree", str(REPO), "--cpus", "x"], "expected CPU ids"),
        (["--baseline-tree", str(REPO), "--lockstep", "--concurrent"], "choose one of --concurrent"),
        (
            ["--baseline-tree", str(REPO), "--concurrent", "--cpus", str(min(os.sched_getaffinity(0)))],
            "two equal halves",
        ),
        ([], "exactly one of --baseline-ref REF or --baseline-tree DIR"),
    ]:
        r = zb("regress", "--ab", str(ab_suite), *args, "--out", str(tmp_path / "x"))
        assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, (args, r.stderr)


@pytest.mark.slow
def test_an_ab_stopped_by_sigterm_removes_its_worktree_and_sides(tmp_path):
    """Slurm's time limit or scancel stops an A/B with SIGTERM: the baseline's git worktree is removed and both
    sides stopped on the way out, the exit is 143 with one line (SIGTERM's default action left the worktree
    registered in the repository, and its sides running)."""
    import signal
    import subprocess
    import sys
    import time

    def worktrees() -> list[str]:
        got = subprocess.run(
            ["git", "-C", str(REPO), "worktree", "list", "--porcelain"], capture_output=True, text=True
        )
        return [line.split(" ", 1)[1] for line in got.stdout.splitlines() if line.startswith("worktree ")]

    before = worktrees()
    (tmp_path / "ab.yaml").write_text(AB_FAST_SUITE)
    proc = subprocess.Popen(
        [
            *(sys.executable, "-m", "zerobench", "regress", "--ab", str(tmp_path / "ab.yaml")),
            *("--baseline-ref", "HEAD", "--rounds", "20", "--out", str(tmp_path / "ab")),
        ],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 120
    while len(worktrees()) == len(before) and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.2)
    added = sorted(set(worktrees()) - set(before))
    assert added, "the A/B never checked out its baseline"
    time.sleep(2)  # the sides start
    proc.send_signal(signal.SIGTERM)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 143, err
    lines = [ln for ln in err.strip().splitlines() if ln.startswith("zerobench: error")]
    assert lines == [f"zerobench: error: A/B cancelled (SIGTERM); its rounds so far are under {tmp_path / 'ab'}"], err
    assert worktrees() == before and not any(Path(w).parent.exists() for w in added)  # its temporary dir too


AB_TINY = """
name: ab-tiny
base: {preset: tiny, dp: 1, steps: 3, warmup: 1, precision: fp32, timeout: 300}
runs:
  - {label: one, stage: 1}
"""


@pytest.mark.slow
def test_an_ab_with_a_relative_out_writes_there(tmp_path):
    """Each side ran its sweep with its own tree as the working directory, so a relative --out (the default, and
    every documented recipe) put the baseline's rows in its worktree, and the comparison stopped at the warm-up
    with 'no results'. The suite both sides ran is the one given, copied into the comparison."""
    import subprocess
    import sys

    (tmp_path / "ab.yaml").write_text(AB_TINY)
    cmd = [sys.executable, "-m", "zerobench", "regress", "--ab", "ab.yaml", "--baseline-tree", str(REPO)]
    cmd += ["--rounds", "2", "--false-alarm", "0.5", "--out", "rel"]
    r = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=900)
    assert r.returncode in (0, 1), r.stdout + r.stderr
    assert (tmp_path / "rel" / "summary" / "rows.jsonl").is_file(), r.stdout + r.stderr
    assert (tmp_path / "rel" / "suite" / "ab.yaml").read_text() == AB_TINY
