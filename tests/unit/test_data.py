"""Synthetic data is reproducible and independent of how the global batch is split."""

from __future__ import annotations

import pytest
import torch

from zerobench.train.data import SyntheticTokens


def test_any_split_sees_the_same_samples():
    d = SyntheticTokens(100, 16, seed=3)
    x, y = d.samples(5, 0, 8)
    parts = [d.micro_batch(5, r, 2, m, 2) for m in range(2) for r in range(2)]
    # micro m, rank r -> samples (m*2 + r)*2 ...
    assert torch.equal(torch.cat([p[0] for p in parts]), x)
    assert torch.equal(y[:, :-1], x[:, 1:])


def test_seeded_and_step_dependent():
    a, b = SyntheticTokens(100, 16, seed=3), SyntheticTokens(100, 16, seed=3)
    assert torch.equal(a.samples(1, 0, 4)[0], b.samples(1, 0, 4)[0])
    assert not torch.equal(a.samples(1, 0, 4)[0], a.samples(2, 0, 4)[0])
    assert int(a.samples(0, 0, 4)[0].max()) < 100


def test_a_global_batch_over_10007_sequences_repeats_no_sample():
    """Sample 10,007 + i of a step was sample i of the next: a global batch of 10,240 retrained 233 samples every
    step. The first 10,007 samples of every step keep the streams every recorded run drew."""
    from zerobench.train.data import STRIDE, sample_stream

    assert sample_stream(3, 5, 17) == (3 * 1_000_003 + 5 * STRIDE + 17, 0)  # as recorded
    d = SyntheticTokens(100, 16, seed=3)
    later = d.samples(0, STRIDE, 3)[0]  # samples 10,007-10,009 of step 0
    assert not any(torch.equal(later[k], d.samples(1, k, 1)[0][0]) for k in range(3))
    assert not any(torch.equal(later[k], d.samples(0, k, 1)[0][0]) for k in range(3))
    assert torch.equal(d.samples(0, STRIDE + 1, 1)[0][0], later[1])  # still any split's same sample


def test_a_vocabulary_padded_for_tp_keeps_the_samples_of_one_process():
    """A sweep pads a vocabulary TP does not divide (129 -> 256 at TP 2, Megatron-LM's rule); the data drew from the
    padded one, so a TP 2 run trained on other samples than the single-process run of the same config (another
    successor table, tokens up to 255). The data keeps the tokenizer's vocabulary; the padding is embedding rows."""
    from zerobench.bench.spec import RunSpec, to_train_config
    from zerobench.train.data import data_source

    one, two = (to_train_config(RunSpec(vocab=129, tp=tp, dp=1, steps=3)) for tp in (1, 2))
    assert (one.model.vocab, two.model.vocab, two.data_vocab) == (129, 256, 129)
    a, b = data_source(one), data_source(two)
    assert torch.equal(a.successors, b.successors)
    for step in range(3):
        assert torch.equal(a.samples(step, 0, 6)[0], b.samples(step, 0, 6)[0])
    assert int(b.samples(0, 0, 64)[0].max()) < 129
    assert to_train_config(RunSpec(vocab=256, tp=2, dp=1)).data_vocab is None  # nothing padded: the model's


def test_a_data_vocabulary_beyond_the_model_s_is_refused():
    import dataclasses

    from zerobench.config import ConfigError
    from zerobench.train.config import TrainConfig

    cfg = TrainConfig()
    for bad in (0, cfg.model.vocab + 1):
        with pytest.raises(ConfigError, match=r"data vocabulary .* must be in \[1, "):
            dataclasses.replace(cfg, data_vocab=bad).validate()
    dataclasses.replace(cfg, data_vocab=cfg.model.vocab).validate()


def test_the_training_loop_feeds_the_data_vocabulary_s_samples(tmp_path, monkeypatch):
    """The loop itself (one gloo process, ``launch.worker.run_rank`` as ``zerobench train`` calls it) trains on the
    samples of ``data_vocab``, not of the padded model vocabulary: the stand-in system records what it is fed."""
    import dataclasses

    from tests.unit.test_run_outcome import _Scripted
    from zerobench.distributed.env import DistEnv
    from zerobench.launch import worker
    from zerobench.launch.local import free_port
    from zerobench.models.config import GPTConfig
    from zerobench.train.config import TrainConfig
    from zerobench.train.entry import SystemEntry

    fed: list[torch.Tensor] = []

    class Recording(_Scripted):
        def forward_backward(self, x, y):
            fed.append(x.clone())
            return super().forward_backward(x, y)

    entry = SystemEntry("recording", lambda cfg, mesh, ledger, device: Recording([6.0, 5.0], [True, True]))
    monkeypatch.setattr(worker, "validate_run", lambda cfg, world: entry)
    model = GPTConfig(layers=1, hidden=32, heads=2, vocab=256, seq=16)
    cfg = TrainConfig(model=model, data_vocab=129, steps=2, warmup_steps=1, micro_batch=2, track_memory=False)
    cfg = dataclasses.replace(cfg, backend="gloo")
    assert worker.run_rank(cfg, DistEnv(0, 1, 0, "127.0.0.1", free_port(), "single"), tmp_path / "run", "r") == 0
    want = SyntheticTokens(129, 16, seed=cfg.seed)
    assert len(fed) == 2 and all(torch.equal(x, want.samples(t, 0, 2)[0]) for t, x in enumerate(fed))
