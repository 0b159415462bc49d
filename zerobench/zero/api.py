"""``apply_zero``: the one entry point that turns a plain model into a ZeRO-trained one."""

from __future__ import annotations

import warnings
from collections import Counter
from collections.abc import Collection

import torch
import torch.distributed as dist
from torch import nn

from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group
from zerobench.metrics.comm import CommLedger
from zerobench.zero.build import check_tp_marks, tp_sharded_names
from zerobench.zero.config import ZeroConfig
from zerobench.zero.engine import ZeroEngine
from zerobench.zero.registry import engine_of
from zerobench.zero.storage.allocator import Allocator
from zerobench.zero.units import UnitPlan, resolve_external


def default_units(model: nn.Module) -> list[nn.Module]:
    """Stage-3 gather units: every transformer block (``model.blocks``) if the model has them."""
    blocks = getattr(model, "blocks", None)
    return list(blocks) if isinstance(blocks, nn.ModuleList) else []


def resolve_units(model: nn.Module, units) -> list[nn.Module]:
    """``units`` as modules: None (``default_units``), a list of submodules, or a module class or tuple of
    classes (every outermost submodule of that class, in registration order, as FSDP's ``ModuleWrapPolicy``).
    """
    if units is None:
        return default_units(model)
    if isinstance(units, type) or (isinstance(units, tuple) and units and all(isinstance(c, type) for c in units)):
        found, inside = [], set()
        for m in model.modules():
            if m is not model and isinstance(m, units) and id(m) not in inside:
                found.append(m)
                inside.update(id(s) for s in m.modules())
        if not found:
            raise ConfigError(f"units={units!r}: the model has no submodule of that class")
        return found
    return list(units)


def _outermost_lists(model: nn.Module) -> dict[str, nn.ModuleList]:
    """Every outermost ``ModuleList`` of two or more entries that holds parameters (a list inside another, such as
    a block's experts, is part of its layer), by name, in registration order."""
    found: dict[str, nn.ModuleList] = {}
    for name, m in model.named_modules():
        if not isinstance(m, nn.ModuleList) or len(m) < 2 or any(name.startswith(f"{n}.") for n in found):
            continue
        if any(True for _ in m.parameters()):
            found[name] = m
    return found


def layer_lists(model: nn.Module) -> dict[str, nn.ModuleList]:
    """The model's lists of layers (``_outermost_lists``), less those that share their parent module with another:
    parallel lists (XLM's ``attentions``, ``ffns`` and norms, one entry of each per layer) run interleaved, and
    units must be listed in the order the forward runs them."""
    found = _outermost_lists(model)
    parents = Counter(n.rpartition(".")[0] for n in found)
    return {n: m for n, m in found.items() if parents[n.rpartition(".")[0]] == 1}


def layer_units(model: nn.Module) -> list[nn.Module]:
    """Stage-3 units as DeepSpeed's users expect them when they name none: ``model.blocks`` if the model has it,
    else every entry of its layer lists (``layer_lists``: a Hugging Face decoder's ``model.layers``, an
    encoder-decoder's two stacks), so that no forward gathers the whole model. DeepSpeed gathers each submodule
    as it runs; a layer is the coarsest grain that keeps its peak to about one layer's parameters."""
    found = default_units(model) or [layer for lst in layer_lists(model).values() for layer in lst]
    return list({id(m): m for m in found}.values())  # a layer listed twice (reused) is one unit


def warn_if_one_unit(model: nn.Module, units, stage: int) -> None:
    """Stage 3, ``units`` not given and no ``model.blocks``, but a list of layers there: warn that every
    forward gathers the whole model, naming the largest outermost ``ModuleList`` (by parameters)."""
    if stage != 3 or units is not None or default_units(model):
        return
    size = {n: sum(p.numel() for p in m.parameters()) for n, m in _outermost_lists(model).items()}
    if not size:
        return
    name = max(size, key=size.get)
    warnings.warn(
        f"ZeRO stage 3 with no units: {type(model).__name__} has no `blocks` ModuleList, so its whole model "
        f"is gathered for every forward and backward; pass its layers, e.g. apply_zero(..., "
        f"units=list(model.{name})) or units=<their class>",
        stacklevel=3,
    )


def apply_zero(
    model: nn.Module,
    dp_group: Group | dist.ProcessGroup | None,
    config: ZeroConfig,
    ledger: CommLedger | None = None,
    units: list[nn.Module] | type | tuple[type, ...] | None = None,
    tp_group: Group | dist.ProcessGroup | None = None,
    tp_sharded: Collection[str] = frozenset(),
    allocator: Allocator | None = None,
    param_groups=None,
    device=None,
    external_params=None,
) -> ZeroEngine:
    """Apply ZeRO ``config.stage`` to ``model`` over ``dp_group`` and return the engine that trains it.

    Apply it last, after tensor parallelism and activation checkpointing: ZeRO partitions whatever parameters the
    model holds at that point (``zerobench.parallel.parallelize`` applies TP, fused kernels, checkpointing and this
    in their one order). Every DP rank must pass the same model and config (checked at construction: a rank that
    differs fails with one line on every rank); DP rank 0's parameter and buffer values are broadcast to the others,
    as DDP does, so the ranks need not seed their initialisation alike. A model is trained by one engine: applying it
    twice is refused (``engine.destroy()`` hands the model back first).

    Args:
        model: a plain ``nn.Module``; its parameters become views of the engine's buffers.
        dp_group: the data-parallel group: a ``torch.distributed.ProcessGroup``, ``None`` for the default (world)
            group as DDP's ``process_group=None``, a 1-D ``DeviceMesh``, or a
            ``zerobench.distributed.collectives.Group``. With tensor parallelism, this TP rank's DP group.
        config: the stage, precision, buckets, loss scaling and AdamW settings (``ZeroConfig``).
        ledger: where the engine's collectives are recorded (default: a ledger of its own, ``engine.ledger``).
        units: stage 3's gather units, as modules or as a layer class (every outermost submodule of it, as FSDP's
            ``ModuleWrapPolicy``); default ``model.blocks``. Checked to be the model's at every stage (the same
            call then works at stage 3), used at stage 3 only.
        tp_group: the tensor-parallel group (``None``: no TP); gradient norms and overflow checks then span both
            groups, counting TP-sharded parameters once per TP rank and replicated ones once.
        tp_sharded: the names of the parameters TP shards (``TPInfo.sharded``).
        allocator: how host work and stage-3 resizes are accounted (default ``PlainAllocator``;
            ``zero/storage/allocator.py``).
        param_groups: the optimizer's groups as ``torch.optim`` takes them (dicts with ``params`` and any of ``lr``,
            ``betas``, ``eps``, ``weight_decay``), or a callable ``param_groups(model)`` returning them from the model
            as ZeRO receives it (after TP replaced its parameters). Default: one group, weight decay on 2+-dim
            parameters only (``zero/optim/param_groups.py``).
        device: where the engine's storage lives, for a model built on the meta device (default: the parameters'
            device); its values are then zero until initialised (``zerobench.parallel.init`` for the GPT,
            ``engine.gathered_params()`` or ``load_state_dict``).
        external_params: parameters (or their names) read outside the forward of the stage-3 unit that holds them
            (DeepSpeed's ``register_external_parameter``): the root unit owns them, gathered for the whole forward and
            backward. Without it such a read finds the freed (empty) parameter.

    Returns:
        The ``ZeroEngine``: ``engine.backward(loss)``/``engine.step()``, or ``loss.backward()``/
        ``engine.optimizer.step()``/``model.zero_grad()`` as under DDP (docs/engine.md). ``as_deepspeed(engine)``
        adds DeepSpeed's engine names.

    Raises:
        ConfigError: one line, on every rank, for an invalid config, a model the ranks disagree on, a model already
            trained by an engine, or a ``device`` for a model that is not on the meta device.
    """
    if not isinstance(model, nn.Module):
        raise ConfigError(f"apply_zero's model must be a torch.nn.Module, not {type(model).__name__}")
    if not isinstance(config, ZeroConfig):
        raise ConfigError(
            f"apply_zero's config must be a ZeroConfig (zerobench.zero.ZeroConfig(stage=2, ...)), not "
            f"{type(config).__name__}; a DeepSpeed config dict goes to zerobench.zero.initialize(config=...)"
        )
    dp_group = Group.coerce(dp_group, "dp", "apply_zero's dp_group")
    tp_group = None if tp_group is None else Group.coerce(tp_group, "tp", "apply_zero's tp_group")
    for name, m in model.named_modules():  # a second engine would hook the same parameters: twice the reduction
        if engine_of(m) is not None:
            raise ConfigError(
                f"{'the model' if not name else f'its submodule {name!r}'} is already trained by a ZeRO "
                "engine (apply_zero was called on it before): apply it once, or build a fresh model"
            )
    taken = next((n for n, p in model.named_parameters() if engine_of(p) is not None), None)
    if taken is not None:  # the model is part of a larger one an engine trains
        raise ConfigError(
            f"the model's parameter {taken!r} is already trained by a ZeRO engine (of a model this one is part "
            "of): apply it to the whole model once, or destroy that engine first (engine.destroy())"
        )
    warn_if_one_unit(model, units, config.stage)
    plan = UnitPlan(resolve_units(model, units), resolve_external(model, external_params))
    device = None if device is None else torch.device(device)
    placed = {p.device for p in model.parameters() if not p.is_meta}
    if device is not None and any(d != device and (device.index is not None or d.type != device.type) for d in placed):
        raise ConfigError(
            f"apply_zero(device={device}) is for a model built on the meta device; this one has parameters "
            f"on {', '.join(sorted(map(str, placed)))}: move the model there first (model.to(device))"
        )
    sharded = tp_sharded_names(model, check_tp_marks(model, tp_group, tp_sharded))  # before any collective
    return ZeroEngine(model, dp_group, config, plan, ledger, tp_group, sharded, allocator, param_groups, device)
