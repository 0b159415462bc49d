"""Interleaved-timing statistics (bench/stats.py) without processes: per-round ratios, AB/BA pairing, when a
verdict needs more rounds."""

import math

import pytest

from zerobench.bench.stats import abba_pairs, median_ratio, ratio_verdict, relative_se_from_mad, undecided


def test_pairs_are_geometric_means_of_complete_ab_ba_rounds():
    # a drift of x1.1 per round, linear in log: each pair's geometric mean removes it
    assert abba_pairs({0: 1.0, 1: 1.21, 2: 1.1, 3: 1.1, 4: 2.0}) == pytest.approx([1.1, 1.1])
    assert abba_pairs({0: 1.0}) == [] and abba_pairs({}) == []
    assert abba_pairs({1: 4.0, 2: 1.0, 3: 1.0}) == [1.0]  # pair 0-1 is incomplete
    assert abba_pairs({0: 0.81, 1: 1.0})[0] == pytest.approx(math.sqrt(0.81))


def test_undecided_while_a_tolerance_edge_is_within_two_standard_errors():
    assert undecided([1.10], 0.05)  # one pair: no spread to judge by
    assert not undecided([1.10, 1.11, 1.09], 0.05)  # clearly above 1.05
    assert not undecided([1.00, 1.01, 0.99], 0.05)  # clearly inside
    assert undecided([1.05, 1.13, 0.99], 0.05)  # median 1.05 +- 0.05
    assert undecided([0.93, 0.97, 0.95, 0.96], 0.05)  # near the improvement edge


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


def test_median_ratio_pairs_rounds_and_resists_one_noisy_round():
    assert median_ratio([1.1, 2.2, 9.0], [1.0, 2.0, 1.0]) == pytest.approx(1.1)
    with pytest.raises(ValueError, match="paired rounds"):
        median_ratio([1.0], [1.0, 2.0])


def test_verdicts_and_the_standard_error_from_a_mad():
    assert [ratio_verdict(x, 0.05) for x in (1.06, 1.05, 0.95, 0.94)] == ["REGRESSION", "ok", "ok", "improvement"]
    assert relative_se_from_mad(0.01, 1.0, 4) == pytest.approx(1.4826 * 0.01 / 2)
