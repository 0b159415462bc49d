"""``zerobench regress``'s stored-baseline gate: reading rows, printing the verdicts (and writing them as rows),
recording a baseline with the noise model of several unchanged runs. The rules, per metric, are
``bench/gate_rules.py``'s; the noise model's statistics ``bench/noise.py``'s."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Sequence
from pathlib import Path

from zerobench.bench import noise
from zerobench.bench.baseline_file import BASELINE_METRICS, check_baseline_path
from zerobench.bench.gate_inputs import (
    check_one_version,
    check_same_kernels,
    check_same_source,
    check_whole,
    one_sided,
)
from zerobench.bench.gate_rules import (
    GATED,
    MAX_TOLERANCE,
    Comparison,
    GateResult,
    gate,
    run_key,
    run_statuses,
    summarize,
)
from zerobench.config import ConfigError
from zerobench.files import replace_file
from zerobench.results.rows import read_rows
from zerobench.results.status import OK, STATUS_METRIC


def _rows(path: str | Path, whole: str | None = None) -> list[dict]:
    """The rows at ``path``. ``whole``: what the file is, where it must be as it was recorded (a baseline): a torn
    last row is refused instead of skipped (``read_rows``)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"no results at {p}")
    try:
        rows = read_rows(p, whole=whole)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not rows:
        raise ConfigError(f"{p}: no result rows (empty file or directory)")
    for i, r in enumerate(rows):
        if not isinstance(r, dict) or "metric" not in r or "config_hash" not in r:
            raise ConfigError(f"{p}: row {i + 1} is not a zerobench result row (needs metric and config_hash)")
    return rows


def compare(
    baseline: list[dict], candidate: list[dict], timing_tolerance: float = 0.05, gate_timing: bool = True
) -> tuple[list[Comparison], list[str]]:
    """The comparisons and what is missing from the candidate (``gate`` has the rest)."""
    res = gate(baseline, candidate, timing_tolerance, gate_timing)
    return res.comparisons, res.missing


def format_table(comps: list[Comparison], only_moved: bool = False) -> str:
    head = f"  {'run':<28} {'metric':<30} {'baseline':>14} {'candidate':>14} {'change':>9} {'tol':>7}  "
    lines = [head + f"{'verdict':<12} basis"]
    for x in comps:
        if only_moved and x.verdict in ("ok", "no noise model"):
            continue
        tol = f"{x.tolerance * 100:6.2f}%" if math.isfinite(x.tolerance) else f"{'-':>7}"
        verdict = x.verdict.upper() if x.verdict not in ("ok", "no noise model") else x.verdict
        lines.append(
            f"  {str(x.label)[:28]:<28} {x.metric:<30} {x.baseline:14.6g} {x.candidate:14.6g} "
            f"{x.change * 100:+8.2f}% {tol}  {verdict:<12} {x.basis}"
        )
    return "\n".join(lines)


def write_baseline(
    candidate_rows: list[dict],
    path: str | Path,
    more: Sequence[list[dict]] = (),
    whole: bool = False,
    carried: Sequence[dict] = (),
) -> int:
    """Keep the rows the gate reads, of runs whose status is ``ok`` only, one JSON row per line; with ``more``
    (the rows of further unchanged runs of the same suite) add the noise model: ``noise_rows``; ``carried``: noise
    rows kept from an earlier baseline (``recentred_noise``). ``whole`` (``--write-baseline``; not a gate's
    ``--propose``, which keeps what passed): refuse a candidate with a configuration none of whose runs completed,
    and samples of another hardware class or commit than the first."""
    status = run_statuses(candidate_rows)  # each tool's run its own: a timed run's retry, its callgrind twin
    if whole:
        summarize(candidate_rows)  # what the gate refuses in a baseline (two completed runs of one configuration, ...)
        check_whole(candidate_rows, status)
        check_same_source([candidate_rows, *more])
        check_same_kernels([candidate_rows, *more], [f"--candidate result {i + 1}" for i in range(1 + len(more))])
    keep = [
        r
        for r in candidate_rows
        if r["metric"] in BASELINE_METRICS and r.get("status", "ok") == "ok" and status[run_key(r)][0] == OK
    ]
    if more:
        keep += noise_rows([candidate_rows, *more])[0]
    keep += carried
    replace_file(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in keep))
    return len(keep)


def recentred_noise(base_rows: list[dict], cand_rows: list[dict]) -> list[dict]:
    """The baseline's noise model (``gate_noise`` rows) for the candidate's proposal: each row of a configuration
    and metric the candidate measured (a completed run), its centre moved to the candidate's value; a proposal
    without them would gate host work no more once adopted."""
    try:
        cand = summarize(cand_rows)
    except ConfigError:
        return []
    out = []
    for r in base_rows:
        if r.get("metric") != noise.NOISE_METRIC:
            continue
        d = cand.get(r.get("config_hash"))
        value = d.get(r.get("of")) if d is not None and d["ok"] else None
        if value is not None and math.isfinite(value):
            out.append(dict(r, center=value))
    return out


def noise_rows(samples: Sequence[list[dict]]) -> tuple[list[dict], list[str]]:
    """The noise model of unchanged runs ``samples`` (each the rows of one sweep of the same suite): one
    ``gate_noise`` row per configuration and gated metric measured in at least two of them, and what was
    measured in fewer (``run: metric (in k of K runs)``)."""
    summaries = [summarize(rs) for rs in samples]
    out, gaps = [], []
    keys = dict.fromkeys(k for S in summaries for k in S)  # every configuration any run has, in first-seen order
    for key in keys:
        oks = [(S[key], rs) for S, rs in zip(summaries, samples) if key in S and S[key]["ok"]]
        if not oks:
            continue
        d0, rows0 = oks[0]
        done = run_statuses(rows0)
        mine = [r for r in rows0 if r["config_hash"] == key]
        template = next(  # the completed timed run's identity (a failed attempt's would leave the model orphaned)
            (r for r in mine if not r.get("instrumented") and done[run_key(r)][0] == OK),
            next((r for r in mine if done[run_key(r)][0] == OK), mine[0]),
        )
        for m in GATED:
            # a metric is modelled when any run measured it; fewer than two runs that did is a gap
            if m == "final_loss" or all(d.get(m) is None for d, _ in oks):
                continue
            vals = [S[key][m] for S in summaries if key in S and S[key]["ok"] and S[key].get(m) is not None]
            vals = [v for v in vals if math.isfinite(v)]
            if len(vals) < 2:
                gaps.append(f"{d0['label']}: {m} (in {len(vals)} of {len(samples)} runs)")
                continue
            center, sigma = noise.spread(vals)
            out.append(
                {
                    k: template[k]
                    for k in ("config", "config_hash", "run_id", "label", "suite", "schema", "provenance")
                    if k in template
                }
                | {
                    "metric": noise.NOISE_METRIC,
                    "of": m,
                    "value": sigma,
                    "unit": "relative",
                    "status": "ok",
                    "center": center,
                    "samples": vals,
                    "n": len(vals),
                    "definition": "standard deviation of value / mean over unchanged runs (bench/noise.py); "
                    "center: their mean, the baseline's value",
                }
            )
    return out, gaps


def run_gate(
    baseline: str,
    candidate: str,
    timing_tolerance: float,
    propose: str | None,
    timing: str = "gate",
    strict: bool = False,
    false_alarm: float = 0.001,
    out: str | None = None,
) -> int:
    """Print the gate's verdicts; 1 on a regression, a non-finite value, something missing from the candidate, a
    configuration of the candidate none of whose runs completed, or a baseline run that never did (and, when
    ``strict``, on anything not in the baseline), else 0. ``out``: also write them as rows there."""
    for p in (baseline, candidate):
        if not Path(p).exists():
            raise ConfigError(f"no results at {p}")
    proposal = (
        Path(propose)
        if propose
        else Path(candidate if Path(candidate).is_dir() else Path(candidate).parent) / "proposed-baseline.jsonl"
    )
    check_baseline_path(
        proposal,
        "--propose" if propose else None,
        "proposed baseline",
        "choose another path" if propose else "give --propose FILE",
    )
    base_rows, cand_rows = _rows(baseline, whole="baseline"), _rows(candidate)
    check_one_version(cand_rows, "candidate")
    check_same_kernels([base_rows, cand_rows], ["the baseline", "the candidate"])
    res = gate(base_rows, cand_rows, timing_tolerance, gate_timing=timing == "gate", false_alarm=false_alarm)
    for note in one_sided(base_rows, cand_rows, ["the baseline", "the candidate"]):
        print(f"zerobench: note: {note}", file=sys.stderr)
    versions = {side: _torch_versions(rows) for side, rows in (("baseline", base_rows), ("candidate", cand_rows))}
    if all(versions.values()) and versions["baseline"] != versions["candidate"]:
        print(
            f"note: the baseline ran torch {', '.join(sorted(versions['baseline']))}, the candidate torch "
            f"{', '.join(sorted(versions['candidate']))}: exact counts and peak memory can differ for that alone"
        )
    devices = {side: _devices(rows) for side, rows in (("baseline", base_rows), ("candidate", cand_rows))}
    if all(devices.values()) and devices["baseline"] != devices["candidate"]:
        print(
            f"note: the baseline ran on {', '.join(sorted(devices['baseline']))}, the candidate on "
            f"{', '.join(sorted(devices['candidate']))} (one hardware class): instruction counts, CPU time and their "
            "noise model hold for the processor they were measured on; record a baseline on this one"
        )
    comps = res.comparisons
    if not comps:
        raise ConfigError(f"no run of {candidate} matches a run of the baseline {baseline} (different configs?)")
    regressions = [x for x in comps if x.verdict in ("regression", "not finite")]
    improved = [x for x in comps if x.verdict == "improved"]
    slower = [x for x in comps if x.verdict == "slower"]
    unmodelled = [x for x in comps if x.verdict == "no noise model"]
    noisy = [x for x in comps if x.verdict == "too noisy"]
    moved = regressions or improved or slower or noisy
    rate = f"; noise-modelled comparisons at a false-alarm rate of {res.false_alarm:g}" if res.false_alarm else ""
    print(
        f"regression gate: {len(comps)} comparisons over {len({x.key for x in comps})} runs; "
        f"{len(regressions)} regressions, {len(improved)} improvements"
        + (f", {len(slower)} slower (not gated: --timing report)" if slower else "")
        + rate
    )
    print(format_table(comps, only_moved=bool(moved)))
    if unmodelled:
        print(
            f"  not gated: {len(unmodelled)} host-work metrics have no noise model in the baseline (record it from "
            f"several unchanged runs: --write-baseline FILE --candidate DIR1 DIR2 ...)"
        )
    if noisy:
        print(
            f"  not gated: {len(noisy)} comparisons too noisy to judge (noise that allows over {MAX_TOLERANCE:.0%}, or "
            "a candidate step time whose own spread hides the change): record the baseline's noise model from more "
            "unchanged runs, or measure more steps"
        )
    for label in res.missing:
        print(f"  missing: {label} (in the baseline, not completed in the candidate)")  # a run, or a run's metric
    for label in res.not_completed:
        print(f"  not completed: {label}")
    for label in res.not_compared:
        print(f"  not compared: {label}")
    for label in res.damaged:
        print(f"  damaged baseline: {label}: a baseline keeps completed runs only; record it again")
    for label in res.failed:
        print(f"  failed: {label}")
    for label in res.not_in_baseline:
        print(f"  not in the baseline: {label}" + (" (fails: --strict)" if strict else ""))
    if strict and (noisy or unmodelled):
        print(f"  --strict: {len(noisy) + len(unmodelled)} comparisons not judged (too noisy, no noise model) fail")
    carried = recentred_noise(base_rows, cand_rows)
    n = write_baseline(cand_rows, proposal, carried=carried)
    if carried:
        print(f"  the proposal keeps the baseline's noise model ({len(carried)} metrics), centred on these values")
    if improved:
        print(f"improvements beyond tolerance: update the baseline? proposed: {proposal} ({n} rows)")
    else:
        print(f"proposed baseline written to {proposal} ({n} rows)")
    failing = (
        regressions
        or res.missing
        or res.damaged
        or res.failed
        or (strict and (res.not_in_baseline or noisy or unmodelled))
    )
    code = 1 if failing else 0
    if out is not None:
        write_verdicts(
            out,
            res,
            cand_rows,
            code,
            {
                "baseline": str(baseline),
                "candidate": str(candidate),
                "timing_tolerance": timing_tolerance,
                "timing": timing,
                "strict": strict,
                "false_alarm": false_alarm,
            },
        )
    return code


def _torch_versions(rows: list[dict]) -> set[str]:
    """The torch versions the rows were measured with (not the status rows': written by whoever recorded the run)."""
    return {
        v for r in rows if r.get("metric") != STATUS_METRIC and (v := (r.get("provenance") or {}).get("torch_version"))
    }


def _devices(rows: list[dict]) -> set[str]:
    """The processors the rows were measured on (not the status rows': written by whoever recorded the run)."""
    return {
        str(v)
        for r in rows
        if r.get("metric") != STATUS_METRIC and (v := ((r.get("provenance") or {}).get("hardware") or {}).get("device"))
    }


def write_verdicts(out: str | Path, res: GateResult, cand_rows: list[dict], code: int, config: dict) -> None:
    """The gate's verdicts as rows in ``out/rows.jsonl``: one ``gate_comparison`` per comparison (value: the
    relative change) and one ``gate_result`` (value: the exit code), each naming the candidate's commit."""
    from zerobench.results.rows import RowWriter

    prov = next((r.get("provenance") or {} for r in cand_rows if r.get("provenance")), {})
    commit = {"commit": prov.get("commit"), "parent": prov.get("parent")}
    w = RowWriter(out, "gate", config)
    for x in res.comparisons:
        w.write(
            "gate_comparison",
            x.change if math.isfinite(x.change) else None,
            "relative",
            of=x.metric,
            label=x.label,
            run_config_hash=x.key,
            baseline=x.baseline,
            candidate=x.candidate,
            tolerance=x.tolerance if math.isfinite(x.tolerance) else None,
            basis=x.basis,
            verdict=x.verdict,
            **commit,
        )
    w.write(
        "gate_result",
        code,
        "exit code",
        regressions=sum(x.verdict in ("regression", "not finite") for x in res.comparisons),
        missing=res.missing,
        failed=res.failed,
        damaged=res.damaged,
        not_compared=res.not_compared,
        not_in_baseline=res.not_in_baseline,
        not_completed=res.not_completed,
        false_alarm=res.false_alarm,
        **commit,
    )
