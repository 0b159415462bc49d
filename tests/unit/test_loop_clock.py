"""What the training loop's step clock covers: the training (forward, backward, optimizer step, zero_grad),
not the synthetic data generator, whose samples a prefetching loader would have ready."""

from __future__ import annotations

import contextlib
import dataclasses
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from zerobench.distributed.fake import init_fake_world
from zerobench.metrics.comm import CommLedger
from zerobench.train import loop
from zerobench.train.config import TrainConfig
from zerobench.train.data import SyntheticTokens
from zerobench.train.hooks import RankSettings, build_hooks

DATA_SECONDS = 1.0


class _System:
    """A system whose work takes no time on the fake clock; it records the micro-batches it is given."""

    def __init__(self):
        self.seen: list[torch.Tensor] = []

    def forward_backward(self, x, y):
        self.seen.append(x)
        return torch.zeros(())

    def step(self) -> bool:
        return True

    def zero_grad(self) -> None:
        pass


@pytest.fixture
def fake_world():
    init_fake_world(1, 0)
    yield
    dist.destroy_process_group()


def test_the_step_clock_starts_after_the_steps_samples_are_made(fake_world, monkeypatch):
    clock = [0.0]

    def now():
        clock[0] += 1e-6
        return clock[0]

    real = SyntheticTokens.micro_batch

    def slow_micro_batch(self, *args):  # each micro-batch "takes" a second of the fake clock
        clock[0] += DATA_SECONDS
        return real(self, *args)

    monkeypatch.setattr(loop.time, "perf_counter", now)
    monkeypatch.setattr(SyntheticTokens, "micro_batch", slow_micro_batch)
    cfg = TrainConfig(steps=4, warmup_steps=1)
    cfg = dataclasses.replace(cfg, zero=dataclasses.replace(cfg.zero, grad_accum_steps=2))
    system = _System()
    mesh = SimpleNamespace(dp_rank=0, dp=SimpleNamespace(pg=None))
    run = loop._Run(cfg, torch.device("cpu"), mesh, CommLedger(), system, None)
    hooks = build_hooks(cfg, RankSettings(), 0, lambda *a, **k: None, "r", lambda: None)
    with contextlib.ExitStack() as stack:
        _, series, halted = loop._steps(run, hooks, stack, loop._probe(run, hooks, None, 0), cfg.steps)
    assert halted is None
    assert len(system.seen) == cfg.steps * 2
    assert clock[0] > cfg.steps * 2 * DATA_SECONDS  # every micro-batch was made
    assert max(series["step_time_s"]) < 1e-3  # and none inside a timed step
    # the samples are the ones a single process draws for that step and micro-batch
    data = SyntheticTokens(cfg.model.vocab, cfg.model.seq, seed=cfg.seed)
    assert torch.equal(system.seen[3], real(data, 1, 0, 1, 1, cfg.micro_batch)[0])


def test_the_reference_workload_is_not_the_runs_memory():
    """The fixed matmul timed after each step (``step_time_norm``) was made and kept under the live-tensor tracker:
    every CPU run's peak (and its memory budget) counted the harness's 256 KiB matrix, 15% of the tiny preset's
    working peak at stage 3."""
    import torch

    from zerobench.metrics.memory import LiveTensorTracker
    from zerobench.train import loop

    loop._reference_matrix.cache_clear()
    with LiveTensorTracker() as t:
        assert loop._reference_seconds(torch.device("cpu")) > 0
    assert (t.current, t.peak) == (0, 0)
