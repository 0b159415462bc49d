"""Entry point of one launched rank: ``python -m zerobench.train.worker CONFIG.json RUN_ID [OUT_DIR]``."""

from __future__ import annotations

import json
import sys

import torch.distributed as dist

from zerobench.config import ConfigError, from_dict
from zerobench.distributed.env import detect
from zerobench.train.config import TrainConfig
from zerobench.train.loop import train


def main(argv: list[str]) -> int:
    cfg_path, run_id = argv[0], argv[1]
    out_dir = argv[2] if len(argv) > 2 else None
    with open(cfg_path) as f:
        cfg = from_dict(TrainConfig, json.load(f))
    try:
        train(cfg, detect(), out_dir, run_id)
    except ConfigError as e:
        print(f"zerobench: error: {e}", file=sys.stderr)
        return 2
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
