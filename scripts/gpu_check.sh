#!/usr/bin/env bash
# GPU checks for a lent CUDA machine (run from the repository root; results under $OUT, default ./gpu-out).
# Uses the machine's own torch/triton (no install: nothing can be fetched there), zerobench from this tree.
#   sections: env | kernels | bench | train | multirank | offload | deepspeed-offload | simulate | overheads | rates
#   (default: env kernels bench train)
# deepspeed-offload (layer counts: DS2_LAYERS, DS3_LAYERS) needs DeepSpeed importable by $PY; the machine has no network, so make the wheels here
# (scripts/fetch_gpu_wheels.sh writes .whl/), carry `.whl`, and start the device command with
#   python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
set -u
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
PY=${PY:-python3}
sections=${*:-env kernels bench train}
for s in $sections; do
  echo "=== $s ==="
  case $s in
    env)
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
      "$PY" -c 'import torch, triton, sys; print(sys.version.split()[0], torch.__version__, triton.__version__, torch.cuda.get_device_name())'
      # the attention kernel SDPA gives zerobench's call (the simulator charges cuDNN's on sm90: software.SDPA_2026)
      "$PY" - <<'PYEOF'
import torch
from torch.nn.attention import SDPBackend
qkv = torch.randn(8, 1024, 3, 16, 128, device="cuda", dtype=torch.bfloat16, requires_grad=True)
q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)
pick = int(torch._fused_sdp_choice(q, k, v, is_causal=True))
names = {int(b): n for n, b in SDPBackend.__members__.items()}
print("cudnn", torch.backends.cudnn.version(), "sdpa backend for zerobench's attention:", names.get(pick, pick))
PYEOF
      which g++ nvcc ;;
    rates)  # issue 59: the held-out rows' GEMMs by shape, one GEMM sustained for 10 s, and SDPA's flash
      # (FlashAttention-2), cuDNN and efficient kernels, each beside what the replay charges it (about 2 minutes)
      timeout 240 "$PY" -m zerobench.sim.card_rates --out "$OUT/rates" 2>&1 | tee "$OUT/rates.log" ;;
    kernels)  # the kernel tests with the Triton kernels compiled for the GPU (no interpreter)
      timeout 400 "$PY" -m pytest tests/kernels -q -p no:cacheprovider 2>&1 | tee "$OUT/kernels-tests.log" | tail -15 ;;
    bench)
      timeout 240 "$PY" -m zerobench bench-kernels --device cuda --numel 200000000 --rounds 15 --no-deepspeed --ops --compile \
        --rows 16384 --hidden 4096 --out "$OUT/bench-kernels" 2>&1 | tee "$OUT/bench-kernels.log" | tail -30 ;;
    train)  # one GPU, NCCL world of 1: every stage's CUDA path, fp32 and bf16; losses must agree across stages
      for prec in fp32 bf16; do for st in 0 1 2 3; do
        timeout 120 "$PY" -m zerobench train --preset small --seq 1024 --micro-batch 8 --steps 8 --warmup 3 --stage $st \
          --precision $prec --out "$OUT/train" --run-id "s$st-$prec" 2>&1 | tee -a "$OUT/train.log" | grep -E "^step +8|median|Error|error" ;
      done; done ;;
    multirank)  # issue 23: two ranks on one card (auto backend: gloo), the parity section, then under the real torchrun
      timeout 1800 "$PY" -m pytest tests/gpu -q -p no:cacheprovider 2>&1 | tee "$OUT/gpu-tests.log" | tail -15
      for st in 0 3; do
        timeout 300 "$PY" -m torch.distributed.run --standalone --nproc-per-node 2 -m zerobench train --preset mini \
          --stage $st --precision bf16 --steps 8 --warmup 3 --out "$OUT/torchrun/s$st" --run-id "torchrun-s$st" 2>&1 |
          tee -a "$OUT/torchrun.log" | grep -E "^step +8|median|Error|error" ;
      done ;;
    offload)  # one card emulated as 8 GiB: the largest GPT with and without ZeRO-Offload (bf16, h=2048)
      common=(--preset small --hidden 2048 --heads 16 --seq 1024 --vocab 16384 --micro-batch 2
              --checkpoint-activations --precision bf16 --steps 3 --warmup 1 --memory-budget 8GiB --out "$OUT/offload")
      run() { echo "--- $*"; timeout 200 "$PY" -m zerobench train "${common[@]}" "$@" 2>&1 | tee -a "$OUT/offload.log" |
              grep -E "GPT |median step|out of memory|OutOfMemory|Error|^ +0 " ; }
      [ -n "${SKIP_BASELINE:-}" ] || { run --stage 2 --layers 6 --run-id nooff-L6; run --stage 2 --layers 8 --run-id nooff-L8; }
      run --stage 2 --layers 56 --offload-optimizer cpu --run-id off-L56
      run --stage 2 --layers 64 --offload-optimizer cpu --run-id off-L64
      run --stage 3 --layers 96 --offload-optimizer cpu --offload-param cpu --run-id offp-L96 ;;
    simulate)  # issue 22 on one card: profile, max size vs the planner, the runs (SIM_SUITE, default gpu/sim_validation)
      suite=${SIM_SUITE:-gpu/sim_validation}  # gpu/sim_device_bound: the step-time bar's two device-bound sizes
      timeout 200 "$PY" -m zerobench profile --device cuda --suite "$suite" --out "$OUT/profile" 2>&1 | tail -3
      shape=(--hidden 2048 --heads 16 --vocab 50304 --seq 1024 --micro-batch 8 --precision bf16 --stage 2 --bucket-size 6250000)
      planned=$("$PY" -m zerobench plan --max-size --profile "$OUT/profile" --gpus 1 --gpu-mem 24GiB "${shape[@]}" --json |
                "$PY" -c 'import json, sys; print(json.load(sys.stdin)["max_layers"])')
      echo "planner (measured terms): $planned layers fit 24 GiB"
      timeout 240 "$PY" -m zerobench maxsize --budget 24GiB --dp 1 --preset small "${shape[@]}" --start-layers "$planned" \
        --timeout 120 --out "$OUT/maxsize" --probes "$OUT/maxsize-probes" 2>&1 | tail -4
      timeout 300 "$PY" -m zerobench sweep "$suite" --out "$OUT/runs" --no-progress --allow-failures > "$OUT/sweep.log" 2>&1
      "$PY" -m zerobench simulate --profile "$OUT/profile" --validate "$OUT/runs" 2>&1 | tail -14 ;;
    overheads)  # issue 24 on one card: each stage next to torch's systems at a world of 1 (NCCL; no communication,
      # so what differs is each engine's own work), then stage 3, FSDP1 and FSDP2 traced (zerobench train --profile)
      timeout "${PEERS_TIMEOUT:-400}" "$PY" -m zerobench peers --dp 1 --preset small --micro-batch 8 --steps 10 \
        --warmup 3 --rounds "${ROUNDS:-2}" --out "$OUT/peers" --systems zerobench-0 zerobench-1 zerobench-2 zerobench-3 \
        torch-ddp torch-zero1 fsdp1-shard-grad-op fsdp2-no-reshard fsdp1-full-shard fsdp2 2>&1 | tee "$OUT/peers.log" |
        grep -v "^\[" | tail -40
      [ -d "$OUT/peers/summary" ] || "$PY" -m zerobench peers --summarize "$OUT/peers" | tail -40  # cut by the limit
      for sys in zerobench fsdp1-full-shard fsdp2; do
        stage=(); [ $sys = zerobench ] && stage=(--stage 3)
        timeout 120 "$PY" -m zerobench train --system $sys "${stage[@]}" --preset small --micro-batch 8 --steps 8 \
          --warmup 3 --kernels reference --profile "$OUT/profile" --profile-steps 2 --run-id "prof-$sys" \
          --out "$OUT/profile-rows/$sys" 2>&1 | grep -E "median|profile of|Error|error"
        head -25 "$OUT/profile/prof-$sys/rank0.ops.txt" | cut -c1-160
      done ;;
    deepspeed-offload)  # DeepSpeed's ZeRO-Offload and zerobench's, side by side on the same emulated 8 GiB card and model
      "$PY" -c 'import deepspeed' || { echo "DeepSpeed is not importable: see the header"; continue; }
      common=(--preset small --hidden 2048 --heads 16 --seq 1024 --vocab 16384 --micro-batch 2
              --checkpoint-activations --precision bf16 --steps "${STEPS:-5}" --warmup 1 --memory-budget 8GiB
              --out "$OUT/ds-offload")
      run() { echo "--- $*"; timeout 300 "$PY" -m zerobench train "${common[@]}" "$@" 2>&1 | tee -a "$OUT/ds-offload.log" |
              grep -E "GPT |median step|out of memory|OutOfMemory|Error|^ +0 " ; }
      # DeepSpeedCPUAdam is built just in time on first use (ninja + the host compiler): build it once, timed.
      t0=$SECONDS; "$PY" -c 'from deepspeed.ops.op_builder import CPUAdamBuilder; CPUAdamBuilder().load()' 2>&1 | tail -3
      echo "cpu_adam op ready in $((SECONDS - t0)) s"
      # Optimizer offload only on both sides (DeepSpeed's offload_optimizer; zerobench --offload-optimizer cpu).
      for L in ${DS2_LAYERS-56 64 72}; do
        run --system deepspeed-2-offload --layers $L --run-id ds2off-L$L
        run --stage 2 --offload-optimizer cpu --layers $L --run-id zb2off-L$L
      done
      for L in ${DS3_LAYERS-64}; do
        run --system deepspeed-3-offload --layers $L --run-id ds3off-L$L
        run --stage 3 --offload-optimizer cpu --layers $L --run-id zb3off-L$L
      done ;;
  esac
done
