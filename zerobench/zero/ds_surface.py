"""DeepSpeed's engine surface on the ZeRO engine: the queries and calls a DeepSpeed training loop makes besides
``backward`` and ``step`` (``engine(batch)``, ``train()``/``eval()``, ``get_lr()``, the accumulation boundary and
step counters, tagged checkpoints), so such a loop runs unchanged on ``ZeroEngine``, which derives from this.

The counters are DeepSpeed's: ``micro_steps`` counts ``engine.step()`` calls, ``global_steps`` optimizer steps
(overflow-skipped ones included). Tested side by side with DeepSpeed's own engine
(``tests/distributed/test_ds_counters.py``).
"""

from __future__ import annotations

from zerobench.zero.checkpoint_dir import load_tagged, save_tagged


class DeepSpeedSurface:
    """Mixin of ``ZeroEngine`` (it reads the engine's ``config``, ``stage``, ``module``, ``optimizer``,
    ``micro_steps`` and ``last_grad_norm``)."""

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

    def was_step_applied(self) -> bool:
        """Whether the latest step updated the parameters (not inside a window, nor on an fp16 overflow)."""
        return self.optimizer.applied

    def get_global_grad_norm(self) -> float | None:
        """The latest step's global gradient norm; None unless clipping computed one (DeepSpeed's: every step)."""
        return self.last_grad_norm

    def __call__(self, *args, **kwargs):
        """``engine(batch)``: the model's forward, as DeepSpeed's engine."""
        return self.module(*args, **kwargs)

    def train(self, mode: bool = True) -> DeepSpeedSurface:
        """``model.train(mode)``; returns the engine (``eval()`` is ``train(False)``), as DeepSpeed's."""
        self.module.train(mode)
        return self

    def eval(self) -> DeepSpeedSurface:
        return self.train(False)

    def save_checkpoint(self, save_dir, tag: str | None = None, client_state: dict | None = None):
        """On every rank: ``save_dir/<tag>`` and ``save_dir/latest``, as DeepSpeed's (``zero/checkpoint_dir.py``)."""
        return save_tagged(self, save_dir, tag, client_state)

    def load_checkpoint(self, load_dir, tag: str | None = None):
        """On every rank: (the checkpoint's path, its client state); (None, None) when there is no ``latest``."""
        return load_tagged(self, load_dir, tag)
