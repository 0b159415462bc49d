"""The tensors inside a module's inputs and outputs, wherever users put them.

Pytrees (tuples, lists, dicts, namedtuples) are not all: a model may return its own ``@dataclass``
(``Output(loss=..., logits=...)``) or take a batch as one. Stage 3 hooks each output tensor to gather a unit
again before its backward, and the backward passes hook the root's outputs, so a tensor the walk missed would be
a unit whose backward runs on freed parameters. The walk covers dataclasses, mappings, namedtuples, sequences and
sets (what FSDP's hooks and input casting walk); anything else is left alone.

A dataclass that is also a mapping (Hugging Face's ``ModelOutput``: its non-None fields are its items too, and
callers read ``out.loss``, ``out["loss"]`` and ``out[0]`` alike) is one set of values seen two ways: each value is
walked once, and a rebuilt one holds the same new object under its attribute and its item.
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
        names = [f.name for f in dataclasses.fields(x)]
        for name in names:
            yield from tensors_in(getattr(x, name, None))
        if isinstance(x, Mapping):  # items that are not fields (the fields' were walked above)
            for k, v in x.items():
                if k not in names:
                    yield from tensors_in(v)
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
        out, done = copy.copy(x), {}
        for f in dataclasses.fields(x):
            value = getattr(x, f.name, None)
            done[f.name] = (value, map_tensors(fn, value))
            object.__setattr__(out, f.name, done[f.name][1])  # frozen ones too
        if isinstance(x, dict):  # a dict too (ModelOutput): each item is its field's new value, mapped once
            for k, v in x.items():
                out[k] = done[k][1] if k in done and done[k][0] is v else map_tensors(fn, v)
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
