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
from zerobench.zero.state.reading import CheckpointMismatch
from zerobench.zero.state.shards import full_parameters

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


def tags_holding(root: Path, values: dict) -> list[str]:
    """The tags of ``root`` (not its staged leftovers) that load ``values`` bit for bit."""
    return [
        e.name
        for e in sorted(root.iterdir())
        if e.is_dir() and not e.name.startswith(".") and equal(loaded(root, e.name), values)
    ]


def kill_points(measured: dict, world: int, uniform: int, targeted: list[str], margin: int) -> list[tuple]:
    """(seed, where, tag, victim rank, call event) for each kill: ``uniform`` seeds draw the tag, the rank and the
    event over the whole second save; then one per entry of ``targeted`` kills the committing rank ``before``,
    ``inside`` or ``after`` its commit (``margin`` events clear of it), alternating the tag."""
    draws = []
    for seed in range(uniform):
        rng = random.Random(seed)
        tag2, victim = rng.choice(["final", None]), rng.randrange(world)
        draws.append((seed, "anywhere", tag2, victim, rng.randrange(1, measured[tag2][victim]["total"] + 1)))
    for seed, where in enumerate(targeted, start=uniform):
        rng, tag2 = random.Random(seed), ("final", None)[seed % 2]
        first = next(r for r, m in enumerate(measured[tag2]) if m["start"] is not None)  # the rank that commits
        commit = measured[tag2][first]
        low, high = {
            "before": (1, commit["start"] - margin),
            "inside": (commit["start"], commit["end"]),
            "after": (commit["end"] + margin, commit["total"]),
        }[where]
        assert low < high, (where, commit)
        draws.append((seed, where, tag2, first, rng.randint(low, high)))
    return draws


@pytest.mark.slow
def test_a_rank_killed_at_a_random_point_of_a_save(tmp_path):
    """A rank dies at a call event of the second save (a re-save of the tag, or a new tag). 20 seeds draw the rank
    and the event over the whole save; 8 more kill the committing rank just before, inside and after the commit
    (the rename that puts the staged directory in place), where the outcome is known: before it the first save is
    the only one there, after it the second is in place. Those 8 make the commit's window certain to be hit, which
    20 uniform draws over a save of thousands of events are not."""
    measured = {}
    for tag2 in ("final", None):
        work = tmp_path / f"measure-{tag2}"
        work.mkdir()
        measured[tag2] = run_distributed(F.measure_save, 2, str(work), 2, tag2)
    margin = 100  # call events: a save's count varies by about a dozen from run to run
    draws = kill_points(measured, 2, 20, ["before"] * 2 + ["inside"] * 3 + ["after"] * 3, margin)
    outcomes = []
    for seed, where, tag2, victim, event in draws:
        out = tmp_path / f"seed{seed}"
        out.mkdir()
        try:
            run_distributed(F.killed_at_random, 2, str(out), 2, tag2, victim, event)
            killed = False
        except DistributedFailure:
            killed = True
        first, second = expected(out)
        latest = check_whole_or_refused(out, [first, second])
        new = equal(loaded(out / "ckpt"), second)
        outcomes.append((where, killed, latest, new))
        root = out / "ckpt"
        if where == "before":  # the second save never reached its commit: nothing of it is loadable
            assert killed and latest == "final" and not new and not tags_holding(root, second), (seed, event)
        if where == "after":  # it was committed: its tag holds it, whether or not ``latest`` was moved yet
            holding = tags_holding(root, second)
            assert len(holding) == 1 and (tag2 is None or (holding == ["final"] and new)), (seed, event, holding)
    uniform = [o for o in outcomes if o[0] == "anywhere"]
    assert sum(k for _, k, _, _ in uniform) >= 15, uniform  # the kill points fall inside the save
    assert any(not new for *_, new in outcomes) and any(new for *_, new in outcomes), outcomes


def tp_saves(out: Path, tp: int) -> dict[int, list[dict[str, torch.Tensor]]]:
    """Each save's values, one dict per TP rank (``ckpt_faults._tp_record``)."""
    return {k: [torch.load(out / f"expected-{k}-tp{t:02d}.pt", weights_only=True) for t in range(tp)] for k in (1, 2)}


def tp_save_held(d: Path, saves: dict[int, list[dict]]) -> int | None:
    """Which save the TP checkpoint ``d`` holds, every one of its ``tp-XX`` directories from that one save (read
    by zero_to_fp32's path); None if they do not all hold the same save."""
    parts = [consolidate(d / f"tp-{t:02d}") for t in range(len(saves[1]))]
    for k, ranks in saves.items():
        if all(equal(want, {n: got[n] for n in want}) for want, got in zip(ranks, parts, strict=True)):
            return k
    return None


@pytest.mark.slow
def test_a_rank_of_a_tp_save_killed_at_a_random_point(tmp_path):
    """TP 2 x DP 2: a rank dies at a call event of the second save. Every tag then holds one save in all its
    ``tp-XX`` directories (never one TP rank's slices from each save), ``latest`` names one, and a staged
    leftover is refused. As above, 8 seeds draw over the whole save and 6 kill the committing rank before,
    inside and after its commit, where the outcome is asserted."""
    tp, stage, margin = 2, 2, 100
    measured = {}
    for tag2 in ("final", None):
        work = tmp_path / f"measure-{tag2}"
        work.mkdir()
        measured[tag2] = run_distributed(F.tp_measure_save, 4, str(work), tp, stage, tag2)
    draws = kill_points(measured, 4, 8, ["before", "inside", "after"] * 2, margin)
    outcomes = []
    for seed, where, tag2, victim, event in draws:
        out = tmp_path / f"seed{seed}"
        out.mkdir()
        try:
            run_distributed(F.tp_killed_at_random, 4, str(out), tp, stage, tag2, victim, event)
            killed = False
        except DistributedFailure:
            killed = True
        saves, root = tp_saves(out, tp), out / "ckpt"
        held = {}
        for entry in sorted(root.iterdir()):
            if entry.name == "latest":
                continue
            if entry.name.startswith("."):  # a save's leftovers: never loadable, whole or not
                for part in [entry, *sorted(entry.glob("tp-*"))]:
                    with pytest.raises(REFUSED):
                        consolidate(part)
                continue
            held[entry.name] = tp_save_held(entry, saves)
            assert held[entry.name] is not None, (seed, event, entry.name)  # torn across TP ranks
        latest = held[(root / "latest").read_text()]
        outcomes.append((where, killed, latest))
        if where == "before":
            assert killed and latest == 1 and 2 not in held.values(), (seed, event, held)
        if where == "after":
            assert list(held.values()).count(2) == 1 and (tag2 is None or held["final"] == 2), (seed, event, held)
    uniform = [o for o in outcomes if o[0] == "anywhere"]
    assert sum(k for _, k, _ in uniform) >= 6, uniform  # the kill points fall inside the save
    assert {latest for *_, latest in outcomes} == {1, 2}, outcomes


def test_a_rank_that_cannot_write_fails_the_save_on_every_rank(tmp_path):
    errors = run_distributed(F.resave_with_a_full_disk, 2, str(tmp_path), 1, timeout=120)
    assert errors[1].startswith("OSError: [Errno 28] No space left on device"), errors
    assert errors[0].startswith("CheckpointSaveError: rank 1 could not write its files of checkpoint "), errors
    assert "a checkpoint already there is unchanged" in errors[0]
    first, second = expected(tmp_path)
    check_whole_or_refused(tmp_path, [first, second])
    assert equal(loaded(tmp_path / "ckpt"), first)
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["final", "latest"]  # nothing staged is left
