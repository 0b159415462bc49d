#!/usr/bin/env bash
# The paper's scaling sweep on 400 GPUs: 25 nodes x 16 GPUs (the paper's 25 DGX-2), one task per GPU.
#
#   sbatch slurm/scale_400gpu.sh                                   # Fig 2 ZeRO rows, 1.5B-170B
#   SUITE=paper/fig3 sbatch slurm/scale_400gpu.sh                  # another suite
#   sbatch --nodes=2 --ntasks-per-node=2 --gpus-per-node=2 slurm/scale_400gpu.sh   # fewer nodes
#
# Account, partition, QoS: SBATCH_ACCOUNT / SBATCH_PARTITION / SBATCH_QOS (sbatch reads them) or
# slurm/cluster.env, which is sourced first (modules, virtualenv, NCCL settings; see cluster.env.example).
# Rows go to results/<suite>/<job id>/ (ZEROBENCH_RESULTS overrides results/). A requeued job resumes there.
# Each run is one srun step laid out as whole nodes of --ntasks-per-node tasks, on a rendezvous port derived from
# the job id (MASTER_PORT overrides it).
#SBATCH --job-name=zerobench-scale400
#SBATCH --nodes=25
#SBATCH --ntasks-per-node=16
#SBATCH --gpus-per-node=16
#SBATCH --cpus-per-task=6
#SBATCH --time=24:00:00
#SBATCH --output=zerobench-scale400-%j.out
set -euo pipefail

die() { echo "scale_400gpu.sh: $*" >&2; exit 2; }
[[ -n "${SLURM_JOB_ID:-}" ]] || die "not inside a Slurm job: submit it with 'sbatch slurm/scale_400gpu.sh'"

repo=${ZEROBENCH_REPO:-${SLURM_SUBMIT_DIR:-$PWD}}
cd "$repo" || die "cannot enter the zerobench checkout $repo (set ZEROBENCH_REPO)"
if [[ -f slurm/cluster.env ]]; then
  # shellcheck source=/dev/null
  source slurm/cluster.env
fi

suite=${SUITE:-paper/fig2}
only=${ONLY-system=zerobench}          # the Fig 2 ZeRO rows by default; ONLY= runs every row
suite_file=suites/${suite%.yaml}.yaml
[[ -f "$suite" ]] && suite_file=$suite
[[ -f "$suite_file" ]] || die "suite '$suite' not found (looked for $suite_file): set SUITE to a file or a name under suites/"
name=$(basename "${suite_file%.yaml}")
# the results go under $ZEROBENCH_RESULTS/<name>: a name of dots (a file '...yaml') would climb out of it
[[ "$name" =~ ^[A-Za-z0-9_][A-Za-z0-9_.-]*$ ]] || die "suite file name '$name' cannot name a results directory: rename the file (letters, digits, _ . -, not starting with .)"
out=${ZEROBENCH_RESULTS:-$repo/results}/$name/$SLURM_JOB_ID

# Rendezvous: the first node of the allocation; NCCL defaults a cluster can override in cluster.env.
first=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n1)
addr=$(scontrol show node "$first" -o | tr ' ' '\n' | sed -n 's/^NodeAddr=//p')
export MASTER_ADDR=${MASTER_ADDR:-${addr:-$first}}
export NCCL_DEBUG=${NCCL_DEBUG:-WARN}
export TORCH_NCCL_ASYNC_ERROR_HANDLING=${TORCH_NCCL_ASYNC_ERROR_HANDLING:-1}
export NCCL_IB_TIMEOUT=${NCCL_IB_TIMEOUT:-22}

echo "zerobench: job $SLURM_JOB_ID, $SLURM_NNODES nodes, $SLURM_NTASKS tasks, master $MASTER_ADDR, suite $suite_file -> $out"
# a run that does not fit is a measurement (the baseline's limit, as the paper's figures show); a crashed or
# timed-out run fails the job, so that sacct tells the truth
args=(sweep "$suite_file" --launcher srun --out "$out" --no-progress --allow-oom)
[[ -n "$only" ]] && args+=(--only "$only")
# A requeued job (node failure, preemption) keeps its id, and so its directory: go on from the runs it finished.
if (( ${SLURM_RESTART_COUNT:-0} > 0 )); then
  args+=(--resume)
  echo "zerobench: restart ${SLURM_RESTART_COUNT} of job $SLURM_JOB_ID: resuming the sweep in $out"
fi
python -m zerobench "${args[@]}"
