"""The planner's analytic model: the paper's tables, max-size search, validation (no processes)."""

from __future__ import annotations

import dataclasses

import pytest

from zerobench.config import parse_bytes
from zerobench.metrics.analytic import paper_model_state_bytes
from zerobench.models.gpt import GPTConfig
from zerobench.models.sizes import num_params, padded_vocab
from zerobench.plan.comm_model import comm_per_gpu
from zerobench.plan.memory_model import PlanConfig, memory_per_gpu, params_per_mp_rank
from zerobench.plan.sizes import paper_model
from zerobench.plan.suites import load_suite, plan_configs
from zerobench.plan.tables import max_size, table1, table2


def test_table1_matches_formulas_and_the_paper():
    rows = {r["dp"]: r for r in table1()}
    for nd, r in rows.items():
        for name, psi in (("7.5B", 7.5e9), ("128B", 128e9), ("1T", 1e12)):
            for stage, label in ((1, "P_os"), (2, "P_os+g"), (3, "P_os+g+p")):
                assert r[f"{name} {label}"] == pytest.approx(paper_model_state_bytes(psi, nd, stage) / 1e9)
    # values printed in the paper's Table 1
    assert [round(rows[nd]["7.5B P_os"], 1) for nd in (1, 4, 16, 64, 256, 1024)] == [120, 52.5, 35.6, 31.4, 30.4, 30.1]
    assert [round(rows[nd]["7.5B P_os+g+p"], 2) for nd in (4, 16, 64)] == [30, 7.5, 1.88]
    assert rows[1024]["1T P_os+g+p"] == pytest.approx(15.6, abs=0.05)


def test_table2_matches_the_paper():
    rows = table2(32e9)
    paper = [
        (2, 7.6, 14.4, 128),
        (4, 15.3, 28.8, 256),
        (8, 30.6, 57.7, 512),
        (16, 61.1, 115.4, 1024),
        (32, 122.3, 230.8, 2048),
    ]
    for r, (base, pos, posg, posgp) in zip(rows, paper):
        assert r["baseline"] / 1e9 == pytest.approx(base)
        assert r["P_os"] / 1e9 == pytest.approx(pos, abs=0.05)
        assert r["P_os+g"] / 1e9 == pytest.approx(posg, abs=0.05)
        assert r["P_os+g+p"] / 1e9 == pytest.approx(posgp, rel=0.001)


def test_params_per_mp_rank_sums_to_the_model():
    cfg = GPTConfig(layers=3, hidden=64, heads=8, vocab=512, seq=32)
    assert params_per_mp_rank(cfg, 1) == num_params(cfg)
    h = cfg.hidden
    replicated = cfg.seq * h + cfg.layers * 6 * h + 2 * h
    sharded = num_params(cfg) - replicated
    assert params_per_mp_rank(cfg, 4) == sharded // 4 + replicated


def test_vocab_padding_like_megatron():
    assert padded_vocab(50257, 1) == 50304 and padded_vocab(50257, 16) == 51200


def _plan(**kw):
    base = PlanConfig(model=paper_model("100B", 16), gpus=400, mp=16, micro_batch=32, stage=2, pa=True)
    return dataclasses.replace(base, **kw)


def test_pa_and_pa_cpu_move_checkpoints():
    plain, pa, cpu = _plan(pa=False), _plan(pa=True), _plan(pa=True, pa_cpu=True)
    a, b, c = (memory_per_gpu(p) for p in (plain, pa, cpu))
    assert b["activation_checkpoints"] == pytest.approx(a["activation_checkpoints"] / 16)
    assert c["activation_checkpoints"] == 0 and c["activation_checkpoints_host"] == b["activation_checkpoints"]
    m = plain.model
    assert a["activation_checkpoints"] == m.layers * 32 * m.seq * m.hidden * 2


def test_comm_model_paper_accounting():
    p = _plan()
    c = comm_per_gpu(p)
    psi = params_per_mp_rank(p.model, 16)
    assert c["dp_elements"] == pytest.approx(2 * psi * 24 / 25)
    assert comm_per_gpu(dataclasses.replace(p, stage=3))["dp_elements"] == pytest.approx(3 * psi * 24 / 25)
    assert c["pa_elements"] / c["mp_elements"] == pytest.approx(1 / 12)
    assert c["paper_mp_elements"] == p.model.layers * 12 * 32 * 1024 * 8192


def test_max_size_monotone_in_memory_and_dp():
    cfg = _plan(model=paper_model("100B", 16))
    sizes_mem = [max_size(dataclasses.replace(cfg, gpu_mem_bytes=g * 1e9))["max_params"] for g in (16, 32, 48, 80)]
    assert sizes_mem == sorted(sizes_mem) and sizes_mem[0] < sizes_mem[-1]
    sizes_dp = [max_size(dataclasses.replace(cfg, gpus=g, stage=3))["max_params"] for g in (64, 128, 256, 512)]
    assert sizes_dp == sorted(sizes_dp) and sizes_dp[0] < sizes_dp[-1]
    ms = max_size(cfg)
    bigger = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, layers=ms["max_layers"] + 1))
    assert memory_per_gpu(dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, layers=ms["max_layers"])))[
        "fits"
    ]
    assert not memory_per_gpu(bigger)["fits"]


def test_stage3_fits_more_than_stage0():
    s0 = max_size(_plan(stage=0, gpus=64, mp=1, model=paper_model("fig4-13B", 1), micro_batch=2))
    s3 = max_size(_plan(stage=3, gpus=64, mp=1, model=paper_model("fig4-13B", 1), micro_batch=2))
    assert s3["max_params"] > 4 * s0["max_params"]


def test_parse_bytes():
    assert parse_bytes("32GB") == 32e9 and parse_bytes("80GiB") == 80 * 2**30 and parse_bytes(5) == 5


def test_paper_suites_load():
    for name in ("paper/fig2", "paper/fig3", "paper/fig4"):
        rows = plan_configs(load_suite(name))
        assert rows and all(p.gpus % p.mp == 0 for _, p in rows)
    assert len(plan_configs(load_suite("paper/fig2"))) == 20


def test_offload_and_8bit_states_in_the_planner():
    """ZeRO-Offload's headline: a 13B GPT trains on one 32 GB V100 with the optimizer on the host (the
    planner agrees), not without. 8-bit moments take the host's 16 bytes per parameter to 10.004."""
    one = dict(gpus=1, mp=1, micro_batch=1, pa=False, md=True, model=paper_model("fig4-13B", 1))
    plain = memory_per_gpu(_plan(stage=2, **one))
    off = memory_per_gpu(_plan(stage=2, offload_optimizer=True, **one))
    off8 = memory_per_gpu(_plan(stage=2, offload_optimizer=True, optim_bits=8, **one))
    psi = plain["params_per_mp_rank"]
    assert not plain["fits"] and off["fits"]
    assert plain["model_states"] == pytest.approx(16 * psi) and plain["model_states_host"] == 0
    assert off["model_states"] == pytest.approx(2 * psi) and off["model_states_host"] == pytest.approx(16 * psi)
    assert off8["model_states_host"] == pytest.approx((10 + 8 / 2048) * psi)
    assert _plan(optim_bits=8).k == pytest.approx(6 + 8 / 2048) and _plan().k == 12
    p3 = memory_per_gpu(_plan(stage=3, offload_optimizer=True, offload_param=True, **one))
    assert p3["model_states"] == 0 and p3["model_states_host"] == pytest.approx(16 * psi)


def test_fp32_plans_4_byte_states_with_no_master():
    """--precision was dropped: an fp32 plan counted 2-byte parameters and gradients and an fp32 master, the same
    bytes as fp16, where the fp32 engine holds 4Ψ + 12Ψ/N_d at stage 1 (the parameters are the master)."""
    model = paper_model("fig4-13B", 1)
    half, full = (memory_per_gpu(_plan(stage=1, gpus=64, mp=1, model=model, precision=p)) for p in ("fp16", "fp32"))
    psi = half["params_per_mp_rank"]
    assert half["model_states"] == pytest.approx(4 * psi + 12 * psi / 64)
    assert full["model_states"] == pytest.approx(4 * psi + 4 * psi + 8 * psi / 64)  # params, grads; moments
    assert full["activation_checkpoints"] == pytest.approx(2 * half["activation_checkpoints"])
    small = dict(stage=1, gpus=64, mp=1, micro_batch=1, model=GPTConfig(layers=1, hidden=2048, heads=16, vocab=50304))
    assert 0 < max_size(_plan(**small, precision="fp32"))["max_layers"] < max_size(_plan(**small))["max_layers"]


def test_the_output_layer_and_stage_3s_gathered_units_are_counted():
    """Two terms the planner left out: the logits and the loss over them, 12 bytes per logit of the MP rank (a 150 MB
    plan said 'fits' for a run that ran out of memory at 221 MiB), and at stage 3 the root unit and one block
    gathered whole (2.45 GB at h 8192, vocabulary 50k)."""
    model = GPTConfig(layers=4, hidden=8192, heads=64, vocab=50304, seq=1024)
    m2, m3 = (memory_per_gpu(_plan(stage=s, gpus=64, mp=2, micro_batch=3, model=model)) for s in (2, 3))
    assert m2["output_layer"] == m3["output_layer"] == pytest.approx(12 * 1024 * 3 * 50304 / 2)
    assert m2["stage3_gathered"] == 0
    h = 8192
    assert m3["stage3_gathered"] == pytest.approx(
        2 * (50304 * h / 2 + 1024 * h + 2 * h + 12 * h * h / 2 + 7 * h / 2 + 6 * h)
    )


def test_a_communication_bucket_never_plans_more_than_one_copy_of_the_gradients():
    """Two C_B buckets were capped at twice the gradients, so for a model under 1e9 parameters turning C_B off
    planned less memory than turning it on. Buckets partition the gradients: two of them never exceed one copy."""
    model = GPTConfig(layers=8, hidden=2048, heads=16, vocab=50304, seq=1024)
    on, off = (memory_per_gpu(_plan(stage=0, gpus=8, mp=1, model=model, cb_elements=cb)) for cb in (500_000_000, None))
    assert on["buffers"] == off["buffers"] == pytest.approx(2 * on["params_per_mp_rank"])
    small = memory_per_gpu(_plan(stage=0, gpus=8, mp=1, model=model, cb_elements=1000))
    assert small["buffers"] == 2 * 2 * 1000


def test_no_model_parallelism_moves_no_mp_traffic():
    assert comm_per_gpu(_plan(mp=1, gpus=64))["paper_mp_elements"] == 0.0
    assert comm_per_gpu(_plan(mp=4, gpus=64))["paper_mp_elements"] > 0


def test_a_search_whose_limit_fits_says_at_least():
    p = _plan(stage=3, gpus=16, mp=1, micro_batch=1, model=paper_model("fig4-13B", 1), offload_optimizer=True)
    p = dataclasses.replace(p, offload_param=True, pa_cpu=True, checkpoint_activations=True)
    got = max_size(p, limit=64)
    assert got["at_least"] and got["max_layers"] == 64
    assert not max_size(_plan(stage=0, gpus=1, mp=1, model=paper_model("fig4-13B", 1)), limit=64)["at_least"]
