"""A run's status as every reader of rows tells it (``results show``, the report, the regression gate).

Whoever launches a training run writes its one ``run_status`` row once the ranks have ended: ``ok``, or
``failed`` / ``oom`` / ``invalid`` / ``timeout`` / ``cancelled`` with the reason. A training run (rows of a
``TrainConfig``) without that row is never ``ok``:

- ``incomplete``: its launcher stopped before recording how the run ended (killed; the disk filled), so
  nothing says it ran to the end or that its figures are whole. This is every sweep's run (sweeps have always
  written the row) and every run whose rows are of ``SCHEMA`` 2 or later (every launcher writes it).
- ``unrecorded``: rows written before ``zerobench train``, ``peers`` and ``maxsize`` probes recorded a status
  (no ``schema`` field, no suite). Those writers wrote rows only after the last step, so the rows are counted as
  they always were, under their own name.

Rows of other kinds (a maxsize search's answer, a peers summary, a simulator validation) are analyses, not runs:
no status applies to them (None). Runs are keyed by (run id, config hash), and in a loaded frame by the file
their rows came from too (``RUN_KEY``): two sweeps of one suite in two directories give their runs the same ids and
hashes, and each is a run of its own (a repeat, with its own status).
"""

from __future__ import annotations

STATUS_METRIC = "run_status"
OK, INCOMPLETE, UNRECORDED = "ok", "incomplete", "unrecorded"
COUNTED = (OK, UNRECORDED)
"""Statuses whose figures are data points (the report's tables, the gate's comparisons where it accepts them)."""
SCHEMA = 2
"""The rows format ``RowWriter`` stamps on every row (``schema``): 2 = every launcher records a status row."""

INCOMPLETE_REASON = (
    "no run_status row: its launcher stopped before recording how the run ended (killed, or the disk filled)"
)
UNRECORDED_REASON = "no run_status row: written before every launcher recorded one"


def is_training(config) -> bool:
    """Whether a row's ``config`` is a training run's (a resolved ``TrainConfig``)."""
    return isinstance(config, dict) and "zero" in config


def status_of(rows) -> tuple[str | None, str | None]:
    """(status, reason) of one run from its rows (dicts, in the order written): its last ``run_status`` row's,
    else ``incomplete`` / ``unrecorded`` for a training run, else (None, None)."""
    status, reason, training, marked = None, None, False, False
    for r in rows:
        if r.get("metric") == STATUS_METRIC:
            status, reason = r.get("status"), r.get("reason")
        training = training or is_training(r.get("config"))
        marked = marked or bool(r.get("suite")) or (r.get("schema") or 1) >= SCHEMA
    if status is not None:
        return status, reason if isinstance(reason, str) and reason else None
    if not training:
        return None, None
    return (INCOMPLETE, INCOMPLETE_REASON) if marked else (UNRECORDED, UNRECORDED_REASON)


def statuses(rows) -> dict[tuple[str, str], tuple[str | None, str | None]]:
    """(run id, config hash) -> (status, reason) for every run in ``rows`` (dicts)."""
    runs: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        runs.setdefault((r.get("run_id"), r.get("config_hash")), []).append(r)
    return {k: status_of(rs) for k, rs in runs.items()}


RUN_KEY = ["rows_file", "run_id", "config_hash"]
"""What keys one run in a ``results.load`` frame (passed through ``with_run_key``)."""

VERDICT_METRICS = ("gate_comparison", "gate_result")
"""The regression gate's verdict rows (``regress --out``): a record of a comparison, not a run."""


def without_verdicts(df):
    """``df`` (a ``results.load`` DataFrame) without the regression gate's verdict rows, and how many verdict sets
    (``(rows_file, run_id)``) it held: readers that count and list runs leave them out, and say so."""
    if "metric" not in df:
        return df, 0
    verdict = df["metric"].isin(VERDICT_METRICS)
    sets = (
        len(df[verdict].groupby(["rows_file", "run_id"])) if "rows_file" in df and verdict.any() else int(verdict.any())
    )
    return df[~verdict], sets


def row_keys(df) -> list[dict]:
    """The fields of a ``results.load`` frame's rows that tell which planned runs left rows (``metric``, ``label``,
    ``config_hash``), as dicts: ``results/outdir.unfinished`` takes them in place of reading the rows again."""
    cols = [c for c in ("metric", "label", "config_hash") if c in df]
    return df[cols].to_dict("records")


def with_run_key(df):
    """``df`` with ``config_hash`` and ``rows_file`` columns (empty where rows lack them) so that ``RUN_KEY`` keys a
    run."""
    return df.assign(
        config_hash=df["config_hash"].fillna("") if "config_hash" in df else "",
        rows_file=df["rows_file"].fillna("") if "rows_file" in df else "",
    )


def frame_statuses(df):
    """The same for a ``results.load`` DataFrame (passed through ``with_run_key``): one row per run (``RUN_KEY``)
    with ``status`` and ``reason`` (None where no status applies), in linear time."""
    import pandas as pd

    key = RUN_KEY
    flags = pd.DataFrame(
        {
            "training": df["config.zero.stage"].notna() if "config.zero.stage" in df else False,
            "marked": (df["suite"].notna() & (df["suite"] != "")) if "suite" in df else False,
        },
        index=df.index,
    )
    if "schema" in df:
        flags["marked"] |= df["schema"].fillna(1) >= SCHEMA
    flags[key] = df[key]
    out = flags.groupby(key, sort=False)[["training", "marked"]].max()
    rec = df[df["metric"] == STATUS_METRIC]
    cols = [c for c in ("status", "reason") if c in rec]
    if len(rec):
        # the last status row's fields as written (groupby's last() would take an earlier row's reason past a null)
        out = out.join(rec.drop_duplicates(subset=key, keep="last").set_index(key)[cols], how="left")
    for c in ("status", "reason"):
        if c not in out:
            out[c] = None
    out = out.astype({"status": object, "reason": object})
    out["reason"] = out["reason"].where(out["reason"].map(lambda v: isinstance(v, str) and bool(v)), None)
    has = out["status"].notna()
    for flag, status, reason in ((True, INCOMPLETE, INCOMPLETE_REASON), (False, UNRECORDED, UNRECORDED_REASON)):
        sel = ~has & out["training"] & (out["marked"] == flag)
        out.loc[sel, "status"], out.loc[sel, "reason"] = status, reason
    out["status"] = out["status"].where(out["status"].notna(), None)
    return out[["status", "reason"]]


def counted_rows(df):
    """The rows of ``df`` (passed through ``with_run_key``) whose run's figures count as data (status ``ok`` or
    ``unrecorded``), with the rows of analyses no status applies to."""
    st = frame_statuses(df)
    keep = st.index[st["status"].isna() | st["status"].isin(COUNTED)]
    return df[df.set_index(RUN_KEY).index.isin(keep)]


ONCE_KEY = ("metric", "rank", "phase", "step", "of", "instrumented")
"""What a training run measures once (with ``RUN_KEY``): a metric per rank, phase and step (a loss per step, a
step time per rank), apart for a run also counted under a measuring tool (``instrumented``)."""


def measured_twice(df) -> str | None:
    """One line naming the first figure of a training run that a ``results.load`` frame holds twice, or None.

    Two rows of one run's figure are the rows of two runs under one id in one file (files concatenated, two writers
    into one directory): every reader keeps one row per figure, so one of the two measurements would be dropped
    without a word and the other presented as the run's. The regression gate refuses them too."""
    if df.empty or "config.zero.stage" not in df:
        return None
    d = with_run_key(df[df["config.zero.stage"].notna()])
    keys = [*RUN_KEY, *(c for c in ONCE_KEY if c in d)]
    dup = d[d.duplicated(keys, keep="first")]
    if dup.empty:
        return None
    r = dup.iloc[0]
    at = ", ".join(
        f"{k} {int(r[k]) if isinstance(r[k], float) and r[k].is_integer() else r[k]}"
        for k in ("rank", "phase", "step", "of", "instrumented")
        if k in r and r[k] == r[k] and r[k] is not None
    )
    more = f" ({len(dup) - 1} more figure(s) too)" if len(dup) > 1 else ""
    return (
        f"{r['rows_file']}: run {r['run_id']} holds {r['metric']}{f' ({at})' if at else ''} twice{more}: the rows "
        "of two runs under one id (files concatenated, or two writers into one directory); give each run its own "
        "directory, or remove the copy"
    )
