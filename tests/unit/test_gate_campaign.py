"""The recorded gate campaign (``scripts/gate_campaign.sh``, rows under results/reference/gate-campaign-cpu-2core):
with a noisy neighbour running, unchanged code passed 20 of 20 gate runs, a planted 10% host-work slowdown was
caught in at least 19 of 20, and a planted 10% step slowdown was caught by the wall-clock A/B in at least 19 of 20
(whose unchanged run was never called a regression). The counts are recomputed from the per-trial rows."""

from __future__ import annotations

import json
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


def test_a_campaign_taken_in_parts_numbers_their_trials_in_turn(tmp_path):
    """``--combine``: two parts of two trials each become trials 1-4, each with its part and its own verdict
    rows, and the totals count all four; parts run with another configuration are refused."""
    summary = _summary_module()
    for part in ("part-1", "part-2"):
        _synthetic_campaign(summary, tmp_path / "work" / part, tmp_path / part)
    assert summary.main(["--combine", str(tmp_path / "all"), str(tmp_path / "part-1"), str(tmp_path / "part-2")]) == 0
    rows = [json.loads(line) for line in (tmp_path / "all" / "rows.jsonl").read_text().splitlines()]
    trials = [(r["kind"], r["trial"], r["part"], r["value"]) for r in rows if r["metric"] == "campaign_trial"]
    assert sorted(t[1] for t in trials if t[0] == "unchanged_gate") == [1, 2, 3, 4]
    assert ("unchanged_gate", 4, "part-2", 0) in trials and ("unchanged_gate", 3, "part-2", 1) in trials
    flagged = [r for r in rows if r["metric"] == "trial_gate_comparison" and r["trial"] == 4]
    assert [r["of"] for r in flagged] == ["py_calls"] and flagged[0]["part_provenance"]["commit"]
    met = {r["kind"]: (r["value"], r["of"]) for r in rows if r["metric"] == "campaign_result"}
    assert met == {"unchanged_gate": (2, 4), "host_planted_gate": (2, 4), "ab_planted": (2, 4), "ab_unchanged": (4, 4)}
    assert {(r["config"]["trials"], tuple(r["config"]["parts"])) for r in rows} == {(4, ("part-1", "part-2"))}
    assert "Taken in parts" in (tmp_path / "all" / "README.md").read_text()
    _synthetic_campaign(summary, tmp_path / "work" / "other", tmp_path / "other", ab_rounds="30")
    code = summary.main(["--combine", str(tmp_path / "mixed"), str(tmp_path / "part-1"), str(tmp_path / "other")])
    assert code == 2 and not (tmp_path / "mixed" / "rows.jsonl").exists()


def _synthetic_campaign(summary, work, out, ab_rounds="28"):

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
    args = [str(out), str(work), "--trials", "2", "--baseline-runs", "5", "--ab-rounds", ab_rounds]
    assert summary.main(args) == 0
