"""Reading one key of a DeepSpeed configuration (``zero/compat/deepspeed/config.py``) as the type DeepSpeed gives
it: a number, a switch, a section; anything else, and an unknown key of a section, is one line naming the key. Pure."""

from __future__ import annotations

import math

from zerobench.config import ConfigError


def is_num(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def num(sec: dict, key: str, default, kind: type, where: str):
    """``sec[key]`` as ``kind`` (``default`` when absent); anything but a finite number is one line naming the key (no
    DeepSpeed key means anything at infinity or NaN, which Python's JSON reader accepts as ``Infinity``/``NaN``)."""
    v = sec.get(key, default)
    if not is_num(v) or not math.isfinite(v) or (kind is int and float(v) != int(v)):
        hint = " ('auto' is filled in by Hugging Face's Trainer; give a number)" if v == "auto" else ""
        raise ConfigError(
            f"DeepSpeed config {where + '.' if where else ''}{key}: must be "
            f"{'an integer' if kind is int else 'a finite number'}, got {v!r}{hint}"
        )
    return kind(v)


def flag(sec: dict, key: str, default: bool, where: str) -> bool:
    """``sec[key]`` as a switch (``default`` when absent); anything but true/false is one line naming the key."""
    v = sec.get(key, default)
    if not isinstance(v, bool):
        hint = " ('auto' is filled in by Hugging Face's Trainer; give true or false)" if v == "auto" else ""
        raise ConfigError(
            f"DeepSpeed config {where + '.' if where else ''}{key}: must be true or false, got {v!r}{hint}"
        )
    return v


def section(cfg: dict, key: str) -> dict:
    v = cfg.get(key) or {}
    if not isinstance(v, dict):
        raise ConfigError(f"DeepSpeed config {key}: must be an object, got {v!r}")
    return v


def known(sec: dict, keys: set[str], where: str) -> None:
    """An unknown key of a section is one line: a misspelt key must not leave its default in force silently."""
    extra = sorted(set(sec) - keys)
    if extra:
        raise ConfigError(f"DeepSpeed config {where}: unknown {', '.join(extra)} (known: {', '.join(sorted(keys))})")
