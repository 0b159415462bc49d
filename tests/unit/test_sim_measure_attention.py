"""The attention-kernel measurement for a card (``zerobench.sim.measure_attention``): its plumbing on this CPU, and
that the rates it prints beside each measurement are the ones the replay charges."""

from __future__ import annotations

import dataclasses

import pytest

from zerobench.results.rows import read_rows
from zerobench.sim import measure_attention as MA
from zerobench.sim.gpu_costs import StatedProfile
from zerobench.sim.stated import DEVICES


def test_smoke_on_cpu_writes_a_row_per_measurement(tmp_path, capsys):
    assert MA.main(["--smoke", "--reps", "2", "--out", str(tmp_path)]) == 0
    rows = read_rows(tmp_path)
    got = {(r["metric"], r["backend"], r["label"]) for r in rows}
    assert got == {("attention_fwd_tflops", "MATH", "smoke"), ("attention_fwd_bwd_tflops", "MATH", "smoke")}
    assert all(
        r["value"] > 0 and r["status"] == "ok" and r["provenance"]["torch_version"] and "hardware" in r["provenance"]
        for r in rows
    )
    assert "MATH" in capsys.readouterr().out


def test_without_a_gpu_it_refuses_in_one_line(capsys, monkeypatch):
    monkeypatch.setattr(MA.torch.cuda, "is_available", lambda: False)
    assert MA.main([]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "--smoke" in err[0]


def test_bad_reps_are_one_line(capsys):
    with pytest.raises(SystemExit) as e:
        MA.main(["--smoke", "--reps", "0"])
    assert e.value.code == 2
    assert "--reps must be at least 1" in capsys.readouterr().err


def test_the_forward_flops_are_the_replays_causal_count():
    s = MA.Shape("x", 6, 32, 128)
    assert s.forward_flops() == 2 * 6 * 2048 * 2048 * (32 * 128)  # gpu_costs: 2·b·s²·h_p, half of 4·b·s²·h_p


@pytest.mark.parametrize(
    ("backend", "stack"), [("FLASH_ATTENTION", "llm-foundry-flash2"), ("CUDNN_ATTENTION", "zerobench")]
)
def test_the_charged_rate_printed_is_the_one_the_replay_charges_on_h100(backend, stack):
    dev = dataclasses.replace(DEVICES["h100-dgx"], compute_scale=1.0)
    prof = StatedProfile(dev, stack)
    for shape in MA.SHAPES:
        c = MA.charged(backend, shape, "h100")
        hp, f = shape.heads * shape.head_dim, shape.forward_flops()
        for backward, rate in ((False, c["fwd"]), (True, None)):
            t = prof._attention(shape.batch, shape.seq, hp, shape.heads, shape.head_dim, 2, dev.peak_flops, backward)
            if not backward:
                assert t - prof.gemm.launch_s == pytest.approx(f / (rate * 1e12), rel=1e-9)
            else:
                fwd = prof._attention(shape.batch, shape.seq, hp, shape.heads, shape.head_dim, 2, dev.peak_flops, False)
                both = (fwd + t - 2 * prof.gemm.launch_s) / (3.5 * f) * 1e12
                assert 1 / both == pytest.approx(c["fwd_bwd"], rel=1e-9)


def test_no_charged_rate_where_the_simulator_states_none():
    s = MA.SHAPES[0]
    assert MA.charged("EFFICIENT_ATTENTION", s, "h100") is None
    assert MA.charged("CUDNN_ATTENTION", s, "a100") is None
    assert MA.charged("FLASH_ATTENTION", s, None) is None
    assert MA.device_class("NVIDIA H200") == "h100" and MA.device_class("NVIDIA A100-SXM4-80GB") == "a100"
    assert MA.device_class("Tesla T4") is None
