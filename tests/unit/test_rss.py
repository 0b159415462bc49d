"""RSS by category (``zerobench/metrics/rss.py``): smaps parsing and the breakdown on synthetic mappings,
then a live process: a tensor the tracker follows shows up as resident tensor bytes."""

from __future__ import annotations

import sys

import pytest
import torch

from zerobench.metrics.memory import LiveTensorTracker
from zerobench.metrics.rss import CATEGORIES, Mapping, current_rss, parse_smaps, rss_breakdown

SMAPS = """\
55d0c0000000-55d0c0400000 rw-p 00000000 00:00 0                          [heap]
Size:               4096 kB
Rss:                3072 kB
Pss:                3072 kB
7f0000000000-7f0000a00000 rw-p 00000000 00:00 0
Size:              10240 kB
Rss:               10240 kB
7f0000a00000-7f0000b00000 r-xp 00000000 08:01 1234                       /usr/lib/libtorch_cpu.so
Size:               1024 kB
Rss:                 512 kB
VmFlags: rd ex mr mw me sd
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]
Size:                132 kB
Rss:                  16 kB
"""


def test_smaps_is_parsed_with_names_and_resident_bytes():
    maps = parse_smaps(SMAPS)
    assert [m.name for m in maps] == ["[heap]", "", "/usr/lib/libtorch_cpu.so", "[stack]"]
    assert [m.rss for m in maps] == [3072 << 10, 10240 << 10, 512 << 10, 16 << 10]
    assert maps[1].start == 0x7F0000000000 and maps[1].end == 0x7F0000A00000


def test_breakdown_splits_by_what_holds_the_pages():
    maps = parse_smaps(SMAPS)
    mib = 1 << 20
    live = [
        (0x7F0000000000 + mib, 4 * mib),  # a 4 MiB tensor in the anonymous mapping
        (0x55D0C0000000, 8 * mib),
    ]  # claims more than the heap has resident: capped at its RSS
    out = rss_breakdown(maps, live)
    assert set(out) == set(CATEGORIES)
    assert out["tensors"] == 4 * mib + 3 * mib
    assert out["native"] == 6 * mib and out["heap"] == 0
    assert out["libraries"] == 512 << 10 and out["other"] == 16 << 10
    assert sum(out.values()) == sum(m.rss for m in maps)


def test_a_storage_spanning_two_mappings_counts_in_both():
    maps = [Mapping(0, 100, "", 100), Mapping(100, 200, "", 100)]
    assert rss_breakdown(maps, [(50, 100)]) == {"tensors": 100, "libraries": 0, "heap": 0, "native": 100, "other": 0}


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/smaps")
def test_the_tracker_breaks_its_highest_rss_down():
    before = current_rss()
    tracker = LiveTensorTracker(rss=True)
    with tracker:
        t = torch.ones(64 << 18)  # 64 MiB, written: resident
        t.add_(1)
    b = tracker.rss.breakdown
    assert b is not None and b["tensors"] >= t.nbytes
    assert sum(b.values()) == tracker.rss.peak >= before + t.nbytes * 0.9
    assert b["libraries"] > 0 and b["heap"] > 0
    tracker.reset_peak()
    assert tracker.rss.breakdown is None
