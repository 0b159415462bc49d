"""One Slurm task = one rank: ``python -m zerobench.launch.task RUN.json`` (started by srun)."""

from __future__ import annotations

import json
import os
import sys

from zerobench.launch import worker
from zerobench.train.faults import FAULT_ENV


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        spec = json.load(f)
    if spec.get("fault"):  # test-only fault injection (zerobench.train.faults)
        os.environ[FAULT_ENV] = spec["fault"]  # read by worker.rank_settings, as under the local launcher
    return worker.run(spec["config"], spec["run_id"], spec["out"], spec.get("suite"))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
