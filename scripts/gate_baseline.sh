#!/usr/bin/env bash
# Record the regression gate's baseline, with its noise model, from the code of a source tree:
#   scripts/gate_baseline.sh TREE BASELINE_FILE [RUNS]
# runs suites/cpu/gate.yaml RUNS times (default 5) with TREE's code, each time timed and with --instructions, then
# writes BASELINE_FILE with `zerobench regress --write-baseline` (the median of the runs and their spread, per run
# and metric). TREE is a checkout of the baseline commit, e.g. `git worktree add /tmp/base "$(git merge-base ...)"`.
# The runs go under ${GATE_BASELINE_WORK:-a new /tmp directory}. About 1.5 minutes a run on a 2-core machine.
set -euo pipefail

if [[ $# -lt 2 || $# -gt 3 ]]; then
  echo "usage: scripts/gate_baseline.sh TREE BASELINE_FILE [RUNS]" >&2
  exit 2
fi
TREE=$(cd "$1" && pwd)
OUT=$2
RUNS=${3:-5}
if ! [[ $RUNS =~ ^[2-9][0-9]*$|^[1-9][0-9]+$ ]]; then
  echo "scripts/gate_baseline.sh: RUNS must be at least 2 (a noise model needs the spread of several runs)" >&2
  exit 2
fi
if [[ ! -f $TREE/zerobench/train/probes.py ]]; then
  echo "scripts/gate_baseline.sh: $TREE predates the host-work measures (no zerobench/train/probes.py)" >&2
  exit 2
fi
WORK=${GATE_BASELINE_WORK:-$(mktemp -d /tmp/gate-baseline-XXXXXX)}
runs=()
for k in $(seq 1 "$RUNS"); do
  echo "baseline run $k/$RUNS (work: $WORK/$k)"
  (cd "$TREE" && PYTHONPATH="$TREE" python -m zerobench sweep cpu/gate --out "$WORK/$k/timed" --no-progress >/dev/null)
  (cd "$TREE" && PYTHONPATH="$TREE" python -m zerobench sweep cpu/gate --out "$WORK/$k/counted" --no-progress \
    --instructions >/dev/null)
  runs+=("$WORK/$k")
done
mkdir -p "$(dirname "$OUT")"
(cd "$TREE" && PYTHONPATH="$TREE" python -m zerobench regress --write-baseline "$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")" \
  --candidate "${runs[@]}")
