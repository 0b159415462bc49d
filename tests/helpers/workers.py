"""Rank-side functions for the ledger, DDP and checkpoint tests (run through ``run_distributed``)."""

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


def zero_r_ledgers(rank, world):
    """Checkpoint bytes and MP / P_a volumes for TP 2 and 4 with checkpointing, P_a, P_a+cpu, M_D."""
    from zerobench.distributed.mesh import build_mesh
    from zerobench.metrics.comm import CommLedger
    from zerobench.parallel.checkpointing import ActivationConfig
    from zerobench.parallel.parallelize import ParallelSpec, parallelize

    cfg = PRESETS["tiny"]
    data = SyntheticTokens(cfg.vocab, cfg.seq)
    variants = {
        "ckpt": ActivationConfig(checkpoint=True),
        "pa": ActivationConfig(checkpoint=True, partition=True),
        "pa_cpu": ActivationConfig(checkpoint=True, partition=True, cpu_offload=True),
        "pa_md": ActivationConfig(checkpoint=True, partition=True, contiguous=True),
    }
    out = {}
    b = 2
    for tp in (2, 4):
        mesh = build_mesh(tp, world // tp)
        for name, ac in variants.items():
            torch.manual_seed(0)
            ledger = CommLedger()
            model = GPT(cfg)
            spec = ParallelSpec(zero=ZeroConfig(stage=2), kernels="reference", activation=ac)
            built = parallelize(model, mesh, spec, ledger)
            store, engine = built.store, built.engine
            x, y = data.micro_batch(0, mesh.dp_rank, mesh.dp.size, 0, b)
            engine.backward(engine.module(x, y))
            engine.step()
            out[(tp, name)] = {
                "ckpt": dict(store.peak),
                "expected_full": cfg.layers * b * cfg.seq * cfg.hidden * 4,
                "mp": ledger.volume_elements(group="tp", tag="mp"),
                "pa": ledger.volume_elements(group="tp", tag="pa"),
                "layers": cfg.layers,
                "bsh": b * cfg.seq * cfg.hidden,
            }
    return out


def megatron_layer_equivalence(rank, world):
    """zerobench's TP layers and vocab-parallel CE vs megatron-core's (unpatched), same weights/inputs."""
    from megatron.core import parallel_state as ps
    from megatron.core import tensor_parallel as mtp
    from megatron.core.model_parallel_config import ModelParallelConfig
    from torch import nn

    from zerobench.distributed.collectives import Group
    from zerobench.parallel.cross_entropy import vocab_parallel_cross_entropy
    from zerobench.parallel.layers import ColumnParallelLinear, RowParallelLinear, VocabParallelEmbedding

    ps.initialize_model_parallel(tensor_model_parallel_size=world)
    pg = ps.get_tensor_model_parallel_group()
    group = Group.of(pg, "tp")
    mcfg = ModelParallelConfig(tensor_model_parallel_size=world, use_cpu_initialization=True,
                               params_dtype=torch.float32, perform_initialization=True)
    init = nn.init.zeros_
    torch.manual_seed(0)
    h, f, V, n = 16, 32, 64, 6
    diffs = {}

    def compare(name, ours, theirs, x, their_out=lambda o: o[0] if isinstance(o, tuple) else o):
        xa = x.clone().requires_grad_(True)
        xb = x.clone().requires_grad_(True)
        ya, yb = ours(xa), their_out(theirs(xb))
        gy = torch.randn_like(ya)
        ya.backward(gy)
        yb.backward(gy)
        d = [(ya - yb).abs().max().item()]
        if xa.grad is not None:
            d.append((xa.grad - xb.grad).abs().max().item())
        for (_, pa), (_, pb) in zip(ours.named_parameters(), theirs.named_parameters()):
            d.append((pa.grad - pb.grad).abs().max().item())
        diffs[name] = max(d)

    full = nn.Linear(h, f)
    ours = ColumnParallelLinear(full, group)
    theirs = mtp.ColumnParallelLinear(h, f, config=mcfg, init_method=init, bias=True, gather_output=False)
    with torch.no_grad():
        theirs.weight.copy_(ours.weight)
        theirs.bias.copy_(ours.bias)
    compare("column", ours, theirs, torch.randn(n, h))

    full = nn.Linear(f, h)
    ours = RowParallelLinear(full, group)
    theirs = mtp.RowParallelLinear(f, h, config=mcfg, init_method=init, bias=True, input_is_parallel=True,
                                   skip_bias_add=False)
    with torch.no_grad():
        theirs.weight.copy_(ours.weight)
        theirs.bias.copy_(ours.bias)
    compare("row", ours, theirs, torch.randn(n, f // world))

    emb = nn.Embedding(V, h)
    ours = VocabParallelEmbedding(emb, group)
    theirs = mtp.VocabParallelEmbedding(V, h, init_method=init, config=mcfg)
    with torch.no_grad():
        theirs.weight.copy_(ours.weight)
    tokens = torch.randint(0, V, (n,))
    ya, yb = ours(tokens), theirs(tokens)
    gy = torch.randn_like(ya)
    ya.backward(gy)
    yb.backward(gy)
    diffs["embedding"] = max((ya - yb).abs().max().item(), (ours.weight.grad - theirs.weight.grad).abs().max().item())

    logits = torch.randn(n, V // world)
    target = torch.randint(0, V, (n,))
    la, lb = logits.clone().requires_grad_(True), logits.clone().requires_grad_(True)
    a = vocab_parallel_cross_entropy(la, target, group)
    b = mtp.vocab_parallel_cross_entropy(lb, target)
    g = torch.randn(n)
    a.backward(g)
    b.backward(g)
    diffs["cross_entropy"] = max((a - b).abs().max().item(), (la.grad - lb.grad).abs().max().item())
    ps.destroy_model_parallel()
    return diffs


def tp_rng_and_dropout(rank, world):
    """TP RNG semantics, replicated activations agreeing across TP ranks with dropout, exact recompute."""
    import dataclasses

    from zerobench.distributed.mesh import build_mesh
    from zerobench.parallel.checkpointing import ActivationConfig
    from zerobench.parallel.parallelize import ParallelSpec, parallelize
    from zerobench.parallel.random import TPRngTracker
    from zerobench.zero.state_dict import full_gradients

    mesh = build_mesh(world, 1)
    torch.manual_seed(5)
    tracker = TPRngTracker(5, mesh.tp_rank, torch.device("cpu"))
    outside = torch.rand(4)
    with tracker.fork():
        inside = torch.rand(4)
    after = torch.rand(4)

    cfg = dataclasses.replace(PRESETS["tiny"], dropout=0.2)
    data = SyntheticTokens(cfg.vocab, cfg.seq)
    grads, block_out = {}, []
    for ckpt in (False, True):
        torch.manual_seed(0)
        model = GPT(cfg)
        spec = ParallelSpec(zero=ZeroConfig(stage=0), kernels="reference",
                            activation=ActivationConfig(checkpoint=ckpt), seed=11)
        engine = parallelize(model, mesh, spec).engine
        if not ckpt:
            model.blocks[-1].register_forward_hook(lambda m, a, o: block_out.append(o.detach().clone()))
        torch.manual_seed(123)  # same default-RNG stream for both runs
        x, y = data.micro_batch(0, 0, 1, 0, 2)
        engine.backward(model(x, y))
        grads[ckpt] = full_gradients(engine)
    return {
        "outside": outside.tolist(), "inside": inside.tolist(), "after": after.tolist(),
        "block_out_sum": block_out[0].double().sum().item(),
        "ckpt_vs_plain": max((grads[True][n] - grads[False][n]).abs().max().item() for n in grads[True]),
        "grad_norm": sum(g.pow(2).sum().item() for g in grads[False].values()),
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
            "host_analytic": engine.host_state_bytes_analytic() if engine.host is not None else {},
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
