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


# --- the A/B decision rule: a sign test with a stated false-alarm rate, on synthetic noisy rounds -------------

import random  # noqa: E402

from zerobench.bench.stats import (  # noqa: E402
    ab_undecided,
    ab_verdict,
    binomial_tail,
    false_alarm_rate,
    median_bounds,
    min_pairs,
    sign_boundaries,
)


def test_the_sign_test_design_states_its_false_alarm_rate_exactly():
    assert binomial_tail(10, 10) == 2**-10 and binomial_tail(14, 13) == 15 / 2**14 and binomial_tail(5, 0) == 1
    assert [min_pairs(a) for a in (0.001, 2**-10, 0.01, 0.05, 0.5)] == [10, 10, 7, 5, 1]
    assert sign_boundaries(10, 10, 0.001) == {10: 10} and false_alarm_rate({10: 10}) == 2**-10
    assert sign_boundaries(14, 14, 0.001) == {14: 13} and false_alarm_rate({14: 13}) == 15 / 2**14
    assert sign_boundaries(9, 9, 0.001) == {9: None}  # 9 pairs cannot reach 0.001
    seq = sign_boundaries(10, 16, 0.001)  # looks after every pair: the total stays within the rate
    assert false_alarm_rate(seq) <= 0.001 and all(c is None or c > n // 2 for n, c in seq.items())
    # the exact rate of a sequential design is less than the sum over its looks (paths flagged once)
    assert false_alarm_rate({10: 10, 11: 10}) < binomial_tail(10, 10) + binomial_tail(11, 10)


def test_a_regression_needs_both_the_sign_test_and_the_tolerance():
    ten_above = [1.02, 1.03, 1.04, 1.01, 1.02, 1.03, 1.02, 1.01, 1.05, 1.03]
    assert median_bounds(ten_above, 10) == (1.01, 1.05)
    assert ab_verdict(ten_above, 0.05, 10) == "ok"  # slower beyond chance, but by 2.5%: within tolerance
    planted = [x + 0.08 for x in ten_above]
    assert ab_verdict(planted, 0.05, 10) == "REGRESSION"
    one_below = [*planted[:9], 0.99]  # one pair below 1: 9 of 10 is not beyond chance at 0.001
    assert ab_verdict(one_below, 0.05, 10) == "ok" and ab_undecided(one_below, 0.05, 10)
    assert ab_verdict([1 / x for x in planted], 0.05, 10) == "improvement"
    assert ab_verdict(planted, 0.05, None) == "undecided"  # too few pairs: neither a verdict nor a pass
    assert ab_verdict(planted[:9], 0.05, 10) == "undecided" and ab_undecided(planted[:9], 0.05, 10)
    assert not ab_undecided(ten_above, 0.05, 10) and ab_undecided([], 0.05, 10)


def _pairs(rng: random.Random, n: int, slowdown: float, bursts: float = 0.1) -> list[float]:
    """AB/BA pair ratios of an A/B on a noisy machine: each round's processes get their own speed (layout,
    caches: 3%), with probability ``bursts`` a neighbour's burst hits one side of a round (heavy-tailed), the
    machine drifts and the side that goes first gains 2% (which ABBA cancels); the candidate is ``slowdown``
    slower."""
    pairs, t = [], 0.0
    for _ in range(n):
        rounds = []
        for first_is_a in (True, False):
            t += 1
            drift = 1 + 0.3 * math.sin(t / 7)
            a = drift * math.exp(rng.gauss(0, 0.03)) * (0.98 if first_is_a else 1.0)
            b = drift * math.exp(rng.gauss(0, 0.03)) * (1.0 if first_is_a else 0.98) * (1 + slowdown)
            if rng.random() < bursts:  # a burst on one side of the round
                (a, b) = (a * rng.uniform(1.2, 3.0), b) if rng.random() < 0.5 else (a, b * rng.uniform(1.2, 3.0))
            rounds.append(b / a)
        pairs.append(math.sqrt(rounds[0] * rounds[1]))
    return pairs


def test_unchanged_code_false_alarms_at_most_at_the_stated_rate():
    """20,000 synthetic comparisons of unchanged code at a stated rate of 1%: the observed rate stays within it
    (plus three standard errors), whatever the bursts and drift; at 0.1% the design's exact rate is 2^-10."""
    rng = random.Random(1234)
    alpha = 0.01
    c = sign_boundaries(min_pairs(alpha), min_pairs(alpha), alpha)[min_pairs(alpha)]
    trials = 20_000
    alarms = sum(ab_verdict(_pairs(rng, min_pairs(alpha), 0.0), 0.0, c) == "REGRESSION" for _ in range(trials))
    assert alarms / trials <= false_alarm_rate({min_pairs(alpha): c}) + 3 * math.sqrt(alpha / trials), alarms


def test_a_planted_ten_percent_slowdown_is_caught_in_nearly_every_comparison():
    """The default design (28 rounds: 13 of 14 pairs above 1) catches a 10% slowdown in 95% of comparisons or more
    when one round in fifty has a one-sided burst (lockstep rounds: a burst longer than a step lands on both
    sides); 20 rounds (all 10 pairs above 1) lose a comparison to every such burst."""
    from zerobench.bench.ab import ABConfig

    rng = random.Random(99)
    n = ABConfig.rounds // 2
    c = sign_boundaries(n, n, 0.001)[n]
    assert (n, c) == (14, 13) and false_alarm_rate({n: c}) <= 0.001
    caught = sum(ab_verdict(_pairs(rng, n, 0.10, bursts=0.02), 0.05, c) == "REGRESSION" for _ in range(2000))
    assert caught / 2000 >= 0.95, caught
    c10 = sign_boundaries(10, 10, 0.001)[10]
    caught10 = sum(ab_verdict(_pairs(rng, 10, 0.10, bursts=0.02), 0.05, c10) == "REGRESSION" for _ in range(2000))
    assert caught10 < caught, (caught10, caught)


def test_extra_rounds_while_undecided_keep_the_false_alarm_rate():
    """The sequential design (looks after every pair from 5 to 9, at a rate of 5% so that 5 pairs can reach it,
    going on only while undecided) on unchanged code: the observed rate stays within the exact rate computed for
    the design."""
    rng = random.Random(7)
    bounds = sign_boundaries(5, 9, 0.05)
    trials, alarms = 20_000, 0
    for _ in range(trials):
        pairs = _pairs(rng, 5, 0.0)
        while ab_undecided(pairs, 0.0, bounds[len(pairs)]) and len(pairs) < 9:
            pairs += _pairs(rng, 1, 0.0)
        alarms += ab_verdict(pairs, 0.0, bounds[len(pairs)]) == "REGRESSION"
    assert alarms / trials <= false_alarm_rate(bounds) + 3 * math.sqrt(0.05 / trials) <= 0.05 + 0.005, alarms


def test_a_coin_orients_each_pair_so_unchanged_code_lies_above_one_half_the_time():
    """A drift that is curved within a pair (slow in its middle slots: a neighbour that wakes between rounds)
    is not cancelled by a pair's geometric mean. With the orientation fixed (AB then BA, the baseline always
    in the outer slots) unchanged code would lie above 1 in every pair; with the seeded coin
    (``bench.ab.round_order``) the side in the middle slots is random, so pairs lie above 1 half the time and
    the sign test's null, Binomial(n, 1/2), holds."""
    from zerobench.bench.ab import round_order

    assert [round_order(r, 0) for r in (-1, -2)] == [("candidate", "baseline"), ("baseline", "candidate")]
    orders = [(round_order(2 * p, 7), round_order(2 * p + 1, 7)) for p in range(2000)]
    assert all(first == second[::-1] for first, second in orders)  # each pair: AB-BA or BA-AB
    assert orders == [(round_order(2 * p, 7), round_order(2 * p + 1, 7)) for p in range(2000)]  # seeded
    assert orders != [(round_order(2 * p, 8), round_order(2 * p + 1, 8)) for p in range(2000)]
    slot = [1.0, 1.3, 1.3, 1.0]  # the four process slots of a pair: two rounds of two sides each

    def pair(first: tuple[str, str], second: tuple[str, str]) -> float:
        where = {}
        for i, side in enumerate((*first, *second)):
            where.setdefault(side, []).append(slot[i])
        # both rounds' ratios candidate / baseline, unchanged code: only the slot differs
        (c1, c2), (b1, b2) = where["candidate"], where["baseline"]
        return math.sqrt((c1 / b1) * (c2 / b2))

    above = sum(pair(*o) > 1 for o in orders)
    assert 0.45 < above / len(orders) < 0.55, above
    fixed = pair(("baseline", "candidate"), ("candidate", "baseline"))
    assert fixed > 1  # what a fixed orientation would have done, every pair


def test_an_ab_suite_named_is_the_candidate_trees_for_both_sides(tmp_path):
    """A suite given by name was resolved by each side in its own tree: a baseline whose suites/ said micro_batch 8
    was compared with a candidate's micro_batch 2 and called an improvement. The candidate tree's file is copied
    into the comparison, and both sides run that copy."""
    from zerobench.bench.ab import ABConfig, _pin_suite
    from zerobench.config import ConfigError

    for side, mb in (("base", 8), ("cand", 2)):
        (tmp_path / side / "suites" / "cpu").mkdir(parents=True)
        (tmp_path / side / "suites" / "cpu" / "g.yaml").write_text(f"name: g\nbase: {{micro_batch: {mb}}}\n")
    out = tmp_path / "out"
    out.mkdir()
    cfg = ABConfig("cpu/g", str(tmp_path / "base"), str(tmp_path / "cand"))
    pinned = _pin_suite(cfg, out)
    assert pinned.parent == out / "suite" and "micro_batch: 2" in pinned.read_text()
    with pytest.raises(ConfigError, match="suite 'cpu/nope' not found"):
        _pin_suite(ABConfig("cpu/nope", str(tmp_path / "base"), str(tmp_path / "cand")), tmp_path / "out2")
