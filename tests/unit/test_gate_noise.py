"""The gate's noise model (bench/noise.py, bench/regress.py) on synthetic noisy samples, without processes: the
Student-t bound it uses, a baseline recorded from several unchanged runs, unchanged candidates passing at the
stated false-alarm rate, a planted 5% host-work change caught by instruction counts, exact counts exact, CPU time
from a run under callgrind never compared, and host-work metrics without a noise model listed, not judged."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest

from zerobench.bench import noise
from zerobench.bench.gate_rules import gate, summarize
from zerobench.bench.regress import noise_rows, run_gate, write_baseline

BASELINE = Path(__file__).resolve().parents[2] / "results" / "baselines" / "cpu-2core.jsonl"
PHASES = ("forward_backward", "optimizer", "zero_grad")
SHARE = {"forward_backward": 0.9, "optimizer": 0.09, "zero_grad": 0.01}


@pytest.fixture(scope="module")
def run_rows() -> list[dict]:
    """The rows of one configuration of the committed baseline (a run of suites/cpu/ci.yaml at stage 2), without
    the host-work metrics ``_host`` draws for each synthetic sweep (and Python calls, which it does not)."""
    rows = [json.loads(line) for line in BASELINE.read_text().splitlines()]
    drawn = ("host_cpu_s", "ops_dispatched", "instructions", "py_calls")
    return [r for r in rows if r["run_id"] == "002-stage-2" and r["metric"] not in drawn]


def _host(
    run_rows: list[dict],
    rng: random.Random,
    *,
    instr: float = 2e8,
    cpu: float = 0.05,
    sigma_i: float = 0.002,
    sigma_c: float = 0.10,
    ops: int = 726,
    instrumented_cpu: float | None = None,
) -> list[dict]:
    """One synthetic sweep of the run: its rows plus host-work rows per rank and phase, the instructions from a
    run under callgrind (rows tagged ``instrumented``), everything else from a timed run."""
    template = next(r for r in run_rows if r["metric"] == "run_status")
    out = [dict(r) for r in run_rows]  # rows are not changed in place
    for rank in (0, 1):
        i_scale, c_scale = math.exp(rng.gauss(0, sigma_i)), math.exp(rng.gauss(0, sigma_c))
        for phase in (*PHASES, "step"):
            share = 1.0 if phase == "step" else SHARE[phase]
            base = {k: template[k] for k in ("config", "config_hash", "run_id", "provenance", "suite") if k in template}
            out.append(
                base
                | {
                    "metric": "host_cpu_s",
                    "value": cpu * share * c_scale,
                    "unit": "s",
                    "status": "ok",
                    "rank": rank,
                    "phase": phase,
                }
            )
            out.append(
                base
                | {
                    "metric": "ops_dispatched",
                    "value": round(ops * share),
                    "unit": "ops",
                    "status": "ok",
                    "rank": rank,
                    "phase": phase,
                }
            )
            out.append(
                base
                | {
                    "metric": "instructions",
                    "value": instr * share * i_scale,
                    "unit": "instructions",
                    "status": "ok",
                    "rank": rank,
                    "phase": phase,
                    "instrumented": "callgrind",
                }
            )
            if instrumented_cpu is not None:  # what a run under callgrind measures as CPU time: not a measurement
                out.append(
                    base
                    | {
                        "metric": "host_cpu_s",
                        "value": instrumented_cpu,
                        "unit": "s",
                        "status": "ok",
                        "rank": rank,
                        "phase": phase,
                        "instrumented": "callgrind",
                    }
                )
    return out


def test_the_student_t_bound_matches_its_tables():
    for p, dof, t in [(0.975, 2, 4.3027), (0.999, 4, 7.1732), (0.995, 10, 3.1693), (0.75, 1, 1.0), (0.9, 3, 1.6377)]:
        assert noise.t_quantile(p, dof) == pytest.approx(t, abs=1e-4), (p, dof)
        assert noise.t_cdf(t, dof) == pytest.approx(p, abs=1e-5)
    assert noise.t_quantile(0.025, 2) == pytest.approx(-4.3027, abs=1e-4)
    assert noise.factor(5, 0.001) > noise.factor(10, 0.001) > noise.factor(50, 0.001) > noise.t_quantile(0.999, 1000)
    assert noise.factor(1, 0.001) == math.inf


def test_spread_and_tolerance():
    assert noise.spread([5, 5, 5]) == (5, 0.0) and noise.spread([-1, 1])[1] == math.inf
    assert noise.spread([0, 1, 0]) == (pytest.approx(1 / 3), pytest.approx(math.sqrt(3)))  # relative to the mean
    center, sigma = noise.spread([99.0, 100.0, 101.0])
    assert center == 100 and sigma == pytest.approx(0.01)
    assert noise.tolerance("ops_dispatched", 0.0, 5, 0.001) == 0.0  # a count that never moved: exact
    assert noise.tolerance("py_calls", 0.0, 5, 0.001, exact_when_still=False) == 0.01  # known to move: its floor
    assert noise.tolerance("host_cpu_s.optimizer", 1e-4, 5, 0.001) == 0.05  # the CPU-time floor
    assert noise.tolerance("instructions", 0.003, 10, 0.001) == pytest.approx(noise.factor(10, 0.001) * 0.003)


def test_a_baseline_from_unchanged_runs_records_their_spread(run_rows, tmp_path):
    rng = random.Random(3)
    samples = [_host(run_rows, rng) for _ in range(5)]
    rows, gaps = noise_rows(samples)
    by = {r["of"]: r for r in rows}
    assert not gaps and by["ops_dispatched"]["value"] == 0 and by["ops_dispatched"]["n"] == 5
    assert by["model_state_bytes"]["value"] == 0 and 0 < by["instructions"]["value"] < 0.01
    assert by["host_cpu_s"]["center"] == pytest.approx(sum(by["host_cpu_s"]["samples"]) / 5)
    write_baseline(samples[0], tmp_path / "b.jsonl", more=samples[1:])
    base = summarize([json.loads(line) for line in (tmp_path / "b.jsonl").read_text().splitlines()])
    (d,) = base.values()
    assert d["instructions"] == by["instructions"]["center"]  # the mean of the unchanged runs is the baseline


def _trial(run_rows, rng, k: int, false_alarm: float, **candidate) -> list:
    samples = [_host(run_rows, rng) for _ in range(k)]
    base = samples[0] + noise_rows(samples)[0]
    res = gate(base, _host(run_rows, rng, **candidate), false_alarm=false_alarm)
    assert not res.missing
    return [c for c in res.comparisons if c.verdict in ("regression", "not finite")]


def test_unchanged_candidates_fail_at_most_at_the_stated_rate(run_rows):
    """500 gate runs of unchanged code, each against a fresh baseline of 5 unchanged runs, at a stated rate of
    10% for the whole gate run: the observed rate stays within it (plus three standard errors)."""
    rng = random.Random(11)
    trials = 500
    failed = sum(bool(_trial(run_rows, rng, 5, 0.1)) for _ in range(trials))
    assert failed / trials <= 0.1 + 3 * math.sqrt(0.1 * 0.9 / trials), failed


@pytest.mark.parametrize("k", [3, 5, 10])
def test_one_comparison_false_alarms_at_its_stated_rate(k):
    """The bound itself, one metric and one comparison (the gate-run test above is conservative: its phases move
    together, so its Bonferroni split overcounts): K unchanged runs with normal noise, one more unchanged run
    judged at alpha = 5%. Over 8,000 trials the observed rate lies within three standard errors of 5%, neither
    above it (a bound too narrow) nor far below it (too wide to catch anything)."""
    rng = random.Random(k)
    alpha, trials, hits = 0.05, 8000, 0
    tol = None
    for _ in range(trials):
        runs = [100 * (1 + rng.gauss(0, 0.01)) for _ in range(k)]
        center, sigma = noise.spread(runs)
        tol = noise.factor(k, alpha) * sigma
        hits += 100 * (1 + rng.gauss(0, 0.01)) / center - 1 > tol
    se = math.sqrt(alpha * (1 - alpha) / trials)
    assert abs(hits / trials - alpha) < 3 * se, (hits / trials, tol)


def test_a_metric_the_first_run_lacks_is_still_modelled(run_rows):
    """The noise model takes every configuration and metric any unchanged run measured: a metric missing from
    the first run (its rows lost) but present in the other four is modelled from those four, not dropped."""
    rng = random.Random(4)
    samples = [_host(run_rows, rng) for _ in range(5)]
    samples[0] = [r for r in samples[0] if r["metric"] != "instructions"]
    rows, gaps = noise_rows(samples)
    (instr,) = [r for r in rows if r["of"] == "instructions"]
    assert instr["n"] == 4 and not gaps, (instr, gaps)
    samples[1:] = [[r for r in rs if r["metric"] != "instructions"] for rs in samples[1:4]] + samples[4:]
    rows, gaps = noise_rows(samples)
    assert not [r for r in rows if r["of"] == "instructions"] and any("instructions (in 1 of 5" in g for g in gaps)


def test_a_planted_five_percent_host_work_change_is_caught_by_instruction_counts(run_rows):
    """+5% host work: instructions with 0.2% noise, a baseline of 10 unchanged runs, false-alarm rate 0.001: caught
    in every one of 200 gate runs. CPU time (10% noise per rank) sees the same change in few of them: on a busy
    machine the instruction count is what catches it."""
    rng = random.Random(5)
    by_cpu = 0
    for _ in range(200):
        bad = _trial(run_rows, rng, 10, 0.001, instr=2e8 * 1.05, cpu=0.05 * 1.05)
        assert {c.metric for c in bad} >= {"instructions", "instructions.forward_backward"}, bad
        by_cpu += any(c.metric == "host_cpu_s" for c in bad)
    assert by_cpu < 20, by_cpu


def test_counts_are_exact_and_cpu_time_under_callgrind_is_never_compared(run_rows):
    rng = random.Random(8)
    samples = [_host(run_rows, rng, sigma_c=0.0) for _ in range(3)]
    base = samples[0] + noise_rows(samples)[0]
    one_more = _host(run_rows, random.Random(8), ops=727, sigma_c=0.0)
    res = gate(base, one_more)
    assert [(c.metric, c.basis) for c in res.comparisons if c.verdict == "regression"] == [
        ("ops_dispatched", "exact"),
        ("ops_dispatched.forward_backward", "exact"),
    ]
    # a callgrind run's CPU time (100x slower) beside the timed run's: only the timed run's is compared
    slow = _host(run_rows, random.Random(8), sigma_c=0.0, instrumented_cpu=5.0)
    res = gate(base, slow)
    cpu = [c for c in res.comparisons if c.metric == "host_cpu_s"]
    assert cpu and cpu[0].candidate == pytest.approx(0.1) and cpu[0].verdict == "ok", cpu


def test_without_a_noise_model_host_work_is_listed_not_judged(run_rows, tmp_path, capsys):
    rng = random.Random(2)
    base, cand = _host(run_rows, rng), _host(run_rows, rng, instr=4e8)  # twice the instructions
    paths = [tmp_path / "b.jsonl", tmp_path / "c.jsonl"]
    for p, rs in zip(paths, (base, cand)):
        p.write_text("".join(json.dumps(r) + "\n" for r in rs))
    code = run_gate(str(paths[0]), str(paths[1]), 0.05, str(tmp_path / "p.jsonl"), out=str(tmp_path / "verdicts"))
    out = capsys.readouterr().out
    assert code == 0 and "no noise model" in out and "not gated: 8 host-work metrics have no noise model" in out, out
    verdicts = [json.loads(line) for line in (tmp_path / "verdicts" / "rows.jsonl").read_text().splitlines()]
    result = next(v for v in verdicts if v["metric"] == "gate_result")
    assert result["value"] == 0 and {v["verdict"] for v in verdicts if v.get("of") == "instructions"} == {
        "no noise model"
    }


def test_a_tiny_phase_that_never_moved_keeps_an_absolute_floor(run_rows):
    """Unchanged runs whose instruction counts agree exactly hold each phase to its floor. A zero_grad phase of
    2e5 instructions (summed over two ranks) that moves by 3,000 (a garbage collection) moved 1.5%: above the 1%
    relative floor, within the family's absolute one (2e5 instructions: a tolerance of 100% here), so it is not a
    regression. The step (2e7) keeps the relative floor, and a planted 10% on it is caught."""

    def sweep(zero_grad: float = 1.0, total: float = 1.0) -> list[dict]:
        rows = _host(run_rows, random.Random(3), instr=1e7, sigma_i=0.0, sigma_c=0.0)
        for r in rows:
            if r["metric"] == "instructions":
                r["value"] *= zero_grad if r["phase"] == "zero_grad" else total if r["phase"] == "step" else 1.0
        return rows

    samples = [sweep() for _ in range(5)]
    base = samples[0] + noise_rows(samples)[0]
    moved = gate(base, sweep(zero_grad=1.015))
    flagged = {c.metric: c for c in moved.comparisons if c.metric.startswith("instructions")}
    assert flagged["instructions.zero_grad"].verdict == "ok", flagged["instructions.zero_grad"]
    assert flagged["instructions.zero_grad"].tolerance == pytest.approx(1.0), flagged["instructions.zero_grad"]
    planted = gate(base, sweep(total=1.10))
    (step,) = [c for c in planted.comparisons if c.metric == "instructions"]
    assert step.verdict == "regression" and step.tolerance == pytest.approx(0.01), step
    assert noise.floor("instructions", 1e7) == pytest.approx(0.02) and noise.floor("instructions", 1e9) == 0.01
    assert noise.floor("py_calls", 40) == pytest.approx(50 / 40) and noise.floor("py_calls") == 0.01


@pytest.mark.parametrize("order", ["instrumented last", "instrumented first"])
def test_a_failed_instrumented_run_beside_its_timed_twin_is_named_and_the_twin_compared(run_rows, order):
    """One directory holds both sweeps of a run: timed (ok) and under callgrind (failed, its status row tagged
    ``instrumented``). Whatever the rows' order, the gate names the instrumented run and its reason, still
    compares the timed run's metrics, and fails on the instructions it lacks."""
    rng = random.Random(6)
    samples = [_host(run_rows, rng) for _ in range(3)]
    base = samples[0] + noise_rows(samples)[0]
    timed = [r for r in _host(run_rows, rng) if not r.get("instrumented")]
    status = next(r for r in timed if r["metric"] == "run_status")
    failed = dict(status, status="failed", value=0, reason="rank 0 timed out after 6000 s", instrumented="callgrind")
    cand = [*timed, failed] if order == "instrumented last" else [failed, *timed]
    res = gate(base, cand)
    assert any("under callgrind: failed: rank 0 timed out" in n for n in res.not_completed), res.not_completed
    assert any(c.metric == "host_cpu_s" for c in res.comparisons), res.comparisons
    assert any("instructions" in m for m in res.missing), res.missing


def test_a_baseline_of_instrumented_runs_only_keeps_its_noise_model(run_rows):
    """Sweeps run only under callgrind: every row of the run is tagged ``instrumented``, its status row too. The
    baseline's noise-model rows (written by the gate, untagged) belong to that run: the instruction counts are
    judged against them, not listed as having no noise model."""
    rng = random.Random(9)

    def counted() -> list[dict]:
        rows = [r for r in _host(run_rows, rng) if r["metric"] in ("run_status", "instructions")]
        return [dict(r, instrumented="callgrind") for r in rows]

    samples = [counted() for _ in range(3)]
    base = samples[0] + noise_rows(samples)[0]
    res = gate(base, counted())
    judged = [c for c in res.comparisons if c.metric.startswith("instructions")]
    assert len(judged) == 4 and all(c.verdict != "no noise model" for c in judged), judged
    assert not res.missing and not res.not_completed, (res.missing, res.not_completed)


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_the_proposal_keeps_the_baselines_noise_model(run_rows, tmp_path, capsys):
    """Adopting the proposal of a passing gate run dropped the noise model, so host work was gated no more: a
    doubling of the instructions then read 'no noise model' and passed. The proposal keeps it, centred on the
    candidate's values."""
    rng = random.Random(21)
    samples = [_host(run_rows, rng) for _ in range(5)]
    write_baseline(samples[0], tmp_path / "b.jsonl", more=samples[1:])
    cand = _host(run_rows, rng)
    proposal = tmp_path / "proposal.jsonl"
    assert run_gate(str(tmp_path / "b.jsonl"), _jsonl(tmp_path / "c.jsonl", cand), 0.05, str(proposal)) == 0
    assert "keeps the baseline's noise model" in capsys.readouterr().out
    kept = [json.loads(line) for line in proposal.read_text().splitlines()]
    instr = next(r for r in kept if r["metric"] == "gate_noise" and r["of"] == "instructions")
    assert instr["center"] == pytest.approx(summarize(cand)[instr["config_hash"]]["instructions"])
    doubled = _host(run_rows, rng, instr=4e8)
    code = run_gate(str(proposal), _jsonl(tmp_path / "d.jsonl", doubled), 0.05, str(tmp_path / "p2.jsonl"))
    out = capsys.readouterr().out
    assert code == 1 and "no noise model" not in out, out


def test_strict_fails_what_was_not_judged(run_rows, tmp_path, capsys):
    """--strict failed only on what the baseline lacked: a host-work metric without a noise model, or a comparison
    too noisy to judge, still passed under it."""
    rng = random.Random(2)
    base, cand = _host(run_rows, rng), _host(run_rows, rng, instr=4e8)  # no noise model: not judged
    args = (_jsonl(tmp_path / "b.jsonl", base), _jsonl(tmp_path / "c.jsonl", cand), 0.05, str(tmp_path / "p.jsonl"))
    assert run_gate(*args) == 0
    assert (
        run_gate(*args, strict=True) == 1 and "not judged (too noisy, no noise model) fail" in capsys.readouterr().out
    )


@pytest.mark.parametrize(
    "field,value,said",
    [("class", "nvidia-h100", "hardware"), ("commit", "f" * 40, "commits"), ("dirty", "0a1b2c3d4e5f", "commits")],
)
def test_a_noise_model_from_two_machines_or_commits_is_refused(run_rows, tmp_path, field, value, said):
    """Unchanged runs of two machine classes or commits gave one noise model, whose spread (their difference)
    widened every tolerance drawn from it."""
    import copy

    from zerobench.config import ConfigError

    rng = random.Random(6)
    samples = [_host(run_rows, rng) for _ in range(3)]
    samples[1] = copy.deepcopy(samples[1])
    for r in samples[1]:
        if "provenance" in r:
            if field == "class":
                r["provenance"]["hardware"]["class"] = value
            elif field == "dirty":  # the same commit with uncommitted changes (before: taken for the commit's)
                r["provenance"].update(dirty=True, dirty_diff=value)
            else:
                r["provenance"]["commit"] = value
    with pytest.raises(ConfigError, match=f"results mix {said} .* \\(result 2\\)"):
        write_baseline(samples[0], tmp_path / "b.jsonl", more=samples[1:], whole=True)


def test_status_rows_of_another_machine_do_not_refuse_a_noise_model(run_rows, tmp_path):
    """Under --launcher slurm the status rows are written on the login node, the training rows on the compute nodes:
    the same-machine check refused every such sweep. It reads the training rows only."""
    import copy

    rng = random.Random(7)
    samples = [copy.deepcopy(_host(run_rows, rng)) for _ in range(3)]
    for rows in samples:
        for r in rows:
            if r["metric"] == "run_status" and "provenance" in r:  # its own provenance (the others share one)
                r["provenance"] = {
                    **r["provenance"],
                    "hardware": {**r["provenance"]["hardware"], "class": "cpu-64core"},
                }
    assert write_baseline(samples[0], tmp_path / "b.jsonl", more=samples[1:], whole=True) > 0
