"""The engine's step, replayed: what ``ZeroEngine`` issues on one rank, in its order, costed by a profile.

Every point where the ranks meet (a TP collective, a wait on the DP stream that blocks) pays the
profile's synchronisation penalty for the compute since they last met (their skew). Streams: ``compute`` (the model's forward and backward, TP's collectives on the critical path as in
Megatron, the engine's copies and the optimizer step) and ``dp`` (the data-parallel collectives, one at a
time in issue order, as a process group runs them). What the engine does, per stage:

- stages 0-1: gradients land in the full buffer (the window's first micro-batch copies each into its ``.grad``
  view, which ``zero_grad()`` set to None; later ones are added into it by autograd); a bucket's all-reduce (0) or reduce-scatter (1) starts
  when its last gradient lands, in bucket order, at most ``MAX_INFLIGHT`` outstanding before backward
  waits for the oldest (``GradBucketGroup``; none with ``overlap_comm`` off: backward waits for each);
  step() waits for all, steps (every element at stage 0, this rank's shard at 1), stage 1 all-gathers every
  bucket; zero_grad() sets ``.grad`` to None (no pass over the buffer);
- stages 2-3: each landed gradient is copied into its staging bucket (``add_grad``), reduce-scattered per
  bucket, every micro-batch; later micro-batches add the result into the partition; a large bucket whose
  gradients land while a collective is in flight is copied once that has finished (``StagingBuckets.hold``),
  so backward waits for it there, and so does the embedding's backward, for the tied weight's second gradient
  (``zero/grads/staging.py``);
- stage 3: each unit is gathered (one all-gather per bucket) before its forward and again before its
  backward, the next unit prefetched (``Stage3Gatherer``): the root at the start of forward and,
  unprefetched, at the start of backward;
- TP's collectives: where the profile measured a piece with them on the real groups (``IN_SITU``), the
  difference from the piece alone; else the isolated collective plus the rank-skew penalty;
- with activation checkpointing, a block's backward includes its recompute (profiled together), and
  P_a adds the all-gather of the block input before it; offload copies the gradient partition to the
  host and the updated parameters back, around the (host) step;
- on a device the host runs ahead of (a GPU profile, ``Profile.asynchronous``), a ``host`` stream issues
  the work: each compute piece costs the host its launch (``LAUNCH``) and starts on the device once issued,
  the engine's host work runs there too, and the host waits for the device where the engine synchronises
  (``step()`` reads the unused-parameter check back before it steps). A step is then device-bound or
  host-bound, whichever its pieces make it, and the critical path says which.
"""

from __future__ import annotations

from zerobench.sim.layout import Bucket, engine_buckets
from zerobench.sim.profile import IN_SITU, LAUNCH, Profile
from zerobench.sim.replay import Timeline
from zerobench.train.config import TrainConfig
from zerobench.zero.config import MAX_INFLIGHT


class StepReplay:
    """Builds the timeline of one optimizer step of ``cfg`` on a host with ``ranks`` processes."""

    def __init__(self, cfg: TrainConfig, prof: Profile, ranks: int | None = None, own_check_at_stage0: bool = False):
        self.cfg, self.prof = cfg, prof
        self.own_check = cfg.dp > 1 and (cfg.zero.stage >= 1 or own_check_at_stage0)
        """The unused-parameter agreement is an all-reduce of its own (stage 0: its flags ride in the last bucket's)."""
        self.ranks = ranks if ranks is not None else cfg.world_size
        self.threads = max(1, prof.cores // self.ranks)
        self.stage, self.dp, self.tp = cfg.zero.stage, cfg.dp, cfg.tp
        self.buckets: tuple[Bucket, ...] = engine_buckets(cfg)
        self.by_unit: dict[int, list[Bucket]] = {}
        self.by_point: dict[int, list[Bucket]] = {}
        for b in self.buckets:
            self.by_unit.setdefault(b.unit, []).append(b)
            self.by_point.setdefault(b.lands, []).append(b)
        machinery = prof.zero_machinery.at(self.stage) if prof.zero_machinery else None
        blocking = bool(machinery and machinery.blocking_reduce and self.stage >= 1)
        self.max_inflight = MAX_INFLIGHT if cfg.zero.overlap_comm and not blocking else 0
        """Reductions outstanding before backward waits for the oldest: none where the engine's ``overlap_comm`` is
        off or the program's ZeRO reduces in the compute stream's order (``ZeroMachinery.blocking_reduce``)."""
        self.elem = cfg.zero.precision.param_dtype.itemsize
        self.grad_elem = prof.grad_elem or self.elem
        """Bytes per element of a gradient reduction (the profile's program may reduce in a wider type)."""
        self.prefetch = cfg.zero.prefetch and not (machinery and machinery.sync_per_module)
        """Stage 3 gathers the next unit behind the current one's compute, unless the program waits for the device
        before every gather (``ZeroMachinery.sync_per_module``)."""
        self.regather = bool(machinery and machinery.regather_for_recompute and cfg.activation.checkpoint)
        m = cfg.model
        self.act_bytes = cfg.micro_batch * m.seq * m.hidden * self.elem
        self.shape = dict(
            b=cfg.micro_batch,
            s=m.seq,
            h=m.hidden,
            heads=m.heads,
            vocab=m.vocab,
            tp=cfg.tp,
            dtype=cfg.zero.precision.value,
            kernels=cfg.kernels,
            checkpoint=cfg.activation.checkpoint,
            ranks=self.ranks,
            threads=self.threads,
        )
        """The compute pieces' ``op_key`` fields (the configuration's, fixed for the replay)."""
        self.asynchronous = prof.asynchronous
        z = cfg.zero
        if self.asynchronous and (
            z.offload_optimizer != "none" or z.offload_param != "none" or cfg.activation.cpu_offload
        ):
            raise KeyError(
                f"the profile of {prof.device} has no host transfers and no host optimizer step: a GPU "
                f"profile does not predict offload yet (predict offload runs on a CPU profile)"
            )
        self.tl = Timeline()
        self.gathers: dict[int, int | None] = {}
        self.last_sync = 0.0

    # -- costs ---------------------------------------------------------------------------------
    def piece(self, name: str) -> float:
        return self.prof.op_time(name, **self.shape)

    def dev(self, name: str, seconds: float, category: str, deps: tuple[int | None, ...] = ()) -> int:
        """Work on the device's (compute) stream; where the host runs ahead, it starts once the host has issued it."""
        if self.asynchronous:
            deps = (*deps, self.tl.now("host"))
        return self.tl.add(name, "compute", seconds, category, deps)

    def compute(self, name: str, extra_tp_allreduces: int = 0, tp_bytes: float | None = None) -> None:
        t = self.piece(name)
        if self.asynchronous:
            launch = self.piece(name + LAUNCH) if self.prof.has_op(name + LAUNCH, **self.shape) else 0.0
            self.tl.add(f"issue {name}", "host", launch, "host")
        self.dev(name, t, "compute")
        reads = self.prof.host_reads(name, **self.shape)
        if reads:  # the program's forward reads values back on the host: the device idles for each round trip
            self.dev(f"host reads in {name}", reads, "host_sync")
        if extra_tp_allreduces and self.prof.has_op(name + IN_SITU, **self.shape):
            # measured with its TP collectives on the real groups: the difference is what they cost here
            self.dev("tp collectives, in situ", max(self.piece(name + IN_SITU) - t, 0.0), "mp_comm")
            self.last_sync = self._compute_end()
            return
        nbytes = self.act_bytes if tp_bytes is None else tp_bytes
        for _ in range(extra_tp_allreduces):
            self.skew(self.tp)
            self.dev("tp all_reduce", self.tp_collective("all_reduce", nbytes), "mp_comm")
            self.last_sync = self._compute_end()

    def engine(self, per: str) -> None:
        """The engine's own host work: ``alpha`` once per step, ``beta`` once per block (profiled per stage)."""
        lin = self.prof.linear.get(f"engine_s{self.stage}|r{self.ranks}")
        t = 0.0 if lin is None else (lin.alpha if per == "alpha" else lin.beta)
        if not t:
            return
        if self.asynchronous:  # the step's part waits for the device first (step() reads a result back)
            self.tl.add("engine host work", "host", t, "engine", (self.tl.now("compute"),) if per == "alpha" else ())
        else:
            self.tl.add("engine host work", "compute", t, "engine")

    def _compute_end(self) -> float:
        i = self.tl.now("compute")
        return self.tl.tasks[i].end if i is not None else 0.0

    def skew(self, group: int) -> None:
        """The ranks meet: pay the profile's synchronisation penalty for the compute since they last did."""
        pen = self.prof.sync_penalty(group, self.ranks, self._compute_end() - self.last_sync)
        if pen:
            self.dev("rank skew", pen, "sync")

    def wait_dp(self, deps: tuple[int | None, ...]) -> None:
        """Compute waits for DP collectives; where it blocks, the ranks have met."""
        before = self._compute_end()
        w = self.tl.wait("compute", deps)
        if self.tl.tasks[w].start > before:
            self.skew(self.dp)
            self.last_sync = self._compute_end()

    def tp_collective(self, op: str, nbytes: float) -> float:
        return self.prof.collective(op, self.tp, self.ranks, nbytes, dim="tp", tp=self.tp)

    def dp_collective(self, op: str, nbytes: float, name: str) -> int | None:
        """Issue ``op`` over the DP group on the ``dp`` stream once the compute issued so far is done; returns the
        last task it put there (the collective, or the program's copies that follow it), so waiting on it waits for
        both. NCCL's share of the SMs is charged for the collective's time only, not for those copies."""
        if self.dp == 1:  # a group of one: a copy between distinct buffers, where the engine has them, or nothing
            if (op == "reduce_scatter" and self.stage >= 2) or (op == "all_gather" and self.stage == 3):
                return self.dev(f"{name} (copy: a group of one)", self.prof.cost("copy", self.ranks, nbytes), "copy")
            return None
        t = self.prof.collective(op, self.dp, self.ranks, nbytes, dim="dp", tp=self.tp)
        idx = self.tl.add(name, "dp", t, "dp_comm", (self.tl.now("compute"),))
        if self.prof.interference and t:  # the collective runs on the compute's cores (CPU) or SMs (NCCL's blocks)
            self.dev("collective beside the compute", self.prof.interference * t, "interference")
        copies = self.prof.collective_copies(op, self.dp, nbytes, stage=self.stage)
        if copies:  # the program's own copies around it, on its stream
            idx = self.tl.add(f"{name}: copies", "dp", copies, "copy")
        return idx

    # -- stage 3 gathers -----------------------------------------------------------------------
    def gather(self, unit: int) -> None:
        if self.stage != 3 or unit in self.gathers:
            return
        last = None
        for b in self.by_unit.get(unit, ()):
            last = self.dp_collective("all_gather", b.numel * self.elem, f"gather unit {unit}")
        self.gathers[unit] = last

    def need(self, unit: int) -> None:
        self.gather(unit)
        self.wait_dp((self.gathers.get(unit),))

    # -- gradients -----------------------------------------------------------------------------
    def start_micro(self, sync: bool, first: bool) -> None:
        self.sync, self.first = sync, first
        self.pending = {b.index for b in self.buckets}
        self.next_start, self.inflight = 0, []

    def land(self, point: int) -> None:
        for b in self.by_point.get(point, ()):
            nbytes = b.param_numel * self.elem
            if self.stage >= 2 and self.sync:  # the buckets completed before this one are being reduced
                self._start_ready()
                if self.inflight and b.held_back:  # its gradients are held until those collectives end
                    self.wait_dp(tuple(self.inflight))
                    self.inflight = []
            if self.stage >= 2:  # add_grad: the gradients are copied into the staging bucket
                self.dev("staging copy", self.prof.cost("copy", self.ranks, nbytes), "copy")
            elif self.first:  # zero_grad() left .grad None: autograd's new gradient is copied into its view
                self.dev("copy into bucket", self.prof.cost("copy", self.ranks, nbytes), "copy")
            else:  # later micro-batches: .grad is the bucket's view, autograd adds into it
                self.dev("accumulate into bucket", self.prof.cost("add", self.ranks, nbytes), "copy")
            self.pending.discard(b.index)
        if self.sync:
            self._start_ready()

    def before_tied_grad(self) -> None:
        """Stages 2-3 with overlap: the embedding's backward (the tied weight's second gradient) waits for the
        collectives in flight when that weight's bucket is held back (``zero/grads/staging.py``)."""
        if (
            self.stage >= 2
            and self.sync
            and self.max_inflight
            and self.inflight
            and any(b.tied and b.held_back for b in self.buckets)
        ):
            self.wait_dp(tuple(self.inflight))
            self.inflight = []

    def _start_ready(self) -> None:
        while self.next_start < len(self.buckets) and self.next_start not in self.pending:
            self._reduce(self.buckets[self.next_start])
            self.next_start += 1

    def _reduce(self, b: Bucket) -> None:
        op = "all_reduce" if self.stage == 0 else "reduce_scatter"
        if self.grad_elem != self.elem and self.dp > 1:
            # A program reducing in a wider type casts the gradients first, on the stream that then reduces them
            # (FSDP's post-backward stream): elem bytes read and grad_elem written per element, a copy's cost
            # being 2 x its bytes. It delays the reduction, not the compute.
            cast = self.prof.cost("copy", self.ranks, b.numel * (self.elem + self.grad_elem) / 2)
            self.tl.add(f"cast bucket {b.index}", "dp", cast, "copy", (self.tl.now("compute"),))
        self.inflight.append(self.dp_collective(op, b.numel * self.grad_elem, f"reduce bucket {b.index}"))
        if self.stage == 3:
            self.gathers.pop(b.unit, None)  # freed once handed over: the next use gathers again
        if len(self.inflight) > self.max_inflight:
            self.wait_dp((self.inflight.pop(0),))

    def end_backward(self) -> None:
        if not self.sync:
            return
        if self.own_check:  # the unused-parameter agreement, behind the last bucket
            self.dp_collective("all_reduce", 4, "unused check")
        self.wait_dp((self.tl.now("dp"),))
        if self.stage >= 2 and not self.first:  # later micro-batches add into the partition
            n = sum(b.shard_numel for b in self.buckets)
            self.dev("accumulate", self.prof.cost("copy", self.ranks, n * self.elem), "copy")
