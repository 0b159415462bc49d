"""A checkpoint load takes effect at once, or is refused before anything changes (a helper's review, reproduced):

- At stage 3, a root submodule called on its own (``engine.module.emb(x)``, allowed as DeepSpeed allows it) leaves the
  root unit gathered until the next step. A load then wrote the master and the shards, and the next forward computed
  with the gathered pre-load embedding and head: its loss and the first step after the load were wrong (offloaded
  parameters too).
- A load inside ``gathered_params()`` at stage 3, or inside DeepSpeed's ``GatheredParameters`` with no
  ``modifier_rank`` at stages 1-2, was undone when the context exited: the weights went back to their initial
  values while the moments, step count and schedule stayed loaded. It is now refused in one line, as ``step()``
  there is.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed

pytestmark = pytest.mark.dist


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(24, 16)
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(16, 16), nn.GELU()) for _ in range(2)])
        self.head = nn.Linear(16, 24)

    def forward(self, x):
        h = self.emb(x).mean(1)
        for b in self.blocks:
            h = b(h)
        return self.head(h).float().logsumexp(-1).mean()


def _engine(seed: int, stage: int, offload: str = "none"):
    from zerobench.zero import ZeroConfig, apply_zero, as_deepspeed
    from zerobench.zero.config import AdamWConfig

    torch.manual_seed(seed)
    cfg = ZeroConfig(
        stage=stage, optimizer=AdamWConfig(lr=1e-2), bucket_numel=300, offload_optimizer=offload, offload_param=offload
    )
    return as_deepspeed(apply_zero(Net(), None, cfg))


def _batch(seed: int) -> torch.Tensor:
    return torch.randint(0, 24, (4, 5), generator=torch.Generator().manual_seed(seed))


def _trained(stage: int, tmp: str, offload: str = "none"):
    e = _engine(0, stage, offload)
    for s in range(3):
        e.backward(e(_batch(s)))
        e.step()
    e.save_checkpoint(f"{tmp}/ck")
    return e


def _root_gathered_then_loaded(rank: int, world: int, tmp: str, offload: str) -> dict:
    from zerobench.zero.state.shards import full_parameters

    saved = _trained(3, f"{tmp}/{offload}", offload)
    x = _batch(9)
    with torch.no_grad():
        want = saved(x).item()
    e = _engine(1, 3, offload)  # another initialisation: stale values would show
    with torch.no_grad():
        e.module.emb(x)  # the root unit gathered on demand
    e.load_checkpoint(f"{tmp}/{offload}/ck")
    with torch.no_grad():
        first = e(x).item()
    e.backward(e(x))
    e.step()
    saved.backward(saved(x))
    saved.step()
    theirs = full_parameters(saved)
    return {
        "want": want,
        "first": first,
        "diff": max((v - theirs[k]).abs().max().item() for k, v in full_parameters(e).items()),
    }


@pytest.mark.parametrize("offload", ["none", "cpu"])
def test_a_load_after_a_root_submodule_call_takes_effect_at_once(tmp_path, offload):
    for r in run_distributed(_root_gathered_then_loaded, 2, str(tmp_path), offload):
        assert r["first"] == r["want"] and r["diff"] == 0.0, r


def _load_inside(rank: int, world: int, tmp: str, stage: int, how: str) -> dict:
    from zerobench.zero import GatheredParameters
    from zerobench.zero.state.shards import full_parameters

    _trained(stage, tmp)
    e = _engine(1, stage)
    before = {k: v.clone() for k, v in full_parameters(e).items()}
    sd = e.optimizer.state_dict()
    said = []
    for load in (lambda: e.load_checkpoint(f"{tmp}/ck"), lambda: e.optimizer.load_state_dict(sd)):
        ctx = e.gathered_params() if how == "gathered_params" else GatheredParameters(list(e.module.parameters()))
        with ctx:
            try:
                load()
            except RuntimeError as err:
                said.append(str(err))
    unchanged = all(torch.equal(v, before[k]) for k, v in full_parameters(e).items())
    e.load_checkpoint(f"{tmp}/ck")  # outside: loads
    return {"said": said, "unchanged": unchanged, "steps": e.global_steps}


@pytest.mark.parametrize(
    ("stage", "how"), [(3, "gathered_params"), (3, "GatheredParameters"), (2, "GatheredParameters")]
)
def test_a_load_inside_a_gathered_context_that_would_undo_it_is_refused(tmp_path, stage, how):
    for r in run_distributed(_load_inside, 2, str(tmp_path), stage, how):
        assert len(r["said"]) == 2 and r["unchanged"] and r["steps"] == 3, r
        for caller, line in zip(("load_checkpoint()", "load_state_dict()"), r["said"]):
            assert line.startswith(f"{caller} inside gathered_params(") and "\n" not in line, line
            assert f"call {caller} after the context exits" in line, line
