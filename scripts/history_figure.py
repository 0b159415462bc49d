"""Draw docs/regress-history.png from the rows of ``scripts/gate_history_demo.sh``:
``python scripts/history_figure.py [DATASET] [PNG]`` (defaults: results/reference/gate-history-cpu-2core and
docs/regress-history.png). It is ``zerobench regress --history`` over the dataset's commits, for the metrics a
reader of the docs needs: instructions, Python calls, operators, allocations and CPU time."""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from zerobench.report.history import run_history  # noqa: E402

METRICS = "instructions,py_calls,ops_dispatched,allocations,host_cpu_s"


def main(dataset: Path, png: Path) -> int:
    dirs = sorted((str(d) for d in dataset.iterdir() if d.is_dir()), key=lambda d: int(Path(d).name))
    with tempfile.TemporaryDirectory() as tmp:
        run_history(dirs, tmp, metrics=METRICS)
        (drawn,) = Path(tmp).glob("history-*.png")
        shutil.copyfile(drawn, png)
    print(f"drawn: {png}")
    return 0


if __name__ == "__main__":
    args = sys.argv[1:]
    sys.exit(
        main(
            Path(args[0]) if args else REPO / "results/reference/gate-history-cpu-2core",
            Path(args[1]) if len(args) > 1 else REPO / "docs/regress-history.png",
        )
    )
