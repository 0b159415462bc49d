"""Reading a DeepSpeed configuration (``zero/compat/deepspeed/config.py``): the file as a dict (a key given twice
refused), and one key of it as the type DeepSpeed gives it: a number, a switch, a section; anything else, and an
unknown key of a section, is one line naming the key."""

from __future__ import annotations

import base64
import errno
import math
from pathlib import Path

import hjson

from zerobench.config import ConfigError


class DeepSpeedAssertionError(ConfigError, AssertionError):
    """An input refused where DeepSpeed asserts (an inconsistent batch triple, ``initialize(model=None)``, a client
    scheduler on another optimizer, an optimizer other than AdamW's): an ``AssertionError``, the type DeepSpeed's
    callers and tests catch, and a ``ConfigError``, one line."""


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


def _no_duplicates(pairs: list[tuple[str, object]]) -> dict:
    """A JSON object's pairs as a dict, refusing a key given twice: the last copy would win silently (DeepSpeed
    refuses it too: ``Duplicate keys in DeepSpeed config``)."""
    keys = [k for k, _ in pairs]
    dup = sorted({k for k in keys if keys.count(k) > 1})
    if dup:
        raise ConfigError(f"Duplicate keys in DeepSpeed config: {dup}: keep one of each")
    return dict(pairs)


def load(config) -> dict:
    """``config`` as a dict, as DeepSpeed takes one: a mapping as given, a path to a file, or the file's text
    base64-encoded (what DeepSpeed's launcher can pass). The text is read as DeepSpeed reads it, as HJSON, so JSON
    with comments or trailing commas is taken; a key given twice in one object is refused."""
    if isinstance(config, dict):
        return dict(config)
    if not isinstance(config, (str, Path)):
        raise ConfigError(f"a DeepSpeed config is a dict or a JSON file's path, not {type(config).__name__}")
    p = Path(config)
    try:
        text, where = p.read_text(), str(p)
    except UnicodeDecodeError as e:
        raise ConfigError(f"DeepSpeed config {p} is not valid JSON: {e}") from None
    except IsADirectoryError:
        raise ConfigError(f"DeepSpeed config {p}: a directory, not a JSON file") from None
    except (FileNotFoundError, NotADirectoryError):  # no such file: DeepSpeed's next reading, base64
        text, where = _base64(config), "given as base64"
        if text is None:
            raise ConfigError(f"DeepSpeed config {p}: no such file (nor a base64-encoded config)") from None
    except OSError as e:
        if e.errno != errno.ENAMETOOLONG:  # a permission, a device: the file's own fault, said as it is
            raise ConfigError(f"DeepSpeed config {p}: cannot read it: {e.strerror or e}") from None
        text, where = _base64(config), "given as base64"  # a name no file can have: a config's base64 text
        if text is None:
            raise ConfigError(f"DeepSpeed config {p}: no such file (nor a base64-encoded config)") from None
    try:
        data = hjson.loads(text, object_pairs_hook=_no_duplicates)
    except (hjson.HjsonDecodeError, OverflowError, RecursionError) as e:  # 1e400 overflows in hjson's own reading
        raise ConfigError(f"DeepSpeed config {where} is not valid JSON: {' '.join(str(e).split())}") from None
    except ConfigError as e:
        raise ConfigError(f"{e} ({where})") from None
    if not isinstance(data, dict):
        raise ConfigError(f"DeepSpeed config {where} must hold a JSON object, not {type(data).__name__}")
    return data


def _base64(config) -> str | None:
    """``config`` decoded as DeepSpeed decodes a config passed as base64 (URL-safe alphabet); None if it is not."""
    if not isinstance(config, str):
        return None
    try:
        text = base64.urlsafe_b64decode(config.encode("ascii")).decode("utf-8")
    except (ValueError, UnicodeError):
        return None
    return text if text.lstrip().startswith("{") else None  # a mistyped path that happens to decode is no config
