#!/usr/bin/env bash
# Issue 61's prepared command for a lent GPU (one H100 or H200), run from the repository root: the multi-rank
# CUDA path, torchrun, a Slurm batch job with the card as a GRES, and the single-card table against every peer,
# each step under its own timeout. Everything goes under $OUT as it is made; each section ends as one archive
# $OUT/<section>.tgz (the device returns at most 8 files), beside console.log and summary.txt (a line per section:
# status, seconds, what it ran).
#
#   scripts/gpu_first.sh [SECTION ...]      tests torchrun slurm table trace (default: the first four, in order)
#
# Budget on one card, seconds (GPU_FIRST_BUDGET=480 in all; each section stops at its own cap):
#   prep 20   install the carried wheels, versions
#   tests 110 tests/gpu -k "$CUDA_PATHS": 5 cases (bucket streams/events, stage-3 gather/free + prefetch, pinned
#             host copies of offload and P_a+cpu, fp16 loss scaler across ranks) + 2 one-process references
#   torchrun 50   zerobench train under torchrun --nproc-per-node 2 on the card, stages 0 and 3
#   slurm 60  slurm/local/start.sh with the card as GRES gpu, sbatch --gres=gpu:1 slurm/scale_400gpu.sh
#             (SUITE=gpu/one_card_slurm), the job's rows checked, the cluster stopped
#   table     what is left (about 240): zerobench peers --dp 1 --precision bf16, seq 2048, 1.3B, every system
#             once (on an H200 about 30 s a system, 330 s for the eleven uncompiled ones). 2.7B, and a second
#             round, do not fit in the same 8 minutes: run them as their own call, TABLE_SIZES=2.7b
#             scripts/gpu_first.sh table (about 55 s a system on an H200: pick TABLE_SYSTEMS to fit the lease).
#   trace     (only when named) zerobench peers --profile of TRACE_SYSTEMS (default: zerobench-3 fsdp2-compiled
#             zerobench-3-compiled) at the table's 1.3B shape, each system as the table runs it, its last two steps
#             traced: the traces (gzipped), the operator tables, and kernels.json (train/profiling.py
#             kernel_summary: the device time by kernel class) beside them; about 45 s a system on an H200
# Carried with the tree (the machine has no network; make them here): .whl (scripts/fetch_gpu_wheels.sh: DeepSpeed,
# megatron-core) and .debs (scripts/fetch_gpu_debs.sh: Slurm and munge): run with carry [".whl", ".debs"].
#
# Environment: OUT (default gpu-first-out), PY (python3), GPU_FIRST_BUDGET (480), TABLE_SIZES (1.3b; 2.7b),
# TABLE_ROUNDS (1), TABLE_SYSTEMS (default below), TABLE_STEPS (8, warm-up 3), MB_1P3B (8), MB_2P7B (4 on an
# 80 GB card, 8 on a card of 120 GiB or more): the largest micro-batches expected to fit, from the 1.3B peak
# measured on an H100 at seq 1024 (37.2 GB at micro-batch 8: 21 GB of states, about 2 MB of activations a token)
# scaled to seq 2048 and to 2.7B (1.7x a token); on the H200 2.7B at 8 peaked at 106 GB (DDP). A system that does
# not fit is a failed row with its reason, the others go on.
# GPU_FIRST_SMOKE=1: every section at tiny sizes on a CPU (no card, no carried files): checks the plumbing.
set -u
OUT=${OUT:-gpu-first-out}
mkdir -p "$OUT"
OUT=$(cd "$OUT" && pwd)
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
SMOKE=${GPU_FIRST_SMOKE:-}
SMOKE_TAG=${SMOKE:+-smoke}
BUDGET=${GPU_FIRST_BUDGET:-480}
SECTIONS=(tests torchrun slurm table trace)
sections=("$@")
[[ ${#sections[@]} -gt 0 ]] || sections=(tests torchrun slurm table)
for s in "${sections[@]}"; do
  [[ " ${SECTIONS[*]} " == *" $s "* ]] || {
    echo "gpu_first.sh: unknown section '$s': choose from ${SECTIONS[*]}" >&2
    exit 2
  }
done
exec > >(tee -a "$OUT/console.log") 2>&1

left() { echo $((BUDGET - SECONDS)); }
cap() { local l; l=$(left); echo $(($1 < l ? $1 : l)); }  # a section's cap, never past the whole budget

prep() {
  if [[ -z $SMOKE && -d .whl ]] && ! "$PY" -c 'import deepspeed, megatron.core' 2>/dev/null; then
    timeout 60 "$PY" -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl &&
      export PYTHONPATH=$PYTHONPATH:/tmp/site
  fi
  command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  "$PY" -W ignore - "$SMOKE" <<'EOF'
import importlib, sys, torch
card = torch.cuda.get_device_name() if torch.cuda.is_available() else "none"
print("python", sys.version.split()[0], "torch", torch.__version__, "card", card)
for m in ("triton", "deepspeed", "megatron.core")[: 1 if sys.argv[1] else 3]:  # smoke: no slow imports
    try:
        print(m, getattr(importlib.import_module(m), "__version__", "?"))
    except Exception as e:  # noqa: BLE001
        print(m, "missing:", type(e).__name__, e)
EOF
}

sec_tests() {  # $1: the section's directory
  local expr n
  expr=$("$PY" -c 'from tests.gpu.test_one_card import CUDA_PATHS; print(CUDA_PATHS)') || return 1
  "$PY" -m pytest tests/gpu -k "$expr" --collect-only -q -p no:cacheprovider > "$1/collected.txt" 2>&1
  n=$(grep -c '::' "$1/collected.txt")
  echo "tests/gpu -k '$expr': $n cases"
  [[ $n -eq 5 ]] || { echo "expected the 5 CUDA-path cases"; return 1; }
  timeout "$(cap 110)" "$PY" -m pytest tests/gpu -k "$expr" -q -p no:cacheprovider -rA \
    --junitxml="$1/junit.xml" > "$1/pytest.log" 2>&1
  local rc=$?
  tail -12 "$1/pytest.log"
  return $rc
}

sec_torchrun() {
  local st rc=0 args=(--preset mini --precision bf16 --steps 8 --warmup 3)
  [[ -z $SMOKE ]] || args=(--preset tiny --precision fp32 --steps 3 --warmup 1)
  for st in 0 3; do
    timeout "$(cap 25)" "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 -m zerobench train \
      "${args[@]}" --stage "$st" --out "$1/s$st" --run-id "torchrun-s$st" > "$1/torchrun-s$st.log" 2>&1 || rc=1
    grep -E "^step|median|[Ee]rror" "$1/torchrun-s$st.log" | tail -4
  done
  return $rc
}

sec_slurm() {
  local d=$1 job rc suite cpus
  if ! command -v sbatch >/dev/null; then
    [[ -d .debs ]] || { echo "no Slurm here and no .debs carried (scripts/fetch_gpu_debs.sh)"; return 1; }
    export ZB_SLURM_DEBS=$PWD/.debs
  fi
  if ! command -v python >/dev/null; then  # the job scripts call python, as a cluster's environment provides it
    mkdir -p "$d/bin" && ln -sf "$(command -v "$PY")" "$d/bin/python" && export PATH=$d/bin:$PATH
  fi
  cpus=$(nproc)
  export ZB_SLURM_DIR=/tmp/zb-gpu-first-slurm ZB_SLURM_NODES=1 ZB_SLURM_CPUS=$cpus
  if ! timeout 40 bash slurm/local/start.sh; then
    cp -r "$ZB_SLURM_DIR/log" "$d/daemons" 2>/dev/null
    bash slurm/local/stop.sh  # the daemons that did start
    return 1
  fi
  export SLURM_CONF=$ZB_SLURM_DIR/slurm.conf
  cp "$ZB_SLURM_DIR/gres.conf" "$ZB_SLURM_DIR/slurm.conf" "$ZB_SLURM_DIR/cgroup.conf" "$d/"
  suite=gpu/one_card_slurm
  if [[ -n $SMOKE ]]; then
    suite=$d/smoke.yaml
    printf '%s\n' "name: smoke" "base: {preset: tiny, dp: 1, steps: 3, warmup: 1, timeout: 120}" \
      "runs:" "  - {label: tiny-s3, stage: 3}" > "$suite"
  fi
  # --gpus-per-node=1 overrides the script's own #SBATCH --gpus-per-node=16 (else its srun steps ask for 16)
  job=$(SUITE=$suite ZEROBENCH_RESULTS=$d/results timeout "$(cap 60)" sbatch --wait --parsable --nodes=1 \
    --ntasks-per-node=1 --gres=gpu:1 --gpus-per-node=1 --cpus-per-task=$((cpus / 2)) \
    --output="$d/job-%j.out" slurm/scale_400gpu.sh)
  rc=$?
  job=${job%%;*}
  scontrol show job -o "$job" > "$d/job.txt" 2>&1
  tr ' ' '\n' < "$d/job.txt" | grep -E "^(JobState|ExitCode|TresPerNode)="
  [[ $rc -eq 0 ]] && "$PY" - "$d/results" "$job" "$SMOKE" <<'EOF' || rc=1
import sys
from pathlib import Path
from zerobench.results.rows import read_rows
out, job, smoke = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
rows = [r for p in out.rglob("rows.jsonl") for r in read_rows(p.parent)]
status = {r["run_id"]: r["status"] for r in rows if r["metric"] == "run_status"}
hw = {(r.get("provenance") or {}).get("hardware", {}).get("kind") for r in rows if r["metric"] == "loss"}
jobs = {(r.get("provenance") or {}).get("slurm", {}).get("job_id") for r in rows if r["metric"] == "loss"}
print("runs:", status, "hardware:", hw, "slurm jobs:", jobs)
ok = status and set(status.values()) == {"ok"} and jobs == {job} and hw == {"cpu" if smoke else "gpu"}
sys.exit(0 if ok else 1)
EOF
  bash slurm/local/stop.sh
  cp -r "$ZB_SLURM_DIR/log" "$d/daemons" 2>/dev/null
  return $rc
}

sec_table() {
  local size shape mb rc=0 systems t out
  # the compiled candidates first after stage 0 and 3: stage 3 against compiled FSDP2 is the open comparison
  systems=(zerobench-0 zerobench-3 zerobench-3-compiled torch-ddp fsdp2-compiled fsdp2 zerobench-0-compiled
    deepspeed-3 zerobench-1 zerobench-2 deepspeed-1 deepspeed-2 megatron-core)
  [[ -z $SMOKE ]] || systems=(zerobench-0 zerobench-3 zerobench-3-compiled torch-ddp fsdp2)
  [[ -z ${TABLE_SYSTEMS:-} ]] || read -r -a systems <<< "$TABLE_SYSTEMS"
  for size in ${TABLE_SIZES:-1.3b}; do
    shape_of "$size" || return 1
    out=$1/$size$SMOKE_TAG
    t=$(($(left) - 15))
    [[ $t -ge 30 ]] || { echo "table $size: ${t}s left of the budget, not started"; rc=1; continue; }
    timeout "$t" "$PY" -m zerobench peers --dp 1 --precision bf16 "${shape[@]}" --micro-batch "$mb" \
      --steps "${TABLE_STEPS:-8}" --warmup 3 --rounds "${TABLE_ROUNDS:-1}" --no-memory-run --no-reference-run \
      --systems "${systems[@]}" --out "$out" > "$out.log" 2>&1 || rc=1
    [[ -d $out/summary ]] || "$PY" -m zerobench peers --summarize "$out" >> "$out.log" 2>&1  # cut by its timeout
    grep -v "^\[" "$out.log" | tail -30
  done
  return $rc
}

mb_2p7b() {  # 8 where the card has 120 GiB or more (H200), else 4 (H100 80 GB)
  local mib
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -1)
  [[ ${mib:-0} -ge 122880 ]] && echo 8 || echo 4
}

shape_of() {  # $1: a table size; sets shape and mb
  case $1 in
    1.3b) shape=(--preset small --layers 24 --hidden 2048 --heads 16 --vocab 50304 --seq 2048); mb=${MB_1P3B:-8} ;;
    2.7b) shape=(--preset small --layers 32 --hidden 2560 --heads 32 --vocab 50304 --seq 2048)
      mb=${MB_2P7B:-$(mb_2p7b)} ;;
    *) echo "TABLE_SIZES: unknown size $1 (1.3b, 2.7b)"; return 1 ;;
  esac
  [[ -z $SMOKE ]] || { shape=(--preset tiny); mb=2; }
}

sec_trace() {  # each system exactly as the table runs it (zerobench peers --profile), its last two steps traced
  local rc=0 shape mb d=$1/1.3b$SMOKE_TAG t systems
  shape_of 1.3b || return 1
  t=$(($(left) - 15))
  [[ $t -ge 30 ]] || { echo "trace: ${t}s left of the budget, not started"; return 1; }
  read -r -a systems <<< "${TRACE_SYSTEMS:-zerobench-3 fsdp2-compiled zerobench-3-compiled}"
  timeout "$t" "$PY" -m zerobench peers --dp 1 --precision bf16 "${shape[@]}" --micro-batch "$mb" --steps 7 \
    --warmup 3 --rounds 1 --no-memory-run --no-reference-run --systems "${systems[@]}" --profile "$d/prof" \
    --out "$d" > "$d.log" 2>&1 || rc=1
  [[ -d $d/summary ]] || "$PY" -m zerobench peers --summarize "$d" >> "$d.log" 2>&1
  grep -v "^\[" "$d.log" | head -8
  "$PY" - "$d/prof" "$SMOKE" <<'EOF' || rc=1
import gzip, json, shutil, sys
from pathlib import Path
from zerobench.train.profiling import kernel_summary
for trace in sorted(Path(sys.argv[1]).glob("*/rank0.trace.json")):
    if not sys.argv[2]:  # a CPU trace has no kernels
        s = kernel_summary(json.loads(trace.read_text()))
        (trace.parent / "kernels.json").write_text(json.dumps(s, indent=1))
        print(f"{trace.parent.name}: device step {s['device_step_ms']:.1f} ms, busy {s['device_busy_ms']:.1f} ms:",
              ", ".join(f"{c} {v:.1f}" for c, v in s["by_class_ms"].items()))
    with trace.open("rb") as f, gzip.open(f"{trace}.gz", "wb", compresslevel=3) as g:
        shutil.copyfileobj(f, g)
    trace.unlink()
EOF
  return $rc
}

echo "=== prep ($(date -u +%FT%TZ))"
prep
for s in "${sections[@]}"; do
  echo "=== $s (${SECONDS}s of ${BUDGET}s used)"
  mkdir -p "$OUT/$s"
  t0=$SECONDS
  "sec_$s" "$OUT/$s"
  rc=$?
  status=$([[ $rc -eq 0 ]] && echo ok || echo "failed (rc $rc)")
  echo "$s: $status in $((SECONDS - t0))s" | tee -a "$OUT/summary.txt"
  tar czf "$OUT/$s.tgz" -C "$OUT" "$s" && rm -rf "${OUT:?}/$s"
done
echo "=== done in ${SECONDS}s"
! grep -q failed "$OUT/summary.txt"
