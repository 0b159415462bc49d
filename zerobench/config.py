"""Shared configuration helpers: the one-line ``ConfigError`` and config serialisation/hashing.

Each component owns its own typed dataclass config (``GPTConfig``, ``ZeroConfig``, ``TrainConfig``);
this module only holds what they share.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import hashlib
import json
import operator
import os
import re
from typing import Any

SEED_MAX = 2**40 - 1
"""The largest run seed: the synthetic data stream derives each sample's generator seed from it
(``train.data.sample_stream``), which must stay a non-negative int64 (``torch.manual_seed``'s range)."""


class ConfigError(ValueError):
    """An invalid configuration. Its message is one line saying what is wrong and how to fix it."""


class RunFailed(RuntimeError):
    """A valid run that could not complete (a rank died or hung, results could not be written, the
    rendezvous failed). One line; the CLI exits 1 with it, where a ``ConfigError`` exits 2."""


class TrainingHalted(RunFailed):
    """A step found that training cannot go on (an fp16 overflow with the loss scale at its minimum). Raised on
    every rank at the same step, from a decision the ranks agreed on, so the step's figures and every earlier
    step's stay valid: the training loop records them, writes the run's rows with this as its failure, and
    then fails the run."""


_BYTES = re.compile(r"\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(B|KB|MB|GB|TB|KiB|MiB|GiB|TiB)?\s*")
_UNITS = {"B": 1, "KB": 1e3, "MB": 1e6, "GB": 1e9, "TB": 1e12, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30, "TiB": 2**40}


def parse_bytes(text: str | float) -> float:
    """'32GB' -> 32e9 (the paper's GB), '80GiB' -> 80 * 2**30, numbers as bytes; positive and finite."""
    if isinstance(text, bool):
        raise ConfigError(f"cannot read memory size {text!r}: write e.g. 32GB (1e9 bytes) or 80GiB")
    if isinstance(text, (int, float)):
        value = float(text)
    else:
        m = _BYTES.fullmatch(str(text))
        if not m:
            raise ConfigError(f"cannot read memory size {text!r}: write e.g. 32GB (1e9 bytes) or 80GiB")
        value = float(m.group(1)) * _UNITS[m.group(2) or "B"]
    if not (value > 0 and value != float("inf")):
        raise ConfigError(f"memory size must be positive and finite, got {text!r}")
    return value


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


def from_dict(cls: type, data: Any, where: str = "config") -> Any:
    """Build dataclass ``cls`` from plain data (the inverse of ``to_dict``), with one-line errors."""
    import types
    import typing

    def build(tp: Any, value: Any, path: str) -> Any:
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(tp) if a is not type(None)]
            if value is None:
                return None
            return build(args[0], value, path)
        if dataclasses.is_dataclass(tp):
            if not isinstance(value, dict):
                raise ConfigError(f"{path}: expected a mapping, got {type(value).__name__}")
            hints = _type_hints(tp)
            names = {f.name for f in dataclasses.fields(tp)}
            unknown = sorted(set(value) - names)
            if unknown:
                raise ConfigError(f"{path}: unknown key {unknown[0]!r}; valid keys: {', '.join(sorted(names))}")
            return tp(**{k: build(hints[k], v, f"{path}.{k}") for k, v in value.items()})
        if isinstance(tp, type) and issubclass(tp, enum.Enum):
            try:
                return tp(value)
            except ValueError:
                raise ConfigError(f"{path}: {value!r} is not one of {', '.join(str(m.value) for m in tp)}") from None
        if origin is tuple:
            return tuple(value)
        if tp is float and isinstance(value, int) and not isinstance(value, bool):
            return float(value)
        if tp in (int, float) and isinstance(value, bool):  # YAML's true is an int to Python: never a count
            raise ConfigError(f"{path}: expected {tp.__name__}, got {value!r}")
        if tp in (int, float, str, bool) and not isinstance(value, tp):
            raise ConfigError(f"{path}: expected {tp.__name__}, got {value!r}")
        return value

    return build(cls, data, where)


def check_types(cfg: Any, where: str) -> None:
    """Refuse, in one line naming the field, a dataclass field whose value is not of its annotated type: a bool where
    a bool is due (``"false"`` is truthy, so a string from YAML or argparse would silently mean True), an int (not a
    float, not a bool) where a count is, a number (not a bool, not a string) where a float is. Nested dataclasses are
    checked too; enums and other types are left to the config's own ``validate``."""
    import types
    import typing

    def fits(tp: Any, value: Any) -> bool | None:  # None: a type this check leaves alone
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            args = typing.get_args(tp)
            if value is None:
                return type(None) in args
            verdicts = [fits(a, value) for a in args if a is not type(None)]
            return None if None in verdicts else any(verdicts)
        if origin is tuple:
            args = typing.get_args(tp)
            if not isinstance(value, (tuple, list)):
                return False
            if len(args) == 2 and args[1] is Ellipsis:
                args = (args[0],) * len(value)
            if len(args) != len(value):
                return False
            verdicts = [fits(a, v) for a, v in zip(args, value)]
            return None if None in verdicts else all(verdicts)
        if tp is bool:
            return isinstance(value, bool)
        if tp not in (int, float, str):
            return None
        if tp is str:
            return isinstance(value, (str, os.PathLike))  # a path where a directory's name is due
        if isinstance(value, (bool, str, bytes)):  # a bool is an int to Python; "1e-3" would pass float()
            return False
        if tp is int:  # numpy's integers and other exact integers (``__index__``) too
            try:
                operator.index(value)
            except TypeError:
                return False
            return True
        if tp is float:  # numpy's floats, a 0-dim tensor: whatever converts to a float exactly as given
            try:
                float(value)
            except OverflowError:  # an int beyond a float's range: a number, refused by the config's own bounds
                return True
            except (TypeError, ValueError):
                return False
            return True

    def name(tp: Any) -> str:
        args = typing.get_args(tp)
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            return " or ".join("None" if a is type(None) else name(a) for a in args)
        if typing.get_origin(tp) is tuple:
            return f"a pair ({', '.join(name(a) for a in args)})" if len(args) == 2 else f"a tuple {tp}"
        return {int: "an int", float: "a number", bool: "true or false", str: "a string"}.get(tp, str(tp))

    for f in dataclasses.fields(cfg):
        value, tp = getattr(cfg, f.name), _type_hints(type(cfg))[f.name]
        if dataclasses.is_dataclass(value) and not isinstance(value, type):
            check_types(value, f"{where}.{f.name}")
        elif fits(tp, value) is False:
            raise ConfigError(f"{where}.{f.name} must be {name(tp)}, got {value!r} ({type(value).__name__})")


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    """``typing.get_type_hints(cls)``, evaluated once per class (it compiles every annotation string: a suite of
    thousands of runs builds thousands of specs)."""
    import typing

    return typing.get_type_hints(cls)
