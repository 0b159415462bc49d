#!/usr/bin/env bash
# One zerobench run as a Slurm job (submitted by `zerobench sweep SUITE --launcher slurm`).
# $1 is the run's JSON spec (config, run id, output directory, suite); nothing from it is evaluated by
# the shell. Each srun task is one rank.
set -euo pipefail
spec=${1:?usage: sbatch slurm/run_one.sh RUN.json}
[[ -n "${SLURM_JOB_ID:-}" ]] || { echo "run_one.sh: not inside a Slurm job (submit it with sbatch)" >&2; exit 2; }
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
addr=$(scontrol show node "$first" -o | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
export MASTER_ADDR=${MASTER_ADDR:-${addr:-$first}}
export MASTER_PORT=${MASTER_PORT:-$((20000 + SLURM_JOB_ID % 20000))}
export PYTHONUNBUFFERED=1
# each rank writes how it ended here: srun's exit code is its SIGTERM to the others, whatever the first one returned
export ZEROBENCH_REPORT_DIR
ZEROBENCH_REPORT_DIR="$(dirname "$spec")/ranks"
mkdir -p "$ZEROBENCH_REPORT_DIR"
exec srun --kill-on-bad-exit=1 python -m zerobench.launch.task "$spec"
