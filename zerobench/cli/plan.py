"""``zerobench plan``: analytic memory/communication planning and dry runs (throughput: ``zerobench simulate``)."""

from __future__ import annotations

import argparse

from zerobench.cli.types import Renamed, byte_size, count, number, path


def _add_plan_args(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group("what to report")
    g.add_argument("--table", type=int, choices=[1, 2], help="print the paper's Table 1 or Table 2, computed")
    g.add_argument("--max-size", action="store_true", help="solve for the largest --layers that fits")
    g.add_argument(
        "--profile",
        type=path,
        help="with --max-size: plan memory from a GPU profile's measured terms (`zerobench "
        "profile --device cuda`) instead of the paper's formulas and allowance; give the "
        "profiled shape (--hidden --heads --vocab --seq --micro-batch --precision --gpus 1)",
    )
    g.add_argument(
        "--dry-run",
        action="store_true",
        help="build the real engine for one rank on the fake backend and compare its bytes",
    )
    g.add_argument("--suite", type=path, help="with --dry-run: every zerobench row of a suite (e.g. paper/fig2)")
    g.add_argument("--rank", type=count(0), default=0, help="with --dry-run: the rank to measure")
    g.add_argument("--project", metavar="SUITE", help=argparse.SUPPRESS)  # moved: one line names where to
    g.add_argument(
        "--json", action="store_true", help="machine-readable output (keys documented in zerobench.plan.command)"
    )
    g = p.add_argument_group("model")
    g.add_argument("--model", help="a named size from the paper's tables (e.g. 100B, 170B, fig4-13B)")
    g.add_argument("--params", type=number(above=0), help="target parameter count (layers solved at --hidden/--heads)")
    g.add_argument("--layers", type=count(1))
    g.add_argument("--hidden", type=count(1))
    g.add_argument("--heads", type=count(1))
    g.add_argument("--seq", type=count(1), default=1024)
    g.add_argument(
        "--vocab", type=count(1), default=50257, help="padded to a multiple of 128 x MP where MP does not divide it"
    )
    g = p.add_argument_group("cluster and parallelism")
    g.add_argument("--gpus", type=count(1), default=400)
    g.add_argument("--gpus-per-node", type=count(1), default=16)
    g.add_argument("--tp", type=count(1), default=1, help="tensor (model) parallel degree: the paper's MP")
    g.add_argument("--mp", action=Renamed, new="--tp", help=argparse.SUPPRESS)
    g.add_argument(
        "--gpu-mem",
        type=byte_size,
        default="32GB",
        help="memory per GPU, e.g. 32GB (1e9 bytes) or 80GiB (default 32GB: the paper's figure for its V100s, 32e9 "
        "bytes; nvidia-smi reports 32510MiB for a V100-32GB, less the CUDA context's share: give that to plan for the "
        "card)",
    )
    g.add_argument("--micro-batch", type=count(1), default=1, help="sequences per DP replica per micro-batch")
    g.add_argument(
        "--precision",
        choices=("fp16", "bf16", "fp32"),
        default="fp16",
        help="training precision (the paper's fp16; with --profile, the profile's)",
    )
    g.add_argument("--stage", type=int, default=2, help="ZeRO-DP stage 0-3")
    g.add_argument("--checkpoint-activations", action="store_true")
    g.add_argument("--pa", action="store_true", help="P_a")
    g.add_argument("--pa-cpu", action="store_true", help="P_a+cpu")
    g.add_argument("--bucket-size", type=count(1), default=500_000_000, help="C_B bucket size in elements")
    g.add_argument("--cb-size", action=Renamed, new="--bucket-size", help=argparse.SUPPRESS)
    g.add_argument("--md", action="store_true", help="M_D (smaller fragmentation allowance)")
    g.add_argument(
        "--optim-bits", type=int, default=32, choices=[32, 8], help="Adam moments: fp32 (K=12) or 8-bit (K~6)"
    )
    g.add_argument(
        "--offload-optimizer",
        nargs="?",
        const="cpu",
        choices=("cpu",),
        help="ZeRO-Offload: optimizer states in host memory (train's flag; NVMe frees the GPU the same way)",
    )
    g.add_argument(
        "--offload-param",
        nargs="?",
        const="cpu",
        choices=("cpu",),
        help="stage 3: the parameter partition in host memory too",
    )


def _check_flags(args: argparse.Namespace) -> None:
    """Flags that would be ignored, or two that say the model twice: one line, before anything runs."""
    from zerobench.config import ConfigError

    if not args.dry_run:
        for flag, given in (("--rank", args.rank != 0), ("--suite", args.suite is not None)):
            if given:
                raise ConfigError(f"{flag} is for --dry-run: add --dry-run, or drop {flag}")
    if args.table:
        _check_table_flags(args)
    if args.model and args.params:
        raise ConfigError("give the model once: --model NAME or --params N, not both")
    if args.params and args.layers:
        raise ConfigError("--params solves for the layers: give --params N or --layers N, not both")
    if args.model and args.layers and args.hidden and args.heads:
        raise ConfigError(
            f"--layers, --hidden and --heads replace all of --model {args.model}'s shape: drop --model, or give "
            "only what changes"
        )


_TABLE_READS = {1: {"table", "json"}, 2: {"table", "json", "gpu_mem"}}
"""What ``--table N`` reads; ``--max-size``, ``--dry-run`` and the model flags have lines of their own
(``zerobench.plan.command``)."""
_TABLE_OWN_LINES = {"max_size", "dry_run", "model", "params", "layers", "hidden", "heads"}


def _check_table_flags(args: argparse.Namespace) -> None:
    """``--table N`` prints the paper's table for the paper's own runs: a flag it does not read, given a value other
    than its default, is refused in one line (before, ``--table 2 --gpus 64 --tp 4`` printed the paper's table as if
    the flags were not given)."""
    from zerobench.config import ConfigError

    reads = _TABLE_READS[args.table] | _TABLE_OWN_LINES
    for dest, flag, default in args.plan_flags:
        if dest not in reads and getattr(args, dest, default) != default:
            also = " (it reads --gpu-mem)" if args.table == 2 else ""
            raise ConfigError(
                f"--table {args.table} is the paper's table for its own runs and does not read {flag}{also}: drop "
                f"{flag}, or drop --table for a plan of your configuration"
            )


def cmd_plan(args: argparse.Namespace) -> int:
    _check_flags(args)
    if args.profile:
        from zerobench.sim.command import run_measured_max_size

        return run_measured_max_size(args)
    from zerobench.plan.command import run_plan

    return run_plan(args)


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to the ``zerobench`` parser."""
    pl = sub.add_parser(
        "plan",
        help="memory/communication analysis, the paper's tables, dry runs",
        description="Plan a configuration without a cluster: per-GPU memory and communication "
        "by the paper's analysis, Tables 1 and 2, the largest model that fits, a dry "
        "run of the real engine on the fake backend. Throughput: zerobench simulate.",
    )
    _add_plan_args(pl)
    given_none = vars(pl.parse_args([]))  # each flag's value when not given (string defaults through their type)
    flags = [(a.dest, a.option_strings[0], given_none[a.dest]) for a in pl._actions if a.dest in given_none]
    pl.set_defaults(func=cmd_plan, plan_flags=flags)
