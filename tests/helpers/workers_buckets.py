"""Workers (run inside spawned ranks) about the engine's gradient buckets: stage 3 bucket sizes, stage
0-1 gradients as bucket views, one-parameter buckets reduced from the gradient, and how long the stage 2-3
gradient partition is held."""

from __future__ import annotations

import dataclasses

import torch

from tests.helpers.scenarios import ADAM, dp_groups
from tests.helpers.workers_engine import _train
from zerobench.models.gpt import GPT
from zerobench.models.sizes import PRESETS
from zerobench.train.data import SyntheticTokens
from zerobench.zero import ZeroConfig, apply_zero
from zerobench.zero.state.shards import full_parameters


def stage3_bucket_sizes(rank, world, bucket_numels):
    """Stage 3 at DP ``world`` with each bucket size: buckets per unit, the most staging bytes held at once
    during backward, reduce-scatter calls and volume, the trained full parameters, and for every bucket staged
    (``StagingBuckets.pop``) its unit, that unit's bucket count and state then."""
    from zerobench.zero.grads.buckets import GradBucketGroup
    from zerobench.zero.grads.staging import StagingBuckets

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
            peak[0] = max(peak[0], sum(t.numel() for t in self.staging_buffers.values()))

        engine.grads.add_grad = tracking.__get__(engine.grads)
        units = engine.gatherer.units
        staged: list[tuple[int, int, str]] = []

        def popping(
            bucket, stage=engine.grads.staging, by_bucket=engine.gatherer.by_bucket, staged=staged, units=units
        ):
            unit = by_bucket[bucket]
            staged.append((units.index(unit), len(unit.buckets), unit.state.value))
            return StagingBuckets.pop(stage, bucket)

        engine.grads.staging.pop = popping
        engine.ledger.reset()
        _train(engine, SyntheticTokens(cfg.vocab, cfg.seq), group, 2, 0, 2 * world)
        rs = [r for r in engine.ledger.summary() if r["op"] == "reduce_scatter"]
        out[numel] = {
            "buckets_per_unit": [len(u.buckets) for u in units],
            "root_bucket": max(b.numel for b in engine.layout.buckets if b.unit == 0),
            "block_bucket": max(b.numel for b in engine.layout.buckets if b.unit != 0),
            "peak_staging": peak[0],
            "rs_calls": sum(r["calls"] for r in rs),
            "rs_volume": sum(r["volume_elements"] for r in rs),
            "staged": staged,
            "deferred": sorted(engine.grads.staging.deferred),
            "unit_ends": sorted({b.unit: b.index for b in engine.layout.buckets}.values()),  # each unit's last
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
        out[reset] = {
            "views": views,
            "params": {n: p.detach().numpy().copy() for n, p in engine.module.named_parameters()},
        }
    return out


def sole_buckets(rank, world, stage):
    """Stages 2-3: a bucket that is one parameter exactly (the tied embedding) is reduced from the gradient
    itself, never copied into a staging bucket; trained with and without that, the parameters are equal."""
    from zerobench.zero.grads.staging import StagingBuckets

    cfg = PRESETS["tiny"]
    group = dp_groups(rank, world, [world])[world]
    out = {}
    for as_is in (True, False):
        torch.manual_seed(0)
        engine = apply_zero(GPT(cfg), group, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=20_000))
        stage_ = engine.grads.staging
        assert isinstance(stage_, StagingBuckets)
        if not as_is:
            stage_._as_is = lambda grad: False
        taken, write = [], stage_.write

        def tracking(slot, grad, scale=None, write=write, stage_=stage_, taken=taken):
            write(slot, grad, scale)
            buf = stage_.buffers.get(slot.bucket)
            taken.append((slot.name, buf is not None and buf.data_ptr() == grad.data_ptr()))

        stage_.write = tracking
        _train(engine, SyntheticTokens(cfg.vocab, cfg.seq), group, 3, 0, 2 * world)
        sole = {
            engine.layout.params[b.params[0]].name
            for b in engine.layout.buckets
            if engine.layout.sole_param(b.index) is not None
        }
        out[as_is] = {
            "sole": sole,
            "taken": sorted({n for n, t in taken if t}),
            "params": {n: t.detach().cpu().numpy().copy() for n, t in full_parameters(engine).items()},
        }
    return out


def grad_partition_lifetime(rank, world, stage):
    """Stages 2-3: which gradient shards the engine holds through a step (after forward, as each bucket's
    reduce-scatter starts, after the step, after ``zero_grad``), and the gradients ``full_gradients``
    returns after ``zero_grad``."""
    from zerobench.zero.state.shards import full_gradients

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
    out = {"buckets": len(engine.layout.buckets), "ledger_before": engine.accounting.memory_ledger()["grads"]}
    for step in range(2):
        x, y = data.micro_batch(step, group.rank, group.size, 0, 2)
        loss = engine.module(x, y)
        out[f"after_forward_{step}"] = len(shards.held())
        held_at_take.clear()
        engine.backward(loss)
        out[f"held_at_take_{step}"] = list(held_at_take)
        engine.optimizer.step()  # torch's step: the gradients stay until zero_grad() (engine.step() zeroes them)
        out[f"after_step_{step}"] = len(shards.held())
        engine.zero_grad()
        out[f"after_zero_{step}"] = len(shards.held())
    out["ledger_after"] = engine.accounting.memory_ledger()["grads"]
    out["partition_bytes"] = engine.layout.shard_numel * 4
    out["grads_after_zero"] = max(g.abs().max().item() for g in full_gradients(engine).values())
    return out


def _train_on_a_slow_network(engine, cfg, group, world) -> int:
    """Three steps with every async collective never seen complete before it is waited for; the peak live bytes."""
    from zerobench.distributed import collectives as C
    from zerobench.metrics.memory import LiveTensorTracker

    originals = {name: getattr(C, name) for name in ("all_reduce", "reduce_scatter")}
    for name, fn in originals.items():
        setattr(C, name, lambda *a, fn=fn, **k: _NeverSeenDone(fn(*a, **k)) if k.get("async_op") else fn(*a, **k))
    try:
        with LiveTensorTracker() as tracker:
            _train(engine, SyntheticTokens(cfg.vocab, cfg.seq), group, 3, 0, 2 * world)
    finally:
        for name, fn in originals.items():
            setattr(C, name, fn)
    return tracker.peak


class _NeverSeenDone:
    """A collective's work that never reports itself complete until waited for (a slow network)."""

    def __init__(self, work):
        self.work = work

    def is_completed(self) -> bool:
        return False

    def wait(self):
        return self.work.wait()


def overlap_comm(rank, world, stage):
    """With ``overlap_comm`` on and off, and collectives never seen complete before they are waited for:
    the most bucket collectives outstanding once backward goes on after starting one, how often a large staging
    buffer was allocated while another bucket was reduced and the most gradients held back at once (stages
    2-3), the peak live bytes of training
    (``LiveTensorTracker``), and the trained full parameters."""
    from zerobench.zero.grads.buckets import GradBucketGroup

    # Small vocabulary and sequence: the blocks' gradient buckets, not the embedding or activations, set the peak.
    cfg = dataclasses.replace(PRESETS["tiny"], layers=3, vocab=64, seq=16)
    group = dp_groups(rank, world, [world])[world]
    start = GradBucketGroup._start_reduce
    out = {}
    for overlap in (True, False):
        torch.manual_seed(0)
        engine = apply_zero(
            GPT(cfg), group, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=20_000, overlap_comm=overlap)
        )
        grads, seen = engine.grads, {"outstanding": 0, "staged_beside": 0, "held": 0}
        write = grads.staging.write

        def starting(bucket, grads=grads, seen=seen):
            start(grads, bucket)
            seen["outstanding"] = max(seen["outstanding"], len(grads.inflight))

        def writing(slot, grad, scale=None, grads=grads, seen=seen, write=write):
            if grads.inflight and grads.staging.large[slot.bucket] and slot.bucket not in grads.staging_buffers:
                seen["staged_beside"] += 1  # a large staging buffer allocated while another is being reduced
            write(slot, grad, scale)

        def holding(slot, grad, scale=None, grads=grads, seen=seen, hold=grads.staging.hold):
            hold(slot, grad, scale)
            seen["held"] = max(seen["held"], len(grads.staging.held_tensors()))

        grads._start_reduce, grads.staging.write, grads.staging.hold = starting, writing, holding
        peak = _train_on_a_slow_network(engine, cfg, group, world)
        out[overlap] = {
            **seen,
            "peak": peak,
            "buckets": len(engine.layout.buckets),
            "largest_bytes": 4 * max(b.numel for b in engine.layout.buckets),
            "params": {n: t.detach().cpu().numpy().copy() for n, t in full_parameters(engine).items()},
        }
    return out


def tied_wait(rank, world, stage):
    """Stages 2-3, ``overlap_comm`` on, collectives never seen complete before they are waited for, a GPT whose
    tied embedding is its own bucket and the largest tensor: trained with the wait before the tied parameter's
    second gradient (``zero/grads/staging.py``) and without it (the hooks not installed), how many collectives were in
    flight as the token lookup's backward began, the peak live bytes, and the trained full parameters."""
    from zerobench.zero.grads import backward as backward_pass

    cfg = dataclasses.replace(PRESETS["tiny"], layers=3, vocab=16384, seq=16)
    group = dp_groups(rank, world, [world])[world]
    installed = backward_pass.wait_before_tied_grads
    out = {}
    for wait in (True, False):
        torch.manual_seed(0)
        if not wait:
            backward_pass.wait_before_tied_grads = lambda *a: []
        try:
            engine = apply_zero(GPT(cfg), group, ZeroConfig(stage=stage, optimizer=ADAM, bucket_numel=60_000))
        finally:
            backward_pass.wait_before_tied_grads = installed
        inflight: list[int] = []

        def record(module, args, output, grads=engine.grads, inflight=inflight):  # after the engine's own hook
            output.register_hook(lambda g: inflight.append(len(grads.inflight)))

        engine.module.wte.register_forward_hook(record)
        peak = _train_on_a_slow_network(engine, cfg, group, world)
        sole = [
            engine.layout.params[b.params[0]].name
            for b in engine.layout.buckets
            if engine.layout.sole_param(b.index) is not None
        ]
        out[wait] = {
            "inflight": inflight,
            "peak": peak,
            "sole": sole,
            "params": {n: t.detach().cpu().numpy().copy() for n, t in full_parameters(engine).items()},
        }
    return out
