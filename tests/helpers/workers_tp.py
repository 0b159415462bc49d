"""Workers (run inside spawned ranks) about tensor parallelism: ZeRO-R activation ledgers, equivalence of
the TP layers with megatron-core, the TP RNG and dropout."""

from __future__ import annotations

import torch

from zerobench.models.gpt import GPT
from zerobench.models.sizes import PRESETS
from zerobench.train.data import SyntheticTokens
from zerobench.zero import ZeroConfig


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
    mcfg = ModelParallelConfig(
        tensor_model_parallel_size=world,
        use_cpu_initialization=True,
        params_dtype=torch.float32,
        perform_initialization=True,
    )
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
    theirs = mtp.RowParallelLinear(
        f, h, config=mcfg, init_method=init, bias=True, input_is_parallel=True, skip_bias_add=False
    )
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
    from zerobench.zero.state.shards import full_gradients

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
        spec = ParallelSpec(
            zero=ZeroConfig(stage=0), kernels="reference", activation=ActivationConfig(checkpoint=ckpt), seed=11
        )
        engine = parallelize(model, mesh, spec).engine
        if not ckpt:
            model.blocks[-1].register_forward_hook(lambda m, a, o: block_out.append(o.detach().clone()))
        torch.manual_seed(123)  # same default-RNG stream for both runs
        x, y = data.micro_batch(0, 0, 1, 0, 2)
        engine.backward(model(x, y))
        grads[ckpt] = full_gradients(engine)
    return {
        "outside": outside.tolist(),
        "inside": inside.tolist(),
        "after": after.tolist(),
        "block_out_sum": block_out[0].double().sum().item(),
        "ckpt_vs_plain": max((grads[True][n] - grads[False][n]).abs().max().item() for n in grads[True]),
        "grad_norm": sum(g.pow(2).sum().item() for g in grads[False].values()),
    }
