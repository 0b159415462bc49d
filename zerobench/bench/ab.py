"""Interleaved A/B timing: the per-commit gate for step time, on machines too noisy for stored baselines.

Timings recorded at different times drift (on the 2-core CI VM, identical runs in different sessions
moved by tens of per cent), so a stored baseline can only catch large slowdowns. Here the baseline code
and the candidate code run the same suite runs *alternately*, in fresh processes each time, after one
discarded warm-up round of each side. Rounds come in pairs, AB then BA or BA then AB, the orientation of each
pair drawn by a seeded coin (``seed``). Each round gives one ratio candidate / baseline per run; a pair's two
rounds are combined by their geometric mean, which cancels a drift that is linear over the pair. The verdict is
a sign test on the pairs (``bench/stats.py``): a regression needs the median pair ratio above 1 + tolerance
*and* enough pairs above 1 that unchanged code would show as many with probability at most ``false_alarm`` (by
default 13 of 14 pairs, rate 0.00092). With unchanged code the two sides are one experiment under two names and
the coin decides which name runs in which slot, so each pair lies above 1 with probability one half whatever the
machine's noise does (curved drift and bursts included): the rate is exact by construction. Each side runs its own
code (``python -m zerobench sweep`` with ``PYTHONPATH`` at its tree): a baseline *ref* is checked out into
a temporary git worktree. ``*_env`` (KEY=VALUE) adds variables to one side, e.g. the test-only planted
delay.

With ``concurrent`` the two sides of a round run at the same time on disjoint halves of the CPUs,
swapping halves every round. On the 2-core CI VM this is what makes a 10% slowdown visible: identical
runs started one after the other differed by up to 20% in step time, run side by side by 2-5%.
"""

from __future__ import annotations

import dataclasses
import math
import os
import random
import shutil
import statistics
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from zerobench.bench.lockstep import Referee
from zerobench.bench.stats import (
    ab_undecided,
    abba_pairs,
    critical_count,
    median_ratio,
    min_pairs,
    sign_boundaries,
    sign_test,
)
from zerobench.config import ConfigError, RunFailed
from zerobench.launch.local import allowed_cpus
from zerobench.results.rows import RowWriter, read_rows
from zerobench.results.status import STATUS_METRIC

METRICS = ("auto", "step_time_s", "step_cpu_s", "step_time_norm")


@dataclass(frozen=True)
class ABConfig:
    """One interleaved comparison."""

    suite: str
    """Suite file (or name under ``suites/``) whose runs both sides run; a name is resolved in the candidate tree,
    and the file is copied into the comparison's directory, which both sides then read (``_pin_suite``)."""
    baseline_tree: str
    """Source tree of the baseline code (a checkout; ``worktree`` makes one from a git ref)."""
    candidate_tree: str
    """Source tree of the candidate code (default: this checkout)."""
    rounds: int = 28
    """Measured alternations (even: AB, BA, AB, ...); each gives one ratio per run. At least
    2 x ``min_pairs(false_alarm)`` (20 for 0.001: all 10 pairs above 1). The default, 14 pairs of which 13 must
    lie above 1 (false-alarm rate 0.00092), does not lose a regression to one pair that noise turned over."""
    max_rounds: int = 0
    """Keep adding AB/BA pairs while a run's median lies beyond a tolerance edge but the sign test does not yet
    say so beyond chance, up to this many rounds (even); 0 or <= ``rounds``: exactly ``rounds``. The test's
    critical counts account for every look (``sign_boundaries``), so the false-alarm rate holds."""
    false_alarm: float = 0.001
    """The probability that unchanged code is called a regression (per run compared), whatever the noise."""
    warmup_rounds: int = 1
    """Rounds of each side run first and discarded (cold caches, first-run effects)."""
    seed: int = 0
    """Seeds the coin that orients each pair of rounds (AB-BA or BA-AB)."""
    only: tuple[str, ...] = ()
    """``KEY=VALUE`` filters passed to ``zerobench sweep --only``."""
    tolerance: float = 0.05
    """A median ratio above 1 + tolerance is a regression, below 1 - tolerance an improvement."""
    metric: str = "auto"
    """The row compared. ``step_time_s``: the median step time. ``step_time_norm``: the median of step time
    over a fixed matmul timed right after each step in the same process, which cancels drift between
    processes run one after the other, but on the CPU VM it also showed only ~70% of a planted slowdown
    (the reference ran slower after the delay). ``auto``: ``step_time_s`` when ``concurrent`` (the sides
    share the machine's noise), else ``step_time_norm``."""
    cpus: tuple[int, ...] = ()
    """Pin both sides to these CPUs (``os.sched_setaffinity`` in the child; the launcher sizes its thread
    pools from the mask). Empty: no pinning."""
    concurrent: bool = False
    """Run both sides *at the same time*, each pinned to its half of ``cpus`` (all usable CPUs when
    empty), swapping halves every round: both see the same machine noise, so it cancels in the ratio,
    and a round takes one side's time. For CPU runs on a noisy (shared, virtualized) machine; the
    sides must not share a device, so not for runs on one GPU."""
    lockstep: bool = False
    """Run both sides at the same time on the same CPUs but let only one *training step* run at a time,
    alternating sides step by step (``zerobench.bench.lockstep``): the sides never compete for a CPU and
    noise lasting longer than a step lands on both. Needs a baseline tree that has lockstep turns
    (``zerobench/train/turnstile.py``)."""
    baseline_env: tuple[str, ...] = field(default_factory=tuple)
    """Extra ``KEY=VALUE`` environment for the baseline side."""
    candidate_env: tuple[str, ...] = field(default_factory=tuple)
    """Extra ``KEY=VALUE`` environment for the candidate side."""
    timeout_s: float = 900.0
    """Per side and round."""

    @property
    def compared(self) -> str:
        """The metric actually compared (``metric`` with ``auto`` resolved)."""
        if self.metric != "auto":
            return self.metric
        return "step_time_s" if self.concurrent or self.lockstep else "step_time_norm"

    def validate(self) -> None:
        if self.metric not in METRICS:
            raise ConfigError(f"unknown A/B metric {self.metric!r}: choose one of {', '.join(METRICS)}")
        if self.rounds < 2 or self.rounds % 2:
            raise ConfigError(f"--rounds must be even and >= 2 (AB/BA pairs), got {self.rounds}")
        if self.max_rounds % 2:
            raise ConfigError(f"--max-rounds must be even (AB/BA pairs), got {self.max_rounds}")
        if self.max_rounds and self.max_rounds < self.rounds:
            raise ConfigError(
                f"--max-rounds {self.max_rounds} is below --rounds {self.rounds}: it is the most rounds with the "
                "extra pairs, so give at least --rounds (or 0 for no extra rounds)"
            )
        if not 0 < self.false_alarm < 1:
            raise ConfigError(f"--false-alarm must lie between 0 and 1, got {self.false_alarm}")
        need = 2 * min_pairs(self.false_alarm)
        if self.rounds < need:
            raise ConfigError(
                f"--rounds {self.rounds} cannot reach a false-alarm rate of {self.false_alarm:g}: the sign "
                f"test needs at least {need} rounds ({need // 2} AB/BA pairs, all above 1); give "
                f"--rounds {need} or a larger --false-alarm"
            )
        for tree in (self.baseline_tree, self.candidate_tree):
            if not (Path(tree) / "zerobench" / "__init__.py").exists():
                raise ConfigError(f"{tree} is not a zerobench source tree (no zerobench/__init__.py)")
        for item in (*self.baseline_env, *self.candidate_env, *self.only):
            if "=" not in item:
                raise ConfigError(f"expected KEY=VALUE, got {item!r}")
        if self.concurrent and self.lockstep:
            raise ConfigError(
                "choose one of --concurrent (sides side by side on CPU halves) and --lockstep "
                "(sides' steps alternating on the same CPUs)"
            )
        if self.lockstep:
            for tree in (self.baseline_tree, self.candidate_tree):
                if not (Path(tree) / "zerobench" / "train" / "turnstile.py").exists():
                    raise ConfigError(
                        f"{tree} predates lockstep A/B (no zerobench/train/turnstile.py): "
                        f"compare it with --concurrent or one side after the other"
                    )
        if self.concurrent and len(self.cpus or allowed_cpus()) % 2:
            raise ConfigError(
                f"--concurrent splits the CPUs into two equal halves, one per side: give an even "
                f"--cpus list (this process may use {len(allowed_cpus())} CPUs)"
            )
        if self.cpus:
            have = allowed_cpus()
            if not set(self.cpus) <= have:
                raise ConfigError(
                    f"--cpus {','.join(map(str, self.cpus))}: this process may only use CPUs "
                    f"{','.join(map(str, sorted(have)))}"
                )


def _start(
    cfg: ABConfig,
    tree: str,
    env_items: tuple[str, ...],
    out: Path,
    cpus: tuple[int, ...],
    extra: dict[str, str] | None = None,
) -> subprocess.Popen:
    env = {
        **os.environ,
        **dict(item.split("=", 1) for item in env_items),
        **(extra or {}),
        "PYTHONPATH": os.pathsep.join([str(Path(tree).resolve()), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    }
    cmd = [sys.executable, "-m", "zerobench", "sweep", cfg.suite, "--out", str(out), "--no-progress"]  # pinned
    for item in cfg.only:
        cmd += ["--only", item]
    pin = (lambda: os.sched_setaffinity(0, cpus)) if cpus else None
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(_log(out), "w") as log:  # a file, not a pipe: a side never blocks on output nobody reads
        # preexec_fn is safe here: this process runs no other thread while sides start (the lockstep
        # referee's thread starts after them)
        return subprocess.Popen(cmd, env=env, cwd=tree, stdout=log, stderr=subprocess.STDOUT, preexec_fn=pin)  # noqa: PLW1509


def _log(out: Path) -> Path:
    return out.parent / f"{out.name}.log"


def _finish(cfg: ABConfig, name: str, proc: subprocess.Popen, out: Path) -> None:
    try:
        proc.wait(timeout=cfg.timeout_s)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise ConfigError(f"the {name} side ran past {cfg.timeout_s:.0f}s in {out} (log: {_log(out)})") from None
    if proc.returncode:
        lines = _log(out).read_text(errors="replace").strip().splitlines()
        raise ConfigError(f"the {name} side failed in {out}: {(lines or ['no output'])[-1]} (log: {_log(out)})")


def _round(cfg: ABConfig, r: int, order: tuple[str, str], sides: dict, out: Path, say) -> dict[str, Path]:
    """Run one round (both sides, in ``order``, or together when concurrent); return each side's rows dir."""
    dirs = {name: out / name / (f"round{r}" if r >= 0 else f"warmup{-r}") for name in order}
    label = f"round {r + 1}/{cfg.rounds}" if r >= 0 else "warm-up round"
    procs: dict[str, subprocess.Popen] = {}
    try:
        if not cfg.concurrent and not cfg.lockstep:
            for name in order:
                say(f"{label}: {name}")
                procs[name] = _start(cfg, *sides[name], dirs[name], cfg.cpus)
                _finish(cfg, name, procs[name], dirs[name])
            return dirs
        if cfg.lockstep:
            _lockstep_round(cfg, label, order, sides, dirs, procs, say)
            return dirs
        cpus = cfg.cpus or tuple(sorted(allowed_cpus()))
        halves = (cpus[: len(cpus) // 2], cpus[len(cpus) // 2 :])
        say(f"{label}: {order[0]} on CPUs {_fmt(halves[0])} with {order[1]} on CPUs {_fmt(halves[1])}")
        for name, half in zip(order, halves):
            procs[name] = _start(cfg, *sides[name], dirs[name], half)
        for name in order:
            _finish(cfg, name, procs[name], dirs[name])
        return dirs
    finally:  # a failed side, a timeout or Ctrl-C never leaves the other side running
        for p in procs.values():
            if p.poll() is None:
                p.kill()
                p.wait()


def _lockstep_round(
    cfg: ABConfig,
    label: str,
    order: tuple[str, str],
    sides: dict,
    dirs: dict[str, Path],
    procs: dict[str, subprocess.Popen],
    say,
) -> None:
    say(f"{label}: {order[0]} and {order[1]} taking turns step by step, {order[0]} first")
    with Referee(order, first=order[0]) as ref:
        for name in order:
            procs[name] = _start(cfg, *sides[name], dirs[name], cfg.cpus, extra=ref.env(name))
            ref.watch(name, procs[name])
        ref.start()
        for name in order:
            _finish(cfg, name, procs[name], dirs[name])
        if not all(ref.grants.values()):
            idle = [name for name, n in ref.grants.items() if not n]
            raise ConfigError(f"the {' and '.join(idle)} side never took a lockstep turn in {dirs[idle[0]]}")


def _fmt(cpus: tuple[int, ...]) -> str:
    return ",".join(map(str, cpus))


def _times(out: Path, metric: str) -> dict[str, dict]:
    return {r["run_id"]: r for r in read_rows(out) if r["metric"] == metric and r.get("status", "ok") == "ok"}


def _runs(out: Path) -> set[str]:
    """The runs a side's round ran (each has its status row, whatever its end), not those its suite's checker
    refused (``invalid``: a suite may hold such entries by design, and they run on neither side)."""
    return {r["run_id"] for r in read_rows(out) if r["metric"] == STATUS_METRIC and r.get("status") != "invalid"}


def _ratio(cand: dict, base: dict, stepwise: bool) -> float | None:
    """Candidate / baseline for one run and round. ``stepwise`` (lockstep rounds, where candidate step k ran
    right next to baseline step k): the median over k of the per-step ratios, so a burst of machine noise
    covering a few steps of both sides cancels instead of shifting one side's median. Otherwise (or when
    the rows carry no per-step ``samples``) the ratio of the two medians."""
    cs, bs = cand.get("samples"), base.get("samples")
    if stepwise and cs and bs and len(cs) == len(bs) and all(b > 0 for b in bs):
        return median_ratio(cs, bs)
    return cand["value"] / base["value"] if base["value"] else None


def round_order(r: int, seed: int) -> tuple[str, str]:
    """Which side runs first in round ``r`` (warm-up rounds are negative): each pair of measured rounds
    (2p, 2p + 1) is AB-BA or BA-AB as a coin seeded with (``seed``, p) says, so which side takes which slot of a
    pair is random and the sign test's null holds whatever the machine does; warm-up rounds alternate."""
    ab, ba = ("baseline", "candidate"), ("candidate", "baseline")
    if r < 0:
        return ab if r % 2 == 0 else ba
    flip = random.Random(f"{seed}:{r // 2}").random() < 0.5
    first = ba if flip else ab
    return first if r % 2 == 0 else (ba if first == ab else ab)


def _suite_source(cfg: ABConfig) -> Path:
    """The suite file both sides run: a file given by path, or a name resolved in the candidate tree's ``suites/``
    (each side resolving a name in its own tree would run the baseline's definition against the candidate's, and
    compare two workloads)."""
    given = Path(cfg.suite)
    if given.is_file():
        return given
    suites = Path(cfg.candidate_tree) / "suites"
    src = next((c for c in (suites / cfg.suite, suites / f"{cfg.suite}.yaml") if c.is_file()), None)
    if src is None:
        raise ConfigError(
            f"suite {cfg.suite!r} not found: give a YAML file or a name under the candidate tree's {suites}"
        )
    return src


def _pin_suite(cfg: ABConfig, out: Path) -> Path:
    """``_suite_source`` copied into ``out``: both sides read the same bytes, whatever their trees hold."""
    src = _suite_source(cfg)
    pinned = out / "suite" / src.name
    pinned.parent.mkdir()
    shutil.copyfile(src, pinned)
    return pinned


def run_ab(cfg: ABConfig, out: Path, say: Callable[[str], None] = print) -> list[dict]:
    """Run the interleaved comparison; return one verdict per run (and write them as rows). ``out`` is taken from
    this process's directory, not each side's tree (a relative one would land in the baseline's worktree)."""
    cfg.validate()
    _suite_source(cfg)  # a suite that is not there is one line before anything is made
    out = out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    if any(out.iterdir()):
        raise ConfigError(f"{out} is not empty: choose a new --out (an A/B comparison never mixes rows)")
    named = cfg.suite
    cfg = dataclasses.replace(cfg, suite=str(_pin_suite(cfg, out)))
    ratios: dict[str, dict[int, float]] = {}
    ran: set[str] = set()  # every run of a measured round, on either side: each gets a verdict
    not_finite: set[str] = set()
    sides = {"baseline": (cfg.baseline_tree, cfg.baseline_env), "candidate": (cfg.candidate_tree, cfg.candidate_env)}
    bounds = sign_boundaries(cfg.rounds // 2, max(cfg.rounds, cfg.max_rounds) // 2, cfg.false_alarm)
    r, last = -cfg.warmup_rounds, cfg.rounds
    while r < last:
        order = round_order(r, cfg.seed)
        dirs = _round(cfg, r, order, sides, out, say)
        got = {name: _times(d, cfg.compared) for name, d in dirs.items()}
        if r >= 0:
            ran |= set().union(*(_runs(d) for d in dirs.values()))
        for run_id, row in got["candidate"].items() if r >= 0 else ():
            if run_id in got["baseline"] and (q := _ratio(row, got["baseline"][run_id], cfg.lockstep)) is not None:
                if math.isfinite(q) and q > 0:
                    ratios.setdefault(run_id, {})[r] = q
                else:  # a NaN or infinite time on a side: never a ratio the sign test could call ok
                    not_finite.add(run_id)
        r += 1
        if (
            r == last
            and last < cfg.max_rounds
            and any(
                ab_undecided(ps, cfg.tolerance, critical_count(bounds, len(ps), cfg.false_alarm))
                for ps in map(abba_pairs, ratios.values())
            )
        ):
            last += 2
            say(f"a median lies beyond the tolerance, not yet beyond chance: 2 more rounds (at most {cfg.max_rounds})")
    verdicts = [
        _verdict(run_id, abba_pairs(rs), bounds, cfg)
        for run_id, rs in sorted(ratios.items())
        if abba_pairs(rs) and run_id not in not_finite
    ]
    judged = {v["run"] for v in verdicts}
    verdicts += [_unjudged(run_id, run_id in not_finite, cfg) for run_id in sorted((ran | not_finite) - judged)]
    if not judged:
        raise RunFailed(
            f"no run produced {cfg.compared!r} rows on both sides of an AB/BA pair: nothing to compare "
            f"(each side's runs and logs are under {out})"
        )
    _write(dataclasses.replace(cfg, suite=named), out, verdicts)
    return verdicts


def _verdict(run_id: str, pairs: list[float], bounds: dict[int, int | None], cfg: ABConfig) -> dict:
    return {
        "run": run_id,
        "median_ratio": statistics.median(pairs),
        "min": min(pairs),
        "max": max(pairs),
        "rounds": 2 * len(pairs),
        **sign_test(pairs, bounds, cfg.false_alarm, cfg.tolerance),
    }


def _unjudged(run_id: str, not_finite: bool, cfg: ABConfig) -> dict:
    """The verdict of a run no AB/BA pair judged: ``not finite`` where a side measured a NaN or infinite time,
    else ``missing`` (a side failed it, or wrote no ``cfg.compared`` row, in every pair). Both fail the gate."""
    return {
        "run": run_id,
        "median_ratio": None,
        "min": None,
        "max": None,
        "rounds": 0,
        "verdict": "NOT FINITE" if not_finite else "missing",
        "lower": None,
        "upper": None,
        "pairs_above": 0,
        "critical": None,
        "false_alarm": cfg.false_alarm,
    }


def _write(cfg: ABConfig, out: Path, verdicts: list[dict]) -> None:
    config = {
        "suite": cfg.suite,
        "rounds": cfg.rounds,
        "max_rounds": cfg.max_rounds,
        "tolerance": cfg.tolerance,
        "false_alarm": cfg.false_alarm,
        "metric": cfg.compared,
        "cpus": list(cfg.cpus),
        "concurrent": cfg.concurrent,
        "lockstep": cfg.lockstep,
        "baseline_env": list(cfg.baseline_env),
        "candidate_env": list(cfg.candidate_env),
        "only": list(cfg.only),
    }
    per_round = (
        f"the median over steps k of candidate / baseline {cfg.compared} of step k"
        if cfg.lockstep
        else f"candidate / baseline {cfg.compared}"
    )
    w = RowWriter(out / "summary", "ab", config)
    for v in verdicts:
        w.write(
            "ab_time_ratio",
            v["median_ratio"],
            "ratio",
            run=v["run"],
            min=v["min"],
            max=v["max"],
            rounds=v["rounds"],
            verdict=v["verdict"],
            lower=v["lower"],
            upper=v["upper"],
            pairs_above=v["pairs_above"],
            critical=v["critical"],
            false_alarm=v["false_alarm"],
            definition=f"median over AB/BA round pairs of the pair's geometric mean of the per-round ratio "
            f"({per_round}); min and max over pairs; lower and upper: the sign test's confidence "
            f"bounds of the median (a regression needs pairs_above >= critical, i.e. lower > 1, and the "
            f"median above 1 + tolerance); false_alarm: the probability that unchanged code is called "
            f"a regression with these rounds",
        )
