"""The performance regression gate's rules: candidate rows vs a per-hardware baseline, metric by metric.

Runs are matched by their resolved-config hash. Rules, per metric:

| metric | direction | rule |
|---|---|---|
| ``model_state_bytes`` (max over ranks) | lower | exact: deterministic |
| ``comm_volume_elements_per_step`` (max over ranks) | lower | exact: deterministic |
| ``peak_memory_bytes`` (max over ranks) | lower | 2%: the live-tensor tracker is deterministic per torch version |
| ``final_loss`` (fp32 runs) | equal | 1e-4 relative: kernels differ slightly across CPUs |
| ``step_time_ratio`` | lower | the run's median step time / its reference's *in the same sweep* (``_timing_reference``: the stage-0 run of the same workload; for zerobench's stage 0, a torch-ddp run of it); absolute times drift across machines, ratios measured side by side do not. Tolerance max(``timing_tolerance``, 3 x the ratio's standard error from the per-step spread), symmetric in ratio: slower than x(1+tol) regresses, faster than /(1+tol) improves. |
| ``ops_dispatched``, ``allocations``, ``allocated_bytes``, ``collective_calls``, ``collective_bytes`` (sum over ranks; per phase as ``name.phase``) | lower | exact: counts of the counted step that do not depend on the machine's load (``train/probes.py``) |
| ``py_calls``, ``host_cpu_s``, ``instructions`` (sum over ranks; per phase as ``name.phase``) | lower | against the baseline's noise model (``bench/noise.py``): max(floor, k x sigma of unchanged runs); not gated without one. ``instructions`` come from runs under callgrind (``zerobench sweep --instructions``, rows tagged ``instrumented``), the rest from timed runs |

A baseline recorded from several unchanged runs carries a noise model: per configuration and metric the values
of every run (``gate_noise`` rows, ``bench/noise.py``). Its mean is then the baseline value, and every metric
moved by more than its noise allows at a false-alarm rate ``false_alarm`` for the whole gate run; a metric that
never moved stays exact.

A change beyond tolerance in the bad direction is a regression (exit 1); in the good direction it is
flagged ("update the baseline?"). Noise that allows more than ``MAX_TOLERANCE`` (a noise model of a few runs,
a step time whose per-step spread is as large as the change) cannot tell a doubling from noise: such a
comparison is "too noisy", listed as not gated, never "ok".

The rows are checked before anything is compared, and refused in one line (``ConfigError``) where a verdict
would be wrong without a word: two rows of one measurement (rows of several sweeps or rounds in one directory,
whose last row would win), two completed runs of one configuration (two sweeps, or two suite entries that
resolve to one configuration: runs are matched by it), a gated value that is not a number, a
negative count or size, a step time that is not positive, a metric in another unit than the baseline's, a
run without hardware provenance beside runs with it (on either side), a configuration measured on another hardware
class than the baseline's run of it (``check_hardware``: per configuration, a run's machine read from its
measurement rows, not from its status row, which whoever recorded the run wrote). A per-rank metric measured on
other ranks than the baseline's (a rank's rows lost) fails as missing, and a configuration the candidate ran and
none of whose runs completed fails whether or not the baseline has it (unless the suite's checker refused it as
invalid). A baseline run that stopped without a status row fails the gate as a damaged baseline; one that failed (a sweep
given as the baseline) is listed as not compared. A candidate value that is not finite (a diverged run's NaN
loss, a NaN or infinite measurement, on any rank; or a baseline's) fails as ``NOT FINITE``, and a gated metric the baseline
has but the candidate's run lacks fails as missing: neither is ever compared away as "ok". Only runs whose
status is ``ok`` are compared (``results/status.py``): a candidate run that failed, or is incomplete (no
``run_status`` row), is listed as not completed; a configuration none of whose candidate runs completed fails,
as missing where the baseline has the run and as failed where it does not (a retry that completed passes). What
the candidate has and the baseline lacks (a run, or a gated metric of a run) is listed as "not in the
baseline": there is nothing to compare it with, so it does not fail the gate unless ``strict`` (as pytorch's
pr_time_benchmarks report a benchmark without an expected value). Either way a proposed new baseline is
written. With ``timing="report"`` step-time changes are shown ("SLOWER") but do not
fail the gate: for baselines recorded in another session or on another machine of a noisy class (2-core CPUs:
step-time ratios of tiny runs moved 80-90% between sessions here), where only same-session timing comparisons
mean anything.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from zerobench.bench import noise
from zerobench.bench.stats import relative_se_from_mad
from zerobench.config import ConfigError
from zerobench.results.status import INCOMPLETE, OK, SCHEMA, STATUS_METRIC, status_of
from zerobench.results.workload import NOT_WORKLOAD, flatten, workload

INVALID = "invalid"
"""The status of a suite entry whose configuration the checker refused (``bench/sweep_state.py``)."""

PHASES = ("forward_backward", "optimizer", "zero_grad")
COUNTS = ("ops_dispatched", "allocations", "allocated_bytes", "collective_calls", "collective_bytes")
MODELLED = ("py_calls", "host_cpu_s", "instructions")
"""Host-work metrics gated against a noise model only (none without one: they move between unchanged runs)."""
HOST = tuple(f"{m}.{p}" if p else m for m in (*COUNTS, *MODELLED) for p in ("", *PHASES))
"""Per-rank host-work rows (``train/probes.py``), summed over ranks: ``name`` for the step, ``name.phase``."""
EXACT = ("model_state_bytes", "comm_volume_elements_per_step", *(m for m in HOST if noise.family(m) in COUNTS))
GATED = (
    "model_state_bytes",
    "comm_volume_elements_per_step",
    "peak_memory_bytes",
    "final_loss",
    "step_time_ratio",
    *HOST,
)


MAX_TOLERANCE = 1.0
"""The widest tolerance noise may set and a comparison still be judged: beyond it a doubling passes as noise. (An
absolute floor, which keeps a phase doing almost nothing from being called for a garbage collection, may be
wider: it is a chosen minimum change, not noise.)"""
MEASURED = (*EXACT, "peak_memory_bytes", "loss", "step_time_s", *COUNTS, *MODELLED)
"""Row metrics the gate reads as measurements: one row per (run, metric, rank, phase, step)."""
SIGNED = ("loss",)
"""Measurements that may be negative; every other one is a size, a count or a time."""


@dataclass(frozen=True)
class Comparison:
    key: str
    label: str
    metric: str
    baseline: float
    candidate: float
    tolerance: float
    verdict: str  # ok / regression / improved / slower / not finite / no noise model / too noisy
    basis: str = ""
    """Where the tolerance comes from: ``exact``, a fixed rule, or the noise model (runs, sigma)."""

    @property
    def change(self) -> float:
        return (self.candidate / self.baseline - 1) if self.baseline else (0.0 if self.candidate == 0 else math.inf)


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def run_key(r: dict) -> tuple:
    """A run in the gate's rows: (run id, config hash, the tool it ran under). A run timed and the same run counted
    under callgrind (``sweep --instructions``, rows tagged ``instrumented``) share run id and configuration when
    one directory holds both sweeps; each keeps its own status, so a failed instrumented run is named as such and
    its timed twin is still compared."""
    return (r.get("run_id"), r.get("config_hash"), r.get("instrumented") or "")


def run_statuses(rows: list[dict]) -> dict[tuple, tuple[str | None, str | None]]:
    """Each ``run_key``'s status. Rows without a status row of their own take the status of the same run's rows
    under another tool that have one, the untagged ones first, only where that is how they were written: an
    instrumented run's rows from sweeps before the runner tagged its status row (the untagged run then holds both
    tools' status rows), the untagged noise-model rows a baseline of instrumented runs carries, and rows from
    before every launcher wrote a status row. An instrumented run of a later sweep that lacks its own is
    incomplete, whatever its timed twin's status."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault(run_key(r), []).append(r)
    out = {k: status_of(rs) for k, rs in by.items()}
    recorded = [k for k, rs in by.items() if any(r.get("metric") == STATUS_METRIC for r in rs)]
    twin = {k[:2]: out[k] for k in sorted(recorded, key=lambda k: k[2], reverse=True)}  # untagged written last
    for k in by.keys() - set(recorded):
        untagged = by.get((*k[:2], ""), [])
        statuses_there = sum(r.get("metric") == STATUS_METRIC for r in untagged)
        # both tools' status rows untagged, or an --instructions sweep whose only untagged rows are its status row
        legacy = statuses_there > 1 or (statuses_there == len(untagged) > 0)
        if legacy or all(r.get("metric") == noise.NOISE_METRIC or (r.get("schema") or 1) < SCHEMA for r in by[k]):
            out[k] = twin.get(k[:2], out[k])
    return out


def _where(r: dict) -> str:
    rank = f" rank {r['rank']}" if r.get("rank") is not None else ""
    return f"run {r.get('run_id')}{' under ' + r['instrumented'] if r.get('instrumented') else ''}: {r['metric']}{rank}"


def _check_value(r: dict) -> None:
    """Refuse a measurement the gate would read wrongly: not a number, a negative size, count or time, a step
    time that is not positive. NaN and infinities pass: the gate fails them as NOT FINITE."""
    m, v = r["metric"], r.get("value")
    if v is None:
        return
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ConfigError(f"{_where(r)} has the value {v!r}, not a number: a damaged or hand-edited row")
    if m not in SIGNED and v < 0:
        raise ConfigError(f"{_where(r)} is {v:g}: a size, count or time is never negative (a damaged row)")
    if m == "step_time_s" and v == 0:
        raise ConfigError(f"{_where(r)} is 0 s: a step takes time (a damaged row)")
    if m == "step_time_s":  # its spread sets the timing tolerance
        for field, least in (("mad", 0), ("n", 1)):
            x = r.get(field)
            if x is not None and (isinstance(x, bool) or not isinstance(x, (int, float)) or not x >= least):
                raise ConfigError(
                    f"{_where(r)} has {field} {x!r}, not a number of at least {least}: a damaged or hand-edited row"
                )


def summarize(rows: list[dict]) -> dict[str, dict]:
    """Per configuration (config hash): the gated metrics of its ``ok`` runs, a label, what the timing ratio
    needs, whether any run completed (``ok``) and the runs that did not (``not_ok``: run id -> status, reason),
    each metric's unit (``units``), the ranks a per-rank metric was measured on (``ranks``) and the hardware
    classes its completed runs were measured on (``hardware``; None for rows without one), read from the
    measurement rows only: a status row is written by whoever recorded the run (under Slurm the submit host, for a
    run that failed before measuring anything the only row it left). Raises ``ConfigError`` where the rows cannot
    be read as one measurement of each configuration (module docstring)."""
    status = run_statuses(rows)
    runs: dict[str, dict] = {}
    seen: set[tuple] = set()

    def entry(r: dict) -> dict:
        return runs.setdefault(
            r["config_hash"],
            {
                "label": r.get("label") or r.get("run_id"),
                "config": r.get("config", {}),
                "hardware": set(),
                "ok": False,
                "not_ok": {},
                "noise": {},
                "units": {},
                "ranks": {},
                "_ranks": {},
                "_max": {},
                "_ok_runs": {},
            },
        )

    for r in rows:
        m, v = r["metric"], r.get("value")
        if m == noise.NOISE_METRIC:  # a baseline's noise model is the configuration's, whatever run it was copied from
            ident = (r["config_hash"], m, r.get("of"))
            if ident in seen:
                raise ConfigError(f"{_where(r)} of {r.get('of')} is recorded twice: a damaged or merged baseline")
            seen.add(ident)
            entry(r)["noise"][r.get("of")] = r
            continue
        run_status, reason = status[run_key(r)]
        if (r.get("status", "ok") != "ok" and m != STATUS_METRIC) or run_status is None:
            continue  # a failed row, or rows of no training run (no status applies: results/status.py)
        d = entry(r)
        if run_status != OK:
            d["not_ok"][f"{r.get('run_id')}{' under ' + r['instrumented'] if r.get('instrumented') else ''}"] = (
                run_status,
                reason,
            )
            continue
        d["ok"] = True
        d.setdefault("run_id", r.get("run_id"))
        if m != STATUS_METRIC:  # a status row's machine is the recorder's, not necessarily the one measured
            d["hardware"].add(((r.get("provenance") or {}).get("hardware") or {}).get("class"))
        tool = r.get("instrumented") or ""
        other = d["_ok_runs"].setdefault(tool, r.get("run_id"))
        if other != r.get("run_id"):
            raise ConfigError(
                f"two completed runs of one configuration ({other} and {r.get('run_id')}): two suite entries that "
                "resolve to the same configuration (the gate matches runs by configuration: make them differ), or "
                "rows of more than one sweep (gate one sweep's results; several unchanged sweeps make a baseline's "
                "noise model: --write-baseline FILE --candidate DIR1 DIR2 ...)"
            )
        if r.get("instrumented") and m not in ("instructions", STATUS_METRIC):
            continue  # a run under callgrind: only its instruction counts are measurements
        if m in MEASURED:
            ident = (run_key(r), m, r.get("rank"), r.get("phase"), r.get("step"), r.get("of"))
            if ident in seen:
                raise ConfigError(
                    f"{_where(r)} is measured twice: rows of more than one sweep or round in one directory "
                    "(the last would win); gate one sweep's results"
                )
            seen.add(ident)
            _check_value(r)
            if r.get("unit") is not None:
                first = d["units"].setdefault(m, r["unit"])
                if first != r["unit"]:  # the max or sum over ranks would mix them
                    raise ConfigError(
                        f"{_where(r)} is in {r['unit']} where other rows of it are in {first}: rows edited by hand or "
                        "of two versions; record them again"
                    )
        if m == STATUS_METRIC:
            d["label"] = r.get("label") or d["label"]
        elif "phase" in r and m in (*COUNTS, *MODELLED):  # per rank and phase: summed over ranks below
            key = m if r["phase"] == "step" else f"{m}.{r['phase']}"
            d["_ranks"].setdefault(key, {})[r.get("rank")] = v
        elif m in EXACT or m == "peak_memory_bytes":  # max over ranks below
            d["_max"].setdefault(m, {})[r.get("rank")] = v
        elif m == "loss":  # the last step's; a NaN on any rank at that step stays
            step, last = r.get("step") or 0, d.get("_loss_step", -1)  # a loss row with no step: step 0
            if step > last or (step == last and not _nan(d.get("final_loss"))):
                d["_loss_step"], d["final_loss"] = step, v
        elif m == "step_time_s" and v is not None:
            d["step_time_s"], d["mad"], d["n"] = v, r.get("mad") or 0.0, r.get("n") or 1

    for d in runs.values():
        for key, per_rank in d.pop("_max").items():  # a rank that measured nothing (None): not measured, no max
            d["ranks"][key] = frozenset(per_rank)
            vals = list(per_rank.values())
            d[key] = None if any(v is None for v in vals) else next((v for v in vals if _nan(v)), max(vals))
        d.pop("_ok_runs")

    for d in runs.values():
        d["workload"] = workload(flatten(d["config"]))  # once per run: every run is matched against every other
    for d in runs.values():
        if "step_time_s" in d:
            ref = _timing_reference(d, runs)
            if ref is not None:
                _set_ratio(d, ref)
    for d in runs.values():
        for key, per_rank in d.pop("_ranks").items():  # None on any rank: not measured there, no sum
            d["ranks"][key] = frozenset(per_rank)
            d[key] = None if any(v is None for v in per_rank.values()) else sum(per_rank.values())
        for key, row in d["noise"].items():  # a noise model's mean is the baseline's value
            if key in GATED and row.get("center") is not None:
                d[key] = row["center"]
    return runs


REFERENCE_SYSTEM = "torch-ddp"
"""The system whose stage-0 run times zerobench's own stage 0: another system's code, measured in the same sweep."""


def _timing_reference(d: dict, runs: dict[str, dict]) -> dict | None:
    """The run ``d``'s step time is gated as a ratio to: for a ZeRO stage above 0, the stage-0 run of its system
    with the same workload (every config key but the stage and ``results.workload.NOT_WORKLOAD``); for zerobench's stage 0, the
    ``REFERENCE_SYSTEM`` run of that workload, where the results hold one (else its time is the others' reference
    and is not gated itself: a slower stage 0 would read as faster ZeRO stages). ``ConfigError`` where two runs
    could be the reference."""
    c = d["config"]
    system, stage = c.get("system", "zerobench"), c.get("zero", {}).get("stage")
    if stage != 0:
        want = (system, 0)
    elif system == "zerobench":
        want = (REFERENCE_SYSTEM, 0)
    else:
        return None
    found = [
        r
        for r in runs.values()
        if r is not d
        and "step_time_s" in r
        and (r["config"].get("system", "zerobench"), r["config"].get("zero", {}).get("stage")) == want
        and r["workload"] == d["workload"]
    ]
    if len(found) > 1:
        raise ConfigError(
            f"{d['label']}: {found[0]['label']} and {found[1]['label']} are both its timing reference (the same "
            f"workload, differing only in {', '.join(NOT_WORKLOAD)}): gate results with one of them"
        )
    return found[0] if found else None


def _set_ratio(d: dict, ref: dict) -> None:
    """``d``'s step time over ``ref``'s, with its standard error; NaN (gated as not finite) where either time is
    not finite, never a ratio of 0 or infinity read as a change."""
    t, t0 = d["step_time_s"], ref["step_time_s"]
    if not (math.isfinite(t) and math.isfinite(t0)):
        d["step_time_ratio"], d["ratio_se"] = math.nan, 0.0
        return
    d["step_time_ratio"] = t / t0
    d["ratio_se"] = math.hypot(
        relative_se_from_mad(d["mad"], t, d["n"]), relative_se_from_mad(ref["mad"], t0, ref["n"])
    )


@dataclass
class GateResult:
    """What the gate found, besides the comparisons."""

    comparisons: list[Comparison]
    missing: list[str] = field(default_factory=list)
    """In the baseline, not completed or not measured in the candidate (a run, or ``run: metric``): fails."""
    not_in_baseline: list[str] = field(default_factory=list)
    """In the candidate, not in the baseline (a run, or ``run: metric``): listed; fails only when strict."""
    not_completed: list[str] = field(default_factory=list)
    """Candidate runs whose status is not ``ok`` (failed, incomplete, ...), with it: listed, never compared."""
    not_compared: list[str] = field(default_factory=list)
    """Baseline configurations whose runs failed or were refused as invalid (a sweep given as the baseline):
    listed, nothing to compare against."""
    damaged: list[str] = field(default_factory=list)
    """Baseline configurations whose run stopped without a status row (a baseline cut short or damaged:
    ``write_baseline`` keeps completed runs only): fails."""
    failed: list[str] = field(default_factory=list)
    """Candidate configurations that the baseline lacks, none of whose runs completed, failed (not refused as
    invalid: a suite may hold configurations its checker refuses by design): fails. Where the baseline has them
    they are ``missing``."""
    false_alarm: float | None = None
    """The false-alarm rate the noise-modelled comparisons were held to (None: there were none)."""


def gate(
    baseline: list[dict],
    candidate: list[dict],
    timing_tolerance: float = 0.05,
    gate_timing: bool = True,
    false_alarm: float = 0.001,
) -> GateResult:
    """Compare ``candidate`` with ``baseline`` run by run (matched by config hash) and metric by metric; the
    noise-modelled comparisons share the false-alarm rate ``false_alarm`` (``bench/noise.py``)."""
    sides = {}
    for side, rows in (("baseline", baseline), ("candidate", candidate)):
        try:
            sides[side] = summarize(rows)
        except ConfigError as e:
            raise ConfigError(f"{side}: {e}") from None
    b, c = sides["baseline"], sides["candidate"]
    check_hardware(b, c)
    for key in b.keys() & c.keys():
        for m, unit in c[key]["units"].items():
            if b[key]["units"].get(m, unit) != unit:
                raise ConfigError(
                    f"{c[key]['label']}: {m} is in {unit} in the candidate and {b[key]['units'][m]} in the baseline: "
                    "rows of another version or edited by hand; record the baseline again"
                )
    res = GateResult([])
    for key, cd in c.items():
        label = b[key]["label"] if key in b else cd["label"]  # a run without a status row has no label of its own
        for run_id, (status, reason) in cd["not_ok"].items():
            res.not_completed.append(f"{label} (run {run_id}: {status}{': ' + reason if reason else ''})")
    for key, cd in c.items():
        if key not in b and cd["ok"]:
            res.not_in_baseline.append(f"{cd['label']} (no run of this configuration in the baseline)")
        elif key not in b and {status for status, _ in cd["not_ok"].values()} - {INVALID}:
            res.failed.append(f"{cd['label']} ({_statuses(cd)}; not in the baseline)")
    for key, bd in b.items():
        if not bd["ok"]:
            stopped = INCOMPLETE in {status for status, _ in bd["not_ok"].values()}
            (res.damaged if stopped else res.not_compared).append(
                f"{bd['label']} (the baseline's run is {_statuses(bd)})"
            )
            cd = c.get(key)  # the candidate ran it and none of its runs completed: a failure, whatever the baseline's
            if cd is not None and not cd["ok"] and {status for status, _ in cd["not_ok"].values()} - {INVALID}:
                res.failed.append(f"{cd['label'] or bd['label']} ({_statuses(cd)}; the baseline's run failed too)")
            continue
        cd = c.get(key)
        if cd is None or not cd["ok"]:
            res.missing.append(bd["label"])
            continue
        _compare_run(bd, cd, key, timing_tolerance, gate_timing, res)
    _apply_noise(res, b, false_alarm, gate_timing)
    return res


def check_hardware(b: dict[str, dict], c: dict[str, dict]) -> None:
    """Refuse, in one line, a comparison across machines (``summarize``'s ``hardware``: the classes a configuration's
    completed runs were measured on). Whole sides first: a baseline of other classes than the candidate's, a side
    without hardware provenance beside one with it. Then per configuration, naming its run, since classes that other
    configurations cover say nothing of this one's: rows without hardware provenance beside rows with it (on either
    side), a configuration measured on another class than the baseline's run of it, and one measured on a class the
    other side has no run on (one side of two machines)."""
    hb = set().union(*(d["hardware"] for d in b.values() if d["ok"])) - {None}
    hc = set().union(*(d["hardware"] for d in c.values() if d["ok"])) - {None}
    if hb and hc and hb.isdisjoint(hc):
        raise ConfigError(
            f"baseline is for {', '.join(sorted(hb))} but the candidate ran on {', '.join(sorted(hc))}: "
            f"use results/baselines/{min(hc)}.jsonl or record one with --write-baseline"
        )
    if hb and not hc and any(d["ok"] for d in c.values()):
        raise ConfigError(
            f"the candidate's rows carry no hardware provenance, the baseline is for {', '.join(sorted(hb))}: "
            "rows not written by zerobench's runs (or damaged); gate a sweep's own results"
        )
    if hc and not hb and any(d["ok"] for d in b.values()):
        raise ConfigError(
            f"the baseline's rows carry no hardware provenance, the candidate ran on {', '.join(sorted(hc))}: "
            "a baseline not written by --write-baseline from a sweep (or damaged); record it again"
        )
    for side, mine in (("candidate", c), ("baseline", b)):
        for d in mine.values():
            if d["ok"] and None in d["hardware"] and hb | hc:
                raise ConfigError(
                    f"{_name(d)} in the {side} has rows without hardware provenance beside runs of "
                    f"{', '.join(sorted(hb | hc))}: rows not written by zerobench's runs (or damaged); "
                    + ("gate a sweep's own results" if side == "candidate" else "record the baseline again")
                )
    for key, cd in c.items():
        bd = b.get(key)
        if cd["ok"] and bd is not None and bd["ok"] and cd["hardware"] != bd["hardware"]:
            raise ConfigError(
                f"{_name(cd)} ran on {_classes(cd)} in the candidate and on {_classes(bd)} in the baseline: a "
                "configuration is compared on the machine class its baseline was measured on; gate it against a "
                f"baseline of {_classes(cd)} or record one with --write-baseline"
            )
    for side, mine, other, there in (("candidate", c, "baseline", hb), ("baseline", b, "candidate", hc)):
        for d in mine.values():
            if d["ok"] and there and d["hardware"] - there:
                raise ConfigError(
                    f"{_name(d)} ran on {_classes(d)} in the {side}, where the {other} has no run ("
                    f"{', '.join(sorted(there))} only): a gate run compares one machine class; gate each machine's "
                    "runs against a baseline of it"
                )


def _name(d: dict) -> str:
    run = d.get("run_id")
    return d["label"] if run is None or run == d["label"] else f"{d['label']} (run {run})"


def _classes(d: dict) -> str:
    return ", ".join(sorted(map(str, d["hardware"])))


def _ranks(ranks: frozenset) -> str:
    return ", ".join(str(r) for r in sorted(ranks, key=str)) or "none"


def _statuses(d: dict) -> str:
    return ", ".join(sorted({status for status, _ in d["not_ok"].values()})) or "absent"


def _compare_run(bd: dict, cd: dict, key: str, timing_tolerance: float, gate_timing: bool, res: GateResult) -> None:
    label = cd["label"] or bd["label"]
    for m in GATED:
        # a 16-bit run's loss is not held to 1e-4 (its rounding differs between runs), but it is held finite
        loose_loss = m == "final_loss" and bd["config"].get("zero", {}).get("precision") != "fp32"
        if m not in bd or bd[m] is None:
            if cd.get(m) is not None:
                res.not_in_baseline.append(f"{label}: {m}")
            continue
        if cd.get(m) is None:
            res.missing.append(f"{label}: {m}")
            continue
        rb, rc = bd["ranks"].get(m), cd["ranks"].get(m)
        if rb is not None and rc is not None and rb != rc:  # a rank's rows lost: its share of a sum or a max is gone
            res.missing.append(f"{label}: {m} (measured on ranks {_ranks(rc)}, the baseline on {_ranks(rb)})")
            continue
        if not (math.isfinite(cd[m]) and math.isfinite(bd[m])):
            res.comparisons.append(Comparison(key, label, m, bd[m], cd[m], 0.0, "not finite"))
            continue
        if loose_loss:
            continue
        modelled = m in bd["noise"] and bd["noise"][m].get("n", 0) >= 2
        if m in EXACT:
            tol, basis = 0.0, "exact"
        elif m == "peak_memory_bytes":
            tol, basis = 0.02, "2%"
        elif m == "final_loss":
            tol, basis = 1e-4, "1e-4"
        elif m == "step_time_ratio":
            # the baseline's spread sets the tolerance; a candidate whose own spread would hide the change is
            # too noisy to judge, never "ok" (its per-step spread must not widen its own tolerance)
            tol = max(timing_tolerance, 3 * bd.get("ratio_se", 0) * math.sqrt(2))
            own = 3 * cd.get("ratio_se", 0) * math.sqrt(2)
            verdict = _verdict(m, bd[m], cd[m], tol, gate_timing)
            hidden = verdict != "ok" and own > tol and _verdict(m, bd[m], cd[m], own, gate_timing) == "ok"
            if hidden or (verdict == "ok" and tol > MAX_TOLERANCE):
                verdict = "too noisy"
            res.comparisons.append(Comparison(key, label, m, bd[m], cd[m], tol, verdict, "timing"))
            continue
        elif not modelled:  # a host-work metric moves between unchanged runs: without a noise model, not judged
            res.comparisons.append(Comparison(key, label, m, bd[m], cd[m], math.nan, "no noise model", "none"))
            continue
        else:
            tol, basis = 0.0, "noise"  # set by _apply_noise, which knows how many comparisons share the rate
        res.comparisons.append(
            Comparison(key, label, m, bd[m], cd[m], tol, _verdict(m, bd[m], cd[m], tol, gate_timing), basis)
        )


def _verdict(m: str, base: float, cand: float, tol: float, gate_timing: bool) -> str:
    change = cand / base - 1 if base else (0.0 if cand == 0 else math.inf)
    if m == "final_loss":
        return "regression" if abs(change) > tol else "ok"
    if change > tol:
        return "regression" if (gate_timing or m != "step_time_ratio") else "slower"
    # symmetric in ratio for timings: worse than x(1+tol) regresses, better than /(1+tol) improves
    if (m == "step_time_ratio" and cand * (1 + tol) < base) or (m != "step_time_ratio" and change < -tol):
        return "improved"
    return "ok"


def _apply_noise(res: GateResult, b: dict[str, dict], false_alarm: float, gate_timing: bool) -> None:
    """Set the tolerance of every comparison the baseline has a noise model for: a metric that moved between the
    unchanged runs (sigma > 0) gets the noise model's tolerance, the false-alarm rate shared by all of them
    (Bonferroni); one that never moved keeps its rule, and a host-work metric known to move (``MODELLED``) its
    floor."""
    idx = {
        i
        for i, x in enumerate(res.comparisons)
        if x.verdict not in ("not finite", "no noise model") and _sigma(b[x.key], x.metric)[0] > 0
    }
    res.false_alarm = false_alarm if idx else None
    for i, x in enumerate(res.comparisons):
        wide = False
        if i in idx:
            sigma, n = _sigma(b[x.key], x.metric)
            tol = max(x.tolerance, noise.tolerance(x.metric, sigma, n, false_alarm / len(idx), center=x.baseline))
            wide = noise.factor(n, false_alarm / len(idx)) * sigma > MAX_TOLERANCE  # the noise, not a floor
            basis = f"noise: {n} runs, sigma {sigma:.2%}"
        elif x.basis == "noise":
            tol, basis = noise.floor(x.metric, x.baseline), f"floor (noise 0 in {_sigma(b[x.key], x.metric)[1]} runs)"
        else:
            continue
        verdict = _verdict(x.metric, x.baseline, x.candidate, tol, gate_timing)
        if wide and verdict == "ok":  # noise that hides a doubling: not a judgement
            verdict = "too noisy"
        if x.verdict == "too noisy":  # the step-time rule's own finding (a tolerance over 100%, a change the
            verdict = "too noisy"  # candidate's spread hides) stands: a noise model does not make it a judgement
        res.comparisons[i] = Comparison(x.key, x.label, x.metric, x.baseline, x.candidate, tol, verdict, basis)


def _sigma(d: dict, metric: str) -> tuple[float, int]:
    row = d["noise"].get(metric)
    if row is None or (row.get("n") or 0) < 2 or row.get("value") is None:
        return 0.0, int(row.get("n") or 0) if row else 0
    return float(row["value"]), int(row["n"])
