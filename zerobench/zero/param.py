"""Per-parameter engine state: a wrapper around each ``nn.Parameter`` with explicit state enums.

The engine never sticks attributes on ``nn.Parameter``; everything it knows about a parameter (where it lives in the
layout, its param group, whether it decays, whether its storage is resident, whether it has a gradient in the current
accumulation window) lives here.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

import torch
from torch import nn

from zerobench.zero.layout import ParamSlot


class ParamState(enum.Enum):
    """Where a parameter's values are."""

    REPLICATED = "replicated"
    """Stages 0-2: the whole parameter is resident, as a view of the flat parameter buffer."""
    SHARDED = "sharded"
    """Stage 3: only this rank's shard exists; the parameter's full view has no storage."""
    GATHERING = "gathering"
    """Stage 3: an all-gather into the full view is in flight."""
    UNSHARDED = "unsharded"
    """Stage 3: gathered; usable for forward/backward until resharded."""


class GradState(enum.Enum):
    """Whether a parameter contributed a gradient in the current accumulation window."""

    NONE = "none"
    ACCUMULATED = "accumulated"


@dataclass
class ZeroParam:
    """The engine's record of one (unique, possibly tied) parameter."""

    param: nn.Parameter
    slot: ParamSlot
    decays: bool
    """Whether weight decay applies (by default 2+ dims: matrices and embeddings, not biases or norms; every
    parameter of a user's group); the rate is its param group's, per step."""
    group: int = 0
    """Index of its param group in ``engine.optimizer.param_groups`` (``zero/optim/param_groups.py``)."""
    state: ParamState = ParamState.REPLICATED
    grad_state: GradState = GradState.NONE

    @property
    def name(self) -> str:
        return self.slot.name

    def check_grad(self, grad: torch.Tensor, dtype: torch.dtype) -> None:
        """Refuse, in one line, a sparse gradient (``F.embedding(..., sparse=True)``: the buffers are dense), one
        of another dtype than the engine trains in (the parameter, or a submodule holding it, was converted after
        ``apply_zero``, e.g. ``model.blocks[0].half()``, and no longer reads the engine's buffers), or one of another
        shape (its ``.data`` reshaped after ``apply_zero``)."""
        if grad.layout is not torch.strided:
            raise RuntimeError(
                f"parameter {self.name!r} got a {grad.layout} gradient: ZeRO keeps gradients in "
                "dense flat buffers; compute it densely (e.g. F.embedding(..., sparse=False))"
            )
        if grad.dtype is not dtype:
            raise self.converted(f"got a {grad.dtype} gradient", dtype)
        if grad.shape != self.slot.shape:  # .data assigned another shape (HF's resize_token_embeddings)
            raise RuntimeError(
                f"parameter {self.name!r} got a gradient of shape {tuple(grad.shape)} where the engine trains it as "
                f"{tuple(self.slot.shape)}: its .data was given another shape after apply_zero (e.g. "
                "resize_token_embeddings); give the model its final shapes before apply_zero"
            )

    def check_assigned(self, data: torch.Tensor, view: torch.Tensor) -> None:
        """Refuse, in one line, a tensor assigned to the parameter's ``.data`` that its view of the engine's buffer
        cannot take: another dtype (a conversion), shape or device."""
        if data.dtype != view.dtype:
            raise self.converted(f"is {data.dtype}", view.dtype)
        if data.shape != view.shape or data.device != view.device:
            raise RuntimeError(
                f"parameter {self.name!r} was assigned a tensor of shape {tuple(data.shape)} on {data.device} after "
                f"apply_zero, where it is {tuple(view.shape)} on {view.device}: assign one of its shape and device "
                "(or load values with load_state_dict)"
            )

    def converted(self, what: str, dtype: torch.dtype) -> RuntimeError:
        """The one-line error for a parameter converted after ``apply_zero`` (found by ``what``)."""
        return RuntimeError(
            f"parameter {self.name!r} {what} where the engine trains in {dtype}: its module was "
            "converted after apply_zero (e.g. .half()), which detaches it from the engine's buffers; "
            "convert the model before apply_zero"
        )
