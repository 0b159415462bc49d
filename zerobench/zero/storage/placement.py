"""Where each of a rank's partitions lives — device, host memory or NVMe files — decided once from the
``ZeroConfig`` and read by the construction steps and the accounting, instead of string flags compared in
each of them."""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Tier(enum.Enum):
    """A place a partition can live."""

    DEVICE = "device"
    HOST = "host"
    NVME = "nvme"


@dataclass(frozen=True)
class Placement:
    """The tier of each partition of this rank."""

    params: Tier
    """The stage-3 parameter partition (stages 0-2 replicate parameters on the device)."""
    master: Tier
    """The fp32 master partition and the reduced-gradient partition it is updated from."""
    states: Tier
    """The optimizer's moments (Adam m and v)."""

    @classmethod
    def of(cls, config) -> Placement:
        """From ``ZeroConfig.offload_optimizer`` (none | cpu | nvme) and ``offload_param`` (none | cpu)."""
        master = Tier.DEVICE if config.offload_optimizer == "none" else Tier.HOST
        states = {"none": Tier.DEVICE, "cpu": Tier.HOST, "nvme": Tier.NVME}[config.offload_optimizer]
        params = Tier.HOST if config.offload_param == "cpu" else Tier.DEVICE
        return cls(params, master, states)

    @property
    def offloaded(self) -> bool:
        """The optimizer step runs on the host (ZeRO-Offload)."""
        return self.master is Tier.HOST
