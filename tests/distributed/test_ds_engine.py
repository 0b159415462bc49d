"""DeepSpeed's engine surface on the ZeRO engine, and checkpoints under tensor parallelism.

DeepSpeed's loop (``loss = engine(batch); engine.backward(loss); engine.step()``), ``train()``/``eval()``, and
``save_checkpoint(dir, tag, client_state)`` / ``load_checkpoint(dir)`` resuming exactly: model buffers and frozen
parameters included, the ``latest`` tag, the client state back. Under TP every TP rank keeps its own slices
(before, TP ranks wrote the same shard file and a resumed run loaded one rank's slices on every rank)."""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.ds_checkpoint import (
    ds_bad_input,
    ds_client_per_rank,
    ds_resume,
    ds_resume_other_world,
    tp_mismatch,
    tp_resume,
)
from tests.helpers.ds_checkpoint_options import (
    ds_load_by_name,
    ds_load_edited_and_scheduled,
    ds_load_options,
    ds_load_tied,
)
from tests.helpers.tiers import STAGES, tiered

pytestmark = pytest.mark.dist


@pytest.mark.parametrize("stage", STAGES)
def test_deepspeed_loop_and_checkpoint_resume_exactly(stage, tmp_path):
    for r in run_distributed(ds_resume, 2, stage, str(tmp_path / "ckpt")):
        assert r["tag"] == "global_step3" and r["latest"] == "global_step3"
        assert r["loaded_path"] == r["saved_path"]
        assert r["client"]["epoch"] == 3 and r["client"]["lr_history"] == [1e-2, 5e-3]
        assert r["client"]["t"] == [0, 1, 2]  # a tensor in the client state, back as one
        assert r["lr"] == [5e-3] and r["step"] == 3
        assert r["global_steps"] == (3, 5, 5), "global_steps must resume from the checkpoint, as DeepSpeed's"
        assert r["eval_mode"] == (False, False)
        assert r["state_diff"] == 0.0, "BatchNorm statistics or the frozen layer did not come back"
        assert r["moved"] > 1e-4, "training after the checkpoint changed nothing: vacuous comparison"
        assert r["param_diff"] == 0.0 and r["loss_diff"] == 0.0, r
        assert r["eval_diff"] == 0.0, "eval mode, which normalises with the running statistics, did not resume"
        assert r["per_rank_files"] == ["module_extra-dp00000.pt", "module_extra-dp00001.pt", "module_extra.pt"], r


@pytest.mark.parametrize("stage", [0, 3])
def test_each_rank_gets_its_own_buffers_back(stage, tmp_path):
    """Every rank got DP rank 0's BatchNorm statistics back (a helper's review): a resumed run's eval diverged from
    the uninterrupted one's on the other ranks. DeepSpeed gives each rank its own at stage 3; here each rank's own
    come back at every stage where the ranks' differ. A save by 2 ranks loaded by 1 warns, and rank 0 gets its own."""
    ranks = run_distributed(ds_resume, 2, stage, str(tmp_path / "ckpt"))
    assert ranks[0]["from_first"] == 0.0 and ranks[1]["from_first"] > 1e-3, "the ranks' statistics did not differ"
    for r in ranks:
        assert r["state_diff"] == 0.0 and r["eval_diff"] == 0.0, r
    (one,) = run_distributed(ds_resume_other_world, 1, stage, str(tmp_path / "ckpt"))
    assert one["diff"] == 0.0, one
    assert one["warned"] and "saved by 2 ranks, and this run has 1" in one["warned"][0], one


@pytest.mark.parametrize("stage", [1, 3])
def test_each_rank_gets_its_own_client_state_back(tmp_path, stage):
    """Each rank got rank 0's ``client_state`` back (a helper's review), where DeepSpeed gives each its own at stage
    3; and a state only rank 1 could not save raised there alone, before the transaction's agreement."""
    ranks = run_distributed(ds_client_per_rank, 2, str(tmp_path / "ckpt"), stage)
    for rank, r in enumerate(ranks):
        assert r["own"] == {"rank": rank, "offset": 1000 + rank}, r
        assert r["shared"] == {"epoch": 3} and r["shared_files"] == ["client_state.pt"], r
        assert r["own_files"] == ["client_state-rank00000.pt", "client_state-rank00001.pt", "client_state.pt"], r
        assert r["bad"].startswith("ConfigError: ") and "client_state must hold only tensors" in r["bad"], r
        assert "\n" not in r["bad"] and not r["bad_saved"], r
        assert r["agreed"] == "t2", r
    assert ranks[0]["bad"].startswith("ConfigError: rank 1's client_state cannot be saved: "), ranks[0]


def test_deepspeed_checkpoint_bad_input_is_one_line(tmp_path):
    for r in run_distributed(ds_bad_input, 2, str(tmp_path / "ckpt")):
        assert r["client"].startswith("ConfigError: client_state must hold only tensors and plain Python data")
        assert "\n" not in r["client"] and "BNNet" in r["client"], r["client"]
        assert r["tag"].startswith("FileNotFoundError: no checkpoint 'nope' in"), r["tag"]
        assert r["none"] == (None, None) and any("does not exist" in w for w in r["warned"])
        for name in ("client_state.pt", "module_extra.pt"):  # before: torch's zip reader, naming no file
            assert r[name].startswith("CheckpointMismatch: checkpoint file ") and f"{name} is damaged: " in r[name], r
            assert "\n" not in r[name]


@pytest.mark.parametrize("dp,stage", [(1, 0), *(pytest.param(2, s, marks=pytest.mark.slow) for s in (2, 3))])
def test_tp_checkpoint_keeps_each_tp_ranks_slices(dp, stage, tmp_path):
    world = 2 * dp
    res = run_distributed(tp_resume, world, dp, stage, str(tmp_path / "ckpt"))
    assert len({round(r["checksum"], 6) for r in res}) > 1, "TP ranks hold the same values: vacuous test"
    assert sorted((tmp_path / "ckpt" / "mid").iterdir())[-2:] == [
        tmp_path / "ckpt" / "mid" / d for d in ("tp-00", "tp-01")
    ]
    for r in res:
        assert r["load_diff"] == 0.0, r
        assert r["moved"] > 1e-4
        assert r["resume_diff"] == 0.0, r


def test_a_tp_checkpoint_refuses_another_tp_degree(tmp_path):
    for msg in run_distributed(tp_mismatch, 2, str(tmp_path / "ckpt")):
        assert msg.startswith("CheckpointMismatch: checkpoint ") and "was saved with TP 2, this engine has TP 1" in msg


@pytest.fixture(
    scope="module", params=[0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 3]
)
def load_options(request, tmp_path_factory):
    stage = request.param
    return stage, run_distributed(ds_load_options, 2, stage, str(tmp_path_factory.mktemp("ckpt")))


def test_load_optimizer_states_false_loads_weights_and_counters(load_options):
    """DeepSpeed's ``load_optimizer_states=False``: the saved weights (fp32 master, buffers, frozen layer) and
    ``global_steps``; this engine's own moments, step count and learning rate stay."""
    _, ranks = load_options
    for r in ranks:
        res = r["no_optimizer"]
        assert res["master"] == 0.0 and res["module"] == 0.0, res
        assert res["moments_kept"] and res["step"] == (1, 1) and res["lr"] == ([2e-3], [2e-3]), res
        assert res["global"] == (3, 1), "global_steps comes back with the weights, as DeepSpeed's"
        assert res["skipped"] == (2, 0), "skipped_steps comes back with the weights, as DeepSpeed's"
        assert res["path"] == "full" and res["client"] == {}


def test_load_module_only_loads_the_weights_alone(load_options):
    _, ranks = load_options
    for r in ranks:
        res = r["module_only"]
        assert res["master"] == 0.0 and res["module"] == 0.0, res
        assert res["moments_kept"] and res["step"] == (1, 1) and res["global"] == (1, 1), res
        assert res["skipped"] == (0, 0), res
        assert res["lr"] == ([2e-3], [2e-3]), res


def test_exclude_frozen_parameters_and_load_module_strict(load_options):
    """``save_checkpoint(..., exclude_frozen_parameters=True, save_latest=False)``: ``latest`` stays at the previous
    tag; a strict load names what is missing in one line, ``load_module_strict=False`` keeps this model's frozen
    layer and loads the rest."""
    _, ranks = load_options
    for r in ranks:
        assert r["latest"] == "full"
        msg = r["strict_error"]
        assert msg is not None and msg.startswith("ValueError: checkpoint ") and "\n" not in msg, msg
        assert "lacks ['frozen.bias', 'frozen.weight']" in msg and "load_module_strict=False" in msg, msg
        res = r["not_strict"]
        assert res["master"] == 0.0 and res["buffers"] == 0.0 and res["frozen_kept"] == 0.0, res
        assert res["step"] == 3 and res["lr"] == [5e-3], "a full load otherwise: moments, step and lr are the saved"


@pytest.fixture(
    scope="module", params=[0, pytest.param(1, marks=pytest.mark.slow), pytest.param(2, marks=pytest.mark.slow), 3]
)
def by_name(request, tmp_path_factory):
    return run_distributed(ds_load_by_name, 2, request.param, str(tmp_path_factory.mktemp("ckpt")))


def _loaded_alone(res: dict) -> None:
    """The saved weights came in where the names match, the engine's own moments and step stayed, and training
    goes on from there."""
    assert res["loaded"] == 0.0 and res["moved"] > 1e-4, res
    assert res["master_vs_module"] == 0.0, "the fp32 master must hold what the module holds"
    assert res["moments_kept"] and res["step"] == (1, 1), res
    assert res["trains"], res


def test_load_module_only_takes_a_layer_unfrozen_or_frozen_since_the_save(by_name):
    """DeepSpeed loads the module's state dict for ``load_module_only``: the trained set at save time does not
    matter. Before, a layer unfrozen since the save (or frozen) refused the load ("checkpoint is of another
    model")."""
    for r in by_name:
        for kind in ("unfrozen", "frozen_now"):
            _loaded_alone(r[kind])
            assert r[kind]["global"] == (1, 1), "load_module_only leaves the counters"


def test_load_optimizer_states_false_takes_other_param_groups(by_name):
    """Two param groups where the checkpoint has one: the weights and counters load, the groups' learning rates stay
    this engine's; a full load (which restores the groups) is refused in one line and changes nothing."""
    for r in by_name:
        res = r["groups"]
        _loaded_alone(res)
        assert res["global"] == (3, 1) and res["lr"] == ([1e-2, 3e-3], [1e-2, 3e-3]), res
        msg = res["full_load"]
        assert msg and msg.startswith("CheckpointMismatch: checkpoint has 1 param group(s), this engine 2"), msg
        assert "\n" not in msg and res["unchanged_after_refusal"], res


def test_load_module_strict_false_warm_starts_a_model_with_other_layers(by_name):
    """A warm start: a model with a layer the checkpoint lacks keeps that layer's own values and loads the rest; one
    lacking a saved layer loads what it has. Strict, both are refused in one line naming the keys, unchanged."""
    for r in by_name:
        for kind, keys in (("wider", "lacks ['extra.bias', 'extra.weight']"), ("narrower", "holds ['frozen.bias'")):
            res = r[kind]
            _loaded_alone(res)
            assert res["own_kept"] == 0.0, "the layer the checkpoint lacks must keep its own values"
            msg = res["strict"]
            assert msg and msg.startswith("ValueError: checkpoint ") and keys in msg, msg
            assert "load_module_strict=False" in msg and "\n" not in msg and res["unchanged_after_refusal"], res


@pytest.mark.parametrize("stage", [1, 3])
def test_weights_tied_otherwise_load_as_torch_load_state_dict(stage, tmp_path):
    """Saved tied and loaded untied, or the other way round (trained, or frozen here with one of the saved weights
    frozen when saved): every key holds what ``load_state_dict`` of the saved
    state dict gives (DeepSpeed's module load). The same tie with the head registered first loads as saved (before,
    it was refused as tied otherwise)."""
    for r in run_distributed(ds_load_tied, 2, stage, str(tmp_path)):
        for case in ("same", "untie", "tie", "tie_frozen"):
            assert r[case]["vs_torch"] == 0.0, (case, r)
        assert r["same"]["head_is_saved_head"] and r["untie"]["head_is_saved_head"], r


@pytest.mark.parametrize("stage", tiered((0, 2, 3), fast=(3,)))
def test_a_warm_start_keeps_the_new_layers_init_and_refuses_a_schedule_of_other_groups(stage, tmp_path):
    """bf16: the new layer's init, made in place after the engine was built, survives the load (before, the stale
    master was written back over it). A schedule saved for one param group would leave a second undriven: one line,
    nothing loaded."""
    for r in run_distributed(ds_load_edited_and_scheduled, 2, stage, str(tmp_path / "ckpt")):
        assert r["kept"] == 0.0, r
        msg = r["refused"]
        assert msg and msg.startswith("CheckpointMismatch: checkpoint ") and "1 param group(s)" in msg, msg
        assert "load_lr_scheduler_states=False" in msg and "\n" not in msg and r["unchanged"], r
