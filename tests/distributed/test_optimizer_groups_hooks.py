"""``engine.optimizer``'s param groups and state-dict hooks, as torch's own optimizer tests drive them, at DP 2.

- A group's parameters are laid out in the partition at construction. torch steps each group's current ``params``
  list, so moving a parameter into a group of lr 0 (or reordering the groups, whose hyperparameters go by position)
  silently stepped it with its old group's: 3.1e-2 off torch. Such edits are refused in one line, and training
  after a refused edit is torch's.
- torch runs ``load_state_dict`` pre-hooks first, on the dict given, and loads the dict they return; a hook that
  raises leaves everything as it was. Here they ran after the shard was loaded, saw no ``zero_shard``, and a
  raising hook left the new moments in place. ``state_dict`` post-hooks now see ``zero_shard`` too.
"""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from tests.helpers.dist import run_distributed
from tests.helpers.tiers import STAGES
from tests.helpers.user_models import error_line

pytestmark = pytest.mark.dist

ADAM = {"lr": 1e-2, "betas": (0.9, 0.95), "eps": 1e-8, "weight_decay": 0.1}


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 3))


def _groups(model: nn.Module) -> list[dict]:
    """Weights at the default lr, biases frozen by an lr of 0 (what moving a weight into it would change)."""
    return [
        {"params": [p for n, p in model.named_parameters() if n.endswith("weight")]},
        {"params": [p for n, p in model.named_parameters() if n.endswith("bias")], "lr": 0.0},
    ]


def _batch(step: int, rank: int, world: int) -> torch.Tensor:
    x = torch.randn(4 * world, 4, generator=torch.Generator().manual_seed(step))
    return x[rank * 4 : (rank + 1) * 4] if rank is not None else x


def _shard(opt) -> dict:
    return _moments(opt.state_dict())


def _moments(sd: dict) -> dict:
    return {k: sd["zero_shard"][k].clone() for k in ("exp_avg", "exp_avg_sq")} | {"step": sd["zero_shard"]["step"]}


def _same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(torch.as_tensor(a[k]), torch.as_tensor(b[k])) for k in a)


def _run(rank: int, world: int, stage: int) -> dict:
    from zerobench.zero import ZeroConfig, apply_zero
    from zerobench.zero.config import AdamWConfig
    from zerobench.zero.state.shards import full_parameters

    model, ref = _model(), _model()
    engine = apply_zero(
        model,
        None,
        ZeroConfig(stage=stage, optimizer=AdamWConfig(**ADAM)),
        units=[model[0], model[2]],
        param_groups=_groups(model),
    )
    opt, torch_opt = engine.optimizer, torch.optim.AdamW(_groups(ref), **ADAM)
    out: dict = {}
    weight = opt.param_groups[0]["params"][0]
    out["moved"] = error_line(lambda: opt.param_groups[1]["params"].append(weight))
    if out["moved"] is None:  # the code before: undo the edit, so the hooks' half still runs
        opt.param_groups[1]["params"].pop()
    opt.param_groups.reverse()
    out["reordered"] = error_line(opt.step)
    opt.param_groups.reverse()

    for step in range(3):  # training after the refused edits is torch's with the groups as built
        model(_batch(step, rank, world)).pow(2).sum().div(world * 4).backward()
        engine.step()
        ref(_batch(step, None, world)).pow(2).sum().div(world * 4).backward()
        torch_opt.step()
        torch_opt.zero_grad()
    full = full_parameters(engine)
    out["off_torch"] = max((full[n] - p.detach()).abs().max().item() for n, p in ref.named_parameters())

    # state_dict post-hooks see the whole dict, and what they return is the result
    seen: list = []
    handle = opt.register_state_dict_post_hook(lambda o, sd: seen.append("zero_shard" in sd) or {**sd, "mine": 1})
    out["post_hook_result_kept"] = "mine" in opt.state_dict()
    out["post_hook_saw_shard"] = seen
    handle.remove()

    # load pre-hooks run first, on the whole dict, and the dict they return is loaded
    early = copy.deepcopy(opt.state_dict())
    model(_batch(3, rank, world)).pow(2).sum().backward()
    engine.step()
    late, late_shard = opt.state_dict(), _shard(opt)

    def raising(o, sd):
        raise RuntimeError("refused by the hook")

    handle = opt.register_load_state_dict_pre_hook(raising)
    out["raising"] = error_line(lambda: opt.load_state_dict(early))
    out["raising_left_shard"] = _same(_shard(opt), late_shard)
    out["raising_left_lr"] = opt.param_groups[0]["lr"]
    handle.remove()

    pre_seen: list = []

    def swap(o, sd):
        pre_seen.append("zero_shard" in sd)
        substitute = copy.deepcopy(early)
        substitute["param_groups"][0]["lr"] = 0.123
        return substitute

    posts: list = []
    opt.register_load_state_dict_pre_hook(swap)
    opt.register_load_state_dict_post_hook(lambda o: posts.append(o.param_groups[0]["lr"]))
    opt.load_state_dict(late)
    out["pre_hook_saw_shard"], out["post_hook_lr"] = pre_seen, posts
    out["loaded_the_hooks_dict"] = _same(_shard(opt), _moments(early))
    out["moments_moved"] = not _same(_shard(opt), late_shard)
    engine.destroy()
    return out


@pytest.fixture(scope="module", params=STAGES, ids=lambda s: f"s{s}")
def ranks(request):
    return run_distributed(_run, 2, request.param)


def test_a_groups_parameters_stay_those_it_was_built_with(ranks):
    for r in ranks:
        assert r["moved"].startswith("ValueError: a ZeRO optimizer's param groups hold the parameters given at")
        assert r["reordered"].startswith("ConfigError: param_groups[0]['params'] is not the list this group was")
        assert "\n" not in r["moved"] + r["reordered"]
        assert r["off_torch"] < 1e-6, r


def test_state_dict_hooks_run_in_torchs_order_on_the_whole_dict(ranks):
    for r in ranks:
        assert r["post_hook_saw_shard"] == [True] and r["post_hook_result_kept"]
        assert r["raising"] == "RuntimeError: refused by the hook"
        assert r["raising_left_shard"] and r["raising_left_lr"] == ADAM["lr"]
        assert r["pre_hook_saw_shard"] == [True] and r["post_hook_lr"] == [0.123]
        assert r["moments_moved"] and r["loaded_the_hooks_dict"], r
