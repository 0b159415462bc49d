"""A results directory assembled from symbolic links to runs elsewhere: readers took rows with ``Path.rglob``, which
does not follow links to directories, so a linked run's rows were left out of ``results show``, reports and the
gate without a word. ``files_below`` follows them, reads a run reached twice once, and stops at a cycle."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from zerobench.cli import main
from zerobench.results.rows import files_below, read_rows

REPO = Path(__file__).resolve().parents[2]
REFERENCE = REPO / "results/reference/quick-cpu-2core"


def _runs(rows) -> set[str]:
    return {r["run_id"] for r in rows}


def test_linked_run_directories_are_read(tmp_path):
    store = tmp_path / "scratch"
    shutil.copytree(REFERENCE, store)
    runs = sorted(d.name for d in store.iterdir() if (d / "rows.jsonl").is_file())
    gathered = tmp_path / "gathered"
    gathered.mkdir()
    for name in runs[:3]:
        os.symlink(store / name, gathered / name)
    (gathered / "more").symlink_to(store)  # every run again, through a link to their parent
    (store / runs[0] / "loop").symlink_to(tmp_path)  # a link back above the store, and above the root
    elsewhere = tmp_path / "elsewhere" / "999-other"
    elsewhere.mkdir(parents=True)
    shutil.copy(store / runs[0] / "rows.jsonl", elsewhere / "rows.jsonl")
    files = files_below(gathered)
    assert len(files) == len(runs) and len({os.path.realpath(f) for f in files}) == len(runs)
    assert _runs(read_rows(gathered)) == _runs(read_rows(store))
    assert len(read_rows(gathered)) == len(read_rows(store))  # no run's rows read twice, none from elsewhere/
    assert not any("elsewhere" in str(f) for f in files_below(store))


def test_results_show_and_the_report_count_a_linked_run(tmp_path, capsys):
    store = tmp_path / "scratch"
    shutil.copytree(REFERENCE, store)
    run = next(d for d in sorted(store.iterdir()) if (d / "rows.jsonl").is_file())
    gathered = tmp_path / "gathered"
    gathered.mkdir()
    (gathered / run.name).symlink_to(run)
    assert main(["results", "show", str(gathered)]) == 0
    assert run.name in capsys.readouterr().out
    assert main(["report", str(gathered), "--out", str(tmp_path / "r")]) == 0
    provenance = (tmp_path / "r" / "summary.md").read_text().splitlines()[2]
    assert provenance.startswith("**Provenance:**") and provenance.endswith(" · 1 runs"), provenance


def test_a_sweep_refuses_a_directory_whose_only_rows_are_linked(tmp_path, capsys):
    """A writer's check that ``--out`` holds no rows must see linked ones too: the new sweep's rows would otherwise
    read as one sweep with them."""
    store = tmp_path / "scratch"
    shutil.copytree(REFERENCE, store)
    out = tmp_path / "out"
    out.mkdir()
    (out / "old").symlink_to(store)
    assert main(["sweep", "cpu/quick", "--out", str(out), "--only", "stage=0", "--only", "dp=1"]) == 2
    err = capsys.readouterr().err
    assert "already holds result rows" in err


def test_a_root_reached_through_a_link_does_not_read_its_parents_rows(tmp_path, capsys):
    """``results`` is a link to scratch storage, which holds a link back to the checkout: resolving the root alone
    did not see that the link holds ``results`` as given, and rows of the checkout's other directories were read."""
    repo, scratch = tmp_path / "repo", tmp_path / "scratch" / "res"
    shutil.copytree(REFERENCE / "000-stage-0-dp-1", scratch / "000-stage-0-dp-1")
    shutil.copytree(REFERENCE / "001-stage-0-dp-2", repo / "reference" / "001-stage-0-dp-2")
    (repo / "results").symlink_to(scratch)
    (scratch / "repo").symlink_to(repo)
    files = files_below(repo / "results")
    assert [f.relative_to(repo / "results").as_posix() for f in files] == ["000-stage-0-dp-1/rows.jsonl"]
    assert "repo links to a directory holding" in capsys.readouterr().err
