"""An output path that cannot be written (a file, a path under a file, a read-only directory) is one line and
exit code 2 before any work starts, for every command that writes: never a traceback after the work. So is a
gate's ``--out`` inside one of its inputs, whose rows would be read as that input's.

Each case replaces the command's expensive step with a stub that fails the test if reached, so the check is
shown to come first. The read-only directory is a ``chmod 555`` one for a normal user and ``/sys`` for root
(CI runs as root, whom permission bits do not stop; sysfs refuses new files to everyone).
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest

from tests.unit.test_bad_inputs import run
from zerobench.cli import main

REPO = Path(__file__).resolve().parents[2]
ROWS = REPO / "results" / "baselines" / "cpu-2core.jsonl"


def _cannot_create_in(d: Path) -> bool:
    try:
        (d / ".zerobench-test-probe").touch()
    except OSError:
        return True
    (d / ".zerobench-test-probe").unlink()
    return False


@pytest.fixture
def read_only_dir(tmp_path):
    """An existing directory in which this user cannot create a file."""
    d = tmp_path / "read-only"
    d.mkdir()
    d.chmod(stat.S_IRUSR | stat.S_IXUSR | stat.S_IRGRP | stat.S_IXGRP | stat.S_IROTH | stat.S_IXOTH)
    if not _cannot_create_in(d):  # root: permission bits do not apply
        d = Path("/sys")
        if not (d.is_dir() and _cannot_create_in(d)):
            pytest.skip("no directory here refuses new files to this user")
    yield d
    (tmp_path / "read-only").chmod(stat.S_IRWXU)


@pytest.fixture(params=["a file", "under a file", "read-only directory"])
def bad_dir(request, tmp_path):
    """An output directory that cannot be written, and the phrase its one line says."""
    f = tmp_path / "a-file"
    f.write_text("x")
    if request.param == "a file":
        return f, "is a file"
    if request.param == "under a file":
        return f / "sub", "Not a directory"
    return request.getfixturevalue("read_only_dir"), "cannot write"


@pytest.fixture(params=["a directory", "under a file", "in a read-only directory"])
def bad_file(request, tmp_path):
    """An output file path that cannot be written, and the phrase its one line says."""
    if request.param == "a directory":
        return tmp_path, "is a directory"
    f = tmp_path / "a-file"
    f.write_text("x")
    if request.param == "under a file":
        return f / "out.jsonl", "Not a directory"
    return request.getfixturevalue("read_only_dir") / "out.jsonl", "cannot write"


def unreached(*args, **kwargs):
    raise AssertionError("the command's work started before its output path was checked")


def assert_refused(argv, needle, capsys, flag):
    code, err = run([str(a) for a in argv], capsys)
    lines = [ln for ln in err.strip().splitlines() if not ln.startswith("zerobench: warning")]
    assert code == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert lines[0].startswith("zerobench: error: ") and needle in lines[0] and flag in lines[0], lines[0]


# (argv with {out} where the bad directory goes, the flag the line names, the stubbed step: module, name)
DIR_CASES = {
    "report --out": (["report", ROWS, "--out", "{out}"], "--out", ("zerobench.report.render", "render")),
    "sweep --out": (["sweep", "cpu/quick", "--out", "{out}"], "--out", ("zerobench.bench.runner", "run_sweep")),
    "sweep --tensorboard": (
        ["sweep", "cpu/quick", "--out", "{tmp}/o", "--tensorboard", "{out}"],
        "--tensorboard",
        ("zerobench.bench.runner", "run_sweep"),
    ),
    "maxsize --out": (
        ["maxsize", "--budget", "8MiB", "--out", "{out}"],
        "--out",
        ("zerobench.bench.maxsize", "search_max_layers"),
    ),
    "maxsize --probes": (
        ["maxsize", "--budget", "8MiB", "--probes", "{out}"],
        "--probes",
        ("zerobench.bench.maxsize", "search_max_layers"),
    ),
    "bench-kernels --out": (
        ["bench-kernels", "--numel", "1000", "--rounds", "1", "--out", "{out}"],
        "--out",
        ("zerobench.bench.kernels", "run_adamw_bench"),
    ),
    "zero-to-fp32 OUTPUT_DIR": (
        ["zero-to-fp32", "{tmp}", "{out}"],
        "OUTPUT_DIR",
        ("zerobench.zero.compat.deepspeed.zero_to_fp32", "convert_zero_checkpoint_to_fp32_state_dict"),
    ),
    "train --tensorboard": (
        ["train", "--dp", "1", "--out", "{tmp}/o", "--tensorboard", "{out}"],
        "--tensorboard",
        ("zerobench.launch.worker", "run_rank"),
    ),
    "demo --out": (["demo", "--out", "{out}"], "--out", ("zerobench.demo", "run_sweep")),
    "peers --out": (["peers", "--dp", "1", "--out", "{out}"], "--out", ("zerobench.bench.peers", "run_peers")),
    "regress --ab --out": (
        ["regress", "--ab", "cpu/quick", "--baseline-tree", "{tmp}", "--out", "{out}"],
        "--out",
        ("zerobench.bench.ab", "run_ab"),
    ),
    "train --profile": (
        ["train", "--dp", "1", "--steps", "4", "--warmup", "0", "--out", "{tmp}/o", "--profile", "{out}"],
        "--profile",
        ("zerobench.launch.worker", "run_rank"),
    ),
}


@pytest.mark.parametrize("case", DIR_CASES)
def test_an_unwritable_output_directory_is_refused_first(case, bad_dir, tmp_path, capsys, monkeypatch):
    argv, flag, (module, name) = DIR_CASES[case]
    monkeypatch.setattr(f"{module}.{name}", unreached)
    out, needle = bad_dir
    assert_refused([str(a).format(out=out, tmp=tmp_path) for a in argv], needle, capsys, flag)


def test_regress_write_baseline_that_cannot_be_written_is_refused_first(bad_file, capsys, monkeypatch):
    monkeypatch.setattr("zerobench.bench.regress._rows", unreached)
    path, needle = bad_file
    assert_refused(["regress", "--candidate", ROWS, "--write-baseline", path], needle, capsys, "--write-baseline")


def test_regress_propose_that_cannot_be_written_is_refused_first(bad_file, capsys, monkeypatch):
    monkeypatch.setattr("zerobench.bench.regress.compare", unreached)
    path, needle = bad_file
    assert_refused(["regress", "--baseline", ROWS, "--candidate", ROWS, "--propose", path], needle, capsys, "--propose")


def test_regress_default_proposal_that_cannot_be_written_is_refused_first(tmp_path, capsys, monkeypatch):
    """The proposed baseline goes beside the candidate by default; where it cannot, the line says how to move it."""
    (tmp_path / "rows.jsonl").write_bytes(ROWS.read_bytes())
    (tmp_path / "proposed-baseline.jsonl").mkdir()  # planted: as root too, no file can be written there
    monkeypatch.setattr("zerobench.bench.regress.compare", unreached)
    assert_refused(
        ["regress", "--baseline", ROWS, "--candidate", tmp_path], "is a directory", capsys, "proposed-baseline.jsonl"
    )


def test_a_writable_output_is_used_and_the_probe_file_is_gone(tmp_path, capsys):
    """The check leaves nothing behind: the baseline written where asked, the directories created, no probe."""
    target = tmp_path / "new" / "dir" / "base.jsonl"
    assert main(["regress", "--candidate", str(ROWS), "--write-baseline", str(target)]) == 0
    assert [p.name for p in target.parent.iterdir()] == ["base.jsonl"]
    assert all(json.loads(line)["metric"] for line in target.read_text().splitlines())
    capsys.readouterr()


@pytest.mark.parametrize("side", ["--candidate", "--baseline"])
def test_a_gate_out_inside_its_input_directory_is_refused_first(side, tmp_path, capsys):
    """``--out`` inside a candidate or baseline directory that is no sweep's (CI's ``pr`` holds ``pr/timed`` and
    ``pr/counted``): its verdict rows would be read as that input's rows the next time it is given."""
    from tests.unit.test_bad_inputs import assert_one_line

    inside = tmp_path / "in"
    inside.mkdir()
    (inside / "rows.jsonl").write_text(ROWS.read_text())
    other = {"--candidate": str(ROWS), "--baseline": str(ROWS)}
    other[side] = str(inside)
    argv = ["regress", "--baseline", other["--baseline"], "--candidate", other["--candidate"], "--timing", "report"]
    code, err = run([*argv, "--propose", str(tmp_path / "p.jsonl"), "--out", str(inside / "gate")], capsys)
    assert_one_line(code, err, f"--out {inside / 'gate'} is inside {side} {inside}")
    assert not (inside / "gate").exists()


def test_a_history_out_inside_one_of_its_directories_is_refused_first(tmp_path, capsys):
    from tests.unit.test_bad_inputs import assert_one_line

    inside = tmp_path / "c1"
    inside.mkdir()
    (inside / "rows.jsonl").write_text(ROWS.read_text())
    code, err = run(["regress", "--history", str(inside), str(ROWS), "--out", str(inside / "h")], capsys)
    assert_one_line(code, err, f"--out {inside / 'h'} is inside --history {inside}")
    assert not (inside / "h").exists()
