"""The profile -> simulate/validate -> fit flow says what it cannot answer (a helper's review found each silent):
a profile of another machine, or rounds of two machines, are refused; runs of what the replay does not describe
(sequence parallelism, 8-bit states, parameter or NVMe offload) are named, never predicted as if they were not;
``--fit`` refuses to report a value it did not fit; a failed run's peak memory is no measurement; a suite's runs of
other systems are named. Built from the committed CPU recordings (``results/reference/sim-validation-cpu-2core*``)."""

from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import pytest

from zerobench.results.rows import read_rows
from zerobench.sim import validate as V
from zerobench.sim.profile import Profile
from zerobench.sim.simulate import simulate

REFS = Path(__file__).resolve().parents[2] / "results" / "reference"
EPYC, XEON = REFS / "sim-validation-cpu-2core", REFS / "sim-validation-cpu-2core-xeon-5"


@pytest.fixture(scope="module")
def epyc():
    return read_rows(EPYC / "runs"), Profile.from_rows(read_rows(EPYC / "profile"))


def test_rounds_of_two_machines_are_refused():
    rows = read_rows(EPYC / "runs") + read_rows(XEON / "runs")
    with pytest.raises(
        ValueError, match=r"measured runs were taken on cpu-2core \(.*\) and cpu-2core \(.*\): validate"
    ):
        V.measured_runs(rows)


def test_profiles_of_two_machines_are_refused():
    with pytest.raises(ValueError, match=r"the profile's rows were measured on cpu: .* and cpu: .*: read one"):
        Profile.from_rows(read_rows(EPYC / "profile") + read_rows(XEON / "profile"))


def test_a_profile_of_another_machine_is_refused_or_noted(epyc):
    rows, prof = epyc
    assert V.check_profile_machine(prof, rows) == []  # its own runs
    other = Profile.from_rows(read_rows(XEON / "profile"))
    notes = V.check_profile_machine(other, rows)  # the same class, another processor
    assert len(notes) == 1 and "the profile's processor is" in notes[0] and "the runs'" in notes[0]
    gpu = copy.deepcopy(rows)
    for r in gpu:
        if (r.get("provenance") or {}).get("hardware"):
            r["provenance"]["hardware"]["class"] = "nvidia-h100-80gb-hbm3"
    with pytest.raises(ValueError, match=r"the profile was measured on cpu-2core .* and the runs on nvidia-h100"):
        V.check_profile_machine(prof, gpu)
    from zerobench.sim.paper import stated_profile

    with pytest.raises(ValueError, match=r"stated device .* and the runs were measured on cpu-2core"):
        V.check_profile_machine(stated_profile("v100-dgx2", "zerobench"), rows)


@pytest.mark.parametrize(
    "change, what",
    [
        (dict(tp=2, sequence_parallel=True), "sequence parallelism"),
        (dict(zero=dict(optim_bits=8)), "8-bit optimizer states"),
        (dict(zero=dict(stage=3, offload_optimizer="cpu", offload_param="cpu")), "parameter offload"),
        (dict(zero=dict(offload_optimizer="nvme", nvme_path="/tmp")), "NVMe offload"),
    ],
)
def test_what_the_replay_does_not_describe_is_named_not_predicted(epyc, change, what):
    """Each of these was predicted to the microsecond as the run without it (8-bit measured 3.6x the step)."""
    rows, prof = epyc
    step = next(r for r in rows if r["metric"] == "step_time_s" and r["status"] == "ok" and r["config"]["dp"] == 2)
    cfg = copy.deepcopy(step["config"])
    for k, v in change.items():
        cfg[k] = {**cfg[k], **v} if isinstance(v, dict) else v
    cfg["dp"], cfg["tp"] = (1, 2) if change.get("tp") else (cfg["dp"], cfg["tp"])
    from zerobench.config import from_dict
    from zerobench.train.config import TrainConfig

    with pytest.raises(ValueError, match=f"does not describe {what}"):
        simulate(from_dict(TrainConfig, cfg), prof)
    odd = [dict(r, config=cfg, run_id="099-odd") for r in rows if r["run_id"] == step["run_id"]]
    assert V.not_predicted(rows + odd) == {"099-odd": what}
    assert "099-odd" not in {r["run_id"] for r in V.validate(rows + odd, prof)}


def test_fit_refuses_what_it_cannot_fit(epyc):
    rows, prof = epyc
    zero_only = [r for r in rows if (r.get("config") or {}).get("zero", {}).get("stage", 1) != 0]
    with pytest.raises(ValueError, match="--fit has nothing to fit on"):
        V.fit_interference(zero_only, prof)
    gpu = dataclasses.replace(prof, device="cuda: NVIDIA H100 80GB HBM3 (16 host cores)")
    with pytest.raises(ValueError, match="--fit fits a CPU profile's one factor"):
        V.fit_interference(rows, gpu)
    with pytest.raises(ValueError, match=r"the best interference is the grid's top, 0.01: .* no value was fitted"):
        V.fit_interference(rows, prof, grid=3, top=0.01)


def test_a_failed_run_s_peak_memory_is_no_measurement():
    """A round whose run failed (with a doubled peak) was in the memory median: 0.665 where the ok rounds say 1."""

    def attempt(stamp: str, peak: float, status: str) -> list[dict]:
        prov = {"timestamp": stamp}
        row = {"run_id": "000-x", "config_hash": "h", "provenance": prov, "suite": "s", "schema": 2}
        return [
            {**row, "metric": "peak_memory_bytes", "value": peak, "status": "ok"},
            {**row, "metric": "run_status", "value": int(status == "ok"), "status": status},
        ]

    rounds = attempt("2026-01-01T00:00:00", 100.0, "ok") + attempt("2026-01-02T00:00:00", 200.0, "failed")
    assert V.measured_peaks(rounds) == {"000-x": 100.0}


def test_a_suite_s_runs_of_other_systems_are_named_and_ours_labelled(capsys):
    from zerobench.cli import main

    assert main(["simulate", "--profile", "v100-dgx2", "--suite", "paper/fig2"]) == 0
    out, err = capsys.readouterr()
    assert "note: 10 runs of other systems are not predicted" in err, err
    assert all('"label": ' in line for line in out.strip().splitlines())


def test_a_run_whose_model_states_exceed_the_card_is_named_not_predicted(tmp_path, capsys):
    """A stated device states its card. A 40B model at stage 0 on 16 V100s holds 16 bytes a parameter on every GPU
    (599 GiB), which no 32 GB card holds: a step time for it was printed as if the run could start. It is now
    named, with what it needs. At stage 3 over 16 ranks it still needs 37.4 GiB a GPU and is named; over 64 ranks
    (9.4 GiB) it is predicted."""
    import json

    from zerobench.cli import main

    def run(label: str, gpus: int, stage: int) -> str:
        return (
            f"- label: {label}\n  gpus: {gpus}\n  tp: 1\n  layers: 88\n  hidden: 6144\n  heads: 64\n"
            f"  micro_batch: 1\n  total_batch: {gpus}\n  system: zerobench\n  stage: {stage}\n"
        )

    suite = tmp_path / "big.yaml"
    suite.write_text(
        "name: big\ndescription: runs that do and do not fit\n"
        "cluster: {hardware: v100-dgx2, gpus_per_node: 16, gpu_mem: 32GB}\n"
        "base: {seq: 1024, vocab: 50257, precision: fp16, checkpoint_activations: true}\nruns:\n"
        + run("ddp-16", 16, 0)
        + run("z3-16", 16, 3)
        + run("z3-64", 64, 3)
    )
    assert main(["simulate", "--profile", "v100-dgx2", "--suite", str(suite)]) == 0
    out, err = capsys.readouterr()
    assert [json.loads(line)["label"] for line in out.strip().splitlines()] == ["z3-64"]
    assert (
        "note: run 'ddp-16' is not predicted: its model states alone need 598.8 GiB a GPU (40.18B parameters x "
        "16.00 bytes), over the 32 GiB card of"
    ) in err, err
    assert "note: run 'z3-16' is not predicted: its model states alone need 37.4 GiB a GPU" in err, err
