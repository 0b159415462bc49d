"""Suite expansion and validation: good files expand as written, bad ones fail with one line."""

from __future__ import annotations

import pytest

from zerobench.bench import suite as suites
from zerobench.config import ConfigError


def write(tmp_path, text, name="s.yaml"):
    p = tmp_path / name
    p.write_text(text)
    return p


def test_quick_and_ci_suites_expand():
    q = suites.load("cpu/quick")
    assert len(q.runs) == 12 and all(r.config is not None for r in q.runs)
    assert {(r.config.zero.stage, r.config.dp) for r in q.runs} == {(s, d) for s in range(4) for d in (1, 2, 4)}
    assert len({r.run_id for r in q.runs}) == 12
    ci = suites.load("cpu/ci")
    assert all(r.error is None for r in ci.runs)


def test_product_zip_and_runs(tmp_path):
    p = write(tmp_path, """
base: {preset: tiny, steps: 2}
axes: {stage: [0, 3]}
zip: {hidden: [32, 64], heads: [2, 4]}
runs: [{dp: 1}, {dp: 2, label: two}]
""")
    s = suites.load(p)
    assert len(s.runs) == 2 * 2 * 2
    combos = {(r.spec.stage, r.spec.hidden, r.spec.heads, r.spec.dp) for r in s.runs}
    assert (3, 64, 4, 2) in combos and (0, 32, 2, 1) in combos and (0, 32, 4, 1) not in combos
    assert any(r.label.startswith("two,") for r in s.runs)


def test_paper_suites_resolve_at_cluster_scale():
    s = suites.load("paper/fig2")
    zero = [r for r in s.runs if r.spec.system == "zerobench"]
    assert len(zero) == 10 and all(r.config.world_size == 400 for r in zero)
    assert all(r.config.model.vocab % r.config.tp == 0 for r in zero)  # padded like Megatron


@pytest.mark.parametrize("text,msg", [
    ("base: {stagee: 1}", "unknown key 'stagee' (did you mean 'stage'?)"),
    ("base: {dp: two}", "run 0.dp: expected int, got 'two'"),
    ("axes: {stage: 3}", "axis 'stage' must be a non-empty list"),
    ("zip: {hidden: [1, 2], heads: [1]}", "zip lists must have equal lengths"),
    ("base: [1, 2]", "'base' must be a mapping"),
    ("base: {dp: 1\n", "not valid YAML"),
    ("bases: {}", "unknown top-level key 'bases'"),
])
def test_bad_suites_fail_with_one_line(tmp_path, text, msg):
    p = write(tmp_path, text)
    with pytest.raises(ConfigError) as e:
        suites.load(p)
    assert msg in str(e.value) and str(p) in str(e.value) and "\n" not in str(e.value)


@pytest.mark.parametrize("run,msg", [
    ("{tp: 3}", "heads 4 is not divisible by TP degree 3"),
    ("{hidden: 60, heads: 7}", "not divisible by heads"),
    ("{gpus: 6, tp: 4}", "gpus 6 is not divisible by tp 4"),
    ("{stage: 7}", "unknown ZeRO stage 7"),
    ("{precision: fp8}", "unknown precision 'fp8': choose fp32, bf16 or fp16"),
])
def test_invalid_runs_are_kept_with_a_reason(tmp_path, run, msg):
    s = suites.load(write(tmp_path, f"base: {{preset: tiny}}\nruns: [{run}]"))
    assert s.runs[0].config is None and msg in s.runs[0].error


def test_missing_suite():
    with pytest.raises(ConfigError, match="not found"):
        suites.load("cpu/does-not-exist")
