"""``SkipTracker``: which stage-3 units a rank replays, and where, without processes or tensors."""

from __future__ import annotations

from zerobench.zero.stage3.skipped import SkipTracker


def forward(t: SkipTracker, ran: list[int]) -> list[tuple[int, list[int]]]:
    """One model forward running ``ran``: (unit, replayed before it) per unit, then (0, replayed at the end)."""
    t.begin_forward()
    return [(i, t.forward_unit(i)) for i in ran] + [(0, t.end_forward())]


def test_a_forward_that_runs_every_unit_replays_nothing():
    assert forward(SkipTracker(4), [1, 2, 3, 4]) == [(1, []), (2, []), (3, []), (4, []), (0, [])]


def test_skipped_units_are_replayed_before_the_next_unit_run_and_at_the_end():
    assert forward(SkipTracker(5), [2, 4]) == [(2, [1]), (4, [3]), (0, [5])]
    assert forward(SkipTracker(3), []) == [(0, [1, 2, 3])]


def test_a_unit_called_again_or_out_of_order_replays_nothing():
    assert forward(SkipTracker(3), [1, 2, 2, 3]) == [(1, []), (2, []), (2, []), (3, []), (0, [])]
    assert forward(SkipTracker(3), [3, 1, 2]) == [(3, [1, 2]), (1, []), (2, []), (0, [])]


def test_a_unit_called_outside_the_models_forward_replays_nothing():
    t = SkipTracker(3)
    assert t.forward_unit(3) == [] and t.end_forward() == []


def test_backward_replays_the_units_no_forward_ran_in_descending_order():
    t = SkipTracker(5)
    forward(t, [1, 3])
    t.begin_backward(task=7)
    assert t.backward_unit(3, 7) == [5, 4]
    assert t.backward_unit(1, 7) == [2]
    assert t.end_backward(7) == []
    forward(t, [2, 3, 4, 5])
    t.begin_backward(task=8)
    assert [t.backward_unit(i, 8) for i in (5, 4, 3, 2)] == [[], [], [], []]
    assert t.end_backward(8) == [1]


def test_a_unit_run_by_any_forward_of_the_window_is_never_replayed():
    """Two forwards, then one backward through both: a unit the second skipped still has the first's gradients
    to come, so completing its buckets early would lose them."""
    t = SkipTracker(3)
    forward(t, [1, 2, 3])
    forward(t, [1, 3])
    t.begin_backward(task=1)
    assert t.backward_unit(3, 1) == [] and t.backward_unit(1, 1) == [] and t.end_backward(1) == []
    forward(t, [1, 3])  # a new window after that backward
    t.begin_backward(task=2)
    assert t.backward_unit(3, 2) == [] and t.backward_unit(1, 2) == [2]


def test_a_retained_graphs_second_backward_replays_again():
    t = SkipTracker(2)
    forward(t, [1])
    for task in (4, 5):
        t.begin_backward(task)
        assert t.backward_unit(1, task) == [2] and t.end_backward(task) == []


def test_a_backward_that_does_not_start_at_the_root_replays_nothing():
    t = SkipTracker(3)
    forward(t, [3])
    assert t.backward_unit(3, task=9) == [] and t.end_backward(9) == [] and t.end_backward(10) == []


def test_a_forward_out_of_the_units_order_stops_replaying_for_good():
    """Units registered [1, 2, 3] and run 3, 2, 1: at unit 3 units 1-2 look skipped and are replayed; when unit 2 then
    runs, the order is known to be another, and nothing is replayed again, in forward or backward."""
    t = SkipTracker(3)
    assert forward(t, [3, 2, 1]) == [(3, [1, 2]), (2, []), (1, []), (0, [])]
    assert t.out_of_order == (2, 3)
    assert forward(t, [3, 1]) == [(3, []), (1, []), (0, [])]
    t.begin_backward(task=1)
    assert t.backward_unit(3, 1) == [] and t.backward_unit(1, 1) == [] and t.end_backward(1) == []


def test_an_evaluation_forward_leaves_no_gradients_to_wait_for():
    """Train forward skipping unit 2, an evaluation forward (no graph) running all, then the train backward: unit 2
    is still replayed there; before ``graph``, the evaluation's units counted and the ranks desynchronised."""
    t = SkipTracker(3)
    forward(t, [1, 3])
    t.begin_forward()
    assert [t.forward_unit(i, graph=False) for i in (1, 2, 3)] == [[], [], []] and t.end_forward() == []
    t.begin_backward(task=1)
    assert t.backward_unit(3, 1) == [] and t.backward_unit(1, 1) == [2]
