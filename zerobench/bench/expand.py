"""A suite's runs: base, each ``runs`` entry, the cartesian product of ``axes`` and the ``zip`` lists,
generated one run at a time.

A suite's size is known without building a run (the product of its list lengths), so a suite beyond
``MAX_RUNS`` is refused at once with its count, before any run starts, and the runs are never all held in
memory: each pass over ``SuiteRuns`` generates them again, in the same order and with the same labels (labels
identify runs for ``--resume``; they are made unique with a set, in one pass).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from zerobench.bench.spec import RunSpec, to_train_config
from zerobench.config import ConfigError, from_dict
from zerobench.train.config import TrainConfig

MAX_RUNS = 10_000
"""Most runs one suite may expand to. A sweep of more is a mistake in its axes (8 axes of 10 values are
10**8 runs); the paper's suites hold tens. Split a larger study into several suites."""


@dataclass(frozen=True)
class ResolvedRun:
    """One run of a suite after expansion."""

    index: int
    label: str
    spec: RunSpec
    config: TrainConfig | None
    error: str | None

    @property
    def run_id(self) -> str:
        safe = "".join(c if c.isalnum() or c in "-_." else "-" for c in self.label)
        return f"{self.index:03d}-{safe}"[:80]


class SuiteRuns:
    """The runs of one suite file, generated on each iteration; ``len`` is their count, computed."""

    def __init__(self, path: Path, base: dict, runs: list[dict], axes: dict[str, list], zipped: dict[str, list]):
        self.path, self.base, self.runs, self.axes, self.zipped = path, base, runs, axes, zipped
        self.zip_len = len(next(iter(zipped.values()))) if zipped else 1
        self.per_entry = math.prod(len(v) for v in axes.values()) * self.zip_len
        """Runs per ``runs`` entry: the product of the axes' lengths times the zip lists' length."""

    def __len__(self) -> int:
        return len(self.runs) * self.per_entry

    def check(self) -> None:
        """Refuse a suite beyond ``MAX_RUNS`` (with its count), and any value of a wrong type (naming the first
        run holding it), in time linear in the file's length, not in the number of runs."""
        if len(self) > MAX_RUNS:
            lists = " x ".join(
                [
                    f"{len(self.runs)} runs",
                    *(f"{len(v)} {k}" for k, v in self.axes.items()),
                    *([f"{self.zip_len} zipped"] if self.zipped else []),
                ]
            )
            raise ConfigError(
                f"{self.path}: expands to {len(self):,} runs ({lists}), more than the {MAX_RUNS:,} one "
                "suite may hold: narrow the axes or split it into several suites"
            )
        varied = set(self.axes) | set(self.zipped)
        for r_i, run in enumerate(self.runs):  # base and entry keys, where no axis overrides them
            fixed = {k: v for k, v in {**self.base, **run}.items() if k not in varied}
            from_dict(RunSpec, fixed, where=f"{self.path}: run {r_i * self.per_entry}")
        stride = self.per_entry
        for k, values in self.axes.items():
            stride //= len(values)
            for j, v in enumerate(values):
                if k not in self.zipped:
                    from_dict(RunSpec, {k: v}, where=f"{self.path}: run {j * stride}")
        for k, values in self.zipped.items():
            for j, v in enumerate(values):
                from_dict(RunSpec, {k: v}, where=f"{self.path}: run {j}")

    def __iter__(self) -> Iterator[ResolvedRun]:
        several = self.per_entry > 1
        counts: dict[str, int] = {}
        taken: set[str] = set()
        index = 0
        for run in self.runs:
            for combo in itertools.product(*self.axes.values()):
                point = dict(zip(self.axes, combo))
                for zcombo in zip(*self.zipped.values()) if self.zipped else [()]:
                    varying = {**point, **dict(zip(self.zipped, zcombo))}
                    spec = from_dict(RunSpec, {**self.base, **run, **varying}, where=f"{self.path}: run {index}")
                    label = spec.label or ",".join(f"{k}={v}" for k, v in varying.items()) or self.path.stem
                    if spec.label and varying and several:
                        label += "," + ",".join(f"{k}={v}" for k, v in varying.items())
                    yield _resolve(index, _unique(label, counts, taken), spec)
                    index += 1

    def __getitem__(self, i: int) -> ResolvedRun:
        """Run ``i`` (negative: from the end), generating the runs before it."""
        j = i + len(self) if i < 0 else i
        if not 0 <= j < len(self):
            raise IndexError(f"run {i} of {len(self)}")
        return next(itertools.islice(iter(self), j, None))


def _unique(label: str, counts: dict[str, int], taken: set[str]) -> str:
    """``label``, or ``label #k`` for its k-th occurrence (the first k not taken): labels identify runs."""
    k = counts.get(label, 0) + 1
    name = label if k == 1 else f"{label} #{k}"
    while name in taken:
        k += 1
        name = f"{label} #{k}"
    counts[label] = k
    taken.add(name)
    return name


def _resolve(index: int, label: str, spec: RunSpec) -> ResolvedRun:
    try:
        return ResolvedRun(index, label, spec, to_train_config(spec), None)
    except ConfigError as e:
        return ResolvedRun(index, label, spec, None, str(e))
