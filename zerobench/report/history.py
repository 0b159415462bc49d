"""A history of the regression gate's metrics over commits, as asv and CodSpeed dashboards draw one.

Input: results of the same suite at several commits (one directory per gate run; a commit measured more than once
shows its median and its range). Rows carry their commit, its first parent and its time (``results/provenance.py``):
commits are put in order by following parents, and by commit time where the chain breaks. Per configuration, one
panel per metric draws the value at each commit and a band around the previous commit's value: the tolerance
the gate would allow there (``bench/noise.py``: the noise model of ``baseline`` when given, else the spread of the
history itself, from its commit-to-commit changes). A commit outside the band is flagged: a regression (red) or an
improvement (green). Written to ``OUT``: one PNG per configuration, ``history.md`` (the flagged commits) and
``rows.jsonl`` (one ``history_flag`` row per flagged commit and metric).
"""

from __future__ import annotations

import io
import itertools
import math
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt

from zerobench.bench import noise
from zerobench.bench.gate_rules import EXACT, GATED, summarize
from zerobench.bench.regress import _devices, _rows, _torch_versions
from zerobench.config import ConfigError
from zerobench.files import replace_file
from zerobench.results.provenance import code_version, short_version
from zerobench.results.status import STATUS_METRIC

DEFAULT_METRICS = tuple(m for m in GATED if "." not in m and m != "final_loss")
RULE_FLOORS = {"peak_memory_bytes": 0.02, "step_time_ratio": 0.05}


@dataclass
class Point:
    """One commit's results."""

    commit: str
    parent: str | None
    time: str
    dirty: bool
    runs: list[dict] = field(default_factory=list)
    """``summarize`` of each results directory measured at this commit."""

    @property
    def name(self) -> str:
        return (self.commit or "unknown")[:8] + ("+" if self.dirty else "")


def _source(d: str, rows: list[dict]) -> tuple[dict, str | None]:
    """The provenance of directory ``d``'s measurement and its hardware class, refusing in one line a directory
    that holds two commits (or a clean and a dirty tree): it is one gate run's results, one point of the history.
    (Status rows are written by whoever recorded the run, a login node under Slurm: their machine is not read.)"""
    provs = [r["provenance"] for r in rows if isinstance(r.get("provenance"), dict)]
    code = {code_version(p) for p in provs}
    if len(code) > 1:
        c0, c1 = sorted(code, key=str)[:2]
        raise ConfigError(
            f"{d} holds the results of {short_version(c0)} and {short_version(c1)}: a history takes one directory "
            "per commit (one gate run's results)"
        )
    classes = {
        (p.get("hardware") or {}).get("class")
        for r in rows
        if r.get("metric") != STATUS_METRIC and isinstance(p := r.get("provenance"), dict)
    }
    if len(classes) > 1:
        raise ConfigError(
            f"{d} mixes hardware {' and '.join(sorted(map(str, classes)))}: one machine class per history"
        )
    return (provs[0] if provs else {}), next(iter(classes), None)


def collect(dirs: list[str]) -> list[Point]:
    """One point per commit of ``dirs``, in history order; refused in one line where the directories are of
    several hardware classes (one series would mix machines: draw a history per class). Processors or torch
    versions that differ within the class are said in a note on stderr (``_note_machines``): a series may hold
    them (a runner replaced), but a commit flagged where they change may be flagged for the machine."""
    points: dict[str, Point] = {}
    hardware: dict[str | None, str] = {}
    machines: dict[str, dict[str, str]] = {"processors": {}, "torch versions": {}}
    for d in dirs:
        rows = _rows(d)
        prov, cls = _source(d, rows)
        for v in sorted(_devices(rows)):
            machines["processors"].setdefault(v, d)
        for v in sorted(_torch_versions(rows)):
            machines["torch versions"].setdefault(v, d)
        hardware.setdefault(cls, d)
        if len(hardware) > 1:
            (c0, d0), (c1, d1) = list(hardware.items())[:2]
            raise ConfigError(
                f"the history mixes hardware {c0} ({d0}) and {c1} ({d1}): a series over commits compares one machine "
                "class; draw a history per class"
            )
        key = str(code_version(prov))  # a dirty tree's runs are a point of their own, one per set of changes
        p = points.setdefault(
            key,
            Point(
                prov.get("commit") or "",
                prov.get("parent"),
                prov.get("commit_time") or prov.get("timestamp") or "",
                bool(prov.get("dirty")),
            ),
        )
        p.runs.append(_summary(d, rows))
    _note_machines(machines)
    return order(list(points.values()))


def _summary(where: str, rows: list[dict]) -> dict[str, dict]:
    """``summarize`` of the rows read from ``where``, its refusal naming ``where``: a history reads many."""
    try:
        return summarize(rows)
    except ConfigError as e:
        raise ConfigError(f"{where}: {e}") from None


def _note_machines(machines: dict[str, dict[str, str]]) -> None:
    """One line on stderr per kind of ``machines`` (value -> the first directory holding it) with two values:
    instruction counts and CPU time move with the processor, exact counts and peak memory with torch."""
    for kind, first in machines.items():
        if len(first) > 1:
            (v0, d0), (v1, d1) = list(first.items())[:2]
            moves = "instruction counts and CPU time" if kind == "processors" else "exact counts and peak memory"
            print(
                f"zerobench: note: the history mixes {kind} {v0} ({d0}) and {v1} ({d1}) of one hardware class: "
                f"{moves} can differ for that alone, so a commit where they change may be flagged for it",
                file=sys.stderr,
            )


def order(points: list[Point]) -> list[Point]:
    """Oldest first: each commit after its parent where the parent is in the history, else by commit time."""
    by_time = sorted(points, key=lambda p: (p.time, p.name))
    present = {p.commit for p in points}
    out: list[Point] = []
    placed: set[int] = set()

    def place(p: Point) -> None:
        if id(p) in placed:
            return
        for q in by_time:  # its parent (clean measurement first) goes before it
            if p.parent and q.commit == p.parent and p.parent in present and id(q) not in placed and q is not p:
                place(q)
        placed.add(id(p))
        out.append(p)

    for p in by_time:
        place(p)
    return out


MIN_HISTORY_FOR_NOISE = 6
"""Commits a metric's noise is estimated from when no baseline gives it (its commit-to-commit changes): fewer, and
one change moves the estimate enough to hide itself (a +10% step and its revert among four changes)."""


def _not_measured(p: Point, key: str) -> str | None:
    """Why configuration ``key`` has no measurement at ``p`` though some result of it exists there: its runs' status
    (failed, incomplete, ...), or None."""
    runs = [r[key] for r in p.runs if key in r]
    if not runs or any(r.get("ok") for r in runs):
        return None
    return ", ".join(sorted({st for r in runs for st, _ in r["not_ok"].values()}) or {"not completed"})


def _value(p: Point, key: str, metric: str) -> tuple[float, float, float] | None:
    """(median, min, max) of ``metric`` over the point's measurements of configuration ``key``."""
    vals = [r[key][metric] for r in p.runs if key in r and r[key].get("ok") and r[key].get(metric) is not None]
    vals = [v for v in vals if math.isfinite(v)]
    return (statistics.median(vals), min(vals), max(vals)) if vals else None


def _sigma_from_history(values: list[float]) -> tuple[float, int]:
    """The noise of one measurement from the history itself: the robust spread of commit-to-commit changes
    (1.4826 MAD of x_i / x_{i-1} - 1, over sqrt 2: a change is the difference of two measurements)."""
    steps = [b / a - 1 for a, b in itertools.pairwise(values) if a]
    if len(steps) < 2:
        return 0.0, len(values)
    med = statistics.median(steps)
    return 1.4826 * statistics.median(abs(s - med) for s in steps) / math.sqrt(2), len(values)


def tolerance(metric: str, sigma: float, n: int, false_alarm: float, center: float | None = None) -> float:
    """The tolerance of a change with noise ``sigma`` (from ``n`` runs) at ``false_alarm``, as the gate would set
    it: exact for a count that never moved, else the noise model's (at least the rule's own floor and, for a
    metric of size ``center``, the family's absolute floor)."""
    return max(
        RULE_FLOORS.get(metric, 0.0),
        noise.tolerance(metric, sigma, n, false_alarm, exact_when_still=metric in EXACT, center=center),
    )


def _series(points: list[Point], key: str, metric: str, model: dict | None, false_alarm: float) -> dict | None:
    vals = [_value(p, key, metric) for p in points]
    have = [(i, v) for i, v in enumerate(vals) if v is not None]
    if len(have) < 2:
        return None
    row = (model or {}).get(metric)
    if row and (row.get("n") or 0) >= 2:
        sigma, n, source = float(row["value"]), int(row["n"]), "baseline noise model"
    elif metric in ("model_state_bytes", "comm_volume_elements_per_step"):  # deterministic: the gate's exact rule
        sigma, n, source = 0.0, len(have), "exact"
    elif len(have) >= MIN_HISTORY_FOR_NOISE:
        sigma, n = _sigma_from_history([v[0] for _, v in have])
        source = "spread of the history"
    else:  # drawn, not judged
        return {"points": have, "tol": None, "sigma": None, "n": len(have), "flags": [], "source": "not judged"}
    # A change between consecutive commits is the difference of two single measurements (sigma * sqrt 2), judged
    # in both directions (alpha / 2 a side).
    tol = tolerance(metric, sigma * math.sqrt(2), n, false_alarm / 2, statistics.median(v[0] for _, v in have))
    flags = []
    for (_, prev), (i, cur) in itertools.pairwise(have):
        change = cur[0] / prev[0] - 1 if prev[0] else (0.0 if cur[0] == 0 else math.inf)
        if abs(change) > tol:
            flags.append((i, "regression" if change > 0 else "improvement", change))
    return {
        "points": have,
        "tol": tol,
        "sigma": sigma,
        "n": n,
        "flags": flags,
        "source": source,
    }


def run_history(
    dirs: list[str],
    out: str | Path,
    baseline: str | None = None,
    metrics: str | None = None,
    false_alarm: float = 0.001,
) -> int:
    """Draw the history of ``dirs`` into ``out``; returns 0 (a history reports, it does not gate)."""
    from zerobench.results.outdir import check_fresh_run_dir
    from zerobench.results.rows import RowWriter, written_whole

    wanted = tuple(m.strip() for m in metrics.split(",")) if metrics else DEFAULT_METRICS
    unknown = [m for m in wanted if m not in GATED]
    if unknown:
        raise ConfigError(f"--metrics: {', '.join(unknown)} is not a gated metric; choose from {', '.join(GATED)}")
    out = Path(out)
    # a second history's flags appended to the first's would read as one history's
    check_fresh_run_dir(out, fix="give each history its own directory")
    points = collect(dirs)
    if len(points) < 2:
        raise ConfigError(
            f"a history needs results of at least two commits; {len(dirs)} directories hold {len(points)}"
        )
    models = {k: d["noise"] for k, d in _summary(f"--baseline {baseline}", _rows(baseline)).items()} if baseline else {}
    keys = sorted({k for p in points for r in p.runs for k in r if r[k].get("ok")})
    lines = [
        f"# History of {len(points)} commits",
        "",
        "| configuration | metric | commit | change | tolerance | verdict |",
        "|---|---|---|---|---|---|",
    ]
    w = RowWriter(out, "history", {"dirs": [str(d) for d in dirs], "baseline": baseline, "false_alarm": false_alarm})
    gaps: list[str] = []
    unjudged: list[str] = []
    labels = {key: next(r[key]["label"] for p in points for r in p.runs if key in r) for key in keys}
    slugs = [_slug(lab) for lab in labels.values()]  # "stage=2" and "stage 2" would share history-stage-2.png
    shared = {lab for lab in labels.values() if slugs.count(_slug(lab)) > 1}
    # all of this history's flags reach rows.jsonl at the block's end, or none: a stopped one leaves none behind
    with written_whole(w):
        for key in keys:
            # a configuration whose hash changed over the history (a default that moved) keeps its label: the hash tells
            # the two apart, in the table and in the plot's file name (else the second plot replaced the first)
            label = f"{labels[key]} [{key[:8]}]" if labels[key] in shared else labels[key]
            for p in points:
                why = _not_measured(p, key)
                if why is not None:
                    gaps.append(f"| {label} | {p.name} | {why} |")
            series = {m: s for m in wanted if (s := _series(points, key, m, models.get(key), false_alarm)) is not None}
            unjudged += [f"{label}: {m}" for m, s in series.items() if s["tol"] is None]
            if not series:
                continue
            path = draw(points, label, series, out / f"history-{_slug(label)}.png")
            print(f"{label}: {path}")
            for m, s in series.items():
                for i, verdict, change in s["flags"]:
                    lines.append(f"| {label} | {m} | {points[i].name} | {change:+.2%} | {s['tol']:.2%} | {verdict} |")
                    w.write(
                        "history_flag",
                        change,
                        "relative",
                        label=label,
                        of=m,
                        commit=points[i].commit,
                        parent=points[i].parent,
                        tolerance=s["tol"],
                        verdict=verdict,
                        sigma=s["sigma"],
                        noise_source=s["source"],
                    )
    flagged = len(lines) - 4
    lines += [] if flagged else ["", "No commit was flagged."]
    if gaps:  # a failed run is no point of its series: said, never skipped without a word
        lines += ["", "## Not measured", "", "| configuration | commit | status |", "|---|---|---|", *gaps]
    if unjudged:
        lines += [
            "",
            f"## Not judged: no noise model, and fewer than {MIN_HISTORY_FOR_NOISE} commits to estimate one from",
            "",
            "Give `--baseline` (a baseline with its noise model) to judge them.",
            "",
            *(f"- {u}" for u in unjudged),
        ]
    replace_file(out / "history.md", "\n".join(lines) + "\n")
    print(
        f"{flagged} flagged (commit, metric) pairs"
        + (f"; {len(gaps)} (configuration, commit) pairs not measured" if gaps else "")
        + (f"; {len(unjudged)} series not judged (no noise model)" if unjudged else "")
        + f"; {out / 'history.md'}"
    )
    return 0


def _slug(label: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "-" for c in str(label)).strip("-") or "run"


def draw(points: list[Point], label: str, series: dict[str, dict], path: Path) -> Path:
    """One panel per metric: values over commits, the band the previous commit's value allows, flagged commits."""
    fig, axes = plt.subplots(
        len(series), 1, figsize=(max(6.0, 0.5 * len(points) + 3), 2.1 * len(series) + 0.6), sharex=True, squeeze=False
    )
    for ax, (metric, s) in zip(axes[:, 0], series.items()):
        xs = [i for i, _ in s["points"]]
        med = [v[0] for _, v in s["points"]]
        err = [[v[0] - v[1] for _, v in s["points"]], [v[2] - v[0] for _, v in s["points"]]]
        ax.errorbar(xs, med, yerr=err, color="#345", marker="o", ms=3.5, lw=1.2, capsize=2, zorder=3)
        for prev, x1 in zip(med, xs[1:]):  # the band each commit is judged in: its predecessor's value +- tol
            if s["tol"]:  # an exact metric has none (any change is flagged), an unjudged one none either
                ax.bar(
                    x1,
                    2 * s["tol"] * abs(prev),
                    bottom=prev - s["tol"] * abs(prev),
                    width=0.8,
                    color="#9bd",
                    alpha=0.45,
                    lw=0,
                    zorder=1,
                )
        for i, verdict, _ in s["flags"]:
            y = med[xs.index(i)]
            ax.scatter(
                [i],
                [y],
                s=70,
                marker="v" if verdict == "regression" else "^",
                zorder=4,
                color="#c22" if verdict == "regression" else "#2a2",
            )
        ax.set_ylabel(metric, fontsize=8)
        if s["tol"] is None:
            title = f"{metric}: not judged (no noise model, {s['n']} commits: give --baseline)"
        else:
            band = f"band ±{s['tol']:.2%}" if s["tol"] > 0 else "exact"
            title = f"{metric}: {band} ({s['source']}, sigma {s['sigma']:.2%})"
        ax.set_title(title, fontsize=8, loc="left")
        ax.tick_params(labelsize=7)
    axes[-1, 0].set_xticks(range(len(points)), [p.name for p in points], rotation=45, ha="right", fontsize=7)
    fig.suptitle(f"{label}: gated metrics over commits (red: regression, green: improvement)", fontsize=9)
    fig.tight_layout()
    fig.savefig(buf := io.BytesIO(), format="png", dpi=110)
    replace_file(path, buf.getvalue())  # never through a link planted at the name
    plt.close(fig)
    return path
