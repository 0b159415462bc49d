"""The published table predicted: predicted ÷ published per row, and the median and worst |error| per device class.

Each device class has at most one calibration row. That row fits the class's one free factor,
``compute_scale``, and nothing else is fitted. A class with no calibration row runs as stated, with a
scale of 1. Where the calibration figure's FLOP convention is unknown (Megatron-LM 2019), each convention is
fitted on its own reading. Every row that depends on that calibration is then predicted once per
convention, and compared with its reading in that convention. A row's bar convention (``BAR``) is the
reading it counts in for the summary: ``exact`` where it needs none. Otherwise it is ``hardware``, with the
recompute, Megatron-LM's own convention as Narayanan et al. 2021 state it (Appendix).
"""

from __future__ import annotations

import statistics

from zerobench.sim.published import CONVENTIONS, Row, load, model_state_floor, readings, run_keys, train_config

BAR = "hardware"
"""The convention an unknown-convention row counts in for the bars (both are reported)."""


def _simulate(row: Row, prof) -> dict:
    from zerobench.sim.simulate import simulate

    cfg = train_config(run_keys(row))
    r = simulate(cfg, prof)
    r.pop("timeline")
    tokens = row.micro_batch * row.grad_accum * row.seq * row.dp / row.gpus
    return {
        "tokens_per_s_per_gpu": tokens / r["step_time_s"],
        "step_time_s": r["step_time_s"],
        "breakdown_s": r["breakdown_s"],
    }


def _profile(row: Row, scale: float):
    """The row's device, with the row's card (its memory and HBM bandwidth), running the row's program, at
    ``compute_scale`` ``scale``."""
    import dataclasses

    from zerobench.sim.gpu_costs import StatedProfile
    from zerobench.sim.published import stack
    from zerobench.sim.stated import DEVICES

    grad = {"fp32": 4, "bf16": 2, "fp16": 2}[row.reduce_dtype]
    dev = DEVICES[row.device].with_memory(row.gpu_mem_gb)
    return StatedProfile(dataclasses.replace(dev, compute_scale=scale), stack(row), grad_elem=grad)


def fit(row: Row, target: float, iterations: int = 4) -> float:
    """The ``compute_scale`` at which ``row`` runs at ``target`` tokens/s per GPU. The step time is
    ``scale x compute + the rest``: linear in the scale where nothing overlaps, piecewise linear where
    collectives hide behind compute. Secant steps converge on it."""
    want = row.micro_batch * row.grad_accum * row.seq * row.dp / row.gpus / target  # seconds per step
    a, b = 1.0, 2.0
    ta, tb = (_simulate(row, _profile(row, s))["step_time_s"] for s in (a, b))
    for _ in range(iterations):
        if tb == ta:
            break
        a, b, ta = b, b + (want - tb) * (b - a) / (tb - ta), tb
        tb = _simulate(row, _profile(row, b))["step_time_s"]
    return b


_FITS: dict[tuple, dict] = {}


def calibration(device_class: str, convention: str = BAR, rows: list[Row] | None = None) -> dict:
    """The fit of ``device_class``'s one free factor: ``value`` (the ``compute_scale``) and ``row`` (the one figure
    it came from; None where the class has no calibration row: scale 1). ``convention`` picks the reading of a
    figure whose FLOP convention is unknown (ignored for an exact one). Fits of the committed table are cached."""
    rows = load() if rows is None else rows
    cal = [r for r in rows if r.split == "calibration" and r.device_class == device_class]
    if len(cal) > 1:
        raise ValueError(f"device class {device_class} has two calibration rows: keep at most one per class")
    if not cal:
        return {"value": 1.0, "row": None, "published": None}
    r = cal[0]
    if r.zero:
        raise ValueError(f"calibration row {r.id!r} is a ZeRO/FSDP run: calibrate on a non-ZeRO figure")
    pub = readings(r, {x.id: x for x in rows})
    conv = "exact" if "exact" in pub else convention
    key = (r, conv)
    if key not in _FITS:
        _FITS[key] = {"value": fit(r, pub[conv]), "row": r.id, "published": r.published, "reading": conv}
    return _FITS[key]


def calibrations(rows: list[Row]) -> dict[str, dict[str, dict]]:
    """Device class -> reading -> its fit (``calibration``): every reading its calibration figure has."""
    out: dict[str, dict[str, dict]] = {}
    for cls in sorted({r.device_class for r in rows}):
        cal = [r for r in rows if r.split == "calibration" and r.device_class == cls]
        convs = list(readings(cal[0], {x.id: x for x in rows})) if cal else ["exact"]
        out[cls] = {c: calibration(cls, c if c != "exact" else BAR, rows) for c in convs}
    return out


def predict(rows: list[Row] | None = None) -> dict:
    """Every row predicted: per row, per reading, predicted and published tokens/s per GPU and their ratio;
    the fits; the summary (``summarize``) of the held-out rows."""
    rows = load() if rows is None else rows
    by_id = {r.id: r for r in rows}
    fits = calibrations(rows)
    recs = []
    for r in rows:
        pub = readings(r, by_id)
        fit_of = fits[r.device_class]
        per = {}
        for conv, published in pub.items():
            f = fit_of.get(conv) or fit_of.get("exact") or fit_of[BAR]
            sim = _simulate(r, _profile(r, f["value"]))
            per[conv] = {
                "published": published,
                "predicted": sim["tokens_per_s_per_gpu"],
                "ratio": sim["tokens_per_s_per_gpu"] / published,
                "compute_scale": f["value"],
                "fitted_on": f["row"],
                "step_time_s": sim["step_time_s"],
                "breakdown_s": sim["breakdown_s"],
            }
        bar = "exact" if "exact" in per else BAR
        recs.append(
            {"row": r, "readings": per, "bar": bar, "ratio": per[bar]["ratio"], "state_floor": model_state_floor(r)}
        )
    return {"fits": fits, "records": recs, "summary": summarize(recs)}


def summarize(recs: list[dict]) -> dict:
    """Median and worst |predicted ÷ published − 1| of the held-out rows, and how many are beyond 25%: per device
    class and overall."""
    held = [x for x in recs if x["row"].split == "held_out"]
    groups = {"all": held}
    for x in held:
        groups.setdefault(x["row"].device_class, []).append(x)
    out = {}
    for g, xs in groups.items():
        errs = sorted((abs(x["ratio"] - 1), x["row"].id) for x in xs)
        out[g] = {
            "rows": len(xs),
            "median_abs_error": statistics.median(e for e, _ in errs),
            "worst_abs_error": errs[-1][0],
            "worst_row": errs[-1][1],
            "beyond_25": sum(e > 0.25 for e, _ in errs),
        }
    return out


__all__ = ["BAR", "CONVENTIONS", "calibrations", "fit", "predict", "summarize"]
