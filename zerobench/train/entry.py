"""What a training system registers: its name, how it checks a run's config and how it is built.

Systems (zerobench's engine, the Megatron-LM baseline, each peer) describe themselves with a
``SystemEntry``; ``zerobench/systems.py`` is the one catalog that collects them, and the training loop is
handed an entry — it never branches on a system's name. This module imports no torch, so validating a
suite or a command line stays cheap.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any


def _no_checks(cfg: Any) -> None:
    return None


@dataclass(frozen=True)
class SystemEntry:
    """One training system, as the loop, the CLI and the suites see it."""

    name: str
    """The ``--system`` / suite ``system:`` value."""
    build: Callable[..., Any]
    """``build(cfg, mesh, ledger, device) -> TrainSystem``; imports heavy dependencies on call."""
    validate: Callable[[Any], None] = _no_checks
    """Raises ``ConfigError`` (one line) for a ``TrainConfig`` this system cannot run."""
    shards_like: int | None = None
    """The zerobench stage doing the same sharding (peers); None: the run's own ``zero.stage``."""
    records_dp_comm: bool = False
    """Whether zerobench's communication ledger sees this system's data-parallel collectives."""

    def describe(self, cfg: Any) -> str:
        """``stage N`` for zerobench-like systems, ``shards as stage N`` for a peer."""
        if self.shards_like is None:
            return f"stage {cfg.zero.stage}"
        return f"shards as stage {self.shards_like}"


def _build_zerobench(cfg, mesh, ledger, device):
    from zerobench.train.systems import ZeroSystem  # torch loads here, not when a suite is checked

    return ZeroSystem(cfg, mesh, ledger, device)


ZEROBENCH = SystemEntry("zerobench", _build_zerobench, records_dp_comm=True)
"""This engine: every parallel feature of ``TrainConfig`` is its own, so it adds no checks."""
