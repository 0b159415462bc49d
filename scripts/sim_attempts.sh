#!/usr/bin/env bash
# The simulator's quick path as a user runs it, N independent times (issue 62): each attempt a fresh profile,
# the suite's sweep and the validation, in directories of its own, then a summary of every attempt from its
# rows (python -m zerobench.sim.attempts). Run it on a quiet machine: nothing else should share the cores.
#
#   scripts/sim_attempts.sh 5 runs/attempts        # then, to commit: python -m zerobench.sim.attempts runs/attempts --trim
#
# SUITE (default cpu/sim_validation) picks another suite; ZEROBENCH (default "python -m zerobench") the program.
set -euo pipefail

usage="usage: scripts/sim_attempts.sh N OUTDIR"
n=${1:?$usage}
out=${2:?$usage}
suite=${SUITE:-cpu/sim_validation}
zb=${ZEROBENCH:-python -m zerobench}
case $n in ''|*[!0-9]*|0) echo "zerobench: error: N must be a positive whole number, got '$n' ($usage)" >&2; exit 2;; esac

mkdir -p "$out"
first=1
while [ -e "$out/attempt-$first" ]; do first=$((first + 1)); done  # never over an earlier attempt
for i in $(seq "$first" $((first + n - 1))); do
    d="$out/attempt-$i"
    echo "== attempt $i: $d ($(date -u +%FT%TZ))" >&2
    $zb profile --suite "$suite" --out "$d/profile"
    $zb sweep "$suite" --out "$d/runs"
    $zb simulate --profile "$d/profile" --validate "$d/runs" --fit --out "$d/validation" | tee "$d/validation.txt"
done
python -m zerobench.sim.attempts "$out"
