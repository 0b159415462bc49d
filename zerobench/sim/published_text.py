"""The published-table validation (``zerobench.sim.published_validate``) as text for the terminal and as rows."""

from __future__ import annotations

from zerobench.sim.published import METRICS

_UNIT = {
    "tflops_per_gpu": "TFLOP/s/GPU",
    "tokens_per_s_per_gpu": "tokens/s/GPU",
    "speedup": "x speedup",
    "weak_scaling_efficiency": "of linear",
}
assert set(_UNIT) == set(METRICS)


def _path(breakdown: dict) -> str:
    total = sum(breakdown.values()) or 1.0
    top = sorted(breakdown.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{k} {v / total:.0%}" for k, v in top if v / total >= 0.01)


def _fits(out: dict) -> list[str]:
    lines = []
    for cls, per in sorted(out["fits"].items()):
        for conv, f in per.items():
            what = (
                f"compute_scale {f['value']:.3f} fitted on {f['row']}" + (f" ({conv} FLOPs)" if conv != "exact" else "")
                if f["row"]
                else "compute_scale 1 (no calibration figure: as stated)"
            )
            lines.append(f"  {cls}: {what}")
    return lines


def format_published(out: dict) -> str:
    """Per row: its published figure, predicted ÷ published (per FLOP reading, the bar's reading marked ``*``) and
    the critical path; then the fits and the summary per device class."""
    lines = [
        "published training throughput, predicted on stated devices (results/reference/sim-published)",
        "fitted factors (one per device class, on its calibration row only):",
        *_fits(out),
        "",
        f"  {'row':<31} {'split':<5} {'published':>22}  {'predicted ÷ published':<30} critical path",
    ]
    for x in out["records"]:
        r = x["row"]
        ratios = "  ".join(f"{c}{'*' if c == x['bar'] else ''} {v['ratio']:.2f}" for c, v in x["readings"].items())
        pub = f"{r.published:g} {_UNIT[r.metric]}"
        lines.append(
            f"  {r.id:<31} {'cal' if r.split == 'calibration' else 'held':<5} {pub:>22}  {ratios:<30} "
            f"{_path(x['readings'][x['bar']]['breakdown_s'])}"
        )
    lines.append(
        "\nheld-out rows, |predicted ÷ published - 1| (* = the reading counted; hardware FLOPs where a source "
        "states no convention):"
    )
    for g, s in out["summary"].items():
        lines.append(
            f"  {g:<5} {s['rows']:>3} rows: median {s['median_abs_error']:6.1%}, worst {s['worst_abs_error']:6.1%} "
            f"({s['worst_row']}), {s['beyond_25']} beyond 25%"
        )
    over = [x for x in out["records"] if x["state_floor"]["bytes"] > x["state_floor"]["card_bytes"]]
    if over:
        lines.append(
            "\nrows whose model states alone exceed the card as the table states the run (a lower bound: no "
            "activations, buffers or fragmentation; the card at its binary size), still counted:"
        )
        for x in over:
            f = x["state_floor"]
            lines.append(
                f"  {x['row'].id}: {f['params'] / 1e9:.3f}B parameters a GPU x {f['per_param']:g} bytes = "
                f"{f['bytes'] / 1e9:.1f} GB, on a {f['card_bytes'] / 1e9:.1f} GB card"
            )
    return "\n".join(lines)


def published_rows(out: dict) -> list[dict]:
    """One row per (table row, FLOP reading): ``sim_published_ratio`` (predicted ÷ published tokens/s per GPU) with
    the run's setup and source; and one ``sim_published_median_abs_error`` per summary group."""
    rows = []
    for x in out["records"]:
        r = x["row"]
        for conv, v in x["readings"].items():
            rows.append(
                {
                    "metric": "sim_published_ratio",
                    "value": v["ratio"],
                    "unit": "ratio",
                    "row_id": r.id,
                    "split": r.split,
                    "device": r.device,
                    "device_class": r.device_class,
                    "framework": r.framework,
                    "gpus": r.gpus,
                    "tp": r.tp,
                    "zero": r.zero,
                    "layers": r.layers,
                    "hidden": r.hidden,
                    "published_metric": r.metric,
                    "published": r.published,
                    "reading": conv,
                    "counted": conv == x["bar"],
                    "published_tokens_per_s_per_gpu": v["published"],
                    "predicted_tokens_per_s_per_gpu": v["predicted"],
                    "step_time_s": v["step_time_s"],
                    "breakdown_s": v["breakdown_s"],
                    "compute_scale": v["compute_scale"],
                    "fitted_on": v["fitted_on"],
                    "state_floor_bytes": x["state_floor"]["bytes"],
                    "card_bytes": x["state_floor"]["card_bytes"],
                    "source": r.source,
                    "where": r.where,
                }
            )
    for g, s in out["summary"].items():
        rows.append(
            {
                "metric": "sim_published_median_abs_error",
                "value": s["median_abs_error"],
                "unit": "fraction",
                "group": g,
                "rows": s["rows"],
                "worst_abs_error": s["worst_abs_error"],
                "worst_row": s["worst_row"],
                "beyond_25": s["beyond_25"],
            }
        )
    return rows
