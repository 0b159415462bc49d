"""The engine DeepSpeed users hold: a ``ZeroEngine`` with DeepSpeed's engine names.

``zerobench.zero.initialize`` returns one; ``as_deepspeed(engine)`` gives them to an engine ``apply_zero`` (or
``parallelize``) built, by making the same object a ``DeepSpeedEngine``: nothing is copied and every hook stays. The
names are DeepSpeed's: ``engine(batch)``, its queries and counters (``get_lr()``, ``train_batch_size()``,
``global_samples``, ``gradient_clipping()``, ...), ``train()``/``eval()``, tagged
``save_checkpoint``/``load_checkpoint`` (``checkpoints.py``), ``save_16bit_model``, at stage 3 the parameters'
``ds_shape``/``ds_numel``, the fp16 optimizers' loss-scale names on ``engine.optimizer`` (``cur_scale``, ...), and,
as DeepSpeed's engine
passes them through to its module, the module's attributes under every other name (``engine.parameters()``, a
model's own methods). The core engine keeps a closed surface of its own; this layer is composed on top of it and the
core never imports it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from pathlib import Path

import torch

from zerobench.config import ConfigError
from zerobench.distributed.env import detect
from zerobench.zero.compat.deepspeed.checkpoints import load_tagged, save_tagged
from zerobench.zero.compat.deepspeed.data import loader
from zerobench.zero.compat.deepspeed.lr_schedules import scheduler_call, step_after_steps
from zerobench.zero.compat.deepspeed.optimizer import DeepSpeedOptimizer
from zerobench.zero.compat.deepspeed.stage3_module import mark_partitioned, sync_generate, unsync_generate
from zerobench.zero.config import LossScaleRule
from zerobench.zero.engine import ZeroEngine
from zerobench.zero.grads.accumulation import StepInsideNoSync
from zerobench.zero.interop.teardown import check_live
from zerobench.zero.optim.torch_optimizer import ZeroOptimizer
from zerobench.zero.state.export import full_state_dict, save_whole
from zerobench.zero.state.transaction import CheckpointSaveError, agree

_MISSING = object()


class NoSyncReentry(RuntimeError, AssertionError):
    """``engine.no_sync()`` entered inside itself: an ``AssertionError``, as DeepSpeed's engine asserts it."""


class DeepSpeedEngine(ZeroEngine):
    """A ``ZeroEngine`` with DeepSpeed's engine names (see the module docstring). Counters: ``micro_steps`` counts
    ``step()`` calls, ``global_steps`` optimizer steps (skipped ones included), ``skipped_steps`` those skipped on a
    non-finite gradient (an fp16 overflow, or ``skip_nonfinite``'s); the batch sizes are the config ``initialize``
    read. Made by ``as_deepspeed``, never constructed."""

    _lr_scheduler = None
    _scheduler_hook = None
    micro_batch: int | None = None
    """Samples per DP rank in one micro-batch, from the DeepSpeed config (None from ``as_deepspeed``)."""
    tag_validation = "WARN"
    """``checkpoint.tag_validation`` of the DeepSpeed config: what ``save_checkpoint`` does with ranks' differing
    tags (``checkpoints.validate_tag``)."""
    training_dataloader = None
    """The loader ``initialize`` made of ``training_data`` (DeepSpeed's attribute; None without one)."""
    collate_fn = None
    """``initialize``'s ``collate_fn``: ``deepspeed_io``'s default."""
    drop_last = False
    """``dataloader_drop_last`` of the DeepSpeed config: loaders leave out a last, partial micro-batch."""
    _samples_at = (0, 0)
    """(``global_steps``, ``global_samples``) when the batch size last changed or a checkpoint was loaded: steps since
    count at the current ``train_batch_size()``."""

    @property
    def lr_scheduler(self):
        """The learning-rate scheduler: ``initialize``'s, or whatever is assigned later, as DeepSpeed steps what
        this attribute holds. It is stepped after every optimizer step that was applied and kept in checkpoints;
        None steps none."""
        return self._lr_scheduler

    @lr_scheduler.setter
    def lr_scheduler(self, scheduler) -> None:
        self._lr_scheduler = scheduler
        if scheduler is not None and self._scheduler_hook is None:
            self._scheduler_hook = step_after_steps(self)

    def __call__(self, *args, **kwargs):
        """``engine(batch)``: the model's forward."""
        return self.module(*args, **kwargs)

    def __getattr__(self, name: str):
        """A name the engine lacks: the module's attribute, as DeepSpeed's engine passes it through (read once: a
        property may gather). Private and dunder names are never passed, so ``copy``, ``pickle`` and ``hasattr``
        probes behave."""
        module = self.__dict__.get("module")
        if not name.startswith("_") and (found := getattr(module, name, _MISSING)) is not _MISSING:
            return found
        where = f" nor has its module ({type(module).__name__})" if module is not None else ""
        raise AttributeError(f"'{type(self).__name__}' object has no attribute {name!r}{where}")

    def destroy(self) -> None:
        """``ZeroEngine.destroy``, and the module's ``generate`` is its class's again (``stage3_module``)."""
        super().destroy()
        unsync_generate(self.module)

    @contextlib.contextmanager
    def no_sync(self):
        """``ZeroEngine.no_sync``; entered again inside itself, an ``AssertionError``, as DeepSpeed's engine asserts
        (DDP's nests)."""
        if self.window.suspended:
            raise NoSyncReentry(
                "no_sync context manager reentry is unsupported: engine.no_sync() is already entered; use one "
                "no_sync() block"
            )
        with super().no_sync():
            yield

    def backward(self, loss: torch.Tensor, retain_graph: bool = False, scale_wrt_gas: bool = True) -> torch.Tensor:
        """The engine's backward (``ZeroEngine.backward``); returns what DeepSpeed's returns: ``loss`` divided by
        ``gradient_accumulation_steps()`` (``scale_wrt_gas``), the share of the window's loss this micro-batch
        is, which a script summing the returns over a window logs as the window's mean."""
        super().backward(loss, retain_graph, scale_wrt_gas)
        return loss / self.config.grad_accum_steps if scale_wrt_gas else loss

    def step(self, lr_kwargs: dict | None = None) -> bool:
        """``ZeroEngine.step``; ``lr_kwargs`` go to the scheduler's ``step`` after an applied optimizer step, as
        DeepSpeed's ``engine.step(lr_kwargs=...)`` passes them (checked against it first: ``scheduler_call``).
        With the boundary set to False by hand (``set_gradient_accumulation_boundary``) it is not a boundary: nothing
        is stepped, as DeepSpeed's; so with windows counted in ``step()`` calls (``initialize``'s engine:
        ``count_micro_batches_in_steps``) before the window's last micro-batch."""
        if self.window.suspended:  # as DeepSpeed's, even where no step would run, in the words its tests match
            raise StepInsideNoSync(
                "It is illegal to call Engine.step() inside no_sync context manager: engine.step() inside no_sync() "
                "finds the window's gradients not synchronised yet; leave the no_sync() context first, and run the "
                "window's last backward outside it"
            )
        call = scheduler_call(self.lr_scheduler, lr_kwargs, self.train_batch_size)
        counted = self.window.boundary is None and self.window.rule is not None
        if self.window.boundary is False or (counted and not self.is_gradient_accumulation_boundary()):
            check_live(self, "step()")
            self.micro_steps += 1
            self.optimizer.applied = self.optimizer.overflow = False
            return False
        self._lr_call = call
        try:
            return super().step()
        finally:
            self._lr_call = None

    def dynamic_loss_scale(self) -> bool:
        """Whether the loss scale moves (DeepSpeed's: its configured ``loss_scale`` is 0, its default, which it
        reports outside fp16 too)."""
        return self.scaler.cfg.rule is not LossScaleRule.STATIC

    def set_train_micro_batch_size(self, micro_batch_size: int) -> None:
        """DeepSpeed's: the samples per DP rank in one micro-batch from now on (``train_batch_size()`` follows;
        the accumulation steps stay)."""
        if isinstance(micro_batch_size, bool) or not isinstance(micro_batch_size, int) or micro_batch_size < 1:
            raise ConfigError(f"set_train_micro_batch_size: give a positive integer, not {micro_batch_size!r}")
        self._samples_at = (self.global_steps, self.global_samples)  # steps so far counted at the old size
        self.micro_batch = micro_batch_size

    def set_train_batch_size(self, train_batch_size: int) -> None:
        """DeepSpeed's: the samples per optimizer step over the DP group from now on, reached by changing the
        accumulation steps (the micro-batch stays). It must be a multiple of micro-batch x DP ranks (a
        ``ValueError``, as DeepSpeed's), and it changes only between windows: inside one, micro-batches already
        run were scaled by the old count, and the step would average them wrongly (DeepSpeed does not check)."""
        per = self.train_micro_batch_size_per_gpu() * self.group.size
        if isinstance(train_batch_size, bool) or not isinstance(train_batch_size, int) or train_batch_size < 1:
            raise ConfigError(f"set_train_batch_size: give a positive integer, not {train_batch_size!r}")
        if train_batch_size % per:
            raise ValueError(
                f"set_train_batch_size({train_batch_size}): give a multiple of micro-batch "
                f"{self.train_micro_batch_size_per_gpu()} x {self.group.size} DP rank(s) = {per}"
            )
        if self.window.open or self.grads.reduced:  # mid-window, or a window complete but not stepped yet
            run = self.window.open or self.config.grad_accum_steps
            raise RuntimeError(
                f"set_train_batch_size() inside an accumulation window ({run} of "
                f"{self.config.grad_accum_steps} micro-batches run): call it after the step() that ends the window"
            )
        gas = train_batch_size // per
        self._samples_at = (self.global_steps, self.global_samples)  # steps so far counted at the old size
        self.config = dataclasses.replace(self.config, grad_accum_steps=gas)
        self.window.accum, self.window.counted = gas, 0
        self.window.counted_from = self.micro_steps

    def get_lr(self) -> list[float]:
        """Each param group's learning rate."""
        return [g["lr"] for g in self.optimizer.param_groups]

    def get_mom(self) -> list[tuple[float, float]]:
        """Each param group's Adam betas (DeepSpeed's name: a schedule such as OneCycle moves beta1)."""
        return [tuple(g["betas"]) for g in self.optimizer.param_groups]

    def train_micro_batch_size_per_gpu(self) -> int:
        """Samples per DP rank in one micro-batch, from the DeepSpeed config ``initialize`` read."""
        if self.micro_batch is None:
            raise ConfigError(
                "train_micro_batch_size_per_gpu(): this engine was given no batch size (initialize() reads it from "
                "the config; as_deepspeed(engine, micro_batch=N) takes it)"
            )
        return self.micro_batch

    def train_batch_size(self) -> int:
        """Samples per optimizer step over the DP group: micro-batch x accumulation steps x DP ranks."""
        return self.train_micro_batch_size_per_gpu() * self.config.grad_accum_steps * self.group.size

    def dataloader_drop_last(self) -> bool:
        """The config's ``dataloader_drop_last``."""
        return self.drop_last

    def deepspeed_io(
        self,
        dataset,
        batch_size=None,
        route="train",
        pin_memory=True,
        data_sampler=None,
        collate_fn=None,
        num_local_io_workers=None,
    ):
        """DeepSpeed's loader of ``dataset`` (``data.loader``): this DP rank's micro-batches of
        ``train_micro_batch_size_per_gpu()`` (or ``batch_size``) samples, shuffled on the ``"train"`` route and in order
        on ``"eval"`` and ``"predict"``, through ``data_sampler`` where one is given; ``collate_fn`` defaults to
        ``initialize``'s."""
        return loader(
            dataset,
            batch_size=self.train_micro_batch_size_per_gpu() if batch_size is None else batch_size,
            group=self.group,
            drop_last=self.drop_last,
            collate_fn=self.collate_fn if collate_fn is None else collate_fn,
            data_sampler=data_sampler,
            route=route,
            pin_memory=pin_memory,
            num_workers=num_local_io_workers or 0,
        )

    def get_batch_info(self) -> tuple[int, int, int]:
        """(``train_batch_size``, ``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``), as
        DeepSpeed's."""
        return self.train_batch_size(), self.train_micro_batch_size_per_gpu(), self.gradient_accumulation_steps()

    @property
    def global_samples(self) -> int:
        """Samples trained over the DP group: ``train_batch_size()`` per optimizer step at the batch size it ran with,
        as DeepSpeed counts them (an fp16 step skipped on an overflow included); checkpoints keep it, so a run resumed
        at another DP size or batch size goes on from the saved count."""
        steps, samples = self._samples_at
        return samples + (self.global_steps - steps) * self.train_batch_size()

    @property
    def skipped_steps(self) -> int:
        """Optimizer steps skipped on a non-finite gradient: fp16 overflows, and outside fp16 those ``skip_nonfinite``
        skips (DeepSpeed's counter)."""
        return self.scaler.skipped_steps

    @property
    def local_rank(self) -> int:
        """This process's rank on its node (torchrun's ``LOCAL_RANK``, Slurm's ``SLURM_LOCALID``; 0 without either)."""
        return detect().local_rank

    def is_gradient_accumulation_boundary(self) -> bool:
        """Whether the current micro-batch ends a window: the boundary set by hand
        (``set_gradient_accumulation_boundary``), else counted in ``step()`` calls (since the accumulation steps
        were last set)."""
        if self.window.boundary is not None:
            return self.window.boundary
        return (self.micro_steps - self.window.counted_from + 1) % self.config.grad_accum_steps == 0

    def count_micro_batches_in_steps(self) -> None:
        """Count a window's micro-batches in ``step()`` calls, as DeepSpeed's engine does (``initialize`` sets it):
        every backward between two ``step()`` calls belongs to one micro-batch (two losses, or a ``retain_graph``
        backward, before one ``step()``), and the window ends with the ``gradient_accumulation_steps()``-th. Counted
        in backward calls, such a loop stepped every micro-batch, on part of the window's gradient."""
        self.window.rule = self.is_gradient_accumulation_boundary

    def set_gradient_accumulation_boundary(self, is_boundary: bool) -> None:
        """DeepSpeed's (what Accelerate calls before every backward, with its ``sync_gradients``): from now on
        each backward ends its window (True: it synchronises, and ``step()`` steps, however many micro-batches the
        window had) or does not (False: one more micro-batch of the window; ``step()`` does nothing). Gradients
        stay averaged by ``gradient_accumulation_steps()``, as DeepSpeed's."""
        if not isinstance(is_boundary, bool):
            raise ConfigError(f"set_gradient_accumulation_boundary: give True or False, not {is_boundary!r}")
        self.window.boundary = is_boundary

    def gradient_accumulation_steps(self) -> int:
        return self.config.grad_accum_steps

    def gradient_clipping(self) -> float:
        """The global gradient norm ``step()`` clips to; 0.0 when it does not clip (DeepSpeed's config value: 1.0
        where ``initialize``'s config leaves ``gradient_clipping`` out, as DeepSpeed's default)."""
        return self.config.clip_grad_norm or 0.0

    def zero_optimization_stage(self) -> int:
        return self.stage

    def zero_optimization(self) -> bool:
        return self.stage > 0

    def zero_optimization_partition_gradients(self) -> bool:
        return self.stage >= 2

    def zero_optimization_partition_weights(self) -> bool:
        return self.stage == 3

    def fp16_enabled(self) -> bool:
        return self.param_dtype == torch.float16

    def bfloat16_enabled(self) -> bool:
        return self.param_dtype == torch.bfloat16

    def was_step_applied(self) -> bool:
        """Whether the latest step updated the parameters (not inside a window, nor skipped on a non-finite
        gradient)."""
        return self.optimizer.applied

    def get_global_grad_norm(self) -> float | None:
        """The latest window's global gradient norm, before clipping: measured at every step under ``always_norm``
        (``initialize`` sets it where DeepSpeed's optimizers measure it), else only where clipping measured one."""
        return self.last_grad_norm

    def train(self, mode: bool = True):
        """``model.train(mode)``; returns the engine (``eval()`` is ``train(False)``)."""
        self.module.train(mode)
        return self

    def eval(self):
        return self.train(False)

    def save_checkpoint(
        self,
        save_dir,
        tag: str | None = None,
        client_state: dict | None = None,
        save_latest: bool = True,
        exclude_frozen_parameters: bool = False,
    ) -> Path:
        """``save_dir/<tag>`` and ``save_dir/latest``, with DeepSpeed's options (``checkpoints.py``); collective. The
        options are named in the signature, as DeepSpeed's are: HF's Trainer passes ``exclude_frozen_parameters``
        only where ``inspect.signature`` shows it."""
        check_live(self, "save_checkpoint()")
        return save_tagged(self, save_dir, tag, client_state, save_latest, exclude_frozen_parameters)

    def load_checkpoint(
        self,
        load_dir,
        tag: str | None = None,
        load_module_strict: bool = True,
        load_optimizer_states: bool = True,
        load_lr_scheduler_states: bool = True,
        load_module_only: bool = False,
        custom_load_fn=None,
    ):
        """(its path, its client state); (None, None) without ``latest``; DeepSpeed's arguments, in its order
        (``checkpoints.load_tagged``). The load restarts the accumulation window (``restart_window``).
        ``custom_load_fn`` is taken as None only."""
        check_live(self, "load_checkpoint()")
        if custom_load_fn is not None:
            raise ConfigError("load_checkpoint(custom_load_fn=...): zerobench loads its own shards; leave it None")
        options = dict(
            load_module_strict=load_module_strict,
            load_optimizer_states=load_optimizer_states,
            load_lr_scheduler_states=load_lr_scheduler_states,
            load_module_only=load_module_only,
        )
        return load_tagged(self, load_dir, tag, **options)

    gather_16bit_on_save = False
    """``stage3_gather_16bit_weights_on_model_save`` of the DeepSpeed config (``initialize`` sets it)."""
    _is_compiled = False

    def zero_gather_16bit_weights_on_model_save(self) -> bool:
        """DeepSpeed's: whether the config asks a stage-3 save to gather the 16-bit weights; Accelerate's and HF
        Trainer's ``get_state_dict`` read it before ``_zero3_consolidated_16bit_state_dict()`` (false: they save a
        checkpoint instead)."""
        return self.gather_16bit_on_save

    def _zero3_consolidated_16bit_state_dict(self, exclude_frozen_parameters: bool = False) -> dict | None:
        """DeepSpeed's: the whole state dict in the training dtype on the host, on DP rank 0, None on the others;
        stage 3 only (as DeepSpeed's, which raises ``ValueError`` below it). Collective: call it on every rank."""
        check_live(self, "_zero3_consolidated_16bit_state_dict()")
        if self.stage < 3:
            raise ValueError("this function requires ZeRO-3 mode")
        sd = full_state_dict(self, exclude_frozen_parameters=exclude_frozen_parameters)
        return sd if self.group.rank == 0 else None

    def compile(self, backend=None, compile_kwargs: dict | None = None, schedule=None, compiled_autograd_enabled=False):
        """DeepSpeed's ``engine.compile``: the module compiled in place (``nn.Module.compile``) with ``backend``
        (torch's default where None) and ``compile_kwargs``; the engine's hooks stay eager (``docs/engine.md``). A
        second call does nothing. DeepCompile's ``schedule`` and compiled autograd are refused in one line."""
        check_live(self, "compile()")
        if schedule is not None or compiled_autograd_enabled:
            raise ConfigError(
                "engine.compile(): DeepCompile schedules and compiled autograd are DeepSpeed's own passes, not "
                "supported here; call engine.compile(backend=..., compile_kwargs=...) without them"
            )
        if self._is_compiled:
            return
        kwargs = dict(compile_kwargs or {})
        if backend is not None:
            kwargs["backend"] = backend
        self.module.compile(**kwargs)
        self._is_compiled = True

    @property
    def is_compiled(self) -> bool:
        return self._is_compiled

    def save_16bit_model(
        self, save_dir: str | os.PathLike, save_filename: str = "pytorch_model.bin", exclude_frozen_parameters=False
    ) -> bool:
        """``full_state_dict`` in the training dtype, written by DP rank 0 to ``save_dir/save_filename`` through a
        temporary file (a reader never sees half of it). Call it on every rank; True once the file is written.

        A ``save_dir`` that is a file, or a target that is a directory, is one line on every rank before anything is
        gathered. Every rank learns whether the write succeeded: rank 0 raises its own error, the others
        ``CheckpointSaveError`` naming it (a barrier would leave them to fail in their next collective)."""
        check_live(self, "save_16bit_model()")
        if not save_filename or Path(save_filename).name != save_filename:
            raise ConfigError(f"save_filename {save_filename!r} must be one file name (no directory)")
        target = Path(save_dir) / save_filename
        if Path(save_dir).exists() and not Path(save_dir).is_dir():
            raise ConfigError(f"save_16bit_model: save_dir {save_dir} is a file: give a directory")
        if target.is_dir():
            raise ConfigError(f"save_16bit_model: {target} is a directory: give another save_filename")
        sd = full_state_dict(self, exclude_frozen_parameters=exclude_frozen_parameters)
        failed = None
        if self.group.rank == 0:
            try:
                save_whole(sd, target)
            except OSError as e:
                failed = e
        if agree(self, 1 if failed is not None else 0):  # on return the file is there for every rank to read
            if failed is not None:
                raise failed
            raise CheckpointSaveError(f"DP rank 0 could not write {target}; see that rank's error")
        return True


def as_deepspeed(engine: ZeroEngine, micro_batch: int | None = None) -> DeepSpeedEngine:
    """``engine`` with DeepSpeed's engine names (the same object; see the module docstring). ``micro_batch``:
    samples per DP rank in one micro-batch, which ``train_batch_size()`` and ``global_samples`` need."""
    if not isinstance(engine, ZeroEngine):
        raise ConfigError(f"as_deepspeed takes the engine apply_zero returns, not a {type(engine).__name__}")
    if not isinstance(engine, DeepSpeedEngine):
        engine.__class__ = DeepSpeedEngine
        if type(engine.optimizer) is ZeroOptimizer:
            engine.optimizer.__class__ = DeepSpeedOptimizer
        if engine.stage == 3:
            mark_partitioned(engine)
            sync_generate(engine)
    if micro_batch is not None:
        engine.micro_batch = micro_batch
    return engine
