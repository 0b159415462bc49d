"""The multi-rank CUDA path on one card (issue 23): ``zerobench train`` at world 2 on one GPU, where the backend
choice gives gloo (NCCL refuses two ranks on a device; gloo moves CUDA tensors for the all-reduce and
broadcast zerobench's gloo path is built from), against one process on the same card with the same global
batch. Runs only where CUDA is present (a lent GPU: ``python -m pytest tests/gpu``); on CPU it is skipped.

``-k "$CUDA_PATHS"`` (the expression below; ``scripts/gpu_first.sh`` uses it) keeps the cases that prove the CUDA
paths, one each: the bucket collectives' streams and events (stage 2, bf16), the stage-3 gather/free with
prefetch (stage 3, bf16), the pinned host copies of the offloaded optimizer (stage 2, bf16) and of P_a+cpu (TP 2),
and the dynamic loss scaler across ranks (fp16 with accumulation). The one-process references are made only for
the precisions the selected cases compare against.
"""

from __future__ import annotations

import json

import pytest
import torch

from tests.e2e.test_cli_train import zb

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

TOLERANCE = {"fp32": 1e-4, "bf16": 2e-2, "fp16": 2e-2}
"""Largest relative difference of a step's loss (reduction order differs; bf16/fp16 round per op)."""


def _losses(out) -> tuple[list[float], dict]:
    rows = [json.loads(line) for line in (out / "rows.jsonl").read_text().splitlines()]
    loss = sorted((r["step"], r["value"]) for r in rows if r["metric"] == "loss")
    return [v for _, v in loss], rows[0]["config"]


def _train(out, *args) -> tuple[list[float], dict]:
    r = zb("train", "--preset", "mini", "--steps", "6", "--warmup", "1", "--out", str(out), *args, timeout=900)
    assert r.returncode == 0, r.stderr
    return _losses(out)


CUDA_PATHS = " or ".join(
    f"[{case}]" for case in ("2-bf16-plain", "3-bf16-plain", "2-bf16-offload", "2-fp16-accum", "pa-cpu-bf16")
)
"""The ``-k`` expression of the cut that proves the CUDA paths (see the module docstring)."""


class OneProcess(dict):
    """The one-process reference losses per precision, each trained when a case first asks for it."""

    def __init__(self, base):
        super().__init__()
        self.base = base

    def __missing__(self, precision: str) -> list[float]:
        self[precision] = _train(self.base / precision, "--dp", "1", "--micro-batch", "4", "--precision", precision)[0]
        return self[precision]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return OneProcess(tmp_path_factory.mktemp("one"))


@pytest.mark.parametrize(
    "extra",
    [[], ["--grad-accum", "2", "--micro-batch", "1"], ["--offload-optimizer", "cpu"]],
    ids=["plain", "accum", "offload"],
)
@pytest.mark.parametrize("precision", list(TOLERANCE))
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_two_ranks_on_one_gpu_train_as_one_process(one_process, tmp_path, stage, precision, extra):
    if "--offload-optimizer" in extra and stage == 0:
        pytest.skip("offload partitions the optimizer: stages 1-3")
    args = ["--micro-batch", "2", *extra] if "--micro-batch" not in extra else extra
    losses, cfg = _train(tmp_path / "two", "--dp", "2", "--stage", str(stage), "--precision", precision, *args)
    assert cfg["backend"] == "auto"
    ref = one_process[precision]
    rel = max(abs(a - b) / abs(b) for a, b in zip(losses, ref))
    assert len(losses) == len(ref) and rel <= TOLERANCE[precision], (losses, ref)


@pytest.mark.parametrize(
    "stage, precision, extra",
    [(0, "fp32", []), (3, "fp32", []), (0, "bf16", ["--pa-cpu"])],
    ids=["s0-fp32", "s3-fp32", "pa-cpu-bf16"],
)
def test_tp2_on_one_gpu(one_process, tmp_path, stage, precision, extra):
    """TP 2 on one card; with ``--pa-cpu`` each rank keeps its part of every block's checkpoint in pinned host
    memory (P_a+cpu), copied there and back on side streams."""
    losses, _ = _train(
        tmp_path / "tp",
        *("--dp", "1", "--tp", "2", "--micro-batch", "4", "--stage", str(stage), "--precision", precision, *extra),
    )
    ref = one_process[precision]
    assert len(losses) == len(ref) and max(abs(a - b) / abs(b) for a, b in zip(losses, ref)) <= TOLERANCE[precision]


def test_nccl_with_two_ranks_on_one_gpu_is_one_line(tmp_path):
    if torch.cuda.device_count() > 1:
        pytest.skip("every rank has a GPU of its own here")
    r = zb("train", "--preset", "tiny", "--dp", "2", "--backend", "nccl", "--steps", "2", "--out", str(tmp_path))
    assert r.returncode == 2 and "--backend nccl needs one GPU per rank: 2 ranks on this node share 1 GPU" in r.stderr
