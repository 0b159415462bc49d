"""``zerobench results show``: one readable line per run, built from rows (never from logs).

A run's status is its ``run_status`` row's; a training run without one is ``incomplete`` (or ``unrecorded``,
for rows from before every launcher wrote one: ``results/status.py``), never ``ok``. ``skipped`` counts the
optimizer steps skipped on fp16 overflow (left out of ``step_ms``). The runs a stopped sweep planned but never
started left no row: a last line names them (``results/outdir.unfinished``)."""

from __future__ import annotations

import math
from pathlib import Path


def _text(v) -> str | None:
    return v if isinstance(v, str) else None  # a column other runs' rows have: NaN on this one's


def _scaled(v, k: float) -> float | None:
    return None if v is None else float(v) * k


def _count(v) -> int | None:
    return None if v is None or (isinstance(v, float) and not math.isfinite(v)) else int(v)


def summarize(path: str | Path):
    """A per-run summary DataFrame: status, configuration and the headline metrics (rank 0)."""
    import pandas as pd

    return pd.DataFrame(_runs(path))


def _frame(path: str | Path):
    """The rows under ``path`` with their run keys, less the regression gate's verdicts (not a run), and how many
    verdict sets there were."""
    from zerobench.results import load
    from zerobench.results.status import with_run_key, without_verdicts

    return without_verdicts(with_run_key(load(path)))


def _runs(path: str | Path, df=None) -> list[dict]:
    from zerobench.results.status import RUN_KEY, frame_statuses

    df = _frame(path)[0] if df is None else df
    st = frame_statuses(df)
    runs = []
    for (rows_file, run_id, key), g in df.groupby(RUN_KEY, sort=True):

        def metric(name, rank0=True, g=g):
            m = g[g["metric"] == name]
            if rank0 and "rank" in m:
                m = m[(m["rank"].isna()) | (m["rank"] == 0)]
            return m["value"].iloc[-1] if len(m) else None

        status, reason = st.loc[(rows_file, run_id, key)]
        loss = g[g["metric"] == "loss"].sort_values("step") if "step" in g else g.iloc[0:0]
        first = g.iloc[0]
        runs.append(
            {
                "run": run_id,
                "status": status,
                "system": first.get("config.system"),
                "stage": first.get("config.zero.stage"),
                "dp": first.get("config.dp"),
                "tp": first.get("config.tp"),
                "precision": first.get("config.zero.precision"),
                "step_ms": _scaled(metric("step_time_s"), 1e3),
                "tflops_gpu": metric("tflops_per_gpu"),
                "model_state_MiB": _scaled(metric("model_state_bytes"), 2**-20),
                "peak_MiB": _scaled(metric("peak_memory_bytes"), 2**-20),
                "skipped": _count(metric("skipped_steps")),
                "final_loss": loss["value"].iloc[-1] if len(loss) else None,
                "reason": _text(reason) or _instrumented(g),
            }
        )
    return runs


def _instrumented(g) -> str | None:
    """What a run under a measuring tool is (its rows are tagged ``instrumented``): its figures are counts, its
    losses stop at the counted step (``zerobench sweep --instructions``)."""
    if "instrumented" not in g:
        return None
    tools = sorted({str(t) for t in g["instrumented"].dropna()})
    return f"instrumented ({', '.join(tools)}): counts only, trained to its counted step" if tools else None


def _cell(v):
    """What a run's line shows: ``-`` where a run has no such row (a failed run's step time, a completed run's
    reason), a number to 4 significant figures, ``nan`` only where a row holds NaN (a diverged loss)."""
    if v is None or (isinstance(v, str) and not v):
        return "-"
    if isinstance(v, float):
        return f"{v:.4g}"
    return v


def show(path: str | Path) -> str:
    import pandas as pd

    from zerobench.results.outdir import unfinished
    from zerobench.results.status import row_keys

    runs, verdicts = _frame(path)
    df = pd.DataFrame([{k: _cell(v) for k, v in r.items()} for r in _runs(path, runs)], dtype=object)
    table = df.to_string(index=False, max_cols=None, max_colwidth=70)
    for u in unfinished(path, row_keys(runs)):  # the rows read above, not read again
        table += f"\nnot run: {u.describe()}"
    if verdicts:
        table += (
            f"\nnot a run: {verdicts} set{'s' if verdicts != 1 else ''} of regression-gate verdicts (regress --out)"
        )
    return table
