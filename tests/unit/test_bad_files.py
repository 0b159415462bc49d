"""Input files of the wrong shape are one line and exit code 2, naming the file (and the line, for rows):
a suite given as a directory, a suite to plan that is not a mapping of runs, a rows file that is a directory
or holds fields of the wrong type."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.unit.test_bad_inputs import assert_one_line, run
from zerobench.cli import main

REPO = Path(__file__).resolve().parents[2]
ROWS = REPO / "results" / "baselines" / "cpu-2core.jsonl"


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "{d}"],
        ["sweep", "{d}", "--check"],
        ["plan", "--dry-run", "--suite", "{d}"],
        ["sweep", "cpu"],
    ],
    ids=["sweep", "sweep --check", "plan --dry-run --suite", "sweep cpu"],
)
def test_a_suite_that_is_a_directory(argv, tmp_path, capsys):
    (tmp_path / "a.yaml").write_text("name: a\nbase: {preset: tiny}\n")
    code, err = run([a.format(d=tmp_path) for a in argv], capsys)
    assert_one_line(code, err, "is a directory: give one suite YAML file")
    # what to give instead: a suite file of that directory
    assert str(tmp_path / "a.yaml") in err or re.search(r"suites/cpu/\w+\.yaml", err), err


PLAN_SUITES = [
    ("[1, 2]", "a suite to plan is a mapping with a 'runs' list"),
    ("", "a suite to plan is a mapping with a 'runs' list"),
    ("name: x", "a suite to plan is a mapping with a 'runs' list"),
    ("runs: 3", "a suite to plan is a mapping with a 'runs' list"),
    ("runs: [3]", "runs[0] must be a mapping of run keys, got 3"),
    ("base: [1]\nruns: [{layers: 2}]", "'base' and 'cluster' must be mappings"),
    ("cluster: [1]\nruns: [{layers: 2}]", "'base' and 'cluster' must be mappings"),
    ("cluster: {gpus_per_node: x}\nruns: [{layers: 2}]", "gpus_per_node must be an integer, got 'x'"),
    ("runs: [{layers: x}]", "runs[0].layers: expected int, got 'x'"),
    (  # a world that fills no whole number of nodes was planned as given
        "cluster: {gpus_per_node: 7}\nruns: [{layers: 2, hidden: 64, heads: 4, gpus: 400}]",
        "runs[0] (runs[0]): gpus 400 is not a whole number of nodes of gpus_per_node 7",
    ),
    ("cluster: {gpus_per_node: 0}\nruns: [{layers: 2}]", "gpus_per_node must be a positive integer, got 0"),
    ("runs: [{label: [1], layers: 2}]", "runs[0].label: expected str"),
]


@pytest.mark.parametrize(("body", "needle"), PLAN_SUITES, ids=[b for b, _ in PLAN_SUITES])
@pytest.mark.parametrize("mode", [["--dry-run", "--suite"]])
def test_a_suite_to_plan_of_another_shape(body, needle, mode, tmp_path, capsys):
    suite = tmp_path / "p.yaml"
    suite.write_text(body + "\n")
    code, err = run(["plan", *mode, str(suite)], capsys)
    assert_one_line(code, err, needle)
    assert err.startswith(f"zerobench: error: {suite}: "), err


def test_an_unlabelled_run_is_planned_under_its_index(tmp_path, capsys):
    suite = tmp_path / "p.yaml"
    suite.write_text("runs: [{system: zerobench, layers: 2, hidden: 64, heads: 2}]\n")
    assert main(["plan", "--dry-run", "--suite", str(suite), "--json"]) == 0
    assert [r["label"] for r in json.loads(capsys.readouterr().out)["rows"]] == ["runs[0]"]


def _rows_with(tmp_path: Path, change) -> Path:
    rows = [json.loads(line) for line in ROWS.read_text().splitlines()]
    change(rows)
    (tmp_path / "c").mkdir()
    (tmp_path / "c" / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return tmp_path / "c" / "rows.jsonl"


def _set(key, value, where=lambda r: True):
    def change(rows):
        i = next(i for i, r in enumerate(rows) if where(r))
        rows[i][key] = value
        return i

    return change


BAD_ROWS = {
    "value 'abc'": (_set("value", "abc", lambda r: r["metric"] == "step_time_s"), "'value' must be a number or null"),
    "value [1]": (_set("value", [1], lambda r: r["metric"] == "loss"), "'value' must be a number or null"),
    "step 'x'": (_set("step", "x", lambda r: "step" in r), "'step' must be an integer or null, got 'x'"),
    "step 1.5": (_set("step", 1.5, lambda r: "step" in r), "'step' must be an integer or null"),
    "rank 'x'": (_set("rank", "x", lambda r: "rank" in r), "'rank' must be an integer or null"),
    "metric 5": (_set("metric", 5, lambda r: r["metric"] == "loss"), "'metric' must be a string, got 5"),
    "status 1": (_set("status", 1), "'status' must be a string"),
    "config 3": (_set("config", 3), "'config' must be an object, got 3"),
    "config_hash null": (_set("config_hash", None), "'config_hash' must be a string"),
}


@pytest.mark.parametrize("case", BAD_ROWS)
@pytest.mark.parametrize("command", ["results show", "report", "regress"])
def test_rows_with_fields_of_the_wrong_type(case, command, tmp_path, capsys):
    change, needle = BAD_ROWS[case]
    line = {}

    def planted(rows):
        line["n"] = change(rows) + 1

    rows = _rows_with(tmp_path, planted)
    argv = {
        "results show": ["results", "show", str(rows.parent)],
        "report": ["report", str(rows.parent), "--out", str(tmp_path / "r")],
        "regress": ["regress", "--baseline", str(ROWS), "--candidate", str(rows.parent)],
    }[command]
    assert_one_line(*run(argv, capsys), f"{rows}:{line['n']}: not a zerobench result row: {needle}")


@pytest.mark.parametrize("command", ["results show", "report", "regress"])
def test_a_rows_file_that_is_a_directory(command, tmp_path, capsys):
    (tmp_path / "c" / "rows.jsonl").mkdir(parents=True)
    argv = {
        "results show": ["results", "show", str(tmp_path / "c")],
        "report": ["report", str(tmp_path / "c"), "--out", str(tmp_path / "r")],
        "regress": ["regress", "--baseline", str(ROWS), "--candidate", str(tmp_path / "c")],
    }[command]
    assert_one_line(*run(argv, capsys), f"{tmp_path / 'c' / 'rows.jsonl'}: cannot read result rows: Is a directory")
