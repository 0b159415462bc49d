"""Megatron-core as a data-parallel peer: its own ``GPTModel`` (local layer spec) at TP 1, wrapped in its
``DistributedDataParallel`` and stepped by its own optimizer with the distributed optimizer off
(``get_megatron_optimizer``, ``use_distributed_optimizer=False``), as a Megatron-LM user trains at a world of 1.

The model, its weights and the data are the Megatron-LM baseline's (``baselines/megatron.py``: an identically
seeded zerobench GPT copied in). What differs from the baseline is the training recipe, taken from Megatron-LM's
own defaults so that the step does Megatron's work: in bf16 the model is wrapped in ``Float16Module`` (every
parameter in bf16), the gradients are accumulated and reduced in fp32
(``grad_reduce_in_fp32``, which Megatron-LM turns on for bf16) and the optimizer keeps fp32 main parameters
(``Float16OptimizerWithFloat16Params``), copied back to the bf16 model after each step; in fp32 it steps the
parameters themselves (``FP32Optimizer``). Megatron picks its Adam: Transformer Engine's or Apex's fused Adam
where installed, else ``torch.optim.AdamW``. Its weight-decay rule (none on biases and 1-dim parameters) is
zerobench's. Megatron-core is sharding stage 0: every rank holds every state. Megatron's optimizers are written
for CUDA (scales and overflow flags allocated on ``"cuda"``, CUDA tensor types checked), so this peer runs on a
GPU only; on a CPU it stops with a one-line error before training.
"""

from __future__ import annotations

import torch

from zerobench.baselines.megatron import MegatronSystem
from zerobench.config import ConfigError
from zerobench.metrics.memory import storage_bytes
from zerobench.peers.common import check_supported


class MegatronCoreSystem(MegatronSystem):
    def __init__(self, name, cfg, mesh, ledger, device):
        check_supported(name, cfg)
        self.name, self.device = name, device
        super().__init__(cfg, mesh, ledger, device)

    def _mixed(self) -> bool:
        return self.cfg.zero.precision.value != "fp32"

    def _ddp_config(self, config_cls):
        return config_cls(grad_reduce_in_fp32=self._mixed(), use_distributed_optimizer=False)

    def optimizer_config(self):
        """Megatron's ``OptimizerConfig`` for this run: Adam(W) with zerobench's hyperparameters, its mixed
        precision in bf16, the distributed optimizer off, clipping as ``--clip`` (0: none)."""
        from megatron.core.optimizer import OptimizerConfig

        o = self.cfg.zero.optimizer
        return OptimizerConfig(
            optimizer="adam",
            lr=o.lr,
            weight_decay=o.weight_decay,
            adam_beta1=o.betas[0],
            adam_beta2=o.betas[1],
            adam_eps=o.eps,
            bf16=self.cfg.zero.precision.value == "bf16",
            params_dtype=self.cfg.zero.precision.param_dtype,
            use_distributed_optimizer=False,
            clip_grad=self.cfg.zero.clip_grad_norm or 0.0,
        )

    def _optimizer(self):
        if self.device.type != "cuda":  # its optimizers allocate their scale and overflow flags on "cuda"
            raise ConfigError(
                f"{self.name}: megatron-core's optimizer runs on CUDA only; on a CPU use --system megatron "
                "(megatron-core's model and DDP with torch's AdamW)"
            )
        from megatron.core.optimizer import get_megatron_optimizer

        return get_megatron_optimizer(self.optimizer_config(), [self.ddp])

    def step(self) -> bool:
        with self.cpu_compat():
            self.ddp.finish_grad_sync()
            stepped, _, _ = self.optimizer.step()
        return bool(stepped)

    def zero_grad(self) -> None:
        self.ddp.zero_grad_buffer()
        self.optimizer.zero_grad()

    def _masters(self) -> list[torch.Tensor]:
        """The fp32 main parameters of the mixed-precision optimizer (none in fp32: it steps the parameters)."""
        return [p for g in getattr(self.optimizer, "fp32_from_float16_groups", []) for p in g]

    def _states(self) -> list[torch.Tensor]:
        inner = self.optimizer.optimizer
        return [t for s in inner.state.values() for t in s.values() if torch.is_tensor(t) and t.dim()]

    def memory_ledger(self) -> dict[str, int]:
        grads = [p.main_grad for p in self.params]
        return {
            "params": storage_bytes(self.params),
            "grads": storage_bytes(grads),
            "master": storage_bytes(self._masters()),
            "optimizer_states": storage_bytes(self._states()),
            "comm_buffers": 0,
        }

    def model_state_bytes(self) -> int:
        led = self.memory_ledger()
        return led["params"] + led["grads"] + led["master"] + led["optimizer_states"]

    def tensors(self) -> list[torch.Tensor]:
        return list(self.params) + self._masters() + self._states()
