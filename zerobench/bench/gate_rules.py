"""The performance regression gate's rules: candidate rows vs a per-hardware baseline, metric by metric.

Runs are matched by their resolved-config hash. Rules, per metric:

| metric | direction | rule |
|---|---|---|
| ``model_state_bytes`` (max over ranks) | lower | exact: deterministic |
| ``comm_volume_elements_per_step`` (max over ranks) | lower | exact: deterministic |
| ``peak_memory_bytes`` (max over ranks) | lower | 2%: the live-tensor tracker is deterministic per torch version |
| ``final_loss`` (fp32 runs) | equal | 1e-4 relative: kernels differ slightly across CPUs |
| ``step_time_ratio`` | lower | the run's median step time / the stage-0 run's with the same model, DP, TP and precision *in the same sweep*; absolute times drift across machines, ratios measured side by side do not. Tolerance max(``timing_tolerance``, 3 x the ratio's standard error from the per-step spread), symmetric in ratio: slower than x(1+tol) regresses, faster than /(1+tol) improves. |
| ``ops_dispatched``, ``allocations``, ``allocated_bytes``, ``collective_calls``, ``collective_bytes`` (sum over ranks; per phase as ``name.phase``) | lower | exact: counts of the counted step that do not depend on the machine's load (``train/probes.py``) |
| ``py_calls``, ``host_cpu_s``, ``instructions`` (sum over ranks; per phase as ``name.phase``) | lower | against the baseline's noise model (``bench/noise.py``): max(floor, k x sigma of unchanged runs); not gated without one. ``instructions`` come from runs under callgrind (``zerobench sweep --instructions``, rows tagged ``instrumented``), the rest from timed runs |

A baseline recorded from several unchanged runs carries a noise model: per configuration and metric the values
of every run (``gate_noise`` rows, ``bench/noise.py``). Its mean is then the baseline value, and every metric
moved by more than its noise allows at a false-alarm rate ``false_alarm`` for the whole gate run; a metric that
never moved stays exact.

A change beyond tolerance in the bad direction is a regression (exit 1); in the good direction it is
flagged ("update the baseline?"). A candidate value that is not finite (a diverged run's NaN loss, a NaN or
infinite measurement, on any rank; or a baseline's) fails as ``NOT FINITE``, and a gated metric the baseline
has but the candidate's run lacks fails as missing: neither is ever compared away as "ok". Only runs whose
status is ``ok`` are compared (``results/status.py``): a candidate run that failed, or is incomplete (no
``run_status`` row), is listed as not completed, and fails as missing where the baseline has the run. What
the candidate has and the baseline lacks (a run, or a gated metric of a run) is listed as "not in the
baseline": there is nothing to compare it with, so it does not fail the gate unless ``strict`` (as pytorch's
pr_time_benchmarks report a benchmark without an expected value). Either way a proposed new baseline is
written. With ``timing="report"`` step-time changes are shown ("SLOWER") but do not
fail the gate: for baselines recorded in another session or on another machine of a noisy class (2-core CPUs:
step-time ratios of tiny runs moved 80-90% between sessions here), where only same-session timing comparisons
mean anything.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from zerobench.bench import noise
from zerobench.bench.stats import relative_se_from_mad
from zerobench.config import ConfigError
from zerobench.results.status import OK, STATUS_METRIC, status_of

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


@dataclass(frozen=True)
class Comparison:
    key: str
    label: str
    metric: str
    baseline: float
    candidate: float
    tolerance: float
    verdict: str  # ok / regression / improved / slower / not finite / no noise model
    basis: str = ""
    """Where the tolerance comes from: ``exact``, a fixed rule, or the noise model (runs, sigma)."""

    @property
    def change(self) -> float:
        return (self.candidate / self.baseline - 1) if self.baseline else (0.0 if self.candidate == 0 else math.inf)


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def _run_key(r: dict) -> tuple:
    """A run in the gate's rows: (run id, config hash, the tool it ran under). A run timed and the same run counted
    under callgrind (``sweep --instructions``, rows tagged ``instrumented``) share run id and configuration when
    one directory holds both sweeps; each keeps its own status, so a failed instrumented run is named as such and
    its timed twin is still compared."""
    return (r.get("run_id"), r.get("config_hash"), r.get("instrumented") or "")


def _run_statuses(rows: list[dict]) -> dict[tuple, tuple[str | None, str | None]]:
    """Each ``_run_key``'s status. Rows without a status row of their own take the status of the same run's rows
    under another tool that have one, the untagged ones first: an instrumented run's rows from sweeps before the
    runner tagged its status row, and the untagged noise-model rows a baseline of instrumented runs carries."""
    by: dict[tuple, list[dict]] = {}
    for r in rows:
        by.setdefault(_run_key(r), []).append(r)
    out = {k: status_of(rs) for k, rs in by.items()}
    recorded = [k for k, rs in by.items() if any(r.get("metric") == STATUS_METRIC for r in rs)]
    twin = {k[:2]: out[k] for k in sorted(recorded, key=lambda k: k[2], reverse=True)}  # untagged written last
    for k in by.keys() - set(recorded):
        out[k] = twin.get(k[:2], out[k])
    return out


def summarize(rows: list[dict]) -> dict[str, dict]:
    """Per configuration (config hash): the gated metrics of its ``ok`` runs, a label, what the timing ratio
    needs, whether any run completed (``ok``) and the runs that did not (``not_ok``: run id -> status, reason)."""
    status = _run_statuses(rows)
    runs: dict[str, dict] = {}
    for r in rows:
        run_status, reason = status[_run_key(r)]
        if (r.get("status", "ok") != "ok" and r["metric"] != STATUS_METRIC) or run_status is None:
            continue  # a failed row, or rows of no training run (no status applies: results/status.py)
        hardware = (r.get("provenance") or {}).get("hardware", {}).get("class")
        d = runs.setdefault(
            r["config_hash"],
            {
                "label": r.get("label") or r.get("run_id"),
                "config": r.get("config", {}),
                "hardware": hardware,
                "ok": False,
                "not_ok": {},
                "noise": {},
                "_ranks": {},
            },
        )
        m, v = r["metric"], r.get("value")
        if run_status != OK:
            d["not_ok"][f"{r.get('run_id')}{' under ' + r['instrumented'] if r.get('instrumented') else ''}"] = (
                run_status,
                reason,
            )
            continue
        d["ok"] = True
        if r.get("instrumented") and m not in ("instructions", STATUS_METRIC):
            continue  # a run under callgrind: only its instruction counts are measurements
        if m == STATUS_METRIC:
            d["label"] = r.get("label") or d["label"]
        elif m == noise.NOISE_METRIC:
            d["noise"][r.get("of")] = r
        elif "phase" in r and m in (*COUNTS, *MODELLED):  # per rank and phase: summed over ranks below
            key = m if r["phase"] == "step" else f"{m}.{r['phase']}"
            d["_ranks"].setdefault(key, {})[r.get("rank")] = v
        elif m in EXACT or m == "peak_memory_bytes":
            if v is not None:  # max over ranks; a NaN on any rank stays NaN, whatever the rows' order
                d[m] = v if m not in d or v > d[m] or _nan(v) else d[m]
        elif m == "loss":  # the last step's; a NaN on any rank at that step stays
            step, last = r.get("step", 0), d.get("_loss_step", -1)
            if step > last or (step == last and not _nan(d.get("final_loss"))):
                d["_loss_step"], d["final_loss"] = step, v
        elif m == "step_time_s":
            d["step_time_s"], d["mad"], d["n"] = v, r.get("mad") or 0.0, r.get("n") or 1

    # timing as a ratio to the stage-0 run of the same shape in the same results
    def shape(c: dict) -> tuple:
        return (
            json.dumps(c.get("model"), sort_keys=True),
            c.get("dp"),
            c.get("tp"),
            c.get("system"),
            json.dumps({k: v for k, v in c.get("zero", {}).items() if k != "stage"}, sort_keys=True),
        )

    ref = {
        shape(d["config"]): d
        for d in runs.values()
        if d["config"].get("zero", {}).get("stage") == 0 and "step_time_s" in d
    }
    for d in runs.values():
        base = ref.get(shape(d["config"]))
        if base is not None and "step_time_s" in d and d is not base:
            d["step_time_ratio"] = d["step_time_s"] / base["step_time_s"]
            d["ratio_se"] = math.hypot(
                relative_se_from_mad(d["mad"], d["step_time_s"], d["n"]),
                relative_se_from_mad(base["mad"], base["step_time_s"], base["n"]),
            )
        for key, per_rank in d.pop("_ranks").items():  # None on any rank: not measured there, no sum
            d[key] = None if any(v is None for v in per_rank.values()) else sum(per_rank.values())
        for key, row in d["noise"].items():  # a noise model's mean is the baseline's value
            if key in GATED and row.get("center") is not None:
                d[key] = row["center"]
    return runs


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
    """Baseline configurations without an ``ok`` run: listed, nothing to compare against."""
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
    b, c = summarize(baseline), summarize(candidate)
    hb = {d["hardware"] for d in b.values()} - {None}
    hc = {d["hardware"] for d in c.values()} - {None}
    if hb and hc and hb != hc:
        raise ConfigError(
            f"baseline is for {', '.join(sorted(hb))} but the candidate ran on {', '.join(sorted(hc))}: "
            f"use results/baselines/{min(hc)}.jsonl or record one with --write-baseline"
        )
    res = GateResult([])
    for key, cd in c.items():
        label = b[key]["label"] if key in b else cd["label"]  # a run without a status row has no label of its own
        for run_id, (status, reason) in cd["not_ok"].items():
            res.not_completed.append(f"{label} (run {run_id}: {status}{': ' + reason if reason else ''})")
    for key, cd in c.items():
        if key not in b and cd["ok"]:
            res.not_in_baseline.append(f"{cd['label']} (no run of this configuration in the baseline)")
    for key, bd in b.items():
        if not bd["ok"]:
            res.not_compared.append(f"{bd['label']} (the baseline's run is {_statuses(bd)})")
            continue
        cd = c.get(key)
        if cd is None or not cd["ok"]:
            res.missing.append(bd["label"])
            continue
        _compare_run(bd, cd, key, timing_tolerance, gate_timing, res)
    _apply_noise(res, b, false_alarm, gate_timing)
    return res


def _statuses(d: dict) -> str:
    return ", ".join(sorted({status for status, _ in d["not_ok"].values()})) or "absent"


def _compare_run(bd: dict, cd: dict, key: str, timing_tolerance: float, gate_timing: bool, res: GateResult) -> None:
    label = cd["label"] or bd["label"]
    for m in GATED:
        if m == "final_loss" and bd["config"].get("zero", {}).get("precision") != "fp32":
            continue
        if m not in bd or bd[m] is None:
            if cd.get(m) is not None:
                res.not_in_baseline.append(f"{label}: {m}")
            continue
        if cd.get(m) is None:
            res.missing.append(f"{label}: {m}")
            continue
        if not (math.isfinite(cd[m]) and math.isfinite(bd[m])):
            res.comparisons.append(Comparison(key, label, m, bd[m], cd[m], 0.0, "not finite"))
            continue
        modelled = m in bd["noise"] and bd["noise"][m].get("n", 0) >= 2
        if m in EXACT:
            tol, basis = 0.0, "exact"
        elif m == "peak_memory_bytes":
            tol, basis = 0.02, "2%"
        elif m == "final_loss":
            tol, basis = 1e-4, "1e-4"
        elif m == "step_time_ratio":
            tol = max(timing_tolerance, 3 * max(bd.get("ratio_se", 0), cd.get("ratio_se", 0)) * math.sqrt(2))
            basis = "timing"
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
        if i in idx:
            sigma, n = _sigma(b[x.key], x.metric)
            tol = max(x.tolerance, noise.tolerance(x.metric, sigma, n, false_alarm / len(idx), center=x.baseline))
            basis = f"noise: {n} runs, sigma {sigma:.2%}"
        elif x.basis == "noise":
            tol, basis = noise.floor(x.metric, x.baseline), f"floor (noise 0 in {_sigma(b[x.key], x.metric)[1]} runs)"
        else:
            continue
        res.comparisons[i] = Comparison(
            x.key,
            x.label,
            x.metric,
            x.baseline,
            x.candidate,
            tol,
            _verdict(x.metric, x.baseline, x.candidate, tol, gate_timing),
            basis,
        )


def _sigma(d: dict, metric: str) -> tuple[float, int]:
    row = d["noise"].get(metric)
    if row is None or (row.get("n") or 0) < 2 or row.get("value") is None:
        return 0.0, int(row.get("n") or 0) if row else 0
    return float(row["value"]), int(row["n"])
