"""What a checkpoint directory refuses, in one process: not a whole save, a damaged or torn one, a bad tag, a
target that holds other files; and the default tag that counts skipped steps, so no save overwrites another."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
from torch import nn

from tests.helpers.checkpoint_files import forget_digests
from tests.helpers.ds import ds_apply_zero
from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group
from zerobench.zero import LossScaleConfig, ZeroConfig
from zerobench.zero.compat.deepspeed.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
from zerobench.zero.state.checkpoint import consolidate, load_sharded, save_sharded
from zerobench.zero.state.reading import MANIFEST, CheckpointMismatch
from zerobench.zero.state.shards import full_parameters, union_length

ONE = Group(None, "dp", 1, 0)


def engine(stage: int = 2, **cfg):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 8), nn.ReLU(), nn.Linear(8, 1))
    return ds_apply_zero(model, ONE, ZeroConfig(stage=stage, bucket_numel=40, **cfg))


def step(e, scale: float = 1.0) -> None:
    e.backward(e(torch.ones(4, 8)).sum() * scale)
    e.step()


@pytest.mark.parametrize(
    "intervals, n",
    [
        ([], 0),
        ([(0, 4)], 4),
        ([(0, 4), (4, 6)], 6),
        ([(0, 4), (2, 6)], 6),
        ([(2, 6), (0, 4), (0, 4)], 6),
        ([(0, 10), (2, 3)], 10),
        ([(0, 2), (5, 7)], 4),
    ],
)
def test_coverage_counts_each_element_once(intervals, n):
    assert union_length(intervals) == n


def test_a_resave_replaces_the_checkpoint_whole(tmp_path):
    a = engine()
    save_sharded(a, tmp_path / "c")
    step(a)
    save_sharded(a, tmp_path / "c")
    b = engine()
    load_sharded(b, tmp_path / "c")
    assert all(torch.equal(x, full_parameters(a)[k]) for k, x in full_parameters(b).items())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]  # nothing staged is left beside it


def test_a_directory_of_other_files_is_not_overwritten(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match="holds files that are not a checkpoint"):
        save_sharded(engine(), tmp_path)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


@pytest.mark.parametrize(
    "record, text",
    [("meta.json", '{"experiment": "run1"}'), ("meta.json", "{}"), (MANIFEST, '{"name": "app"}')],
    ids=["meta-json-of-an-experiment", "empty-meta-json", "web-app-manifest"],
)
def test_a_directory_holding_a_file_named_like_a_checkpoint_s_record_is_not_deleted(tmp_path, record, text):
    """A directory was taken for a checkpoint, and replaced whole (its files deleted), by the mere presence of a
    ``meta.json`` or ``manifest.json``; it is a checkpoint only by its own records (a manifest of this format, or a
    shard directory's ``meta.json``), and only the files they name may be replaced."""
    target = tmp_path / "run1"
    target.mkdir()
    (target / record).write_text(text)
    (target / "train_log.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"holds files that are not a checkpoint's \(.*train_log.txt"):
        save_sharded(engine(), target)
    with pytest.raises(ConfigError, match=r"holds files that are not a checkpoint's"):
        engine().save_checkpoint(tmp_path, tag="run1")
    assert sorted(p.name for p in target.iterdir()) == sorted([record, "train_log.txt"])


@pytest.mark.parametrize("legacy", [False, True])
def test_a_file_added_inside_a_checkpoint_is_not_deleted_by_a_resave(tmp_path, legacy):
    """A checkpoint's own files are replaced by a re-save (this format's, and one saved before manifests); a file
    someone put beside them is not the checkpoint's, so the save is refused rather than deleting it."""
    a = engine(stage=0)
    save_sharded(a, tmp_path / "c")
    if legacy:
        _legacy(tmp_path / "c")
    save_sharded(a, tmp_path / "c")  # a checkpoint alone is replaced
    (tmp_path / "c" / "notes.txt").write_text("mine")
    with pytest.raises(ConfigError, match=r"not a checkpoint's \(notes.txt\)"):
        save_sharded(a, tmp_path / "c")
    assert (tmp_path / "c" / "notes.txt").read_text() == "mine"


def test_a_save_that_never_committed_is_refused(tmp_path):
    save_sharded(engine(), tmp_path / "c")
    (tmp_path / "c" / MANIFEST).unlink()
    with pytest.raises(CheckpointMismatch, match="its save never finished"):
        load_sharded(engine(), tmp_path / "c")
    with pytest.raises(CheckpointMismatch, match="its save never finished"):
        consolidate(tmp_path / "c")


@pytest.mark.parametrize("tp", [False, True])
def test_a_whole_checkpoint_under_a_staging_name_is_refused(tmp_path, tp):
    """What a save stopped inside its commit leaves: the staged save with its manifest, not yet renamed, or the
    checkpoint an exchange replaced, not yet removed. Both are whole; neither is the checkpoint, so neither loads."""
    save_sharded(engine(), tmp_path / "c")
    staged = tmp_path / ".c.saving-00c0ffee00c0ffee"
    shutil.copytree(tmp_path / "c", staged / "tp-00" if tp else staged)
    if tp:  # a TP save's layout: the manifest at the top, one directory per TP rank
        (staged / "tp-00" / MANIFEST).rename(staged / MANIFEST)
    if not tp:
        with pytest.raises(CheckpointMismatch, match=r"staging directory, not a checkpoint .*; load .*/c$"):
            load_sharded(engine(), staged)
    with pytest.raises(CheckpointMismatch, match=r"staging directory, not a checkpoint .*; load .*/c$"):
        consolidate(staged / "tp-00" if tp else staged)
    b = engine()
    load_sharded(b, tmp_path / "c")  # the checkpoint itself loads


def _legacy(path, step_of=None):
    """The checkpoint at ``path`` as a release before manifests wrote it (optionally one shard's step changed)."""
    (path / MANIFEST).unlink()
    meta = json.loads((path / "meta.json").read_text())
    del meta["save_id"]
    (path / "meta.json").write_text(json.dumps(meta))
    for f in sorted(path.glob("shard-*.pt")):
        sd = torch.load(f, weights_only=True)
        del sd["save_id"]
        if step_of == f.name:
            sd["step"] += 2
        torch.save(sd, f)


def test_a_checkpoint_from_before_manifests_loads_and_a_torn_one_is_refused(tmp_path):
    a = engine(stage=0)
    step(a)
    save_sharded(a, tmp_path / "c")
    _legacy(tmp_path / "c")
    b = engine(stage=0)
    load_sharded(b, tmp_path / "c")
    assert all(torch.equal(x, full_parameters(a)[k]) for k, x in full_parameters(b).items())


@pytest.mark.parametrize("digests", [True, False], ids=["digests", "saved-before-digests"])
def test_shards_of_two_saves_are_refused(tmp_path, digests):
    """A shard of another save put in a checkpoint's place: its manifest's digests refuse the edited files; where the
    manifest records none (saved before it did), the shard's save id does."""
    a = engine()
    save_sharded(a, tmp_path / "c")
    if not digests:
        forget_digests(tmp_path / "c")
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    shard = torch.load(tmp_path / "c" / "shard-00000.pt", weights_only=True)
    # a second shard written by another save: a legacy checkpoint would show it by its step, a new one by its id
    other = dict(
        shard,
        save_id="0" * 16,
        shard=1,
        segments=[],
        master=torch.empty(0),
        exp_avg=torch.empty(0),
        exp_avg_sq=torch.empty(0),
    )
    torch.save(other, tmp_path / "c" / "shard-00001.pt")
    meta["num_shards"] = 2
    (tmp_path / "c" / "meta.json").write_text(json.dumps(meta))
    man = json.loads((tmp_path / "c" / MANIFEST).read_text())
    man["dirs"]["."].append("shard-00001.pt")
    (tmp_path / "c" / MANIFEST).write_text(json.dumps(man))
    words = r"meta\.json is damaged: its SHA-256" if digests else r"is torn: shard-00001\.pt is from another save"
    with pytest.raises(CheckpointMismatch, match=words):
        consolidate(tmp_path / "c")


@pytest.mark.dist
def test_a_legacy_checkpoint_with_shards_of_two_steps_is_refused(tmp_path):
    from tests.helpers.dist import run_distributed

    run_distributed(_two_shards, 2, str(tmp_path / "c"))
    _legacy(tmp_path / "c", step_of="shard-00001.pt")
    with pytest.raises(CheckpointMismatch, match=r"is torn: shard-00001\.pt is from another save than shard-00000\.pt"):
        consolidate(tmp_path / "c")


def _two_shards(rank: int, world: int, path: str) -> None:
    from tests.helpers.scenarios import dp_groups

    group = dp_groups(rank, world, [world])[world]
    torch.manual_seed(0)
    e = ds_apply_zero(nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 1)), group, ZeroConfig(stage=2, bucket_numel=40))
    save_sharded(e, path)


@pytest.mark.parametrize("tag", ["global_step*", "global_step[5]", "global_step?"])
def test_a_tag_with_pattern_characters_leaves_another_tag_s_set_aside_copy(tmp_path, tag):
    """The sweep after a commit globbed the tag unescaped: a save under ``global_step*`` deleted
    ``.global_step5.replaced-*``, the only whole copy of ``global_step5`` after a replacement that stopped."""
    import zerobench.zero.state.transaction as T

    e = engine()
    e.save_checkpoint(tmp_path, tag="global_step5")
    aside = tmp_path / ".global_step5.replaced-0123456789abcdef"
    (tmp_path / "global_step5").rename(aside)  # the replacement that stopped between its renames
    e.save_checkpoint(tmp_path, tag=tag)
    assert aside.is_dir() and T.replaced_copy(tmp_path / "global_step5") == aside
    assert T.replaced_copy(tmp_path / tag) is None


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda m: m.write_text('{"format": "zerobench-zero-shard/1", "num_'), "meta.json is damaged"),
        (
            lambda m: m.write_text(json.dumps({**json.loads(m.read_text()), "num_shards": 10**12})),
            "is torn: meta.json names",
        ),
        (lambda m: m.write_text(json.dumps({**json.loads(m.read_text()), "num_shards": "x"})), "num_shards 'x'"),
    ],
)
@pytest.mark.parametrize("digests", [True, False], ids=["digests", "saved-before-digests"])
def test_a_damaged_meta_json_is_one_line_at_once(tmp_path, damage, words, digests):
    save_sharded(engine(), tmp_path / "c")
    if digests:
        words = "meta.json is damaged: its SHA-256"
    else:
        forget_digests(tmp_path / "c")
    damage(tmp_path / "c" / "meta.json")
    t0 = time.monotonic()
    for load in (lambda: load_sharded(engine(), tmp_path / "c"), lambda: consolidate(tmp_path / "c")):
        with pytest.raises((CheckpointMismatch, FileNotFoundError)) as e:
            load()
        assert words in str(e.value) and "\n" not in str(e.value)
    assert time.monotonic() - t0 < 30  # not a list of 10**12 file names


def test_a_huge_shard_count_without_a_manifest_is_refused_without_listing_it(tmp_path):
    save_sharded(engine(), tmp_path / "c")
    _legacy(tmp_path / "c")
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    (tmp_path / "c" / "meta.json").write_text(json.dumps({**meta, "num_shards": 10**12}))
    with pytest.raises(FileNotFoundError, match=r"meta\.json names 1000000000000 shards, the directory holds 1"):
        consolidate(tmp_path / "c")


@pytest.mark.parametrize("tag", ["latest", "", ".", "..", ".hidden", "a/b", "../up"])
def test_a_tag_that_cannot_name_a_checkpoint_is_refused_before_writing(tmp_path, tag):
    with pytest.raises(ConfigError, match="must be one directory name"):
        engine().save_checkpoint(tmp_path / "ckpt", tag=tag)
    assert not (tmp_path / "ckpt").exists() or not any((tmp_path / "ckpt").iterdir())


def test_the_default_tag_counts_skipped_steps(tmp_path):
    """fp16 steps skipped on overflow still count (DeepSpeed's ``global_steps``): each save gets its own tag."""
    e = engine(precision="fp16", loss_scale=LossScaleConfig(init_scale=2.0**8))
    paths = []
    for scale in (float("inf"), float("inf"), 1.0):
        step(e, scale)
        paths.append(e.save_checkpoint(tmp_path / "ckpt").name)
    assert paths == ["global_step1", "global_step2", "global_step3"] and e.adamw.step_count == 1
    assert (tmp_path / "ckpt" / "latest").read_text() == "global_step3"
    assert sorted(get_fp32_state_dict_from_zero_checkpoint(tmp_path / "ckpt", "global_step1")) == sorted(
        get_fp32_state_dict_from_zero_checkpoint(tmp_path / "ckpt")
    )


@pytest.mark.parametrize("lost", ["client_state.pt", "module_extra.pt", "shard-00000.pt"])
def test_a_checkpoint_that_lost_a_file_beside_its_shards_is_refused(tmp_path, lost):
    """The manifest lists every file of the save, not only the shards: a checkpoint missing its client state or
    its buffers is torn, not loaded with a warning and a default."""
    e = engine()
    e.save_checkpoint(tmp_path / "ckpt", tag="t", client_state={"epoch": 3})
    (tmp_path / "ckpt" / "t" / lost).unlink()
    with pytest.raises((CheckpointMismatch, FileNotFoundError), match=f"lacks {lost}"):
        engine().load_checkpoint(tmp_path / "ckpt", "t")


def test_a_replacement_without_an_atomic_exchange(tmp_path, monkeypatch):
    """Where the file system has no ``RENAME_EXCHANGE``, the old checkpoint is renamed aside, the new one renamed
    in, and the old one removed. Stopped between the two renames, the old one is whole under the aside name and a
    load says where; the next committed save to the tag removes that copy."""
    import zerobench.zero.state.transaction as T

    monkeypatch.setattr(T, "_exchange", lambda a, b: False)
    e = engine()
    e.save_checkpoint(tmp_path / "ckpt", tag="t")
    first = full_parameters(e)
    step(e)
    e.save_checkpoint(tmp_path / "ckpt", tag="t")  # a whole replacement, nothing left beside it
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["latest", "t"]
    second = full_parameters(e)
    step(e)
    renames, real = [], os.rename

    def rename(src, dst):
        renames.append(dst)
        if len(renames) == 2:  # the new one's rename into place: a crash here
            raise KeyboardInterrupt
        return real(src, dst)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.raises(KeyboardInterrupt):
        e.save_checkpoint(tmp_path / "ckpt", tag="t")
    monkeypatch.setattr(os, "rename", real)
    aside = T.replaced_copy(tmp_path / "ckpt" / "t")
    with pytest.raises(CheckpointMismatch, match=f"the previous one is whole in {aside}; rename it to"):
        engine().load_checkpoint(tmp_path / "ckpt", "t")
    aside.rename(tmp_path / "ckpt" / "restored")  # as the message says (under another tag, to keep the copy)
    b = engine()
    b.load_checkpoint(tmp_path / "ckpt", "restored")  # it is the second save, whole
    assert all(torch.equal(x, second[k]) for k, x in full_parameters(b).items())
    shutil.copytree(tmp_path / "ckpt" / "restored", aside)
    e.save_checkpoint(tmp_path / "ckpt", tag="t")  # the next committed save sweeps the copy away
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["latest", "restored", "t"]
    c = engine()
    c.load_checkpoint(tmp_path / "ckpt", "t")
    assert all(torch.equal(x, full_parameters(e)[k]) for k, x in full_parameters(c).items())
    assert not all(torch.equal(x, first[k]) for k, x in full_parameters(c).items())


@pytest.mark.parametrize(
    "damage, words",
    [
        (lambda d: (d / "t" / "shard-00000.pt").write_text("junk"), r"shard-00000.pt is damaged: "),
        (lambda d: ((d / "latest").unlink(), (d / "latest").mkdir()), r"latest is not a file naming a tag"),
        (lambda d: (d / "t" / "meta.json").write_text("{}"), r"meta.json is damaged: it has no 'params' object"),
        (lambda d: (d / "t" / "frozen.json").write_text("[1]"), r"frozen.json is damaged: not a list of names"),
        (lambda d: (d / "t" / "frozen.json").write_text('["x"]'), r"frozen.json is damaged: it names \['x'\]"),
    ],
    ids=["shard-is-text", "latest-is-a-directory", "meta-without-params", "frozen-not-names", "frozen-unknown"],
)
@pytest.mark.parametrize("digests", [True, False], ids=["digests", "saved-before-digests"])
def test_a_damaged_file_is_one_line_for_zero_to_fp32(tmp_path, capsys, damage, words, digests):
    """What a hand-edited or half-copied checkpoint does to ``zero-to-fp32`` (a helper's fuzzing found each as a
    traceback, or, for frozen.json, an exit 0 with the frozen parameters still in the output): a file's digest
    refuses it, and, saved before digests, the check of what it says."""
    from zerobench.cli import main

    e = engine()
    e.save_checkpoint(tmp_path / "ckpt", tag="t")
    if digests and "is damaged" in words:
        words = words[: words.index("is damaged")] + "is damaged: its SHA-256"
    elif not digests:
        forget_digests(tmp_path / "ckpt" / "t")
    damage(tmp_path / "ckpt")
    assert main(["zero-to-fp32", str(tmp_path / "ckpt"), str(tmp_path / "out"), "--exclude-frozen-parameters"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("zerobench: error: "), err
    with pytest.raises((CheckpointMismatch, FileNotFoundError), match=words):
        get_fp32_state_dict_from_zero_checkpoint(tmp_path / "ckpt", None, exclude_frozen_parameters=True)


@pytest.mark.parametrize("tag", ["v1 ", " v1", "a\nb"])
def test_a_tag_with_surrounding_whitespace_is_refused(tmp_path, tag):
    """'latest' is read back stripped (as DeepSpeed reads it): a save under 'v1 ' made the default load pick an older
    'v1' without a word, or fail to find its own checkpoint."""
    with pytest.raises(ConfigError, match="begins or ends with whitespace or holds a line break"):
        engine().save_checkpoint(tmp_path / "ckpt", tag=tag)


def test_a_save_dir_that_is_a_file_is_one_line(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match=r"save_dir .* is a file: give a directory"):
        engine().save_checkpoint(tmp_path / "f")


@pytest.mark.parametrize("where", ["", None, "  "])
def test_an_empty_or_missing_checkpoint_dir_is_refused_not_taken_for_the_cwd(tmp_path, monkeypatch, where):
    """``Path("")`` is the current directory: an unset variable saved the checkpoint into wherever the job started
    and loaded it back from there. DeepSpeed raises ``ValueError`` for both (its test_tag_validation's
    TestSaveCheckpointInvalidDir); ``ConfigError`` is one."""
    monkeypatch.chdir(tmp_path)
    e = engine()
    with pytest.raises(ValueError, match=r"save_checkpoint: save_dir is .*: give the checkpoint directory's path"):
        e.save_checkpoint(where)
    with pytest.raises(ValueError, match=r"load_checkpoint: load_dir is .*: give the checkpoint directory's path"):
        e.load_checkpoint(where)
    with pytest.raises(ValueError, match=r"save_sharded: path is .*: give the checkpoint directory's path"):
        save_sharded(e, where)
    with pytest.raises(ValueError, match=r"load_sharded: path is .*: give the checkpoint directory's path"):
        load_sharded(e, where)
    assert list(tmp_path.iterdir()) == []


def test_a_schedule_of_another_kind_is_refused_before_anything_loads(tmp_path):
    """A torch StepLR's state loaded into an engine scheduled by a LambdaLR: the weights and counters were loaded, then
    the scheduler failed (a DeepSpeed schedule: KeyError) or silently took the other's state (a torch one). It is
    refused in one line first, and the engine is left as it was."""
    saved = engine()
    saved.lr_scheduler = torch.optim.lr_scheduler.StepLR(saved.optimizer, 2)
    step(saved)
    saved.save_checkpoint(tmp_path / "ckpt")
    fresh = engine()
    fresh.lr_scheduler = torch.optim.lr_scheduler.LinearLR(fresh.optimizer)
    before = {k: v.clone() for k, v in full_parameters(fresh).items()}
    with pytest.raises(CheckpointMismatch, match="another learning-rate schedule than this engine's LinearLR"):
        fresh.load_checkpoint(tmp_path / "ckpt")
    after = full_parameters(fresh)
    assert all(torch.equal(before[k], after[k]) for k in before) and fresh.global_steps == 0


def test_an_optimizer_state_dict_refused_leaves_the_hyperparameters(tmp_path):
    """ZeroOptimizer.load_state_dict set the groups' lr from the state dict, then refused its shard: 'nothing was
    loaded', yet the learning rate was the other's."""
    a, b = engine(), engine()
    for g in a.optimizer.param_groups:
        g["lr"] = 0.5
    sd = a.optimizer.state_dict()
    sd["zero_shard"] = {**sd["zero_shard"], "segments": []}  # a shard refused (its segments hold nothing)
    lr = [g["lr"] for g in b.optimizer.param_groups]
    with pytest.raises(CheckpointMismatch, match="damaged shard 0"):
        b.optimizer.load_state_dict(sd)
    assert [g["lr"] for g in b.optimizer.param_groups] == lr


def test_a_schedule_saved_under_another_torch_version_loads(tmp_path):
    """torch adds and drops its schedulers' private keys between versions (``_is_initial`` now, ``verbose`` before):
    only the schedule's own keys must be there."""
    from zerobench.zero.compat.deepspeed.checkpoints import _check_scheduler

    live = torch.optim.lr_scheduler.StepLR(torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=0.1), 2)
    older = {k: v for k, v in live.state_dict().items() if k != "_is_initial"} | {"verbose": False}
    _check_scheduler(live, older, tmp_path)
    with pytest.raises(CheckpointMismatch, match=r"lacks \['step_size'\]"):
        _check_scheduler(live, {k: v for k, v in older.items() if k != "step_size"}, tmp_path)


def test_a_schedule_of_other_param_groups_is_refused_and_a_missing_private_list_is_not(tmp_path):
    """A torch schedule's per-group lists (``base_lrs``) must be as long as the engine's groups, or the load would
    leave a group undriven; a private list torch's other version lacks (``_last_lr``) does not matter."""
    from zerobench.zero.compat.deepspeed.checkpoints import _check_scheduler

    def sched(groups: int):
        params = [{"params": [nn.Parameter(torch.ones(1))]} for _ in range(groups)]
        return torch.optim.lr_scheduler.LambdaLR(torch.optim.SGD(params, lr=0.1), lambda s: 0.5**s)

    two = sched(2)
    _check_scheduler(two, {k: v for k, v in sched(2).state_dict().items() if k != "_last_lr"}, tmp_path)
    own = sched(2)
    own.history = [1, 2, 3]  # a list of a scheduler's own, not per group: another length is no refusal
    _check_scheduler(own, {**sched(2).state_dict(), "history": [1]}, tmp_path)
    with pytest.raises(
        CheckpointMismatch, match=r"schedule of 1 param group\(s\) \(base_lrs\), this engine's drives 2"
    ):
        _check_scheduler(two, sched(1).state_dict(), tmp_path)


def test_a_checkpoint_of_another_precision_leaves_the_loss_scale(tmp_path):
    """An fp16 engine loading an fp32 or bf16 checkpoint took that run's disabled scaler's scale, 1.0, where fp16's
    small gradients flush to zero (a helper's review: 154 of 161 elements); as torch's ``GradScaler``, it keeps its
    own, and a disabled scaler loads nothing. An fp16 checkpoint still restores an fp16 engine's scale."""
    from zerobench.zero import Precision

    for precision in (Precision.FP32, Precision.BF16):
        a = engine(precision=precision)
        step(a)
        save_sharded(a, tmp_path / precision.value)
        b = engine(precision=Precision.FP16)
        fresh = b.scaler.state_dict()
        load_sharded(b, tmp_path / precision.value)
        assert b.scaler.enabled and b.scaler.state_dict() == fresh and fresh["scale"] > 1
    h = engine(precision=Precision.FP16)
    step(h, scale=float("inf"))  # an overflow: the scale backs off
    step(h)
    save_sharded(h, tmp_path / "fp16")
    assert h.scaler.scale < engine(precision=Precision.FP16).scaler.scale
    same = engine(precision=Precision.FP16)
    load_sharded(same, tmp_path / "fp16")
    assert same.scaler.state_dict() == h.scaler.state_dict()
    other = engine()
    load_sharded(other, tmp_path / "fp16")
    assert not other.scaler.enabled and other.scaler.scale == 1.0


def test_a_save_inside_an_accumulation_window_is_refused(tmp_path):
    """Saved after 1 of 2 micro-batches, the checkpoint lacked that micro-batch's gradient and the resumed run's
    windows started one micro-batch later, silently (a helper's review: 1e-2 off the uninterrupted run)."""
    e = engine(grad_accum_steps=2)
    e.backward(e(torch.ones(4, 8)).sum())
    for save in (lambda: save_sharded(e, tmp_path / "c"), lambda: e.save_checkpoint(tmp_path / "ds")):
        with pytest.raises(RuntimeError, match=r"inside an accumulation window \(1 of 2 micro-batches run\)"):
            save()
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []  # nothing staged is left, no `latest`
    e.step()  # (DeepSpeed's micro-step: not the window's end)
    e.backward(e(torch.ones(4, 8)).sum())
    e.step()
    save_sharded(e, tmp_path / "c")  # at the boundary
    b = engine(grad_accum_steps=2)
    load_sharded(b, tmp_path / "c")
    assert all(torch.equal(x, full_parameters(e)[k]) for k, x in full_parameters(b).items())


def test_a_first_save_stopped_before_naming_its_tag_is_not_taken_for_no_checkpoint(tmp_path):
    """A first ``save_checkpoint`` killed after its commit and before writing ``latest`` left a whole checkpoint and
    no ``latest``: ``load_checkpoint`` warned "no checkpoint to load" and returned (None, None), so a resume loop
    trained afresh beside it. It is refused in one line naming the checkpoints and how to load one; a directory
    with none (or only a save that never committed) still loads nothing, with DeepSpeed's warning."""
    a = engine()
    step(a)
    a.save_checkpoint(tmp_path, tag="first")
    (tmp_path / "latest").unlink()
    with pytest.raises(CheckpointMismatch) as e:
        engine().load_checkpoint(tmp_path)
    msg = str(e.value)
    assert "holds whole checkpoint(s) 'first' but no latest" in msg and "tag='first'" in msg and "\n" not in msg
    b = engine()
    b.load_checkpoint(tmp_path, tag="first")
    assert all(torch.equal(x, full_parameters(a)[k]) for k, x in full_parameters(b).items())
    (tmp_path / "first" / MANIFEST).unlink()  # not a whole checkpoint: nothing to take it for
    with pytest.warns(UserWarning, match="no checkpoint to load"):
        assert engine().load_checkpoint(tmp_path) == (None, None)


def test_the_staged_directories_are_flushed_before_the_commit_s_rename(tmp_path, monkeypatch):
    """Each file of a save is flushed as it is written, but its directory entry lives in the staging directory: a
    power loss after the commit's rename could leave a checkpoint whose files were never recorded, with the old one
    already replaced. The staging directory (and each ``tp-*`` one) is flushed before the rename puts it in
    place."""
    import zerobench.zero.state.transaction as T

    events = []
    real_rename, real_fsync = os.rename, T.fsync_dir
    monkeypatch.setattr(T, "fsync_dir", lambda d: (events.append(("fsync", Path(d).name)), real_fsync(d)))
    monkeypatch.setattr(T.os, "rename", lambda a, b: (events.append(("rename", Path(a).name)), real_rename(a, b)))
    save_sharded(engine(), tmp_path / "c")
    renamed = next(i for i, (what, _) in enumerate(events) if what == "rename")
    staged = events[renamed][1]
    assert staged.startswith(".c") and ("fsync", staged) in events[:renamed], events


def test_zero_to_fp32_writes_safetensors_and_shards_as_deepspeed_s_script_does(tmp_path):
    """DeepSpeed's ``zero_to_fp32.py`` takes ``--max_shard_size`` and ``--safe_serialization``; ``zerobench
    zero-to-fp32`` takes both: ``model.safetensors``, or Hugging Face's shards and index above the size, each read
    back equal to the consolidated state dict."""
    from safetensors.torch import load_file

    from zerobench.cli import main

    e = engine()
    step(e)
    e.save_checkpoint(tmp_path / "ckpt", tag="t")
    want = get_fp32_state_dict_from_zero_checkpoint(tmp_path / "ckpt", "t")
    assert main(["zero-to-fp32", str(tmp_path / "ckpt"), str(tmp_path / "safe"), "--safe-serialization"]) == 0
    got = load_file(tmp_path / "safe" / "model.safetensors")
    assert set(got) == set(want) and all(torch.equal(got[k], want[k]) for k in want)
    assert main(["zero-to-fp32", str(tmp_path / "ckpt"), str(tmp_path / "shards"), "--max-shard-size", "200"]) == 0
    index = json.loads((tmp_path / "shards" / "pytorch_model.bin.index.json").read_text())
    files = sorted(set(index["weight_map"].values()))
    assert len(files) > 1 and files[0] == f"pytorch_model-00001-of-{len(files):05d}.bin"
    merged = {}
    for f in files:
        merged.update(torch.load(tmp_path / "shards" / f, weights_only=True))
    assert set(merged) == set(want) and all(torch.equal(merged[k], want[k]) for k in want)


@pytest.mark.parametrize(
    ("first", "then"),
    [
        (["--max-shard-size", "200"], []),  # one file beside shards and their index
        ([], ["--safe-serialization"]),  # model.safetensors beside pytorch_model.bin
        ([], []),  # an export again over the earlier one
    ],
    ids=["shards then one file", "bin then safetensors", "again"],
)
def test_zero_to_fp32_never_mixes_two_exports_in_one_directory(tmp_path, capsys, first, then):
    """``zero-to-fp32`` wrote into a directory that held an earlier export, leaving stale shards, an index,
    ``pytorch_model.bin`` and ``model.safetensors`` side by side (``from_pretrained`` reads the index first). A
    directory holding any export's model files is refused in one line, left as it was; other files there are not
    the export's and do not stop it."""
    from tests.unit.test_bad_inputs import assert_one_line, run
    from zerobench.cli import main

    e = engine()
    step(e)
    e.save_checkpoint(tmp_path / "ckpt", tag="t")
    out = tmp_path / "out"
    assert main(["zero-to-fp32", str(tmp_path / "ckpt"), str(out), *first]) == 0
    before = {f.name: f.read_bytes() for f in out.iterdir()}
    code, err = run(["zero-to-fp32", str(tmp_path / "ckpt"), str(out), *then], capsys)
    assert_one_line(code, err, f"the output directory {out} already holds an earlier export")
    assert "empty it, or choose another directory" in err
    assert {f.name: f.read_bytes() for f in out.iterdir()} == before
    other = tmp_path / "other"
    other.mkdir()
    (other / "config.json").write_text("{}")
    assert main(["zero-to-fp32", str(tmp_path / "ckpt"), str(other), *then]) == 0


@pytest.mark.parametrize("inside", [".", "t", "t/fp32", "fp32"])
def test_zero_to_fp32_refuses_an_output_inside_the_checkpoint(tmp_path, capsys, inside):
    """The checkpoint's tag directory (or any directory in the checkpoint's) is no place for the export: its files
    would be mixed into the checkpoint's. Refused before anything is written or created."""
    from tests.unit.test_bad_inputs import assert_one_line, run
    from zerobench.zero.compat.deepspeed.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict

    e = engine()
    step(e)
    ckpt = tmp_path / "ckpt"
    e.save_checkpoint(ckpt, tag="t")
    files = sorted(p.relative_to(ckpt) for p in ckpt.rglob("*"))
    code, err = run(["zero-to-fp32", str(ckpt), str(ckpt / inside)], capsys)
    assert_one_line(code, err, "is inside the checkpoint directory")
    with pytest.raises(ConfigError, match="is inside the checkpoint directory"):
        convert_zero_checkpoint_to_fp32_state_dict(ckpt, ckpt / inside)
    assert sorted(p.relative_to(ckpt) for p in ckpt.rglob("*")) == files


class _NotAllowed:
    """A class ``weights_only`` loading does not allow (a checkpoint pickled with an object in it)."""


def test_a_file_weights_only_refuses_says_why_not_to_load_it_unsafely(tmp_path):
    """torch's refusal opens with advice to load again with ``weights_only=False``: false for a file that is not
    torch.save's at all, and a way to run the file's code. The line shown is the unpickler's cause."""
    from zerobench.zero.state.reading import load_file

    junk = tmp_path / "junk.pt"
    junk.write_bytes(b"not a checkpoint at all")
    with pytest.raises(CheckpointMismatch) as err:
        load_file(junk)
    assert str(err.value) == (
        f"checkpoint file {junk} is damaged: torch.load(weights_only=True) refused it: Unsupported operand 110"
    )
    pickled = tmp_path / "object.pt"
    torch.save({"w": torch.ones(2), "extra": _NotAllowed()}, pickled)
    with pytest.raises(CheckpointMismatch) as err:
        load_file(pickled)
    message = str(err.value)
    assert "\n" not in message and "weights_only` set to `False`" not in message
    assert message.startswith(f"checkpoint file {pickled} is damaged: torch.load(weights_only=True) refused it: ")
    assert "_NotAllowed" in message


def test_a_killed_save_s_staging_under_another_tag_is_swept_and_a_set_aside_copy_is_kept(tmp_path):
    """DeepSpeed's default tags count steps, so a save killed under ``global_step1`` was swept only by a later save
    to that same tag, which never comes: each such leftover held a whole save's bytes for good. The next committed
    save into the directory removes it; a copy set aside by a stopped replacement can be its tag's only whole copy,
    and stays."""
    e = engine()
    e.save_checkpoint(tmp_path / "ckpt", tag="a")
    killed = tmp_path / "ckpt" / ".global_step1.saving-00c0ffee00c0ffee"
    shutil.copytree(tmp_path / "ckpt" / "a", killed)
    aside = tmp_path / "ckpt" / ".b.replaced-00c0ffee00c0ffee"
    shutil.copytree(tmp_path / "ckpt" / "a", aside)
    elsewhere = tmp_path / ".c.saving-00c0ffee00c0ffee"  # beside a plain save_sharded path: another save's
    elsewhere.mkdir()
    step(e)
    e.save_checkpoint(tmp_path / "ckpt")
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [aside.name, "a", "global_step1", "latest"]
    save_sharded(e, tmp_path / "d")
    assert elsewhere.is_dir()
