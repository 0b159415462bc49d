"""DeepSpeed's engine surface on a ``ZeroEngine``: its queries and counters (``get_lr()``, ``train_batch_size()``,
``global_samples``, ...) and ``train()``/``eval()``; and, as DeepSpeed's engine passes through to its module, the
module's attributes under every other name (``engine.parameters()``, ``engine.named_parameters()``, a model's own
methods). ``ZeroEngine.__getattr__`` resolves a name the engine lacks with ``engine_attribute``: here, then on the
module, then one line naming both."""

from __future__ import annotations

from typing import Any

import torch

from zerobench.config import ConfigError
from zerobench.distributed.env import detect


class DeepSpeedSurface:
    """DeepSpeed's queries on one engine (counters: ``micro_steps`` counts ``step()`` calls, ``global_steps``
    optimizer steps, ``skipped_steps`` fp16 overflows; the batch sizes are the config ``initialize`` read)."""

    def __init__(self, engine):
        self._engine = engine

    def get_lr(self) -> list[float]:
        return [g["lr"] for g in self._engine.optimizer.param_groups]

    def get_mom(self) -> list[tuple[float, float]]:
        """Each param group's Adam betas (DeepSpeed's name: a schedule such as OneCycle moves beta1)."""
        return [tuple(g["betas"]) for g in self._engine.optimizer.param_groups]

    def train_micro_batch_size_per_gpu(self) -> int:
        """Samples per DP rank in one micro-batch, from the DeepSpeed config ``initialize`` read."""
        if self._engine.micro_batch is None:
            raise ConfigError("train_micro_batch_size_per_gpu(): apply_zero takes no batch size (initialize() does)")
        return self._engine.micro_batch

    def train_batch_size(self) -> int:
        """Samples per optimizer step over the DP group: micro-batch x accumulation steps x DP ranks."""
        e = self._engine
        return self.train_micro_batch_size_per_gpu() * e.config.grad_accum_steps * e.group.size

    def get_batch_info(self) -> tuple[int, int, int]:
        """(``train_batch_size``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``), as DeepSpeed's."""
        return self.train_batch_size(), self.train_micro_batch_size_per_gpu(), self.gradient_accumulation_steps()

    @property
    def global_samples(self) -> int:
        """Samples trained over the DP group: ``train_batch_size()`` per optimizer step, as DeepSpeed counts them
        (an fp16 step skipped on an overflow included)."""
        return self._engine.global_steps * self.train_batch_size()

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped on an fp16 overflow (DeepSpeed's counter)."""
        return self._engine.scaler.skipped_steps

    @property
    def local_rank(self) -> int:
        """This process's rank on its node (torchrun's ``LOCAL_RANK``, Slurm's ``SLURM_LOCALID``; 0 without either)."""
        return detect().local_rank

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the current micro-batch ends a window, counted in ``step()`` calls."""
        e = self._engine
        return (e.micro_steps + 1) % e.config.grad_accum_steps == 0

    def gradient_accumulation_steps(self) -> int:
        return self._engine.config.grad_accum_steps

    def gradient_clipping(self) -> float:
        """The global gradient norm ``step()`` clips to; 0.0 when it does not clip (DeepSpeed's config value: 1.0
        where ``initialize``'s config leaves ``gradient_clipping`` out, as DeepSpeed's default)."""
        return self._engine.config.clip_grad_norm or 0.0

    def zero_optimization_stage(self) -> int:
        return self._engine.stage

    def fp16_enabled(self) -> bool:
        return self._engine.param_dtype == torch.float16

    def bfloat16_enabled(self) -> bool:
        return self._engine.param_dtype == torch.bfloat16

    def was_step_applied(self) -> bool:
        """Whether the latest step updated the parameters (not inside a window, nor on an fp16 overflow)."""
        return self._engine.optimizer.applied

    def get_global_grad_norm(self) -> float | None:
        """The latest step's global gradient norm; None unless clipping computed one (DeepSpeed's: every step)."""
        return self._engine.last_grad_norm

    def train(self, mode: bool = True):
        """``model.train(mode)``; returns the engine (``eval()`` is ``train(False)``)."""
        self._engine.module.train(mode)
        return self._engine

    def eval(self):
        return self.train(False)


_MISSING = object()


def engine_attribute(state: dict[str, Any], name: str) -> Any:
    """``name`` for an engine whose own attributes are ``state`` (its ``__dict__``) and lack it: DeepSpeed's surface,
    then the module's (as DeepSpeed's engine passes names through to its module); else ``AttributeError``."""
    surface, module = state.get("_surface"), state.get("module")
    if not name.startswith("_"):
        if surface is not None and hasattr(DeepSpeedSurface, name):  # the class: nothing evaluated yet
            return getattr(surface, name)
        if (found := getattr(module, name, _MISSING)) is not _MISSING:  # evaluated once (a property may gather)
            return found
    where = f" nor has its module ({type(module).__name__})" if module is not None else ""
    raise AttributeError(f"'ZeroEngine' object has no attribute {name!r}{where}")
