"""``zerobench plan``: what a configuration needs per GPU, the paper's tables, dry runs, projections.

JSON output (``--json``) has stable keys:
- plan: ``{"config": {...}, "params": int, "params_per_mp_rank": int, "memory_bytes": {model_states, model_states_host,
  activation_checkpoints, activation_checkpoints_host, working_activations, buffers,
  fragmentation_allowance, total}, "fits": bool, "comm_elements_per_step": {dp, mp, pa, paper_mp},
  "max_layers"?: int, "max_params"?: int}``
- ``--table 1``: ``{"table": 1, "unit": "GB", "rows": [{"dp": N, "<size> <stage>": GB, ...}]}``
- ``--table 2``: ``{"table": 2, "unit": "params", "rows": [{"mp", "gpus", "baseline", "P_os", "P_os+g",
  "P_os+g+p"}]}``
- ``--dry-run``: ``{"rows": [{"label", "rank", "gpus", "mp", "dp", "stage", "params_per_mp_rank",
  "measured_model_state_bytes", "analytic_model_state_bytes", "padding_elements", "ledger"}]}``
- ``--project``: ``{"assumptions": {...}, "rows": [{"label", "system", "gpus", "mp", "fits",
  "hw_tflops_per_gpu", "model_tflops_per_gpu", "aggregate_pflops", ...}], "claims": [...]}``
"""

from __future__ import annotations

import dataclasses
import json

from zerobench.config import ConfigError, parse_bytes, to_dict
from zerobench.models.sizes import num_params
from zerobench.plan.comm_model import comm_per_gpu
from zerobench.plan.memory_model import PlanConfig, memory_per_gpu
from zerobench.plan.sizes import PAPER_SIZES
from zerobench.plan.suites import load_suite, plan_config, plan_configs


def _shape(args) -> dict:
    """layers/hidden/heads from ``--model``, ``--params`` or the flags themselves."""
    if args.model:
        if args.model not in PAPER_SIZES:
            raise ConfigError(f"unknown model size {args.model!r}: choose one of {', '.join(PAPER_SIZES)}")
        layers, hidden, heads = PAPER_SIZES[args.model]
    else:
        hidden, heads = args.hidden or 8192, args.heads or 64
        if args.params:
            per_layer = 12 * hidden * hidden + 13 * hidden
            layers = max(1, round((args.params - (args.vocab + args.seq) * hidden) / per_layer))
        elif args.layers:
            layers = args.layers
        elif args.max_size:
            layers = 1  # solved below
        else:
            raise ConfigError("give a model: --model NAME, --params N, or --layers/--hidden/--heads")
    return {"layers": args.layers or layers, "hidden": args.hidden or hidden, "heads": args.heads or heads}


def plan_run_spec(args):
    """The flags as the ``RunSpec`` a suite row would be (``zerobench.bench.spec``)."""
    from zerobench.bench.spec import RunSpec

    return RunSpec(
        **_shape(args),
        vocab=args.vocab,
        seq=args.seq,
        gpus=args.gpus,
        tp=args.tp,
        stage=args.stage,
        precision=getattr(args, "precision", "fp16"),
        micro_batch=args.micro_batch,
        checkpoint_activations=args.checkpoint_activations,
        pa=args.pa,
        pa_cpu=args.pa_cpu,
        bucket_size=args.bucket_size,
        md=args.md,
        optim_bits=args.optim_bits,
        offload_optimizer="cpu" if args.offload_optimizer else "none",
        offload_param="cpu" if args.offload_param else "none",
    )


def _plan_config(args) -> PlanConfig:
    """The flags as the ``RunSpec`` a suite row would be, resolved by the one resolver (same rules and
    errors as ``zerobench train`` and sweeps), then placed on the cluster the flags describe."""
    return plan_config(plan_run_spec(args), args.gpus_per_node, parse_bytes(args.gpu_mem))


def _emit(obj, as_json: bool, text: str) -> None:
    print(json.dumps(obj, indent=1, default=float) if as_json else text)


def run_plan(args) -> int:
    if args.table:
        return _tables(args)
    if args.dry_run:
        return _dry_run(args)
    if args.project:
        return _project(args)
    p = _plan_config(args)
    solved = None
    if args.max_size:  # the breakdown below is the solved model's (its layers at --hidden/--heads)
        from zerobench.plan.tables import max_size

        solved = max_size(p)
        if solved["max_layers"]:
            p = dataclasses.replace(p, model=dataclasses.replace(p.model, layers=solved["max_layers"]))
    mem, comm = memory_per_gpu(p), comm_per_gpu(p)
    out = {
        "config": to_dict(p),
        "params": num_params(p.model),
        "params_per_mp_rank": mem["params_per_mp_rank"],
        "memory_bytes": {k: v for k, v in mem.items() if k not in ("fits", "params_per_mp_rank")},
        "fits": mem["fits"],
        "comm_elements_per_step": {
            "dp": comm["dp_elements"],
            "mp": comm["mp_elements"],
            "pa": comm["pa_elements"],
            "paper_mp": comm["paper_mp_elements"],
        },
    }
    lines = [
        (
            f"model: {p.model.layers} layers, hidden {p.model.hidden}, heads {p.model.heads}, vocab "
            f"{p.model.vocab} (padded), seq {p.model.seq}: {out['params'] / 1e9:.2f}B params, "
            f"{out['params_per_mp_rank'] / 1e9:.3f}B per MP rank"
        ),
        (
            f"cluster: {p.gpus} GPUs ({p.gpus_per_node}/node), MP {p.mp} x DP {p.dp}, "
            f"{p.gpu_mem_bytes / 1e9:.1f} GB per GPU; ZeRO stage {p.stage}, micro-batch {p.micro_batch}"
        ),
        "memory per GPU (GB = 1e9 bytes):",
    ]
    for k, v in out["memory_bytes"].items():
        lines.append(f"  {k:<28} {v / 1e9:10.3f}")
    lines.append(f"  {'fits':<28} {'yes' if mem['fits'] else 'NO'}")
    lines.append(
        "communication per GPU and step (elements): "
        + ", ".join(f"{k} {v:.3e}" for k, v in out["comm_elements_per_step"].items())
    )
    if solved is not None:
        out.update(solved)
        lines.append(
            f"max size: {solved['max_layers']} layers = {solved['max_params'] / 1e9:.2f}B params fit "
            "(the model and memory above are at that size)"
        )
    _emit(out, args.json, "\n".join(lines))
    return 0


def _tables(args) -> int:
    from zerobench.plan.tables import table1, table2

    if args.table == 1:
        rows = table1()
        cols = [c for c in rows[0] if c != "dp"]
        text = [
            "Table 1: per-device model-state memory (GB) by ZeRO-DP stage, K = 12",
            "  " + f"{'DP':>5} " + " ".join(f"{c:>17}" for c in cols),
        ]
        text += ["  " + f"{r['dp']:>5} " + " ".join(f"{r[c]:>17.2f}" for c in cols) for r in rows]
        _emit({"table": 1, "unit": "GB", "rows": rows}, args.json, "\n".join(text))
    else:
        mem = parse_bytes(args.gpu_mem)
        rows = table2(mem)
        text = [
            f"Table 2: theoretical maximum model size (params) with {mem / 1e9:.0f} GB per GPU",
            "  " + f"{'MP':>3} {'GPUs':>5} {'baseline':>10} {'P_os':>10} {'P_os+g':>10} {'P_os+g+p':>10}",
        ]
        text += [
            "  "
            f"{r['mp']:>3} {r['gpus']:>5} "
            + " ".join(f"{_human(r[k]):>10}" for k in ("baseline", "P_os", "P_os+g", "P_os+g+p"))
            for r in rows
        ]
        _emit({"table": 2, "unit": "params", "rows": rows}, args.json, "\n".join(text))
    return 0


def _human(n: float) -> str:
    return f"{n / 1e12:.2f}T" if n >= 1e12 else f"{n / 1e9:.1f}B"


def _dry_run(args) -> int:
    from zerobench.plan.dry_run import dry_run

    if args.suite:
        todo = [
            (r["label"], p)
            for r, p in plan_configs(load_suite(args.suite), args.suite)
            if r.get("system") == "zerobench"
        ]
    else:
        todo = [("config", _plan_config(args))]
    rows = []
    for label, p in todo:
        if args.rank >= p.gpus:
            raise ConfigError(f"--rank {args.rank} is outside the {p.gpus}-GPU world")
        r = dry_run(p.model, p.gpus, p.mp, p.stage, rank=args.rank)
        rows.append({"label": label, **r})
        if not args.json:
            diff = r["measured_model_state_bytes"] / r["analytic_model_state_bytes"] - 1
            print(
                f"  {label:<16} {p.gpus:>4} GPUs MP {p.mp:>2} stage {p.stage}: engine {r['measured_model_state_bytes'] / 1e9:9.3f} GB"
                f"  analytic {r['analytic_model_state_bytes'] / 1e9:9.3f} GB  ({diff * 100:+.4f}%, padding "
                f"{r['padding_elements']} elements)",
                flush=True,
            )
    if args.json:
        print(json.dumps({"rows": rows}, indent=1, default=float))
    return 0


MODEL_NOTE = (
    "the quick analytic projection (zerobench.plan.perf_model: FLOPs at an assumed efficiency plus "
    "α-β communication, unvalidated); `zerobench simulate` replays the engine's schedule on a measured "
    "profile instead"
)


def _project(args) -> int:
    import csv

    from zerobench.bench.suite import SUITES_DIR as SUITES
    from zerobench.plan.perf_model import HARDWARE, project

    if args.hardware not in HARDWARE:
        raise ConfigError(f"unknown hardware {args.hardware!r}: choose one of {', '.join(HARDWARE)}")
    hw = HARDWARE[args.hardware]
    rows = []
    for r, suite_plan in plan_configs(load_suite(args.project), args.project):
        p = dataclasses.replace(suite_plan, gpus_per_node=hw.gpus_per_node, gpu_mem_bytes=hw.mem_bytes)
        proj = project(p, hw, efficiency=args.efficiency, dp_overlap=args.dp_overlap)
        mem = memory_per_gpu(p)
        rows.append(
            {
                "label": r["label"],
                "system": r.get("system"),
                "gpus": p.gpus,
                "mp": p.mp,
                "fits": mem["fits"],
                "memory_gb": mem["total"] / 1e9,
                **proj,
            }
        )
    with open(SUITES / "paper" / "claims.csv", newline="") as f:
        claims = list(csv.DictReader(f))
    assumptions = {
        "model": MODEL_NOTE,
        "hardware": hw.name,
        "efficiency": args.efficiency,
        "dp_overlap": args.dp_overlap,
        "flops": "Megatron count with recompute (hardware FLOPs)",
        "dtype_bytes": 2,
    }
    if args.json:
        print(json.dumps({"assumptions": assumptions, "rows": rows, "claims": claims}, indent=1, default=float))
        return 0
    print(f"model: {MODEL_NOTE}")
    print(
        f"projection on {hw.name}: efficiency {args.efficiency} of {hw.peak_flops / 1e12:.0f} TFLOP/s peak, "
        f"{args.dp_overlap:.0%} of backward can hide DP traffic (assumptions, not fitted to the paper)"
    )
    print(
        f"  {'run':<22} {'GPUs':>4} {'MP':>3} {'fits':>4} {'mem GB':>7} {'TFLOPs/GPU':>10} {'PFLOPs':>7} "
        f"{'compute s':>9} {'MP s':>6} {'DP exp s':>8}"
    )
    for r in rows:
        print(
            f"  {r['label']:<22} {r['gpus']:>4} {r['mp']:>3} {'yes' if r['fits'] else 'NO':>4} "
            f"{r['memory_gb']:7.1f} {r['hw_tflops_per_gpu']:10.1f} {r['aggregate_pflops']:7.2f} "
            f"{r['t_compute_s']:9.2f} {r['t_mp_s']:6.2f} {r['t_dp_exposed_s']:8.2f}"
        )
    _compare_claims(rows)
    return 0


def _compare_claims(rows: list[dict]) -> None:
    """Print the paper's stated numbers next to the projection and the gap between them."""
    by = {r["label"]: r for r in rows}
    checks = []
    if "100B ZeRO" in by:
        checks.append(("ZeRO 100B, TFLOPs/GPU", ">38", by["100B ZeRO"]["hw_tflops_per_gpu"], 38))
    zero_8_100 = [
        by[k]["aggregate_pflops"]
        for k in by
        if k.endswith("ZeRO") and k.split("B")[0] in ("8", "20", "40", "60", "80", "100")
    ]
    if zero_8_100:
        checks.append(("ZeRO 8B-100B, average aggregate PFLOPs", "15", sum(zero_8_100) / len(zero_8_100), 15))
    if "40B Baseline" in by:
        checks.append(("Megatron 40B across nodes, TFLOPs/GPU", "about 5", by["40B Baseline"]["hw_tflops_per_gpu"], 5))
    if not checks:
        return
    print("\nthe paper's statements vs this projection (the model is not tuned to match):")
    for what, paper, ours, ref in checks:
        print(f"  {what:<42} paper {paper:>7}   projected {ours:8.2f}   ({(ours / ref - 1) * 100:+.0f}%)")
