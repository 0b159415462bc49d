"""DeepSpeed ZeRO stages 0-3 (and 2/3 with optimizer offload to the CPU Adam) as a peer.

Optional: ``pip install 'zerobench[deepspeed]'`` (the pinned release, part of the test extra; its C++ ops are
built just in time on first use); zerobench never requires it. Configured as its documentation recommends,
with settings that keep the comparison fair: ``gradient_clipping`` set explicitly (DeepSpeed otherwise clips
at 1.0 and trains differently without a word), torch's fused AdamW as the client optimizer
(``DeepSpeedCPUAdam`` with offload, as DeepSpeed requires), fp32 (or bf16 through DeepSpeed's ``bf16``
section, with plain activation checkpointing: the one-card offload comparison), the same bucket size as
zerobench (``ZeroConfig.bucket_numel``) at stages 1-3 (DeepSpeed's stage 0 all-reduces after backward in its own
buckets whatever the config says), and ``overlap_comm`` as the run's config says at every stage. DeepSpeed picks
gloo on CPU and joins the already initialised process group.
"""

from __future__ import annotations

import os

import torch

from zerobench.config import ConfigError
from zerobench.metrics.memory import storage_bytes
from zerobench.parallel.parallelize import ParallelSpec, parallelize
from zerobench.peers.common import (
    PeerBase,
    adamw_kwargs,
    build_model,
    optimizer_tensors,
    param_groups,
)


def ds_config(name: str, cfg) -> dict:
    stage = int(name.split("-")[1])
    zero: dict = {
        "stage": stage,
        "reduce_bucket_size": cfg.zero.bucket_numel,
        "allgather_bucket_size": cfg.zero.bucket_numel,
        "contiguous_gradients": True,
    }
    # Always said: DeepSpeed's own default is off at stages 1-2 (on at 3), so a deepspeed-2 left to it ran without
    # overlap while its rows said overlap_comm on, beside a zerobench-2 that overlaps. Its ZeRO-2 examples set it on.
    zero["overlap_comm"] = cfg.zero.overlap_comm
    if name.endswith("offload"):
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": torch.cuda.is_available()}
    if stage == 3:
        zero["stage3_prefetch_bucket_size"] = cfg.zero.bucket_numel
        # every parameter sharded, as zerobench's stage 3 shards them: DeepSpeed's default (1e5 elements) keeps
        # smaller ones whole on every rank, which at the tiny preset is all of them
        zero["stage3_param_persistence_threshold"] = 0
    return {
        "bf16": {"enabled": cfg.zero.precision.value == "bf16"},
        "train_micro_batch_size_per_gpu": cfg.micro_batch,
        "gradient_accumulation_steps": cfg.zero.grad_accum_steps,
        "gradient_clipping": cfg.zero.clip_grad_norm or 0.0,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }


class DeepSpeedSystem(PeerBase):
    def __init__(self, name, cfg, mesh, ledger, device):
        super().__init__(name, cfg, ledger)
        try:
            import deepspeed
        except Exception as e:  # noqa: BLE001 - any import failure means "not usable here"
            raise ConfigError(
                f"{name} needs DeepSpeed ({type(e).__name__}: {e}); pip install 'zerobench[deepspeed]'"
            ) from None
        model = build_model(cfg, device)
        # The same block-level recompute zerobench uses (plain checkpointing, no P_a/M_D), applied to the
        # plain module before DeepSpeed wraps it, as a DeepSpeed user checkpoints their own model.
        parallelize(model, mesh, ParallelSpec(zero=None, kernels="reference", activation=cfg.activation), ledger)
        groups = param_groups(model, cfg)
        self.offload = name.endswith("offload")
        if self.offload:
            from deepspeed.ops.adam import DeepSpeedCPUAdam

            opt = DeepSpeedCPUAdam(groups, adamw_mode=True, **adamw_kwargs(cfg))
        else:
            opt = torch.optim.AdamW(groups, fused=True, **adamw_kwargs(cfg))
        # DeepSpeed reads this rank's GPU from LOCAL_RANK, which only torchrun and its own launcher set;
        # a single process or an srun task runs on the device zerobench already picked.
        os.environ.setdefault("LOCAL_RANK", str(device.index or 0) if device.type == "cuda" else "0")
        self.engine, self.optimizer, _, _ = deepspeed.initialize(
            model=model,
            optimizer=opt,
            config=ds_config(name, cfg),
            dist_init_required=False,
        )
        self.module = self.engine

    def forward_backward(self, x, y):
        # DeepSpeed owns the accumulation window: backward scales by 1/accum, step() applies at the boundary.
        loss = self.engine(x, y)
        self.engine.backward(loss)
        self.engine.step()
        return loss.detach()

    def step(self) -> bool:
        return True  # taken by engine.step() at the window's last micro-batch

    def zero_grad(self) -> None:
        pass  # DeepSpeed clears gradients in its step

    def _params(self) -> list[torch.Tensor]:
        return [getattr(p, "ds_tensor", p) for p in self.engine.module.parameters()]

    def _inner_optimizer(self):
        return getattr(self.optimizer, "optimizer", self.optimizer)

    def _master(self) -> list[torch.Tensor]:
        """DeepSpeed's fp32 master partitions: the tensors its inner optimizer steps, where they are not the
        module's own parameters (stage 0 steps those directly; ZeRO 1-3 step fp32 partition copies).
        ``storage_bytes`` counts a tensor listed twice once."""
        held = {t.untyped_storage()._cdata for t in self._params()}
        inner = self._inner_optimizer()
        # stage 3 puts a sub-group's partition into param_groups only for its step: the state keys hold them
        stepped = list(inner.state.keys()) + [p for g in inner.param_groups for p in g["params"]]
        return [p for p in stepped if isinstance(p, torch.Tensor) and p.untyped_storage()._cdata not in held]

    def memory_ledger(self) -> dict[str, int]:
        """Model states by category, measured from DeepSpeed's tensors. With ``offload_optimizer`` the fp32
        master and Adam moments are host memory (``host_*``), as in zerobench's offload ledger."""
        led = super().memory_ledger()
        masters = self._master()
        master = storage_bytes(masters)
        # fp32 gradient partitions DeepSpeed keeps on its master partitions (with offload a pinned host
        # buffer that gradients stream into); staging/bucket buffers are not counted
        grad_tensors = [m.grad for m in masters if m.grad is not None]
        flat = getattr(self.engine.optimizer, "grad_partitions_flat_buffer", None)  # stage 3's, held from init
        grads = storage_bytes(grad_tensors + ([flat] if isinstance(flat, torch.Tensor) else []))
        states = storage_bytes(optimizer_tensors(self._inner_optimizer()))
        if self.offload:
            led.update(
                master=0,
                optimizer_states=0,
                host_params=0,
                host_grads=grads,
                host_master=master,
                host_optimizer_states=states,
                nvme_optimizer_states=0,
            )
        else:
            led.update(grads=led["grads"] + grads, master=master, optimizer_states=states)
        return led

    def host_state_bytes(self) -> dict | None:
        """Offloaded model states: measured host bytes (no analytic figure for a peer)."""
        if not self.offload:
            return None
        led = self.memory_ledger()
        return {"measured": led["host_grads"] + led["host_master"] + led["host_optimizer_states"], "analytic": None}

    def tensors(self) -> list[torch.Tensor]:
        return self._params() + self._master() + optimizer_tensors(self._inner_optimizer())
