"""Argument types for the CLI: every number and size is checked where it is parsed, so a bad value is
one line (``zerobench train: error: argument --hidden: must be >= 1, got 0``) and exit code 2, never a
traceback later and never silently replaced by a default."""

from __future__ import annotations

import argparse
import math
import sys
from typing import NoReturn

from zerobench.config import SEED_MAX, ConfigError, parse_bytes


class OneLineParser(argparse.ArgumentParser):
    """argparse, but an error is one line on stderr (the usage is one ``--help`` away)."""

    def error(self, message: str) -> NoReturn:
        print(f"{self.prog}: error: {message} (see {self.prog} --help)", file=sys.stderr)
        sys.exit(2)


def count(minimum: int = 1):
    """An integer >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            v = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if v < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {v}")
        return v

    parse.__name__ = "integer"
    return parse


def number(minimum: float | None = None, above: float | None = None, maximum: float | None = None):
    """A finite float, optionally ``>= minimum``, ``> above`` and ``<= maximum`` (nan/inf refused)."""

    def parse(text: str) -> float:
        try:
            v = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(v):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if minimum is not None and v < minimum:
            raise argparse.ArgumentTypeError(f"must be >= {minimum:g}, got {v:g}")
        if above is not None and v <= above:
            raise argparse.ArgumentTypeError(f"must be > {above:g}, got {v:g}")
        if maximum is not None and v > maximum:
            raise argparse.ArgumentTypeError(f"must be <= {maximum:g}, got {v:g}")
        return v

    parse.__name__ = "number"
    return parse


def seed(text: str) -> int:
    v = count(0)(text)
    if v > SEED_MAX:
        raise argparse.ArgumentTypeError(f"must be at most 2**40-1 (the data stream's seeds stay int64), got {text}")
    return v


def path(text: str) -> str:
    """A file, directory or suite path: an empty one, as ``--out ""`` from an unset shell variable, is refused
    (before, commands took it as the flag not given and wrote to their default, or read the current directory)."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path: give a path (for a flag's default, leave the flag out)")
    return text


def byte_size(text: str) -> str:
    """A memory size such as 32GB or 80GiB (kept as text: it is stored as written in configs)."""
    try:
        parse_bytes(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(str(e)) from None
    return text


class Renamed(argparse.Action):
    """An old flag kept only to say its one spelling now (``add_argument("--mp", action=Renamed, new="--tp")``)."""

    def __init__(self, option_strings, dest, new: str, **kwargs):
        kwargs.setdefault("nargs", "?")
        super().__init__(option_strings, dest, **kwargs)
        self.new = new

    def __call__(self, parser, namespace, values, option_string=None):
        parser.error(
            f"{option_string} is now spelled {self.new}: use {self.new}" + (f" {values}" if values is not None else "")
        )
