"""Input files of the wrong shape are one line and exit code 2, naming the file: a suite given as a
directory, a suite to plan that is not a mapping of runs."""

from __future__ import annotations

import json

import pytest

from tests.unit.test_bad_inputs import assert_one_line, run
from zerobench.cli import main


@pytest.mark.parametrize("argv", [["sweep", "{d}"], ["sweep", "{d}", "--check"], ["plan", "--project", "{d}"],
                                  ["plan", "--dry-run", "--suite", "{d}"], ["sweep", "cpu"]],
                         ids=["sweep", "sweep --check", "plan --project", "plan --dry-run --suite", "sweep cpu"])
def test_a_suite_that_is_a_directory(argv, tmp_path, capsys):
    (tmp_path / "a.yaml").write_text("name: a\nbase: {preset: tiny}\n")
    code, err = run([a.format(d=tmp_path) for a in argv], capsys)
    assert_one_line(code, err, "is a directory: give one suite YAML file")
    assert str(tmp_path / "a.yaml") in err or "suites/cpu/quick.yaml" in err, err  # what to give instead


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
    ("runs: [{label: [1], layers: 2}]", "runs[0].label: expected str"),
]


@pytest.mark.parametrize(("body", "needle"), PLAN_SUITES, ids=[b for b, _ in PLAN_SUITES])
@pytest.mark.parametrize("mode", [["--project"], ["--dry-run", "--suite"]])
def test_a_suite_to_plan_of_another_shape(body, needle, mode, tmp_path, capsys):
    suite = tmp_path / "p.yaml"
    suite.write_text(body + "\n")
    code, err = run(["plan", *mode, str(suite)], capsys)
    assert_one_line(code, err, needle)
    assert err.startswith(f"zerobench: error: {suite}: "), err


def test_an_unlabelled_run_is_planned_under_its_index(tmp_path, capsys):
    suite = tmp_path / "p.yaml"
    suite.write_text("runs: [{layers: 2, hidden: 64, heads: 2}]\n")
    assert main(["plan", "--project", str(suite), "--json"]) == 0
    assert [r["label"] for r in json.loads(capsys.readouterr().out)["rows"]] == ["runs[0]"]
