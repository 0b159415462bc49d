"""A checkpoint is whole or refused: ranks killed while saving never leave a checkpoint that loads with values from
no save, whatever the point of the save they die at, and whatever checkpoint the tag held before."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

from tests.helpers import ckpt_faults as F
from tests.helpers.dist import DistributedFailure, run_distributed
from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group
from zerobench.zero.compat.deepspeed.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
from zerobench.zero.state.checkpoint import consolidate, load_sharded
from zerobench.zero.state.shards import full_parameters
from zerobench.zero.state.transaction import CheckpointMismatch

pytestmark = pytest.mark.dist
ONE = Group(None, "dp", 1, 0)
REFUSED = (CheckpointMismatch, FileNotFoundError, ConfigError)


def expected(out: Path) -> list[dict[str, torch.Tensor]]:
    return [torch.load(f, weights_only=True) for f in sorted(out.glob("expected-*.pt"))]


def equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def loaded(root: Path, tag: str | None = None) -> dict[str, torch.Tensor]:
    """The checkpoint loaded by a one-process engine, and by zero_to_fp32's path: both must agree."""
    engine = F.engine_for(ONE, 2)
    path, _ = engine.load_checkpoint(root, tag)
    assert path is not None
    values = full_parameters(engine)
    fp32 = get_fp32_state_dict_from_zero_checkpoint(root, tag)
    assert equal(values, {k: fp32[k] for k in values})
    return values


def check_whole_or_refused(out: Path, saves: list[dict]) -> str:
    """The newest loadable checkpoint (``latest``) and every tag equal one of ``saves`` bit for bit; whatever else
    lies in the directory is refused. Returns the tag ``latest`` names."""
    root = out / "ckpt"
    newest = loaded(root)
    assert any(equal(newest, s) for s in saves), "latest loads values from no save"
    for entry in sorted(root.iterdir()):
        if entry.name == "latest":
            continue
        if not entry.name.startswith("."):
            assert any(equal(loaded(root, entry.name), s) for s in saves), entry.name
            continue
        engine = F.engine_for(ONE, 2)  # a save's leftovers: never loadable, by tag or by path
        with pytest.raises(REFUSED):
            engine.load_checkpoint(root, entry.name)
        with pytest.raises(REFUSED):
            load_sharded(engine, entry)
        with pytest.raises(REFUSED):
            consolidate(entry)
    return (root / "latest").read_text()


@pytest.mark.parametrize("stage", [pytest.param(2, marks=pytest.mark.slow), 3])
def test_a_resave_killed_inside_a_shard_write_leaves_the_previous_save(tmp_path, stage):
    with pytest.raises(DistributedFailure):
        run_distributed(F.resave_killed, 2, str(tmp_path), stage, 1)
    first, second = expected(tmp_path)
    assert not equal(first, second)
    assert check_whole_or_refused(tmp_path, [first, second]) == "final"
    assert equal(loaded(tmp_path / "ckpt"), first)


@pytest.mark.slow
def test_a_dp2_resave_over_a_dp4_checkpoint_killed_leaves_the_dp4_one(tmp_path):
    run_distributed(F.save_first, 4, str(tmp_path), 2)
    with pytest.raises(DistributedFailure):
        run_distributed(F.resave_killed, 2, str(tmp_path), 2, 1, 4)
    first, second = expected(tmp_path)
    check_whole_or_refused(tmp_path, [first, second])
    assert equal(loaded(tmp_path / "ckpt"), first)
    # the command a user runs on it (issue 57's variant: it exited 0 with 208 of 433 weights zeroed): the DP 4
    # save, whole; a staged leftover of the killed save, named as a tag, is refused in one line
    from tests.e2e.test_cli_train import zb

    r = zb("zero-to-fp32", str(tmp_path / "ckpt"), str(tmp_path / "fp32"))
    assert r.returncode == 0, r.stderr
    got = torch.load(tmp_path / "fp32" / "pytorch_model.bin", weights_only=True)
    assert equal(first, {k: got[k] for k in first})
    for leftover in [e.name for e in (tmp_path / "ckpt").iterdir() if e.name.startswith(".")]:
        r = zb("zero-to-fp32", str(tmp_path / "ckpt"), str(tmp_path / "bad"), "--tag", leftover)
        assert r.returncode != 0 and len(r.stderr.strip().splitlines()) == 1, r.stderr


@pytest.mark.slow
def test_a_rank_killed_at_a_random_point_of_a_save(tmp_path):
    """20 seeds: a random rank dies at a random call of the second save (a re-save of the tag, or a new tag)."""
    counts = {}
    for tag2 in ("final", None):
        work = tmp_path / f"measure-{tag2}"
        work.mkdir()
        counts[tag2] = run_distributed(F.measure_save, 2, str(work), 2, tag2)
    outcomes = []
    for seed in range(20):
        rng = random.Random(seed)
        tag2, victim = rng.choice(["final", None]), rng.randrange(2)
        event = rng.randrange(1, counts[tag2][victim] + 1)
        out = tmp_path / f"seed{seed}"
        out.mkdir()
        try:
            run_distributed(F.killed_at_random, 2, str(out), 2, tag2, victim, event)
            killed = False
        except DistributedFailure:
            killed = True
        first, second = expected(out)
        latest = check_whole_or_refused(out, [first, second])
        outcomes.append((killed, latest, equal(loaded(out / "ckpt"), second)))
    assert sum(k for k, _, _ in outcomes) >= 15, outcomes  # the kill points fall inside the save
    assert any(not new for _, _, new in outcomes) and any(new for _, _, new in outcomes), outcomes


def test_a_rank_that_cannot_write_fails_the_save_on_every_rank(tmp_path):
    errors = run_distributed(F.resave_with_a_full_disk, 2, str(tmp_path), 1, timeout=120)
    assert errors[1].startswith("OSError: [Errno 28] No space left on device"), errors
    assert errors[0].startswith("CheckpointSaveError: rank 1 could not write its files of checkpoint "), errors
    assert "a checkpoint already there is unchanged" in errors[0]
    first, second = expected(tmp_path)
    check_whole_or_refused(tmp_path, [first, second])
    assert equal(loaded(tmp_path / "ckpt"), first)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["final", "latest"]  # nothing staged is left
