"""DeepSpeed's ``zero_to_fp32`` functions on a directory ``engine.save_checkpoint`` wrote, in one process and no
group: ``get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag)``,
``load_state_dict_from_zero_checkpoint(model, checkpoint_dir, tag)`` and
``convert_zero_checkpoint_to_fp32_state_dict(checkpoint_dir, output_dir, max_shard_size, safe_serialization, tag)``
(``zerobench zero-to-fp32``).

The keys are the model's own ``state_dict()`` keys, as ``full_state_dict`` gives them from a live engine: every
trained parameter's fp32 value (a tied one under each name), then the saved buffers and frozen parameters. A
checkpoint that is not whole is refused (``zero/state/checkpoint.py``); every file loads with ``weights_only=True``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import torch
from torch import nn

from zerobench.files import replace_file
from zerobench.zero.compat.deepspeed.checkpoints import FROZEN, LATEST, tagged_path
from zerobench.zero.state.checkpoint import consolidate
from zerobench.zero.state.export import save_whole
from zerobench.zero.state.reading import CheckpointMismatch, check_digest, load_file


def _tag_dir(checkpoint_dir: str | os.PathLike, tag: str | None) -> Path:
    if not Path(checkpoint_dir).is_dir():
        what = " (it is a file: give the directory save_checkpoint wrote)" if Path(checkpoint_dir).exists() else ""
        raise FileNotFoundError(f"no checkpoint directory {checkpoint_dir}{what}")
    path = tagged_path(checkpoint_dir, tag)
    if path is None:
        raise FileNotFoundError(f"no {LATEST} file in {checkpoint_dir}: name the checkpoint's tag (e.g. global_step10)")
    return path


def get_fp32_state_dict_from_zero_checkpoint(
    checkpoint_dir: str | os.PathLike, tag: str | None = None, exclude_frozen_parameters: bool = False
) -> dict[str, torch.Tensor]:
    """DeepSpeed's: the fp32 state dict of ``checkpoint_dir/<tag>`` (default: the tag ``latest`` names), written by
    ``engine.save_checkpoint`` on any number of DP ranks. Parameters first (each name a tied one is registered
    by), then the saved buffers and frozen parameters, every floating-point value in fp32; every file loads with
    ``weights_only=True``."""
    path = _tag_dir(checkpoint_dir, tag)
    out = dict(consolidate(path))  # one line naming tp-XX for a TP checkpoint
    extra = load_file(path / "module_extra.pt")
    if exclude_frozen_parameters:
        if not (path / FROZEN).exists():
            raise FileNotFoundError(
                f"checkpoint {path} does not say which saved tensors are frozen parameters (no "
                f"{FROZEN}: saved before it was written): load it without exclude_frozen_parameters"
            )
        check_digest(path / FROZEN)
        try:
            names = json.loads((path / FROZEN).read_text())
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointMismatch(f"checkpoint file {path / FROZEN} is damaged: {e}") from None
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise CheckpointMismatch(f"checkpoint file {path / FROZEN} is damaged: not a list of names")
        frozen = set(names)
        unknown = sorted(frozen - set(extra))
        if unknown:
            raise CheckpointMismatch(
                f"checkpoint file {path / FROZEN} is damaged: it names {unknown[:4]}, which the checkpoint does not "
                "hold as buffers or frozen parameters"
            )
        extra = {k: v for k, v in extra.items() if k not in frozen}
    out.update({k: v.float() if torch.is_tensor(v) and v.is_floating_point() else v for k, v in extra.items()})
    return out


def load_state_dict_from_zero_checkpoint(
    model: nn.Module, checkpoint_dir: str | os.PathLike, tag: str | None = None, strict: bool = True
) -> nn.Module:
    """DeepSpeed's: ``get_fp32_state_dict_from_zero_checkpoint`` loaded into ``model`` (moved to the host first, as
    DeepSpeed's); returns ``model``. ``strict`` as ``load_state_dict``'s (DeepSpeed loads non-strictly)."""
    model = model.cpu()
    model.load_state_dict(get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag), strict=strict)
    return model


EXPORT_FILES = ("pytorch_model*.bin", "model*.safetensors", "*.index.json")
"""The names an export writes, either serialization, one file or shards with their index: an output directory
holding any of them holds an earlier export's model."""


def check_output_dir(checkpoint_dir: str | os.PathLike, output_dir: str | os.PathLike) -> None:
    """Refuse (``ConfigError``, one line) an ``output_dir`` where the export would be mixed with other files. One
    at or inside ``checkpoint_dir``: its files would join the checkpoint's (a save of that tag refuses files that are
    not its own, or a reader takes them for a checkpoint's). One holding an earlier export's model files
    (``EXPORT_FILES``): an export writes only the names it needs, so a single file beside an earlier export's shards
    and index, or ``model.safetensors`` beside ``pytorch_model.bin``, would leave two models in one directory, of
    which ``from_pretrained`` reads one by its own rules (the index first), perhaps the stale one."""
    from zerobench.config import ConfigError

    out, ckpt = Path(output_dir), Path(checkpoint_dir)
    if out.resolve() == ckpt.resolve() or ckpt.resolve() in out.resolve().parents:
        raise ConfigError(
            f"the output directory {out} is inside the checkpoint directory {ckpt}: the export would be mixed "
            "into the checkpoint's own files; choose a directory outside it"
        )
    held = sorted({f.name for pattern in EXPORT_FILES for f in out.glob(pattern)}) if out.is_dir() else []
    if held:
        more = f" and {len(held) - 3} more" if len(held) > 3 else ""
        raise ConfigError(
            f"the output directory {out} already holds an earlier export ({', '.join(held[:3])}{more}): a new one "
            "beside it would leave two models in one directory; empty it, or choose another directory"
        )


def convert_zero_checkpoint_to_fp32_state_dict(
    checkpoint_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    max_shard_size: int | str = "5GB",
    safe_serialization: bool = False,
    tag: str | None = None,
    exclude_frozen_parameters: bool = False,
) -> Path:
    """DeepSpeed's, with its arguments in its order: ``get_fp32_state_dict_from_zero_checkpoint`` written into
    ``output_dir`` as Hugging Face lays a model's weights out. Up to ``max_shard_size`` bytes (``"5GB"``: 5e9, or
    ``"5GiB"``, or a number) it is one file, ``pytorch_model.bin`` (``model.safetensors`` with
    ``safe_serialization``); above it, shards ``pytorch_model-00001-of-0000N.bin`` in the state dict's order (a
    tensor larger than the limit alone in its shard, tied ones beside the first), then the index
    ``pytorch_model.bin.index.json`` naming each tensor's shard. Returns the file, or the index, it wrote last.
    ``output_dir`` must hold no earlier export and lie outside ``checkpoint_dir`` (``check_output_dir``)."""
    from zerobench.config import ConfigError, parse_bytes

    limit = parse_bytes(max_shard_size)
    _tag_dir(checkpoint_dir, tag)  # what is wrong with the checkpoint first, then with where it goes
    check_output_dir(checkpoint_dir, output_dir)  # before the shards are read
    sd = get_fp32_state_dict_from_zero_checkpoint(checkpoint_dir, tag, exclude_frozen_parameters)
    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    stem, suffix = ("model", ".safetensors") if safe_serialization else ("pytorch_model", ".bin")
    if safe_serialization:
        try:
            from safetensors.torch import save
        except ImportError:
            raise ConfigError(
                "safe_serialization=True needs the safetensors package: pip install safetensors"
            ) from None
        sd = _unshared(sd)

    def write(part: dict, path: Path) -> None:
        if safe_serialization:
            replace_file(path, save(part, metadata={"format": "pt"}))
        else:
            save_whole(part, path)

    shards = _shards(sd, limit)
    if len(shards) == 1:
        write(sd, out / f"{stem}{suffix}")
        return out / f"{stem}{suffix}"
    names = [f"{stem}-{i:05d}-of-{len(shards):05d}{suffix}" for i in range(1, len(shards) + 1)]
    for keys, name in zip(shards, names, strict=True):
        write({k: sd[k] for k in keys}, out / name)
    total = sum(t.numel() * t.element_size() for t in {_storage(t): t for t in sd.values()}.values())
    index = {"metadata": {"total_size": total}, "weight_map": {k: n for keys, n in zip(shards, names) for k in keys}}
    replace_file(out / f"{stem}{suffix}.index.json", json.dumps(index, indent=2, sort_keys=True) + "\n")
    return out / f"{stem}{suffix}.index.json"


def _unshared(sd: dict) -> dict[str, torch.Tensor]:
    """``sd`` as safetensors can hold it: tensors only (one line naming a value that is not), contiguous, and a
    tensor sharing storage with an earlier one (a tied weight) copied, so each name holds its own."""
    from zerobench.config import ConfigError

    out, seen = {}, set()
    for k, v in sd.items():
        if not torch.is_tensor(v):
            raise ConfigError(
                f"{k!r} is a {type(v).__name__}, not a tensor, which safetensors cannot hold: convert with "
                "safe_serialization=False"
            )
        out[k] = (v.clone() if _storage(v) in seen else v).contiguous()
        seen.add(_storage(v))
    return out


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def _shards(sd: dict[str, torch.Tensor], limit: float) -> list[list[str]]:
    """The state dict's keys in shards of at most ``limit`` bytes, in order, as Hugging Face splits them: a tensor
    larger than the limit alone, one sharing storage with an earlier tensor beside it (counted once)."""
    shards: list[list[str]] = [[]]
    size, home = 0, {}
    for k, t in sd.items():
        if _storage(t) in home:
            shards[home[_storage(t)]].append(k)
            continue
        n = t.numel() * t.element_size()
        if shards[-1] and size + n > limit:
            shards.append([])
            size = 0
        shards[-1].append(k)
        home[_storage(t)] = len(shards) - 1
        size += n
    return shards
