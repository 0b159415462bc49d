#!/usr/bin/env bash
# The rows behind docs/regress-history.png: scripts/gate_history_demo.sh OUTDIR
# Builds a scratch branch of eight commits on top of HEAD in a temporary worktree (removed afterwards; the commits
# exist only in the rows): commits 1-3 and 6-8 touch a comment, commit 4 sums every parameter's absolute value
# after each micro-batch's backward (ZeroSystem.forward_backward: a debug norm left in the hot path, two operators
# and an item() per parameter), commit 5 reverts it. At each commit it sweeps suites/cpu/gate.yaml's stage-2 run, timed and with --instructions, and keeps the
# rows the figure draws (whole-step host-work figures, run statuses) in OUTDIR/<n>/rows.jsonl. Then: python scripts/history_figure.py OUTDIR docs/regress-history.png
# About 2 minutes a commit on a quiet 2-core machine.
set -euo pipefail

if [[ $# -ne 1 ]]; then
  echo "usage: scripts/gate_history_demo.sh OUTDIR" >&2
  exit 2
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
TREE=$(mktemp -d /tmp/gate-history-XXXXXX)/tree
git -C "$REPO" worktree add --detach "$TREE" HEAD >/dev/null
trap 'git -C "$REPO" worktree remove --force "$TREE"' EXIT
G=(git -C "$TREE" -c user.name=zerobench -c user.email=zerobench@localhost)
SYSTEMS=zerobench/train/systems.py
PLANT='        _ = sum(float(p.detach().abs().sum()) for p in self.module.parameters())  # scratch commit: a debug norm'

for n in 1 2 3 4 5 6 7 8; do
  case $n in
    4) sed -i "s/^        self.engine.backward(loss)$/        self.engine.backward(loss)\n$PLANT/" "$TREE/$SYSTEMS" ;;
    5) sed -i "/# scratch commit: a debug norm/d" "$TREE/$SYSTEMS" ;;
    *) echo "# history demo commit $n" >>"$TREE/suites/cpu/gate.yaml" ;;
  esac
  "${G[@]}" commit -q -am "history demo commit $n"
  work=$(mktemp -d /tmp/gate-history-run-XXXXXX)
  (cd "$TREE" && PYTHONPATH="$TREE" python -m zerobench sweep cpu/gate --only stage=2 --out "$work/timed" \
    --no-progress >/dev/null)
  (cd "$TREE" && PYTHONPATH="$TREE" python -m zerobench sweep cpu/gate --only stage=2 --out "$work/counted" \
    --no-progress --instructions >/dev/null)
  mkdir -p "$OUT/$n"  # the rows the figure draws (whole-step figures and each run's status), of both sweeps
  python - "$work" "$OUT/$n/rows.jsonl" <<'PY'
import json, pathlib, sys
keep = {"run_status", "instructions", "py_calls", "ops_dispatched", "allocations", "host_cpu_s"}
rows = [json.loads(line) for f in sorted(pathlib.Path(sys.argv[1]).rglob("rows.jsonl"))
        for line in f.read_text().splitlines()]
pathlib.Path(sys.argv[2]).write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows
                                             if r["metric"] in keep and r.get("phase", "step") == "step"))
PY
  rm -rf "$work"
  echo "commit $n: $("${G[@]}" rev-parse --short HEAD)"
done
