"""An output directory belongs to one writer at a time: sweeps, train and maxsize hold its lock for their whole
life; a second writer is one line naming the holder; the kernel frees the lock of a killed holder; a resume
takes only its own suite's directory; names never lead outside runs/."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.e2e.test_cli_train import zb
from zerobench.results.lock import LOCK_FILE, claim
from zerobench.results.rows import RowWriter

pytestmark = pytest.mark.dist
TINY_SUITE = "name: {name}\nbase: {{preset: tiny, steps: 2, warmup: 0, dp: 1}}\nruns: [{{label: a}}]\n"


def one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.strip().splitlines() if not ln.startswith("zerobench: warning")]
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


def suite_file(tmp_path: Path, name: str = "tiny") -> Path:
    p = tmp_path / f"{name}.yaml"
    p.write_text(TINY_SUITE.format(name=name))
    return p


def rows_under(out: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(out.rglob("rows.jsonl")) for line in f.read_text().splitlines()]


def test_a_held_directory_refuses_sweep_train_and_maxsize_naming_the_holder(tmp_path):
    out = tmp_path / "out"
    with claim(out):  # this test process is the holder
        for args in (
            ["sweep", str(suite_file(tmp_path)), "--out", str(out), "--no-progress"],
            ["train", "--preset", "tiny", "--steps", "1", "--out", str(out)],
            ["maxsize", "--budget", "64MiB", "--stage", "0", "--dp", "1", "--out", str(out)],
            ["maxsize", "--budget", "64MiB", "--stage", "0", "--dp", "1", "--probes", str(out)],
        ):
            r = zb(*args, timeout=120)
            line = one_line(r.stderr)
            assert r.returncode == 2, r.stderr
            flag = "--probes" if "--probes" in args else "--out"
            assert f"{flag} {out} is in use by another zerobench (pid {os.getpid()}" in line, line
        assert not list(out.rglob("rows.jsonl")) and not list(out.glob("0*"))
    assert not (out / LOCK_FILE).exists()  # a holder that ends removes its lock file


def test_one_process_cannot_claim_a_directory_twice(tmp_path):
    with claim(tmp_path / "d"), pytest.raises(Exception, match=f"pid {os.getpid()}"):
        claim(tmp_path / "d")
    with claim(tmp_path / "d"):  # released: free again
        pass


@pytest.mark.slow
def test_two_sweeps_started_together_into_one_out(tmp_path):
    suite, out = suite_file(tmp_path), tmp_path / "out"
    cmd = [sys.executable, "-m", "zerobench", "sweep", str(suite), "--out", str(out), "--no-progress"]
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    results = [(p.pid, *p.communicate(timeout=300), p.returncode) for p in procs]
    codes = sorted(code for *_, code in results)
    assert codes == [0, 2], results
    (winner, *_), (_, _, err, _) = (next(r for r in results if r[3] == 0), next(r for r in results if r[3] == 2))
    assert f"is in use by another zerobench (pid {winner}: zerobench sweep" in one_line(err), err
    rows = rows_under(out)
    status = [r for r in rows if r["metric"] == "run_status"]
    assert [r["status"] for r in status] == ["ok"]
    keys = [(r["run_id"], r["metric"], r.get("step"), r.get("rank"), r.get("phase")) for r in rows]
    assert len(keys) == len(set(keys)), "duplicate (run, metric, step, rank, phase) rows"


def test_a_killed_holder_leaves_no_lock_behind(tmp_path):
    out = tmp_path / "out"
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            (
                "import sys, time\nfrom zerobench.results.lock import claim\nclaim(sys.argv[1])\n"
                "print('held', flush=True)\ntime.sleep(600)\n"
            ),
            str(out),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert holder.stdout.readline().strip() == "held"
    r = zb("sweep", str(suite_file(tmp_path)), "--out", str(out), "--no-progress", timeout=120)
    assert r.returncode == 2 and f"pid {holder.pid}" in one_line(r.stderr)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    assert f'"pid": {holder.pid}' in (out / LOCK_FILE).read_text()  # left behind, naming a dead process
    with claim(out):  # not obeyed: the kernel dropped the dead holder's lock
        assert f'"pid": {os.getpid()}' in (out / LOCK_FILE).read_text()
    assert not (out / LOCK_FILE).exists()


@pytest.mark.slow
def test_train_under_torchrun_locks_once_for_all_its_ranks(tmp_path):
    """Every rank is a ``zerobench train`` process; global rank 0 holds the lock, so no rank refuses its peers."""
    out = tmp_path / "run"
    base = {
        "WORLD_SIZE": "2",
        "LOCAL_WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(29000 + os.getpid() % 1000),
    }
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "zerobench",
                "train",
                "--preset",
                "tiny",
                "--steps",
                "2",
                "--warmup",
                "0",
                "--out",
                str(out),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, **base, "RANK": str(r), "LOCAL_RANK": str(r)},
        )
        for r in range(2)
    ]
    results = [(*p.communicate(timeout=300), p.returncode) for p in procs]
    assert [code for *_, code in results] == [0, 0], results
    assert {r.get("rank") for r in rows_under(out)} >= {0, 1}  # both ranks wrote their rows
    assert not (out / LOCK_FILE).exists()


def test_resume_with_another_suite_is_refused(tmp_path):
    out = tmp_path / "out"
    RowWriter(out / "000-a", "000-a", {"a": 1}, suite="first").write("run_status", 1, "bool", label="a")
    r = zb("sweep", str(suite_file(tmp_path, "second")), "--out", str(out), "--resume", "--no-progress", timeout=120)
    line = one_line(r.stderr)
    assert r.returncode == 2, r.stderr
    assert f"--out {out} holds the rows of suite 'first', not of suite 'second'" in line, line
    assert len(rows_under(out)) == 1 and not (out / "000-a-r2").exists()
    train_out = tmp_path / "train-out"
    RowWriter(train_out, "t", {"a": 1}).write("loss", 1.0, "nats")  # a zerobench train run's rows
    r = zb(
        "sweep", str(suite_file(tmp_path, "second")), "--out", str(train_out), "--resume", "--no-progress", timeout=120
    )
    assert r.returncode == 2 and "holds the rows of a run of no suite (zerobench train)" in one_line(r.stderr)


def test_names_that_would_leave_runs_are_refused(tmp_path):
    cwd = tmp_path / "a" / "b"
    cwd.mkdir(parents=True)
    for name in ("../../X", str(tmp_path / "abs")):
        suite = cwd / "s.yaml"
        suite.write_text(TINY_SUITE.format(name=json.dumps(name)))
        r = subprocess.run(
            [sys.executable, "-m", "zerobench", "sweep", "s.yaml", "--no-progress"],
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert r.returncode == 2 and f"suite name {name!r} is a path" in one_line(r.stderr), r.stderr
    r = subprocess.run(
        [sys.executable, "-m", "zerobench", "train", "--preset", "tiny", "--steps", "1", "--run-id", "../../escaped"],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 2 and "--run-id '../../escaped' is a path" in one_line(r.stderr), r.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["a", "b", "s.yaml"]  # nothing written anywhere


@pytest.mark.slow
def test_an_explicit_out_may_be_anywhere(tmp_path):
    out = tmp_path / ".hidden" / "out"  # --out is the user's path, not a name under runs/
    r = zb("train", "--preset", "tiny", "--steps", "1", "--warmup", "0", "--run-id", "r-1", "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert {x["run_id"] for x in rows_under(out)} == {"r-1"}


def test_the_lock_names_a_holder_that_has_not_written_its_pid_yet(tmp_path, monkeypatch):
    import fcntl

    from zerobench.config import ConfigError
    from zerobench.results import lock

    out = tmp_path / "out"
    out.mkdir()
    fd = os.open(out / LOCK_FILE, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)  # locked, nothing recorded yet
    monkeypatch.setattr(lock, "HOLDER_WAIT_S", 0.2)
    t0 = time.monotonic()
    with pytest.raises(ConfigError, match="pid unknown"):
        claim(out)
    assert time.monotonic() - t0 < 5
    os.close(fd)


def test_a_lock_file_that_is_a_link_is_refused_and_its_target_untouched(tmp_path):
    """``DIR/.zerobench.lock`` planted as a symbolic link: the claim opened it through the link and wrote the holder's
    record over the target, outside the directory, then removed the link (a helper's review)."""
    from zerobench.config import ConfigError

    target = tmp_path / "precious.txt"
    target.write_text("mine")
    out = tmp_path / "out"
    out.mkdir()
    (out / LOCK_FILE).symlink_to(target)
    with pytest.raises(ConfigError, match=r"lock file .* is a symbolic link; remove it"):
        claim(out)
    assert target.read_text() == "mine" and (out / LOCK_FILE).is_symlink()
    (out / LOCK_FILE).unlink()
    os.mkfifo(out / LOCK_FILE)
    with pytest.raises(ConfigError, match=r"lock file .* is not a regular file: remove it"):
        claim(out)


def test_report_and_history_files_replace_a_link_instead_of_writing_through_it(tmp_path):
    """``history.md``, ``index.html``, ``summary.md`` and the figures were written through a link planted at their
    name, overwriting its target; they are replaced whole."""
    from zerobench.report.render import render
    from zerobench.results.rows import read_rows

    base = Path(__file__).resolve().parents[2] / "results" / "baselines" / "cpu-2core.jsonl"
    rows = tmp_path / "in"
    rows.mkdir()
    (rows / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in read_rows(base)))
    out = tmp_path / "report"
    out.mkdir()
    target = tmp_path / "precious.txt"
    target.write_text("mine")
    for name in ("index.html", "summary.md"):
        (out / name).symlink_to(target)
    render([str(rows)], str(out))
    assert target.read_text() == "mine"
    assert not any((out / n).is_symlink() for n in ("index.html", "summary.md"))
    figs = list(out.glob("figures-*/*.png"))  # drawn into a directory of the report's own making
    assert figs and not any(f.is_symlink() for f in figs)


def test_a_backslash_in_a_slurm_sweep_s_out_is_refused_before_anything(tmp_path):
    """sbatch's ``--output`` reads a backslash as "no patterns here" and drops it: the job's log would go to a sibling
    directory, with ``%j`` unexpanded, and a failed run would lose its blamed rank (a helper's review)."""
    out = tmp_path / "a\\b"
    r = zb("sweep", str(suite_file(tmp_path)), "--launcher", "slurm", "--out", str(out))
    assert r.returncode == 2 and "a backslash in the path turns off Slurm's log file patterns" in one_line(r.stderr)
    assert not out.exists()
