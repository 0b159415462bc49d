"""The Megatron-LM baseline in fp16 and bf16 trains with Megatron-LM's mixed precision: fp32 main parameters and
moments (16 bytes a parameter in fp16, the paper's §3.1 baseline; 18 in bf16, whose gradients Megatron-LM reduces
in fp32), and in fp16 a dynamic loss scale whose overflowing steps are skipped on every TP rank alike. Before, fp16
was refused (every baseline row of the paper's Fig 2 suite was invalid) and bf16 stepped the bf16 parameters with
bf16 moments (8 bytes a parameter), so its memory was not the baseline's. Reference: zerobench's stage 0, same
weights, batches and loss-scale settings."""

from __future__ import annotations

import importlib.util

import pytest

from tests.helpers.dist import run_distributed
from tests.helpers.megatron_mixed import train_both

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(importlib.util.find_spec("megatron") is None, reason="megatron-core is not installed"),
]


@pytest.fixture(scope="module")
def fp16_overflowing():
    """fp16 at an initial scale of 2^40: the first steps overflow (fp16 tops out at 65504) until it backs off."""
    return run_distributed(train_both, 2, "fp16", 2.0**40, 30, timeout=400)


def test_fp16_skips_overflowing_steps_as_zerobench_does(fp16_overflowing):
    for rank in fp16_overflowing:
        meg, ours = rank["megatron"], rank["zerobench"]
        skipped = meg["taken"].index(True)
        assert skipped >= 10, meg  # 2^40 halves at least this often before fp16 gradients fit
        assert not any(meg["taken"][:skipped]) and all(meg["taken"][skipped:]), meg["taken"]
        assert meg["taken"] == ours["taken"] and meg["scales"] == ours["scales"]
        assert meg["scales"][skipped - 1] == 2.0 ** (40 - skipped)
        assert meg["losses"][: skipped + 1] == pytest.approx(ours["losses"][: skipped + 1], abs=1e-3)
        assert max(abs(a - b) for a, b in zip(meg["losses"], ours["losses"])) <= 2e-3, (meg, ours)
    assert fp16_overflowing[0]["megatron"]["taken"] == fp16_overflowing[1]["megatron"]["taken"]


def test_fp16_model_states_are_the_papers_16_bytes_a_parameter(fp16_overflowing):
    r = fp16_overflowing[0]
    assert r["param_dtypes"] == ["torch.float16"]
    assert r["ledger"] == {"params": 2, "grads": 2, "master": 4, "optimizer_states": 8, "comm_buffers": 0}
    assert r["state_bytes_per_param"] == 16


def test_bf16_keeps_fp32_masters_and_fp32_gradients():
    for r in run_distributed(train_both, 2, "bf16", 2.0**16, 6, timeout=400):
        meg, ours = r["megatron"], r["zerobench"]
        assert all(meg["taken"]) and meg["scales"] == [1.0] * 6
        assert meg["losses"][-1] < meg["losses"][0] - 0.5, "the baseline must actually train"
        # bf16 keeps 8 significant bits (a loss near 6 is resolved to about 0.03); the baseline reduces its
        # gradients in fp32 and zerobench in bf16, so their rounding differs by about that much, not more
        assert max(abs(a - b) for a, b in zip(meg["losses"], ours["losses"])) <= 1e-2, (meg, ours)
        assert r["param_dtypes"] == ["torch.bfloat16"]
        assert r["ledger"] == {"params": 2, "grads": 4, "master": 4, "optimizer_states": 8, "comm_buffers": 0}
        assert r["state_bytes_per_param"] == 18


def test_an_overflow_on_one_tp_rank_skips_the_step_on_every_rank():
    """The last TP rank alone finds an inf in its shard: both ranks skip that step and back off alike (a rank that
    stepped would leave its shard's parameters out of step with the others')."""
    ranks = run_distributed(train_both, 2, "fp16", 2.0**12, 5, 2, 1, 2, timeout=400)
    for r in ranks:
        meg = r["megatron"]
        assert meg["taken"] == [True, True, False, True, True], meg
        assert meg["scales"][1] == 2.0**12 and meg["scales"][2] == 2.0**11
    assert ranks[0]["megatron"]["losses"] == ranks[1]["megatron"]["losses"]


def test_fp16_accumulation_and_data_parallel_match_zerobench():
    """DP 2 with two micro-batches a step, from an overflowing scale: the loss is scaled per micro-batch and unscaled
    once, so the skipped steps, the scales and the losses are zerobench's."""
    for r in run_distributed(train_both, 2, "fp16", 2.0**30, 24, 1, 2, timeout=400):
        meg, ours = r["megatron"], r["zerobench"]
        assert not meg["taken"][0] and any(meg["taken"]), meg
        assert meg["taken"] == ours["taken"] and meg["scales"] == ours["scales"]
        assert max(abs(a - b) for a, b in zip(meg["losses"], ours["losses"])) <= 2e-3, (meg, ours)
