"""The ``fake`` process-group backend (torch's testing backend): collectives return at once, without data.

Used for dry runs of large worlds (the real engine built for one rank of 400) and for profiling one TP
rank's compute alone. It initialises the default process group, so it needs a process of its own.
"""

from __future__ import annotations

import torch.distributed as dist


def init_fake_world(world_size: int, rank: int) -> None:
    """Make the default process group a fake one of ``world_size`` ranks, this process being ``rank``."""
    from torch.testing._internal.distributed.fake_pg import FakeStore  # registers the "fake" backend

    if dist.is_initialized():
        dist.destroy_process_group()
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=world_size)
