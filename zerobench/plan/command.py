"""``zerobench plan``: what a configuration needs per GPU, the paper's tables and dry runs. Throughput is the
simulator's (``zerobench simulate``), the one performance model.

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
"""

from __future__ import annotations

import dataclasses
import json
import sys

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
            per_layer, fixed = 12 * hidden * hidden + 13 * hidden, (args.vocab + args.seq) * hidden
            if args.params < fixed + per_layer / 2:
                raise ConfigError(
                    f"--params {args.params:g} is below one layer at hidden {hidden}: the embeddings alone hold "
                    f"{fixed:,} parameters; give more parameters or a smaller --hidden"
                )
            layers = round((args.params - fixed) / per_layer)
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
        offload_optimizer=args.offload_optimizer or "none",
        offload_param=args.offload_param or "none",
    )


def _plan_config(args) -> PlanConfig:
    """The flags as the ``RunSpec`` a suite row would be, resolved by the one resolver (same rules and
    errors as ``zerobench train`` and sweeps), then placed on the cluster the flags describe."""
    return plan_config(plan_run_spec(args), args.gpus_per_node, parse_bytes(args.gpu_mem))


def _emit(obj, as_json: bool, text: str) -> None:
    print(json.dumps(obj, indent=1, default=float) if as_json else text)


_MODEL_FLAGS = ("model", "params", "layers", "hidden", "heads")


def _check_combination(args) -> None:
    """One line for flags that the report asked for would ignore (before, a plan of something else was printed)."""
    if args.table and (args.max_size or args.dry_run):
        raise ConfigError("--table prints the paper's table alone: drop --max-size/--dry-run, or drop --table")
    model = next((k for k in _MODEL_FLAGS if getattr(args, k, None)), None)
    if args.table and model:  # before, the table was printed as if the flag were not given
        raise ConfigError(f"--table {args.table} is the paper's own models: drop --{model}, or drop --table")
    if args.dry_run and args.max_size:
        raise ConfigError(
            "--dry-run builds the engine for a given model: solve the size first (--max-size without --dry-run), "
            "then dry-run that many --layers"
        )
    if args.dry_run and args.suite and any(getattr(args, k, None) for k in _MODEL_FLAGS):
        raise ConfigError("--dry-run --suite plans the suite's own rows: drop the model flags, or drop --suite")


def run_plan(args) -> int:
    _check_combination(args)
    if args.table:
        return _tables(args)
    if args.dry_run:
        return _dry_run(args)
    if args.project:
        raise ConfigError(
            "plan --project is gone: project a suite with the simulator, `zerobench simulate --profile v100-dgx2 "
            "--suite SUITE` (a100-dgx, h100-dgx), or the paper's figures with `zerobench simulate --paper`"
        )
    p = _plan_config(args)
    solved = None
    if args.max_size:  # the breakdown below is the solved model's (its layers at --hidden/--heads)
        from zerobench.plan.tables import max_size

        solved = max_size(p)
        if solved["at_least"]:
            print(
                f"zerobench: warning: the search's limit of {solved['max_layers']} layers fits: the largest model is "
                "at least that (check the host memory an offloaded plan needs: model_states_host)",
                file=sys.stderr,
            )
        if not solved["max_layers"]:
            one = memory_per_gpu(dataclasses.replace(p, model=dataclasses.replace(p.model, layers=1)))
            raise ConfigError(
                f"no layer count fits: 1 layer needs {one['total'] / 1e9:.2f} GB per GPU, more than the "
                f"{p.gpu_mem_bytes / 1e9:.2f} GB given: give more memory (--gpu-mem), GPUs or MP, a higher stage, "
                "or a smaller hidden size or micro-batch"
            )
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
            f"{p.model.vocab}, seq {p.model.seq}: {out['params'] / 1e9:.2f}B params, "
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
            f"max size: {'at least ' if solved['at_least'] else ''}{solved['max_layers']} layers = "
            f"{solved['max_params'] / 1e9:.2f}B params fit (the model and memory above are at that size)"
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
        suite = load_suite(args.suite)
        rows = plan_configs(suite, args.suite)
        todo = [(r["label"], p) for r, p in rows if (r.get("system") or "zerobench") == "zerobench"]
        left = len(suite.get("runs") or []) - len(todo)
        if not todo:  # before, nothing was built and the command exited 0
            raise ConfigError(
                f"{args.suite} has no zerobench row with layers to build: dry-run a suite with such rows (e.g. "
                "paper/fig2), or give the model's flags without --suite"
            )
    else:
        todo, left = [("config", _plan_config(args))], 0
    small = next(((label, p) for label, p in todo if args.rank >= p.gpus), None)
    if small:  # every row, before the first is built and printed
        label, p = small
        where = f" of row {label}" if args.suite else ""
        raise ConfigError(f"--rank {args.rank} is outside the {p.gpus}-GPU world{where}: give a rank below {p.gpus}")
    if left:  # a peer's row (a baseline system) or one without a layer count: not this engine's to build
        print(
            f"zerobench: note: {left} row(s) of {args.suite} are not zerobench runs with --layers: not built",
            file=sys.stderr,
        )
    rows = []
    for label, p in todo:
        r = dry_run(p, rank=args.rank)
        rows.append({"label": label, **r})
        if not args.json:
            measured, analytic = r["measured_model_state_bytes"], r["analytic_model_state_bytes"]
            diff = measured / analytic - 1 if analytic else 0.0 if measured == 0 else float("inf")  # all offloaded: 0
            print(
                f"  {label:<16} {p.gpus:>4} GPUs MP {p.mp:>2} stage {p.stage}: engine {r['measured_model_state_bytes'] / 1e9:9.3f} GB"
                f"  analytic {r['analytic_model_state_bytes'] / 1e9:9.3f} GB  ({diff * 100:+.4f}%, padding "
                f"{r['padding_elements']} elements)",
                flush=True,
            )
    if args.json:
        print(json.dumps({"rows": rows}, indent=1, default=float))
    return 0
