"""Summarise a gate campaign (``scripts/gate_campaign.sh``): ``python scripts/gate_campaign_summary.py OUT WORK
--trials N --baseline-runs K``; combine campaigns taken in parts: ``... --combine OUT PART...``.

Reads each trial's gate verdict rows (``WORK/verdicts/<kind>-<i>``) and A/B verdict rows (``WORK/ab/<i>/summary``)
and writes to ``OUT``: ``rows.jsonl`` (one ``campaign_trial`` row per trial and kind, value 1 when the trial went
as it must: unchanged code passed, a plant was caught; the gate's flagged comparisons and result of every trial;
the A/B verdicts; one ``campaign_result`` row per kind with the count) and ``README.md`` (the table). A trial whose
rows are missing (a gate or an A/B that did not finish) counts as not having gone as it must.

A campaign of 20 trials needs about 6 hours of a quiet 2-core machine; it can be taken in parts (each a
``gate_campaign.sh`` run with a baseline of its own, recorded under the same neighbour on the machine it runs on,
so a part never judges one machine's runs by another's noise model). ``--combine`` numbers the parts' trials one
after another and writes the totals over all of them, with each trial's part.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from zerobench.results.rows import RowWriter  # noqa: E402

KINDS = {
    "unchanged_gate": ("the stored-baseline gate on unchanged code passes", "all"),
    "host_planted_gate": ("the gate catches host work planted 10% slower (ZEROBENCH_PLANT_CPU=0.10)", "all but one"),
    "ab_planted": (
        "the lockstep A/B calls a step planted 10% slower a regression (ZEROBENCH_PLANT_DELAY=0.10:2)",
        "all but one",
    ),
    "ab_unchanged": ("the lockstep A/B does not call the unchanged stage-1 run a regression", "all"),
}


def _read(path: Path) -> list[dict]:
    f = path / "rows.jsonl"
    return [json.loads(line) for line in f.read_text().splitlines() if line.strip()] if f.exists() else []


def trials(work: Path, n: int) -> list[dict]:
    """One record per (kind, trial): whether it went as it must, and what says so."""
    out = []
    for i in range(1, n + 1):
        for kind, want_fail in (("unchanged", False), ("host", True)):
            rows = _read(work / "verdicts" / f"{kind}-{i}")
            result = next((r for r in rows if r["metric"] == "gate_result"), None)
            flagged = sorted(
                {
                    r["of"]
                    for r in rows
                    if r["metric"] == "gate_comparison" and r["verdict"] in ("regression", "not finite")
                }
            )
            code = None if result is None else result["value"]
            met = code is not None and (code == 1 if want_fail else code == 0)
            out.append(
                {
                    "kind": "host_planted_gate" if want_fail else "unchanged_gate",
                    "trial": i,
                    "met": met,
                    "exit_code": code,
                    "flagged": flagged,
                    "missing": (result or {}).get("missing"),
                    "rows": [
                        r
                        for r in rows
                        if r["metric"] == "gate_result" or r.get("verdict") in ("regression", "not finite", "improved")
                    ],
                }
            )
        ab = {r["run"]: r for r in _read(work / "ab" / str(i) / "summary") if r["metric"] == "ab_time_ratio"}
        for kind, run, want in (("ab_planted", "001-stage2", "REGRESSION"), ("ab_unchanged", "000-stage1", None)):
            v = ab.get(run)
            met = v is not None and (v["verdict"] == want if want else v["verdict"] != "REGRESSION")
            out.append(
                {
                    "kind": kind,
                    "trial": i,
                    "met": met,
                    "verdict": None if v is None else v["verdict"],
                    "median_ratio": None if v is None else v["value"],
                    "rows": [v] if v else [],
                }
            )
    return out


SKIP = ("metric", "value", "unit", "config", "config_hash", "run_id", "provenance", "schema", "suite", "status")
"""Fields of a source row that its copy does not carry over (the copy's writer sets its own)."""


def combine(out: Path, parts: list[Path]) -> int:
    """One campaign from its parts (each a summarised ``OUT`` of ``gate_campaign.sh``): their trials numbered one
    after another, each with its ``part``, and the totals over all; the parts must share their configuration
    apart from the trial count."""

    def refuse(why: str) -> int:
        print(f"gate_campaign_summary: {why}", file=sys.stderr)
        return 2

    if out.exists() and any(out.iterdir()):
        return refuse(f"{out} is not empty: combine into a new directory")
    names = [p.name for p in parts]
    if len(set(names)) != len(names):
        return refuse(f"two parts share a directory name ({', '.join(names)}): name each part's directory apart")
    loaded = [(p, _read(p)) for p in parts]
    for p, rows in loaded:
        if not rows:
            return refuse(f"{p}: no rows.jsonl: summarise that part first")
        if not (p / "baseline.jsonl").exists():
            return refuse(f"{p}: no baseline.jsonl: a part keeps the baseline its trials were judged against")
    configs = [{k: v for k, v in rows[0]["config"].items() if k != "trials"} for _, rows in loaded]
    if any(c != configs[0] for c in configs):
        return refuse("the parts ran with different configurations: combine like with like")
    counts = [rows[0]["config"]["trials"] for _, rows in loaded]
    total = sum(counts)
    w = RowWriter(
        out,
        "gate-campaign",
        {**configs[0], "trials": total, "parts": names},
        hardware=_hardware([rows[0]["provenance"]["hardware"] for _, rows in loaded]),
    )
    (out / "baselines").mkdir()
    for p in parts:  # the baselines the parts' trials were judged against travel with them
        shutil.copyfile(p / "baseline.jsonl", out / "baselines" / f"{p.name}.jsonl")
    recs: list[dict] = []
    trials = 0
    for (p, rows), n in zip(loaded, counts):
        for r in rows:
            if r["metric"] == "campaign_result":
                continue
            extra = {k: v for k, v in r.items() if k not in SKIP and k != "trial"}
            prov = {k: r["provenance"].get(k) for k in ("commit", "host", "hardware", "timestamp")}
            w.write(
                r["metric"],
                r["value"],
                r.get("unit", ""),
                trial=trials + r["trial"],
                part=p.name,
                part_provenance=prov,
                **extra,
            )
            if r["metric"] == "campaign_trial":
                recs.append({"kind": r["kind"], "met": bool(r["value"])})
        trials += n
    table = _totals(w, recs)
    parts_line = ", ".join(f"`{name}` ({n} trials)" for name, n in zip(names, counts))
    (out / "README.md").write_text(
        README.format(n=total, k=configs[0]["baseline_runs"], table=table, baseline="`baselines/<part>.jsonl`")
        + f"\nTaken in parts, each with a baseline of its own: {parts_line}.\n"
    )
    print(table)
    return 0


def _hardware(parts: list[dict]) -> dict:
    """The machine the combined rows were measured on: the parts' own when they share it, else each part's device
    (never the machine that happens to run ``--combine``)."""
    if all(h == parts[0] for h in parts):
        return parts[0]
    classes = {h.get("class") for h in parts}
    return {
        "kind": "mixed",
        "class": classes.pop() if len(classes) == 1 else "mixed",
        "device": "; ".join(str(h.get("device")) for h in parts),
        "count": None,
        "parts": parts,
    }


def _totals(w: RowWriter, recs: list[dict]) -> str:
    lines = ["| what | met | of | required |", "|---|---|---|---|"]
    for kind, (what, required) in KINDS.items():
        got = [r for r in recs if r["kind"] == kind]
        met = sum(r["met"] for r in got)
        w.write("campaign_result", met, "trials", kind=kind, of=len(got), required=required, definition=what)
        lines.append(f"| {what} | {met} | {len(got)} | {required} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv and argv[0] == "--combine":
        if len(argv) < 3:
            print("usage: gate_campaign_summary.py --combine OUT PART [PART...]", file=sys.stderr)
            return 2
        return combine(Path(argv[1]), [Path(p) for p in argv[2:]])
    ap = argparse.ArgumentParser(
        description=__doc__.splitlines()[0],
        epilog="To join a campaign taken in parts: gate_campaign_summary.py --combine OUT PART [PART...]",
    )
    ap.add_argument("out")
    ap.add_argument("work")
    ap.add_argument("--trials", type=int, required=True)
    ap.add_argument("--baseline-runs", type=int, required=True)
    ap.add_argument("--ab-rounds", type=int, default=28)
    ap.add_argument("--ab-false-alarm", type=float, default=0.001)
    a = ap.parse_args(argv)
    out, work = Path(a.out), Path(a.work)
    recs = trials(work, a.trials)
    config = {
        "suite": "cpu/gate",
        "only": "stage=2",
        "ab_suite": "cpu/gate_ab",
        "trials": a.trials,
        "baseline_runs": a.baseline_runs,
        "host_plant": "ZEROBENCH_PLANT_CPU=0.10",
        "step_plant": "ZEROBENCH_PLANT_DELAY=0.10:2",
        "neighbour": "scripts/noisy_neighbour.py 1",
        "gate": "zerobench regress --timing report (false-alarm rate 0.001)",
        "ab": "zerobench regress --ab --lockstep",
        "ab_rounds": a.ab_rounds,
        "ab_false_alarm": a.ab_false_alarm,
    }
    w = RowWriter(out, "gate-campaign", config)
    for rec in recs:
        w.write(
            "campaign_trial",
            int(rec["met"]),
            "met",
            kind=rec["kind"],
            trial=rec["trial"],
            **{k: v for k, v in rec.items() if k not in ("kind", "trial", "met", "rows")},
        )
        for r in rec["rows"]:
            w.write(
                f"trial_{r['metric']}",
                r.get("value"),
                r.get("unit", ""),
                kind=rec["kind"],
                trial=rec["trial"],
                **{k: v for k, v in r.items() if k not in SKIP},
            )
    table = _totals(w, recs)
    (out / "README.md").write_text(
        README.format(n=a.trials, k=a.baseline_runs, table=table, baseline="`baseline.jsonl`")
    )
    print(table)
    return 0


README = """# The regression gate under a noisy neighbour (2-core CPU)

`scripts/gate_campaign.sh` with `scripts/noisy_neighbour.py 1` running throughout: {n} trials of each kind,
interleaved, after a baseline of {k} unchanged runs recorded under the same neighbour ({baseline}, with its
noise model). A gate run is `suites/cpu/gate.yaml`'s stage-2 run (tiny GPT, fp32, DP 2) timed and under callgrind
(`zerobench sweep --instructions`), judged by `zerobench regress --timing report`; the A/B is
`zerobench regress --ab suites/cpu/gate_ab.yaml --lockstep --cpus 0` (28 rounds).

{table}

`rows.jsonl`: one `campaign_trial` row per trial and kind (value 1: it went as it must), the gate's result and
flagged comparisons of every trial (`trial_gate_result`, `trial_gate_comparison`), the A/B verdicts
(`trial_ab_time_ratio`) and the totals (`campaign_result`). `tests/unit/test_gate_campaign.py` checks them.
"""

if __name__ == "__main__":
    sys.exit(main())
