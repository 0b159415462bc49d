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
    assert "5 measurements, 0 skipped" in out and "MATH" in out and "gemm_sustained" in out


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
    """The GEMMs timed for a block cost, charged one by one, exactly what the replay charges its four linears:
    the forwards the forward, the data and weight gradients the backward, at TP 1 and TP 4."""
    dev, prof = _h100()
    for tp in (1, 4):
        h, tokens = 4096, 6 * 2048
        gemms = CR._block_gemms("x", tokens, h, tp)
        hp = h // tp
        linears = ((3 * hp, h), (h, hp), (4 * hp, h), (h, 4 * hp))
        for backward, kinds in ((False, ("fwd",)), (True, ("dgrad", "wgrad"))):
            timed = sum(CR.gemm_charged(g, "h100")[0] for g in gemms if g.label.rsplit(" ", 1)[1] in kinds)
            replay = sum(prof._linear(tokens, n, k, 2, dev.peak_flops, backward) for n, k in linears)
            assert timed == pytest.approx(replay, rel=1e-12)


def test_the_rates_are_computed_from_the_timers_seconds(monkeypatch):
    """With a timer that says every sample takes 1 ms, a GEMM is timed in samples of 2 calls (about 2 ms), so a
    call takes 0.5 ms; the ratio to the charge and its launch-free version follow from it."""
    monkeypatch.setattr(CR, "_timer", lambda device: lambda fn: 1e-3)
    g = CR.Gemm("g", 512, 512, 512)
    (rec,) = CR.measure_gemms([g], CR.torch.device("cpu"), reps=3, warmup=0, klass="h100")
    charge, launch = CR.gemm_charged(g, "h100")
    assert rec["calls"] == 2 and rec["seconds"] == 5e-4
    assert rec["tflops"] == pytest.approx(2 * 512**3 / 5e-4 / 1e12)
    assert rec["measured_over_charged"] == pytest.approx(charge / 5e-4)
    assert rec["measured_over_charged_without_launch"] == pytest.approx((charge - launch) / 5e-4)
    shape = CR.Shape("s", 2, 4, 64, 128)
    r = CR.attention_rates(shape, 1e-3, 4e-3)
    assert r["fwd_tflops"] == pytest.approx(shape.forward_flops() / 1e-3 / 1e12)
    assert r["fwd_bwd_tflops"] == pytest.approx(3.5 * shape.forward_flops() / 4e-3 / 1e12)


def test_the_sustained_windows_are_the_first_fifth_second_and_the_last_second():
    # 10-call samples of 0.1 s for the first 0.3 s, then 0.2 s each: the card slowed down
    samples, at = [], 0.0
    for t in [0.1] * 3 + [0.2] * 20:
        samples.append((at, t))
        at += t
    w = CR.sustained_windows(samples, 10)
    assert w["first 0.2 s"] == pytest.approx(0.01) and w["last 1 s"] == pytest.approx(0.02)


def test_a_backend_that_does_not_run_is_a_skipped_row_with_its_reason(tmp_path, capsys):
    """On a CPU, SDPA has no cuDNN kernel: the measurement is skipped with torch's reason, the run goes on, and
    the row says so with no value."""
    recs = list(CR.measure_attention(CR.SMOKE_SHAPES, CR.torch.device("cpu"), 1, 1, None, ("CUDNN_ATTENTION", "MATH")))
    assert [r["status"] for r in recs] == ["skipped", "ok"]
    assert recs[0]["reason"].startswith("RuntimeError:") and "skipped:" in CR.line(recs[0])
    sink = CR.RowSink(tmp_path, {"card_rates": {}})
    for r in recs:
        sink(r)
    rows = read_rows(tmp_path)
    skipped = [r for r in rows if r["status"] == "skipped"]
    assert len(skipped) == 1 and skipped[0]["value"] is None and skipped[0]["backend"] == "CUDNN_ATTENTION"
    assert "1 skipped" in CR.summary(recs)


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
