"""Peer systems: the implementations users already have (torch DDP, ZeroRedundancyOptimizer, FSDP1/FSDP2,
DeepSpeed ZeRO), as ``TrainSystem`` adapters the training loop drives exactly like zerobench — same GPT,
same init, same synthetic data, same AdamW hyperparameters (decay on 2+-dim parameters only), same timing
and memory measurement. ``zerobench peers`` (``bench/peers.py``) runs them side by side.
"""

from zerobench.peers.registry import PEERS, SHARDING, peer_names

__all__ = ["PEERS", "SHARDING", "peer_names"]
