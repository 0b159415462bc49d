"""The Megatron-LM baseline (megatron-core's GPTModel, TP, DDP) trains the same GPT to the same loss."""

from __future__ import annotations

import importlib.util
import json

import pytest

from tests.e2e.test_cli_train import zb

pytestmark = [
    pytest.mark.dist,
    pytest.mark.skipif(
        importlib.util.find_spec("megatron") is None,
        reason="megatron-core is not installed (pip install -e '.[megatron]')",
    ),
]


def losses(path):
    rows = [json.loads(line) for line in (path / "rows.jsonl").read_text().splitlines()]
    return [r["value"] for r in sorted((r for r in rows if r["metric"] == "loss"), key=lambda r: r["step"])]


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], ["--checkpoint-activations"]])
def test_megatron_matches_zerobench_tp2_stage0(tmp_path, extra):
    common = ["--preset", "tiny", "--tp", "2", "--dp", "1", "--steps", "5", "--warmup", "1", *extra]
    a = zb("train", "--system", "megatron", *common, "--out", str(tmp_path / "megatron"))
    assert a.returncode == 0, a.stderr[-3000:]
    b = zb("train", "--system", "zerobench", "--stage", "0", *common, "--out", str(tmp_path / "zerobench"))
    assert b.returncode == 0, b.stderr[-3000:]
    la, lb = losses(tmp_path / "megatron"), losses(tmp_path / "zerobench")
    assert len(la) == len(lb) == 5
    assert la[-1] < la[0], "the baseline must actually train"
    assert max(abs(x - y) for x, y in zip(la, lb)) <= 1e-5, (la, lb)


def test_megatron_rejects_zero_options():
    r = zb("train", "--system", "megatron", "--stage", "2")
    assert r.returncode == 2 and "stage 0" in r.stderr
