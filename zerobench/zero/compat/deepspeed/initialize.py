"""``zerobench.zero.initialize``: DeepSpeed's ``deepspeed.initialize`` for users who bring a DeepSpeed
configuration, on zerobench's engine.

It reads the config (``zero/compat/deepspeed/config.py``), applies ZeRO to the model with ``apply_zero`` and returns
what DeepSpeed returns: ``(engine, optimizer, training_dataloader, lr_scheduler)``. The loop is DeepSpeed's::

    engine, optimizer, loader, _ = zerobench.zero.initialize(model=model, config="ds_config.json",
                                                             model_parameters=model.parameters(),
                                                             training_data=dataset)
    for x, y in loader:
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()

The config trains as it does under DeepSpeed: DeepSpeed's defaults where a key is absent (``gradient_clipping`` 1.0,
fp16's hysteresis 2 and window 1000) and its rule for moving the fp16 loss scale
(``zero/compat/deepspeed/precision.py``), where ``apply_zero``'s ``ZeroConfig`` defaults to no clipping and torch's
``GradScaler`` rule.

As DeepSpeed, ``model_parameters`` are the optimizer's groups (the config's weight decay on every parameter
given); without them the model's parameters are one group, and the config's weight decay reaches every one of
them, biases and norms included, as DeepSpeed's engine takes ``module.parameters()`` (``apply_zero``'s own
default decays 2+-dim parameters only). The default process group is initialised from torchrun's or Slurm's
environment where nothing has initialised it (``zerobench.distributed.env``; a world of one without either), as
``deepspeed.init_distributed``; the engine uses the group passed as ``dp_group`` (default: the whole world). A
model on the CPU goes to this rank's GPU where there is one, as DeepSpeed moves it.
"""

from __future__ import annotations

import datetime
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group
from zerobench.zero.compat.deepspeed.client import check_scheduler, client_groups, rebind, share_groups
from zerobench.zero.compat.deepspeed.config import from_deepspeed
from zerobench.zero.compat.deepspeed.lr_schedules import build
from zerobench.zero.compat.deepspeed.mpu import mpu_groups, warn_if_unmarked
from zerobench.zero.compat.deepspeed.values import DeepSpeedAssertionError
from zerobench.zero.config import Precision


def _init_distributed() -> torch.device:
    """The default process group from torchrun's or Slurm's environment where nothing has initialised it (a world
    of one on an in-memory store without either: no port to collide on), with DeepSpeed's collective timeout
    (``distributed.env.deepspeed_timeout_s``); this rank's device."""
    from zerobench.distributed.env import choose_backend, deepspeed_timeout_s, default_device, detect, init_distributed

    denv = detect()
    if dist.is_initialized():  # the caller's group, with the caller's timeout
        return init_distributed(denv)
    timeout_s = deepspeed_timeout_s()
    if denv.source == "single" and not dist.is_initialized():  # a plain `python train.py`
        device = default_device(0)
        dist.init_process_group(
            choose_backend("auto", device, 1, torch.cuda.device_count()),
            store=dist.HashStore(),
            rank=0,
            world_size=1,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
        return device
    return init_distributed(denv, timeout_s=timeout_s)


def _config_of(args, model, config):
    """(model, config) from DeepSpeed's arguments: ``args.deepspeed_config`` (``deepspeed.add_config_arguments``'
    flag) or ``config``; zerobench's own order ``initialize(model, config)`` is read too."""
    if isinstance(args, nn.Module):  # initialize(model) or initialize(model, config)
        args, model, second = None, args, model
        if second is not None and not isinstance(second, (dict, str, Path)):
            raise ConfigError(
                f"initialize(model, config): the second argument is a {type(second).__name__}, not a "
                "DeepSpeed config (a dict or a JSON file's path)"
            )
        if second is not None and config is not None:
            raise ConfigError("initialize: the config came twice (as the second argument and as config=): give one")
        config = second if second is not None else config
    from_args = getattr(args, "deepspeed_config", None) or getattr(args, "deepscale_config", None)
    if from_args is not None and config is not None:
        raise ConfigError("initialize: a DeepSpeed config came both in args.deepspeed_config and as config=: give one")
    if not isinstance(model, nn.Module):  # DeepSpeed asserts it: an AssertionError too
        raise DeepSpeedAssertionError(f"initialize: model= must be a torch.nn.Module, not {type(model).__name__}")
    return model, config if config is not None else from_args


def _take_over(model: nn.Module) -> None:
    """A model an earlier engine trains is handed over, as DeepSpeed's second ``initialize`` on one model builds a
    new engine from the module's current values (its tests resume so): the earlier engine is destroyed (every rank
    calls ``initialize``, so its stage-3 gather is collective) and its optimizer state does not carry over. A warning
    says so; ``engine.destroy()`` before the call says it is meant."""
    from zerobench.zero.registry import engine_of

    engines = [engine_of(m) for m in model.modules()] + [engine_of(p) for p in model.parameters()]
    earlier = {id(e): e for e in engines if e is not None}
    mine = {id(m) for m in model.modules()}
    if any(id(e.module) not in mine for e in earlier.values()):
        raise ConfigError(
            "initialize: the model is part of a larger model an engine trains: initialize that whole model, or "
            "destroy its engine first (engine.destroy())"
        )
    if earlier:
        warnings.warn(
            "initialize: the model is trained by an earlier engine; that engine is destroyed and the new one starts "
            "from the model's current values (the earlier optimizer state does not carry over). Call "
            "engine.destroy() first to say it is meant",
            stacklevel=3,
        )
    for engine in earlier.values():
        engine.destroy()


def initialize(
    args=None,
    model: nn.Module | None = None,
    optimizer=None,
    model_parameters=None,
    training_data=None,
    lr_scheduler=None,
    distributed_port=None,
    mpu=None,
    dist_init_required=None,
    collate_fn=None,
    config=None,
    mesh_param=None,
    config_params=None,
    *,
    dp_group=None,
    units=None,
    external_params=None,
):
    """``deepspeed.initialize`` on zerobench's engine: apply ZeRO to ``model`` as the DeepSpeed config says.

    The arguments are ``deepspeed.initialize``'s, in its order; the keyword-only ones are zerobench's.

    Args:
        args: an argparse namespace; its ``deepspeed_config`` is the config when ``config`` is not given.
        model: the plain model to train.
        optimizer: None (the engine builds AdamW from the config's ``optimizer`` section), or the client's: a fresh
            ``torch.optim.AdamW`` or a callable building one from ``model_parameters``, whose param groups the
            engine trains (``client.py``; the returned optimizer is the engine's).
        model_parameters: the optimizer's parameters or groups (the config's weight decay on every one given;
            default: all the model's, as DeepSpeed's).
        training_data: a dataset, returned as a loader of micro-batches of this rank's share.
        lr_scheduler: None (the config's ``scheduler`` section, if any), a callable ``fn(optimizer)`` returning a
            scheduler over the engine's optimizer, or a scheduler built on the client optimizer (rebound to the
            engine's). Either becomes ``engine.lr_scheduler``: stepped after every optimizer step that was applied
            (do not step it yourself), its state saved and loaded with the engine's checkpoints.
        distributed_port: unused (torchrun's or Slurm's variables say where to meet).
        mpu: the model-parallel groups, as DeepSpeed takes them (Megatron's ``mpu``, ``megatron.core.parallel_state``,
            or a zerobench ``Mesh``): the data-parallel group, and the tensor-parallel group the gradient norm and
            overflow check span, counting the parameters marked ``tensor_model_parallel`` once per TP rank. A model
            holding marked shards without it is refused (``apply_zero``'s rule).
        dist_init_required: ``False``: a process group must exist already.
        collate_fn: the loader's, as DeepSpeed's.
        config: a DeepSpeed config dict or a JSON file's path.
        mesh_param: refused in one line.
        config_params: DeepSpeed's older name for ``config``.
        dp_group: the data-parallel group (default: ``mpu``'s, else the whole world).
        units: stage 3's gather units (``apply_zero``'s). Default: ``model.blocks``, else every entry of the
            model's lists of layers (``layer_units``), so that, as in DeepSpeed, no forward gathers the whole model;
            ``[]``: the whole model one unit.
        external_params: parameters read outside their stage-3 unit (``apply_zero``'s).

    Returns:
        ``(engine, optimizer, training_dataloader, lr_scheduler)`` as DeepSpeed returns them: a ``DeepSpeedEngine``,
        its optimizer, the loader (None without ``training_data``) and the scheduler (or None).

    Raises:
        ConfigError: one line for an invalid or unsupported config key, a batch triple that does not resolve, or an
            argument DeepSpeed takes that zerobench does not.
    """
    from zerobench.zero.api import apply_zero, layer_units, resolve_units
    from zerobench.zero.state.transaction import agree
    from zerobench.zero.units import assign_units, resolve_external

    del distributed_port
    model, config = _config_of(args, model, config if config is not None else config_params)
    if config is None:
        raise ConfigError("initialize: give config= (a DeepSpeed config dict or a JSON file's path)")
    if mesh_param is not None:
        raise ConfigError(
            "initialize: mesh_param= (DeepSpeed's device-mesh shape) is not taken: give the groups as mpu= (Megatron's "
            "mpu or a zerobench Mesh) or the data-parallel group as dp_group="
        )
    dp_group, tp_group = mpu_groups(mpu, dp_group)
    if dist_init_required is False and not dist.is_initialized():
        raise ConfigError(
            "initialize: dist_init_required=False but no process group exists: initialise one first "
            "(torch.distributed.init_process_group) or leave dist_init_required unset"
        )
    client, groups = None, None if model_parameters is None else list(model_parameters)
    if optimizer is not None:
        client, groups = client_groups(optimizer, model, groups)
    elif groups is None:  # DeepSpeed's engine takes module.parameters(): one group the config's weight decay
        groups = list(model.parameters())  # reaches whole, biases and norms too (apply_zero's decays 2+-dim ones)
    built = lr_scheduler is not None and check_scheduler(lr_scheduler, client)  # before any collective
    device = _init_distributed()
    group = Group.coerce(dp_group, "dp", "initialize's dp_group")
    cfg = from_deepspeed(config, group.size, client_optimizer=client is not None)
    if device.type == "cuda" and all(p.device.type == "cpu" for p in model.parameters()):
        model.to(device)
    if units is None and cfg.zero.stage == 3:  # DeepSpeed never gathers the whole model: one layer at a time
        units = layer_units(model) or None  # none found: apply_zero's default, and its warning
    external = resolve_external(model, external_params)  # (what apply_zero would refuse, refused before the takeover)
    if cfg.zero.stage == 3:
        assign_units(model, resolve_units(model, units), external)
    _take_over(model)
    warn_if_unmarked(model, tp_group)
    engine = apply_zero(
        model, group, cfg.zero, units=units, tp_group=tp_group, param_groups=groups, external_params=external_params
    )
    failed = None
    try:
        done = _finish(engine, cfg, training_data, collate_fn, client, lr_scheduler, built)
    except Exception as e:  # noqa: BLE001 - every rank must reach the agreement below, whatever went wrong here
        failed = e
    # A refusal after the engine was built, on any rank, leaves the model plain with its values on every rank (the
    # ranks agree first: destroying gathers at stage 3).
    if agree(engine, int(failed is not None)):
        engine.destroy()
        raise failed if failed is not None else ConfigError("initialize failed on another rank (its error says why)")
    return done


def _finish(engine, cfg, training_data, collate_fn, client, lr_scheduler, built):
    """``initialize``'s rest once the engine exists: DeepSpeed's names, the loader, the optimizer and scheduler."""
    from zerobench.zero.compat.deepspeed.engine import as_deepspeed

    engine = as_deepspeed(engine, cfg.micro_batch)
    engine.tag_validation = cfg.tag_validation
    engine.skip_nonfinite = cfg.skip_nonfinite  # DeepSpeed's optimizers skip a non-finite window outside fp16 too
    engine.cast_forward_inputs = cfg.cast_inputs  # DeepSpeed's engine casts no input, but under fp16.auto_cast
    # and compute the global norm at every step, clipping or not; only fp32 stage 0 steps a plain torch optimizer
    engine.always_norm = cfg.zero.stage > 0 or cfg.zero.precision is not Precision.FP32
    engine.gather_16bit_on_save = cfg.gather_16bit_on_save
    engine.unused_hint = "set zero_optimization.ignore_unused_parameters to true in the DeepSpeed config"
    engine.count_micro_batches_in_steps()  # as DeepSpeed's engine: a micro-batch ends at step()
    engine.collate_fn, engine.drop_last = collate_fn, cfg.drop_last
    loader = None if training_data is None else engine.deepspeed_io(training_data)
    engine.training_dataloader = loader
    if client is not None:
        share_groups(client, engine.optimizer)
    scheduler = None
    if built:
        scheduler = rebind(lr_scheduler, engine.optimizer)
    elif lr_scheduler is not None:  # the caller's first, as DeepSpeed's; else the config's
        scheduler = lr_scheduler(engine.optimizer)
    elif cfg.scheduler is not None:
        scheduler = build(cfg.scheduler, engine.optimizer)
    if scheduler is not None:
        engine.lr_scheduler = scheduler  # stepped after every applied optimizer step; checkpoints hold its state
    return engine, engine.optimizer, loader, scheduler
