"""``model.load_state_dict(sd)`` after ``apply_zero``: the loaded values reach the engine, at every stage.

A trained parameter's source of truth is the engine's fp32 master (this rank's shard of it at stages 1-3;
under bf16/fp16 a copy beside the low-precision parameters), and at stage 3 the parameter itself is a
0-element placeholder between gathers. Torch's ``load_state_dict`` writes only the module's parameters,
so on its own it would be undone by the next step under mixed precision (the step starts from the old
master), and refused at stage 3 (a size mismatch against every placeholder).

A load-state-dict pre-hook on every module that owns a trained parameter writes the loaded value's
pieces in this rank's shard into the master, at full precision, and into the parameter shards (stage
3's own partition; views of the replica at stages 0-2, where torch then copies the whole value in as
usual). Where the parameter is a placeholder, torch is handed a matching empty tensor, so keys, strict
mode and ``missing_keys`` behave as they would without ZeRO, and a wrong shape gets torch's own message
with the real shape. No collective: every rank loads its own copy of the state dict, as under DDP. The
Adam moments and the step count are left alone, as ``torch.optim`` leaves them when a model is loaded. Inside
``gathered_params(modifier_rank=r)`` (DeepSpeed's ``GatheredParameters``, HF's ZeRO-3 loading, where rank ``r``
alone loads), the loaded values are also kept for that context's exit, which sends them to the other ranks'
masters (``zero/state/gathered.py``).
"""

from __future__ import annotations

import torch
from torch import nn

from zerobench.zero.protocols import Engine
from zerobench.zero.state.shards import segment_view


def install_load_hooks(engine: Engine) -> list:
    """Register the pre-hook on each module owning a trained parameter; returns the handles."""
    index = {id(zp.param): i for i, zp in enumerate(engine.zparams)}
    segments = segments_by_param(engine)
    handles = []
    for module in engine.module.modules():
        owned = {
            name: index[id(p)]
            for name, p in module.named_parameters(recurse=False, remove_duplicate=False)
            if id(p) in index
        }
        if owned:
            handles.append(module.register_load_state_dict_pre_hook(_pre_hook(engine, owned, segments)))
    return handles


def _pre_hook(engine: Engine, owned: dict[str, int], segments: dict[int, list]):
    def hook(
        module: nn.Module, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
    ) -> None:
        if local_metadata.get("assign_to_params_buffers"):
            raise ValueError(
                "load_state_dict(assign=True) would replace parameters the ZeRO engine holds "
                "views of: load with assign=False (the default)"
            )
        for name, i in owned.items():
            key = prefix + name
            value = state_dict.get(key)
            if not isinstance(value, torch.Tensor):
                continue
            zp = engine.zparams[i]
            if getattr(module, name, None) is not zp.param:  # a deepcopy of the model (its hooks came along)
                continue
            placeholder = zp.param.shape != zp.slot.shape
            if value.shape == zp.slot.shape:
                write_segments(engine, segments.get(i, ()), value)
                record_load(engine, i, value)
            elif placeholder:  # torch would compare against the placeholder's shape: say it with the real one
                error_msgs.append(
                    f"size mismatch for {key}: copying a param with shape {value.shape} from "
                    f"checkpoint, the shape in current model is {torch.Size(zp.slot.shape)}."
                )
            if placeholder:
                state_dict[key] = torch.empty(0, dtype=zp.param.dtype)
                # torch copies that into the placeholder next, which moves its version: not an edit to refuse
                engine.gatherer.expect_copy(zp.param)

    return hook


def record_load(engine: Engine, index: int, value: torch.Tensor) -> None:
    """Inside a ``gathered_params(modifier_rank=r)`` context, keep the full value loaded into parameter ``index``:
    the hook writes only this rank's segments of the master, and the context's exit sends rank ``r``'s loaded
    values to the others at full precision (their masters would otherwise take only the low-precision broadcast)."""
    for ctx in reversed(engine._gathered_open):
        if ctx.modifier_rank is not None:
            ctx.loaded[index] = value.detach()
            return


def segments_by_param(engine: Engine) -> dict[int, list]:
    """This rank's layout segments, by the index of the parameter they belong to."""
    out: dict[int, list] = {}
    for seg in engine.layout.segments(engine.rank_in_shards):
        out.setdefault(seg.param, []).append(seg)
    return out


@torch.no_grad()
def write_segments(engine: Engine, segs, value: torch.Tensor) -> None:
    """Write this rank's segments ``segs`` of one parameter's full value into the fp32 master and the shards."""
    flat = value.detach().reshape(-1)
    storage, layout = engine.storage, engine.layout
    storage.rewritten()
    for seg in segs:
        master = segment_view(storage.master, layout, seg)
        master.copy_(flat[seg.param_start : seg.param_end])
        shard = segment_view(storage.shards, layout, seg)
        if shard.data_ptr() != master.data_ptr():  # (fp32 without offload: the shards are the master)
            shard.copy_(master)
