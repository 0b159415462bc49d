"""What a baseline file is (the rows ``regress --write-baseline`` and a gate's proposal keep), and where one may be
written: never over a file that is not one, never as a ``rows.jsonl`` that readers would take for a run's rows."""

from __future__ import annotations

import json
from pathlib import Path

from zerobench.bench.gate_rules import COUNTS, MODELLED
from zerobench.bench.noise import NOISE_METRIC
from zerobench.config import ConfigError
from zerobench.results.outdir import check_writable_file
from zerobench.results.rows import ROWS_FILE

BASELINE_METRICS = {
    "run_status",
    "loss",
    "step_time_s",
    "model_state_bytes",
    "comm_volume_elements_per_step",
    "peak_memory_bytes",
    *COUNTS,
    *MODELLED,
}
"""The metrics a baseline keeps (``regress.write_baseline``), beside its noise model's rows: those the gate reads."""


def check_baseline_path(path: str | Path, flag: str | None, what: str, fix: str = "choose another path") -> None:
    """Prove a baseline (``--write-baseline``) or a proposed one (``--propose``, by default beside the candidate)
    may be written to the file ``path``, or raise a one-line ConfigError naming ``flag`` (None: a default path,
    which ``fix`` then says how to move). Writing replaces the file whole (``write_baseline``), so:

    - an existing file must be one this command wrote (``not_a_baseline``): baselines are re-recorded in place, per
      commit, but anything else there (a run's rows, notes) would be lost without a word;
    - the file is never named ``rows.jsonl``: every reader of a directory takes each ``rows.jsonl`` below it for a
      run's rows (``results.rows.files_below``), so a baseline there (in a run's or a sweep's directory, or in one
      of its own) would be read as a run, or replace one. Under any other name nothing reads it but the gate;
    - the directory can be written (``check_writable_file``: a directory at ``path``, an unwritable place)."""
    path = Path(path)
    where = f"{flag} {path}" if flag else str(path)
    if path.name == ROWS_FILE:
        raise ConfigError(
            f"{where}: a {what} named {ROWS_FILE} would be read as a run's rows by every reader of a directory "
            f"above it (results show, report, the gate): name it otherwise, e.g. baseline.jsonl"
        )
    if path.is_file():
        why = not_a_baseline(path)
        if why is not None:
            raise ConfigError(
                f"{where} already exists and is not a baseline ({why}): writing the {what} would replace it; "
                f"{fix}, or move that file away"
            )
    check_writable_file(path, flag, what, fix)


def not_a_baseline(path: Path) -> str | None:
    """Why the file ``path`` is not one ``write_baseline`` wrote (the first line that says so), or None where every
    row is of the kind it writes: a JSON result row with a config hash, of a metric a baseline keeps
    (``BASELINE_METRICS``) or of its noise model, whose status is ``ok``. An empty file holds nothing to lose. A run's
    rows fail this (a run writes metrics no baseline keeps: its parameter count, its throughput), as do a failed
    run's, a gate's verdicts and any text that is not rows."""
    try:
        text = path.read_text(errors="replace")
    except OSError as e:
        return f"it cannot be read: {e.strerror or e}"
    kinds = BASELINE_METRICS | {NOISE_METRIC}
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except ValueError:
            return f"line {n} is not a JSON row"
        if not isinstance(row, dict) or not isinstance(row.get("metric"), str) or "config_hash" not in row:
            return f"line {n} is not a result row"
        if row["metric"] not in kinds:
            return f"line {n} is a {row['metric'][:40]!r} row, which no baseline holds"
        if row.get("status", "ok") != "ok":
            return f"line {n} is a row of status {str(row['status'])[:40]!r}, which no baseline holds"
    return None
