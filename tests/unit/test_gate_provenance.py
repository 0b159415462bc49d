"""What the gate reads of where and how a run ran, and what it does with it, on copies of the committed ``cpu-2core``
baseline, changed: a configuration's machine is that of its measurements (a status row is written by whoever
recorded the run: under Slurm the submit host) and is compared per configuration; a field of what a run ran on
(``backend_ran``, ``kernels_ran``) that one side lacks is said, not passed over."""

from __future__ import annotations

import copy

import pytest

from tests.unit.test_bad_inputs import assert_one_line, run
from tests.unit.test_gate_silent import BASELINE, ROWS, STAGE3, _gate_out
from tests.unit.test_results_whole import _write


def _on(r: dict, cls: str) -> None:
    r["provenance"]["hardware"] = {**r["provenance"]["hardware"], "class": cls}


def test_a_failed_run_s_status_row_written_on_the_submit_host_is_not_its_machine(tmp_path, capsys):
    """A run that failed before measuring anything leaves its status row only, stamped (under Slurm) with the
    submit host's hardware and torch: the gate fails it as missing, neither refusing the whole candidate as of
    two machine classes nor noting another torch version."""
    cand = [r for r in copy.deepcopy(ROWS) if r["config_hash"] != STAGE3 or r["metric"] == "run_status"]
    for r in cand:
        if r["config_hash"] == STAGE3:
            r["status"], r["reason"] = "failed", "RuntimeError: boom"
            _on(r, "cpu-64core")
            r["provenance"]["torch_version"] = "2.99.0+cpu"
    code, out = _gate_out(capsys, BASELINE, _write(tmp_path / "c", cand))
    assert code == 1, out
    assert "missing: stage=3 (in the baseline, not completed in the candidate)" in out, out
    assert "not completed: stage=3 (run 003-stage-3: failed: RuntimeError: boom)" in out, out
    assert "cpu-64core" not in out and "2.99.0" not in out, out


@pytest.mark.parametrize("rows", ["all", "rank 1"])
def test_a_configuration_without_hardware_provenance_beside_ones_with_it_is_refused(rows, tmp_path, capsys):
    """A candidate run whose rows (or one rank's) lack the hardware provenance its other runs and the baseline have
    is refused, naming the run: it would be compared with a baseline of whatever machine."""
    cand = copy.deepcopy(ROWS)
    for r in cand:
        if r["config_hash"] == STAGE3 and r["metric"] != "run_status" and (rows == "all" or r.get("rank") == 1):
            del r["provenance"]["hardware"]
    code, err = run(["regress", "--baseline", str(BASELINE), "--candidate", str(_write(tmp_path / "c", cand))], capsys)
    assert_one_line(code, err, "stage=3 (run 003-stage-3) in the candidate has rows without hardware provenance")


def test_a_configuration_is_compared_on_its_own_machine_class(tmp_path, capsys):
    """Both sides ran on cpu-2core and cpu-64core, but stage=2 on cpu-64core in the candidate only: refused, naming
    it, whatever classes the other configurations cover."""
    base, cand = copy.deepcopy(ROWS), copy.deepcopy(ROWS)
    for rows, run_id in ((base, "003-stage-3"), (cand, "002-stage-2")):
        for r in rows:
            if r["run_id"] == run_id:
                _on(r, "cpu-64core")
    argv = ["regress", "--baseline", str(_write(tmp_path / "b", base) / "rows.jsonl")]
    code, err = run([*argv, "--candidate", str(_write(tmp_path / "c", cand))], capsys)
    assert_one_line(code, err, "stage=2 (run 002-stage-2) ran on cpu-64core in the candidate and on cpu-2core in the")


@pytest.mark.parametrize(
    ("field", "side", "n"),
    [("backend_ran", "the baseline", 9), ("kernels_ran", "the candidate", 1)],
)
def test_a_field_of_what_a_run_ran_on_recorded_on_one_side_only_is_noted(field, side, n, tmp_path, capsys):
    """The committed baselines predate ``backend_ran`` (a refusal would refuse them): the gate runs, and one line on
    stderr says how many configurations lack the field on which side, since their paths are not compared."""
    cand = copy.deepcopy(ROWS)
    for r in cand:
        if field == "backend_ran" and r["metric"] != "run_status":
            r["backend_ran"] = "gloo"
        if field == "kernels_ran" and r["config_hash"] == STAGE3:
            r.pop("kernels_ran", None)
    code, err = run(["regress", "--baseline", str(BASELINE), "--candidate", str(_write(tmp_path / "c", cand))], capsys)
    notes = [ln for ln in err.splitlines() if field in ln]
    assert code == 0 and len(notes) == 1 and len(err.strip().splitlines()) == 1, err
    assert notes[0].startswith("zerobench: note: ") and f"{n} of the 9 configurations both sides ran lack" in notes[0]
    assert f"lack {field} in {side} and have it in" in notes[0], notes[0]


@pytest.mark.parametrize(
    ("field", "value", "kind"),
    [("device", "Intel Xeon", "processors"), ("torch_version", "2.99.0+cpu", "torch versions")],
)
def test_a_baseline_from_two_processors_or_torch_versions_is_refused(field, value, kind, tmp_path, capsys):
    """Unchanged runs of one hardware class on two processors (or torch versions): their spread would be the
    difference between them, and the gate holds a noise model for the processor it was measured on only."""
    other = copy.deepcopy(ROWS)
    for r in other:
        if field == "device":
            r["provenance"]["hardware"]["device"] = value
        else:
            r["provenance"]["torch_version"] = value
    out = tmp_path / "base.jsonl"
    argv = ["regress", "--write-baseline", str(out), "--candidate", str(_write(tmp_path / "1", ROWS))]
    code, err = run([*argv, str(_write(tmp_path / "2", other))], capsys)
    first = "AMD EPYC" if field == "device" else "2.13.0+cpu"
    assert_one_line(code, err, f"the --candidate results mix {kind} {first} and {value} (result 2)")
    assert not out.exists()
