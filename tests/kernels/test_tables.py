"""The kernels' work tables are pure data: checked against a per-element oracle, without kernels."""

import itertools
import random

import pytest
import torch

from kernels import tables


def _oracle(numel, ranges):
    mask = [0] * numel
    for lo, hi in ranges:
        for i in range(lo, hi):
            mask[i] = 1
    return mask


@pytest.mark.parametrize("seed", range(40))
def test_adamw_blocks_cover_partition_with_exact_decay_flags(seed):
    rnd = random.Random(seed)
    numel = rnd.randint(1, 3000)
    cuts = sorted(rnd.sample(range(numel + 1), k=min(numel + 1, 2 * rnd.randint(0, 6))))
    ranges = [(cuts[i], cuts[i + 1]) for i in range(0, len(cuts) - 1, 2)]
    rnd.shuffle(ranges)
    block = rnd.choice([1, 7, 64, 1024])
    t = tables.adamw_blocks(numel, ranges, block)
    assert t.dtype == torch.int64 and t.shape[1] == 3
    pos = 0
    flags = []
    for s, e, d in t.tolist():
        assert s == pos and 0 < e - s <= block
        flags += [d] * (e - s)
        pos = e
    assert pos == numel and flags == _oracle(numel, ranges)


@pytest.mark.parametrize("seed", range(20))
def test_adamw_blocks_over_spans_cover_exactly_the_spans(seed):
    """One param group's table: rows over its spans only, in order, with the decay flags of the full table."""
    rnd = random.Random(seed)
    numel = rnd.randint(1, 2000)
    cuts = sorted(rnd.sample(range(numel + 1), k=min(numel + 1, 2 * rnd.randint(1, 8))))
    pieces = [(cuts[i], cuts[i + 1]) for i in range(len(cuts) - 1)]
    spans = [r for r in pieces if rnd.random() < 0.5]
    ranges = [r for r in pieces if rnd.random() < 0.5]
    block = rnd.choice([1, 5, 64])
    t = tables.adamw_blocks(numel, ranges, block, spans=list(reversed(spans)))
    covered = [i for lo, hi in spans for i in range(lo, hi)]
    got, flags = [], []
    for s, e, d in t.tolist():
        assert 0 < e - s <= block
        got += list(range(s, e))
        flags += [d] * (e - s)
    oracle = _oracle(numel, ranges)
    assert got == covered and flags == [oracle[i] for i in covered]


def test_adamw_blocks_reject_overlap_and_outside():
    with pytest.raises(ValueError, match="span range"):
        tables.adamw_blocks(10, [], 4, spans=[(0, 5), (3, 6)])
    with pytest.raises(ValueError, match="overlaps"):
        tables.adamw_blocks(10, [(0, 5), (4, 8)], 4)
    with pytest.raises(ValueError, match="outside"):
        tables.adamw_blocks(10, [(5, 11)], 4)
    with pytest.raises(ValueError, match="block"):
        tables.adamw_blocks(10, [], 0)


def test_copy_pieces_split_every_tensor_in_bounded_pieces():
    sizes, offs = [10, 0, 33, 7], [0, 16, 16, 64]
    t = tables.copy_pieces(sizes, offs, 8).tolist()
    per = {}
    for ti, toff, foff, n in t:
        assert 0 < n <= 8 and foff == offs[ti] + toff
        per.setdefault(ti, []).append((toff, n))
    for ti, size in enumerate(sizes):
        got = sorted(per.get(ti, []))
        assert sum(n for _, n in got) == size
        assert all(a + n == b for (a, n), (b, _) in itertools.pairwise(got))
