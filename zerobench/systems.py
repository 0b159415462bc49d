"""The catalog of training systems: zerobench's engine, the Megatron-LM baseline and every peer.

Each system registers a ``SystemEntry`` in its own package; this module only collects them (it sits above
``train/``, ``baselines/`` and ``peers/``, so none of those imports another's registry). Harness code asks
it for an entry by name and validates a run here; the training loop is handed the entry. Nothing here
imports torch: the entries build lazily.
"""

from __future__ import annotations

from zerobench.baselines.entry import MEGATRON
from zerobench.config import ConfigError
from zerobench.parallel.config import COMPILED
from zerobench.peers.registry import ENTRIES as PEER_ENTRIES
from zerobench.train.config import TrainConfig
from zerobench.train.entry import ZEROBENCH, SystemEntry

SYSTEMS: dict[str, SystemEntry] = {ZEROBENCH.name: ZEROBENCH, MEGATRON.name: MEGATRON, **PEER_ENTRIES}


def get_system(name: str) -> SystemEntry:
    """The registered entry of ``name``; one-line ConfigError for an unknown name."""
    if name not in SYSTEMS:
        raise ConfigError(f"unknown system {name!r}: choose zerobench, megatron or a peer ({', '.join(PEER_ENTRIES)})")
    return SYSTEMS[name]


def validate_run(cfg: TrainConfig, world_size: int | None = None) -> SystemEntry:
    """Everything checkable before launch: the config itself, then what its system can run."""
    cfg.validate(world_size)
    if cfg.kernels == COMPILED and cfg.system != "zerobench":  # another system would run its own kernels silently
        raise ConfigError(
            f"--kernels compiled compiles zerobench's blocks; {cfg.system} builds its own model: drop it "
            "(the peer with compiled blocks is fsdp2-compiled)"
        )
    entry = get_system(cfg.system)
    entry.validate(cfg)
    return entry
