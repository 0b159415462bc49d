"""``simulate(cfg, profile)``: one training step of the engine replayed on a device profile.

Drives ``StepReplay`` through the micro-batches' forward and backward and the optimizer step in the
engine's order (see ``zerobench.sim.schedule``), and reports the predicted step time, its critical path
by category (compute, exposed DP communication, MP communication, rank skew at synchronisations, the
engine's host work, copies, optimizer, offload, NCCL's share of the SMs, a stated program's loop metrics and
the host reads of its own optimizer step, ``host_sync``) and the throughput it implies, in both FLOP
conventions (model FLOPs, and hardware FLOPs with the recompute), with the replayed ``Timeline`` itself.
"""

from __future__ import annotations

from zerobench.models.sizes import flops_per_token
from zerobench.parallel.config import COMPILED
from zerobench.sim.layout import HEAD
from zerobench.sim.profile import LOOP_METRICS, Profile
from zerobench.sim.schedule import StepReplay
from zerobench.train.config import TrainConfig


def _forward(r: StepReplay) -> None:
    L, tp, pre = r.cfg.model.layers, r.tp > 1, r.prefetch
    r.need(0)
    if pre:
        r.gather(1)
    r.compute("embed_fwd", 1 if tp else 0)
    for i in range(L):
        r.need(i + 1)
        if pre and i + 1 < L:
            r.gather(i + 2)
        r.compute("block_fwd", 2 if tp else 0)
        if r.cfg.activation.cpu_offload:  # P_a+cpu: the block's (partitioned) checkpoint goes to the host
            r.dev("checkpoint to host", r.prof.transfer(r.ranks, r.act_bytes / r.tp), "offload")
        r.gathers.pop(i + 1, None)  # stage 3 frees a block after its forward
    r.compute("head_fwd", 3 if tp else 0, tp_bytes=r.cfg.micro_batch * r.cfg.model.seq * 4)
    r.gathers.pop(0, None)


def _backward(r: StepReplay) -> None:
    c = r.cfg
    L, tp, pre, ckpt = c.model.layers, r.tp > 1, r.prefetch, c.activation.checkpoint
    r.need(0)
    if pre:
        r.gather(L)
    r.compute("head_bwd", 1 if tp else 0)
    r.land(HEAD)
    for i in reversed(range(L)):
        if r.regather:  # the recompute's forward gathered the block and released it: backward gathers it again
            r.need(i + 1)
            r.gathers.pop(i + 1, None)
        r.need(i + 1)
        if pre and i >= 1:
            r.gather(i)
        if ckpt and c.activation.cpu_offload:
            r.dev("checkpoint from host", r.prof.transfer(r.ranks, r.act_bytes / r.tp), "offload")
        if tp and ckpt and c.activation.partition:
            r.skew(r.tp)
            t = r.tp_collective("all_gather", r.act_bytes)
            r.dev("P_a all_gather", t, "mp_comm")
            r.last_sync = r._compute_end()
        r.compute("block_bwd", ((4 if ckpt else 2) if tp else 0))
        r.engine("beta")
        r.land(i)
    r.before_tied_grad()
    r.compute("embed_bwd")
    r.land(L)
    r.end_backward()
    if r.prof.has_op(LOOP_METRICS, **r.shape):  # the loop's metrics on the logits, once the backward has finished
        r.dev("train metrics", r.piece(LOOP_METRICS), "metrics")


def _step(r: StepReplay) -> None:
    r.engine("alpha")
    n_local = sum(b.shard_numel for b in r.buckets)
    offload = r.cfg.zero.offload_optimizer != "none"
    if offload:  # the gradient partition goes to the host, the updated parameters come back
        r.dev("grads to host", r.prof.transfer(r.ranks, n_local * r.elem), "offload")
    loop = None
    if r.stage == 0:  # without ZeRO the program steps with its own optimizer
        loop = r.prof.step_loop(tuple(x for b in r.buckets for x in b.param_sizes), r.tp, r.ranks)
    if loop is None:
        r.dev("optimizer step", r.prof.cost("adamw", r.ranks, n_local), "optimizer")
    else:  # the program's own step, tensor by tensor (with ZeRO, the engine's optimizer steps instead)
        kernels, reads, flags = loop
        r.dev("optimizer step, tensor by tensor", kernels, "optimizer")
        r.dev("host reads in the optimizer step", reads, "host_sync")
        if flags:
            r.dev("the optimizer step's TP all-reduces", flags, "mp_comm")
    if offload:
        r.dev("params to device", r.prof.transfer(r.ranks, n_local * r.elem), "offload")
    if r.stage in (1, 2) and r.dp > 1:
        for b in r.buckets:
            r.dp_collective("all_gather", b.numel * r.elem, f"publish bucket {b.index}")
        r.wait_dp((r.tl.now("dp"),))
    # zero_grad() costs nothing to replay: stages 0-1 set .grad to None, stages 2-3 drop the partition


def undescribed(cfg: TrainConfig) -> list[str]:
    """What of ``cfg`` the replay has no costs for: a prediction would leave it out, the same to the microsecond
    with or without it (measured on CPU: 8-bit moments 3.6x the step, NVMe 8% more)."""
    z = cfg.zero
    return [
        what
        for what, used in (
            ("sequence parallelism", cfg.sequence_parallel and cfg.tp > 1),
            ("8-bit optimizer states", z.optim_bits != 32),
            ("parameter offload", z.offload_param != "none"),
            ("NVMe offload", z.offload_optimizer == "nvme"),
            ("compiled blocks (--kernels compiled: the profile times eager ones)", cfg.kernels == COMPILED),
        )
        if used
    ]


def simulate(cfg: TrainConfig, prof: Profile, ranks: int | None = None, own_check_at_stage0: bool = False) -> dict:
    """Predicted step of ``cfg`` on ``prof``'s device (``ranks``: processes sharing the host; default the
    configuration's world size, as local runs place them). ``own_check_at_stage0``: replay the engine from before
    stage 0's unused-parameter flags rode in its last gradient all-reduce (a run recorded then, ``validate.py``).
    Raises ``ValueError`` for a configuration the replay does not describe (``undescribed``)."""
    missing = undescribed(cfg)
    if missing:
        raise ValueError(
            f"the simulator does not describe {', '.join(missing)}: it would predict the step without them"
        )
    r = StepReplay(cfg, prof, ranks, own_check_at_stage0)
    accum = cfg.zero.grad_accum_steps
    for micro in range(accum):
        r.start_micro(sync=micro == accum - 1 or r.stage >= 2, first=micro == 0)
        _forward(r)
        _backward(r)
    _step(r)
    step = r.tl.makespan
    tokens = cfg.micro_batch * accum * cfg.model.seq / cfg.tp
    model_fpt = flops_per_token(cfg.model)
    hw_fpt = flops_per_token(cfg.model, recompute=cfg.activation.checkpoint)
    return {
        "step_time_s": step,
        "breakdown_s": r.tl.breakdown(),
        "busy_s": {s: r.tl.busy(s) for s in ("compute", "dp")},
        "tflops_per_gpu": model_fpt * tokens / step / 1e12,
        "hw_tflops_per_gpu": hw_fpt * tokens / step / 1e12,
        "pflops_aggregate": model_fpt * tokens / step / 1e12 * cfg.world_size / 1e3,
        "hw_pflops_aggregate": hw_fpt * tokens / step / 1e12 * cfg.world_size / 1e3,
        "timeline": r.tl,
    }


def interval(
    cfg: TrainConfig, prof: Profile, bounds: tuple[Profile, Profile] | None = None, **kw
) -> tuple[float, float]:
    """The predicted step of ``cfg`` with every profile entry at the low end of its spread and at the high end
    (``Profile.bound``): the prediction's interval as far as the profile's own noise goes. ``bounds``: the two
    bound profiles, where the caller replays many configurations on one profile; ``kw``: as ``simulate``."""
    low, high = bounds if bounds is not None else (prof.bound(-1), prof.bound(+1))
    return simulate(cfg, low, **kw)["step_time_s"], simulate(cfg, high, **kw)["step_time_s"]
