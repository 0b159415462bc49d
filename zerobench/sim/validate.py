"""The simulator checked against runs: predicted ÷ measured step time per run, from result rows.

The runs' rows carry their resolved configuration (``TrainConfig``) and measured median step time; the
simulator sees only the configuration and the profile. ``summarize`` gives the figures issue 22's
acceptance bar names: the median and the worst |predicted ÷ measured − 1|.
"""

from __future__ import annotations

import math
import statistics
from datetime import datetime

from zerobench.config import from_dict
from zerobench.results.status import COUNTED, STATUS_METRIC, status_of
from zerobench.sim.profile import Profile
from zerobench.sim.simulate import interval, simulate, undescribed
from zerobench.train.config import TrainConfig


def _attempts(rows: list[dict]) -> list[list[dict]]:
    """``rows`` cut into one list per run attempt. An attempt's rows are written together (``read_rows`` reads
    file by file) and hold one ``step_time_s``, then its launcher's ``run_status`` row last, so an attempt ends
    where the (run id, config hash) changes, after a ``run_status`` row, and before a second ``step_time_s``: a
    run measured in several sweeps is several attempts, each with its own status, even where they are adjacent."""
    out: list[list[dict]] = []
    for r in rows:
        key = (r.get("run_id"), r.get("config_hash"))
        cur = out[-1] if out else None
        if (
            cur is None
            or (cur[0].get("run_id"), cur[0].get("config_hash")) != key
            or cur[-1].get("metric") == STATUS_METRIC
            or (r.get("metric") == "step_time_s" and any(x.get("metric") == "step_time_s" for x in cur))
        ):
            out.append([])
        out[-1].append(r)
    return out


def measured_runs(rows: list[dict]) -> list[tuple[str, TrainConfig, float]]:
    """(run id, config, median step seconds) of every zerobench run with an ok step time whose run's status
    counts (``results.status.COUNTED``: a run killed, failed or timed out after writing its step time is not a
    measurement). A run measured more than once (the same run id and configuration in several sweeps, e.g.
    ``--validate`` given a directory of rounds) is one run: the median of its measurements, in the order first
    seen."""
    found: dict[tuple[str, str], tuple[TrainConfig, list[float]]] = {}
    counted = _counted(rows)
    machines(counted)  # one machine's runs, or refused
    for r in counted:
        if r.get("metric") != "step_time_s" or r.get("status") != "ok" or r.get("value") is None:
            continue
        key = (r["run_id"], r.get("config_hash", ""))
        if key not in found:
            cfg = from_dict(TrainConfig, r["config"], where=f"run {r['run_id']}")
            if cfg.system != "zerobench" or undescribed(cfg):  # (``not_predicted`` names the latter)
                continue
            found[key] = (cfg, [])
        found[key][1].append(float(r["value"]))
    ids = [rid for rid, _ in found]
    if len(set(ids)) != len(ids):
        dup = next(rid for rid in ids if ids.count(rid) > 1)
        raise ValueError(
            f"run {dup!r} appears with two different configurations: validate one suite's rounds at a time"
        )
    return [(rid, cfg, statistics.median(ts)) for (rid, _), (cfg, ts) in found.items()]


def _counted(rows: list[dict]) -> list[dict]:
    """The rows of the run attempts whose status counts (``results.status.COUNTED``)."""
    return [r for rs in _attempts(rows) if status_of(rs)[0] in COUNTED for r in rs]


def machines(rows: list[dict]) -> tuple[str, str] | None:
    """The (hardware class, device) the runs of ``rows`` were measured on (their ``step_time_s`` rows), None where
    they say none; refused (``ValueError``) where they are several: a directory of rounds from two machines would
    give each run the median of two machines' times, and call their difference the runs' own variation."""
    seen = {
        (str(hw.get("class")), str(hw.get("device")))
        for r in rows
        if r.get("metric") == "step_time_s" and (hw := (r.get("provenance") or {}).get("hardware"))
    }
    if len(seen) > 1:
        (c0, d0), (c1, d1) = sorted(seen)[:2]
        raise ValueError(
            f"the measured runs were taken on {c0} ({d0}) and {c1} ({d1}): validate one machine's rounds at a time"
        )
    return next(iter(seen), None)


def not_predicted(rows: list[dict]) -> dict[str, str]:
    """Run id -> what the replay does not describe (``simulate.undescribed``), for the counted zerobench runs that
    ``validate`` leaves out for it."""
    out = {}
    for r in _counted(rows):
        if r.get("metric") == "step_time_s" and r.get("status") == "ok" and isinstance(r.get("config"), dict):
            cfg = from_dict(TrainConfig, r["config"], where=f"run {r['run_id']}")
            if cfg.system == "zerobench" and (missing := undescribed(cfg)):
                out[r["run_id"]] = ", ".join(missing)
    return out


def check_profile_machine(prof: Profile, rows: list[dict]) -> list[str]:
    """Refuse (``ValueError``) a profile of another hardware class than the measured runs' (its costs are another
    machine's: every ratio would be that machine's speed); the notes where it is of the same class but another
    processor or torch version, which the predictions then carry."""
    runs = machines(_counted(rows))
    if runs is None:
        return []
    from zerobench.sim.gpu_costs import StatedProfile

    cls, device = runs
    if isinstance(prof, StatedProfile):  # it predicts its own card only
        card = prof.device.split()[0].lower().split("-")[0]
        if card not in cls.lower():
            raise ValueError(
                f"the profile is a stated device ({prof.device}) and the runs were measured on {cls}: a stated "
                "device predicts runs on its own card; take a profile of this machine (`zerobench profile`)"
            )
        return []
    if prof.hardware is None:  # a profile's rows from before provenance said the machine
        return []
    p_cls, p_device = prof.hardware
    if p_cls != cls:
        raise ValueError(
            f"the profile was measured on {p_cls} ({p_device}) and the runs on {cls} ({device}): a profile predicts "
            "the machine it measured; take one on the runs' machine (`zerobench profile`)"
        )
    notes = []
    if p_device != device:
        notes.append(f"the profile's processor is {p_device}, the runs' {device}: the predictions carry the difference")
    torch_runs = {(r.get("provenance") or {}).get("torch_version") for r in rows if r.get("metric") == "step_time_s"}
    if prof.torch_version and torch_runs - {None} and torch_runs - {None} != {prof.torch_version}:
        notes.append(
            f"the profile ran torch {prof.torch_version}, the runs {', '.join(sorted(map(str, torch_runs - {None})))}"
        )
    return notes


def step_times(path) -> dict[str, float]:
    """Run id -> median step seconds of the ok zerobench runs in one sweep's rows (``measured_runs``)."""
    from zerobench.results.rows import read_rows

    return {rid: t for rid, _, t in measured_runs(read_rows(path))}


def sweep_repeatability(sweeps: list) -> list[dict]:
    """How closely sweeps of one suite repeat: each sweep's runs predicted by the median of the same runs in the
    other sweeps, scored as the simulator is (|prediction ÷ measured − 1|). That predictor knows every run's
    typical time on the machine and nothing of the moment; its error is what the runs' own variation costs a
    prediction judged against one sweep (a median of few sweeps is itself noisy, so this is an estimate, not a
    bound). Per sweep: the runs every sweep measured (``runs``), those some sweep lacks (``dropped``), the median
    and worst error and the worst run."""
    if len(sweeps) < 2:
        raise ValueError(f"how closely sweeps repeat needs at least two sweeps of one suite, got {len(sweeps)}")
    times = [step_times(p) for p in sweeps]
    shared = sorted(set.intersection(*(set(t) for t in times)))
    if not shared:
        raise ValueError("the sweeps share no run with an ok step time: give sweeps of one suite")
    dropped = sorted(set().union(*(set(t) for t in times)) - set(shared))
    out = []
    for k, (path, t) in enumerate(zip(sweeps, times)):
        others = [u for j, u in enumerate(times) if j != k]
        recs = [{"run_id": r, "ratio": statistics.median(u[r] for u in others) / t[r]} for r in shared]
        out.append({"sweep": str(path), "dropped": dropped, **summarize(recs)})
    return out


FLAGS_RIDE_SINCE = datetime.fromisoformat("2026-11-26T14:40:00+00:00")
"""Since then stage 0's unused-parameter flags ride in its last gradient all-reduce (``zero/grads/unused.py``); a run
whose rows were recorded before is replayed with the check as an all-reduce of its own, as the engine that ran it
started one."""


def recorded_before_flags_rode(rows: list[dict]) -> set[str]:
    """Run ids whose step times were recorded before ``FLAGS_RIDE_SINCE`` (by their rows' provenance timestamp)."""
    out = set()
    for r in rows:
        stamp = (r.get("provenance") or {}).get("timestamp")
        if r.get("metric") == "step_time_s" and stamp and datetime.fromisoformat(stamp) < FLAGS_RIDE_SINCE:
            out.add(r["run_id"])
    return out


def is_zero(cfg: TrainConfig) -> bool:
    """Whether a run uses ZeRO's partitioning (stage >= 1): those stay out of any fit."""
    return cfg.zero.stage >= 1


def fit_interference(rows: list[dict], prof: Profile, grid: int = 41, top: float = 2.0) -> float:
    """The ``Profile.interference`` that best predicts the measured *non-ZeRO* runs with more than one
    process (stage 0: plain data parallelism, TP): the grid value minimising their median
    |log(predicted / measured)|. No ZeRO run is looked at."""
    old = recorded_before_flags_rode(rows)
    runs = [(cfg, m, rid in old) for rid, cfg, m in measured_runs(rows) if not is_zero(cfg) and cfg.world_size > 1]
    if not prof.device.startswith("cpu:"):
        raise ValueError(f"--fit fits a CPU profile's one factor (gloo's threads on the cores); {prof.device} has none")
    if not runs:
        raise ValueError(
            "--fit has nothing to fit on: no counted non-ZeRO run with more than one process (stage 0, DP or TP) "
            "among the measured runs"
        )
    saved, best = prof.interference, (float("inf"), 0.0)
    try:
        for i in range(grid):
            prof.interference = top * i / (grid - 1)
            errs = [abs(math.log(simulate(cfg, prof, own_check_at_stage0=o)["step_time_s"] / m)) for cfg, m, o in runs]
            best = min(best, (statistics.median(errs), prof.interference))
    finally:
        prof.interference = saved
    if best[1] >= top:
        raise ValueError(
            f"--fit: the best interference is the grid's top, {top:g}: the runs want more than the factor allows "
            "(a profile of another load than the runs'?); no value was fitted"
        )
    return best[1]


def measured_peaks(rows: list[dict]) -> dict[str, float]:
    """Run id -> peak device bytes (``peak_memory_bytes``, the largest over its ranks; the median over rounds)."""
    per: dict[tuple[str, int], float] = {}
    for r in _counted(rows):  # a failed run's peak is no measurement of its configuration
        if r.get("metric") == "peak_memory_bytes" and r.get("status") == "ok" and r.get("value") is not None:
            key = (r["run_id"], (r.get("provenance") or {}).get("timestamp", ""))  # one measurement: one run's write
            per[key] = max(per.get(key, 0.0), float(r["value"]))
    out: dict[str, list[float]] = {}
    for (rid, _), v in per.items():
        out.setdefault(rid, []).append(v)
    return {rid: statistics.median(v) for rid, v in out.items()}


def validate(rows: list[dict], prof: Profile) -> list[dict]:
    """One record per measured run: predicted and measured step time, their ratio, and the breakdown; where
    the profile carries spreads, the prediction's interval (``simulate.interval``) and whether the measured
    step falls ``inside`` it; where the profile measured memory (a GPU's), the predicted and measured peak
    bytes and their ratio too."""
    peaks = measured_peaks(rows) if prof.memory else {}
    old = recorded_before_flags_rode(rows)
    bounds = (prof.bound(-1), prof.bound(+1)) if prof.has_spread else None
    out = []
    for run_id, cfg, measured in measured_runs(rows):
        sim = simulate(cfg, prof, own_check_at_stage0=run_id in old)
        sim.pop("timeline")
        rec = {
            "run_id": run_id,
            "stage": cfg.zero.stage,
            "dp": cfg.dp,
            "tp": cfg.tp,
            "layers": cfg.model.layers,
            "hidden": cfg.model.hidden,
            "predicted_s": sim["step_time_s"],
            "measured_s": measured,
            "ratio": sim["step_time_s"] / measured,
            "breakdown_s": sim["breakdown_s"],
            "in_fit": not is_zero(cfg) and cfg.world_size > 1,
        }
        if bounds is not None:
            low, high = interval(cfg, prof, bounds, own_check_at_stage0=run_id in old)
            rec.update(predicted_low_s=low, predicted_high_s=high, inside=low <= measured <= high)
        mem = _memory(cfg, prof) if run_id in peaks else None
        if mem is not None:
            rec.update(
                predicted_peak_bytes=mem["total"],
                measured_peak_bytes=peaks[run_id],
                memory_ratio=mem["total"] / peaks[run_id],
                memory_breakdown_bytes=mem,
            )
        out.append(rec)
    return out


def _memory(cfg: TrainConfig, prof: Profile) -> dict | None:
    """The predicted peak, or None where the profile has no memory entry for the run's shape (a CPU profile, or a
    GPU one from before the entries were measured per block)."""
    from zerobench.sim.memory import predict_memory

    try:
        return predict_memory(cfg, prof)
    except KeyError:
        return None


def summarize(records: list[dict], ratio: str = "ratio") -> dict:
    """Median and worst |predicted ÷ measured − 1| of ``ratio`` (``ratio``: step time; ``memory_ratio``: peak
    memory) over the records that have it."""
    records = [r for r in records if ratio in r]
    errs = [abs(r[ratio] - 1) for r in records]
    if not errs:
        return {"runs": 0, "median_abs_error": None, "worst_abs_error": None}
    worst = max(records, key=lambda r: abs(r[ratio] - 1))
    out = {
        "runs": len(errs),
        "median_abs_error": statistics.median(errs),
        "worst_abs_error": max(errs),
        "worst_run": worst["run_id"],
    }
    if ratio == "ratio" and all("inside" in r for r in records):
        out["inside_interval"] = sum(r["inside"] for r in records)
    return out


def write_rows(out_dir, records: list[dict], prof: Profile, measured: str) -> None:
    """The validation as rows (run id ``sim-validation``): per measured run, the predicted step time
    (``sim_predicted_step_time_s``) and predicted ÷ measured (``sim_step_time_ratio``), each with the run,
    its axes, the profile's device and, where the profile carries spreads, the interval and whether the
    measured step is inside it; the report draws them."""
    from zerobench.results.rows import RowWriter, written_whole

    w = RowWriter(
        out_dir,
        "sim-validation",
        {"profile_device": prof.device, "interference": prof.interference, "measured": str(measured)},
    )
    with written_whole(w):  # an interrupted write leaves no rows that read as the whole validation
        _write_records(w, records, prof)


def _write_records(w, records: list[dict], prof: Profile) -> None:
    for r in records:
        keys = {
            "measured_run": r["run_id"],
            "stage": r["stage"],
            "dp": r["dp"],
            "tp": r["tp"],
            "layers": r["layers"],
            "hidden": r["hidden"],
            "measured_s": r["measured_s"],
            "in_fit": r["in_fit"],
            "profile_device": prof.device,
            "breakdown_s": r["breakdown_s"],
        }
        if "inside" in r:
            keys.update(
                predicted_low_s=r["predicted_low_s"], predicted_high_s=r["predicted_high_s"], inside=r["inside"]
            )
        w.write("sim_predicted_step_time_s", r["predicted_s"], "s", **keys)
        w.write("sim_step_time_ratio", r["ratio"], "ratio", **keys)
        if "memory_ratio" in r:
            mem = {
                "measured_peak_bytes": r["measured_peak_bytes"],
                "memory_breakdown_bytes": r["memory_breakdown_bytes"],
            }
            w.write("sim_predicted_peak_bytes", r["predicted_peak_bytes"], "bytes", **keys, **mem)
            w.write("sim_peak_memory_ratio", r["memory_ratio"], "ratio", **keys, **mem)
