"""``zerobench profile``: this host's costs for a suite's configurations, measured in passes of replicates
(``zerobench.sim.profiler``), written as rows of kind ``profile``."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from zerobench.config import ConfigError
from zerobench.sim.command import _configs, _device, _device_kind


def _plant():
    """The test-only slow piece ``train.faults.PROFILE_PLANT_ENV`` asks for (``SECONDS[:REPLICATES]``), or None."""
    import os

    from zerobench.sim.measure import Plant
    from zerobench.train.faults import PROFILE_PLANT_ENV

    spec = os.environ.get(PROFILE_PLANT_ENV)
    if not spec:
        return None
    seconds, _, reps = spec.partition(":")
    try:
        return Plant(float(seconds), int(reps or 1))
    except ValueError:
        raise ConfigError(f"{PROFILE_PLANT_ENV}={spec!r}: give SECONDS[:REPLICATES], e.g. 0.02:1") from None


def run_profile(args: argparse.Namespace) -> int:
    from zerobench.results.lock import claim

    threshold, limit = getattr(args, "max_spread", None), getattr(args, "time_limit", None)
    if threshold is not None and not 0 < threshold < 1:
        raise ConfigError(f"--max-spread {threshold}: give a fraction between 0 and 1, e.g. 0.05 (±5%)")
    if limit is not None and not 0 <= limit < float("inf"):  # nan and inf were taken: inf re-measured without end
        raise ConfigError(f"--time-limit {limit}: give finite seconds >= 0 (0: the two passes every profile takes)")
    with claim(args.out):  # one writer at a time: two profiles into one --out would each stage over the other's rows
        return _run_profile(args)


def _run_profile(args: argparse.Namespace) -> int:
    import dataclasses

    import torch

    from zerobench.launch.local import usable_cpus
    from zerobench.results.outdir import check_fresh_run_dir
    from zerobench.results.rows import RowWriter, written_whole
    from zerobench.sim.measure import jobs_for
    from zerobench.sim.measure_compute import STATISTIC
    from zerobench.sim.profiler import profile_suite

    out = Path(args.out)
    threshold, limit = getattr(args, "max_spread", None), getattr(args, "time_limit", None)
    check_fresh_run_dir(out)
    cores = usable_cpus()
    configs = [cfg for _, cfg in _configs(args.suite)]
    kind = _device_kind(getattr(args, "device", "cpu"))
    device = _device(kind, cores)
    jobs = jobs_for(configs, cores, device=kind, gpus=torch.cuda.device_count() if kind == "cuda" else 0)
    plant = _plant()
    if plant is not None:
        jobs = [dataclasses.replace(j, plant=plant) for j in jobs]
    for i, job in enumerate(jobs, 1):
        print(
            f"[{i}/{len(jobs)}] {job.ranks} process(es) x {job.threads} thread(s): {len(job.shapes)} shape(s), "
            f"collectives on groups of {list(job.groups) or 'none'}",
            file=sys.stderr,
            flush=True,
        )
    kw = {k: v for k, v in (("threshold", threshold), ("time_limit_s", limit)) if v is not None}
    done = profile_suite(jobs, device, cores, **kw)
    prof = done.profile
    w = RowWriter(
        out,
        "profile",
        {
            "suite": args.suite,
            "device": device,
            "cores": cores,
            "statistic": STATISTIC,
            "max_spread": done.tally.threshold,
            "time_limit_s": done.time_limit_s,
        },
    )
    with written_whole(w):  # a profile cut short (killed, disk full) must not read as a whole one
        for row in prof.rows():
            metric, value, unit = row.pop("metric"), row.pop("value"), row.pop("unit")
            w.write(metric, value, unit, kind="profile", device=device, cores=cores, **row)
    noisy = done.noisy()
    if noisy:
        print(noisy, file=sys.stderr)
    print(
        f"profile of {device}: {len(prof.ops)} ops, {len(prof.curves)} collective curves, "
        f"{len(prof.memory)} memory entries in {done.seconds:.0f} s, "
        f"{'some pieces unsettled' if noisy else f'every piece settled within ±{done.tally.threshold:.0%}'} -> {out}"
    )
    return 0
