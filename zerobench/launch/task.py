"""One Slurm task = one rank: ``python -m zerobench.launch.task RUN.json`` (started by srun).

When the srun launcher names a report directory (``channel.FILE_ENV``), the rank writes there how it ended: its
one line on failure, ``done``, and its exit code (``channel.RankFile``). srun's own exit code cannot say which
rank failed first, or with what code."""

from __future__ import annotations

import json
import os
import sys

from zerobench.launch import channel, worker


def main(argv: list[str]) -> int:
    with open(argv[0]) as f:
        spec = json.load(f)
    os.environ.update(spec.get("env", {}))  # the launcher's extra environment, read by worker.rank_settings
    where = os.environ.get(channel.FILE_ENV)
    report = channel.RankFile(where, int(os.environ.get("SLURM_PROCID", "0"))) if where else None
    if report is not None:  # a requeued job reuses its directory: an earlier attempt's lines are not this one's
        report.started()
    try:
        code = worker.run(spec["config"], spec["run_id"], spec["out"], spec.get("suite"), report)
    except BaseException as e:  # the traceback goes to the log; the launcher reads the line and the code
        if report is not None:
            report.error(f"{type(e).__name__}: {worker.first_line(e)}")
            report.exited(130 if isinstance(e, KeyboardInterrupt) else 1)
        raise
    if report is not None:
        if code == 0:
            report.done()
        report.exited(code)
    return code


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
