"""The report's peers table from rows: comparisons that share a results directory stay apart, and a figure a
comparison's summary holds twice is refused in one line."""

import json
from pathlib import Path

import pandas as pd
import pytest

from zerobench.config import ConfigError
from zerobench.report.peers import peers_table


def row(cand, metric, value, *, dp, layers, when, commit="9b2b8af0"):
    peers = {"preset": "small", "layers": layers, "hidden": None, "seq": 64, "dp": dp}
    return {
        "run_id": "peers-summary",
        "candidate": cand,
        "sharding_stage": 3,
        "metric": metric,
        "value": value,
        "status": "ok",
        "config": {"candidates": [cand, "torch-ddp"], "peers": peers},
        "config_hash": f"h-{dp}-{layers}",
        "provenance": {"commit": commit, "timestamp": when, "hardware": {"device": "cpu-x"}},
    }


def test_two_comparisons_in_one_directory_are_two_rows_each_with_its_own_figures():
    rows = [
        row("zerobench-3", "peer_peak_live_bytes", 913 * 2**20, dp=2, layers=None, when="2026-11-25T14:16:12"),
        row("zerobench-3", "peer_time_vs_torch_ddp", 1.17, dp=2, layers=None, when="2026-11-25T14:16:12"),
        row("zerobench-3", "peer_peak_live_bytes", 553 * 2**20, dp=4, layers=None, when="2026-11-25T14:23:30"),
        row("zerobench-3", "peer_time_vs_torch_ddp", 1.16, dp=4, layers=None, when="2026-11-25T14:23:30"),
        # the same command again later: another comparison, though its config hash is the same
        row("zerobench-3", "peer_peak_live_bytes", 926 * 2**20, dp=2, layers=None, when="2026-11-26T09:00:00"),
    ]
    t = peers_table(pd.json_normalize(rows, sep="."))
    assert len(t) == 3
    assert list(t["peak_live_MiB"]) == [913, 553, 926]
    assert list(t["processes"]) == [2, 4, 2]
    assert t["comparison"].iloc[0] == "small, seq 64, DP 2 @ 9b2b8af 2026-11-25 14:16"
    assert t["comparison"].nunique() == 3
    assert t["time_vs_torch_ddp"].iloc[2] is None or pd.isna(t["time_vs_torch_ddp"].iloc[2])


PEERS = Path(__file__).resolve().parents[2] / "results" / "reference" / "peers-offload-cpu-2core" / "summary"


def test_a_summary_figure_held_twice_is_one_line_not_the_last_one(tmp_path, capsys):
    """A summary row of one comparison and candidate written twice (files concatenated) was read as its last copy,
    the other dropped without a word."""
    from tests.unit.test_bad_inputs import assert_one_line, run
    from zerobench.results import load

    rows = [json.loads(line) for line in (PEERS / "rows.jsonl").read_text().splitlines() if line.strip()]
    first = next(r for r in rows if r["metric"] == "peer_time_vs_torch_ddp")
    (tmp_path / "twice").mkdir()
    twice = tmp_path / "twice" / "rows.jsonl"
    twice.write_text("".join(json.dumps(r) + "\n" for r in [*rows, {**first, "value": 9.0}]))
    with pytest.raises(ConfigError, match=f"holds {first['candidate']}'s peer_time_vs_torch_ddp 2 times") as e:
        peers_table(load(twice))
    assert str(twice.resolve()) in str(e.value) and "\n" not in str(e.value)
    code, err = run(["report", str(twice), "--out", str(tmp_path / "r")], capsys)
    assert_one_line(code, err, "its summary written twice")
    assert len(peers_table(load(PEERS))) == len({r["candidate"] for r in rows})  # each once: read as before


def test_the_speed_verdict_says_when_one_round_cannot_place_it():
    from zerobench.cli.bench import _speed_verdict

    assert (
        _speed_verdict({"speed_ok": True, "speed_decided": False, "time_noise": float("inf")})
        == "yes, one round: spread unknown"
    )  # was "yes, within noise (±inf)" at 0.62 of the peer's time
    assert (
        _speed_verdict({"speed_ok": False, "speed_decided": False, "time_noise": 0.058}) == "NO, within noise (±0.058)"
    )
    assert _speed_verdict({"speed_ok": True, "speed_decided": True, "time_noise": 0.01}) == "yes"
