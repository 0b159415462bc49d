"""The performance regression gate: candidate rows vs a per-hardware baseline, metric by metric.

Runs are matched by their resolved-config hash. Rules, per metric:

| metric | direction | rule |
|---|---|---|
| ``model_state_bytes`` (max over ranks) | lower | exact: deterministic |
| ``comm_volume_elements_per_step`` (max over ranks) | lower | exact: deterministic |
| ``peak_memory_bytes`` (max over ranks) | lower | 2%: the live-tensor tracker is deterministic per torch version |
| ``final_loss`` (fp32 runs) | equal | 1e-4 relative: kernels differ slightly across CPUs |
| ``step_time_ratio`` | lower | the run's median step time / the stage-0 run's with the same model, DP, TP and precision *in the same sweep*; absolute times drift across machines, ratios measured side by side do not. Tolerance max(``timing_tolerance``, 3 x the ratio's standard error from the per-step spread), symmetric in ratio: slower than x(1+tol) regresses, faster than /(1+tol) improves. |

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
from pathlib import Path

from zerobench.bench.stats import relative_se_from_mad
from zerobench.config import ConfigError
from zerobench.results.outdir import check_writable_file
from zerobench.results.rows import read_rows
from zerobench.results.status import OK, STATUS_METRIC, statuses

EXACT = ("model_state_bytes", "comm_volume_elements_per_step")
GATED = (*EXACT, "peak_memory_bytes", "final_loss", "step_time_ratio")


@dataclass(frozen=True)
class Comparison:
    key: str
    label: str
    metric: str
    baseline: float
    candidate: float
    tolerance: float
    verdict: str  # ok / regression / improved

    @property
    def change(self) -> float:
        return (self.candidate / self.baseline - 1) if self.baseline else (0.0 if self.candidate == 0 else math.inf)


def _rows(path: str | Path) -> list[dict]:
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"no results at {p}")
    try:
        rows = read_rows(p)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not rows:
        raise ConfigError(f"{p}: no result rows (empty file or directory)")
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or "metric" not in r or "config_hash" not in r:
            raise ConfigError(f"{p}: row {i + 1} is not a zerobench result row (needs metric and config_hash)")
    return rows


def _nan(v) -> bool:
    return isinstance(v, float) and math.isnan(v)


def summarize(rows: list[dict]) -> dict[str, dict]:
    """Per configuration (config hash): the gated metrics of its ``ok`` runs, a label, what the timing ratio
    needs, whether any run completed (``ok``) and the runs that did not (``not_ok``: run id -> status, reason)."""
    status = statuses(rows)
    runs: dict[str, dict] = {}
    for r in rows:
        run_status, reason = status[(r.get("run_id"), r["config_hash"])]
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
            },
        )
        m, v = r["metric"], r.get("value")
        if run_status != OK:
            d["not_ok"][r.get("run_id")] = (run_status, reason)
            continue
        d["ok"] = True
        if m == STATUS_METRIC:
            d["label"] = r.get("label") or d["label"]
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


def compare(
    baseline: list[dict], candidate: list[dict], timing_tolerance: float = 0.05, gate_timing: bool = True
) -> tuple[list[Comparison], list[str]]:
    """The comparisons and what is missing from the candidate (``gate`` has the rest)."""
    res = gate(baseline, candidate, timing_tolerance, gate_timing)
    return res.comparisons, res.missing


def gate(
    baseline: list[dict], candidate: list[dict], timing_tolerance: float = 0.05, gate_timing: bool = True
) -> GateResult:
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
        if m in EXACT:
            tol = 0.0
        elif m == "peak_memory_bytes":
            tol = 0.02
        elif m == "final_loss":
            tol = 1e-4
        else:
            tol = max(timing_tolerance, 3 * max(bd.get("ratio_se", 0), cd.get("ratio_se", 0)) * math.sqrt(2))
        change = cd[m] / bd[m] - 1 if bd[m] else (0.0 if cd[m] == 0 else math.inf)
        # symmetric in ratio: worse than x(1+tol) regresses, better than /(1+tol) improves
        better = cd[m] * (1 + tol) < bd[m]
        if m == "final_loss":
            verdict = "regression" if abs(change) > tol else "ok"
        elif change > tol:
            verdict = "regression" if (gate_timing or m != "step_time_ratio") else "slower"
        elif (m == "step_time_ratio" and better) or (m != "step_time_ratio" and change < -tol):
            verdict = "improved"
        else:
            verdict = "ok"
        res.comparisons.append(Comparison(key, label, m, bd[m], cd[m], tol, verdict))


def format_table(comps: list[Comparison], only_moved: bool = False) -> str:
    lines = [f"  {'run':<28} {'metric':<30} {'baseline':>14} {'candidate':>14} {'change':>9} {'tol':>7}  verdict"]
    for x in comps:
        if only_moved and x.verdict == "ok":
            continue
        lines.append(
            f"  {str(x.label)[:28]:<28} {x.metric:<30} {x.baseline:14.6g} {x.candidate:14.6g} "
            f"{x.change * 100:+8.2f}% {x.tolerance * 100:6.2f}%  {x.verdict.upper() if x.verdict != 'ok' else 'ok'}"
        )
    return "\n".join(lines)


BASELINE_METRICS = {
    "run_status",
    "loss",
    "step_time_s",
    "model_state_bytes",
    "comm_volume_elements_per_step",
    "peak_memory_bytes",
}


def write_baseline(candidate_rows: list[dict], path: str | Path) -> int:
    """Keep the rows the gate reads, of runs whose status is ``ok`` only, one JSON row per line."""
    status = statuses(candidate_rows)
    keep = [
        r
        for r in candidate_rows
        if r["metric"] in BASELINE_METRICS
        and r.get("status", "ok") == "ok"
        and status[(r.get("run_id"), r.get("config_hash"))][0] == OK
    ]
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))
    return len(keep)


def run_gate(
    baseline: str,
    candidate: str,
    timing_tolerance: float,
    propose: str | None,
    timing: str = "gate",
    strict: bool = False,
) -> int:
    """Print the gate's verdicts; 1 on a regression, a non-finite value or something missing from the candidate
    (and, when ``strict``, on anything not in the baseline), else 0."""
    for p in (baseline, candidate):
        if not Path(p).exists():
            raise ConfigError(f"no results at {p}")
    proposal = (
        Path(propose)
        if propose
        else Path(candidate if Path(candidate).is_dir() else Path(candidate).parent) / "proposed-baseline.jsonl"
    )
    check_writable_file(
        proposal,
        "--propose" if propose else None,
        "proposed baseline",
        "choose a writable path" if propose else "give --propose FILE",
    )
    base_rows, cand_rows = _rows(baseline), _rows(candidate)
    res = gate(base_rows, cand_rows, timing_tolerance, gate_timing=timing == "gate")
    comps = res.comparisons
    if not comps:
        raise ConfigError(f"no run of {candidate} matches a run of the baseline {baseline} (different configs?)")
    regressions = [x for x in comps if x.verdict in ("regression", "not finite")]
    improved = [x for x in comps if x.verdict in ("improved", "slower")]
    print(
        f"regression gate: {len(comps)} comparisons over {len({x.key for x in comps})} runs; "
        f"{len(regressions)} regressions, {len(improved)} improvements"
    )
    print(
        format_table(comps, only_moved=bool(regressions or improved))
        if (regressions or improved)
        else format_table(comps)
    )
    for label in res.missing:
        print(f"  missing: {label} (in the baseline, not completed in the candidate)")  # a run, or a run's metric
    for label in res.not_completed:
        print(f"  not completed: {label}")
    for label in res.not_compared:
        print(f"  not compared: {label}")
    for label in res.not_in_baseline:
        print(f"  not in the baseline: {label}" + (" (fails: --strict)" if strict else ""))
    n = write_baseline(cand_rows, proposal)
    if improved:
        print(f"improvements beyond tolerance: update the baseline? proposed: {proposal} ({n} rows)")
    else:
        print(f"proposed baseline written to {proposal} ({n} rows)")
    return 1 if regressions or res.missing or (strict and res.not_in_baseline) else 0
