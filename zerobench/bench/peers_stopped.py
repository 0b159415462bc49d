"""``zerobench peers --summarize DIR``: the table of a comparison that stopped before its summary (a time limit, a
cancel, a machine taken back), made from the runs it finished.

``run_peers`` writes the comparison's settings to ``DIR/comparison.json`` before its first run. This reads them
back and summarises what is there with the same ``summarize``: a candidate with no timed run is "not run", a
missing memory run leaves that candidate's peak memory out, and a missing reference run its loss parity. The
summary names the hardware the runs ran on, wherever it is computed.
"""

from __future__ import annotations

import json
from pathlib import Path

from zerobench.bench.peers import COMPARISON_FILE, PeersConfig, summarize
from zerobench.config import ConfigError
from zerobench.results.rows import ROWS_FILE, read_rows
from zerobench.results.status import status_of

NOT_RUN = "not run: the comparison stopped before any of its timed runs"


def summarize_stopped(out: Path) -> list[dict]:
    """Summarise the comparison under ``out`` from its finished runs; its records, as ``run_peers`` returns them."""
    path = out / COMPARISON_FILE
    if not path.is_file():
        raise ConfigError(
            f"{out} holds no comparison ({COMPARISON_FILE} is missing): give the --out directory of a "
            "zerobench peers run"
        )
    try:
        data = json.loads(path.read_text())
        cands = tuple(data["candidates"])
        absent = {str(c): str(why) for c, why in (data.get("not_run") or {}).items()}  # peers that could not run
        p = PeersConfig(**{**data["peers"], "systems": cands})
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise ConfigError(f"{path} is damaged ({type(e).__name__}: {e}): it is written by zerobench peers") from None
    if (out / "summary").exists():
        raise ConfigError(f"{out} is summarised already ({out / 'summary'}): remove that directory to summarise again")
    failed = {c: NOT_RUN for c in cands if not any((out / f"r{r}-{c}" / ROWS_FILE).is_file() for r in range(p.rounds))}
    for c in cands:  # a run that ended other than ok makes its candidate failed, as run_peers records it
        for run_id in [f"r{r}-{c}" for r in range(p.rounds)] + [f"mem-{c}"]:
            if c not in failed and (out / run_id / ROWS_FILE).is_file():
                status, reason = status_of(read_rows(out / run_id))
                if status not in (None, "ok"):
                    failed[c] = f"{run_id} {status}: {reason}" if reason else f"{run_id} {status}"
    return summarize(p, out, (*cands, *absent), {**failed, **absent})
