"""``zerobench plan`` as users run it: tables, dry runs of the real engine at 400 GPUs, projection, errors."""

from __future__ import annotations

import json
import time

import pytest

from tests.e2e.test_cli_train import imports_torch, zb


@pytest.mark.slow
def test_dry_run_of_every_fig2_zero_row_agrees_with_the_formula():
    t0 = time.monotonic()
    r = zb("plan", "--dry-run", "--suite", "paper/fig2", "--json", timeout=120)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 60
    rows = json.loads(r.stdout)["rows"]
    assert [x["label"] for x in rows][-1] == "170B ZeRO" and len(rows) == 10
    for x in rows:
        assert x["gpus"] == 400
        rel = x["measured_model_state_bytes"] / x["analytic_model_state_bytes"] - 1
        assert 0 <= rel <= 1e-3, x  # only alignment padding on top of the formula


def test_dry_run_170b_under_a_minute_on_another_rank():
    t0 = time.monotonic()
    r = zb(
        "plan",
        "--dry-run",
        "--model",
        "170B",
        "--gpus",
        "400",
        "--tp",
        "16",
        "--stage",
        "3",
        "--rank",
        "399",
        "--json",
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 60
    x = json.loads(r.stdout)["rows"][0]
    assert x["rank"] == 399 and x["dp"] == 25
    assert x["measured_model_state_bytes"] == pytest.approx(x["analytic_model_state_bytes"], rel=1e-3)


def test_plan_json_keys_and_tables():
    r = zb("plan", "--model", "100B", "--tp", "16", "--micro-batch", "32", "--pa", "--md", "--max-size", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert {
        "config",
        "params",
        "params_per_mp_rank",
        "memory_bytes",
        "fits",
        "comm_elements_per_step",
        "max_layers",
        "max_params",
    } <= set(d)
    t = json.loads(zb("plan", "--table", "2", "--json").stdout)
    assert t["table"] == 2 and len(t["rows"]) == 5


def test_the_projection_is_the_simulators_now_and_plan_says_so():
    """One performance model: ``plan --project`` (an analytic projection at an assumed efficiency) is gone, and
    asking for it names the simulator's commands in one line."""
    r = zb("plan", "--project", "paper/fig2")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    assert "zerobench simulate --profile v100-dgx2 --suite SUITE" in r.stderr and "simulate --paper" in r.stderr


@pytest.mark.parametrize(
    "args,msg",
    [
        # the resolver's messages, as `zerobench train` and sweeps give them
        (["--model", "100B", "--tp", "3", "--gpus", "399"], "attention heads 64 is not divisible by TP degree 3"),
        (["--model", "100B", "--tp", "16", "--gpus", "100"], "gpus 100 is not divisible by tp 16"),
        (["--model", "8B", "--stage", "5"], "stage"),
        (["--model", "8B", "--stage", "0", "--offload-optimizer"], "offload"),
        (["--model", "999B"], "unknown model size"),
        (["--gpu-mem", "lots", "--model", "8B"], "cannot read memory size"),
    ],
)
def test_invalid_plans_are_one_line(args, msg):
    r = zb("plan", *args)
    assert r.returncode == 2 and msg in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_max_size_needs_no_layers_and_reports_the_solved_model():
    """DP-only on 128 x 32 GB, stage 2, h 4096 (the paper's Fig 4 setting): the JSON's model and memory
    breakdown are the solved size's, which fits, while one more layer does not."""
    args = [
        "--hidden",
        "4096",
        "--heads",
        "32",
        "--gpus",
        "128",
        "--stage",
        "2",
        "--micro-batch",
        "2",
        "--checkpoint-activations",
        "--md",
    ]
    r = zb("plan", *args, "--max-size", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["config"]["model"]["layers"] == d["max_layers"] > 1
    assert d["params"] == d["max_params"] and d["fits"]
    assert d["memory_bytes"]["total"] <= 32e9
    over = json.loads(zb("plan", *args, "--layers", str(d["max_layers"] + 1), "--json").stdout)
    assert not over["fits"] and over["memory_bytes"]["total"] > 32e9


def test_planning_does_not_import_torch():
    """Plans, tables and their one-line errors are arithmetic: none of them imports torch (seconds on this VM),
    so a plan answers at once. A dry run, which builds the real engine, and an 8-bit optimizer's
    bytes (the quantizer's block) do."""
    plans = [
        ["--table", "1"],
        ["--table", "2"],
        ["--model", "100B", "--tp", "16", "--max-size", "--json"],
        ["--model", "100B", "--tp", "16", "--gpus", "100"],
    ]
    assert not imports_torch([["plan", *args] for args in plans])
    assert imports_torch([["plan", "--model", "1.5B", "--gpus", "8", "--optim-bits", "8"]])
