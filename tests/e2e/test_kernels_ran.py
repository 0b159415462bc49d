"""A run where the fused kernels do not load (here: no C++ compiler, and an empty kernel cache) trains on the
reference path under ``--kernels auto``, as before, and now says so in its rows; the gate refuses to compare it with
a baseline whose kernels were fused."""

from __future__ import annotations

import json

import pytest

from tests.e2e.test_cli_train import zb

ARGS = ["train", "--stage", "2", "--dp", "1", "--steps", "3", "--warmup", "1", "--kernels", "auto"]


def _kernels_ran(out):
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    return {json.dumps(r.get("kernels_ran"), sort_keys=True) for r in rows if r["metric"] != "run_status"}


@pytest.mark.slow
def test_a_run_without_a_compiler_records_the_reference_path_and_the_gate_refuses_it(tmp_path):
    fused, plain = tmp_path / "fused", tmp_path / "no-compiler"
    r = zb(*ARGS, "--out", str(fused))
    assert r.returncode == 0, r.stderr
    no_cxx = {"CXX": str(tmp_path / "no-such-c++"), "ZEROBENCH_KERNEL_CACHE": str(tmp_path / "empty-cache")}
    r = zb(*ARGS, "--out", str(plain), env=no_cxx)
    assert r.returncode == 0, r.stderr
    assert "fused kernels unavailable, using the reference path" in r.stdout + r.stderr
    assert _kernels_ran(fused) == {json.dumps({"model": "fused", "optimizer": "fused"}, sort_keys=True)}
    assert _kernels_ran(plain) == {json.dumps({"model": "reference", "optimizer": "reference"}, sort_keys=True)}
    base = tmp_path / "baseline.jsonl"
    r = zb("regress", "--write-baseline", str(base), "--candidate", str(fused))
    assert r.returncode == 0, r.stderr
    r = zb("regress", "--baseline", str(base), "--candidate", str(plain), "--propose", str(tmp_path / "p.jsonl"))
    assert r.returncode == 2, r.stdout + r.stderr
    assert "kernels took model=reference, optimizer=reference in the candidate" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
