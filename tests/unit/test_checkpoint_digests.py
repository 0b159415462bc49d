"""A checkpoint's files against the SHA-256 digests its manifest records: ``torch.load`` checks no checksum of a
tensor's bytes, so before these a bit flipped on disk in a shard loaded as a different weight without a word."""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers.ds import ds_apply_zero
from zerobench.distributed.collectives import Group
from zerobench.files import file_digest
from zerobench.zero import ZeroConfig
from zerobench.zero.compat.deepspeed.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
from zerobench.zero.state import reading
from zerobench.zero.state.checkpoint import consolidate, load_sharded, save_sharded
from zerobench.zero.state.reading import MANIFEST, CheckpointMismatch
from zerobench.zero.state.shards import full_parameters
from zerobench.zero.state.transaction import SUM

ONE = Group(None, "dp", 1, 0)


def engine(group: Group = ONE, seed: int = 0):
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(8, 8), nn.BatchNorm1d(8), nn.Linear(8, 1))
    return ds_apply_zero(model, group, ZeroConfig(stage=2, bucket_numel=40))


def trained():
    e = engine()
    e.backward(e(torch.ones(4, 8)).sum())
    e.step()
    e.lr_scheduler = torch.optim.lr_scheduler.StepLR(e.optimizer, 2)
    return e


def flip_a_value(shard: Path, index: int = 3) -> None:
    """Flip the lowest bit of the fp32 master value ``index`` in ``shard``'s bytes: the file still loads, one
    weight differs by one unit in the last place."""
    value = torch.load(shard, weights_only=True)["master"][index : index + 1].numpy().tobytes()
    data = bytearray(shard.read_bytes())
    at = data.find(value)
    assert at > 0 and data.count(value) == 1
    data[at] ^= 0x01
    shard.write_bytes(bytes(data))


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_a_bit_flipped_in_a_shard_s_values_is_refused_and_nothing_loads(tmp_path):
    saved = trained()
    save_sharded(saved, tmp_path / "c")
    flip_a_value(tmp_path / "c" / "shard-00000.pt")
    fresh = engine(seed=1)
    before = {k: v.clone() for k, v in full_parameters(fresh).items()}
    with pytest.raises(CheckpointMismatch, match=r"shard-00000\.pt is damaged: its SHA-256 is .* its save recorded"):
        load_sharded(fresh, tmp_path / "c")
    assert same(full_parameters(fresh), before)
    with pytest.raises(CheckpointMismatch, match=r"shard-00000\.pt is damaged: its SHA-256"):
        consolidate(tmp_path / "c")


@pytest.mark.parametrize(
    "name", ["shard-00000.pt", "meta.json", "module_extra.pt", "client_state.pt", "lr_scheduler.pt"]
)
def test_every_file_a_load_reads_is_checked(tmp_path, name):
    """A byte changed in the middle of any file ``load_checkpoint`` reads: refused in one line naming the file, and
    the engine is left as it was."""
    saved = trained()
    saved.save_checkpoint(tmp_path / "ckpt", tag="t", client_state={"epoch": 3, "seen": torch.arange(5)})
    f = tmp_path / "ckpt" / "t" / name
    data = bytearray(f.read_bytes())
    data[len(data) // 2] ^= 0x20
    f.write_bytes(bytes(data))
    fresh = engine(seed=1)
    fresh.lr_scheduler = torch.optim.lr_scheduler.StepLR(fresh.optimizer, 2)
    before = {k: v.clone() for k, v in full_parameters(fresh).items()}
    with pytest.raises(CheckpointMismatch, match=rf"{name.replace('.', '[.]')} is damaged: its SHA-256") as e:
        fresh.load_checkpoint(tmp_path / "ckpt")
    assert "\n" not in str(e.value)
    assert same(full_parameters(fresh), before) and fresh.global_steps == 0
    if name not in {"lr_scheduler.pt", "client_state.pt"}:  # (the offline export reads neither)
        with pytest.raises(CheckpointMismatch, match="its SHA-256"):
            get_fp32_state_dict_from_zero_checkpoint(tmp_path / "ckpt")


def test_the_manifest_records_every_file_s_digest_and_no_sidecar_is_left(tmp_path):
    trained().save_checkpoint(tmp_path / "ckpt", tag="t", client_state={"epoch": 3})
    top = tmp_path / "ckpt" / "t"
    man = json.loads((top / MANIFEST).read_text())
    assert set(man["sha256"]) == set(man["files"]) and len(man["files"]) >= 5
    assert all(man["sha256"][f] == file_digest(top / f) for f in man["files"])
    assert not list(top.rglob(f"*{SUM}"))
    assert sorted(p.name for p in top.iterdir()) == sorted([*man["files"], MANIFEST])


def test_a_checkpoint_saved_before_digests_loads(tmp_path):
    saved = trained()
    save_sharded(saved, tmp_path / "c")
    man = json.loads((tmp_path / "c" / MANIFEST).read_text())
    del man["sha256"]
    (tmp_path / "c" / MANIFEST).write_text(json.dumps(man))
    fresh = engine(seed=1)
    load_sharded(fresh, tmp_path / "c")
    assert same(full_parameters(fresh), full_parameters(saved))


@pytest.mark.dist
def test_each_rank_hashes_only_the_shards_it_loads_from(tmp_path):
    """At 400 ranks every rank reading every shard to hash it would read the whole checkpoint 400 times: a rank
    checks the shards it copies from (its own at the same DP size), and one process loading them all checks all."""
    from tests.helpers.dist import run_distributed

    run_distributed(_save, 2, str(tmp_path / "c"))
    hashed = run_distributed(_load_counting, 2, str(tmp_path / "c"))
    assert hashed == [["meta.json", "shard-00000.pt"], ["meta.json", "shard-00001.pt"]]
    with hashed_files() as seen:
        load_sharded(engine(), tmp_path / "c")
    assert sorted(set(seen)) == ["meta.json", "shard-00000.pt", "shard-00001.pt"]


@contextlib.contextmanager
def hashed_files():
    """The names of the files a load hashes (``reading.file_digest``'s calls) while inside."""
    seen: list[str] = []
    real = reading.file_digest

    def counting(path):
        seen.append(Path(path).name)
        return real(path)

    reading.file_digest = counting
    try:
        yield seen
    finally:
        reading.file_digest = real


def _group(rank: int, world: int) -> Group:
    from tests.helpers.scenarios import dp_groups

    return dp_groups(rank, world, [world])[world]


def _save(rank: int, world: int, path: str) -> None:
    e = engine(_group(rank, world))
    e.backward(e(torch.ones(4, 8) * (rank + 1)).sum())
    e.step()
    save_sharded(e, path)


def _load_counting(rank: int, world: int, path: str) -> list[str]:
    with hashed_files() as seen:
        load_sharded(engine(_group(rank, world), seed=1), path)
    return sorted(set(seen))


def test_a_damaged_shard_that_looks_like_another_save_s_is_named_damaged(tmp_path):
    save_sharded(trained(), tmp_path / "c")
    f = tmp_path / "c" / "shard-00000.pt"
    torch.save({**torch.load(f, weights_only=True), "save_id": "0" * 16}, f)
    with pytest.raises(CheckpointMismatch, match=r"shard-00000\.pt is damaged: its SHA-256"):
        load_sharded(engine(seed=1), tmp_path / "c")


def test_a_file_its_save_did_not_write_is_refused(tmp_path):
    """A per-rank client state left by another copy of the checkpoint synced over it (``rsync`` without
    ``--delete``): found by its name, it was returned as this rank's state."""
    trained().save_checkpoint(tmp_path / "ckpt", tag="t", client_state={"epoch": 3})
    torch.save({"epoch": 999}, tmp_path / "ckpt" / "t" / "client_state-rank00000.pt")
    with pytest.raises(CheckpointMismatch, match=r"client_state-rank00000\.pt is not one its save wrote"):
        engine(seed=1).load_checkpoint(tmp_path / "ckpt")


@pytest.mark.dist
@pytest.mark.parametrize("option", ["load_module_only", "load_optimizer_states"])
def test_a_damaged_shard_a_weights_only_load_skips_cannot_drop_weights(tmp_path, option):
    """The last shard decided which saved parameters a weights-only load had to fill; renamed by damage, nothing was
    copied from it, so it was never checked, and the parameters it held stayed unloaded without a word."""
    from tests.helpers.dist import run_distributed

    run_distributed(_save_tagged, 2, str(tmp_path / "ckpt"))
    f = tmp_path / "ckpt" / "t" / "shard-00001.pt"
    sd = torch.load(f, weights_only=True)
    sd["params"] = {f"{k}~": v for k, v in sd["params"].items()}
    sd["segments"] = [[f"{n}~", a, b] for n, a, b in sd["segments"]]
    torch.save(sd, f)
    fresh = engine(seed=1)
    before = {k: v.clone() for k, v in full_parameters(fresh).items()}
    kwargs = {"load_module_only": True} if option == "load_module_only" else {"load_optimizer_states": False}
    with pytest.raises(CheckpointMismatch, match=r"shard-00001\.pt is damaged: its SHA-256"):
        fresh.load_checkpoint(tmp_path / "ckpt", **kwargs)
    assert same(full_parameters(fresh), before)


def _save_tagged(rank: int, world: int, path: str) -> None:
    e = engine(_group(rank, world))
    e.backward(e(torch.ones(4, 8) * (rank + 1)).sum())
    e.step()
    e.save_checkpoint(path, tag="t")
