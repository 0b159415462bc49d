"""``zerobench zero-to-fp32``: a checkpoint directory written by ``engine.save_checkpoint`` as one fp32 state dict,
as DeepSpeed's ``zero_to_fp32.py`` script (``zerobench/zero/compat/deepspeed/zero_to_fp32.py`` does the work)."""

from __future__ import annotations

import argparse

from zerobench.cli.types import path


def cmd_zero_to_fp32(args: argparse.Namespace) -> int:
    from pathlib import Path

    from zerobench.config import ConfigError
    from zerobench.results.outdir import check_writable_dir
    from zerobench.zero.compat.deepspeed.zero_to_fp32 import convert_zero_checkpoint_to_fp32_state_dict
    from zerobench.zero.state.reading import CheckpointMismatch

    if Path(args.checkpoint_dir).is_dir():  # else the missing checkpoint is the error, and nothing is created
        check_writable_dir(args.output_dir, "OUTPUT_DIR", "the state dict")  # before the shards are read
    try:
        path = convert_zero_checkpoint_to_fp32_state_dict(
            args.checkpoint_dir,
            args.output_dir,
            max_shard_size=args.max_shard_size,
            safe_serialization=args.safe_serialization,
            tag=args.tag,
            exclude_frozen_parameters=args.exclude_frozen_parameters,
        )
    except (FileNotFoundError, CheckpointMismatch) as e:
        raise ConfigError(str(e)) from None
    print(f"wrote {path}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add this module's subcommand to the ``zerobench`` parser."""
    p = sub.add_parser(
        "zero-to-fp32",
        help="a save_checkpoint directory as one fp32 state dict (DeepSpeed's zero_to_fp32)",
        description="Consolidate the shards of a checkpoint written by engine.save_checkpoint (any number "
        "of DP ranks) into OUTPUT_DIR/pytorch_model.bin (or model.safetensors; shards above --max-shard-size): the "
        "model's parameters in fp32, a "
        "tied one under each name, with its buffers and frozen parameters, for "
        "model.load_state_dict without ZeRO. One process, no GPU.",
    )
    p.add_argument(
        "checkpoint_dir", type=path, help="the directory given to save_checkpoint (holding 'latest' and the tags)"
    )
    p.add_argument(
        "output_dir",
        type=path,
        help="where pytorch_model.bin goes (created if missing): outside the checkpoint, holding no earlier export",
    )
    p.add_argument("--tag", help="which checkpoint (default: the one 'latest' names), e.g. global_step100")
    p.add_argument("--exclude-frozen-parameters", action="store_true", help="leave the frozen parameters out")
    p.add_argument(
        "--max-shard-size",
        default="5GB",
        help="above this size, Hugging Face's shards and index instead of one file (default 5GB; 5GiB, or bytes)",
    )
    p.add_argument(
        "--safe-serialization", action="store_true", help="write model.safetensors instead of pytorch_model.bin"
    )
    p.set_defaults(func=cmd_zero_to_fp32)
