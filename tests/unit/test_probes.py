"""The step probe (train/probes.py) without processes: CPU time per phase every step, counts of the counted step
only, counts that repeat exactly, a host-work plant seen by CPU time and not by the call and operator counts; the
planted CPU burn; reading callgrind's dumps."""

from __future__ import annotations

import time

import pytest
import torch

from zerobench.metrics import callgrind
from zerobench.metrics.comm import CommLedger
from zerobench.metrics.memory import LiveTensorTracker
from zerobench.train import faults
from zerobench.train.probes import PHASES, Meter, StepProbe, counted_step


def _helper() -> int:
    return 1


def _train(probe: StepProbe, ledger: CommLedger, steps: int = 3, extra_calls: int = 0) -> None:
    w = torch.ones(64, 64)
    for step in range(steps):
        ledger.reset()
        with probe.step(step):
            with probe.phase("forward_backward"):
                x = (w @ w).relu()
                ledger.record("all_reduce", "dp", 2, x.numel(), x.numel() * 4, "grad")
                for _ in range(extra_calls):
                    _helper()
            with probe.phase("optimizer"):
                w.add_(x, alpha=-1e-3)
            with probe.phase("zero_grad"):
                pass


def _probe(counted=1, after_phase=None, read=None) -> tuple[StepProbe, CommLedger, LiveTensorTracker]:
    ledger, tracker = CommLedger(), LiveTensorTracker()
    probe = StepProbe(counted, ledger, tracker, torch.device("cpu"), read=read, after_phase=after_phase)
    return probe, ledger, tracker


def test_cpu_every_step_counts_in_the_counted_step_only():
    probe, ledger, tracker = _probe()
    with tracker:
        _train(probe, ledger)
    assert all(len(probe.cpu[p]) == 3 for p in PHASES)
    fb, opt, step = probe.counts["forward_backward"], probe.counts["optimizer"], probe.counts["step"]
    assert fb["ops_dispatched"] == 2 and opt["ops_dispatched"] == 1  # matmul, relu; add_
    assert fb["allocations"] == 2 and fb["allocated_bytes"] == 2 * 64 * 64 * 4 and opt["allocations"] == 0
    assert (fb["collective_calls"], fb["collective_bytes"]) == (1, 64 * 64 * 4)
    assert step == {k: sum(probe.counts[p][k] for p in PHASES) for k in step}
    assert counted_step(3) == 2 and counted_step(1) == 0 and counted_step(0) is None


def test_counts_repeat_exactly_and_see_each_python_call():
    got = []
    for extra in (0, 0, 10):
        probe, ledger, tracker = _probe()
        with tracker:
            _train(probe, ledger, extra_calls=extra)
        got.append(probe.counts["forward_backward"]["py_calls"])
    assert got[0] == got[1] and got[2] - got[0] == 10, got


def test_a_host_work_plant_shows_in_cpu_time_not_in_the_counts():
    warm, ledger, tracker = _probe()  # first calls in a fresh process (lazy imports, caches) are not the plant's
    with tracker:
        _train(warm, ledger)
    plain, ledger, tracker = _probe()
    with tracker:
        _train(plain, ledger)
    burned = []
    planted, ledger, tracker = _probe(
        after_phase=lambda phase, cpu, meter: burned.append(faults.planted_cpu("1.0", 0, 0.02, meter))
    )
    with tracker:
        _train(planted, ledger)
    assert len(burned) == 9 and all(b == pytest.approx(0.02) for b in burned)
    assert all(c >= 0.02 for p in PHASES for c in planted.cpu[p])  # the burn is inside each phase's CPU time
    assert planted.counts == plain.counts  # and invisible to the counts, as slower native code would be


def test_the_cpu_plant_burns_its_fraction_of_the_phase_at_its_stage_only():
    c0 = time.process_time()
    assert faults.planted_cpu("0.5:2", 2, 0.04) == pytest.approx(0.02)
    assert time.process_time() - c0 >= 0.02
    assert faults.planted_cpu("0.5:2", 3, 0.04) == 0.0 and faults.planted_cpu(None, 2, 0.04) == 0.0


class _FakeCallgrind:
    """Counts a unit of work as three instructions; ``dump`` files the count under a label and zeroes it."""

    def __init__(self):
        self.now, self.files = 0, {}

    def dump(self, label):
        self.files[label] = self.files.get(label, 0) + self.now
        self.now = 0

    def read(self):
        return dict(self.files)

    def work(self, n):
        self.now += 3 * n


def test_under_callgrind_the_plant_adds_its_fraction_of_the_phases_instructions(monkeypatch):
    """Valgrind runs vector code far slower than the plant's scalar loop, so a share of CPU time there is not a
    share of instructions: the meter sizes the plant's work from the phase's own count."""
    monkeypatch.setattr(Meter, "unit", None)
    cg = _FakeCallgrind()
    cg.now = 30_000
    cg.dump("optimizer")  # the phase's own instructions
    n = Meter(cg, cg.read, "optimizer").spend(0.10, cg.work)
    assert n == 1000 and cg.files["optimizer"] == 33_000 and Meter.unit == 3
    asked = []

    class Stub:
        def spend(self, fraction, work):
            asked.append(fraction)
            work(10)

    c0 = time.process_time()
    assert faults.planted_cpu("0.5", 0, 99.0, Stub()) == 0.0 and asked == [0.5]  # the meter's share, no CPU time
    assert time.process_time() - c0 < 1.0


def test_instruction_counts_come_from_the_dumps(tmp_path):
    probe, _, _ = _probe(read=lambda: {"forward_backward": 100, "optimizer": 20, "zero_grad": 3, "probe": 9})
    probe.read_instructions()
    assert probe.instructions == {"forward_backward": 100, "optimizer": 20, "zero_grad": 3, "step": 123}
    probe, _, _ = _probe(read=lambda: {"forward_backward": 100})  # a phase missing: no figure, not a partial one
    probe.read_instructions()
    assert probe.instructions is None
    stem = tmp_path / f"{callgrind.OUT_PREFIX}.rank0.4242"
    stem.write_text("desc: Trigger: Program termination\nsummary: 18446744073656174182\n")  # the exit dump: not ours
    for n, (label, ir) in enumerate([("forward_backward", 1000), ("optimizer", 30), ("zero_grad", 7)], 1):
        for thread, share in (("01", 1), ("02", 100)):  # per thread: the main thread's is the host work
            (tmp_path / f"{stem.name}.{n}-{thread}").write_text(
                f"version: 1\ndesc: I1 cache:\ndesc: Trigger: Client Request: {label}\nevents: Ir\n"
                f"summary: {ir * share}\ntotals: {ir * share + 5}\n"
            )
    (tmp_path / f"{callgrind.OUT_PREFIX}.rank1.4242.1").write_text("desc: Trigger: Client Request: x\nsummary: 9\n")
    assert callgrind.read_counts(tmp_path, "rank0", pid=4242) == {
        "forward_backward": 1000,
        "optimizer": 30,
        "zero_grad": 7,
    }
    assert callgrind.read_counts(tmp_path, "rank0", pid=4242, thread=2)["optimizer"] == 3000
