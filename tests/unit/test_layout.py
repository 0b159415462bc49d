"""The partition layout against an independent element-by-element oracle (no processes)."""

from __future__ import annotations

import random

import pytest

from zerobench.zero.layout import RUNT, ParamSpec, build_layout


def random_specs(rng: random.Random, n: int, units: bool) -> list[ParamSpec]:
    specs = []
    unit = 0
    for i in range(n):
        if units and rng.random() < 0.25:
            unit += 1
        shape = tuple(rng.randint(1, 40) for _ in range(rng.randint(1, 2)))
        specs.append(ParamSpec(f"p{i}", shape, unit))
    return specs


CASES = [
    (seed, shards, bucket, align, units)
    for seed in range(6)
    for shards in (1, 2, 3, 4, 8)
    for bucket in (1, 50, 700, 10**9)
    for align in (1, 16)
    for units in (False, True)
]


@pytest.mark.parametrize("seed,shards,bucket,align,units", CASES)
def test_layout_oracle(seed, shards, bucket, align, units):
    rng = random.Random(seed)
    specs = random_specs(rng, rng.randint(1, 30), units)
    lay = build_layout(specs, shards, bucket, align)

    # Oracle 1: every element of every parameter has exactly one home; padding belongs to nobody.
    owner = [None] * lay.numel
    for spec, slot in zip(specs, lay.params):
        assert slot.end - slot.start == spec.numel and slot.start % align == 0
        for e in range(slot.start, slot.end):
            assert owner[e] is None
            owner[e] = (slot.index, e - slot.start)
    assert sum(o is not None for o in owner) == sum(s.numel for s in specs) == lay.unpadded_numel

    # Oracle 2: buckets tile the buffer, hold whole parameters, split evenly, never mix units.
    pos = 0
    for b in lay.buckets:
        assert b.start == pos and b.numel % (shards * align) == 0 and b.numel > 0
        pos = b.end
        for i in b.params:
            assert b.start <= lay.params[i].start and lay.params[i].end <= b.end
            assert specs[i].unit == b.unit
    assert pos == lay.numel
    # a bucket closes only once it is big enough (or at a unit change, before a bucket-sized parameter,
    # at the end); a parameter of a bucket's size or more is alone in its bucket
    for b, nxt in zip(lay.buckets, lay.buckets[1:]):
        last, first = lay.params[b.params[-1]], specs[nxt.params[0]]
        assert last.end - b.start >= bucket or first.unit != b.unit or first.numel >= bucket
        # ... and not before a runt: what is left of the unit, with no bucket-sized parameter in it
        tail = [j for j in range(b.params[-1] + 1, len(specs)) if specs[j].unit == b.unit]
        small = all(specs[j].numel < bucket for j in tail) and specs[b.params[-1]].numel < bucket
        assert not (tail and small and sum(specs[j].numel for j in tail) * RUNT < bucket)
    for b in lay.buckets:
        assert all(specs[i].numel < bucket for i in b.params) or len(b.params) == 1
        sole = lay.sole_param(b.index)
        assert (sole is not None) == (len(b.params) == 1 and not lay.padding(b.index))

    # Oracle 3: concatenating every rank's segments, by local offset, covers each element exactly once.
    seen = {}
    for rank in range(shards):
        local = [None] * lay.shard_numel
        for seg in lay.segments(rank):
            b = lay.buckets[seg.bucket]
            lo, hi = b.shard(rank)
            assert lo <= seg.flat_start and seg.flat_start + seg.numel <= hi
            for k in range(seg.numel):
                flat = seg.flat_start + k
                assert owner[flat] == (seg.param, seg.param_start + k)
                assert local[seg.local_start + k] is None
                local[seg.local_start + k] = flat
                assert flat not in seen
                seen[flat] = rank
            # local position = bucket's local offset + offset inside the rank's shard
            assert seg.local_start == lay.local_offset(seg.bucket) + seg.flat_start - lo
    assert set(seen) == {e for e, o in enumerate(owner) if o is not None}

    # Oracle 4: each bucket's padding ranges are exactly its elements that belong to no parameter.
    for b in lay.buckets:
        pad = {b.start + e for lo, hi in lay.padding(b.index) for e in range(lo, hi)}
        assert pad == {e for e in range(b.start, b.end) if owner[e] is None}


def test_padding_is_small_for_large_models():
    specs = [ParamSpec(f"w{i}", (1024, 1024)) for i in range(8)] + [ParamSpec(f"b{i}", (1024,)) for i in range(8)]
    lay = build_layout(specs, 64, 2_000_000, 16)
    assert (lay.numel - lay.unpadded_numel) / lay.unpadded_numel < 0.001


def test_an_embedding_gets_its_own_bucket():
    """GPT's tail in backward order: the first block's LayerNorm, the position and token embeddings. The
    token embedding (tied to the head: its gradient is complete only at the very end) is its own bucket,
    unpadded, so it is reduced from its gradient; the small ones before it close their own bucket."""
    specs = [
        ParamSpec("blocks.0.ln_1.weight", (768,)),
        ParamSpec("wpe.weight", (64, 768)),
        ParamSpec("wte.weight", (16384, 768)),
    ]
    lay = build_layout(specs, 2, 6_250_000, 16)
    assert [b.params for b in lay.buckets] == [(0, 1), (2,)]
    assert lay.sole_param(1) == lay.params[2] and lay.sole_param(0) is None
    odd = build_layout([ParamSpec("wte", (16383, 767))], 2, 6_250_000, 16)  # padded: copied, not reduced as is
    assert odd.sole_param(0) is None


def test_a_blocks_first_layernorm_is_not_a_bucket_of_its_own():
    """A GPT-2 small block in backward order (7.09M elements) over a 6.25M-element bucket: the first
    LayerNorm, last in backward, stays in the block's bucket, so the bucket is ready when the block's backward
    ends and a stage 3 unit is one bucket. A remainder of an eighth of a bucket or more is still cut off."""
    block = [
        ("mlp.fc2.bias", (768,)),
        ("mlp.fc2.weight", (768, 3072)),
        ("mlp.fc1.bias", (3072,)),
        ("mlp.fc1.weight", (3072, 768)),
        ("ln_2.bias", (768,)),
        ("ln_2.weight", (768,)),
        ("attn.proj.bias", (768,)),
        ("attn.proj.weight", (768, 768)),
        ("attn.qkv.bias", (2304,)),
        ("attn.qkv.weight", (2304, 768)),
        ("ln_1.bias", (768,)),
        ("ln_1.weight", (768,)),
    ]
    for units in (False, True):
        specs = [ParamSpec(f"blocks.{k}.{n}", s, k if units else 0) for k in (1, 0) for n, s in block]
        lay = build_layout(specs, 2, 6_250_000, 16)
        cut = [b.params[-1] for b in lay.buckets]
        assert cut == ([11, 23] if units else [9, 23])  # without units a LayerNorm opens the next bucket
    full = [ParamSpec("a", (600,)), ParamSpec("b", (400,))]
    assert [b.params for b in build_layout([*full, ParamSpec("rest", (125,))], 1, 1000).buckets] == [(0, 1), (2,)]
    assert [b.params for b in build_layout([*full, ParamSpec("rest", (124,))], 1, 1000).buckets] == [(0, 1, 2)]
    sole = [ParamSpec("w", (1000,)), ParamSpec("rest", (1,))]  # a bucket-sized parameter stays alone
    assert [b.params for b in build_layout(sole, 1, 1000).buckets] == [(0,), (1,)]


def test_invalid_arguments():
    with pytest.raises(ValueError):
        build_layout([ParamSpec("a", (3,))], 0, 10)
