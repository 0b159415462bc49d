"""The regression gate's verdict rows (``regress --out``) beside the runs they judge: ``results show`` listed them as a
run with no status, and the report counted them as one more run in its provenance line."""

from __future__ import annotations

import shutil
from pathlib import Path

from zerobench.cli import main

REPO = Path(__file__).resolve().parents[2]
HISTORY = REPO / "results/reference/gate-history-cpu-2core"


def test_verdicts_are_named_not_counted(tmp_path, capsys):
    both = tmp_path / "both"
    shutil.copytree(HISTORY / "1", tmp_path / "base")
    shutil.copytree(HISTORY / "2", both / "cand")
    assert main(["regress", "--write-baseline", str(tmp_path / "b.jsonl"), "--candidate", str(tmp_path / "base")]) == 0
    main(
        [
            "regress",
            "--baseline",
            str(tmp_path / "b.jsonl"),
            "--candidate",
            str(both / "cand"),
            "--out",
            str(both / "g"),
        ]
    )
    assert (both / "g" / "rows.jsonl").is_file()
    capsys.readouterr()
    assert main(["results", "show", str(both)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert not any(line.split()[0] == "gate" for line in lines[1:-1]), lines
    assert lines[-1] == "not a run: 1 set of regression-gate verdicts (regress --out)"
    assert main(["report", str(both), "--out", str(tmp_path / "r")]) == 0
    provenance = (tmp_path / "r" / "summary.md").read_text().splitlines()[2]
    assert provenance.endswith(" · 1 runs"), provenance
