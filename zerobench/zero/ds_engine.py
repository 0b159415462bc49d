"""DeepSpeed's engine surface on a ``ZeroEngine``, for code written against ``deepspeed.initialize``'s engine: its
counters and queries (``micro_steps`` counted by ``step()``, ``global_steps`` by optimizer steps), ``engine(batch)``,
``train()``/``eval()``, its ranks and sizes, and its files, called on every rank as DeepSpeed's:
``save_checkpoint`` / ``load_checkpoint`` (a tagged directory, ``zero/checkpoint_dir.py``) and
``save_16bit_model`` (the whole model as one plain state dict, ``zero/export.py``)."""

from __future__ import annotations

import torch
import torch.distributed as dist

from zerobench.zero.checkpoint_dir import load_tagged, save_tagged
from zerobench.zero.export import save_16bit_model


class DeepSpeedSurface:
    """Mixed into ``ZeroEngine``."""

    def get_lr(self) -> list[float]:
        """The learning rate of each param group, as DeepSpeed's ``engine.get_lr()``."""
        return [g["lr"] for g in self.optimizer.param_groups]

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the current micro-batch ends a window, counted in ``step()`` calls, as DeepSpeed's."""
        return (self.micro_steps + 1) % self.config.grad_accum_steps == 0

    def gradient_accumulation_steps(self) -> int:
        return self.config.grad_accum_steps

    def zero_optimization_stage(self) -> int:
        return self.stage

    def fp16_enabled(self) -> bool:
        return self.param_dtype == torch.float16

    def bfloat16_enabled(self) -> bool:
        return self.param_dtype == torch.bfloat16

    def was_step_applied(self) -> bool:
        """Whether the latest step updated the parameters (not inside a window, nor on an fp16 overflow)."""
        return self.optimizer.applied

    def get_global_grad_norm(self) -> float | None:
        """The latest step's global gradient norm; None unless clipping computed one (DeepSpeed's: every step)."""
        return self.last_grad_norm

    @property
    def dp_world_size(self) -> int:
        """Ranks in the engine's data-parallel group."""
        return self.group.size

    @property
    def mp_world_size(self) -> int:
        """Ranks in its tensor-parallel group (1 without TP)."""
        return 1 if self.tp_group is None else self.tp_group.size

    @property
    def global_rank(self) -> int:
        """This process's rank in the default group (0 without one)."""
        return dist.get_rank() if dist.is_initialized() else 0

    @property
    def world_size(self) -> int:
        """Processes in the default group (1 without one)."""
        return dist.get_world_size() if dist.is_initialized() else 1

    def __call__(self, *args, **kwargs):
        """``engine(batch)``: the model's forward, as DeepSpeed's engine."""
        return self.module(*args, **kwargs)

    def train(self, mode: bool = True):
        """``model.train(mode)``; returns the engine (``eval()`` is ``train(False)``), as DeepSpeed's."""
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def save_checkpoint(self, save_dir, tag: str | None = None, client_state: dict | None = None, **options):
        """``save_dir/<tag>`` and ``save_dir/latest``, as DeepSpeed's, with its ``save_latest`` and
        ``exclude_frozen_parameters``."""
        return save_tagged(self, save_dir, tag, client_state, **options)

    def load_checkpoint(self, load_dir, tag: str | None = None, **options):
        """(the checkpoint's path, its client state); (None, None) when there is no ``latest``. DeepSpeed's options:
        ``load_module_strict``, ``load_optimizer_states``, ``load_module_only``, ...."""
        return load_tagged(self, load_dir, tag, **options)

    def save_16bit_model(self, save_dir, save_filename: str = "pytorch_model.bin",
                         exclude_frozen_parameters: bool = False) -> bool:
        """The model's state dict, trained parameters in the training dtype, written by DP rank 0 to
        ``save_dir/save_filename`` for ``model.load_state_dict`` without ZeRO (at stage 3 too: always gathered)."""
        return save_16bit_model(self, save_dir, save_filename, exclude_frozen_parameters)
