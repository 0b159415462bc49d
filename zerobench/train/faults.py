"""Fault injection for tests of failure handling: make one rank die at a given step.

Set ``ZEROBENCH_FAULT=RANK:STEP`` (e.g. ``1:2``) and that rank exits abruptly (``os._exit(17)``) at the
start of that step, as a crashed or OOM-killed process would. Unset, this does nothing.
"""

from __future__ import annotations

import os

EXIT_CODE = 17


def maybe_fail(rank: int, step: int) -> None:
    spec = os.environ.get("ZEROBENCH_FAULT")
    if not spec:
        return
    r, s = (int(v) for v in spec.split(":"))
    if r == rank and s == step:
        os._exit(EXIT_CODE)
