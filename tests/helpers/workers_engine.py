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
from zerobench.zero.state.checkpoint import consolidate, load_sharded, save_sharded
from zerobench.zero.state.shards import full_parameters


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
                    "ledger": engine.accounting.memory_ledger(),
                    "model_state_bytes": engine.accounting.model_state_bytes(),
                    "analytic": engine.accounting.model_state_bytes_analytic(),
                    "volume": engine.ledger.volume_elements(group="dp"),
                    "summary": engine.ledger.summary(),
                    "psi": num_params(cfg),
                    "flat_numel": engine.layout.numel,
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
    save_sharded(a, ckpt_dir)
    at_save = full_parameters(a)
    dist.barrier()
    _train(a, data, groups[4], 2, 2, 8)
    uninterrupted = full_parameters(a)

    torch.manual_seed(1)  # a different init: everything must come from the checkpoint
    bg = groups[4] if same else groups[2]
    b = apply_zero(
        GPT(cfg), bg, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=20_000 if same else 7_000, **extra)
    )
    load_sharded(b, ckpt_dir)
    step_after_load = b.adamw.step_count
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
        engine = apply_zero(
            GPT(cfg),
            group,
            ZeroConfig(
                stage=2 if world > 1 else 0,
                optimizer=ADAM,
                optim_bits=bits,
                offload_optimizer=offload if world > 1 else "none",
            ),
        )
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
        out[bits] = {"losses": losses, "ledger": engine.accounting.memory_ledger(), "numel": engine.numel}
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
            "ledger": engine.accounting.memory_ledger(),
            "analytic": engine.accounting.model_state_bytes_analytic(),
            "host_analytic": engine.accounting.host_state_bytes_analytic() if engine.placement.offloaded else {},
            "device": engine.accounting.model_state_bytes(),
            "host": engine.accounting.host_model_state_bytes(),
        }
        if engine.gatherer is not None:
            units = engine.gatherer.order
            m["peak_gathered"] = engine.gatherer.peak_gathered_bytes
            m["root_bytes"] = units[0].nbytes
            m["largest_block_bytes"] = max(u.nbytes for u in units[1:])
        out[key] = m
    return {"psi": num_params(cfg), "configs": out, "storage_bytes_ok": storage_bytes([]) == 0}


def accumulated_volume(rank, world, accum):
    """The data-parallel volume (elements) of one optimizer step of ``accum`` micro-batches at stages 0-3, with the
    engine's flat numel, on the tiny GPT."""
    cfg = PRESETS["tiny"]
    group = dp_groups(rank, world, [world])[world]
    out = {}
    for stage in (0, 1, 2, 3):
        torch.manual_seed(0)
        engine = apply_zero(GPT(cfg), group, ZeroConfig(stage=stage, grad_accum_steps=accum, bucket_numel=30_000))
        data = SyntheticTokens(cfg.vocab, cfg.seq)
        for micro in range(accum):
            x, y = data.micro_batch(0, group.rank, group.size, micro, 2)
            engine.backward(engine.module(x, y))
        engine.step()
        engine.zero_grad()
        out[stage] = {"volume": engine.ledger.volume_elements(group="dp"), "numel": engine.layout.numel}
        engine.destroy()
    return out
