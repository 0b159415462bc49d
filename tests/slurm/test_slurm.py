"""sbatch slurm/scale_400gpu.sh and sweep submission against a real Slurm started on localhost."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from zerobench.results import load
from zerobench.train.faults import FAULT_ENV

pytestmark = [pytest.mark.slurm, pytest.mark.dist, pytest.mark.slow]
REPO = Path(__file__).resolve().parents[2]

TINY = """
name: slurmtiny
base: {preset: tiny, steps: 3, warmup: 1, timeout: 180}
runs:
  - {label: s2-dp4, stage: 2, dp: 4}
  - {label: s3-dp2-tp2, stage: 3, dp: 2, tp: 2}
  - {label: too-big, stage: 0, dp: 8}
"""


def run(cmd, env, timeout=600, **kw):
    return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=REPO, **kw)


def test_scale_400gpu_scaled_down(slurm_env, tmp_path):
    (tmp_path / "tiny.yaml").write_text(TINY)
    env = {**slurm_env, "SUITE": str(tmp_path / "tiny.yaml"), "ZEROBENCH_RESULTS": str(tmp_path / "results")}
    # the same script, with the node/task counts of the emulated cluster given on the command line
    r = run(
        [
            "sbatch",
            "--wait",
            "--parsable",
            "--nodes=2",
            "--ntasks-per-node=2",
            "--gpus-per-node=2",
            "--cpus-per-task=1",
            f"--output={tmp_path}/job-%j.out",
            "slurm/scale_400gpu.sh",
        ],
        env,
    )
    job = r.stdout.strip().split(";")[0]
    assert r.returncode == 0, r.stderr + (tmp_path / f"job-{job}.out").read_text()
    state = run(["scontrol", "show", "job", "-o", job], env).stdout
    assert "JobState=COMPLETED" in state
    out = tmp_path / "results" / "tiny" / job
    df = load(out)
    st = df[df["metric"] == "run_status"].set_index("label")
    assert st.loc["s2-dp4", "status"] == "ok" and st.loc["s3-dp2-tp2", "status"] == "ok"
    assert st.loc["too-big", "status"] == "invalid" and "allocation has 4" in st.loc["too-big", "reason"]
    trained = df[(df["metric"] == "loss") & (df["run_id"] == "000-s2-dp4")]
    assert len(trained) == 3
    assert (trained["provenance.slurm.job_id"] == job).all()
    assert (trained["provenance.slurm.nodelist"] == "n[1-2]").all()


SUBMIT = """
name: submit
base: {preset: tiny, dp: 2, steps: 3, warmup: 1, timeout: 300}
runs:
  - {label: good, stage: 1}
  - {label: dies, stage: 2, steps: 6, fault: "1:2"}
  - {label: cancelme, stage: 0, steps: 100000}
"""


def test_sweep_with_slurm_launcher(slurm_env, tmp_path):
    (tmp_path / "s.yaml").write_text(SUBMIT)
    out = tmp_path / "out"
    cmd = [
        sys.executable,
        "-m",
        "zerobench",
        "sweep",
        str(tmp_path / "s.yaml"),
        "--launcher",
        "slurm",
        "--out",
        str(out),
        "--no-progress",
    ]
    proc = subprocess.Popen(cmd, env=slurm_env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    cancelled = False
    while time.monotonic() < deadline and not cancelled:
        q = run(["squeue", "-h", "-o", "%i|%j|%T"], slurm_env).stdout
        for line in q.splitlines():
            jid, name, state = line.split("|")
            if "cancelme" in name and state == "RUNNING":
                run(["scancel", jid], slurm_env)
                cancelled = True
        time.sleep(0.5)
    assert cancelled, "the long job never started"
    stdout, stderr = proc.communicate(timeout=600)
    assert proc.returncode == 1, stdout + stderr
    st = load(out)
    st = st[st["metric"] == "run_status"].set_index("label")
    assert st.loc["good", "status"] == "ok" and st.loc["good", "slurm_state"] == "COMPLETED"
    assert st.loc["dies", "status"] == "failed" and "FAILED" in st.loc["dies", "reason"]
    assert st.loc["dies", "reason"].startswith("rank 1 exited with code 17")  # not the step's SIGTERM code
    assert st.loc["cancelme", "status"] == "cancelled" and st.loc["cancelme", "slurm_state"] == "CANCELLED"
    # --resume resubmits only what did not complete
    r = run([*cmd[:-1], "--resume", "--no-progress", "--only", "label=good", "--allow-failures"], slurm_env)
    assert r.returncode == 0 and "1 skipped" in r.stdout, r.stdout + r.stderr


def test_script_fails_fast_outside_slurm_or_without_suite(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    r = subprocess.run(["bash", "slurm/scale_400gpu.sh"], env=env, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "not inside a Slurm job" in r.stderr
    r = subprocess.run(
        ["bash", "slurm/scale_400gpu.sh"],
        env={**env, "SLURM_JOB_ID": "1", "SUITE": "no/such"},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "suite 'no/such' not found" in r.stderr
    dots = tmp_path / "...yaml"  # its results directory would be results/../<job>: outside results/
    dots.write_text("name: dots\nbase: {preset: tiny}\nruns: [{label: a}]\n")
    r = subprocess.run(
        ["bash", "slurm/scale_400gpu.sh"],
        env={**env, "SLURM_JOB_ID": "1", "SUITE": str(dots)},
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert r.returncode == 2 and "suite file name '..' cannot name a results directory" in r.stderr, r.stderr
    r = subprocess.run(["bash", "slurm/run_one.sh", "x.json"], env=env, cwd=REPO, capture_output=True, text=True)
    assert r.returncode == 2 and "not inside a Slurm job" in r.stderr


def test_scripts_are_shellcheck_clean():
    scripts = sorted(str(p) for p in (REPO / "slurm").rglob("*.sh"))
    for s in scripts:
        assert subprocess.run(["bash", "-n", s]).returncode == 0, s
    if not shutil.which("shellcheck"):
        pytest.skip("shellcheck is not installed: run tests/setup-tools.sh (as root)")
    r = subprocess.run(["shellcheck", *scripts, str(REPO / "tests" / "setup-tools.sh")], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout


def test_start_is_idempotent(slurm_env):
    r = subprocess.run(
        ["bash", str(REPO / "slurm/local/start.sh")], env=slurm_env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0 and "already running" in r.stdout
    info = json.dumps(run(["sinfo", "-h", "-N", "-o", "%N %t"], slurm_env).stdout.split())
    assert "n1" in info and "n2" in info


def test_sbatch_launcher_runs_a_job_and_reports_how_it_ended(slurm_env, tmp_path, monkeypatch):
    """The sbatch launcher behind the common Launcher interface: a good run ends ok with its rows, a
    planted dying rank ends failed with Slurm's state in the reason."""
    from zerobench.bench.spec import RunSpec, to_train_config
    from zerobench.launch.base import LaunchRequest
    from zerobench.launch.launchers import get_launcher
    from zerobench.results.rows import read_rows

    for k, v in slurm_env.items():
        monkeypatch.setenv(k, v)
    cfg = to_train_config(RunSpec(dp=2, steps=2, warmup=0))
    launcher = get_launcher("sbatch")
    launcher.poll_s = 0.5
    good = tmp_path / "good"
    good.mkdir()
    res = launcher.launch(LaunchRequest(cfg, good, "good", 240, good / "run.log"))
    assert res.ok and res.status == "ok", res
    assert any(r["metric"] == "loss" for r in read_rows(good))
    bad = tmp_path / "bad"
    bad.mkdir()
    res = launcher.launch(
        LaunchRequest(
            to_train_config(RunSpec(dp=2, steps=4, warmup=0)),
            bad,
            "bad",
            240,
            bad / "run.log",
            extra_env={FAULT_ENV: "1:1"},
        )
    )
    assert not res.ok and res.status == "failed" and "FAILED" in res.reason, res


FAILING = """
name: failing
base: {preset: tiny, dp: 2, stage: 1, steps: 4, warmup: 1, timeout: 180, collective_timeout: 30}
runs:
  - {label: oom, fault: "1:2:oom"}
  - {label: dies, fault: "1:2"}
  - {label: full-disk, fault: "1:2:enospc"}
  - {label: after-full-disk}
"""


def _scale_job(slurm_env, tmp_path, suite: str, *extra: str):
    (tmp_path / "s.yaml").write_text(suite)
    env = {**slurm_env, "SUITE": str(tmp_path / "s.yaml"), "ZEROBENCH_RESULTS": str(tmp_path / "results")}
    cmd = ["sbatch", "--parsable", "--nodes=2", "--ntasks-per-node=2", "--gpus-per-node=2", "--cpus-per-task=1"]
    cmd += [f"--output={tmp_path}/job-%j.out", *extra, "slurm/scale_400gpu.sh"]
    r = run(cmd, env)
    job = r.stdout.strip().split(";")[0]
    assert job.isdigit(), r.stderr  # with --wait sbatch exits as the job did: the caller judges that
    return job, env


def _statuses(out: Path) -> dict[str, tuple[str, str]]:
    df = load(out)
    st = df[df["metric"] == "run_status"]
    return {rid: (s, reason) for rid, s, reason in zip(st["run_id"], st["status"], st["reason"].fillna(""))}


def _wait(cond, what: str, timeout: float = 300):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def test_srun_steps_blame_the_first_failing_rank_with_its_own_code(slurm_env, tmp_path):
    """Under srun a failed step exited 143 whatever its failing task returned (--kill-on-bad-exit ends the rest
    with SIGTERM): an OOM read as 'failed, code 143', and a full disk did not stop the sweep. Each rank now says how
    it ended in a file of its own, and the first to fail is blamed with its own code and line."""
    job, _ = _scale_job(slurm_env, tmp_path, FAILING, "--wait")
    st = _statuses(tmp_path / "results" / "s" / job)
    assert st["000-oom"][0] == "oom" and st["000-oom"][1].startswith("rank 1 ran out of memory"), st
    assert st["001-dies"] == ("failed", "rank 1 exited with code 17"), st
    assert st["002-full-disk"][0] == "failed" and "rank 1 could not write its results" in st["002-full-disk"][1], st
    assert "003-after-full-disk" not in st  # the disk is full: the sweep stops, as it does on local ranks
    text = (tmp_path / f"job-{job}.out").read_text()
    assert "results could not be written, the sweep stopped" in text, text[-2000:]


LONG = """
name: long
base: {preset: tiny, dp: 2, stage: 1, warmup: 1, timeout: 600}
runs:
  - {label: quick, steps: 3}
  - {label: long, steps: 100000}
"""


def test_a_requeued_job_resumes_and_a_cancelled_step_reads_cancelled(slurm_env, tmp_path):
    """A requeued job keeps its id and so its directory: it died at once ('already holds result rows') and the rest
    of the sweep was lost. It now resumes. A step stopped by scancel read 'failed, code 143'; it reads cancelled."""
    job, env = _scale_job(slurm_env, tmp_path, LONG, "--requeue")
    out = tmp_path / "results" / "s" / job
    _wait(
        lambda: (out / "001-long" / "run.log").is_file() and "loss" in (out / "001-long" / "run.log").read_text(),
        "the long run's first steps",
    )
    assert run(["scontrol", "requeue", job], env).returncode == 0
    _wait((out / "001-long-r2" / "run.log").is_file, "the requeued job's attempt at the long run")
    run(["scancel", job], env)
    _wait(lambda: "001-long-r2" in _statuses(out), "the cancelled attempt's status row", 120)
    st = _statuses(out)
    assert st["000-quick"][0] == "ok" and "000-quick-r2" not in st, st  # done once, skipped on the restart
    assert st["001-long-r2"][0] == "cancelled", st
    assert st.get("001-long", ("cancelled", ""))[0] == "cancelled", st  # the requeue's SIGTERM, if it was recorded


REFUSED = """
name: refused
base: {preset: tiny, steps: 3, warmup: 1, timeout: 300}
runs:
  - {label: too-many-tasks, stage: 0, dp: 64}
  - {label: good, stage: 1, dp: 2}
"""


def test_a_job_sbatch_refuses_is_a_row_and_the_sweep_goes_on(slurm_env, tmp_path):
    """sbatch refusing one job ('More processors requested than permitted') ended the whole sweep: the jobs already
    submitted read incomplete, the later runs were never submitted, and the refused one had no row."""
    (tmp_path / "s.yaml").write_text(REFUSED)
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "zerobench", "sweep", str(tmp_path / "s.yaml"), "--launcher", "slurm"]
    r = run([*cmd, "--out", str(out), "--no-progress"], slurm_env, timeout=600)
    assert r.returncode == 1, r.stdout + r.stderr
    assert "the jobs request no GPUs and run on CPU" in r.stderr
    st = _statuses(out)
    assert st["000-too-many-tasks"][0] == "invalid" and "sbatch" in st["000-too-many-tasks"][1], st
    assert st["001-good"][0] == "ok", st


QUEUED = """
name: queued
base: {preset: tiny, dp: 2, steps: 3, warmup: 1, timeout: 300}
runs:
  - {label: a, stage: 1}
  - {label: b, stage: 2}
"""


def _queued(env, prefix: str) -> dict[str, str]:
    """The job id -> state of this test's jobs still in the queue (job names ``zb-<run id>``)."""
    out = run(["squeue", "-h", "-o", "%i|%j|%T"], env).stdout
    return {j: s for j, n, s in (line.split("|") for line in out.splitlines()) if n.startswith(prefix)}


def test_queued_jobs_are_the_sweeps_own(slurm_env, tmp_path):
    """A job pending forever kept the sweep waiting forever, and a sweep stopped by SIGINT left its queued jobs to
    run unobserved (and ``--resume`` would submit those runs again). Now a job pending past ``--pending-limit`` is
    scancelled and recorded as a timeout with Slurm's reason, and SIGINT scancels every job the sweep tracks and
    records it as cancelled."""
    (tmp_path / "s.yaml").write_text(QUEUED)
    cmd = [sys.executable, "-m", "zerobench", "sweep", str(tmp_path / "s.yaml"), "--launcher", "slurm", "--no-progress"]
    assert run(["scontrol", "update", "PartitionName=debug", "State=DOWN"], slurm_env).returncode == 0
    try:
        out = tmp_path / "limit"
        r = run([*cmd, "--out", str(out), "--pending-limit", "3", "--only", "label=a"], slurm_env, timeout=300)
        assert r.returncode == 1, r.stdout + r.stderr
        ((status, reason),) = _statuses(out).values()
        assert status == "timeout" and "still pending after 3s" in reason and "PartitionDown" in reason, reason
        assert _queued(slurm_env, "zb-000-a") == {}

        out = tmp_path / "interrupted"
        proc = subprocess.Popen(
            [*cmd, "--out", str(out)],
            env=slurm_env,
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        _wait(lambda: len(_queued(slurm_env, "zb-00")) == 2, "both jobs queued")
        proc.send_signal(subprocess.signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 143 and "2 job(s) scancelled" in stderr, stdout + stderr
        st = _statuses(out)
        assert sorted(s for s, _ in st.values()) == ["cancelled", "cancelled"], st
        assert all("SIGINT" in why for _, why in st.values()), st
        assert _queued(slurm_env, "zb-00") == {}
    finally:
        run(["scontrol", "update", "PartitionName=debug", "State=UP"], slurm_env)
