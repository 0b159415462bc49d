"""``zerobench profile`` and ``zerobench simulate``: the performance simulator's commands."""

from __future__ import annotations

import argparse

from zerobench.cli.types import path


def cmd_profile(args: argparse.Namespace) -> int:
    from zerobench.sim.profile_command import run_profile

    return run_profile(args)


def cmd_simulate(args: argparse.Namespace) -> int:
    from zerobench.sim.command import run_simulate

    return run_simulate(args)


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommands to the ``zerobench`` parser."""
    p = sub.add_parser(
        "profile",
        help="measure this host's per-op and collective costs for a suite's shapes",
        description="Measure, with every rank of each configuration running at once on this host, "
        "the compute pieces of a step at the suite's exact shapes, the engine's "
        "per-element costs and the collectives from 1 KiB to 64 MiB (1 GiB on GPUs); rows of kind "
        "'profile' for `zerobench simulate`. Each piece is measured in replicates spread over "
        "the profiling time, outliers rejected and re-measured, until its replicates agree "
        "(--max-spread) or --time-limit passes; each entry keeps its spread, and a profile "
        "whose pieces did not all settle says so in one line.",
    )
    p.add_argument(
        "--suite", type=path, required=True, help="the configurations to profile for (e.g. cpu/sim_validation)"
    )
    p.add_argument("--out", type=path, required=True, help="directory for the profile's rows")
    p.add_argument(
        "--device",
        choices=("auto", "cpu", "cuda"),
        default="auto",
        help="what to profile: this node's GPUs where it has them (auto), or the CPU processes; on "
        "GPUs each rank of a run has a card of its own (NCCL), so a world of N needs N of them",
    )
    p.add_argument(
        "--max-spread",
        type=float,
        default=None,
        metavar="FRACTION",
        help="a piece has settled when its replicates lie within ± this fraction of their mean (or "
        "50 us); pieces that have not are measured again until --time-limit (default 0.05)",
    )
    p.add_argument(
        "--time-limit",
        type=float,
        default=None,
        metavar="SECONDS",
        help="stop re-measuring unsettled pieces after this many seconds; the two passes every profile "
        "takes always complete (default 300)",
    )
    p.set_defaults(func=cmd_profile)
    s = sub.add_parser(
        "simulate",
        help="replay the engine's step on a profile; check predictions against runs",
        description="Predict step time, its critical path and TFLOPs of a suite's runs from a "
        "profile (discrete-event replay of the engine's schedule), or compare the "
        "predictions with measured runs (--validate).",
    )
    s.add_argument(
        "--profile",
        type=path,
        help="a profile's rows (from `zerobench profile`), or a stated device: v100-dgx2, "
        "v100-dgx2h, a100-dgx, h100-dgx (zerobench/sim/stated.py)",
    )
    s.add_argument("--suite", type=path, help="predict every run of this suite")
    s.add_argument(
        "--paper",
        action="store_true",
        help="predict the paper's figures (100B, 8B-100B, Fig 3, Fig 4) on the stated V100 DGX-2, one factor "
        "fitted on Megatron-LM's single-V100 figure, each next to the paper's number",
    )
    s.add_argument(
        "--validate-published",
        type=path,
        nargs="?",
        metavar="CSV",
        const=True,  # not a string: argparse would pass a string const through the path type
        help="predict published training throughput figures on stated devices, each next to its figure, "
        "with the median and worst |predicted / published - 1| per device class (default: the "
        "committed table results/reference/sim-published/published.csv)",
    )
    s.add_argument(
        "--validate",
        type=path,
        metavar="RESULTS",
        help="compare with the measured runs in these rows (a directory holding several "
        "sweeps of one suite: each run's median over them)",
    )
    s.add_argument(
        "--fit",
        action="store_true",
        help="with --validate: fit the profile's one free factor (interference) on the non-ZeRO runs",
    )
    s.add_argument(
        "--out",
        type=path,
        help="with --validate, --validate-published or --paper: also write the result as rows here (the "
        "report draws them)",
    )
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_simulate)
