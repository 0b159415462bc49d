"""The recorded gate campaign (``scripts/gate_campaign.sh``, rows under results/reference/gate-campaign-cpu-2core):
with a noisy neighbour running, unchanged code passed 20 of 20 gate runs, a planted 10% host-work slowdown was
caught in at least 19 of 20, and a planted 10% step slowdown was caught by the wall-clock A/B in at least 19 of 20
(whose unchanged run was never called a regression). The counts are recomputed from the per-trial rows."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

DATASET = Path(__file__).resolve().parents[2] / "results" / "reference" / "gate-campaign-cpu-2core"
REQUIRED = {"unchanged_gate": 20, "host_planted_gate": 19, "ab_planted": 19, "ab_unchanged": 20}


@pytest.fixture(scope="module")
def rows() -> list[dict]:
    f = DATASET / "rows.jsonl"
    if not f.exists():
        pytest.skip(f"no campaign recorded yet: run scripts/gate_campaign.sh {DATASET.relative_to(DATASET.parents[2])}")
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()]


def test_the_campaign_ran_twenty_trials_of_each_kind_under_the_neighbour(rows):
    trials = [r for r in rows if r["metric"] == "campaign_trial"]
    for kind in REQUIRED:
        assert sorted(r["trial"] for r in trials if r["kind"] == kind) == list(range(1, 21)), kind
    assert {r["config"]["neighbour"] for r in rows} == {"scripts/noisy_neighbour.py 1"}
    assert {r["config"]["host_plant"] for r in rows} == {"ZEROBENCH_PLANT_CPU=0.10"}
    assert {r["config"]["step_plant"] for r in rows} == {"ZEROBENCH_PLANT_DELAY=0.10:2"}
    assert {(r["config"]["ab_rounds"], r["config"]["ab_false_alarm"]) for r in rows} == {(28, 0.001)}


@pytest.mark.parametrize("kind", list(REQUIRED))
def test_the_campaign_meets_the_bar(rows, kind):
    trials = [r for r in rows if r["metric"] == "campaign_trial" and r["kind"] == kind]
    met = sum(r["value"] for r in trials)
    assert met >= REQUIRED[kind], [r for r in trials if not r["value"]]
    total = next(r for r in rows if r["metric"] == "campaign_result" and r["kind"] == kind)
    assert total["value"] == met and total["of"] == 20


def test_each_trial_agrees_with_its_own_verdict_rows(rows):
    _agrees_with_its_verdicts(rows)


PARTS = sorted(DATASET.glob("part-*"), key=lambda p: int(p.name.rsplit("-", 1)[1]))
"""The campaign's parts recorded so far (``GATE_CAMPAIGN_HOURS``), each with the baseline it was judged against."""


@pytest.mark.parametrize("part", PARTS, ids=[p.name for p in PARTS])
def test_each_recorded_part_is_whole_and_counts_what_its_trials_did(part):
    """A part's totals are its trials' own verdicts, every trial has all four kinds, and the part's README
    tables those totals; it ran under the neighbour with the campaign's plants and A/B rounds."""
    rows = [json.loads(line) for line in (part / "rows.jsonl").read_text().splitlines() if line.strip()]
    assert (part / "baseline.jsonl").stat().st_size > 0
    _agrees_with_its_verdicts(rows)
    n = rows[0]["config"]["trials"]
    trials = [r for r in rows if r["metric"] == "campaign_trial"]
    for kind in REQUIRED:
        assert sorted(r["trial"] for r in trials if r["kind"] == kind) == list(range(1, n + 1)), kind
    readme = (part / "README.md").read_text()
    for r in (r for r in rows if r["metric"] == "campaign_result"):
        assert r["value"] == sum(t["value"] for t in trials if t["kind"] == r["kind"]) and r["of"] == n
        assert f"| {r['definition']} | {r['value']} | {n} |" in readme
    assert {r["config"]["neighbour"] for r in rows} == {"scripts/noisy_neighbour.py 1"}
    assert {(r["config"]["ab_rounds"], r["config"]["ab_false_alarm"]) for r in rows} == {(28, 0.001)}


def _agrees_with_its_verdicts(rows: list[dict]) -> None:
    results = {(r["kind"], r["trial"]): r for r in rows if r["metric"] == "trial_gate_result"}
    ab = {(r["kind"], r["trial"]): r for r in rows if r["metric"] == "trial_ab_time_ratio"}
    for t in (r for r in rows if r["metric"] == "campaign_trial"):
        key = (t["kind"], t["trial"])
        if t["kind"] == "unchanged_gate":
            assert t["value"] == (key in results and results[key]["value"] == 0), t
        elif t["kind"] == "host_planted_gate":
            assert t["value"] == (key in results and results[key]["value"] == 1), t
            if t["value"]:  # caught by host-work metrics (instructions, CPU time), not by something missing
                assert any(f.split(".")[0] in ("instructions", "host_cpu_s") for f in t["flagged"]), t
        elif t["kind"] == "ab_planted":
            assert t["value"] == (key in ab and ab[key]["verdict"] == "REGRESSION"), t
        else:
            assert t["value"] == (key in ab and ab[key]["verdict"] != "REGRESSION"), t


def _summary_module():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "summary", DATASET.parents[2] / "scripts" / "gate_campaign_summary.py"
    )
    summary = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summary)
    return summary


def test_the_summary_counts_what_each_trial_did(tmp_path):
    """scripts/gate_campaign_summary.py on a synthetic campaign of two trials: a trial counts only when its own
    verdict rows say it went as it must; a trial without rows (a gate that did not finish) does not."""
    summary = _summary_module()
    _synthetic_campaign(summary, tmp_path / "work", tmp_path / "out")
    rows = [json.loads(line) for line in (tmp_path / "out" / "rows.jsonl").read_text().splitlines()]
    met = {r["kind"]: r["value"] for r in rows if r["metric"] == "campaign_result"}
    assert met == {"unchanged_gate": 1, "host_planted_gate": 1, "ab_planted": 1, "ab_unchanged": 2}, met
    trial = {(r["kind"], r["trial"]): r for r in rows if r["metric"] == "campaign_trial"}
    assert trial[("unchanged_gate", 2)]["flagged"] == ["py_calls"] and trial[("host_planted_gate", 2)]["value"] == 0
    assert "| the lockstep A/B does not call" in (tmp_path / "out" / "README.md").read_text()


def test_help_names_the_way_to_join_parts(capsys):
    """``--combine`` is parsed before argparse; ``--help`` still tells a user it exists."""
    with pytest.raises(SystemExit) as e:
        _summary_module().main(["--help"])
    assert e.value.code == 0
    assert "--combine OUT PART" in capsys.readouterr().out


def test_a_campaign_taken_in_parts_numbers_their_trials_in_turn(tmp_path):
    """``--combine``: a part of two trials and a part stopped by its budget after one become trials 1-3, each with
    its part and its own verdict rows; the totals count all three; each part's baseline travels with them."""
    summary = _summary_module()
    _synthetic_campaign(summary, tmp_path / "work" / "part-1", tmp_path / "part-1")
    _synthetic_campaign(summary, tmp_path / "work" / "part-2", tmp_path / "part-2", trials=1)
    parts = [str(tmp_path / "part-1"), str(tmp_path / "part-2")]
    assert summary.main(["--combine", str(tmp_path / "all"), *parts]) == 0
    rows = [json.loads(line) for line in (tmp_path / "all" / "rows.jsonl").read_text().splitlines()]
    trials = [(r["kind"], r["trial"], r["part"], r["value"]) for r in rows if r["metric"] == "campaign_trial"]
    assert sorted(t[1] for t in trials if t[0] == "unchanged_gate") == [1, 2, 3]
    assert ("unchanged_gate", 2, "part-1", 0) in trials and ("unchanged_gate", 3, "part-2", 1) in trials
    flagged = [r for r in rows if r["metric"] == "trial_gate_comparison" and r["trial"] == 2]
    assert [r["of"] for r in flagged] == ["py_calls"] and flagged[0]["part_provenance"]["commit"]
    met = {r["kind"]: (r["value"], r["of"]) for r in rows if r["metric"] == "campaign_result"}
    assert met == {"unchanged_gate": (2, 3), "host_planted_gate": (2, 3), "ab_planted": (2, 3), "ab_unchanged": (3, 3)}
    assert {(r["config"]["trials"], tuple(r["config"]["parts"])) for r in rows} == {(3, ("part-1", "part-2"))}
    assert sorted(f.name for f in (tmp_path / "all" / "baselines").iterdir()) == ["part-1.jsonl", "part-2.jsonl"]
    assert "Taken in parts" in (tmp_path / "all" / "README.md").read_text()


def test_combining_refuses_what_would_mix_or_lose_rows(tmp_path, capsys):
    """Parts run with another configuration, an output directory already holding rows (combining again would
    double them), two parts of one name, and a part without its baseline are each refused in one line; parts
    measured on different machines say so instead of borrowing the combining machine's name."""
    summary = _summary_module()
    for part in ("part-1", "part-2"):
        _synthetic_campaign(summary, tmp_path / "work" / part, tmp_path / part)
    _synthetic_campaign(summary, tmp_path / "work" / "other", tmp_path / "other", ab_rounds="30")
    one, two = str(tmp_path / "part-1"), str(tmp_path / "part-2")
    assert summary.main(["--combine", str(tmp_path / "c1"), one, str(tmp_path / "other")]) == 2
    assert "different configurations" in capsys.readouterr().err and not (tmp_path / "c1").exists()
    assert summary.main(["--combine", str(tmp_path / "c2"), one, two]) == 0
    assert summary.main(["--combine", str(tmp_path / "c2"), one, two]) == 2
    assert "not empty" in capsys.readouterr().err
    (tmp_path / "x").mkdir()
    shutil.copytree(tmp_path / "part-1", tmp_path / "x" / "part-1")
    assert summary.main(["--combine", str(tmp_path / "c3"), one, str(tmp_path / "x" / "part-1")]) == 2
    assert "share a directory name" in capsys.readouterr().err
    (tmp_path / "part-2" / "baseline.jsonl").unlink()
    assert summary.main(["--combine", str(tmp_path / "c4"), one, two]) == 2
    assert "no baseline.jsonl" in capsys.readouterr().err
    (tmp_path / "part-2" / "baseline.jsonl").write_text("{}\n")
    rows = (tmp_path / "part-2" / "rows.jsonl").read_text().splitlines()
    moved = []
    for line in rows:
        r = json.loads(line)
        r["provenance"]["hardware"] = {**r["provenance"]["hardware"], "device": "another CPU"}
        moved.append(json.dumps(r))
    (tmp_path / "part-2" / "rows.jsonl").write_text("\n".join(moved) + "\n")
    assert summary.main(["--combine", str(tmp_path / "c5"), one, two]) == 0
    hw = {json.dumps(json.loads(line)["provenance"]["hardware"]) for line in (tmp_path / "c5" / "rows.jsonl").open()}
    assert len(hw) == 1 and json.loads(hw.pop())["kind"] == "mixed"


def _synthetic_campaign(summary, work, out, ab_rounds="28", trials=2):
    """Two trials' verdict rows under ``work`` (trial 1 went as it must throughout; in trial 2 the unchanged gate
    failed, the host plant's gate never finished and the A/B missed the plant), summarised into ``out`` for
    ``trials`` of them, with a baseline file as gate_campaign.sh leaves one."""

    def put(path, rows):
        path.mkdir(parents=True)
        (path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))

    put(work / "verdicts" / "unchanged-1", [{"metric": "gate_result", "value": 0, "run_id": "gate"}])
    put(
        work / "verdicts" / "unchanged-2",
        [
            {"metric": "gate_result", "value": 1, "run_id": "gate"},
            {"metric": "gate_comparison", "of": "py_calls", "verdict": "regression", "value": 0.02, "run_id": "gate"},
        ],
    )
    put(
        work / "verdicts" / "host-1",
        [
            {"metric": "gate_result", "value": 1, "run_id": "gate"},
            {
                "metric": "gate_comparison",
                "of": "instructions",
                "verdict": "regression",
                "value": 0.1,
                "run_id": "gate",
            },
        ],
    )  # host-2 never finished
    for i, verdicts in ((1, ("ok", "REGRESSION")), (2, ("ok", "ok"))):
        put(
            work / "ab" / str(i) / "summary",
            [
                {"metric": "ab_time_ratio", "run": run, "verdict": v, "value": 1.0, "run_id": "ab"}
                for run, v in zip(("000-stage1", "001-stage2"), verdicts)
            ],
        )
    args = [str(out), str(work), "--trials", str(trials), "--baseline-runs", "5", "--ab-rounds", ab_rounds]
    assert summary.main(args) == 0
    (out / "baseline.jsonl").write_text("{}\n")


@pytest.mark.parametrize("hours", ["abc", "0", "-1", "1e3"])
def test_the_campaign_refuses_a_budget_that_is_not_hours_before_it_starts(tmp_path, hours):
    """A bad GATE_CAMPAIGN_HOURS is one line and exit 2 before anything runs (not a traceback after the baseline's
    twelve minutes), and nothing is created."""
    import os
    import subprocess

    script = DATASET.parents[2] / "scripts" / "gate_campaign.sh"
    env = {**os.environ, "GATE_CAMPAIGN_HOURS": hours}
    r = subprocess.run(["bash", str(script), str(tmp_path / "out"), "2"], env=env, capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.count("\n") == 1 and "GATE_CAMPAIGN_HOURS" in r.stderr
    assert not (tmp_path / "out").exists()
