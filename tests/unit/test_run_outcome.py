"""A run's status tells the truth about its training: a run whose every step the optimizer skipped (fp16 overflow),
whose loss is not finite at the end (any precision), or that has no timed step left is ``failed`` with the reason
(one line on stderr, exit 1, a ``run_status`` row), its rows still written; the timing medians leave the skipped
steps out, and a ``skipped_steps`` row counts them. Before, all of these were recorded ``ok`` with exit 0 and the
skipped steps' times in the medians.

The training loop runs for real (one gloo process, ``launch.worker.run_rank`` as ``zerobench train`` calls it);
only the system is a stand-in whose losses and skips are scripted."""

from __future__ import annotations

import dataclasses
import json
import math
import time

import pytest
import torch

from zerobench.distributed.env import DistEnv
from zerobench.launch import worker
from zerobench.launch.local import free_port
from zerobench.train.config import TrainConfig
from zerobench.train.entry import SystemEntry
from zerobench.train.outcome import failure, timed_steps
from zerobench.zero.config import Precision

NAN, INF = math.nan, math.inf
SLOW_SKIP_S = 0.2
"""A scripted skipped step takes this long, an applied one no time: a median that took in a skipped step
would be at least this."""


class _Scripted:
    """A system whose loss and whether it stepped, step by step, are given."""

    def __init__(self, losses: list[float], stepped: list[bool]):
        self.losses, self.stepped, self.k = losses, stepped, 0

    def forward_backward(self, x, y):
        return torch.tensor(self.losses[self.k])

    def step(self) -> bool:
        took = self.stepped[self.k]
        if not took:
            time.sleep(SLOW_SKIP_S)
        self.k += 1
        return took

    def zero_grad(self) -> None:
        pass

    def memory_ledger(self) -> dict[str, int]:
        return {"params": 8, "grads": 8, "master": 0, "optimizer_states": 16}

    def model_state_bytes(self) -> int:
        return 32

    def model_state_bytes_analytic(self) -> float | None:
        return None

    def tensors(self) -> list[torch.Tensor]:
        return []


def _run(tmp_path, monkeypatch, capsys, losses, stepped, precision=Precision.FP32, warmup=1):
    entry = SystemEntry("scripted", lambda cfg, mesh, ledger, device: _Scripted(losses, stepped))
    monkeypatch.setattr(worker, "validate_run", lambda cfg, world: entry)
    cfg = TrainConfig(steps=len(losses), warmup_steps=warmup, track_memory=False, backend="gloo")
    cfg = dataclasses.replace(cfg, zero=dataclasses.replace(cfg.zero, precision=precision))
    out = tmp_path / "run"
    code = worker.run_rank(cfg, DistEnv(0, 1, 0, "127.0.0.1", free_port(), "single"), out, "scripted")
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    return code, rows, capsys.readouterr().err


def _one(rows, metric):
    (row,) = [r for r in rows if r["metric"] == metric]
    return row


@pytest.mark.parametrize("precision,last", [(Precision.FP32, NAN), (Precision.BF16, INF), (Precision.FP16, NAN)])
def test_a_loss_not_finite_at_the_end_fails_the_run(tmp_path, monkeypatch, capsys, precision, last):
    code, rows, err = _run(tmp_path, monkeypatch, capsys, [6.0, 5.0, last], [True] * 3, precision)
    assert code == 1
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("zerobench: error: training diverged: the loss is"), err
    status = _one(rows, "run_status")
    assert (status["status"], status["value"]) == ("failed", 0)
    assert f"the loss is {last} at the last step (3)" in status["reason"], status
    assert [r["value"] for r in rows if r["metric"] == "loss"][:2] == [6.0, 5.0]  # the rows are still written
    assert _one(rows, "skipped_steps")["value"] == 0


def test_a_run_whose_every_step_was_skipped_fails(tmp_path, monkeypatch, capsys):
    # a short fp16 run that never reaches the loss scale's minimum: the loss stays finite
    code, rows, err = _run(tmp_path, monkeypatch, capsys, [6.0, 6.0, 6.0], [False] * 3, Precision.FP16)
    assert code == 1 and "every one of the 3 steps was skipped (fp16 overflow)" in err, err
    assert _one(rows, "run_status")["status"] == "failed"
    skipped = _one(rows, "skipped_steps")
    assert (skipped["value"], skipped["steps"], skipped["of"]) == (3, [1, 2, 3], 3)
    assert not [r for r in rows if r["metric"] in ("step_time_s", "tflops_per_gpu")]  # no median to give


def test_a_run_whose_every_timed_step_was_skipped_fails_without_a_median(tmp_path, monkeypatch, capsys):
    code, rows, err = _run(
        tmp_path, monkeypatch, capsys, [6.0, 5.5, 5.5, 5.5], [True, True, False, False], Precision.FP16, warmup=2
    )
    assert code == 1 and "every timed step was skipped" in err and len(err.strip().splitlines()) == 1, err
    assert _one(rows, "run_status")["status"] == "failed"
    assert _one(rows, "skipped_steps")["value"] == 2
    assert not [r for r in rows if r["metric"].startswith("step_") or r["metric"].endswith("flops_per_gpu")]


def test_the_medians_leave_the_skipped_steps_out(tmp_path, monkeypatch, capsys):
    stepped = [True, False, True, False, False, True, True]  # 5 timed steps after 1 warm-up, 3 skipped in all
    code, rows, err = _run(tmp_path, monkeypatch, capsys, [6.0 - 0.1 * k for k in range(7)], stepped, Precision.FP16)
    assert code == 0, err
    assert (_one(rows, "run_status")["status"], _one(rows, "run_status")["value"]) == ("ok", 1)
    skipped = _one(rows, "skipped_steps")
    assert (skipped["value"], skipped["steps"], skipped["of"]) == (3, [2, 4, 5], 7)
    assert skipped["provenance"]["hardware"] and skipped["config_hash"] and skipped["run_id"] == "scripted"
    t = _one(rows, "step_time_s")
    assert t["n"] == len(t["samples"]) == 3  # steps 3, 6 and 7: the skipped 4 and 5 left out
    assert t["value"] < SLOW_SKIP_S / 2 and max(t["samples"]) < SLOW_SKIP_S / 2, t
    assert "skipped ones (fp16 overflow) left out" in t["aggregate"]


def test_timed_steps_and_failure_rules():
    assert timed_steps(6, 2, 0, set()) == [2, 3, 4, 5]
    assert timed_steps(6, 2, 1, {4}) == [2, 4]  # step 4 (index 3) skipped, the last one traced
    assert timed_steps(2, 5, 0, set()) == [0, 1]  # no step after the warm-up: all of them
    assert timed_steps(3, 1, 0, {2, 3}) == []
    assert failure([3.0, 2.0], [], 1) is None
    assert failure([3.0, 2.0], [2], 1) is None  # some skips are fp16's normal life
    assert "every one of the 2 steps" in failure([3.0, 3.0], [1, 2], 0)
    assert "the loss is inf at the last step (2)" in failure([3.0, INF], [], 1)
    assert "1 of 2 steps skipped" in failure([3.0, NAN], [2], 0)
    assert "no step time" in failure([3.0, 2.5], [2], 0)


def test_one_run_end_is_recorded_once_whichever_rank_writes_first(tmp_path):
    """Under torchrun the rank that ran out of memory writes the run's ``oom`` row, and rank 0, losing it, records
    the run's end too unless it finds that row: a check then a write, which a loaded host could interleave (a
    clean-clone CI run: two status rows). The row is written once, under the rows file's lock, by whichever rank
    comes first."""
    cfg = TrainConfig(steps=1)
    t0 = time.monotonic()
    assert worker._status_row(cfg, tmp_path, "r", None, t0, "oom", "rank 1 ran out of memory: x; rank 0 lost it", 75)
    worker._oom(MemoryError("x"), cfg, DistEnv(1, 2, 1, "127.0.0.1", 1, "single"), tmp_path, "r", None, True, t0, print)
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [r["status"] for r in rows if r["metric"] == "run_status"] == ["oom"]
    worker._status_row(cfg, tmp_path, "other", None, t0, "ok", None, 0)  # another run's row is its own
    rows = [json.loads(line) for line in (tmp_path / "rows.jsonl").read_text().splitlines()]
    assert [r["run_id"] for r in rows if r["metric"] == "run_status"] == ["r", "other"]
