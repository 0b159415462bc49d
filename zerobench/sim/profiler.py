"""``zerobench profile``'s passes: replicates of every unit, spread over the profiling time, until they settle.

``profile_suite`` runs passes over the jobs (``measure.HostJob``, one per process count). Each pass sends each
job's processes a plan (``replicates.Tally.plan``): the first pass two replicates of every unit, the second one
more of every unit (so every piece has replicates from two moments apart), later passes only the units whose
pieces have not settled, until none is left or ``time_limit_s`` has passed. After each pass the checks across
units (``checks``) flag contradictions, whose units are measured afresh. Then each piece is its kept
replicates' mean, with their spread (``Profile.spread``), and the per-element costs, the engine's host work,
the skew penalty and the collective curves are fitted through theirs.

A profile some of whose pieces did not settle says so in one line (``Profiled.noisy``), naming them; its
entries carry their spreads, so every prediction made from it carries an interval that shows it.
"""

from __future__ import annotations

import itertools
import sys
import time
from dataclasses import dataclass

from zerobench.sim.checks import cross_world, non_monotone
from zerobench.sim.measure import HostJob, HostSession
from zerobench.sim.measure_comm import monotone
from zerobench.sim.measure_engine import engine_line
from zerobench.sim.measure_units import sync_key, units_of
from zerobench.sim.profile import Curve, Linear, Profile, moved_bytes, point_key
from zerobench.sim.replicates import MAX_SPREAD, Estimate, Tally

TIME_LIMIT_S = 300.0
"""Default seconds after which no more replicates are taken of pieces that have not settled (the first two
passes always complete)."""
MIN_PASSES = 2


@dataclass
class Profiled:
    """A profile and how it was measured."""

    profile: Profile
    tally: Tally
    seconds: float
    time_limit_s: float

    def noisy(self) -> str | None:
        """One line naming the units a check flagged and the pieces that did not settle (widest spread first), or
        None."""
        left = sorted(self.tally.unsettled(), key=lambda x: -x[2].spread if x[2] is not None else float("-inf"))
        if not left:  # the flagged first, then the widest spreads
            return None
        names = [
            f"{_describe(u, p)} ±{e.spread:.0%} from {e.kept} kept"
            if e is not None
            else f"flagged: {self.tally.flagged[u]}"
            for u, p, e in left
        ]
        shown = "; ".join(names[:8]) + (f"; and {len(names) - 8} more" if len(names) > 8 else "")
        total = sum(len(v) for v in self.tally.samples.values())
        return (
            f"zerobench profile: taken in a noisy moment: {len(names)} of {total} pieces did not settle within "
            f"{self.time_limit_s:.0f} s (replicates further apart than ±{self.tally.threshold:.0%}): {shown}; "
            f"their rows say settled: false, and predictions carry the spreads as intervals"
        )


def _describe(unit: tuple, piece: str) -> str:
    """A piece's name for the one-line report: an op by its piece, shape and processes, others by their size."""
    kind = unit[0]
    if kind in ("compute", "insitu"):
        name, b, s, h, _, _, tp, *_, r, _ = piece.split("|")
        return f"{name} ({h} {s} {b}{f' {tp}' if tp != 'tp1' else ''}, {r[1:]} process(es))"
    if kind == "coll":
        return f"{piece} at {unit[4]} B"
    if kind == "elem":
        return f"{piece} at {unit[2]} elements"
    if kind == "engine":
        return f"{piece} at {unit[3]} blocks"
    if kind == "sync":
        return f"{sync_key(unit[2], unit[1])} after {unit[3] * 1e3:.0f} ms"
    return piece or f"{kind} unit {unit}"


def _say(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def profile_suite(
    jobs: list[HostJob],
    device: str,
    cores: int,
    threshold: float = MAX_SPREAD,
    time_limit_s: float = TIME_LIMIT_S,
    timeout_s: float = 900.0,
    say=_say,
) -> Profiled:
    """Profile ``jobs`` in passes (see the module). ``threshold``: the spread below which a piece has settled;
    ``timeout_s``: the longest one job's pass may take before the profile fails as hung."""
    tally = Tally(threshold)
    units = [units_of(j) for j in jobs]
    sessions: list[HostSession | None] = [None] * len(jobs)
    memory: dict[str, float] = {}
    composed: dict[str, str] = {}
    t0 = time.monotonic()
    try:
        for n in itertools.count():
            took = 0
            for i, job in enumerate(jobs):
                plan = tally.plan(units[i], every=n == 1)
                if n >= MIN_PASSES and time.monotonic() - t0 > time_limit_s:  # only what lacks its replicates
                    plan = {u: k for u, k in plan.items() if tally.lacking(u)}
                if not plan:
                    continue
                if sessions[i] is None:
                    sessions[i] = HostSession(job, timeout_s)
                t = time.monotonic()
                out = sessions[i].run(plan)
                for u, reps in out["replicates"].items():
                    for values in reps:
                        tally.add(u, values)
                memory.update(out["memory"])
                composed.update(out["composed"])
                took += 1
                say(
                    f"pass {n + 1}: {job.ranks} process(es) x {job.threads} thread(s): {sum(plan.values())} "
                    f"replicate(s) of {len(plan)} unit(s) in {time.monotonic() - t:.0f} s"
                )
            check(tally)
            if not took:
                break
    finally:
        for s in sessions:
            if s is not None:
                s.close()
    return Profiled(assemble(tally, memory, composed, device, cores), tally, time.monotonic() - t0, time_limit_s)


def check(tally: Tally) -> None:
    """Flag the units the checks across units find implausible (measured afresh once), and clear the flags of
    those that pass now."""
    values = {u: {p: e.value for p, e in tally.estimates(u).items()} for u in tally.samples}
    found = {**cross_world(values), **non_monotone(values, tally.threshold)}
    for u in list(tally.flagged):
        if u not in found and u in tally.samples:
            tally.clear_flag(u)
    for u, why in found.items():
        tally.flag(u, why)


def _note(prof: Profile, entry: str, ests: list[Estimate], flagged: str | None) -> None:
    prof.spread[entry] = min(max(e.spread for e in ests), 1.0)
    prof.quality[entry] = {
        "replicates": min(e.kept for e in ests),
        "rejected": sum(e.rejected for e in ests),
        "settled": all(e.settled for e in ests),
    }
    if flagged:
        prof.quality[entry]["flagged"] = flagged


def assemble(tally: Tally, memory: dict, composed: dict, device: str, cores: int) -> Profile:
    """The profile from the tally: each piece its estimate, the lines and curves fitted through theirs."""
    prof = Profile(device=device, cores=cores, memory=dict(memory), composed=dict(composed))
    lines: dict[str, list[tuple[float, Estimate]]] = {}
    engine: dict[str, dict[int, Estimate]] = {}
    curves: dict[str, list[tuple[float, Estimate, str | None]]] = {}
    for unit in tally.samples:
        ests, kind, why = tally.estimates(unit), unit[0], tally.flagged.get(unit)
        if kind in ("compute", "insitu"):
            for k, e in ests.items():
                prof.ops[k] = e.value
                _note(prof, k, [e], why)
        elif kind == "elem":
            for k, e in ests.items():
                lines.setdefault(k, []).append((unit[2] if k.startswith("adamw|") else 4 * unit[2], e))
        elif kind == "engine":
            for k, e in ests.items():
                engine.setdefault(k, {})[unit[3]] = e
        elif kind == "coll":
            for k, e in ests.items():
                curves.setdefault(k, []).append((moved_bytes(unit[4], unit[2]), e, why))
        elif kind == "sync":
            key = sync_key(unit[2], unit[1])
            lines.setdefault(key, []).append((ests["compute_s"].value, ests[key]))
    for k, pts in lines.items():
        prof.linear[k] = Linear.fit([(x, e.value) for x, e in sorted(pts, key=lambda p: p[0])])
        _note(prof, k, [e for _, e in pts], None)
    for k, per in engine.items():
        prof.linear[k] = engine_line({layers: e.value for layers, e in per.items()})
        _note(prof, k, list(per.values()), None)
    for k, pts in curves.items():
        pts.sort(key=lambda p: p[0])
        prof.curves[k] = Curve(tuple(monotone([(b, e.value) for b, e, _ in pts])))
        for b, e, why in pts:
            _note(prof, point_key(k, b), [e], why)
    return prof
