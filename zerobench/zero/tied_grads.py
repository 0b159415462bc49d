"""Stages 2-3 with ``overlap_comm``: a large tied parameter's second gradient is not allocated beside a bucket
still being reduced.

A parameter two modules own (a language model's head tied to its token embedding: ``lm_head.weight =
wte.weight``) gets two gradients in backward. Autograd keeps the first (the head's, at the start of backward)
until the second (the lookup's, at the end) is added to it, and that second one is a full-size dense tensor.
With overlap, the last block's staging bucket is usually still being reduced when it is allocated, so the head's
gradient, the lookup's and that bucket are alive at once: the step's peak (4-layer small, stage 2: 538 MiB of
live tensors with overlap on, 512 with it off). So before the backward of each module owning such a parameter,
the collectives in flight finish first: ``zero/staging.py``'s policy (one large buffer reduced at a time, as
FSDP2's ``reduce_scatter_max_input_buffers``) applied to the buffer autograd allocates. Only parameters of held
back buckets (``staging.held_back``, kept as ``StagingBuckets.large``) get it; the first owner's wait, at the
start of backward, finds nothing in flight. A module reused in two places (its parameters owned once, used
twice) is not seen here.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn
from torch.utils.hooks import RemovableHandle

from zerobench.zero.bucket import GradBucketGroup
from zerobench.zero.containers import tensors_in
from zerobench.zero.param import ZeroParam
from zerobench.zero.tooling import eager


def tied_owners(model: nn.Module, zparams: list[ZeroParam]) -> dict[int, list[nn.Module]]:
    """Per trained parameter (index into ``zparams``) owned directly by two or more modules: those modules."""
    owners: dict[int, list[nn.Module]] = {}
    for m in model.modules():
        for p in m.parameters(recurse=False):
            owners.setdefault(id(p), []).append(m)
    return {i: owners[id(zp.param)] for i, zp in enumerate(zparams) if len(owners.get(id(zp.param), ())) > 1}


def wait_before_tied_grads(model: nn.Module, zparams: list[ZeroParam], grads: GradBucketGroup) -> list[RemovableHandle]:
    """A forward hook on every owner of a large tied parameter: its output's gradient hook finishes the collectives
    in flight before that module's backward. None at stages 0-1 (no staging) or with ``overlap_comm`` off."""
    if grads.keep_full or grads.max_inflight == 0:
        return []
    large = grads.stage.large
    owners = weakref.WeakSet(
        m for i, ms in tied_owners(model, zparams).items() if large[zparams[i].slot.bucket] for m in ms
    )

    def wait(grad: torch.Tensor) -> None:
        grads.wait_inflight()

    def on_output(module: nn.Module, args, output) -> None:  # copy.deepcopy(model) shares it: act on owners only
        if module in owners and torch.is_grad_enabled():
            for t in tensors_in(output):
                if t.requires_grad:
                    t.register_hook(wait)

    return [m.register_forward_hook(eager(on_output)) for m in owners]
