"""The tensors inside a module's inputs and outputs, wherever users put them.

Pytrees (tuples, lists, dicts, namedtuples) are not all: a model may return its own ``@dataclass``
(``Output(loss=..., logits=...)``) or take a batch as one. Stage 3 hooks each output tensor to gather a unit
again before its backward, and the backward passes hook the root's outputs, so a tensor the walk missed would be
a unit whose backward runs on freed parameters. The walk covers dataclasses, mappings, namedtuples, sequences and
sets (what FSDP's hooks and input casting walk); anything else is left alone.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable, Iterator, Mapping

import torch


def _is_dataclass_instance(x) -> bool:
    return dataclasses.is_dataclass(x) and not isinstance(x, type)


def tensors_in(x) -> Iterator[torch.Tensor]:
    """Every tensor in ``x`` (depth first)."""
    if isinstance(x, torch.Tensor):
        yield x
    elif _is_dataclass_instance(x):
        for f in dataclasses.fields(x):
            yield from tensors_in(getattr(x, f.name, None))
    elif isinstance(x, Mapping):
        for v in x.values():
            yield from tensors_in(v)
    elif isinstance(x, (list, tuple, set, frozenset)):
        for v in x:
            yield from tensors_in(v)


def map_tensors(fn: Callable[[torch.Tensor], torch.Tensor], x):
    """``x`` with ``fn`` applied to every tensor in it, containers rebuilt as their own types."""
    if isinstance(x, torch.Tensor):
        return fn(x)
    if _is_dataclass_instance(x):
        out = copy.copy(x)
        for f in dataclasses.fields(x):
            object.__setattr__(out, f.name, map_tensors(fn, getattr(x, f.name, None)))  # frozen ones too
        return out
    if isinstance(x, dict):
        out = copy.copy(x)
        for k, v in x.items():
            out[k] = map_tensors(fn, v)
        return out
    if isinstance(x, tuple) and hasattr(x, "_fields"):  # a namedtuple
        return type(x)(*(map_tensors(fn, v) for v in x))
    if isinstance(x, (list, tuple, set, frozenset)):
        return type(x)(map_tensors(fn, v) for v in x)
    return x
