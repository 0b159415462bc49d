#!/usr/bin/env bash
# The regression gate's campaign: with scripts/noisy_neighbour.py running (started and stopped here), N trials of
#   - the stored-baseline gate on unchanged code (must pass: N of N),
#   - the same gate on code whose host work is planted 10% slower (ZEROBENCH_PLANT_CPU=0.10: must fail, >= N-1),
#   - the wall-clock A/B, lockstep, on suites/cpu/gate_ab.yaml with a planted 10% step slowdown at stage 2
#     (ZEROBENCH_PLANT_DELAY=0.10:2: its stage-2 verdict must be REGRESSION, >= N-1) and stage 1 unchanged (must
#     not be), interleaved trial by trial so that the machine's drift reaches every kind alike.
# The baseline is recorded first, under the same neighbour, from K unchanged runs (its noise model). A gate run is
# what docs/results.md's CI recipe runs: suites/cpu/gate.yaml's stage-2 run timed and with --instructions, judged
# with --timing report (the wall clock is the A/B's to judge).
#
# Usage: scripts/gate_campaign.sh OUTDIR [N]     N trials (default 20); K baseline runs: GATE_CAMPAIGN_BASELINE_RUNS
# (default 5); work files (sweeps, callgrind dumps: ~300 MB) under GATE_CAMPAIGN_WORK (default: a new /tmp dir).
# GATE_CAMPAIGN_AB_ROUNDS / GATE_CAMPAIGN_AB_FALSE_ALARM (default 28 / 0.001) shorten a smoke run of the script; a
# recorded campaign keeps the defaults (the summary records them).
# OUTDIR gets what is committed: rows.jsonl (every trial, the gate's flagged comparisons, the A/B verdicts, the
# totals), baseline.jsonl (with its noise model) and README.md (scripts/gate_campaign_summary.py writes them).
#
# Expected duration on a quiet 2-core machine, with the neighbour taking one core in bursts: about 6 hours for
# N=20, K=5 (a gate run, timed and instrumented, ~2 min; an A/B of 29 rounds, each four fresh training processes,
# ~15 min). A campaign can be taken in parts: GATE_CAMPAIGN_HOURS (e.g. 2) starts no trial that the mean trial so far
# would carry past that budget, and summarises the trials run; each part records a baseline of its own, and
# `python scripts/gate_campaign_summary.py --combine OUT PART...` joins the parts (their trials in turn).
# tests/unit/test_gate_campaign.py reads results/reference/gate-campaign-cpu-2core.
set -euo pipefail

if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: scripts/gate_campaign.sh OUTDIR [TRIALS]" >&2
  exit 2
fi
REPO=$(cd "$(dirname "$0")/.." && pwd)
OUT=$1
N=${2:-20}
K=${GATE_CAMPAIGN_BASELINE_RUNS:-5}
AB_ROUNDS=${GATE_CAMPAIGN_AB_ROUNDS:-28}
AB_ALARM=${GATE_CAMPAIGN_AB_FALSE_ALARM:-0.001}
if [[ -e $OUT && -n "$(ls -A "$OUT" 2>/dev/null)" ]]; then
  echo "scripts/gate_campaign.sh: $OUT is not empty: choose a new OUTDIR" >&2
  exit 2
fi
if ! [[ $N =~ ^[1-9][0-9]*$ && $K =~ ^[2-9][0-9]*$ ]]; then
  echo "scripts/gate_campaign.sh: TRIALS must be a positive integer and GATE_CAMPAIGN_BASELINE_RUNS at least 2" >&2
  exit 2
fi
HOURS=${GATE_CAMPAIGN_HOURS:-1000}
if ! [[ $HOURS =~ ^[0-9]+([.][0-9]+)?$ ]] || [[ $HOURS =~ ^0+([.]0+)?$ ]]; then
  echo "scripts/gate_campaign.sh: GATE_CAMPAIGN_HOURS must be a positive number of hours (e.g. 2.5), got '$HOURS'" >&2
  exit 2
fi
START=$(date +%s)
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
WORK=${GATE_CAMPAIGN_WORK:-$(mktemp -d /tmp/gate-campaign-XXXXXX)}
mkdir -p "$WORK"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}"
zb() { python -m zerobench "$@"; }
CPU=$(python -c "import os; print(min(os.sched_getaffinity(0)))")
LOG="$WORK/campaign.log"
say() { echo "[$(date +%H:%M:%S)] $*" | tee -a "$LOG"; }

OPENBLAS_NUM_THREADS=1 python "$REPO/scripts/noisy_neighbour.py" 1 &
NEIGHBOUR=$!
trap 'kill "$NEIGHBOUR" 2>/dev/null || true; wait "$NEIGHBOUR" 2>/dev/null || true' EXIT
say "campaign: $N trials, baseline of $K runs, noisy neighbour pid $NEIGHBOUR, work under $WORK"

gate_sweeps() {  # DIR [KEY=VALUE...]: one gate run's sweeps (timed, then instructions) into DIR
  local dir=$1
  shift
  env "$@" python -m zerobench sweep cpu/gate --only stage=2 --out "$dir/timed" --no-progress >>"$LOG" 2>&1
  env "$@" python -m zerobench sweep cpu/gate --only stage=2 --out "$dir/counted" --no-progress --instructions \
    >>"$LOG" 2>&1
}

gate() {  # KIND I [KEY=VALUE...]: sweep and judge one trial; the exit code goes into the verdict rows
  local kind=$1 i=$2
  shift 2
  gate_sweeps "$WORK/$kind/$i" "$@" || say "a sweep of $kind trial $i failed: the gate finds its run missing"
  zb regress --baseline "$OUT/baseline.jsonl" --candidate "$WORK/$kind/$i" --timing report \
    --propose "$WORK/$kind/$i/proposed.jsonl" --out "$WORK/verdicts/$kind-$i" >>"$LOG" 2>&1 || true
}

for k in $(seq 1 "$K"); do
  say "baseline run $k/$K"
  gate_sweeps "$WORK/baseline/$k"
done
BASE_RUNS=()
for k in $(seq 1 "$K"); do BASE_RUNS+=("$WORK/baseline/$k"); done
zb regress --write-baseline "$OUT/baseline.jsonl" --candidate "${BASE_RUNS[@]}" \
  | tee -a "$LOG"

BUDGET_S=$(python -c "import sys; print(int(float(sys.argv[1]) * 3600))" "$HOURS")
DONE=0
for i in $(seq 1 "$N"); do
  NOW=$(date +%s)
  if ((DONE > 0 && NOW - START + (NOW - TRIALS_START) / DONE > BUDGET_S)); then
    say "trial $i would run past GATE_CAMPAIGN_HOURS=$HOURS: stopping after $DONE trials"
    break
  fi
  if ((DONE == 0)); then TRIALS_START=$NOW; fi
  say "trial $i/$N: unchanged"
  gate unchanged "$i"
  say "trial $i/$N: host work planted 10% slower"
  gate host "$i" ZEROBENCH_PLANT_CPU=0.10
  say "trial $i/$N: A/B, step planted 10% slower at stage 2"
  zb regress --ab cpu/gate_ab --baseline-tree "$REPO" --lockstep --cpus "$CPU" --rounds "$AB_ROUNDS" \
    --false-alarm "$AB_ALARM" \
    --candidate-env ZEROBENCH_PLANT_DELAY=0.10:2 --out "$WORK/ab/$i" >>"$LOG" 2>&1 || true
  DONE=$i
done

kill "$NEIGHBOUR" 2>/dev/null || true
python "$REPO/scripts/gate_campaign_summary.py" "$OUT" "$WORK" --trials "$DONE" --baseline-runs "$K" \
  --ab-rounds "$AB_ROUNDS" --ab-false-alarm "$AB_ALARM" | tee -a "$LOG"
say "done: $OUT (work files: $WORK)"
