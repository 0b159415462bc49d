"""How the engine's hooks meet torch's own tools: a profiler and ``torch.compile``.

- ``labelled``: under a profiler (``zerobench train --profile``) a per-unit hook's work shows by name in the trace
  (``zerobench::pre_forward (unit 3)``). Without one a label costs a check of autograd's profiler flag, not a
  ``record_function``, which costs far more per unit and hook.
- ``eager``: a hook the engine registers on the user's modules runs eagerly under ``torch.compile(model)``
  (``torch.compiler.disable``), so Dynamo neither traces the engine's bookkeeping (which unit is gathered, which
  backward is open, the ledger of collectives) nor guards on it: traced, every step would recompile until Dynamo's
  limit. The model's own modules compile. Without ``torch.compile`` the wrapper adds about a microsecond a call.
"""

from __future__ import annotations

import functools

import torch


def labelled(name: str):
    """Decorate a gatherer hook ``fn(self, i, ...)`` (``i``: the unit) to run under ``record_function`` named
    ``"<name> (unit <i>)"`` while a profiler records."""

    def wrap(fn):
        @functools.wraps(fn)
        def run(self, i: int, *args):
            if not torch.autograd._profiler_enabled():
                return fn(self, i, *args)
            with torch.profiler.record_function(f"{name} (unit {i})"):
                return fn(self, i, *args)

        return run

    return wrap


def eager(hook):
    """``hook`` (a module or tensor hook of the engine's), run eagerly under ``torch.compile``."""
    return torch.compiler.disable(hook)
