"""Optimizer state across ZeRO stages, on two ranks. ``engine.optimizer.state_dict()`` holds this rank's shard of its
stage's partition, so loading it into another stage's partition that it does not cover is refused in one line that
names both partitions (before, the line blamed missing shards or another rank's state dict); ``save_sharded`` /
``load_sharded`` and DeepSpeed's ``save_checkpoint`` / ``load_checkpoint`` hold every shard and load exactly at any
stage, which the docs promise."""

from __future__ import annotations

import os

import pytest
import torch

from tests.helpers.dist import run_distributed

pytestmark = pytest.mark.dist

PAIRS = [(1, 3), (3, 1), (2, 0), (3, 2), (0, 3)]
BUCKET = 16
"""Elements per bucket: small, so that stages 1-2 (buckets in parameter order) and 3 (buckets per unit) cut the
partition differently."""


def _engine(stage: int):
    from tests.unit.test_replaced_grads import ADAM, model
    from zerobench.distributed.collectives import Group
    from zerobench.zero import ZeroConfig, apply_zero

    m = model()
    cfg = ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=BUCKET)
    return m, apply_zero(m, Group.of(None, "dp"), cfg)


def _trained(rank: int, world: int, stage: int):
    from tests.unit.test_replaced_grads import X

    m, engine = _engine(stage)
    for _ in range(2):
        m(X[rank::world]).pow(2).sum().backward()
        engine.optimizer.step()
        engine.optimizer.zero_grad()
    return m, engine


def _across_stages(rank: int, world: int, directory: str) -> dict:
    from zerobench.zero import as_deepspeed
    from zerobench.zero.state.checkpoint import load_sharded, save_sharded
    from zerobench.zero.state.shards import full_parameters

    out = {}
    for a, b in PAIRS:
        trained, saved = _trained(rank, world, a)
        want = full_parameters(saved)
        with saved.gathered_params():
            weights = {k: v.clone() for k, v in trained.state_dict().items()}
        fresh_model, fresh = _engine(b)
        try:  # torch's resume: the model's weights, then the optimizer's state (which leaves the weights alone)
            fresh_model.load_state_dict(weights)
            fresh.optimizer.load_state_dict(saved.optimizer.state_dict())
            got = full_parameters(fresh)
            said = max((got[n] - want[n]).abs().max().item() for n in got)
        except Exception as e:  # noqa: BLE001 - the message is what is checked
            said = f"{type(e).__name__}: {e}"
        path = os.path.join(directory, f"stage{a}to{b}")
        as_deepspeed(saved).save_checkpoint(path)
        _, loaded = _engine(b)
        as_deepspeed(loaded).load_checkpoint(path)
        got = full_parameters(loaded)
        save_sharded(saved, path + "-sharded")
        _, plain = _engine(b)
        load_sharded(plain, path + "-sharded")
        got_plain = full_parameters(plain)
        untrained = full_parameters(_engine(b)[1])
        out[f"{a}->{b}"] = {
            "state_dict": said,
            "checkpoint": max((got[n] - want[n]).abs().max().item() for n in got),
            "sharded": max((got_plain[n] - want[n]).abs().max().item() for n in got_plain),
            "moved": max((want[n] - untrained[n]).abs().max().item() for n in want),
        }
    # the other rank's state dict, stages 1 -> 2 (which cut the partition alike): blamed on the rank, not the stage
    _, saved = _trained(rank, world, 1)
    torch.save(saved.optimizer.state_dict(), os.path.join(directory, f"rank{rank}.pt"))
    torch.distributed.barrier()
    other = torch.load(os.path.join(directory, f"rank{1 - rank}.pt"), weights_only=True)
    _, fresh = _engine(2)
    try:
        fresh.optimizer.load_state_dict(other)
        out["other rank"] = "loaded"
    except Exception as e:  # noqa: BLE001 - the message is what is checked
        out["other rank"] = f"{type(e).__name__}: {e}"
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_distributed(_across_stages, 2, str(tmp_path_factory.mktemp("stages")), timeout=240)


def test_another_ranks_state_dict_is_named_as_such(results):
    """Stages 1 and 2 cut the partition alike, so the refusal is about the rank, not the stage."""
    for rank, res in enumerate(results):
        said = res["other rank"]
        assert "\n" not in said and "another rank refused" not in said, said
        assert f"it is shard {1 - rank}'s state and this rank holds shard {rank}, a state dict another rank" in said


def test_optimizer_state_across_stages(results):
    """Each pair: the checkpoint loads exactly; the rank's state dict loads exactly (stage 0's covers every
    partition) or is refused in one line naming both partitions, on some pair at least."""
    refused = 0
    for rank, res in enumerate(results):
        for pair, r in res.items():
            if pair == "other rank":
                continue
            a, b = pair.split("->")
            assert r["checkpoint"] == 0.0 and r["sharded"] == 0.0 and r["moved"] > 1e-3, (rank, pair, r)
            said = r["state_dict"]
            if isinstance(said, float):
                assert said == 0.0, (rank, pair, said)
                continue
            refused += 1
            assert "\n" not in said, said
            if "another rank refused" not in said:
                assert f"of a stage-{a} partition, and this engine's stage-{b} partition has " in said, said
                assert "save_sharded / load_sharded, or DeepSpeed's save_checkpoint / load_checkpoint, load" in said, (
                    said
                )
        assert isinstance(res["0->3"]["state_dict"], float), res  # stage 0's shard is the whole model
    assert refused, "no pair was refused: the message is untested"
