"""``BucketShards`` (the stage 2-3 gradient partition): each bucket's shard is allocated when taken, all
are released together, and what the partition takes while held is known without holding it. And
``FullBuffer``'s tail, where stage 0's unused-parameter flags ride after the last bucket."""

from __future__ import annotations

import pytest
import torch

from zerobench.zero.layout import ParamSpec, build_layout
from zerobench.zero.storage.buffer import BucketShards, LocalBuffer


@pytest.fixture
def layout():
    specs = [ParamSpec(f"p{i}", (n,), 0) for i, n in enumerate([700, 30, 1200, 5])]
    return build_layout(specs, 4, 1000, 8)


def test_shards_are_allocated_when_taken_and_released_together(layout):
    shards = BucketShards(layout, torch.bfloat16, torch.device("cpu"))
    assert shards.held() == []
    first = shards.take(1)
    assert first.numel() == layout.buckets[1].shard_numel and first.dtype == torch.bfloat16
    assert shards.take(1) is first and shards.get(1) is first, "taking a held shard returns it"
    assert len(shards.held()) == 1
    with pytest.raises(RuntimeError, match="not held"):
        shards.get(0)
    shards.release()
    assert shards.held() == []


def test_views_are_zeros_where_nothing_was_reduced(layout):
    shards = BucketShards(layout, torch.float32, torch.device("cpu"))
    shards.take(0).fill_(3.0)
    views = shards.views()
    assert [v.numel() for v in views] == [b.shard_numel for b in layout.buckets]
    assert views[0].eq(3.0).all() and all(v.eq(0).all() for v in views[1:])


def test_nbytes_is_the_whole_partition_held_or_not(layout):
    shards = BucketShards(layout, torch.bfloat16, torch.device("cpu"))
    flat = LocalBuffer(layout, torch.bfloat16, torch.device("cpu"))
    assert shards.nbytes() == flat.data.untyped_storage().nbytes() == 2 * layout.shard_numel
    shards.views()
    assert sum(t.untyped_storage().nbytes() for t in shards.held()) == shards.nbytes()


def test_stage0_flags_ride_after_the_last_bucket(layout):
    """``FullBuffer``'s tail (stage 0's unused-parameter flags) lies right after the last bucket, outside every
    bucket and parameter view; ``with_flag`` is one contiguous tensor for the last bucket's all-reduce, the tail
    zero but this rank's flag (so summing the ranks' gives every rank's)."""
    from zerobench.zero.storage.buffer import FullBuffer

    full = FullBuffer(layout, torch.bfloat16, torch.device("cpu"), tail=4)
    assert full.data.numel() == layout.numel and full.tail.numel() == 4
    full.data.fill_(2.0)
    full.tail.fill_(7.0)  # stale flags of an earlier window
    last = layout.buckets[-1]
    carried = full.with_flag(2, True)
    assert carried.numel() == last.numel + 4 and carried.data_ptr() == full.bucket_view(last.index).data_ptr()
    assert full.tail.tolist() == [0, 0, 1, 0] and carried[-4:].tolist() == [0, 0, 1, 0]
    assert full.data.eq(2.0).all(), "the flags touch no gradient"
    full.with_flag(1, False)
    assert full.tail.tolist() == [0, 0, 0, 0]
    assert FullBuffer(layout, torch.float32, torch.device("cpu")).tail.numel() == 0, "no tail unless asked"
