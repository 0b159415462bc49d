"""What a sweep's directory may hold before it runs anything: not inside another sweep, a resumed plan that is
readable and this suite's, no configuration measured again under a new label; and what its readers refuse in one
line instead of a traceback (found by a review that ran each case)."""

from __future__ import annotations

import errno
import json
from pathlib import Path

import pytest

from zerobench.bench import suite as suites
from zerobench.bench.sweep_state import PLAN_FILE, check_out, check_resumed, record_plan
from zerobench.cli import main
from zerobench.config import ConfigError
from zerobench.results.rows import run_hash


def suite_file(tmp_path: Path, label: str = "a", steps: int = 3, name: str = "one", **top) -> Path:
    path = tmp_path / f"{name}-{label}-{steps}.yaml"
    extra = "".join(f"{k}: {json.dumps(v)}\n" for k, v in top.items())
    path.write_text(
        f"name: {name}\n{extra}base:\n  preset: tiny\n  steps: {steps}\n  warmup: 1\n  dp: 1\nruns:\n  - label: {label}\n"
    )
    return path


def done_of(s) -> set[tuple[str, str]]:
    return {(r.label, run_hash(r.config)) for r in s.runs}


def test_a_sweep_inside_another_sweep_s_directory_is_refused(tmp_path):
    outer = tmp_path / "o1"
    outer.mkdir()
    record_plan(outer, suites.load(suite_file(tmp_path)), resume=False)
    with pytest.raises(ConfigError, match=r"inside the sweep .*o1 \(it holds sweep-plan\.json\)"):
        check_out(outer / "nested" / "deeper", resume=False, suite="one")
    check_out(tmp_path / "beside", resume=False, suite="one")  # a directory of its own is fine


@pytest.mark.parametrize(
    "plan, words",
    [
        ('{"suite": "one", "runs": [', r"is damaged \(JSONDecodeError\)"),
        ('{"suite": "one", "runs": 3}', r"is damaged \(TypeError\)"),
        ('{"suite": "other", "runs": []}', r"is the plan of suite 'other', not of suite 'one'"),
    ],
)
def test_a_resumed_sweep_keeps_a_plan_it_cannot_read_or_that_is_another_suite_s(tmp_path, plan, words):
    """It was replaced by the current runs alone (a damaged one), or adopted under this suite's name (another
    suite's): which runs the sweep set out to measure was lost."""
    (tmp_path / PLAN_FILE).write_text(plan)
    with pytest.raises(ConfigError, match=words):
        record_plan(tmp_path, suites.load(suite_file(tmp_path)), resume=True)
    assert (tmp_path / PLAN_FILE).read_text() == plan


def test_a_resumed_plan_keeps_the_runs_planned_before(tmp_path):
    record_plan(tmp_path, suites.load(suite_file(tmp_path, label="a")), resume=False)
    record_plan(tmp_path, suites.load(suite_file(tmp_path, label="b", steps=4)), resume=True)
    assert [r["label"] for r in json.loads((tmp_path / PLAN_FILE).read_text())["runs"]] == ["a", "b"]


def test_a_configuration_measured_under_another_label_is_not_measured_again(tmp_path):
    done = done_of(suites.load(suite_file(tmp_path, label="a")))
    with pytest.raises(ConfigError, match=r"run 'b' is the configuration this sweep measured as 'a'"):
        check_resumed(suites.load(suite_file(tmp_path, label="b")), done)
    assert check_resumed(suites.load(suite_file(tmp_path, label="a")), done) == []  # resumed as it was
    # a label whose definition changed is a new run, and named for the note
    assert check_resumed(suites.load(suite_file(tmp_path, label="a", steps=4)), done) == ["a"]


def test_two_entries_of_one_configuration_in_the_suite_itself_resume(tmp_path):
    path = tmp_path / "twice.yaml"
    path.write_text("name: one\nbase:\n  preset: tiny\n  steps: 3\n  dp: 1\nruns:\n  - label: a\n  - label: b\n")
    s = suites.load(path)
    first = {(r.label, run_hash(r.config)) for r in s.runs if r.label == "a"}
    assert check_resumed(s, first) == []


@pytest.mark.parametrize("key, value", [("cluster", [1]), ("description", [1]), ("source", {"a": 1})])
def test_a_suite_s_informational_keys_of_the_wrong_kind_are_one_line(tmp_path, key, value):
    with pytest.raises(ConfigError, match=rf"'{key}' must be a"):
        suites.load(suite_file(tmp_path, **{key: value}))


def test_an_empty_base_list_is_refused_not_read_as_an_empty_mapping(tmp_path):
    path = tmp_path / "s.yaml"
    path.write_text("name: one\nbase: []\nruns:\n  - label: a\n")
    with pytest.raises(ConfigError, match="'base' must be a mapping"):
        suites.load(path)


def test_a_run_row_beyond_a_number_s_range_is_one_line(tmp_path):
    from zerobench.results.rows import read_rows

    row = {"metric": "step_time_s", "value": 10**400, "run_id": "r", "unit": "s", "config_hash": "h"}
    (tmp_path / "rows.jsonl").write_text(json.dumps(row) + "\n")
    with pytest.raises(ConfigError, match=r"rows\.jsonl:1: .*'value' is beyond a number's range"):
        read_rows(tmp_path)


def test_a_non_finite_count_shows_as_missing():
    from zerobench.results.show import _count

    assert _count(float("inf")) is None and _count(float("nan")) is None and _count(3.0) == 3


def test_a_label_that_looks_like_rich_markup_is_shown_as_text(capsys):
    """A label ``a[/]`` raised rich's MarkupError in the bar's refresh thread (the bar stopped), and ``[red]x``
    was drawn as red ``x``."""
    from zerobench.bench.progress import Progress

    with Progress(1, enabled=True) as bar:
        bar.start("a[/] [red]x", Path("/nonexistent"))
        bar._progress.refresh()  # rendered here, in this thread, where an error would raise
    assert "a[/] [red]x starting" in capsys.readouterr().out


def test_a_launch_that_cannot_write_its_own_files_is_a_full_disk_outcome(monkeypatch):
    """A full disk while the launcher wrote the ranks' config or its log was a traceback, and the sweep recorded no
    status for the run; it is now the run's outcome, with the code that stops a sweep on a full disk."""
    from zerobench.launch import local
    from zerobench.launch.base import EXIT_IO
    from zerobench.train.config import TrainConfig

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", "/tmp/zerobench-launch-x")

    monkeypatch.setattr(local.tempfile, "TemporaryDirectory", full)
    res = local.launch_local(TrainConfig(), None, run_id="r")
    assert not res.ok and res.status == "failed" and res.returncodes == [EXIT_IO]
    assert res.reason.startswith("the launch could not write its files: No space left on device")


def test_a_resume_does_not_record_an_invalid_run_again(tmp_path):
    """Each resume added one more attempt of a run that never starts (``001-bad-r2``, ``-r3``, ...); it is still
    counted as failed."""
    from zerobench.bench.progress import Progress
    from zerobench.bench.sweep_state import SweepSummary, should_run

    path = tmp_path / "inv.yaml"
    path.write_text("name: inv\nbase:\n  preset: tiny\n  steps: 3\n  dp: 1\nruns:\n  - label: bad\n    tp: 3\n")
    (bad,) = suites.load(path).runs
    assert bad.config is None
    out = tmp_path / "out"
    for done in (None, set(), set()):  # the sweep, then two resumes
        summary = SweepSummary()
        with Progress(1, enabled=False) as bar:
            assert not should_run(bad, out, suites.load(path), summary, bar, done)
        assert summary.failed_status == {"bad": "invalid"}
    assert sorted(p.name for p in out.iterdir()) == ["000-bad"]


def _refusal(argv, capsys) -> str:
    """The one line ``argv`` is refused with (exit 2), warnings aside."""
    from tests.unit.test_bad_inputs import assert_one_line, run

    code, err = run(argv, capsys)
    assert_one_line(code, err, "zerobench: error: ")
    return next(ln for ln in err.strip().splitlines() if not ln.startswith("zerobench: warning"))


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        (["--out", "a-file"], "is a file"),
        (["--out", "a-file/sub"], "Not a directory"),
        (["--out", "ran"], "already holds result rows"),
        (["--out", "ran", "--resume"], "holds the rows of suite 'other'"),
        (["--out", "swept/inner"], "is inside the sweep"),
        (["--out", "fresh", "--tensorboard", "a-file"], "--tensorboard a-file is a file"),
        (["--out", "held"], "is in use by another zerobench"),
    ],
    ids=[
        "out a file",
        "out under a file",
        "out holds rows",
        "resume another suite",
        "out in a sweep",
        "tb a file",
        "held",
    ],
)
def test_sweep_check_says_what_the_sweep_would_and_creates_nothing(case, needle, tmp_path, capsys, monkeypatch):
    """``sweep --check`` exited 0 where the sweep refuses its directories: ``--out`` a file, holding rows, inside
    another sweep, ``--resume`` into another suite's, ``--tensorboard`` a file. It now refuses them with the sweep's
    own line, before which the sweep runs nothing, and leaves nothing behind."""
    from zerobench.results.lock import claim

    monkeypatch.chdir(tmp_path)
    suite = suite_file(tmp_path)
    (tmp_path / "a-file").write_text("x")
    ran = tmp_path / "ran" / "000-a"
    ran.mkdir(parents=True)
    row = {"metric": "run_status", "run_id": "000-a", "suite": "other", "status": "ok", "value": 0, "unit": ""}
    (ran / "rows.jsonl").write_text(json.dumps(row) + "\n")
    (tmp_path / "swept").mkdir()
    record_plan(tmp_path / "swept", suites.load(suite_file(tmp_path, name="other")), resume=False)
    (tmp_path / "held").mkdir()
    monkeypatch.setattr("zerobench.bench.runner._run_all", lambda *a, **k: pytest.fail("the sweep ran"))
    with claim(tmp_path / "held"):
        before = _tree(tmp_path)
        line = _refusal(["sweep", str(suite), "--check", *case], capsys)
        assert needle in line, line
        assert _tree(tmp_path) == before
        assert _refusal(["sweep", str(suite), *case], capsys) == line


def test_sweep_check_passes_where_the_sweep_would_start_and_creates_nothing(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    suite = suite_file(tmp_path)
    for argv in (["--out", "new/deeper"], ["--tensorboard", "tb"], []):  # the default: runs/<suite name>
        assert main(["sweep", str(suite), "--check", *argv]) == 0, capsys.readouterr().err
    assert _tree(tmp_path) == [suite.name]
