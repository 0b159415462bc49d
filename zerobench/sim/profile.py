"""A device profile: what the pieces of a training step cost on one kind of hardware, as data.

Measured by ``zerobench profile`` on the device at hand (``zerobench.sim.measure``) or stated for hardware
we cannot run (``zerobench.sim.stated``). Three kinds of entry:

- ``ops``: seconds of one compute op at one exact shape (``op_key``): a block's forward, its backward
  (with the recompute when checkpointing), the embedding's and the head's (LM head + loss) forward and
  backward — measured with every rank of the configuration running at once on the host, so cores and
  memory bandwidth are what the run sees (with more ranks than cores, read as the one-rank-per-core piece times
  the share: ``Profile.time_shared``); a TP shape's pieces also with their TP
  collectives on the real groups (``IN_SITU``), what those collectives cost on the critical path;
- ``curves``: seconds of a collective as a function of its bytes, per (op, group size, processes on the
  host), interpolated piecewise-linearly in log-log between measured sizes and extrapolated at the
  largest measured bandwidth above them; where one collective is built from another over the same bytes
  (on gloo zerobench's reduce-scatter is an all-reduce, ``composed``), the two curves time one operation
  twice and are read as one measurement, their pointwise mean;
- ``linear``: α + β·n costs of the engine's own per-element work: the optimizer step per partition
  element, a copy, an add and a memset per byte, per (name, processes on the host); and the
  synchronisation penalty per group size (α + β·T for T seconds of compute since the ranks last met).

A measured entry carries its *spread* (``Profile.spread``): the half-range of the replicates it was taken
from, relative to its value (``zerobench.sim.replicates``). ``Profile.bound`` moves every entry to one end of
its spread, and the replay on both ends is a prediction's interval (``simulate.interval``).

Profiles are saved as result rows (kind ``profile``: one row per entry) and read back from them.
"""

from __future__ import annotations

import dataclasses
import statistics
from dataclasses import dataclass, field

from zerobench.sim.costs import Curve, Linear

IN_SITU = "+tp"
"""Suffix of a compute piece measured with its TP collectives on the real groups (``measure_units``' ``insitu``)."""
LAUNCH = "@launch"
"""Suffix of a compute piece's host cost to issue it, on a device the host runs ahead of (a GPU)."""
LOOP_METRICS = "train_metrics"
"""The piece a training loop's own metrics cost after each micro-batch's backward, where a profile has it
(``has_op``): zerobench's loop computes none, so only a stated program's profile does."""


def op_key(
    op: str,
    *,
    b: int,
    s: int,
    h: int,
    heads: int,
    vocab: int,
    tp: int,
    dtype: str,
    kernels: str,
    checkpoint: bool,
    ranks: int,
    threads: int,
) -> str:
    """The cache key of a compute op: everything its cost depends on."""
    return f"{op}|b{b}|s{s}|h{h}|a{heads}|v{vocab}|tp{tp}|{dtype}|{kernels}|ckpt{int(checkpoint)}|r{ranks}|t{threads}"


def curve_key(op: str, group: int, ranks: int) -> str:
    """A collective over groups of ``group`` processes, ``ranks`` processes on the host in all."""
    return f"{op}|g{group}|r{ranks}"


def point_key(key: str, nbytes: float) -> str:
    """The entry id of one measured point of curve ``key`` (its spread's key in ``Profile.spread``)."""
    return f"{key}@{int(nbytes)}"


def moved_bytes(nbytes: int, group: int) -> float:
    """Bytes a collective timed at about ``nbytes`` over ``group`` ranks moves: whole fp32 elements, as many per
    rank (the profiler's rounding)."""
    return 4.0 * (-(-nbytes // (4 * group)) * group)


@dataclass
class Profile:
    """Costs on one device (see the module docstring)."""

    device: str
    """What it was measured on (or stated for), e.g. ``cpu: AMD EPYC ... (2 cores)``."""
    cores: int = 1
    """Cores the host has (CPU profiles; the threads per rank follow from it)."""
    ops: dict[str, float] = field(default_factory=dict)
    """``op_key`` -> seconds."""
    curves: dict[str, Curve] = field(default_factory=dict)
    """``curve_key`` -> seconds against bytes."""
    linear: dict[str, Linear] = field(default_factory=dict)
    """``name|r{ranks}`` -> α + β·n (``adamw`` per element, ``copy`` and ``memset`` per byte)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Where a stated figure comes from, per entry name."""
    composed: dict[str, str] = field(default_factory=dict)
    """``curve_key`` of a collective that runs as another over the same bytes -> that one's key. On gloo
    zerobench's reduce-scatter is an all-reduce of the whole tensor that keeps this rank's chunk
    (``collectives.reduce_scatter``); the profiler times both, and each of them alone carries the host's
    noise (on a 2-core Xeon VM, over three profiles, a 1 MiB all-reduce took 2.4 ms in one curve and 1.5 ms
    in the other). ``collective`` reads such a pair as one measurement: their pointwise mean."""
    memory: dict[str, float] = field(default_factory=dict)
    """``op_key`` of ``activations`` / ``step_peak`` -> bytes a step of that shape holds beyond its
    parameters (``measure_compute.step_memory``; GPU profiles)."""
    interference: float = 0.0
    """Fraction of a data-parallel collective's time that also delays the compute running beside it. On a CPU
    host gloo's threads share the cores the ranks compute on: a measured profile's one fitted factor, fitted on
    non-ZeRO runs only (``validate.fit_interference``). On a stated GPU device NCCL's thread blocks take SMs:
    stated, not fitted (``StatedProfile``: channels ÷ SMs). A measured GPU profile leaves it at zero."""

    grad_elem: int | None = None
    """Bytes per gradient element of the data-parallel reductions, where the program reduces in another type than
    its parameters (None: the parameters' type). Stated profiles only."""
    spread: dict[str, float] = field(default_factory=dict)
    """Entry id (an ``ops`` or ``linear`` key, or a curve's ``point_key``) -> half-range of the replicates it was
    taken from, relative to its value (measured profiles; an entry without one is read as exact)."""
    quality: dict[str, dict] = field(default_factory=dict)
    """Entry id -> how it was measured: ``replicates`` kept, ``rejected`` outliers, whether it ``settled``
    (``zerobench.sim.replicates``) and why a check across pieces ``flagged`` it; written with its rows."""
    hardware: tuple[str, str] | None = None
    """(hardware class, device) of the machine measured, from its rows' provenance; None for a stated device."""
    torch_version: str | None = None
    """The torch the profile measured (its rows' provenance)."""

    @property
    def zero_machinery(self):
        """How the program's ZeRO-3 gathers and reduces where it differs from zerobench's engine
        (``software.ZeroMachinery``; None: zerobench's)."""
        return None

    @property
    def asynchronous(self) -> bool:
        """Whether the host issues work that the device runs later (a GPU): the replay then keeps a host stream
        beside the device's, and the host waits for the device only where the engine synchronises."""
        return self.device.startswith("cuda")

    def op(self, key: str) -> float:
        if key not in self.ops:
            raise KeyError(f"the profile of {self.device} has no op {key}: run `zerobench profile` for this shape")
        return self.ops[key]

    def has_op(self, name: str, **shape) -> bool:
        return op_key(name, **shape) in self.ops

    def op_time(self, name: str, **shape) -> float:
        """Seconds of compute op ``name`` at ``shape`` (the keywords of ``op_key``); on a CPU host with more ranks
        than cores, the time-shared cost (``time_shared``) where the profile has the piece at one rank per core."""
        shared = self.time_shared(name, shape)
        return self.op(op_key(name, **shape)) if shared is None else shared

    def time_shared(self, name: str, shape: dict) -> float | None:
        """A compute piece's seconds when ``shape["ranks"]`` single-threaded processes share the host's cores: the
        piece measured with one process per core, times processes / cores (None where the host is not
        oversubscribed, is not a CPU, or the profile lacks that piece).

        Measured directly, such a piece is bimodal: a block of a few milliseconds, shorter than the scheduler's
        time slice, runs either untouched or with a whole slice of another process inside it, and the median of
        its samples lands on one mode or the other (tiny's block at 4 processes on 2 cores: 1.4x to 2.7x the
        2-process figure over five profiles). A step of many pieces pays the share on average, which is what
        this charges. Every rank computes at once in a data-parallel step, so the share is the whole ratio."""
        ranks, threads = shape["ranks"], shape["threads"]
        if not self.device.startswith("cpu") or ranks * threads <= self.cores:
            return None
        own = op_key(name, **{**shape, "ranks": self.cores, "threads": 1})
        if own not in self.ops:
            return None
        return self.ops[own] * ranks * threads / self.cores

    def collective(self, op: str, group: int, ranks: int, nbytes: float, dim: str = "dp", tp: int = 1) -> float:
        """Seconds of ``op`` moving ``nbytes`` (the unsharded size) over a group of ``group`` ranks, ``ranks``
        processes in all. ``dim`` (``dp`` or ``tp``) and ``tp`` place the group on a cluster (stated profiles);
        a measured host profile already reflects its own placement."""
        if group <= 1 or nbytes <= 0:
            return 0.0
        key = curve_key(op, group, ranks)
        if key not in self.curves:
            raise KeyError(
                f"the profile of {self.device} has no collective {key}: run `zerobench profile` with {ranks} processes"
            )
        return self.pooled(key).seconds(nbytes)

    def pooled(self, key: str) -> Curve:
        """The curve of ``key`` read together with every curve timing the same operation (``composed``): the
        pointwise mean over their common sizes (each curve's own interpolation elsewhere)."""
        base = self.composed.get(key, key)
        same = [k for k in (base, *sorted(k for k, b in self.composed.items() if b == base)) if k in self.curves]
        if len(same) < 2:
            return self.curves[key]
        sizes = sorted({b for k in same for b, _ in self.curves[k].points})
        return Curve(tuple((b, sum(self.curves[k].seconds(b) for k in same) / len(same)) for b in sizes))

    def cost(self, name: str, ranks: int, n: float) -> float:
        key = f"{name}|r{ranks}"
        if key not in self.linear:
            raise KeyError(f"the profile of {self.device} has no {key}: run `zerobench profile` with {ranks} processes")
        return self.linear[key].seconds(n)

    def transfer(self, ranks: int, nbytes: float) -> float:
        """Seconds to move ``nbytes`` between device and host memory (on a CPU host: a copy)."""
        return self.cost("copy", ranks, nbytes)

    def collective_copies(self, op: str, group: int, nbytes: float, dim: str = "dp", stage: int | None = None) -> float:
        """Seconds of the device-side copies a stated program runs around one of its DP collectives (a list
        collective's per-tensor copies, a zeroed output, a divide before a reduction: ``ZeroMachinery``, as a run
        at ZeRO ``stage`` meets it), on the collective's stream; 0 where the program runs none (every measured
        profile)."""
        return 0.0

    def host_reads(self, name: str, **shape) -> float:
        """Seconds the device idles during compute piece ``name`` at ``shape`` while the host reads values back (a
        stated program whose forward calls ``.item()``); 0 where the piece's own timing holds them (every measured
        profile)."""
        return 0.0

    def step_loop(self, param_sizes: tuple[int, ...], tp: int, ranks: int) -> tuple[float, float, float] | None:
        """A stated program's own optimizer step for a run without ZeRO, where it walks the parameter tensors one at
        a time (``software.StepLoop``; ``param_sizes``: this rank's elements of each): seconds of its kernels on the
        device, seconds the device idles while the host reads values back or waits for it to drain, and seconds of
        its one-element all-reduces over the TP group. None where the step is one pass over flat buffers, as
        zerobench's engine takes it (every measured profile)."""
        return None

    def sync_penalty(self, group: int, ranks: int, compute_s: float) -> float:
        """Extra seconds of a blocking collective over ``group`` ranks after ``compute_s`` of compute since
        the last synchronisation (0 where the profile has no such measurement: stated profiles)."""
        lin = self.linear.get(f"sync|g{group}|r{ranks}")
        return lin.seconds(compute_s) if lin is not None and group > 1 else 0.0

    def bound(self, side: int) -> Profile:
        """This profile with every entry at the low (``side`` -1) or the high (+1) end of its spread: the replay is
        monotone in its costs (a task starts at the latest end it waits for), so the replay on the two ends
        bounds the prediction as far as the profile's own noise goes, every piece at once (a host's noise
        moves them together)."""

        def at(key: str, v: float) -> float:  # a spread of 90% or more leaves a tenth at the low end, never zero
            return v * max(1 + side * self.spread.get(key, 0.0), 0.1)

        return dataclasses.replace(
            self,
            ops={k: at(k, v) for k, v in self.ops.items()},
            curves={k: Curve(tuple((b, at(point_key(k, b), t)) for b, t in c.points)) for k, c in self.curves.items()},
            linear={k: Linear(at(k, lin.alpha), at(k, lin.beta)) for k, lin in self.linear.items()},
        )

    @property
    def has_spread(self) -> bool:
        """Whether any entry carries a spread (profiles taken before spreads were measured have none)."""
        return any(self.spread.values())

    def merge(self, other: Profile) -> None:
        self.ops.update(other.ops)
        self.spread.update(other.spread)
        self.quality.update(other.quality)
        self.curves.update(other.curves)
        self.linear.update(other.linear)
        self.composed.update(other.composed)
        self.memory.update(other.memory)
        self.sources.update(other.sources)
        self.interference = other.interference or self.interference

    # -- as rows -------------------------------------------------------------------------------
    def rows(self) -> list[dict]:
        """One dict per entry (metric, value, unit and keys, with its spread and how it was measured where
        known), for ``RowWriter.write``."""

        def noted(entry: str) -> dict:
            out = dict(self.quality.get(entry, {}))
            if entry in self.spread:
                out["spread"] = self.spread[entry]
            return out

        out = [
            {"metric": "profile_op_seconds", "value": t, "unit": "s", "key": k, **noted(k)}
            for k, t in sorted(self.ops.items())
        ]
        out += [
            {"metric": "profile_memory_bytes", "value": b, "unit": "bytes", "key": k}
            for k, b in sorted(self.memory.items())
        ]
        for k, c in sorted(self.curves.items()):
            out += [
                {
                    "metric": "profile_collective_seconds",
                    "value": t,
                    "unit": "s",
                    "key": k,
                    "bytes": b,
                    "composed_of": self.composed.get(k),
                    **noted(point_key(k, b)),
                }
                for b, t in c.points
            ]
        for k, lin in sorted(self.linear.items()):
            out.append({"metric": "profile_alpha_seconds", "value": lin.alpha, "unit": "s", "key": k, **noted(k)})
            out.append(
                {
                    "metric": "profile_beta_seconds",
                    "value": lin.beta,
                    "unit": "s per element or byte",
                    "key": k,
                    **noted(k),
                }
            )
        if self.interference:
            out.append(
                {
                    "metric": "profile_interference",
                    "value": self.interference,
                    "unit": "fraction",
                    "key": "interference",
                }
            )
        return out

    @classmethod
    def from_rows(cls, rows: list[dict]) -> Profile:
        """The profile in ``rows``. An entry measured more than once (several profiles of one host read
        together, e.g. one taken before each round of a sweep) is the median of its measurements, and its
        spread the larger of their own spreads' median and their half-range across the profiles."""
        prof = [r for r in rows if r.get("metric", "").startswith("profile_") and r.get("status") == "ok"]
        if not prof:
            raise ValueError("no profile rows: run `zerobench profile --out DIR` first")
        devices = {str(r.get("device", "unknown")) for r in prof}
        if len(devices) > 1:  # its entries would be medians over machines, labelled with one of them
            a, b = sorted(devices)[:2]
            raise ValueError(f"the profile's rows were measured on {a} and {b}: read one machine's profiles at a time")
        p = cls(device=prof[-1].get("device", "unknown"), cores=int(prof[-1].get("cores", 1)))
        prov = next((r["provenance"] for r in prof if isinstance(r.get("provenance"), dict)), {})
        hw = prov.get("hardware") or {}
        p.hardware = (str(hw.get("class")), str(hw.get("device"))) if hw else None
        p.torch_version = prov.get("torch_version")
        ops: dict[str, list[float]] = {}
        memory: dict[str, list[float]] = {}
        fitted: list[float] = []
        points: dict[str, dict[float, list[float]]] = {}
        lin: dict[str, dict[str, list[float]]] = {}
        composed: dict[str, str | None] = {}
        spreads: dict[str, list[float]] = {}
        for r in prof:
            m, k = r["metric"], r["key"]
            if m == "profile_op_seconds":
                ops.setdefault(k, []).append(r["value"])
            elif m == "profile_memory_bytes":
                memory.setdefault(k, []).append(r["value"])
            elif m == "profile_interference":
                fitted.append(r["value"])
            elif m == "profile_collective_seconds":
                points.setdefault(k, {}).setdefault(float(r["bytes"]), []).append(r["value"])
                if "composed_of" in r:
                    composed[k] = r["composed_of"]
            else:
                which = "alpha" if m == "profile_alpha_seconds" else "beta"
                lin.setdefault(k, {}).setdefault(which, []).append(r["value"])
            if "spread" in r and m != "profile_beta_seconds":  # a line's spread rides on both of its rows
                entry = point_key(k, float(r["bytes"])) if m == "profile_collective_seconds" else k
                spreads.setdefault(entry, []).append(float(r["spread"]))
        med = statistics.median
        p.ops = {k: med(v) for k, v in ops.items()}
        p.memory = {k: med(v) for k, v in memory.items()}
        p.interference = med(fitted) if fitted else 0.0
        p.curves = {k: Curve(tuple(sorted((b, med(ts)) for b, ts in v.items()))) for k, v in points.items()}
        p.linear = {k: Linear(med(v["alpha"]), med(v["beta"])) for k, v in lin.items()}
        if points and not composed and p.device.startswith("cpu:"):
            # rows from before curves said what they are composed of: every CPU profile was taken on gloo
            composed = {k: "all_reduce|" + k.split("|", 1)[1] for k in points if k.startswith("reduce_scatter|")}
        p.composed = {k: b for k, b in composed.items() if b}
        measured = {
            **{k: [v] for k, v in ops.items()},
            **{k: [v["alpha"], v["beta"]] for k, v in lin.items()},
            **{point_key(k, b): [ts] for k, v in points.items() for b, ts in v.items()},
        }
        for entry, lists in measured.items():
            across = max(_half_range(vs) for vs in lists)
            if across or entry in spreads:
                p.spread[entry] = max(med(spreads[entry]) if entry in spreads else 0.0, across)
        return p


def _half_range(values: list[float]) -> float:
    """Half the range of ``values`` relative to their median (0 for a single value)."""
    m = statistics.median(values)
    return (max(values) - min(values)) / 2 / abs(m) if len(values) > 1 and m else 0.0
