#!/usr/bin/env bash
# Fig 3 (superlinear scaling): 60B on 64, 128, 256 and 400 GPUs, as a chain of jobs of growing size.
# Each step is scale_400gpu.sh with SUITE=paper/fig3 restricted to one GPU count; each waits for the
# previous one (afterany), so one failure does not stop the chain. Run from the repository root:
#   bash slurm/scale_60b.sh
set -euo pipefail
cd "$(dirname "$0")/.."
prev=""
for gpus in 64 128 256 400; do
  nodes=$(( (gpus + 15) / 16 ))
  per_node=$(( gpus / nodes ))
  dep=()
  [[ -n "$prev" ]] && dep=(--dependency="afterany:$prev")
  prev=$(SUITE=paper/fig3 ONLY="gpus=$gpus" sbatch --parsable "${dep[@]}" --nodes="$nodes" \
         --ntasks-per-node="$per_node" --gpus-per-node="$per_node" --job-name="zerobench-60b-$gpus" \
         slurm/scale_400gpu.sh)
  echo "submitted 60B on $gpus GPUs: job $prev"
done
