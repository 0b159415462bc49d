"""The vocabulary-parallel loss as the plain GPT's ``F.cross_entropy``: targets of -100 (its ``ignore_index``:
padding, a prompt's tokens) add neither loss nor gradient, and a target outside the vocabulary is an error.

Before, TP counted an ignored target as a token of no rank's vocabulary slice: it added a log-sum-exp term and a
softmax gradient, and the mean ran over every token (loss 5.870 where one process has 6.249, gradients 0.75 off
relative); a target past the vocabulary was taken the same way, where torch raises."""

from __future__ import annotations

import copy

import pytest
import torch

from tests.helpers.dist import run_distributed

pytestmark = pytest.mark.dist


def _worker(rank: int, world: int) -> dict:
    from tests.helpers.scenarios import tp_local
    from zerobench.distributed.mesh import build_mesh
    from zerobench.models.gpt import GPT
    from zerobench.models.sizes import PRESETS
    from zerobench.parallel.parallelize import ParallelSpec, parallelize
    from zerobench.train.data import SyntheticTokens
    from zerobench.zero import ZeroConfig
    from zerobench.zero.state.shards import full_gradients

    mesh = build_mesh(2, 1)
    cfg = PRESETS["tiny"]
    torch.manual_seed(0)
    base = GPT(cfg)
    x, y = SyntheticTokens(cfg.vocab, cfg.seq, seed=7).samples(0, 0, 4)
    y = y.clone()
    y[:, cfg.seq // 2 :] = -100
    ref = copy.deepcopy(base)
    ref_loss = ref(x, y)
    ref_loss.backward()
    engine = parallelize(copy.deepcopy(base), mesh, ParallelSpec(zero=ZeroConfig(stage=0), kernels="reference")).engine
    loss = engine.module(x, y)
    engine.backward(loss)
    grads = full_gradients(engine)
    err = max(
        ((grads[n] - tp_local(n, p.grad, mesh.tp)).abs().max() / p.grad.abs().max()).item()
        for n, p in ref.named_parameters()
    )
    out = {"loss": (ref_loss.item(), loss.item()), "grad_rel_err": err}
    bad = y.clone()
    bad[0, 0] = cfg.vocab + 3
    try:
        engine.module(x, bad)
        out["bad"] = "accepted"
    except RuntimeError as e:
        out["bad"] = str(e)
    return out


def test_ignored_targets_and_the_vocabulary_bound_as_torchs():
    for r in run_distributed(_worker, 2, timeout=120):
        assert r["loss"][1] == pytest.approx(r["loss"][0], rel=1e-5), r
        assert r["grad_rel_err"] <= 1e-5, r
        assert "a target is outside the vocabulary [0, 512)" in r["bad"], r
