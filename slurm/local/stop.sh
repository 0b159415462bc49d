#!/usr/bin/env bash
# Stop the local Slurm started by start.sh: signal every recorded daemon and wait for it to exit
# (pid files vanish before the daemons are gone, so the PIDs recorded at start are what we wait on).
set -euo pipefail
dir=${ZB_SLURM_DIR:-/tmp/zerobench-slurm}
[[ -f "$dir/pids" ]] || { echo "no local Slurm recorded in $dir"; exit 0; }
mapfile -t pids < "$dir/pids"
for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
for _ in $(seq 100); do
  alive=0
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
  [[ $alive -eq 0 ]] && break
  sleep 0.1
done
for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
rm -f "$dir/pids"
echo "local Slurm stopped"
