"""Hugging Face ``transformers`` models trained as DeepSpeed users train them, through ``zerobench.zero.initialize``
(``out = engine(input_ids=ids, labels=ids)``, ``engine.backward(out.loss)``, ``engine.step()``), at world 2 in fp32,
against single-process ``torch.optim.AdamW`` on the same global batch: a tiny GPT-2 (head tied to the token
embedding) and a tiny Llama (untied head, RMSNorm, rotary positions), stages 0-3, stage 3 with
initialize's default units (the decoder layers it finds), with the layers given and with none (the whole model one
unit), with HF's gradient checkpointing; the ``ModelOutput`` the engine returns;
the trained model taken out (``save_16bit_model``, ``zero_to_fp32``, ``gathered_params``) into
``save_pretrained``/``from_pretrained``, ties kept; ``generate`` on the stage-3 engine. Helpers:
``tests/helpers/hf_models.py``."""

from __future__ import annotations

import pytest

from tests.distributed.test_user_models import close  # the same tolerances
from tests.helpers.dist import run_distributed
from tests.helpers.hf_models import (
    SEQ,
    VOCAB,
    case_key,
    run_encoder_outputs_bf16,
    run_export,
    run_generate_lengths,
    run_parity,
)

pytest.importorskip("transformers", reason="Hugging Face transformers is not installed (pip install zerobench[test])")

pytestmark = pytest.mark.dist

STAGES = (0, 1, 2, 3)
# units: "" initialize's default (the decoder layers, found), "layers" given, "one" none (units=[]: the whole model)
FAST = [("gpt2", s, "", "") for s in STAGES] + [("gpt2", 3, "engine", "layers")]
SLOW = [("llama", s, "", "") for s in STAGES] + [
    ("llama", 3, "engine", "layers"),
    ("gpt2", 3, "", "one"),
    ("llama", 3, "", "one"),
    ("gpt2", 3, "model", ""),  # enabled on the model before initialize
    ("llama", 3, "reentrant", "layers"),  # HF's default checkpointing
    ("t5", 3, "", ""),  # an encoder-decoder: both stacks' layers are the default units
]
LAYER = {"gpt2": "GPT2Block", "llama": "LlamaDecoderLayer", "t5": "T5Block"}
N_LAYERS = {"gpt2": 2, "llama": 2, "t5": 4}
OUTPUT_TYPE = {"gpt2": "CausalLMOutputWithCrossAttentions", "llama": "CausalLMOutputWithPast", "t5": "Seq2SeqLMOutput"}


@pytest.fixture(scope="module")
def fast_grid():
    return run_distributed(run_parity, 2, FAST, timeout=300)


@pytest.fixture(scope="module")
def slow_grid():
    return run_distributed(run_parity, 2, SLOW, timeout=420)


def _check(ranks, kind: str, stage: int, ckpt: str, units: str) -> None:
    for r in ranks:
        res = r[case_key(kind, stage, ckpt, units)]
        assert "error" not in res, res["error"]
        assert res["missing"] == [], res
        assert res["max_update"] > 1e-3, "parameters did not move: the comparison would be vacuous"
        assert close(res), res
        assert res["checkpointing"] == [bool(ckpt)] * N_LAYERS[kind]  # on every layer
        out = res["output"]
        assert out["type"] == OUTPUT_TYPE[kind] and out["is_model_output"], out
        assert out["keys"][:2] == ["loss", "logits"] and out["same_loss"] and out["loss_grad"], out
        assert out["logits_shape"] == (2, SEQ, VOCAB), out
        if stage == 3:  # as in DeepSpeed, no forward gathers the whole model unless the user asks for one unit
            assert res["units"] == ([] if units == "one" else [LAYER[kind]] * N_LAYERS[kind]), res["units"]
            assert res["one_unit_warnings"] == 0, res


@pytest.mark.parametrize("kind, stage, ckpt, units", FAST, ids=[case_key(*c) for c in FAST])
def test_hf_model_parity(fast_grid, kind, stage, ckpt, units):
    """Stages 0-3 on GPT-2, whose tied head is one parameter under two names; stage 3 with gradient checkpointing
    (non-reentrant) re-gathering each decoder layer for its recomputation."""
    _check(fast_grid, kind, stage, ckpt, units)


@pytest.mark.slow
@pytest.mark.parametrize("kind, stage, ckpt, units", SLOW, ids=[case_key(*c) for c in SLOW])
def test_hf_model_parity_full(slow_grid, kind, stage, ckpt, units):
    _check(slow_grid, kind, stage, ckpt, units)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["gpt2", "llama"])
def test_stage3_model_saved_for_from_pretrained(kind, tmp_path):
    """After stage-3 training, the fp32 state dict from ``save_16bit_model`` and from ``save_checkpoint`` +
    ``get_fp32_state_dict_from_zero_checkpoint`` has the model's own keys (GPT-2's ``lm_head.weight`` too) and, through
    ``save_pretrained(dir, state_dict=...)`` and ``from_pretrained(dir)``, gives exactly the engine's fp32 master with
    GPT-2's head still tied; so does ``save_pretrained`` inside ``gathered_params()`` (outside it, refused in one
    line); and ``generate`` on the engine
    produces the reloaded model's tokens."""
    r = run_distributed(run_export, 2, kind, str(tmp_path), timeout=300)[0]
    assert r["dtypes_16bit"] == ["torch.float32"]
    for how in ("16bit", "zero_to_fp32"):
        got = r[how]
        assert got["keys_match"] and got["max_diff"] == 0.0, (how, got)
        assert got["tied"] is (kind == "gpt2") and (got["head_diff"] == 0.0) is (kind == "gpt2"), (how, got)
    assert r["gathered_diff"] == 0.0
    outside, inside, plain = r["num_parameters"]  # outside gathered_params() only placeholders are held
    assert outside == 0 and inside == plain > 0
    assert r["refused"] is not None and "gathered_params()" in r["refused"] and "\n" not in r["refused"], r["refused"]
    assert r["generate_same"] and r["generated_shape"] == (4, 10)


@pytest.mark.slow
def test_bf16_encoder_outputs_given_as_a_model_output_are_cast():
    """``apply_zero``'s forward-input cast (FSDP's) reaches a ``ModelOutput`` argument in both its views: T5's decoder
    reads ``encoder_outputs[0]``, which must be bf16 like the weights it meets."""
    for r in run_distributed(run_encoder_outputs_bf16, 2, timeout=200):
        assert "error" not in r, r["error"]
        assert r["logits"] == "torch.bfloat16" and r["applied"] and 0 < r["loss"] < 20, r


def test_stage3_generate_where_ranks_end_at_other_lengths():
    """Each rank generates from its own prompt and rank 0's ends at once: at stage 3 every rank must run every
    forward (a unit's gather is a collective), and HF syncs them only under DeepSpeed's ZeRO-3 or FSDP. Before, rank 1
    waited on rank 0's gathers until the collective timed out; the module's ``generate`` now runs with
    ``synced_gpus`` True, and ``destroy()`` takes that off again. An explicit False, as HF's ``Seq2SeqTrainer`` passes
    when it sees no DeepSpeed ZeRO-3, hung the same way; it is overridden with one warning."""
    for r in run_distributed(run_generate_lengths, 2, timeout=180, coll_timeout=30):
        assert r["lengths"][0] < r["lengths"][1], r  # the case is real: the ranks' ends differ
        assert r["same"] and r["stepped"] and r["unwrapped"], r
        assert len(r["warned"]) == 1 and "generating with synced_gpus=True" in r["warned"][0], r["warned"]
