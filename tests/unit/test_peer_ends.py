"""The per-rank end reports of runs under torchrun or srun (``launch/peer_ends.py``), without processes: a rank's
report starts afresh with each run, and an earlier run's claim on the recording is cleared by rank 0."""

from __future__ import annotations

import os

import pytest

from zerobench.config import ConfigError
from zerobench.distributed.env import deepspeed_timeout_s
from zerobench.launch.channel import read_rank_files
from zerobench.launch.peer_ends import RECORDER, PeerEnds


def test_an_earlier_runs_reports_are_not_read_as_this_ones(tmp_path):
    """An earlier run's ``error`` and ``exit`` lines in rank 1's file were read as this run's: the recorder blamed rank
    1 for a failure it never had, and a leftover claim file stopped every survivor from recording."""
    ranks = tmp_path / "ranks"
    ranks.mkdir()
    (ranks / "rank1").write_text("1.0 start vm 1\n2.0 error RuntimeError: an earlier run's\n3.0 exit 1\n")
    (ranks / RECORDER).write_text("")
    PeerEnds.for_run(0, 2, tmp_path)
    ends = PeerEnds.for_run(1, 2, tmp_path)
    (end,) = [e for e in read_rank_files(ranks) if e.rank == 1]
    assert end.failed_at is None and end.code is None and end.pid == os.getpid(), end
    assert not (ranks / RECORDER).exists() and ends.claim()


def test_one_rank_alone_writes_no_report(tmp_path):
    assert PeerEnds.for_run(0, 1, tmp_path) is None and not (tmp_path / "ranks").exists()


@pytest.mark.parametrize("raw", ["inf", "nan", "0", "-1", "soon"])
def test_a_deepspeed_timeout_that_is_no_duration_is_one_line(raw):
    with pytest.raises(ConfigError, match="give the collective timeout in minutes, a finite number above 0"):
        deepspeed_timeout_s({"DEEPSPEED_TIMEOUT": raw})
    assert deepspeed_timeout_s({}) == 1800 and deepspeed_timeout_s({"DEEPSPEED_TIMEOUT": "2"}) == 120
