"""What the regression gate's inputs must be before any comparison: whole (every configuration a sweep planned,
each with a completed run) and of one source (one machine class, one code version: the commit and any uncommitted
changes). A baseline, a noise model or a candidate that is not is refused in one line, since what it lacks or mixes
would otherwise pass, or widen every tolerance, without a word."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from zerobench.bench.gate_rules import run_key
from zerobench.config import ConfigError
from zerobench.results.provenance import code_version, describe_version
from zerobench.results.status import OK, STATUS_METRIC

SOURCE = ("hardware", "commits", "processors", "torch versions")
"""What ``_sources`` tells a sample's source by, in its key's order."""


def check_same_source(samples: Sequence[list[dict]]) -> None:
    """Refuse, in one line, unchanged runs that are not one machine class, one commit, one processor (the hardware's
    ``device``) and one torch version: their spread would be the difference between machines, commits, processors
    or torch versions (instruction counts, CPU time and the live-tensor counts move with each), and every tolerance
    drawn from it that much wider; and the gate holds a noise model for the processor it was measured on only."""
    seen = _sources(samples)
    for i, what in enumerate(SOURCE):
        first: dict = {}
        for key, sample in seen.items():  # in the order first seen: the earliest sample of each value first
            if i < 2 or key[i] is not None:  # a processor or torch version not recorded tells nothing apart
                first.setdefault(key[i], sample)
        if len(first) > 1:
            (v0, _), (v1, at) = list(first.items())[:2]
            if i == 1:
                v0, v1 = describe_version(v0), describe_version(v1)
            raise ConfigError(
                f"the --candidate results mix {what} {v0} and {v1} (result {at + 1}): a baseline and its noise "
                "model come from unchanged runs of one commit on one machine class, one processor and one torch "
                "version"
            )


def _sources(samples: Sequence[list[dict]]) -> dict[tuple, int]:
    """(hardware class, code version, processor, torch version) -> the first sample holding it, over every row but
    the status rows (written by whoever recorded the run: a login node under Slurm). The code version is the
    commit with the hash of any uncommitted changes (``provenance.code_version``): a dirty tree's runs are not the
    commit's."""
    seen: dict[tuple, int] = {}
    for i, rows in enumerate(samples):
        for r in rows:
            if r.get("metric") == STATUS_METRIC:
                continue
            prov = r.get("provenance") or {}
            hw = prov.get("hardware") or {}
            seen.setdefault((hw.get("class"), code_version(prov), hw.get("device"), prov.get("torch_version")), i)
    return seen


def check_one_version(rows: list[dict], what: str) -> None:
    """Refuse, in one line, gate input measured with two code versions (a sweep resumed at another commit, rows of
    two sweeps copied together): its step-time ratios would be taken across them and its verdicts stamped with one."""
    versions = {key[1] for key in _sources([rows])}
    if len(versions) > 1:
        a, b = sorted(versions, key=str)[:2]
        raise ConfigError(
            f"the {what} mixes runs of code {describe_version(a)} and {describe_version(b)}: a gate run judges one "
            "code version's results; sweep it again at one checkout"
        )


def check_same_kernels(samples: Sequence[list[dict]], names: Sequence[str]) -> None:
    """Refuse, in one line, runs of one configuration whose kernels took two paths across ``samples`` (each named by
    ``names``): ``auto`` takes the reference path where the fused kernels do not load (no C++ compiler, no Triton,
    or a change that broke their build), and times or working memory compared across the paths compare kernel paths,
    not code. The same for two process-group backends (``backend_ran``: gloo against NCCL). Rows of before runs
    recorded their path are not judged (``one_sided`` counts the configurations that leaves unjudged)."""
    kernels: dict[str, tuple[str, str]] = {}
    backends: dict[str, tuple[str, str]] = {}
    for name, rows in zip(names, samples, strict=True):
        for r in rows:
            b = r.get("backend_ran")
            if isinstance(b, str) and (first := _first_other(backends, r, name, b)):
                raise ConfigError(
                    f"run {r.get('run_id')} ran on {b} in {name} and on {first[1]} in {first[0]}: its times would "
                    "compare process-group backends, not code; give both sides the same --backend, or the same "
                    "layout of ranks and GPUs"
                )
            k = r.get("kernels_ran")
            if not isinstance(k, dict):
                continue
            path = ", ".join(f"{part}={v}" for part, v in sorted(k.items()))
            if first := _first_other(kernels, r, name, path):
                raise ConfigError(
                    f"run {r.get('run_id')}'s kernels took {path} in {name} and {first[1]} in {first[0]}: its times "
                    "would compare kernel paths, not code; where 'reference' ran, the fused kernels did not load (the "
                    "run's log says why: fix that), or measure both on one machine"
                )


RECORDED = {"backend_ran": "process-group backend", "kernels_ran": "kernel path"}
"""What a run records of what it ran on (``train/loop.py``), and what ``check_same_kernels`` compares it as."""


def one_sided(a: list[dict], b: list[dict], names: Sequence[str]) -> list[str]:
    """One line per ``RECORDED`` field and side: how many configurations of both ``a`` and ``b`` (named by
    ``names``) lack the field on that side while the other has it. ``check_same_kernels`` cannot compare those
    runs' paths, and refusing them would refuse every baseline recorded before the field was (none of the committed
    ones has ``backend_ran``): said instead, so that a path that changed is not taken for nothing having changed."""
    has = [_recorded(rows) for rows in (a, b)]
    both = has[0].keys() & has[1].keys()
    notes = []
    for field, what in RECORDED.items():
        for i in (0, 1):
            n = sum(field not in has[i][k] and field in has[1 - i][k] for k in both)
            if n:
                notes.append(
                    f"{n} of the {len(both)} configurations both sides ran lack {field} in {names[i]} and have it "
                    f"in {names[1 - i]}: their {what}s are not compared; record {names[i]} again to compare them"
                )
    return notes


def _recorded(rows: list[dict]) -> dict[str, set[str]]:
    """config hash -> the ``RECORDED`` fields any of its measurement rows carries (a status row carries none)."""
    out: dict[str, set[str]] = {}
    for r in rows:
        if r.get("metric") == STATUS_METRIC:
            continue
        fields = out.setdefault(str(r.get("config_hash")), set())
        fields.update(f for f in RECORDED if isinstance(r.get(f), str if f == "backend_ran" else dict))
    return out


def _first_other(seen: dict[str, tuple[str, str]], r: dict, name: str, value: str) -> tuple[str, str] | None:
    """(where, value) first seen for ``r``'s configuration where it differs from ``value``, else None (recording
    ``value`` from ``name`` if it is the first)."""
    first = seen.setdefault(str(r.get("config_hash")), (name, value))
    return first if first[1] != value else None


def check_whole(rows: list[dict], status: dict) -> None:
    """Refuse, in one line, a baseline from a sweep with a configuration none of whose runs completed: it would
    leave that configuration out, and the gate would then never compare it ("not in the baseline")."""
    runs: dict[tuple, list[tuple[str, str]]] = {}
    for r in rows:
        st = status.get(run_key(r), (None, None))[0]
        if st is not None:
            key = (r.get("config_hash"), r.get("instrumented") or "")
            runs.setdefault(key, []).append((r.get("label") or r.get("run_id"), st))
    missing = sorted({f"{ids[0][0]} ({ids[-1][1]})" for ids in runs.values() if all(s != OK for _, s in ids)})
    if missing:
        raise ConfigError(
            f"the candidate has {len(missing)} configuration(s) with no completed run: {', '.join(missing[:4])}"
            f"{' ...' if len(missing) > 4 else ''}; a baseline without them would never gate them: rerun them "
            "(zerobench sweep SUITE --out DIR --resume) and write the baseline again"
        )


def check_planned(path: str | Path, rows: list[dict]) -> None:
    """Refuse, in one line, a baseline from a sweep stopped before some of its runs (``sweep-plan.json`` lists them
    and they left no row): ``_check_whole`` sees only configurations that left rows, so these would be missing from
    the baseline and never gated."""
    from zerobench.results.outdir import unfinished

    sweeps = unfinished(path, rows)
    left = [label for u in sweeps for label in u.labels]
    running = next((u for u in sweeps if u.writer is not None), None)
    if running is not None:
        raise ConfigError(
            f"{path}: {len(left)} of the sweep's planned runs have no row yet, and a writer holds the sweep's lock "
            f"({running.writer}): write the baseline once the sweep has finished"
        )
    if left:
        raise ConfigError(
            f"{path}: the sweep stopped before {len(left)} of its planned runs ({', '.join(left[:4])}"
            f"{' ...' if len(left) > 4 else ''}); a baseline without them would never gate them: finish the sweep "
            "(zerobench sweep SUITE --out DIR --resume) and write the baseline again"
        )
