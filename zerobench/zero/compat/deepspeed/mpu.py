"""DeepSpeed's ``mpu=``: the model-parallel groups a Megatron-style program hands ``deepspeed.initialize``.

DeepSpeed reads two things from it: the data-parallel group its engine reduces over, and the model-parallel group its
gradient norm and overflow check span (a parameter counts once per TP rank where it is marked
``tensor_model_parallel``, once in all where it is not). Megatron's ``mpu``, ``megatron.core.parallel_state`` and
zerobench's ``Mesh`` all answer both."""

from __future__ import annotations

import warnings

from torch import nn

from zerobench.config import ConfigError
from zerobench.distributed.collectives import Group
from zerobench.distributed.mesh import Mesh


def mpu_groups(mpu, dp_group) -> tuple[Group | None, Group | None]:
    """(data-parallel group, tensor-parallel group) from ``mpu`` and ``dp_group``: (``dp_group``, None) without an
    ``mpu``; both are one line where they are given together, or where ``mpu`` lacks DeepSpeed's getters or has a
    pipeline (zerobench has no pipeline parallelism)."""
    if mpu is None:
        return dp_group, None
    if dp_group is not None:
        raise ConfigError(
            "initialize: give the data-parallel group once: as dp_group=, or through mpu= (its "
            "get_data_parallel_group())"
        )
    if isinstance(mpu, Mesh):
        return mpu.dp, mpu.tp
    pipeline = getattr(mpu, "get_pipeline_model_parallel_world_size", None)
    if callable(pipeline) and pipeline() > 1:
        raise ConfigError(
            f"initialize: mpu= has {pipeline()} pipeline stages; zerobench has no pipeline parallelism: "
            "give it an mpu of tensor and data parallelism only"
        )
    tp = getattr(mpu, "get_tensor_model_parallel_group", None) or getattr(mpu, "get_model_parallel_group", None)
    dp = getattr(mpu, "get_data_parallel_group", None)
    if not callable(tp) or not callable(dp):
        raise ConfigError(
            f"initialize: mpu= ({type(mpu).__name__}) has no get_model_parallel_group() (or "
            "get_tensor_model_parallel_group()) and get_data_parallel_group(), which DeepSpeed reads: give Megatron's "
            "mpu, megatron.core.parallel_state, or a zerobench Mesh (zerobench.distributed.mesh.build_mesh)"
        )
    return Group.coerce(dp(), "dp", "mpu's data-parallel group"), Group.coerce(tp(), "tp", "mpu's model-parallel group")


def warn_if_unmarked(model: nn.Module, tp_group: Group | None) -> None:
    """A TP group of several ranks beside a model with no parameter marked ``tensor_model_parallel``: every parameter
    counts as replicated, as in DeepSpeed, which is right only if the model's TP layers did not shard any."""
    if tp_group is None or tp_group.size == 1:
        return
    if not any(getattr(p, "tensor_model_parallel", False) for p in model.parameters()):
        warnings.warn(
            f"initialize: mpu= has {tp_group.size} model-parallel ranks but no parameter of the model is marked "
            "tensor_model_parallel (as Megatron's and zerobench.parallel's TP layers mark their shards): the gradient "
            "norm counts every parameter as replicated across them",
            stacklevel=3,
        )
