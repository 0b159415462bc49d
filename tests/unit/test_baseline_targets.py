"""``regress --write-baseline FILE`` and ``--propose FILE`` replace FILE whole. Before, any existing file was
replaced without a word: another run's ``rows.jsonl``, a text file. Now an existing file must be a baseline (or
proposal) this command wrote, and no baseline is named ``rows.jsonl`` (every reader of a directory would take it for
a run's rows); anything else is one line, exit 2, the file as it was. Re-recording a baseline in place, and a
gate's default proposal beside its candidate run after run, keep working."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.unit.test_bad_inputs import assert_one_line, run

REPO = Path(__file__).resolve().parents[2]
BASELINE = REPO / "results" / "baselines" / "cpu-2core.jsonl"
RUN = REPO / "results" / "reference" / "quick-cpu-2core" / "000-stage-0-dp-1"


def _write_baseline(target: Path) -> list[str]:
    return ["regress", "--candidate", str(BASELINE), "--write-baseline", str(target)]


def _propose(target: Path) -> list[str]:
    argv = ["regress", "--baseline", str(BASELINE), "--candidate", str(BASELINE), "--timing", "report"]
    return [*argv, "--propose", str(target)]


COMMANDS = {"--write-baseline": _write_baseline, "--propose": _propose}


@pytest.fixture
def victims(tmp_path) -> dict[str, tuple[Path, str]]:
    """Files no baseline may replace, each with the phrase its refusal says."""
    run_dir = tmp_path / "run"
    shutil.copytree(RUN, run_dir)
    renamed = tmp_path / "run-rows.jsonl"  # a run's rows under another name: still no baseline
    shutil.copy(RUN / "rows.jsonl", renamed)
    notes = tmp_path / "notes.txt"
    notes.write_text("notes\n")
    return {
        "a run's rows.jsonl": (run_dir / "rows.jsonl", "named rows.jsonl"),
        "a run's rows, renamed": (renamed, "which no baseline holds"),
        "a text file": (notes, "line 1 is not a JSON row"),
    }


@pytest.mark.parametrize("flag", COMMANDS)
@pytest.mark.parametrize("victim", ["a run's rows.jsonl", "a run's rows, renamed", "a text file"])
def test_an_existing_file_that_is_no_baseline_is_refused_and_kept(flag, victim, victims, capsys):
    path, needle = victims[victim]
    before = path.read_bytes()
    code, err = run(COMMANDS[flag](path), capsys)
    assert_one_line(code, err, f"{flag} {path}")
    assert needle in err, err
    assert path.read_bytes() == before


@pytest.mark.parametrize("flag", COMMANDS)
def test_a_new_file_named_rows_jsonl_is_refused(flag, tmp_path, capsys):
    """Not only over a run's rows: in a fresh directory too, which every reader would then take for a run."""
    path = tmp_path / "fresh" / "rows.jsonl"
    code, err = run(COMMANDS[flag](path), capsys)
    assert_one_line(code, err, "name it otherwise")
    assert not path.parent.exists()


@pytest.mark.parametrize("flag", COMMANDS)
def test_a_baseline_is_rewritten_in_place(flag, tmp_path, capsys):
    """Baselines are refreshed per commit: the file written before (by either command) is replaced."""
    path = tmp_path / "base.jsonl"
    for write in (_write_baseline, COMMANDS[flag], COMMANDS[flag]):
        code, err = run(write(path), capsys)
        assert code == 0, err
    assert path.read_text() == BASELINE.read_text()  # the committed baseline, written back as it was


def test_the_default_proposal_is_rewritten_but_never_replaces_another_file(tmp_path, capsys):
    """The proposal goes to ``proposed-baseline.jsonl`` beside the candidate, where readers of the run do not read
    it: a second gate run replaces the first's; a file of that name that is no proposal is refused."""
    cand = tmp_path / "cand"
    shutil.copytree(RUN, cand)
    base = tmp_path / "base.jsonl"
    assert run(["regress", "--candidate", str(cand), "--write-baseline", str(base)], capsys)[0] == 0
    argv = ["regress", "--baseline", str(base), "--candidate", str(cand), "--timing", "report"]
    for _ in range(2):
        code, err = run(argv, capsys)
        assert code == 0, err
    proposal = cand / "proposed-baseline.jsonl"
    assert proposal.read_text() == base.read_text()
    proposal.write_text("notes\n")
    code, err = run(argv, capsys)
    assert_one_line(code, err, f"{proposal} already exists and is not a baseline")
    assert "give --propose FILE" in err and proposal.read_text() == "notes\n"
