"""Accumulation windows as pure data (``zerobench/zero/window.py``): which micro-batch synchronises, which
starts a window, and when ``step()`` is refused."""

from __future__ import annotations

import pytest

from zerobench.zero.grads.accumulation import AccumulationWindow


def run(w: AccumulationWindow, plan: list[str]) -> list[tuple[bool, bool]]:
    """``plan``: 'e' engine.backward, 'p' plain backward, 'E'/'P' the same under no_sync()."""
    out = []
    for c in plan:
        if c.isupper():
            with w.no_sync():
                mb = w.begin(plain=c == "P")
        else:
            mb = w.begin(plain=c == "p")
        out.append((mb.sync, mb.first))
    return out


def test_grad_accum_steps_counts_micro_batches_into_windows():
    w = AccumulationWindow(3)
    assert run(w, "eee") == [(False, True), (False, False), (True, False)]
    w.check_step()
    assert run(w, "e") == [(False, True)]
    assert w.open == 1
    with pytest.raises(RuntimeError, match=r"^step\(\) after 1 of 3 micro-batches"):
        w.check_step()


def test_no_sync_passes_extend_the_window_and_the_next_pass_synchronises():
    w = AccumulationWindow(1)
    assert run(w, "PPp") == [(False, True), (False, False), (True, False)]
    assert w.open == 0
    w.check_step()
    assert run(w, "p") == [(True, True)]  # a new window


def test_step_after_only_unsynchronised_passes_is_refused():
    w = AccumulationWindow(1)
    run(w, "P")
    assert w.open == 1
    with pytest.raises(RuntimeError, match=r"under no_sync\(\) and none outside it"):
        w.check_step()


def test_zero_grad_drops_the_unsynchronised_passes_and_keeps_the_count():
    """``zero_grad()`` after passes under ``no_sync()`` cleared their gradients: a step next has nothing missing, and
    the next pass starts a window. Counted micro-batches keep counting, as DeepSpeed's boundaries do."""
    w = AccumulationWindow(1)
    run(w, "P")
    w.cleared()
    w.check_step()
    assert run(w, "p") == [(True, True)]
    w = AccumulationWindow(2)
    run(w, "e")
    w.cleared()
    assert w.open == 1
    with pytest.raises(RuntimeError, match=r"^step\(\) after 1 of 2 micro-batches"):
        w.check_step()


def test_a_window_mixing_the_two_backwards_is_refused_and_windows_may_differ():
    w = AccumulationWindow(2)
    run(w, "e")
    with pytest.raises(RuntimeError, match=r"mixes engine\.backward"):
        w.begin(plain=True)
    run(w, "e")
    assert run(w, "pp") == [(False, True), (True, False)]  # the next window may be plain


def test_no_sync_nests_and_restores():
    w = AccumulationWindow(1)
    with w.no_sync():
        with w.no_sync():
            pass
        assert w.suspended
    assert not w.suspended
