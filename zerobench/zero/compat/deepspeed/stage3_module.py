"""What a stage-3 module needs under DeepSpeed's names (``as_deepspeed`` applies both): the whole sizes on its
partitioned parameters, and a ``generate`` that keeps the DP ranks' forwards in step."""

from __future__ import annotations

import functools
import inspect
import warnings

import torch

from zerobench.zero.engine import ZeroEngine


def mark_partitioned(engine: ZeroEngine) -> None:
    """DeepSpeed's size attributes on each parameter stage 3 frees between uses, as its ``zero.Init`` sets them:
    ``ds_shape`` and ``ds_numel``, the whole shape and size, which ``p.shape`` no longer tells outside a gather. Code
    written for DeepSpeed counts with them (PEFT's trainable-parameter count, the HF Trainer's
    ``get_model_param_count``, DeepSpeed's ``is_optimized_parameter``). They are static facts; where the parameter's values are lives in the engine's
    own wrappers, never on the parameter.

    ``ds_id`` is deliberately not set. DeepSpeed reads it as "this is one of my partitioned parameters"
    (``is_zero_param``), and its patched ``F.linear``, ``GatheredParameters`` and checkpoint paths then drive the
    parameter's ``ds_status``/``all_gather``, which only DeepSpeed's own parameters have. With DeepSpeed imported in
    the same process, a zerobench stage-3 step would fail inside DeepSpeed's linear backward."""
    for zp in engine.zparams:
        zp.param.ds_shape = torch.Size(zp.slot.shape)
        zp.param.ds_numel = zp.param.ds_shape.numel()


def sync_generate(engine: ZeroEngine) -> None:
    """At stage 3 every DP rank must run every forward, since a unit's gather is a collective. Hugging Face's
    ``generate`` stops a rank at its own end of sequence unless ``synced_gpus``, which it turns on by itself only
    under DeepSpeed's ZeRO-3 or FSDP (``is_deepspeed_zero3_enabled``, ``is_fsdp_managed_module``), neither of which
    it can see here: ranks whose prompts end at different lengths then waited on each other's gathers until the
    collective timed out. The module's ``generate`` (any that takes ``synced_gpus``) now runs with it True, on the
    module instance, as HF would under DeepSpeed; ``destroy()`` takes it off again. An explicit False (HF's
    ``Seq2SeqTrainer`` passes ``is_deepspeed_zero3_enabled()``, False here) would hang: it is overridden, with a
    warning."""
    gen = getattr(engine.module, "generate", None)
    if engine.group.size < 2 or not callable(gen) or "synced_gpus" not in inspect.signature(gen).parameters:
        return

    @functools.wraps(gen)
    def generate(*args, **kwargs):
        if kwargs.get("synced_gpus") is False and not generate.warned:  # HF's Seq2SeqTrainer passes its own guess
            warnings.warn(
                "generate(synced_gpus=False) at ZeRO stage 3 over several ranks would leave a rank that ends first "
                "waiting on the others' gathers until a timeout: generating with synced_gpus=True",
                stacklevel=2,
            )
            generate.warned = True
        if not kwargs.get("synced_gpus"):
            kwargs["synced_gpus"] = True
        return gen(*args, **kwargs)

    generate.warned = False

    generate.synced_by_engine = True
    engine.module.generate = generate


def unsync_generate(module) -> None:
    """Undo ``sync_generate``: the module's ``generate`` is its class's again (``destroy()``)."""
    if getattr(module.__dict__.get("generate"), "synced_by_engine", False):
        del module.__dict__["generate"]
