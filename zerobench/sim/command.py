"""``zerobench profile`` and ``zerobench simulate``: measure this device's costs, replay configurations on a
profile, and check the predictions against measured runs."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
from pathlib import Path

from zerobench.config import ConfigError

PROFILE_MAX_LAYERS = 4096
"""The most layers ``plan --max-size --profile`` searches; where that many fit, it says "at least"."""


def _configs(suite: str) -> list[tuple[str, object]]:
    """(label, config) of the suite's zerobench runs; the others (a Megatron-LM baseline, a peer) are named on
    stderr, never dropped without a word."""
    from zerobench.bench.suite import load

    s = load(suite)
    ours = [r for r in s.runs if r.spec.system == "zerobench"]  # the simulator replays zerobench's own runs
    others = [r.label for r in s.runs if r.spec.system != "zerobench"]
    if others:
        print(
            f"note: {len(others)} runs of other systems are not predicted (the simulator replays zerobench's engine): "
            f"{', '.join(others[:6])}{' ...' if len(others) > 6 else ''}",
            file=sys.stderr,
        )
    bad = [r for r in ours if r.config is None]
    if bad:
        raise ConfigError(f"{s.path}: run {bad[0].label!r} is invalid: {bad[0].error}")
    return [(r.label, r.config) for r in ours]


def _software(suite: str) -> str:
    """The program a suite's runs are: its ``cluster.software`` (the paper's suites:
    ``megatron-2019+deepspeed-0.2``), else zerobench's own. Only a stated device reads it."""
    from zerobench.bench.suite import load

    return str(load(suite).cluster.get("software", "zerobench"))


def _device(kind: str, cores: int) -> str:
    """What the profile is of: ``cpu: MODEL (N cores)`` or ``cuda: GPU NAME (N host cores)``."""
    import torch

    from zerobench.results.provenance import cpu_model

    if kind == "cuda":
        n = torch.cuda.device_count()
        return f"cuda: {f'{n} x ' if n > 1 else ''}{torch.cuda.get_device_name(0)} ({cores} host cores)"
    return f"cpu: {cpu_model()} ({cores} cores)"


def _device_kind(asked: str) -> str:
    import torch

    if asked == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if asked == "cuda" and not torch.cuda.is_available():
        raise ConfigError("--device cuda: this machine has no CUDA device; use --device cpu (or auto)")
    return asked


def _load_profile(path: str, software: str = "zerobench"):
    """A measured profile's rows, or a stated device by name running ``software`` (a program of
    ``zerobench.sim.software.STACKS``), at its device class's fitted compute_scale."""
    from zerobench.results.rows import ROWS_FILE, partial_path, read_rows
    from zerobench.sim.profile import Profile
    from zerobench.sim.stated import DEVICES

    if path in DEVICES:
        from zerobench.sim.paper import stated_profile
        from zerobench.sim.software import STACKS

        if software not in STACKS:
            raise ConfigError(
                f"the suite's cluster.software {software!r} is not a described program: choose one of "
                f"{', '.join(STACKS)}"
            )
        return stated_profile(path, software)

    if not Path(path).exists():
        raise ConfigError(
            f"--profile {path}: neither a profile's results (`zerobench profile --out DIR`) nor a stated device "
            f"({', '.join(DEVICES)})"
        )
    if Path(path).name == partial_path(Path(ROWS_FILE)).name:
        raise ConfigError(
            f"--profile {path}: the part of a profile's rows written before it stopped, never read: run "
            "`zerobench profile` again into a new directory"
        )
    rows = read_rows(path)
    if Path(path).is_dir() and not any(r.get("metric", "").startswith("profile_") for r in rows):
        cut = next(Path(path).rglob(partial_path(Path(ROWS_FILE)).name), None)
        if cut is not None:
            raise ConfigError(
                f"{path}: the profile stopped while its rows were written ({cut} holds part of them, never read): "
                "run `zerobench profile` again into a new directory"
            )
    try:
        return Profile.from_rows(rows)
    except ValueError as e:
        raise ConfigError(f"{path}: {e}") from None


def run_simulate(args: argparse.Namespace) -> int:
    from zerobench.sim.simulate import interval, simulate, undescribed

    if args.paper:
        return _paper(args)
    if getattr(args, "validate_published", None) is not None:
        return _published(args)
    if not args.profile:
        raise ConfigError(
            "give --profile: a profile's rows (`zerobench profile --out DIR`) or a stated device "
            "(v100-dgx2, v100-dgx2h, a100-dgx, h100-dgx)"
        )
    prof = _load_profile(args.profile, _software(args.suite) if args.suite and not args.validate else "zerobench")
    if args.validate:
        from zerobench.sim.validate_command import run_validate

        return run_validate(args, prof)
    if not args.suite:
        raise ConfigError("give --suite SUITE to predict its runs, or --validate RESULTS to check measured ones")
    for flag, given in (("--out", args.out), ("--fit", args.fit)):
        if given:  # a suite's prediction prints JSON lines; it writes no rows and fits nothing
            raise ConfigError(f"{flag} is for --validate RESULTS (or --paper): drop it, or validate measured runs")
    bounds = (prof.bound(-1), prof.bound(+1)) if prof.has_spread else None
    for label, cfg in _configs(args.suite):
        missing = undescribed(cfg)
        if missing:
            print(
                f"note: run {label!r} is not predicted: the simulator does not describe {', '.join(missing)}",
                file=sys.stderr,
            )
            continue
        over = _does_not_fit(cfg, prof)
        if over:
            print(f"note: run {label!r} is not predicted: {over}", file=sys.stderr)
            continue
        try:
            r = simulate(cfg, prof)
            r.pop("timeline")
            if bounds is not None:
                r["step_time_interval_s"] = list(interval(cfg, prof, bounds))
        except KeyError as e:
            raise ConfigError(str(e.args[0])) from None
        shape = {"stage": cfg.zero.stage, "dp": cfg.dp, "tp": cfg.tp, "layers": cfg.model.layers}
        print(json.dumps({"label": label, **shape, **r}))
    return 0


def _does_not_fit(cfg, prof) -> str | None:
    """Why ``cfg`` cannot run on ``prof``'s card, or None. Only a stated device states its card; a run whose model
    states alone (``sim.memory.state_floor``, a lower bound) exceed it would stop at its first step, so a step
    time for it would be a number for nothing. The card is read at its binary size, the generous reading."""
    from zerobench.sim.gpu_costs import StatedProfile
    from zerobench.sim.memory import state_floor

    if not isinstance(prof, StatedProfile):
        return None
    floor = state_floor(cfg, prof.stack)
    card = prof.dev.mem_bytes / 1e9 * 2**30
    if floor["bytes"] <= card:
        return None
    return (
        f"its model states alone need {floor['bytes'] / 2**30:.1f} GiB a GPU ({floor['params'] / 1e9:.2f}B "
        f"parameters x {floor['per_param']:.2f} bytes), over the {card / 2**30:.0f} GiB card of {prof.device}: "
        "raise the ZeRO stage, tp or gpus"
    )


def _paper(args: argparse.Namespace) -> int:
    from zerobench.sim.paper import CALIBRATED, predict_paper
    from zerobench.sim.paper_text import format_paper, paper_rows

    device = args.profile or "v100-dgx2"
    if device not in CALIBRATED:
        raise ConfigError(
            f"--paper predicts the paper's V100 cluster: give --profile v100-dgx2 (or leave it out), not {device!r}"
        )
    with _result_dir(args.out) as write:
        out = predict_paper(device, progress=lambda msg: print(f"  {msg}", file=sys.stderr, flush=True))
        write("sim-paper", {"device": out["device"], "chosen_convention": out["chosen"]}, paper_rows(out))
    print(json.dumps(out, indent=1, default=float) if args.json else format_paper(out))
    return 0


@contextlib.contextmanager
def _result_dir(out: str | None):
    """``--out``, claimed for this process (``results.lock.claim``) and checked to hold no result yet, for the
    block; it yields ``write(run_id, config, rows)``, which writes the rows all at once or not at all
    (``written_whole``: an interrupted write leaves none that read as a whole result). Without ``--out``,
    ``write`` does nothing."""
    if not out:
        yield lambda *_: None
        return
    from zerobench.results.lock import claim
    from zerobench.results.outdir import check_fresh_run_dir
    from zerobench.results.rows import RowWriter, written_whole

    def write(run_id: str, config: dict, rows: list[dict]) -> None:
        w = RowWriter(out, run_id, config)
        with written_whole(w):
            for row in rows:
                metric, value, unit = row.pop("metric"), row.pop("value"), row.pop("unit")
                w.write(metric, value, unit, **row)

    with claim(out):
        check_fresh_run_dir(Path(out))
        yield write


def _published(args: argparse.Namespace) -> int:
    from zerobench.sim.published import TABLE, load
    from zerobench.sim.published_text import format_published, published_rows
    from zerobench.sim.published_validate import predict

    if args.profile or args.suite or args.validate:
        raise ConfigError(
            "--validate-published predicts every row on its own stated device: drop --profile, --suite and --validate"
        )
    path = TABLE if args.validate_published is True else args.validate_published
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(
            f"--validate-published {path}: cannot read it: {e.strerror or e}: give a published table's CSV "
            f"(default {TABLE})"
        ) from None
    try:
        rows = load(path, data)
    except UnicodeDecodeError:
        raise ConfigError(f"--validate-published {path}: not a CSV table (not UTF-8 text)") from None
    except ValueError as e:
        raise ConfigError(str(e)) from None
    with _result_dir(args.out) as write:
        out = predict(rows)
        write("sim-published", _table_identity(Path(path), data), published_rows(out))
    if args.json:
        print(json.dumps(published_rows(out), indent=1, default=float))
    else:
        print(format_published(out))
    return 0


def _table_identity(path: Path, data: bytes) -> dict:
    """The published table as the rows' config: its path relative to the checkout zerobench runs from where it lies
    inside it (so the same table gives the same config hash on every checkout; else the path as given) and the
    SHA-256 of ``data``, the bytes that were read and predicted."""
    import hashlib

    from zerobench.results.provenance import REPO

    p = path.resolve()
    name = str(p.relative_to(REPO)) if p.is_relative_to(REPO) else str(path)
    return {"table": name, "table_sha256": hashlib.sha256(data).hexdigest()}


def run_measured_max_size(args: argparse.Namespace) -> int:
    """``zerobench plan --max-size --profile P``: the largest model of the flags' shape whose peak, as the
    measured memory planner predicts it (``zerobench.sim.memory``), fits ``--gpu-mem``; the breakdown at it."""
    import dataclasses

    from zerobench.bench.spec import to_train_config
    from zerobench.config import parse_bytes
    from zerobench.models.sizes import num_params
    from zerobench.plan.command import plan_run_spec
    from zerobench.sim.memory import max_layers, predict_memory

    if not args.max_size:
        raise ConfigError("--profile plans from measured memory terms for --max-size: add --max-size")
    prof = _load_profile(args.profile)
    if not prof.memory:
        raise ConfigError(
            f"{args.profile}: the profile has no memory entries: take one on a GPU (`zerobench profile --device cuda`)"
        )
    cfg = to_train_config(plan_run_spec(args), check_system=False)
    budget = parse_bytes(args.gpu_mem)
    limit = PROFILE_MAX_LAYERS
    try:
        layers = max_layers(cfg, prof, budget, limit)
        solved = dataclasses.replace(cfg, model=dataclasses.replace(cfg.model, layers=max(layers, 1)))
        mem = predict_memory(solved, prof)
    except KeyError as e:
        raise ConfigError(str(e.args[0])) from None
    out = {
        "memory_model": f"measured: {prof.device} ({args.profile})",
        "budget_bytes": budget,
        "max_layers": layers,
        "max_params": num_params(solved.model) if layers else 0,
        "at_least": layers == limit,  # the search's limit fits: a lower bound
        "memory_bytes": mem if layers else {},
    }
    if args.json:
        print(json.dumps(out, indent=1))
        return 0
    m = cfg.model
    print(f"memory model: {out['memory_model']}")
    print(
        f"shape: hidden {m.hidden}, heads {m.heads}, vocab {m.vocab}, seq {m.seq}, micro-batch {cfg.micro_batch}, "
        f"{cfg.zero.precision.value}, stage {cfg.zero.stage}, dp {cfg.dp} x tp {cfg.tp}"
    )
    if not layers:
        print(f"max size: not even one layer fits {budget / 2**30:.2f} GiB")
        return 0
    print(
        f"max size: {'at least ' if out['at_least'] else ''}{layers} layers = {out['max_params'] / 1e9:.3f}B params "
        f"fit {budget / 2**30:.2f} GiB; "
        "predicted peak there (max_memory_allocated), GiB:"
    )
    for k, v in mem.items():
        print(f"  {k:<26} {v / 2**30:10.3f}")
    return 0
