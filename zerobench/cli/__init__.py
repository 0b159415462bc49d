"""The ``zerobench`` command line: parses arguments into typed configs and hands them on (no logic here).

Each module registers its subcommands (``register(sub)``); commands import their heavy dependencies
(torch, pandas) only when they run, so ``zerobench --help`` and suite checks stay fast.
"""

from __future__ import annotations

import argparse
import sys

from zerobench.cli import bench, export, gate, plan, sim, training
from zerobench.cli.types import OneLineParser
from zerobench.config import ConfigError, RunFailed


def build_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="zerobench",
        description="ZeRO (stages 0-3) training and the harness that reproduces the ZeRO paper's results.",
    )
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in (training, bench, gate, plan, sim, export):
        module.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    from zerobench.results.outdir import CREATED, remove_created

    CREATED.clear()
    try:
        return args.func(args)
    except ConfigError as e:
        remove_created()  # bad input found after an output directory was proved writable: leave nothing behind
        print(f"zerobench: error: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"zerobench: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # piped into head/less that exited: not an error of the command
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    except KeyboardInterrupt:
        print("zerobench: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
