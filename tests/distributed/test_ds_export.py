"""The trained model taken out of the engine as DeepSpeed's users take it (``zerobench/zero/export.py``,
``zerobench/zero/tensor_fragment.py``): ``engine.save_16bit_model`` (a plain ``state_dict`` file a model without
ZeRO loads strictly and computes the engine's forward with), DeepSpeed's ``zero_to_fp32`` functions on a
``save_checkpoint`` directory, and ``safe_get_full_fp32_param`` / ``safe_get_full_grad`` /
``safe_get_full_optimizer_state`` / ``safe_set_full_*`` per parameter, at stages 0-3, fp32, bf16 and fp16, world 2.
Before, none of these existed: ``full_parameters`` and ``consolidate`` gave the parameters only (no buffers, no frozen
layers) under other names."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.ds_export import ds_export, tp_export
from tests.helpers.tiers import tiered

pytestmark = pytest.mark.dist


@pytest.mark.parametrize("precision", tiered(("fp32", "bf16", "fp16"), fast=("bf16",)))
def test_the_trained_model_comes_out_whole_at_every_stage(precision, tmp_path):
    for rank, res in enumerate(run_distributed(ds_export, 2, precision, str(tmp_path), timeout=240)):
        assert res.pop("mid_window") == (
            "safe_get_full_grad before this window's gradients are reduced: call it "
            "after the last backward() of the window, before step()"
        )
        for stage, r in res.items():
            where = (precision, stage, rank, r)
            assert r["surface"] == (2, 1, rank, 2, precision == "fp16", precision == "bf16"), (
                where
            )  # DeepSpeed's queries
            assert r["export_files"] == ["model.bin", "nofrozen.bin"], where  # DP rank 0 wrote; no temporary left
            assert r["visible_on_return"] and r["fp32"] and r["frozen_none"] and r["moments"], where
            assert r["no_grad_after_step"] and r["grads"] and r["grad_nonzero"], where
            assert r["set_read_back"] and r["set_then_trained"] and r["trained_moved"] > 1e-4, where
            assert r["moment_read_back"] and r["other_moment_kept"], where
            assert "momentum_buffer" in r["bad_key"] and "exp_avg" in r["bad_key"], where
            if rank:
                continue
            assert r["keys"] == (True, []), where  # model.state_dict()'s keys, in its order, the tied head too
            assert r["dtypes"] and r["params_exact"] and r["tied_exact"] and r["state_exact"], where
            assert r["forward"] == 0.0, where  # the plain model in the training dtype computes the engine's loss
            assert r["nofrozen"] == ["frozen.bias", "frozen.weight"], where
            assert r["fp32_mismatch"] == [] and r["loaded_exact"] and r["converted"], where
            sharded = r["sharded"]  # DeepSpeed 0.19's max_shard_size and safe_serialization
            assert sharded["index"] == "pytorch_model.bin.index.json" and sharded["files"] > 1, sharded
            assert sharded["sharded_equal"] and sharded["safe"] == "model.safetensors" and sharded["safe_equal"], (
                sharded
            )
            assert r["fp32_nofrozen"] == ["frozen.bias", "frozen.weight"], where


def test_a_tp_model_has_no_one_state_dict(tmp_path):
    for sizes, msg in run_distributed(tp_export, 2):
        dp, mp, slices, wte = sizes
        assert (dp, mp) == (1, 2)  # engine.dp_world_size, engine.mp_world_size
        assert slices and wte == (256, 64), sizes  # tiny: half of the 512 vocabulary rows on each TP rank
        assert msg.startswith("ConfigError: a TP-sharded model has no one state dict") and "\n" not in msg, msg


def _failed_save_worker(rank: int, world: int, root: str) -> dict:
    """save_16bit_model to a file (refused on every rank), then a write that fails on DP rank 0."""
    import torch

    from zerobench.config import ConfigError
    from zerobench.zero import ZeroConfig, apply_zero, as_deepspeed
    from zerobench.zero.compat.deepspeed import engine as ds_engine
    from zerobench.zero.state.transaction import CheckpointSaveError

    engine = as_deepspeed(apply_zero(torch.nn.Linear(4, 2), None, ZeroConfig(stage=2)), micro_batch=1)
    out = {}
    try:
        engine.save_16bit_model(f"{root}/a-file")
    except ConfigError as e:
        out["file"] = f"{type(e).__name__}: {e}"

    def full_disk(sd, path):
        raise OSError(28, "No space left on device", str(path))

    ds_engine.save_whole = full_disk
    try:
        engine.save_16bit_model(f"{root}/export")
    except (OSError, CheckpointSaveError) as e:
        out["write"] = f"{type(e).__name__}: {e}"
    engine.backward(engine(torch.ones(1, 4)).sum())  # the ranks are still paired
    out["stepped"] = engine.step()
    return out


def test_a_save_16bit_model_that_fails_fails_on_every_rank(tmp_path):
    """A file as save_dir was rank 0's FileExistsError traceback while rank 1 waited in the barrier (then 'Connection
    closed by peer'); a failed write left the other ranks to fail in their next collective. Both are now settled
    across the ranks: one line on each, or the write's error on rank 0 and CheckpointSaveError naming it elsewhere."""
    (tmp_path / "a-file").write_text("x")
    r0, r1 = run_distributed(_failed_save_worker, 2, str(tmp_path), timeout=120)
    for r in (r0, r1):
        assert r["file"].startswith("ConfigError: save_16bit_model: save_dir") and "is a file" in r["file"], r
        assert r["stepped"] is True, r
    assert r0["write"].startswith("OSError: [Errno 28] No space left on device"), r0
    assert r1["write"].startswith("CheckpointSaveError: DP rank 0 could not write"), r1
