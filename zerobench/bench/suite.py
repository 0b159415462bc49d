"""Suite files: a base configuration plus axes, expanded into fully resolved runs.

```yaml
name: quick                 # default: the file name
description: what it shows
base: {preset: tiny, steps: 6}          # RunSpec keys shared by every run
axes: {stage: [0, 1, 2, 3], dp: [1, 2]} # cartesian product
zip: {hidden: [64, 128], heads: [4, 8]} # lists of equal length, taken together
runs: [{label: a, stage: 3}, ...]       # explicit runs (each also crossed with axes/zip)
cluster: {hardware: v100-dgx2, gpus_per_node: 16, gpu_mem: 32GB}   # informational
```

Structural problems (bad YAML, duplicate keys, unknown keys, wrong types, zip lists of different lengths,
a name that cannot be a directory, more than ``MAX_RUNS`` runs) fail the load with one line naming the file,
the place and the fix; the runs themselves are generated lazily (``bench/expand.py``). A run whose values cannot be trained (a degree
that does not divide the GPU count, heads not divisible by TP, hidden not divisible by heads) is kept
with its reason: the runner records it as a failed row and goes on; ``zerobench sweep --check`` fails.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

from zerobench.bench.expand import ResolvedRun, SuiteRuns
from zerobench.bench.spec import FIELDS, RENAMED, RunSpec
from zerobench.bench.suite_yaml import load_yaml
from zerobench.config import ConfigError
from zerobench.results.outdir import check_name

SUITES_DIR = Path(__file__).resolve().parents[2] / "suites"
TOP_KEYS = {"name", "description", "source", "base", "axes", "zip", "runs", "cluster"}


@dataclass(frozen=True)
class Suite:
    name: str
    """Checked to be one directory name (``check_name``): a sweep's default results are ``runs/<name>``."""
    path: Path
    description: str
    runs: SuiteRuns | list[ResolvedRun]
    """The runs, generated on each pass (``SuiteRuns``; at most ``MAX_RUNS``), or a chosen list of them."""
    cluster: dict


def find_suite(name: str | Path) -> Path:
    """The suite file ``name`` names: a path, or a name under ``SUITES_DIR``; a directory is refused, with
    the suites in it."""
    p = Path(name)
    cands = (p, SUITES_DIR / name, SUITES_DIR / f"{name}.yaml")
    for cand in cands:
        if cand.exists() and not cand.is_dir():  # a file, or a pipe (``sweep <(generate-suite)``)
            return cand
    folder = next((c for c in cands if c.is_dir()), None)
    if folder is not None:
        inside = ", ".join(str(f) for f in sorted(folder.glob("*.yaml"))[:3]) or "none"
        raise ConfigError(f"suite {str(name)!r} is a directory: give one suite YAML file (in it: {inside})")
    raise ConfigError(f"suite {str(name)!r} not found: give a YAML file or a name under {SUITES_DIR} (e.g. cpu/quick)")


def check_keys(where: str, d: dict, fix_hint: str = "") -> None:
    renamed = sorted(set(d) & set(RENAMED))
    if renamed:
        old = renamed[0]
        raise ConfigError(f"{where}: key {old!r} is now spelled {RENAMED[old]!r}: rename it{fix_hint}")
    unknown = sorted(set(d) - FIELDS)
    if unknown:
        close = [f for f in sorted(FIELDS) if f[:3] == unknown[0][:3]]
        hint = f" (did you mean {close[0]!r}?)" if close else f"; valid keys: {', '.join(sorted(FIELDS))}"
        raise ConfigError(f"{where}: unknown key {unknown[0]!r}{hint}{fix_hint}")


def load(name: str | Path) -> Suite:
    """The suite ``name`` (a file, or a name under ``suites/``), checked whole; its runs are generated lazily."""
    path = find_suite(name)
    data = load_yaml(path)
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a suite is a mapping with 'base' and 'axes' or 'runs'")
    extra = sorted(set(data) - TOP_KEYS)
    if extra:
        raise ConfigError(f"{path}: unknown top-level key {extra[0]!r}; valid: {', '.join(sorted(TOP_KEYS))}")
    suite_name = check_name(
        data.get("name") or path.stem,
        f"{path}: suite name",
        ": set the suite's 'name:' to e.g. my-suite (its default results are runs/<name>)",
    )
    for key, kind, types in (
        ("cluster", "a mapping", dict),
        ("description", "a string", str),
        ("source", "a string", str),
    ):
        if data.get(key) is not None and not isinstance(data[key], types):
            raise ConfigError(f"{path}: '{key}' must be {kind}, got {data[key]!r:.40}")
    base, axes, zipped = (data[k] if data.get(k) is not None else {} for k in ("base", "axes", "zip"))
    runs = data.get("runs") or [{}]
    for where, section in (("base", base), ("axes", axes), ("zip", zipped)):
        if not isinstance(section, dict):
            raise ConfigError(f"{path}: '{where}' must be a mapping of run keys")
        check_keys(f"{path}: {where}", section)
    for k, v in {**axes, **zipped}.items():
        if not isinstance(v, list) or not v:
            raise ConfigError(f"{path}: axis {k!r} must be a non-empty list, got {v!r}")
    lengths = {len(v) for v in zipped.values()}
    if len(lengths) > 1:
        raise ConfigError(f"{path}: zip lists must have equal lengths, got {sorted(lengths)}: pad or split them")
    if not isinstance(runs, list):
        raise ConfigError(f"{path}: 'runs' must be a list of mappings")
    for r_i, run in enumerate(runs):
        if not isinstance(run, dict):
            raise ConfigError(f"{path}: runs[{r_i}] must be a mapping, got {run!r}")
        check_keys(f"{path}: runs[{r_i}]", run)
    expanded = SuiteRuns(path, base, runs, axes, zipped)
    expanded.check()
    return Suite(suite_name, path, data.get("description") or "", expanded, data.get("cluster") or {})


def with_overrides(spec: RunSpec, **kw) -> RunSpec:
    return dataclasses.replace(spec, **kw)
