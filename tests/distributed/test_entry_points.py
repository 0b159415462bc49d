"""How users reach the engine, beyond the GPT and ``build_mesh``: the DP group spelled as torch's APIs spell it
(``None``, ``dist.group.WORLD``, a 1-D ``DeviceMesh``), two engines in one backward, stage 3 driven through
submodules (the model's own forward never called), DeepSpeed's ``empty_partition_cache``, and the models the flat buffers cannot hold, refused in
one line. Parity is against single-process ``torch.optim.AdamW`` on the global batch (``helpers/entry_points.py``).
"""

from __future__ import annotations

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.entry_points import (
    bf16_fp32_inputs,
    conversions,
    group_spellings,
    refusals,
    submodules_called,
    units_by_class,
)
from tests.helpers.tiers import STAGES
from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group

pytestmark = pytest.mark.dist

TOL = 1e-6  # fp32, 3 AdamW steps at lr 1e-2: measured 1.5e-8


@pytest.mark.parametrize("stage", STAGES)
def test_dp_group_as_torch_spells_it_and_two_engines_in_one_backward(stage):
    for r in run_distributed(group_spellings, 2, stage, timeout=180):
        for name in ("none", "world", "mesh"):
            assert r[name] <= TOL, (name, r)
        assert {r["none_size"][0], r["world_size"][0], r["mesh_size"][0]} == {2}


@pytest.mark.parametrize("stage", STAGES)
def test_submodules_called_without_the_models_forward(stage):
    """DeepSpeed lets a loop call ``model.encoder(x)``; at stage 3 a module holding root parameters gathers the
    root on demand, and units called on their own start their pass (before: placeholders reached F.linear,
    and units called directly skipped their gather in the second backward)."""
    for r in run_distributed(submodules_called, 2, stage, timeout=180):
        assert r["root"] <= TOL and r["units"] <= TOL, r
        assert r["root_then_model_moved"] > 1e-4  # the model's own forward still trains afterwards


def partition_cache(rank: int, world: int, stage: int):
    """An evaluation through a submodule (stage 3 gathers the root on demand and keeps it), then
    ``empty_partition_cache()``, then training: (gathered bytes before, after, parity)."""
    import copy

    import torch
    from torch import nn

    from tests.helpers.entry_points import _config, _train, _two_nets
    from zerobench.zero.api import apply_zero

    a, b = _two_nets()
    ref = nn.Sequential(copy.deepcopy(a), copy.deepcopy(b))
    model = nn.Sequential(a, b)
    engine = apply_zero(model, None, _config(stage))
    with torch.no_grad():
        a(torch.ones(2, 4))

    def held() -> int:
        s = engine.gatherer
        return sum(t.untyped_storage().nbytes() for t in s.gathered_tensors()) if s is not None else 0

    before = held()
    engine.empty_partition_cache()
    return before, held(), _train(rank, world, [engine], model, ref)


@pytest.mark.parametrize("stage", STAGES)
def test_empty_partition_cache_frees_what_an_evaluation_gathered(stage):
    for before, after, diff in run_distributed(partition_cache, 2, stage, timeout=180):
        assert (before > 0) == (stage == 3) and after == 0, (before, after)
        assert diff <= TOL


@pytest.fixture(scope="module", params=STAGES)
def refused(request):
    return request.param, run_distributed(refusals, 2, request.param, timeout=180)


@pytest.mark.parametrize(
    "case, kind, words",
    [
        ("sparse", "ConfigError", "has sparse=True"),
        ("float64", "ConfigError", "is float64"),
        (
            "mixed_dtypes",
            "ConfigError",
            "the trained parameters mix dtypes ('0.weight' is float32, '1.weight' bfloat16)",
        ),
        (
            "half_model_fp32_precision",
            "ConfigError",
            "the trained parameters are bfloat16 ('1.weight') but the precision is fp32",
        ),
        ("sparse_functional", "RuntimeError", "sparse_coo gradient"),
        ("frozen_after", "UnusedParametersError", "frozen (requires_grad=False) after apply_zero"),
        (
            "frozen_after_unused_allowed",
            "UnusedParametersError",
            "['0.weight'] were frozen (requires_grad=False) after",
        ),
        ("added_after", "RuntimeError", "['1.weight', '1.bias'] were added to the model after apply_zero"),
        (
            "unfrozen_after",
            "RuntimeError",
            "['0.weight', '0.bias'] were unfrozen (requires_grad=True) after apply_zero",
        ),
        ("added_head_over_a_no_grad_backbone", "RuntimeError", "['2.weight', '2.bias'] were added to the model after"),
        ("tied_after", "RuntimeError", "['1.weight'] are no longer the model's: replaced after apply_zero"),
        ("frozen_after_plain_backward", "UnusedParametersError", "frozen (requires_grad=False) after apply_zero"),
        ("reshaped_after", "RuntimeError", "shape (6"),
        ("wrong_group", "ConfigError", "expected a torch.distributed ProcessGroup"),
        ("applied_twice", "ConfigError", "the model is already trained by a ZeRO engine"),
        ("converted_after", "ConfigError", "would detach its parameters from the engine's buffers"),
        ("to_empty_after", "ConfigError", "would detach its parameters from the engine's buffers"),
        ("submodule_converted", "RuntimeError", "parameter 'fc."),
    ],
)
def test_refused_in_one_line(refused, case, kind, words):
    _, ranks = refused
    for r in ranks:
        got = r[case]
        assert got is not None, f"{case} was accepted"
        assert got[0] == kind and words in got[1] and "\n" not in got[1], got


def test_a_parametrization_registered_while_partitioned_is_refused_at_stage3(refused):
    """Stages 0-2 take back what ``right_inverse`` set (``reattach``); at stage 3 it ran on the empty placeholder."""
    stage, ranks = refused
    for r in ranks:
        got = r["reset_while_partitioned"]
        if stage < 3:
            assert got is None, got
        else:
            assert got[0] == "RuntimeError" and "\n" not in got[1], got
            assert "was re-set (set_(), e.g. by register_parametrization's right_inverse) while stage 3" in got[1]


def test_submodule_converted_names_the_conversion(refused):
    """A submodule's ``.half()`` after ``apply_zero`` is found where it bites: its gradient's dtype at stages 0-2,
    its gather at stage 3 (before, stages 0-2 trained buffers the module no longer read, stage 3 undid it)."""
    stage, ranks = refused
    for r in ranks:
        _, msg = r["submodule_converted"]
        assert "converted after apply_zero" in msg and "torch.float16" in msg and "torch.float32" in msg, msg
        assert ("is torch.float16" if stage == 3 else "got a torch.float16 gradient") in msg, msg


@pytest.mark.parametrize("stage", STAGES)
def test_conversions_that_change_nothing_still_train(stage):
    """``model.float()``, ``.cpu()``, ``.to("cpu")`` of an fp32 CPU model after ``apply_zero``: torch gives back the same
    tensors, so they go through, and training matches one process."""
    for r in run_distributed(conversions, 2, stage, timeout=180):
        assert r["diff"] <= TOL, r


@pytest.mark.parametrize("stage", STAGES)
def test_bf16_engine_casts_fp32_inputs(stage):
    """fp32 tensors in the forward's arguments (positional, keyword, inside a dict) reach a bf16 model as bf16;
    integer ids pass as they are. Before: ``mat1 and mat2 must have the same dtype`` inside ``F.linear``."""
    for r in run_distributed(bf16_fp32_inputs, 2, stage, timeout=180):
        assert r["diff"] == 0.0 and r["dtype"] == "torch.bfloat16", r


def test_group_coerce_without_torch_distributed():
    """Before ``init_process_group``, ``None`` names no group: one line saying what to call."""
    import torch.distributed as dist

    assert not dist.is_initialized()
    with pytest.raises(ConfigError, match=r"not initialised: call torch\.distributed\.init_process_group"):
        Group.coerce(None, "dp", "apply_zero's dp_group")
    with pytest.raises(ConfigError, match="got int"):
        Group.coerce(3, "dp")
    g = Group(None, "dp", 1, 0)
    assert Group.coerce(g, "other") is g


@pytest.mark.parametrize("stage", STAGES)
def test_units_given_as_a_layer_class(stage):
    """FSDP's ``ModuleWrapPolicy`` spelling: every ``_Layer`` is a stage-3 unit; a model with a layer list but
    no ``blocks`` and no ``units`` is warned about at stage 3, naming the list to pass."""
    for r in run_distributed(units_by_class, 2, stage, timeout=180):
        assert r["diff"] <= TOL, r
        assert r["units"] == (3 if stage == 3 else None)
        if stage == 3:
            assert len(r["warnings"]) == 1 and "units=list(model.layers)" in r["warnings"][0], r["warnings"]
        else:
            assert r["warnings"] == []
        assert r["bad_class"][0] == "ConfigError" and "no submodule of that class" in r["bad_class"][1]
