"""The A/B gate's statistics without processes: AB/BA pairing and when a verdict needs more rounds."""

import math

import pytest

from zerobench.bench.ab import _pairs, _undecided


def test_pairs_are_geometric_means_of_complete_ab_ba_rounds():
    # a drift of x1.1 per round, linear in log: each pair's geometric mean removes it
    assert _pairs({0: 1.0, 1: 1.21, 2: 1.1, 3: 1.1, 4: 2.0}) == pytest.approx([1.1, 1.1])
    assert _pairs({0: 1.0}) == [] and _pairs({}) == []
    assert _pairs({1: 4.0, 2: 1.0, 3: 1.0}) == [1.0]  # pair 0-1 is incomplete
    assert _pairs({0: 0.81, 1: 1.0})[0] == pytest.approx(math.sqrt(0.81))


def test_undecided_while_a_tolerance_edge_is_within_two_standard_errors():
    assert _undecided([1.10], 0.05)  # one pair: no spread to judge by
    assert not _undecided([1.10, 1.11, 1.09], 0.05)  # clearly above 1.05
    assert not _undecided([1.00, 1.01, 0.99], 0.05)  # clearly inside
    assert _undecided([1.05, 1.13, 0.99], 0.05)  # median 1.05 +- 0.05
    assert _undecided([0.93, 0.97, 0.95, 0.96], 0.05)  # near the improvement edge


def test_lockstep_rounds_pair_step_k_with_step_k():
    from zerobench.bench.ab import _ratio

    # a noise burst doubles steps 2-3 of both sides: stepwise it cancels, the medians' ratio does not
    base = {"value": 1.0, "samples": [1.0, 1.0, 2.0, 2.0, 1.0]}
    cand = {"value": 2.2, "samples": [1.1, 2.2, 2.2, 1.1, 1.1]}
    assert _ratio(cand, base, stepwise=True) == pytest.approx(1.1)
    assert _ratio(cand, base, stepwise=False) == pytest.approx(2.2)
    # rows without per-step samples (an older tree) or of different lengths fall back to the medians
    assert _ratio({"value": 3.0}, {"value": 2.0}, stepwise=True) == pytest.approx(1.5)
    assert _ratio({"value": 3.0, "samples": [3.0]}, {"value": 2.0, "samples": [2.0, 2.0]}, stepwise=True) == 1.5
    assert _ratio({"value": 3.0}, {"value": 0.0}, stepwise=False) is None
