"""The partition layout: where every parameter lives in the flat buffers, and what each rank owns.

Pure data, computed by a pure function and unit-tested without processes. Parameters are packed, in the order
given (callers pass reverse registration order, the order gradients arrive in backward), into one flat buffer.
The buffer is cut into buckets: a bucket closes once it holds at least ``bucket_numel`` elements, or where the
parameter's *unit* changes (stage 3 gathers one unit, i.e. one module, at a time, so a unit never shares a
bucket). A parameter of ``bucket_numel`` elements or more gets a bucket of its own: its bucket is then ready the
moment its gradient is, and the small parameters before it (a position embedding, a LayerNorm) do not hold a
bucket of its size waiting for it; an unpadded one-parameter bucket can also be reduced straight from the
gradient. A bucket does not close when what is left of its unit is a runt, under ``1 / RUNT`` of
``bucket_numel`` (a block's first LayerNorm, last in backward): the runt joins it. Cut off, it would make the
block's large bucket ready before the block's backward ends, with the block's activation gradients alive, and
keep a stage 3 unit's parameters gathered through that bucket's staging copy. Every parameter starts on a
multiple of ``param_align`` elements; every bucket is padded to a multiple of ``shards * param_align`` so that
it splits into ``shards`` equal, aligned, contiguous shards. Rank ``r`` owns shard ``r`` of every bucket; its
*local* buffers (fp32 master, Adam states, gradient partition) are those shards concatenated in bucket order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ParamSpec:
    """A parameter to place: its name, shape and gather unit."""

    name: str
    shape: tuple[int, ...]
    unit: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


@dataclass(frozen=True)
class ParamSlot:
    """Where parameter ``index`` lives in the flat buffer: ``[start, end)`` inside bucket ``bucket``."""

    index: int
    name: str
    shape: tuple[int, ...]
    start: int
    end: int
    bucket: int


@dataclass(frozen=True)
class BucketSlot:
    """A contiguous, padded range ``[start, end)`` of the flat buffer, split into equal shards."""

    index: int
    start: int
    end: int
    params: tuple[int, ...]
    unit: int
    shards: int

    @property
    def numel(self) -> int:
        return self.end - self.start

    @property
    def shard_numel(self) -> int:
        return self.numel // self.shards

    def shard(self, rank: int) -> tuple[int, int]:
        """Flat-buffer range ``[start, end)`` owned by ``rank``."""
        lo = self.start + rank * self.shard_numel
        return lo, lo + self.shard_numel


@dataclass(frozen=True)
class Segment:
    """The part of a parameter that falls in one rank's shard of one bucket.

    ``param_start:param_end`` index the flattened parameter; ``flat_start`` is the position in the flat
    buffer; ``local_start`` the position in the rank's concatenated local shard buffer.
    """

    param: int
    bucket: int
    param_start: int
    param_end: int
    flat_start: int
    local_start: int

    @property
    def numel(self) -> int:
        return self.param_end - self.param_start


@dataclass(frozen=True)
class PartitionLayout:
    """The result of ``build_layout``: parameter slots, buckets, and per-rank shard arithmetic."""

    params: tuple[ParamSlot, ...]
    buckets: tuple[BucketSlot, ...]
    shards: int
    param_align: int

    @property
    def numel(self) -> int:
        """Padded size of the flat buffer."""
        return self.buckets[-1].end if self.buckets else 0

    @property
    def unpadded_numel(self) -> int:
        return sum(p.end - p.start for p in self.params)

    @property
    def shard_numel(self) -> int:
        """Size of every rank's local shard buffer (the same on every rank)."""
        return sum(b.shard_numel for b in self.buckets)

    def local_offset(self, bucket: int) -> int:
        """Where bucket ``bucket``'s shard starts in the local shard buffer."""
        return sum(b.shard_numel for b in self.buckets[:bucket])

    def sole_param(self, bucket: int) -> ParamSlot | None:
        """The bucket's one parameter when it fills the bucket exactly (no padding), else None: its
        gradient can then be reduced as it is, with no copy into a bucket."""
        b = self.buckets[bucket]
        slot = self.params[b.params[0]] if len(b.params) == 1 else None
        return slot if slot is not None and (slot.start, slot.end) == (b.start, b.end) else None

    def padding(self, bucket: int) -> list[tuple[int, int]]:
        """The ranges of bucket ``bucket`` (relative to its start) that hold no parameter: alignment gaps
        and the tail padding. Buffers that are not zero-initialised must zero these before a reduction."""
        b = self.buckets[bucket]
        out, cursor = [], b.start
        for i in b.params:
            p = self.params[i]
            if p.start > cursor:
                out.append((cursor - b.start, p.start - b.start))
            cursor = max(cursor, p.end)
        if cursor < b.end:
            out.append((cursor - b.start, b.end - b.start))
        return out

    def segments(self, rank: int) -> list[Segment]:
        """Every (parameter ∩ rank's shard) piece, in flat-buffer order."""
        out: list[Segment] = []
        for b in self.buckets:
            lo, hi = b.shard(rank)
            base = self.local_offset(b.index)
            for i in b.params:
                p = self.params[i]
                s, e = max(p.start, lo), min(p.end, hi)
                if s < e:
                    out.append(Segment(i, b.index, s - p.start, e - p.start, s, base + s - lo))
        return out


RUNT = 8
"""What is left of a unit after a full bucket joins that bucket when it is under ``bucket_numel / RUNT`` elements."""


def _unit_rest(specs: Sequence[ParamSpec], bucket_numel: int) -> list[int | None]:
    """Per parameter: the elements after it in its unit, or None where a parameter of ``bucket_numel`` or more (a
    bucket of its own) comes first."""
    rest: list[int | None] = [0] * len(specs)
    for i in range(len(specs) - 2, -1, -1):
        nxt, after = specs[i + 1], rest[i + 1]
        if nxt.unit != specs[i].unit:
            rest[i] = 0
        else:
            rest[i] = None if after is None or nxt.numel >= bucket_numel else after + nxt.numel
    return rest


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def build_layout(specs: Sequence[ParamSpec], shards: int, bucket_numel: int, param_align: int = 16) -> PartitionLayout:
    """Pack ``specs`` into buckets and shards (see the module docstring)."""
    if shards < 1:
        raise ValueError(f"shards must be >= 1, got {shards}")
    if bucket_numel < 1 or param_align < 1:
        raise ValueError("bucket_numel and param_align must be >= 1")
    slots: list[ParamSlot] = []
    buckets: list[BucketSlot] = []
    pad_to = shards * param_align
    bucket_start = cursor = 0
    members: list[int] = []
    rest = _unit_rest(specs, bucket_numel)

    def close(unit: int) -> None:
        nonlocal bucket_start, cursor, members
        end = _round_up(max(cursor, bucket_start + 1), pad_to)
        buckets.append(BucketSlot(len(buckets), bucket_start, end, tuple(members), unit, shards))
        bucket_start = cursor = end
        members = []

    for i, spec in enumerate(specs):
        if members and (specs[members[-1]].unit != spec.unit or spec.numel >= bucket_numel):
            close(specs[members[-1]].unit)
        start = _round_up(cursor, param_align)
        cursor = start + spec.numel
        slots.append(ParamSlot(i, spec.name, tuple(spec.shape), start, cursor, len(buckets)))
        members.append(i)
        runt = spec.numel < bucket_numel and rest[i] is not None and 0 < rest[i] * RUNT < bucket_numel
        if cursor - bucket_start >= bucket_numel and not runt:
            close(spec.unit)
    if members:
        close(specs[members[-1]].unit)
    return PartitionLayout(tuple(slots), tuple(buckets), shards, param_align)
