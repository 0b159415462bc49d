"""Stage 3: parameters that escape the forward of the unit holding them. A unit that returns its own parameter is
refused in one line (``refuse_returned``); a forward that fails because it read one elsewhere gets a note naming it.

There a freed parameter is an empty tensor, and the op that reads it fails deep inside torch (``size mismatch, got
input (2), mat (2x8), vec (0)``). Nothing marks which op read what, so the engine does not try to catch the read;
when the model's forward raises, an ``always_call`` forward hook on the model looks at the failing frames instead: a
local variable that is a freed parameter, or an attribute chain on the failing line (``self.a.weight``) that
resolves, through modules and parameters only, to one. Each such parameter is named in a note on the exception (PEP
678: printed under its message), with the fix: ``apply_zero(..., external_params=[...])``. A forward that succeeds
pays one function call.
"""

from __future__ import annotations

import linecache
import re
import sys
from collections.abc import Callable

from torch import nn

from zerobench.config import ConfigError
from zerobench.zero.interop.containers import tensors_in

_CHAIN = re.compile(r"\b([A-Za-z_]\w*)((?:\.[A-Za-z_]\w*)+)")


def _resolve(base, path: list[str]) -> list:
    """The objects ``base.path`` names, prefix by prefix (``self.a``, ``self.a.weight``, ...), through submodules and
    parameters only (no getattr: a property could run code); it stops where that path leaves them (``.shape``)."""
    out, obj = [], base
    for attr in path:
        if not isinstance(obj, nn.Module):
            break
        obj = obj._modules[attr] if attr in obj._modules else obj._parameters.get(attr)
        if obj is None:
            break
        out.append(obj)
    return out


def escaped_reads(tb, freed: dict[int, str]) -> list[str]:
    """Names of the freed parameters (``id -> name``) that the frames of traceback ``tb`` hold in a local or
    name on their failing line."""
    found: list[str] = []
    while tb is not None:
        frame, local = tb.tb_frame, tb.tb_frame.f_locals
        hits = [freed[id(v)] for v in local.values() if id(v) in freed]
        for m in _CHAIN.finditer(linecache.getline(frame.f_code.co_filename, tb.tb_lineno)):
            hits += [freed[id(o)] for o in _resolve(local.get(m.group(1)), m.group(2).split(".")[1:]) if id(o) in freed]
        found.extend(h for h in hits if h not in found)
        tb = tb.tb_next
    return found


def note_escaped_reads(freed: Callable[[], dict[int, str]]):
    """The model's ``always_call`` forward hook; ``freed()``: the parameters freed now, ``id -> name``."""

    def hook(module, args, output) -> None:
        exc = sys.exc_info()[1]
        if exc is None or output is not None or not isinstance(exc, Exception):
            return
        names = escaped_reads(exc.__traceback__, freed())
        if names:
            listed = ", ".join(repr(n) for n in names)
            it, is_ = ("it", "it is") if len(names) == 1 else ("them", "they are")
            exc.add_note(
                f"ZeRO stage 3: the failing line reads {listed} outside the forward of the unit that holds "
                f"{it}, where {is_} freed (0 elements): pass {it} to apply_zero(..., external_params="
                f"[{listed}]) so that the root keeps {it} gathered"
            )

    return hook


def refuse_returned(param_ids: frozenset[int], zparams, unit: str, output) -> None:
    """A unit that returns one of its own parameters (a linear layer's bias for its caller to add, as Megatron's
    ``skip_bias_add``): the caller would read it freed. One line naming it and the fix."""
    for t in tensors_in(output):
        if id(t) in param_ids:
            name = next(zp.name for zp in zparams if zp.param is t)
            raise ConfigError(
                f"ZeRO stage 3: unit {unit} returned its own parameter {name!r}, which is freed when the "
                f"unit's forward ends: pass it to apply_zero(..., external_params=[{name!r}]) so that the "
                "root keeps it gathered"
            )
