"""Shared configuration helpers: the one-line ``ConfigError`` and config serialisation/hashing.

Each component owns its own typed dataclass config (``GPTConfig``, ``ZeroConfig``, ``TrainConfig``);
this module only holds what they share.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import json
from typing import Any


class ConfigError(ValueError):
    """An invalid configuration. Its message is one line saying what is wrong and how to fix it."""


def to_dict(cfg: Any) -> Any:
    """Recursively turn (nested) dataclasses, enums and tuples into JSON-compatible data."""
    if dataclasses.is_dataclass(cfg) and not isinstance(cfg, type):
        return {f.name: to_dict(getattr(cfg, f.name)) for f in dataclasses.fields(cfg)}
    if isinstance(cfg, enum.Enum):
        return cfg.value
    if isinstance(cfg, (list, tuple)):
        return [to_dict(v) for v in cfg]
    if isinstance(cfg, dict):
        return {str(k): to_dict(v) for k, v in cfg.items()}
    return cfg


def config_hash(cfg: Any) -> str:
    """A stable short hash of a resolved config (its canonical JSON form)."""
    blob = json.dumps(to_dict(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]
