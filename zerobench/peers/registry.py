"""Names of the peer systems, what each shards (its ZeRO-stage equivalent), how to build and check one."""

from __future__ import annotations

from collections.abc import Callable

from zerobench.train.entry import SystemEntry

# name -> the zerobench stage doing the same sharding (the comparison the bar is about)
SHARDING: dict[str, int] = {
    "torch-ddp": 0,
    "torch-zero1": 1,
    "fsdp1-shard-grad-op": 2,
    "fsdp2-no-reshard": 2,
    "fsdp1-full-shard": 3,
    "fsdp2": 3,
    "fsdp2-compiled": 3,
    "megatron-core": 0,
    "deepspeed-0": 0,
    "deepspeed-1": 1,
    "deepspeed-2": 2,
    "deepspeed-3": 3,
    "deepspeed-2-offload": 2,
    "deepspeed-3-offload": 3,
}
TORCH_PEERS = ("torch-ddp", "torch-zero1", "fsdp1-shard-grad-op", "fsdp2-no-reshard", "fsdp1-full-shard", "fsdp2")
DEEPSPEED_PEERS = tuple(n for n in SHARDING if n.startswith("deepspeed"))
OPTIONAL_PEERS = ("fsdp2-compiled", "megatron-core")
"""Peers run only when named in ``--systems``: ``torch.compile`` takes minutes on a CPU, and megatron-core is an
optional install."""


def peer_names() -> tuple[str, ...]:
    return tuple(SHARDING)


def _torch(name: str) -> Callable:
    def build(cfg, mesh, ledger, device):
        from zerobench.peers.torch_peers import build_torch_peer

        return build_torch_peer(name, cfg, mesh, ledger, device)

    return build


def _deepspeed(name: str) -> Callable:
    def build(cfg, mesh, ledger, device):
        from zerobench.peers.deepspeed_peer import DeepSpeedSystem

        return DeepSpeedSystem(name, cfg, mesh, ledger, device)

    return build


def _megatron_core(name: str) -> Callable:
    def build(cfg, mesh, ledger, device):
        from zerobench.peers.megatron_peer import MegatronCoreSystem

        return MegatronCoreSystem(name, cfg, mesh, ledger, device)

    return build


def _validate(name: str) -> Callable:
    def validate(cfg) -> None:
        from zerobench.peers.common import check_supported

        check_supported(name, cfg)
        if name == "megatron-core":
            from zerobench.baselines.megatron import require_megatron

            require_megatron()

    return validate


PEERS: dict[str, Callable] = {
    **{n: _torch(n) for n in (*TORCH_PEERS, "fsdp2-compiled")},
    "megatron-core": _megatron_core("megatron-core"),
    **{n: _deepspeed(n) for n in DEEPSPEED_PEERS},
}
ENTRIES: dict[str, SystemEntry] = {n: SystemEntry(n, PEERS[n], _validate(n), shards_like=SHARDING[n]) for n in SHARDING}
"""Each peer's registration: built lazily, validated by ``check_supported``, sharding like ``SHARDING``."""


def deepspeed_available() -> bool:
    try:
        import deepspeed  # noqa: F401

        return True
    except Exception:  # noqa: BLE001 - any import failure means "not usable here"
        return False
