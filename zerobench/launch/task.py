"""One Slurm task = one rank: ``python -m zerobench.launch.task RUN.json`` (started by srun)."""

from __future__ import annotations

import json
import os
import sys

from zerobench.launch import worker


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        spec = json.load(f)
    os.environ.update(spec.get("env", {}))  # the launcher's extra environment, read by worker.rank_settings
    return worker.run(spec["config"], spec["run_id"], spec["out"], spec.get("suite"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
