#!/usr/bin/env bash
# Fig 4 (data parallelism only, no MP): ZeRO 1.5B-13B and the DDP baselines on 128 GPUs (8 x 16).
#   SUITE=paper/fig4 ONLY= sbatch --nodes=8 slurm/dp_only_128gpu.sh
#SBATCH --job-name=zerobench-dp128
#SBATCH --nodes=8
#SBATCH --ntasks-per-node=16
#SBATCH --gpus-per-node=16
#SBATCH --cpus-per-task=6
#SBATCH --time=12:00:00
#SBATCH --output=zerobench-dp128-%j.out
set -euo pipefail
export SUITE=${SUITE:-paper/fig4} ONLY=${ONLY-}
exec bash "${ZEROBENCH_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}/slurm/scale_400gpu.sh"
