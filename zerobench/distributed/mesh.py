"""The 2-D device mesh: world = DP x TP, TP innermost (consecutive ranks, i.e. inside a node).

Groups are built once, by every rank in the same order (``new_group`` is collective), and passed
explicitly to whatever needs them.
"""

from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch.distributed as dist

from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group


@dataclass(frozen=True)
class Mesh:
    """This rank's DP and TP groups and coordinates."""

    dp: Group
    tp: Group
    world: Group

    @property
    def dp_rank(self) -> int:
        return self.dp.rank

    @property
    def tp_rank(self) -> int:
        return self.tp.rank


def validate_degrees(world: int, tp: int, dp: int | None = None) -> int:
    """Return the DP degree for ``world`` ranks at TP degree ``tp``, or raise a one-line error."""
    if tp < 1:
        raise ConfigError(f"TP degree must be >= 1, got {tp}")
    if world % tp:
        raise ConfigError(f"world size {world} is not divisible by TP degree {tp}: use a TP degree dividing {world}")
    if dp is not None and dp * tp != world:
        raise ConfigError(f"DP {dp} x TP {tp} = {dp * tp} does not match the world size {world}")
    return world // tp


def build_mesh(
    tp: int,
    dp: int | None = None,
    backend: str | None = None,
    timeout_s: float | None = None,
    native_collectives: bool = False,
) -> Mesh:
    """Build the DP x TP groups. With ``dp * tp`` smaller than the world, the world is cut into
    independent meshes of ``dp * tp`` consecutive ranks (useful to run several configurations at once).

    ``timeout_s``: every group's collective timeout (the run's; torch's own default for new groups is
    30 minutes, so a stuck rank would otherwise hang its peers that long). ``native_collectives``: keep
    gloo's own reduce-scatter/all-gather (``Group.native``).
    """
    timeout = datetime.timedelta(seconds=timeout_s) if timeout_s is not None else None
    world, rank = dist.get_world_size(), dist.get_rank()
    if dp is None:
        dp = validate_degrees(world, tp)
    elif world % (dp * tp):
        raise ConfigError(f"DP {dp} x TP {tp} = {dp * tp} does not divide the world size {world}")
    size = dp * tp
    my_tp = my_dp = None
    for base in range(0, world, size):
        for d in range(dp):  # TP groups: consecutive ranks
            ranks = list(range(base + d * tp, base + (d + 1) * tp))
            pg = dist.new_group(ranks, backend=backend, timeout=timeout)
            if rank in ranks:
                my_tp = pg
        for t in range(tp):  # DP groups: same TP rank in every replica
            ranks = list(range(base + t, base + size, tp))
            pg = dist.new_group(ranks, backend=backend, timeout=timeout)
            if rank in ranks:
                my_dp = pg
    native = native_collectives
    return Mesh(Group.of(my_dp, "dp", native), Group.of(my_tp, "tp", native), Group.of(None, "world", native))
