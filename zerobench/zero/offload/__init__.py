"""ZeRO-Offload and ZeRO-Infinity: the host side of a rank's partition (``host``) and the NVMe tier (``nvme``)."""
