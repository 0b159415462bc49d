"""Parameters changed in place between steps, outside ``gathered_params``, under bf16/fp16 at stages 0-2 (and under
optimizer offload, fp32 too), inside spawned ranks: the change must be what the next step starts from, as ``torch.optim`` steps whatever a parameter
holds.

Two idioms, as training loops write them: ``with torch.no_grad(): emb.weight[0].zero_()`` (a padding row kept at
zero) and ``head.weight.data.copy_(values)`` (re-initialising a layer; ``.data`` writes do not bump the version
counter, so only comparing values can see them). The reference is the single-process bf16 recipe
(``tests/helpers/user_models_bf16.py``) with the same changes made to the parameter and its fp32 master, which is
what one parameter means to a torch user.

Before, the step recomputed every parameter from the fp32 master, which never saw the change: the zeroed row came
back at its old values (about 0.8 in magnitude) one step later.
"""

from __future__ import annotations

import copy

import torch

from tests.helpers.reference import make_adamw
from tests.helpers.user_models import ADAM, batches, compare, engine_for, make_model, reference_loss, slice_of
from zerobench.distributed.collectives import Group
from zerobench.zero import Precision
from zerobench.zero.compat.deepspeed.tensor_fragment import safe_get_full_fp32_param
from zerobench.zero.state.shards import full_parameters

CASES = [(s, Precision.BF16, "auto", "none") for s in (0, 1, 2)] + [
    (2, Precision.FP16, "auto", "none"),
    (1, Precision.BF16, "reference", "none"),
    (1, Precision.BF16, "auto", "cpu"),
    (2, Precision.FP16, "auto", "cpu"),
    (2, Precision.FP32, "auto", "cpu"),
]
"""(stage, precision, kernels, optimizer offload): the fused kernel takes the change inside its pass, the reference
path before it; under offload the master is on the host, and the step finds a change by each shard's checksum."""


def case_key(stage: int, precision: Precision, kernels: str, offload: str = "none") -> str:
    return (
        f"s{stage}-{precision.value}"
        + ("" if kernels == "auto" else f"-{kernels}")
        + ("" if offload == "none" else f"-offload-{offload}")
    )


def fixed_head(dtype: torch.dtype) -> torch.Tensor:
    """The values ``head.weight`` is re-initialised to after the first step (seeded, in the training dtype)."""
    g = torch.Generator().manual_seed(5)
    return (0.05 * torch.randn(make_model("mlp").head.weight.shape, generator=g)).to(dtype)


def edit(model, step: int, dtype: torch.dtype, masters: dict | None = None) -> None:
    """The loop's changes after step ``step``; with ``masters`` (the reference's fp32 copies by name) those too."""
    with torch.no_grad():
        model.emb.weight[0].zero_()
        if masters is not None:
            masters["emb.weight"][0].zero_()
    if step == 0:
        model.head.weight.data.copy_(fixed_head(dtype))
        if masters is not None:
            masters["head.weight"].data.copy_(fixed_head(dtype).float())


def reference(model, data, world: int) -> dict[str, torch.Tensor]:
    """The bf16 recipe with the loop's changes made to each parameter and its master."""
    work = copy.deepcopy(model).bfloat16()
    names = [n for n, _ in work.named_parameters()]
    master = [p.detach().float().clone().requires_grad_(True) for p in work.parameters()]
    opt = make_adamw(master, ADAM)
    for step, (x, y) in enumerate(data):
        reference_loss(work, x, y, world).backward()
        for m, p in zip(master, work.parameters()):
            m.grad, p.grad = p.grad.float(), None
        opt.step()
        with torch.no_grad():
            for m, p in zip(master, work.parameters()):
                p.copy_(m)
        if step < len(data) - 1:
            edit(work, step, torch.bfloat16, dict(zip(names, master)))
    return {n: m.detach() for n, m in zip(names, master)}


def _train(model, group, case, data, rank, world, loop_edit) -> object:
    stage, precision, kernels, offload = case
    engine = engine_for(
        copy.deepcopy(model), group, stage, precision=precision, kernels=kernels, offload_optimizer=offload
    )
    for step, (x, y) in enumerate(data):
        engine.backward(engine.module(slice_of(x, rank, world), slice_of(y, rank, world)))
        engine.step()
        if step < len(data) - 1:
            loop_edit(engine.module, step)
    return engine


def _noop(module, step: int) -> None:
    """Writes that change nothing: every parameter copied onto itself, both idioms."""
    with torch.no_grad():
        for p in module.parameters():
            p.data.copy_(p.data.clone())
            p.add_(0)


def run_param_edits(rank: int, world: int) -> dict[str, dict]:
    group = Group.of(torch.distributed.new_group(backend="gloo"), "dp")
    model, data = make_model("mlp"), batches(3, 6)
    ref = reference(model, data, world)
    out = {}
    for case in CASES:
        _, precision, _, _ = case
        dtype = precision.param_dtype
        engine = _train(model, group, case, data, rank, world, lambda m, s, d=dtype: edit(m, s, d))
        res = compare(engine, model, ref)
        full = full_parameters(engine)
        res["row0_max"] = full["emb.weight"][0].abs().max().item()
        res["row0_ref_diff"] = (full["emb.weight"][0] - ref["emb.weight"][0]).abs().max().item()
        res["head_from_fixed"] = (full["head.weight"] - fixed_head(dtype).float()).abs().max().item()
        res["row0_module"] = engine.module.emb.weight[0].float().abs().max().item()
        # changed after the last step, then read or saved before any other step
        with torch.no_grad():
            engine.module.emb.weight[1].zero_()
        res["row1_safe_get"] = safe_get_full_fp32_param(engine.module.emb.weight)[1].abs().max().item()
        saved = copy.deepcopy(engine.optimizer.state_dict())
        res["row1_saved"] = _saved_row(saved["zero_shard"], "emb.weight", 1, model.emb.weight.shape[1])
        # no-op writes change nothing: the untouched run's masters, bit for bit
        quiet = full_parameters(_train(model, group, case, data, rank, world, lambda m, s: None))
        noisy = full_parameters(_train(model, group, case, data, rank, world, _noop))
        res["noop_identical"] = all(torch.equal(quiet[n], noisy[n]) for n in quiet)
        out[case_key(*case)] = res
    return out


def _saved_row(shard: dict, name: str, row: int, width: int) -> tuple[float, int]:
    """(the largest |value| of the fp32 master ``shard`` holds for row ``row`` of parameter ``name``, how many of
    that row's elements this rank's shard holds)."""
    lo, hi, at, found = row * width, (row + 1) * width, 0, []
    for seg_name, start, end in shard["segments"]:
        if seg_name == name and start < hi and end > lo:
            a, b = max(start, lo), min(end, hi)
            found.append(shard["master"][at + a - start : at + b - start])
        at += end - start
    values = torch.cat([torch.empty(0), *found])
    return (values.abs().max().item() if values.numel() else 0.0), values.numel()


def run_restore_after_write(rank: int, world: int) -> dict[str, float]:
    """Under offload, a write outside the step (``model.load_state_dict``, ``safe_set_full_fp32_param``, a checkpoint
    load) then the step's own values copied back in place (an EMA swap undone): the master must take the copy back.
    A checksum taken before the write matches the restored shard, so it must not be trusted after one. Per case:
    how far the master, in the training dtype, ends from the restored values."""
    from zerobench.zero.compat.deepspeed.tensor_fragment import safe_set_full_fp32_param

    group = Group.of(torch.distributed.new_group(backend="gloo"), "dp")
    model, data = make_model("mlp"), batches(2, 6)
    out = {}
    for how in ("load_state_dict", "safe_set", "optimizer_load"):
        engine = _train(model, group, (2, Precision.BF16, "auto", "cpu"), data[:1], rank, world, lambda m, s: None)
        saved = copy.deepcopy(engine.optimizer.state_dict())
        engine.backward(engine.module(slice_of(data[1][0], rank, world), slice_of(data[1][1], rank, world)))
        engine.step()
        live = {n: p.detach().clone() for n, p in engine.module.named_parameters()}
        if how == "load_state_dict":
            engine.module.load_state_dict({n: torch.full_like(p, 0.5) for n, p in live.items()})
        elif how == "safe_set":
            for p in engine.module.parameters():
                safe_set_full_fp32_param(p, torch.full(p.shape, 0.5))
        else:  # the state one step back
            engine.optimizer.load_state_dict(saved)
        with torch.no_grad():
            for n, p in engine.module.named_parameters():
                p.data.copy_(live[n])
        full = full_parameters(engine)
        out[how] = max((full[n].to(live[n].dtype).float() - live[n].float()).abs().max().item() for n in full)
    return out


def _swap_pairs(p: torch.Tensor) -> None:
    """Elements 2i and 2i+1 of ``p`` swapped in place: every even-aligned span keeps its values, so each shard
    keeps the sum of its bits."""
    flat = p.data.view(-1)
    even = flat[: flat.numel() // 2 * 2].view(-1, 2)
    even.copy_(even.flip(1))


def _negate_mixed_pairs(p: torch.Tensor) -> None:
    """Each even-aligned pair of one positive and one negative element negated in place: the sum of each shard's
    bits is kept (one sign bit set, one cleared)."""
    flat = p.data.view(-1)
    even = flat[: flat.numel() // 2 * 2].view(-1, 2)
    mixed = (even[:, 0] > 0) != (even[:, 1] > 0)
    even[mixed] = -even[mixed]


def run_sum_keeping_edits(rank: int, world: int) -> dict[str, dict]:
    """Under optimizer offload, changes in place that keep each shard's sum of bits: a permutation
    (``_swap_pairs``) and balanced sign flips (``_negate_mixed_pairs``). Per case: how far the master ends from the
    edited values when read (``safe_get_full_fp32_param``), and after the next step how far each parameter is from
    its edited value (one step's move) and from the value it had before the edit (the edit undone)."""
    group = Group.of(torch.distributed.new_group(backend="gloo"), "dp")
    model, data = make_model("mlp"), batches(2, 6)
    out = {}
    for case in [c for c in CASES if c[3] != "none"]:
        engine = _train(model, group, case, data[:1], rank, world, lambda m, s: None)
        head, emb = engine.module.head.weight, engine.module.emb.weight
        before = {"head": head.detach().float().clone(), "emb": emb.detach().float().clone()}
        with torch.no_grad():
            _swap_pairs(head)
            _negate_mixed_pairs(emb)
        edited = {"head": head.detach().float().clone(), "emb": emb.detach().float().clone()}
        res = {
            "edit_size": min((edited[k] - before[k]).abs().max().item() for k in edited),
            "read": max(
                (safe_get_full_fp32_param(p).to(p.dtype).float() - edited[k]).abs().max().item()
                for k, p in (("head", head), ("emb", emb))
            ),
        }
        x, y = data[1]
        engine.backward(engine.module(slice_of(x, rank, world), slice_of(y, rank, world)))
        engine.step()
        after = {"head": head.detach().float(), "emb": emb.detach().float()}
        res["from_edited"] = max((after[k] - edited[k]).abs().max().item() for k in after)
        res["from_before"] = min((after[k] - before[k]).abs().max().item() for k in after)
        out[case_key(*case)] = res
    return out
