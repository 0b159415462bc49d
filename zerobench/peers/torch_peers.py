"""torch's own data-parallel systems as peers: DDP, ZeroRedundancyOptimizer (ZeRO-1), FSDP1 and FSDP2.

Each is configured as its documentation recommends, with AdamW ``fused=True`` (supported on CPU and CUDA):
DDP with its default 25 MB buckets; ZeRO-1 as ``ZeroRedundancyOptimizer`` under DDP; FSDP1 wrapping every
transformer block and the root, ``use_orig_params=True`` (param groups), ``device_id`` set (CPU needs
it); FSDP2 ``fully_shard`` on every block and then the root, over a 1-D device mesh of the DP group.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

from zerobench.metrics.memory import storage_bytes
from zerobench.models.gpt import Block
from zerobench.peers.common import (
    PeerBase,
    adamw_kwargs,
    build_model,
    optimizer_tensors,
    param_groups,
)


def _adamw(groups, cfg):
    return torch.optim.AdamW(groups, fused=True, **adamw_kwargs(cfg))


class TorchDDP(PeerBase):
    def __init__(self, name, cfg, mesh, ledger, device):
        super().__init__(name, cfg, ledger)
        model = build_model(cfg, device)
        self.module = DDP(model, process_group=mesh.dp.pg)
        self.optimizer = _adamw(param_groups(model, cfg), cfg)

    def _no_sync(self):
        return self.module.no_sync()


class TorchZeRO1(PeerBase):
    def __init__(self, name, cfg, mesh, ledger, device):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        super().__init__(name, cfg, ledger)
        model = build_model(cfg, device)
        self.module = DDP(model, process_group=mesh.dp.pg)
        groups = param_groups(model, cfg)
        self.optimizer = ZeroRedundancyOptimizer(
            groups[0]["params"],
            optimizer_class=torch.optim.AdamW,
            process_group=mesh.dp.pg,
            weight_decay=groups[0]["weight_decay"],
            fused=True,
            **adamw_kwargs(cfg),
        )
        self.optimizer.add_param_group(groups[1])

    def _no_sync(self):
        return self.module.no_sync()

    def memory_ledger(self) -> dict[str, int]:
        led = super().memory_ledger()
        led["optimizer_states"] = storage_bytes(optimizer_tensors(self.optimizer.optim))
        return led

    def tensors(self) -> list[torch.Tensor]:
        return self._params() + self._grads() + optimizer_tensors(self.optimizer.optim)


class TorchFSDP1(PeerBase):
    def __init__(self, name, cfg, mesh, ledger, device):
        from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
        from torch.distributed.fsdp import ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        super().__init__(name, cfg, ledger)
        strategy = ShardingStrategy.FULL_SHARD if name == "fsdp1-full-shard" else ShardingStrategy.SHARD_GRAD_OP
        model = build_model(cfg, device)
        self.module = FSDP(
            model,
            process_group=mesh.dp.pg,
            sharding_strategy=strategy,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            device_id=device,
            use_orig_params=True,
        )
        self.optimizer = _adamw(param_groups(self.module, cfg), cfg)

    def _no_sync(self):
        return self.module.no_sync()

    def _clip(self) -> None:
        if self.cfg.zero.clip_grad_norm is not None:
            self.module.clip_grad_norm_(self.cfg.zero.clip_grad_norm)


class TorchFSDP2(PeerBase):
    def __init__(self, name, cfg, mesh, ledger, device):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import fully_shard

        super().__init__(name, cfg, ledger)
        reshard = name == "fsdp2"
        model = build_model(cfg, device)
        dm = DeviceMesh.from_group(mesh.dp.pg or dist.group.WORLD, device.type)
        for block in model.blocks:
            fully_shard(block, mesh=dm, reshard_after_forward=reshard)
        fully_shard(model, mesh=dm, reshard_after_forward=reshard)
        self.module = model
        self.optimizer = _adamw(param_groups(model, cfg), cfg)

    def forward_backward(self, x, y):
        accum = self.cfg.zero.grad_accum_steps
        self.micro += 1
        self.module.set_requires_gradient_sync(self.micro % accum == 0)
        loss = self.module(x, y)
        (loss / accum).backward()
        return loss.detach()


_CLASSES = {
    "torch-ddp": TorchDDP,
    "torch-zero1": TorchZeRO1,
    "fsdp1-shard-grad-op": TorchFSDP1,
    "fsdp1-full-shard": TorchFSDP1,
    "fsdp2-no-reshard": TorchFSDP2,
    "fsdp2": TorchFSDP2,
}


def build_torch_peer(name, cfg, mesh, ledger, device):
    return _CLASSES[name](name, cfg, mesh, ledger, device)
