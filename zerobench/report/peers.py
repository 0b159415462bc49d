"""The report's peers table: ``zerobench peers`` summary rows, one row per (comparison, candidate)."""

from __future__ import annotations

import pandas as pd

from zerobench.config import ConfigError
from zerobench.report.aggregate import missing

PEER_METRICS = {
    "peer_time_vs_torch_ddp": "time_vs_torch_ddp",
    "peer_step_time_s": "step_time_s",
    "peer_peak_live_bytes": "peak_live_bytes",
    "peer_peak_rss_bytes": "peak_rss_bytes",
    "peer_loss_max_abs_diff": "loss_max_abs_diff",
}


def _comparison(row: pd.Series) -> str:
    """A comparison's model and world, from its summary rows' ``config.peers``: ``small, 4 layers, seq 64, DP 2``."""

    def get(key):
        v = row.get(f"config.peers.{key}")
        return None if missing(v) else v

    parts = [str(get("preset") or "?")]
    parts += [f"{int(get(k))} {name}" for k, name in (("layers", "layers"), ("hidden", "hidden")) if get(k)]
    parts += [f"seq {int(get('seq'))}"] if get("seq") else []
    parts += [f"DP {int(get('dp'))}"] if get("dp") else []
    commit, when = row.get("provenance.commit"), row.get("provenance.timestamp")
    tail = " ".join(
        str(x)
        for x in (
            None if missing(commit) else str(commit)[:7],
            None if missing(when) else str(when)[:16].replace("T", " "),
        )
        if x
    )
    return ", ".join(parts) + (f" @ {tail}" if tail else "")


def peers_table(df: pd.DataFrame) -> pd.DataFrame:
    """``zerobench peers`` summary rows: one row per (comparison, candidate), failed candidates kept. Several
    comparisons in one results directory (their summaries share a run id) stay apart by config hash and by
    the time their summary was written. A comparison's candidate holding a figure twice is refused in one line
    (``_twice``): keeping one of the two would drop the other without a word."""
    d = df[df["metric"].isin(list(PEER_METRICS))]
    if d.empty:
        return pd.DataFrame()
    keys = [k for k in ("run_id", "config_hash", "provenance.timestamp") if k in d] + ["candidate"]
    out = []
    # dropna=False: a row lacking a key's field (a summary written without a timestamp) stays in the table, as a
    # comparison of its own, instead of being dropped from it without a word
    for key, g in d.groupby(keys, sort=False, dropna=False):
        cand = key[-1]
        first = g.iloc[0]
        rec = {
            "comparison": _comparison(first),
            "candidate": cand,
            "shards_like_stage": None if missing(first.get("sharding_stage")) else int(first["sharding_stage"]),
            "processes": first.get("config.peers.dp"),
            "params_M": None,
            "device": first.get("provenance.hardware.device"),
            "status": first.get("status") or "ok",
        }
        for metric, col in PEER_METRICS.items():
            rows = g[g["metric"] == metric]
            if len(rows) > 1:
                raise ConfigError(_twice(rows, rec["comparison"], cand, metric))
            v = rows["value"].dropna()
            rec[col] = float(v.iloc[0]) if len(v) else None
        out.append(rec)
    t = pd.DataFrame(out).drop(columns=["params_M"])
    for col in ("peak_live_bytes", "peak_rss_bytes"):
        t[col.replace("_bytes", "_MiB")] = t.pop(col) / 2**20
    return t


def _twice(rows: pd.DataFrame, comparison: str, candidate: str, metric: str) -> str:
    """One line naming a summary figure that ``rows`` (one comparison's, one candidate's) hold more than once."""
    files = sorted({str(f) for f in rows["rows_file"].dropna()}) if "rows_file" in rows else []
    return (
        f"{', '.join(files) or 'the rows'}: the peers comparison {comparison} holds {candidate}'s {metric} "
        f"{len(rows)} times: its summary written twice (files concatenated, or one summary in two of the report's "
        "inputs); give each comparison's summary once"
    )
