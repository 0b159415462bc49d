"""The kernel-rate measurement for a card (``zerobench.sim.card_rates``): its plumbing on this CPU, and that what
it prints beside each measurement is exactly what the replay charges that kernel."""

from __future__ import annotations

import dataclasses

import pytest

from zerobench.results.rows import read_rows
from zerobench.sim import card_rates as CR
from zerobench.sim.gpu_costs import StatedProfile
from zerobench.sim.published import load
from zerobench.sim.stated import DEVICES


def _h100(stack: str = "zerobench") -> tuple:
    dev = dataclasses.replace(DEVICES["h100-dgx"], compute_scale=1.0)
    return dev, StatedProfile(dev, stack)


def test_smoke_on_cpu_writes_a_row_per_measurement(tmp_path, capsys):
    assert CR.main(["--smoke", "--reps", "1", "--sustain", "0.05", "--out", str(tmp_path)]) == 0
    rows = read_rows(tmp_path)
    got = {(r["metric"], r.get("backend") or r.get("window") or r["label"]) for r in rows}
    assert got == {
        ("gemm_tflops", "smoke square"),
        ("gemm_tflops", "smoke thin"),
        ("gemm_sustained_tflops", "first 0.2 s"),
        ("gemm_sustained_tflops", "last 1 s"),
        ("attention_fwd_tflops", "MATH"),
        ("attention_fwd_bwd_tflops", "MATH"),
    }
    assert all(r["value"] > 0 and r["status"] == "ok" and "hardware" in r["provenance"] for r in rows)
    out = capsys.readouterr().out
    assert "GEMMs: 2 shapes" in out and "MATH" in out and "sustained" in out


def test_without_a_gpu_it_refuses_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(CR.torch.cuda, "is_available", lambda: False)
    assert CR.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--smoke" in err[0]


@pytest.mark.parametrize(("args", "says"), [(["--reps", "0"], "--reps must be"), (["--sustain", "-1"], "--sustain")])
def test_bad_arguments_are_one_line(args, says, capsys):
    with pytest.raises(SystemExit) as e:
        CR.main(["--smoke", *args])
    assert e.value.code == 2
    assert says in capsys.readouterr().err


def test_a_blocks_gemms_are_the_ones_the_replay_charges():
    """The 12 GEMMs timed for a block cost, charged one by one, exactly what the replay charges the block's four
    linears forward and backward (``StatedProfile._linear``), at TP 1 and TP 4."""
    dev, prof = _h100()
    for tp in (1, 4):
        h, tokens = 4096, 6 * 2048
        timed = sum(CR.gemm_charged(g, "h100") for g in CR._block_gemms("x", tokens, h, tp))
        hp = h // tp
        linears = ((3 * hp, h), (h, hp), (4 * hp, h), (h, 4 * hp))
        replay = sum(prof._linear(tokens, n, k, 2, dev.peak_flops, bw) for n, k in linears for bw in (False, True))
        assert timed == pytest.approx(replay, rel=1e-12)


def test_every_held_out_row_of_the_class_has_its_gemms_once():
    shapes = CR.gemm_shapes("h100")
    keys = [(g.m, g.n, g.k) for g in shapes]
    assert len(keys) == len(set(keys))
    h100 = [r for r in load() if r.device.startswith("h100")]
    assert h100
    for r in h100:
        tokens = r.micro_batch * r.seq
        assert (tokens, 3 * r.hidden // r.tp, r.hidden) in keys, r.id
        assert (tokens, r.vocab // r.tp, r.hidden) in keys, r.id
    assert (8 * 2048, 3 * 2048 // 8, 2048) in keys  # zerobench's 1.3B at TP 8
    assert {g.label.split(" tp")[0] for g in CR.gemm_shapes(None)} == {"zerobench 1.3B"}  # a class with no rows


def test_the_attention_flops_are_the_replays_causal_count():
    s = CR.Shape("x", 6, 32, 128)
    assert s.forward_flops() == 2 * 6 * 2048 * 2048 * (32 * 128)  # gpu_costs: 2·b·s²·h_p, half of 4·b·s²·h_p


@pytest.mark.parametrize(
    ("backend", "stack"), [("FLASH_ATTENTION", "llm-foundry-flash2"), ("CUDNN_ATTENTION", "zerobench")]
)
def test_the_charged_attention_rate_is_the_one_the_replay_charges_on_h100(backend, stack):
    dev, prof = _h100(stack)
    for shape in CR.SHAPES:
        c = CR.attention_charged(backend, shape, "h100")
        hp, f = shape.heads * shape.head_dim, shape.forward_flops()
        args = (shape.batch, shape.seq, hp, shape.heads, shape.head_dim, 2, dev.peak_flops)
        fwd, bwd = prof._attention(*args, False), prof._attention(*args, True)
        assert fwd - prof.gemm.launch_s == pytest.approx(f / (c["fwd"] * 1e12), rel=1e-9)
        assert 3.5 * f / (fwd + bwd - 2 * prof.gemm.launch_s) / 1e12 == pytest.approx(c["fwd_bwd"], rel=1e-9)


def test_no_charged_rate_where_the_simulator_states_none():
    s = CR.SHAPES[0]
    assert CR.attention_charged("EFFICIENT_ATTENTION", s, "h100") is None
    assert CR.attention_charged("CUDNN_ATTENTION", s, "a100") is None
    assert CR.attention_charged("FLASH_ATTENTION", s, None) is None
    assert CR.gemm_charged(CR.SUSTAINED, None) is None
    assert CR.device_class("NVIDIA H200") == "h100" and CR.device_class("NVIDIA A100-SXM4-80GB") == "a100"
    assert CR.device_class("Tesla T4") is None
