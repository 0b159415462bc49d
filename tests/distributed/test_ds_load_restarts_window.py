"""``engine.load_checkpoint()`` in the middle of an accumulation window (rolling back after a micro-batch whose
loss was NaN): the checkpoint holds a window's boundary, so the load drops the gradients accumulated before it and
the next micro-batch starts a window. Kept, a NaN gradient trained into the weights at stage 0 and the first window
after the load was skipped at stages 1-3; a finite one was mixed into that window, and every boundary after the load
came one micro-batch early. The run after the rollback must equal a run that loaded the checkpoint and trained the
same micro-batches."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed
from tests.helpers.tiers import STAGES

pytestmark = pytest.mark.dist


def _engine(stage: int):
    from zerobench.zero import initialize

    torch.manual_seed(0)
    model = nn.Linear(4, 1)
    cfg = {
        "train_micro_batch_size_per_gpu": 2,
        "gradient_accumulation_steps": 2,
        "gradient_clipping": 0,
        "optimizer": {"type": "AdamW", "params": {"lr": 0.1}},
        "zero_optimization": {"stage": stage},
    }
    return initialize(model=model, config=cfg)[0]


def _weights(e) -> torch.Tensor:
    with e.gathered_params():
        return e.module.weight.detach().clone()


def _run(rank: int, world: int, stage: int, ckpt: str) -> dict:
    e = _engine(stage)
    e.save_checkpoint(ckpt)
    e.destroy()
    g = torch.Generator().manual_seed(1 + rank)
    data = [torch.randn(2, 4, generator=g) for _ in range(4)]
    out = {}
    for case in ("clean", "nan", "finite"):
        e = _engine(stage)
        if case != "clean":  # one micro-batch of a window, then roll back
            bad = data[0].clone()
            if case == "nan":
                bad[0, 0] = float("nan")
            e.backward(e(bad).pow(2).mean())
            e.step()
        e.load_checkpoint(ckpt)
        steps = []
        for x in data:
            e.backward(e(x).pow(2).mean())
            steps.append(e.step())
        out[case] = {"w": _weights(e), "steps": steps, "skipped": e.skipped_steps, "global": e.global_steps}
        e.destroy()
    return out


@pytest.mark.parametrize("stage", STAGES)
def test_a_load_mid_window_trains_as_a_load_at_its_boundary(stage, tmp_path):
    for r in run_distributed(_run, 2, stage, str(tmp_path / "ckpt"), timeout=300):
        clean = r["clean"]
        assert clean["steps"] == [False, True, False, True] and clean["skipped"] == 0
        for case in ("nan", "finite"):
            got = r[case]
            assert got["steps"] == clean["steps"] and got["skipped"] == 0 and got["global"] == clean["global"], case
            assert torch.isfinite(got["w"]).all() and torch.equal(got["w"], clean["w"]), case
