"""Entry point of one launched rank: ``python -m zerobench.train.worker CONFIG.json RUN_ID [OUT_DIR [SUITE]]``."""

from __future__ import annotations

import json
import sys

import torch
import torch.distributed as dist

from zerobench.config import ConfigError, from_dict
from zerobench.distributed.env import detect
from zerobench.metrics.memory import TrackedOutOfMemory
from zerobench.train.config import TrainConfig
from zerobench.train.launch import EXIT_CONFIG, EXIT_OOM
from zerobench.train.loop import train
from zerobench.train.turnstile import TurnstileError


def main(argv: list[str]) -> int:
    cfg_path, run_id = argv[0], argv[1]
    with open(cfg_path) as f:
        data = json.load(f)
    return run(data, run_id, argv[2] if len(argv) > 2 else None, argv[3] if len(argv) > 3 else None)


def run(config: dict, run_id: str, out_dir: str | None, suite: str | None) -> int:
    """Train one rank of the run described by ``config`` (a resolved ``TrainConfig`` as plain data)."""
    cfg = from_dict(TrainConfig, config)
    try:
        train(cfg, detect(), out_dir, run_id, suite=suite)
    except ConfigError as e:
        print(f"zerobench: error: {e}", file=sys.stderr)
        return EXIT_CONFIG
    except TurnstileError as e:
        print(f"zerobench: error: {e}", file=sys.stderr)
        return 1
    except (TrackedOutOfMemory, torch.OutOfMemoryError) as e:
        print(f"zerobench: out of memory: {str(e).splitlines()[0]}", file=sys.stderr)
        return EXIT_OOM
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
