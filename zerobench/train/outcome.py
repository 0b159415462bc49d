"""Whether a finished run trained, and which of its steps its timing medians are taken over.

A step the optimizer skipped (fp16 overflow: the gradients held an inf or NaN, so no update was applied and the
loss scale was lowered) did less work than a step that updated the parameters: it is left out of the medians,
and the rows count it (``skipped_steps``). A run fails, with its reason, when

- every step was skipped: nothing was trained;
- the loss at the last step is not finite: training diverged, whatever the precision;
- every timed step was skipped: the run has no step time to report.

Its rows are still written (the losses show how it diverged); its status is ``failed``, not ``ok``.
"""

from __future__ import annotations

import math

HINT = "lower the learning rate (--lr), clip gradients (--clip) or train in bf16"


def timed_steps(n_steps: int, warmup: int, traced: int, skipped: set[int]) -> list[int]:
    """0-based indices of the steps the timing medians are taken over: those after the warm-up (all steps when
    none is after it), less the profiler's ``traced`` last steps (they ran slower) and the ``skipped`` ones
    (1-based step numbers). Empty when every such step was skipped."""
    window = list(range(max(0, n_steps - traced)))
    after = window[warmup:] or window
    return [i for i in after if i + 1 not in skipped]


def failure(losses: list[float], skipped: list[int], n_timed: int) -> str | None:
    """Why the run failed (one line), or None: ``losses`` per step, ``skipped`` the 1-based steps the optimizer
    skipped, ``n_timed`` how many steps are left for the timing medians."""
    n = len(losses)
    if n == 0:
        return None
    of = f"{len(skipped)} of {n} steps skipped (fp16 overflow)"
    if len(skipped) == n:
        return f"every one of the {n} steps was skipped (fp16 overflow): nothing was trained; {HINT}"
    if not math.isfinite(losses[-1]):
        tail = f", {of}" if skipped else ""
        return f"training diverged: the loss is {losses[-1]} at the last step ({n}){tail}; {HINT}"
    if n_timed == 0:
        return (
            f"every timed step was skipped (fp16 overflow; {of}): there is no step time to report; "
            "train more steps or " + HINT
        )
    return None
