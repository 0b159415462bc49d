"""Parity scenarios run inside spawned ranks: train with the engine, compare with the reference."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from tests.helpers.reference import reference_train
from zerobench.distributed.collectives import Group
from zerobench.distributed.mesh import Mesh, build_mesh
from zerobench.models.gpt import GPT
from zerobench.models.sizes import PRESETS
from zerobench.parallel.checkpointing import ActivationConfig
from zerobench.parallel.fused import apply_fused_kernels
from zerobench.parallel.layers import shard_cols, shard_rows
from zerobench.parallel.parallelize import ParallelSpec, parallelize
from zerobench.train.data import SyntheticTokens
from zerobench.zero import AdamWConfig, LossScaleConfig, Precision, ZeroConfig
from zerobench.zero.state.shards import full_gradients, full_parameters


@dataclass(frozen=True)
class Scenario:
    dp: int
    stage: int
    precision: str = "fp32"
    accum: int = 1
    clip: float | None = None
    steps: int = 3
    global_batch: int = 8
    bucket_numel: int = 20_000
    loss_scale: LossScaleConfig = field(default_factory=LossScaleConfig)
    preset: str = "tiny"
    tp: int = 1
    ac: ActivationConfig = field(default_factory=ActivationConfig)
    sp: bool = False
    kernels: str = "auto"
    offload: str = "none"
    offload_param: str = "none"
    optim_bits: int = 32
    groups: str = "default"
    """``"default"`` (one group, the engine's rule) or a name in ``GROUPINGS`` (passed to ``parallelize``)."""

    @property
    def key(self) -> str:
        a = self.ac
        ac = f"-ckpt{int(a.checkpoint)}{int(a.partition)}{int(a.cpu_offload)}{int(a.contiguous)}"
        sp = "-sp" if self.sp else ""
        kern = "" if self.kernels == "auto" else f"-{self.kernels}"
        off = "" if self.offload == "none" else f"-off{self.offload}{self.offload_param}"
        bits = "" if self.optim_bits == 32 else f"-adam{self.optim_bits}"
        groups = "" if self.groups == "default" else f"-groups{self.groups}"
        return (
            f"dp{self.dp}-tp{self.tp}{sp}-s{self.stage}-{self.precision}-acc{self.accum}-clip{self.clip}"
            f"{ac}{kern}{off}{bits}{groups}"
        )


ADAM = AdamWConfig(lr=1e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)


def three_groups(named) -> list[dict]:
    """Over ``(name, parameter)`` pairs: the token embedding (tied to the head) at a lower lr with other betas
    and decay; other matrices at the config's values; vectors without decay, at a higher lr and eps."""
    return [
        {"params": [p for n, p in named if p.dim() >= 2 and n != "wte.weight"]},
        {"params": [p for n, p in named if n == "wte.weight"], "lr": 3e-4, "betas": (0.8, 0.99), "weight_decay": 0.05},
        {"params": [p for _, p in named if p.dim() < 2], "lr": 2e-3, "eps": 1e-6, "weight_decay": 0.0},
    ]


GROUPINGS = {"three": three_groups}


def dp_groups(rank: int, world: int, dps) -> dict[int, Group]:
    """One DP group per degree, consecutive ranks; every rank takes part in creating every group."""
    out = {}
    for dp in sorted(set(dps)):
        for start in range(0, world, dp):
            ranks = list(range(start, start + dp))
            pg = dist.new_group(ranks, backend="gloo")
            if rank in ranks:
                out[dp] = Group.of(pg, "dp")
    return out


def tp_local(name: str, full: torch.Tensor, tp: Group) -> torch.Tensor:
    """The slice of a full (reference) parameter that TP rank ``tp.rank`` holds, derived from names."""
    if tp.size == 1:
        return full
    if name.endswith(("qkv.weight", "qkv.bias")):
        return shard_rows(full, tp, strided=3)
    if name.endswith(("fc.weight", "fc.bias")) or name == "wte.weight":
        return shard_rows(full, tp)
    if name.endswith("proj.weight"):
        return shard_cols(full, tp)
    return full


def _grad_error(engine, model, data, sc: Scenario, tp_group: Group) -> float:
    """Max over parameters of max|g_engine - g_ref| / max|g_ref| for the first step's gradient."""
    got = full_gradients(engine)
    ref = copy.deepcopy(model)
    x, y = data.samples(0, 0, sc.global_batch)
    ref(x, y).backward()
    worst = 0.0
    for n, p in ref.named_parameters():
        g = tp_local(n, p.grad, tp_group)
        worst = max(worst, (got[n] - g).abs().max().item() / max(g.abs().max().item(), 1e-30))
    return worst


def run_scenarios(rank: int, world: int, scenarios: list[Scenario], keep_params: bool = False) -> dict[str, dict]:
    """Train every scenario and compare it with the single-process reference; ``keep_params`` also
    returns the trained full parameters (to compare scenarios with each other)."""
    import tempfile

    with tempfile.TemporaryDirectory(prefix="zerobench-test-nvme-") as nvme_dir:  # removed, not leaked
        return _run_scenarios(rank, world, scenarios, keep_params, nvme_dir)


def _run_scenarios(
    rank: int, world: int, scenarios: list[Scenario], keep_params: bool, nvme_dir: str
) -> dict[str, dict]:
    """Train every scenario and compare it with the single-process reference; ``keep_params`` also
    returns the trained full parameters (to compare scenarios with each other)."""
    groups = dp_groups(rank, world, [s.dp for s in scenarios if s.tp == 1])
    meshes = {(s.dp, s.tp): None for s in scenarios if s.tp > 1}
    for dp, tp in meshes:
        meshes[(dp, tp)] = build_mesh(tp, dp)
    results, ref_cache = {}, {}
    for sc in scenarios:
        cfg = PRESETS[sc.preset]
        torch.manual_seed(0)
        model = GPT(cfg)
        data = SyntheticTokens(cfg.vocab, cfg.seq, seed=7)
        tp_group = meshes[(sc.dp, sc.tp)].tp if sc.tp > 1 else Group(None, "tp", 1, 0)
        group = meshes[(sc.dp, sc.tp)].dp if sc.tp > 1 else groups[sc.dp]
        zcfg = ZeroConfig(
            stage=sc.stage,
            precision=Precision(sc.precision),
            bucket_numel=sc.bucket_numel,
            grad_accum_steps=sc.accum,
            clip_grad_norm=sc.clip,
            optimizer=ADAM,
            loss_scale=sc.loss_scale,
            kernels=sc.kernels,
            offload_optimizer=sc.offload,
            offload_param=sc.offload_param,
            nvme_path=nvme_dir if sc.offload == "nvme" else None,
            optim_bits=sc.optim_bits,
        )
        work = copy.deepcopy(model)
        mesh = Mesh(dp=group, tp=tp_group, world=group)  # world: unused by parallelize
        spec = ParallelSpec(zero=zcfg, sequence_parallel=sc.sp, kernels=sc.kernels, activation=sc.ac)
        grouping = GROUPINGS.get(sc.groups)
        param_groups = None if grouping is None else (lambda m, g=grouping: g(list(m.named_parameters())))
        built = parallelize(work, mesh, spec, param_groups=param_groups)  # the production composition
        store, engine = built.store, built.engine
        mb = sc.global_batch // (sc.dp * sc.accum)
        losses, stepped = [], []
        grad_rel_err = None
        for step in range(sc.steps):
            total = torch.zeros(1)
            for micro in range(sc.accum):
                x, y = data.micro_batch(step, group.rank, sc.dp, micro, mb)
                loss = engine.module(x, y)
                engine.backward(loss)
                total += loss.detach().float() / sc.accum
            dist.all_reduce(total, group=group.pg)
            losses.append(total.item() / sc.dp)
            if step == 0 and sc.precision == "fp32":
                grad_rel_err = _grad_error(engine, model, data, sc, tp_group)
            stepped.append(engine.step())
            engine.zero_grad()
        full = full_parameters(engine)
        key = (sc.precision, sc.clip, sc.loss_scale, sc.steps, sc.global_batch, sc.preset, sc.kernels, sc.groups)
        if key not in ref_cache:
            # The reference is the same model (same fused model kernels) trained in one process with
            # torch.optim.AdamW: the difference is the parallelism and ZeRO's optimizer step alone.
            ref_model = copy.deepcopy(model)
            apply_fused_kernels(ref_model, sc.kernels)
            batches = [data.samples(t, 0, sc.global_batch) for t in range(sc.steps)]
            ref_cache[key] = reference_train(
                ref_model, batches, sc.precision, ADAM, sc.clip, sc.loss_scale, GROUPINGS.get(sc.groups)
            )
        ref_losses, ref_params, ref_stepped = ref_cache[key]
        ref_params = {n: tp_local(n, t, tp_group) for n, t in ref_params.items()}
        init = {n: tp_local(n, p.detach(), tp_group) for n, p in model.named_parameters()}
        diff = max((full[n] - ref_params[n]).abs().max().item() for n in ref_params)
        moved = max((ref_params[n] - init[n]).abs().max().item() for n in ref_params)
        num = sum((full[n] - ref_params[n]).pow(2).sum().item() for n in ref_params)
        den = sum((ref_params[n] - init[n]).pow(2).sum().item() for n in ref_params)
        res = {
            "grad_rel_err": grad_rel_err,
            "max_diff": diff,
            "update_rel_err": (num / den) ** 0.5,
            "max_update": moved,
            "loss_diff": max(abs(a - b) for a, b in zip(losses, ref_losses)),
            "stepped": stepped,
            "ref_stepped": ref_stepped,
            "loss_scale": engine.loss_scale,
            "ckpt_peak": dict(store.peak) if store is not None else None,
            "ledger": engine.accounting.memory_ledger(),
        }
        if keep_params:
            res["params"] = {n: t.detach().cpu().numpy().copy() for n, t in full.items()}  # picklable across processes
        if sc.stage < 3:  # replicated model parameters equal the (cast) master on every rank
            lp = {n: p.detach().float() for n, p in engine.module.named_parameters()}
            dtype = Precision(sc.precision).param_dtype
            res["model_vs_master"] = max((lp[n] - full[n].to(dtype).float()).abs().max().item() for n in lp)
        results[sc.key] = res
    return results
