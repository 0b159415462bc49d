"""What a ``ZeroEngine`` holds, by category and place: the memory ledger (device and host), the model-state
bytes measured from its tensors, the analytic figures they are compared with, and the tensor list the
live-tensor tracker starts from. ``ZeroEngine`` builds one ``EngineAccounting`` from the parts it holds
(explicitly, not as a base class); it reads them and changes nothing."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from zerobench.metrics.analytic import host_state_bytes_analytic, model_state_bytes_analytic
from zerobench.metrics.memory import storage_bytes
from zerobench.zero.storage.placement import Placement, Tier


@dataclass
class EngineAccounting:
    """The memory figures of one engine, from the tensors its parts hold."""

    grads: Any
    """The ``GradBucketGroup``."""
    gatherer: Any
    """The stage-3 ``Stage3Gatherer`` (None at stages 0-2)."""
    storage: Any
    """The ``ParamStorage`` (replica, shards, master, host partition)."""
    optimizer: Any
    """The ``ShardedAdamW``."""
    config: Any
    """The engine's ``ZeroConfig``."""
    placement: Placement
    """Where each partition lives."""
    numel: int
    """Unpadded parameters this engine trains."""
    dp_size: int

    def memory_ledger(self) -> dict[str, int]:
        """Bytes held by this rank's engine tensors, by category (measured from the tensors). Device
        categories (params, grads, master, optimizer_states, comm_buffers); under offload also
        the host ones (host_*) and the NVMe tier's file bytes. ``grads`` is the gradients' size while held:
        at stages 2-3 the partition exists from backward until ``zero_grad()`` and is released between."""
        g = self.grads.tensors()
        comm = list(g["comm_buffers"])
        if self.gatherer is not None:
            comm += self.gatherer.gathered_tensors()
        led = {
            "params": storage_bytes(self.storage.device_params()),
            "grads": self.grads.grad_bytes(),
            "master": storage_bytes(self.storage.device_master()),
            "optimizer_states": storage_bytes(self.optimizer.tensors()) if self.storage.host is None else 0,
            "comm_buffers": storage_bytes(comm),
        }
        if self.storage.host is not None:
            led.update(self.storage.host.ledger(self.optimizer.tensors(), self.optimizer.store.file_bytes()))
        return led

    def host_model_state_bytes(self) -> int:
        """Model-state bytes this rank keeps in host memory (0 without offload)."""
        led = self.memory_ledger()
        return sum(v for k, v in led.items() if k.startswith("host_"))

    def model_state_bytes(self) -> int:
        led = self.memory_ledger()
        return led["params"] + led["grads"] + led["master"] + led["optimizer_states"]

    def model_state_bytes_analytic(self) -> dict[str, float]:
        """Device bytes by category (ZeRO §3.1 and §5's formulas, with the offloaded parts moved to the host;
        ``metrics/analytic.py``)."""
        pb = torch.finfo(self.config.precision.param_dtype).bits // 8
        return model_state_bytes_analytic(
            self.numel,
            self.dp_size,
            self.config.stage,
            pb,
            pb,
            4 if self.storage.device_master() else 0,
            self.optimizer.codec.bytes_per_element(),
            offload_optimizer=self.placement.offloaded,
            offload_param=self.placement.params is Tier.HOST,
        )

    def host_state_bytes_analytic(self) -> dict[str, float]:
        """Host bytes by category under offload (NVMe-swapped states excluded)."""
        pb = torch.finfo(self.config.precision.param_dtype).bits // 8
        out = host_state_bytes_analytic(
            self.numel,
            self.dp_size,
            self.config.stage,
            pb,
            pb,
            self.optimizer.codec.bytes_per_element(),
            self.placement.params is Tier.HOST,
        )
        if self.placement.states is Tier.NVME:
            out["host_optimizer_states"] = 0.0
        return out

    def tensors(self) -> list[torch.Tensor]:
        """Every *device* tensor the engine holds now (for memory trackers; host ones excluded)."""
        out = self.storage.device_params() + self.grads.tensors()["grads"]
        if self.storage.host is None:
            out += self.optimizer.tensors()
        return out + self.storage.device_master()
