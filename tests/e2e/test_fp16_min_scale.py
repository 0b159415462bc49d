"""``zerobench train`` in fp16 whose gradients overflow at every step: the loss scale backs off to its minimum and
the next overflow ends the run in one line, exit 1, with a ``failed`` status row giving that line as its reason
(in the CLI's own process and on launched ranks), as DeepSpeed stops at its minimum scale."""

from __future__ import annotations

import pytest

from tests.e2e.test_cli_train import rows, zb

REASON = "fp16 gradients overflowed with the loss scale already at its minimum 1 (min_loss_scale 1;"


@pytest.mark.slow  # 20 tiny fp16 steps: ~30 s on the 2-core VM
@pytest.mark.parametrize(
    "dp", [pytest.param(1, id="one-process"), pytest.param(2, id="launched", marks=pytest.mark.dist)]
)
def test_an_fp16_run_that_overflows_at_the_minimum_scale_fails_in_one_line(tmp_path, dp):
    out = tmp_path / "run"
    r = zb(
        "train",
        "--precision",
        "fp16",
        "--lr",
        "50",
        "--steps",
        "20",
        "--micro-batch",
        "1",
        "--preset",
        "tiny",
        "--dp",
        str(dp),
        "--out",
        str(out),
        timeout=300,
    )
    assert r.returncode == 1, r.stdout[-2000:] + r.stderr
    (line,) = r.stderr.strip().splitlines()
    assert line.startswith("zerobench: error: ") and REASON in line and "lower the learning rate" in line, line
    (status,) = [x for x in rows(out) if x["metric"] == "run_status"]
    assert status["status"] == "failed" and REASON in status["reason"], status
