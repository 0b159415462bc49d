"""Workers (run inside spawned ranks) about the engine on data parallelism alone: ledgers, DDP equivalence,
checkpoint resume at another DP degree, offload and 8-bit Adam."""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist

from tests.helpers.reference import make_adamw
from tests.helpers.scenarios import ADAM, dp_groups
from zerobench.models.gpt import GPT
from zerobench.models.sizes import PRESETS, num_params
from zerobench.train.data import SyntheticTokens
from zerobench.zero import Precision, ZeroConfig, apply_zero
from zerobench.zero.state_dict import consolidate, full_parameters, load_checkpoint, save_checkpoint


def _train(engine, data, group, steps, start, global_batch):
    mb = global_batch // group.size
    for step in range(start, start + steps):
        x, y = data.micro_batch(step, group.rank, group.size, 0, mb)
        engine.backward(engine.module(x, y))
        engine.step()
        engine.zero_grad()


def ledgers(rank, world, preset, precisions, stages, dps):
    """Measured model-state bytes and per-step communication volume for each configuration."""
    cfg = PRESETS[preset]
    groups = dp_groups(rank, world, dps)
    out = {}
    for prec in precisions:
        for dp in dps:
            for stage in stages:
                torch.manual_seed(0)
                engine = apply_zero(
                    GPT(cfg), groups[dp], ZeroConfig(stage=stage, precision=Precision(prec), bucket_numel=300_000)
                )
                data = SyntheticTokens(cfg.vocab, cfg.seq)
                _train(engine, data, groups[dp], 1, 0, 2 * dp)  # warm-up step
                engine.ledger.reset()
                _train(engine, data, groups[dp], 1, 1, 2 * dp)
                out[(prec, dp, stage)] = {
                    "ledger": engine.memory_ledger(),
                    "model_state_bytes": engine.model_state_bytes(),
                    "analytic": engine.model_state_bytes_analytic(),
                    "volume": engine.ledger.volume_elements(group="dp"),
                    "summary": engine.ledger.summary(),
                    "psi": num_params(cfg),
                }
    return out


def ddp_vs_stage0(rank, world, steps):
    """Stage 0 and torch DDP, same model/data/optimizer: return max parameter difference."""
    from torch.nn.parallel import DistributedDataParallel as DDP

    cfg = PRESETS["tiny"]
    torch.manual_seed(0)
    base = GPT(cfg)
    data = SyntheticTokens(cfg.vocab, cfg.seq)
    group = dp_groups(rank, world, [world])[world]
    engine = apply_zero(copy.deepcopy(base), group, ZeroConfig(stage=0, optimizer=ADAM, bucket_numel=30_000))
    _train(engine, data, group, steps, 0, 8)
    ddp = DDP(copy.deepcopy(base))
    opt = make_adamw(ddp.parameters(), ADAM)
    for step in range(steps):
        x, y = data.micro_batch(step, rank, world, 0, 8 // world)
        ddp(x, y).backward()
        opt.step()
        opt.zero_grad()
    mine = dict(engine.module.named_parameters())
    return max((mine[n] - p).abs().max().item() for n, p in ddp.module.named_parameters())


def checkpoint_resume(rank, world, stage, ckpt_dir, extra=None):
    """Train 2 steps at DP=4, save, go on 2 steps; reload at DP=2 (other init) and do the same 2 steps.

    Also loads the checkpoint into a single-process model and compares it with what was saved. ``extra``:
    more ``ZeroConfig`` fields for both engines (offload, 8-bit states); with ``same_layout`` in it the
    reload is at DP=4 with the same buckets (8-bit states resume exactly only on the same block layout).
    """
    cfg = PRESETS["tiny"]
    data = SyntheticTokens(cfg.vocab, cfg.seq)
    groups = dp_groups(rank, world, [2, 4])
    extra = dict(extra or {})
    same = extra.pop("same_layout", False)
    if extra.get("nvme_path"):
        extra["nvme_path"] = f"{extra['nvme_path']}/rank{rank}"
    zc = ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=20_000, **extra)
    torch.manual_seed(0)
    a = apply_zero(GPT(cfg), groups[4], zc)
    _train(a, data, groups[4], 2, 0, 8)
    save_checkpoint(a, ckpt_dir)
    at_save = full_parameters(a)
    dist.barrier()
    _train(a, data, groups[4], 2, 2, 8)
    uninterrupted = full_parameters(a)

    torch.manual_seed(1)  # a different init: everything must come from the checkpoint
    bg = groups[4] if same else groups[2]
    b = apply_zero(GPT(cfg), bg, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=20_000 if same else 7_000, **extra))
    load_checkpoint(b, ckpt_dir)
    step_after_load = b.optimizer.step_count
    _train(b, data, bg, 2, 2, 8)
    resumed = full_parameters(b)

    single = GPT(cfg)
    single.load_state_dict(consolidate(ckpt_dir))
    return {
        "diff": max((uninterrupted[n] - resumed[n]).abs().max().item() for n in resumed),
        "moved": max((uninterrupted[n] - at_save[n]).abs().max().item() for n in at_save),
        "step_after_load": step_after_load,
        "single_vs_saved": max((p.detach() - at_save[n]).abs().max().item() for n, p in single.named_parameters()),
    }


def adam_bits_losses(rank, world, steps, bits_list, offload="none", preset="mini"):
    """Loss curves of the same model/data trained with each Adam state width (stage 2 over the group)."""
    cfg = PRESETS[preset]
    group = dp_groups(rank, world, [world])[world]
    out = {}
    for bits in bits_list:
        torch.manual_seed(0)
        engine = apply_zero(GPT(cfg), group, ZeroConfig(stage=2 if world > 1 else 0, optimizer=ADAM, optim_bits=bits,
                                                        offload_optimizer=offload if world > 1 else "none"))
        data = SyntheticTokens(cfg.vocab, cfg.seq, seed=3)
        losses = []
        for step in range(steps):
            x, y = data.micro_batch(step, group.rank, group.size, 0, 8 // group.size)
            loss = engine.module(x, y)
            engine.backward(loss)
            engine.step()
            engine.zero_grad()
            t = loss.detach().clone()
            dist.all_reduce(t, group=group.pg)
            losses.append(t.item() / group.size)
        out[bits] = {"losses": losses, "ledger": engine.memory_ledger(), "numel": engine.numel}
    return out


def offload_ledgers(rank, world, preset):
    """Device/host ledgers and their analytic figures under offload and 8-bit states (bf16, stages 2-3)."""
    from zerobench.metrics.memory import storage_bytes

    cfg = PRESETS[preset]
    group = dp_groups(rank, world, [world])[world]
    configs = {
        "s2-cpu": dict(stage=2, offload_optimizer="cpu"),
        "s1-cpu": dict(stage=1, offload_optimizer="cpu"),
        "s3-cpu": dict(stage=3, offload_optimizer="cpu"),
        "s3-cpu-param": dict(stage=3, offload_optimizer="cpu", offload_param="cpu"),
        "s2-adam8": dict(stage=2, optim_bits=8),
        "s2-cpu-adam8": dict(stage=2, offload_optimizer="cpu", optim_bits=8),
    }
    out = {}
    data = SyntheticTokens(cfg.vocab, cfg.seq)
    for key, kw in configs.items():
        torch.manual_seed(0)
        engine = apply_zero(GPT(cfg), group, ZeroConfig(precision=Precision.BF16, bucket_numel=300_000, **kw))
        _train(engine, data, group, 2, 0, 2 * world)
        m = {
            "ledger": engine.memory_ledger(),
            "analytic": engine.model_state_bytes_analytic(),
            "host_analytic": engine.host_state_bytes_analytic() if engine.placement.offloaded else {},
            "device": engine.model_state_bytes(),
            "host": engine.host_model_state_bytes(),
        }
        if engine.scheduler is not None:
            units = engine.scheduler.order
            m["peak_gathered"] = engine.scheduler.peak_gathered_bytes
            m["root_bytes"] = units[0].nbytes
            m["largest_block_bytes"] = max(u.nbytes for u in units[1:])
        out[key] = m
    return {"psi": num_params(cfg), "configs": out, "storage_bytes_ok": storage_bytes([]) == 0}


def stage3_bucket_sizes(rank, world, bucket_numels):
    """Stage 3 at DP ``world`` with each bucket size: buckets per unit, the most staging bytes held at once
    during backward, reduce-scatter calls and volume, and the trained full parameters."""
    from zerobench.zero.bucket import GradBucketGroup

    cfg = PRESETS["tiny"]
    group = dp_groups(rank, world, [world])[world]
    out = {}
    for numel in bucket_numels:
        torch.manual_seed(0)
        engine = apply_zero(GPT(cfg), group, ZeroConfig(stage=3, optimizer=ADAM, bucket_numel=numel))
        peak = [0]
        add_grad = GradBucketGroup.add_grad

        def tracking(self, zp, grad, add_grad=add_grad, peak=peak):
            add_grad(self, zp, grad)
            peak[0] = max(peak[0], sum(t.numel() for t in self.staging.values()))

        engine.grads.add_grad = tracking.__get__(engine.grads)
        engine.ledger.reset()
        _train(engine, SyntheticTokens(cfg.vocab, cfg.seq), group, 2, 0, 2 * world)
        units = engine.scheduler.units
        rs = [r for r in engine.ledger.summary() if r["op"] == "reduce_scatter"]
        out[numel] = {
            "buckets_per_unit": [len(u.buckets) for u in units],
            "root_bucket": max(b.numel for b in engine.layout.buckets if b.unit == 0),
            "block_bucket": max(b.numel for b in engine.layout.buckets if b.unit != 0),
            "peak_staging": peak[0],
            "rs_calls": sum(r["calls"] for r in rs),
            "rs_volume": sum(r["volume_elements"] for r in rs),
            "params": {n: t.detach().cpu().numpy().copy() for n, t in full_parameters(engine).items()},
        }
    return out


def grad_views(rank, world, stage):
    """Stages 0-1: ``.grad`` is a view of the engine's gradient buffer (no per-step gradient tensors), and
    a user who resets ``.grad`` (``model.zero_grad()``) between steps trains the same parameters."""
    cfg = PRESETS["tiny"]
    group = dp_groups(rank, world, [world])[world]
    data = SyntheticTokens(cfg.vocab, cfg.seq)
    out = {}
    for reset in (False, True):
        torch.manual_seed(0)
        engine = apply_zero(GPT(cfg), group, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=30_000))
        buf = engine.grads.full.data.untyped_storage().data_ptr()
        views = []
        for step in range(3):
            x, y = data.micro_batch(step, rank, world, 0, 8 // world)
            engine.backward(engine.module(x, y))
            views.append(all(p.grad.untyped_storage().data_ptr() == buf for p in engine.module.parameters()))
            engine.step()
            engine.zero_grad()
            if reset:
                engine.module.zero_grad()  # set_to_none: autograd makes fresh tensors; the engine copies them in
        out[reset] = {"views": views, "params": {n: p.detach().numpy().copy() for n, p in engine.module.named_parameters()}}
    return out


def sole_buckets(rank, world, stage):
    """Stages 2-3: a bucket that is one parameter exactly (the tied embedding) is reduced from the gradient
    itself, never copied into a staging bucket; trained with and without that, the parameters are equal."""
    from zerobench.zero.staging import StagingBuckets

    cfg = PRESETS["tiny"]
    group = dp_groups(rank, world, [world])[world]
    out = {}
    for as_is in (True, False):
        torch.manual_seed(0)
        engine = apply_zero(GPT(cfg), group, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=20_000))
        stage_ = engine.grads.stage
        assert isinstance(stage_, StagingBuckets)
        if not as_is:
            stage_._as_is = lambda grad: False
        taken, write = [], stage_.write

        def tracking(slot, grad, write=write, stage_=stage_, taken=taken):
            write(slot, grad)
            buf = stage_.buffers.get(slot.bucket)
            taken.append((slot.name, buf is not None and buf.data_ptr() == grad.data_ptr()))

        stage_.write = tracking
        _train(engine, SyntheticTokens(cfg.vocab, cfg.seq), group, 3, 0, 2 * world)
        sole = {engine.layout.params[b.params[0]].name for b in engine.layout.buckets
                if engine.layout.sole_param(b.index) is not None}
        out[as_is] = {"sole": sole, "taken": sorted({n for n, t in taken if t}),
                      "params": {n: t.detach().cpu().numpy().copy() for n, t in full_parameters(engine).items()}}
    return out


def grad_partition_lifetime(rank, world, stage):
    """Stages 2-3: which gradient shards the engine holds through a step (after forward, as each bucket's
    reduce-scatter starts, after the step, after ``zero_grad``), and the gradients ``full_gradients``
    returns after ``zero_grad``."""
    from zerobench.zero.state_dict import full_gradients

    cfg = PRESETS["tiny"]
    group = dp_groups(rank, world, [world])[world]
    torch.manual_seed(0)
    engine = apply_zero(GPT(cfg), group, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=20_000))
    data, shards = SyntheticTokens(cfg.vocab, cfg.seq), engine.grads.local
    held_at_take, take = [], shards.take

    def counting(bucket, take=take):
        held_at_take.append(len(shards.held()))
        return take(bucket)

    shards.take = counting
    out = {"buckets": len(engine.layout.buckets), "ledger_before": engine.memory_ledger()["grads"]}
    for step in range(2):
        x, y = data.micro_batch(step, group.rank, group.size, 0, 2)
        loss = engine.module(x, y)
        out[f"after_forward_{step}"] = len(shards.held())
        held_at_take.clear()
        engine.backward(loss)
        out[f"held_at_take_{step}"] = list(held_at_take)
        engine.step()
        out[f"after_step_{step}"] = len(shards.held())
        engine.zero_grad()
        out[f"after_zero_{step}"] = len(shards.held())
    out["ledger_after"] = engine.memory_ledger()["grads"]
    out["partition_bytes"] = engine.layout.shard_numel * 4
    out["grads_after_zero"] = max(g.abs().max().item() for g in full_gradients(engine).values())
    return out
