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
        # a report that would ignore the flags given with it (before, something else was planned without a word)
        (["--table", "1", "--max-size"], "--table prints the paper's table alone"),
        (["--dry-run", "--max-size", "--hidden", "64", "--heads", "4"], "solve the size first"),
        (["--dry-run", "--suite", "paper/fig2", "--layers", "2"], "plans the suite's own rows"),
        # before: "max size: 0 layers ... fit (the model and memory above are at that size)" over a 1-layer model
        (
            ["--max-size", "--gpus", "128", "--hidden", "4096", "--heads", "32", "--stage", "2", "--gpu-mem", "1GB"],
            "no layer count fits: 1 layer needs 3.40 GB per GPU, more than the 1.00 GB given",
        ),
        # before: a 1.23B-parameter model planned without a word
        (["--params", "1000"], "--params 1000 is below one layer at hidden 8192"),
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


def test_a_dry_run_suite_builds_rows_that_leave_the_system_at_its_default(tmp_path):
    """Rows that did not spell out ``system: zerobench`` (its default) were skipped without a word, and the command
    printed nothing and exited 0."""
    suite = tmp_path / "s.yaml"
    suite.write_text(
        "name: s\nbase: {seq: 32, vocab: 128, precision: bf16}\nruns:\n"
        "  - {label: a, layers: 2, hidden: 64, heads: 4, gpus: 4, stage: 2}\n"
        "  - {label: b, layers: 2, hidden: 64, heads: 4, gpus: 4, stage: 0, system: megatron}\n"
    )
    r = zb("plan", "--dry-run", "--suite", str(suite))
    assert r.returncode == 0, r.stderr
    assert "  a " in r.stdout and "  b " not in r.stdout, r.stdout
    assert "1 row(s) of" in r.stderr and "not built" in r.stderr


@pytest.mark.slow  # two processes that build the engine on the fake backend: about 20 s
def test_a_dry_run_builds_the_precision_asked_for():
    """The dry run built every engine in fp16 with 500M-element buckets whatever was asked: an fp32 plan's 'engine
    measured' bytes were an fp16 engine's."""
    args = ["--dry-run", "--layers", "2", "--hidden", "64", "--heads", "4", "--vocab", "128", "--seq", "32"]
    r16, r32 = (zb("plan", *args, "--gpus", "2", "--stage", "1", "--precision", p, "--json") for p in ("fp16", "fp32"))
    (a,), (b,) = json.loads(r16.stdout)["rows"], json.loads(r32.stdout)["rows"]
    psi = a["params_per_mp_rank"]
    assert a["measured_model_state_bytes"] == a["analytic_model_state_bytes"] == 4 * psi + 12 * psi / 2
    assert b["measured_model_state_bytes"] == b["analytic_model_state_bytes"] == 8 * psi + 8 * psi / 2


def test_a_dry_run_that_offloads_every_model_state_prints_zero_bytes():
    """Stage 3 with optimizer and parameter offload keeps no model state on the device: the text output divided by
    the analytic 0 (a ZeroDivisionError traceback). A small shape: the division is the same at any size, and an 8B
    model's host-side offload buffers took half a minute of page faults."""
    shape = ("--layers", "2", "--hidden", "256", "--heads", "4")
    r = zb("plan", "--dry-run", *shape, "--gpus", "16", "--stage", "3", "--offload-optimizer", "--offload-param")
    assert r.returncode == 0, r.stderr
    assert "engine     0.000 GB  analytic     0.000 GB  (+0.0000%" in r.stdout, r.stdout
