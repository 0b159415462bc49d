"""The communication ledger: every collective of a training step an engine issues, with the paper's volume accounting.

Volume follows the ZeRO paper (§7): per rank, a reduce-scatter or all-gather of a tensor of N elements
(the full, unsharded size) over a group of n ranks moves N(n-1)/n elements; an all-reduce moves twice
that (it is a reduce-scatter followed by an all-gather).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class CommRecord:
    """One collective call."""

    op: str
    """``all_reduce``, ``reduce_scatter`` or ``all_gather``."""
    group: str
    """Name of the process group (``dp``, ``tp``, ...)."""
    group_size: int
    """Ranks in the group."""
    numel: int
    """Elements of the full (unsharded) tensor."""
    bytes: int
    """Bytes of the full tensor."""
    tag: str
    """What the engine used it for (``grad``, ``param``, ``norm``, ...)."""

    @property
    def volume_elements(self) -> float:
        """Per-rank volume in the paper's accounting."""
        frac = (self.group_size - 1) / self.group_size
        return (2.0 if self.op == "all_reduce" else 1.0) * self.numel * frac

    @property
    def volume_bytes(self) -> float:
        return self.volume_elements * (self.bytes / max(self.numel, 1))


class CommLedger:
    """Records collectives; ``reset`` at each step start, ``summary`` after."""

    def __init__(self) -> None:
        self.records: list[CommRecord] = []

    def record(self, op: str, group: str, group_size: int, numel: int, nbytes: int, tag: str) -> None:
        self.records.append(CommRecord(op, group, group_size, numel, nbytes, tag))

    def reset(self) -> None:
        self.records.clear()

    def volume_elements(self, group: str | None = None, tag: str | None = None) -> float:
        return sum(
            r.volume_elements
            for r in self.records
            if (group is None or r.group == group) and (tag is None or r.tag == tag)
        )

    def summary(self) -> list[dict]:
        """Per (group, op, tag): calls, elements, bytes and paper-accounted volume."""
        acc: dict[tuple, dict] = defaultdict(
            lambda: {"calls": 0, "numel": 0, "bytes": 0, "volume_elements": 0.0, "volume_bytes": 0.0}
        )
        for r in self.records:
            a = acc[(r.group, r.op, r.tag)]
            a["calls"] += 1
            a["numel"] += r.numel
            a["bytes"] += r.bytes
            a["volume_elements"] += r.volume_elements
            a["volume_bytes"] += r.volume_bytes
        return [{"group": g, "op": o, "tag": t, **v} for (g, o, t), v in sorted(acc.items())]

    def as_rows(self) -> list[dict]:
        return [asdict(r) for r in self.records]
