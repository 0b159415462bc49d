"""torch's own data-parallel systems as peers: DDP, ZeroRedundancyOptimizer (ZeRO-1), FSDP1 and FSDP2.

Each is configured as its documentation recommends, with AdamW ``fused=True`` (supported on CPU and CUDA):
DDP with its default 25 MB buckets; ZeRO-1 as ``ZeroRedundancyOptimizer`` under DDP; FSDP1 wrapping every
transformer block and the root, ``use_orig_params=True`` (param groups), ``device_id`` set (CPU needs
it); FSDP2 ``fully_shard`` on every block and then the root, over a 1-D device mesh of the DP group;
``fsdp2-compiled`` the same with each block's forward compiled first (``torch.compile(..., fullgraph=True)``; FSDP2's
all-gather and reshard hooks run around it, outside the compiled region), as torchtitan compiles block by block.

bf16 is each wrapper's own mixed precision: DDP and ZeRO-1 run the forward under ``torch.autocast`` (fp32
parameters and optimizer); FSDP1 and FSDP2 keep fp32 sharded parameters, compute with bf16 copies and reduce
gradients in fp32 (``MixedPrecision`` / ``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``, torchtitan's
default).
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
    bf16,
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
        self.autocast = bf16(cfg)

    def _no_sync(self):
        return self.module.no_sync()


class TorchZeRO1(PeerBase):
    def __init__(self, name, cfg, mesh, ledger, device):
        from torch.distributed.optim import ZeroRedundancyOptimizer

        super().__init__(name, cfg, ledger)
        model = build_model(cfg, device)
        self.module = DDP(model, process_group=mesh.dp.pg)
        self.autocast = bf16(cfg)
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
        from torch.distributed.fsdp import MixedPrecision, ShardingStrategy
        from torch.distributed.fsdp.wrap import ModuleWrapPolicy

        super().__init__(name, cfg, ledger)
        strategy = ShardingStrategy.FULL_SHARD if name == "fsdp1-full-shard" else ShardingStrategy.SHARD_GRAD_OP
        model = build_model(cfg, device)
        # grouped before wrapping: FSDP (use_orig_params) keeps these Parameter objects but flattens them to 1-D
        # shards, which the 2+ dims rule would put all in the group without weight decay
        groups = param_groups(model, cfg)
        self.module = FSDP(
            model,
            process_group=mesh.dp.pg,
            sharding_strategy=strategy,
            auto_wrap_policy=ModuleWrapPolicy({Block}),
            device_id=device,
            use_orig_params=True,
            mixed_precision=MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
            if bf16(cfg)
            else None,
        )
        self.optimizer = _adamw(groups, cfg)

    def _no_sync(self):
        return self.module.no_sync()

    def _clip(self) -> None:
        if self.cfg.zero.clip_grad_norm is not None:
            self.module.clip_grad_norm_(self.cfg.zero.clip_grad_norm)


class TorchFSDP2(PeerBase):
    def __init__(self, name, cfg, mesh, ledger, device):
        from torch.distributed.device_mesh import DeviceMesh
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        super().__init__(name, cfg, ledger)
        reshard = name != "fsdp2-no-reshard"
        model = build_model(cfg, device)
        if name == "fsdp2-compiled":  # each block's forward compiled; FSDP2's hooks run around it, uncompiled
            self.op_counting = False
            for block in model.blocks:
                block.forward = torch.compile(block.forward, fullgraph=True)
        dm = DeviceMesh.from_group(mesh.dp.pg or dist.group.WORLD, device.type)
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32) if bf16(cfg) else None
        kw = {"mesh": dm, "reshard_after_forward": reshard, **({"mp_policy": mp} if mp else {})}
        for block in model.blocks:
            fully_shard(block, **kw)
        fully_shard(model, **kw)
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
    "fsdp2-compiled": TorchFSDP2,
}


def build_torch_peer(name, cfg, mesh, ledger, device):
    return _CLASSES[name](name, cfg, mesh, ledger, device)
