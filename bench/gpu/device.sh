#!/usr/bin/env bash
# Runs the GPU checks on a lent GPU machine, from the kit bench/gpu/kit.sh built here
# (the machine has CUDA 13 and PyTorch but no Bazel, OpenMPI, SQLite or cJSON).
#
#   bench/gpu/device.sh KIT OUT STEP...
#
# Steps (each logs to OUT/<step>.log, and the script goes on after a failing step):
#   probe     what the machine has: GPU, driver, CUDA/cuBLASLt/NCCL libraries, PyTorch
#   kernels   the gpu-tagged test binaries (CUDA kernels against the CPU reference)
#   kbench    bench/kernels_bench: kernel throughput beside measured peaks
#   attnsweep bench/attention_bench: every flash-attention configuration; the fastest
#             (OUT/attn_best.env) is exported to the steps after it
#   torch     bench/gpu/torch_llama.py: PyTorch eager and torch.compile on the 1B model
#   cpprobe   bench/gpu/cp_probe.py: SDPA per backend at the ring's step shapes, and one
#             rank of torch's context-parallel ring on a fake process group (OUT/cp_probe.jsonl)
#   tpmem     bench/gpu/tp_mem_probe.py: the memory PyTorch allocates for one rank of a
#             torchtitan-style Llama step (TP + SP, FSDP, full AC) on a fake process group
#             (OUT/tp_mem.jsonl)
#   power     bench/gpu/power_probe.py: power draw, SM clock and bf16 GEMM TFLOP/s under 20 s
#             of sustained matrix load, random data then zeros (OUT/power.jsonl)
#   trainpower  meshplan train on llama-1b-bench for 120 steps on the GPU while nvidia-smi
#             samples power draw and SM clock every 200 ms (OUT/smi_train.csv): whether a
#             training step, not a GEMM loop, runs at the power cap
#   mpi       mpirun works: 2 CPU ranks train tiny-dense with dp_shard=2
#   gputrain  tests/runtime/gpu_parity.py: the tiny models on CUDA vs the CPU run; the
#             4-rank plan on the one GPU through MPI staging vs the single-rank GPU run
#   calib     meshplan calibrate --device cuda into OUT/calib.db
#   bench     bench/gpu/bench.py: meshplan bf16 and float8 and PyTorch eager/compile on the
#             1B model, with the predictions (calibrated when calib ran first); the table
#             goes to OUT/bench.md
#   benchmp   the same, meshplan's rows alone (no PyTorch runs)
# The last lines of every log are printed at the end, so the reply's output tail holds them.
set -uo pipefail
kit=$(cd "$1" && pwd)
out=$2
shift 2
mkdir -p "$out"
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$root"

# CUDA's libraries from the machine (toolkit first, then PyTorch's wheels for NCCL).
cudalib=/usr/local/cuda/lib64
nccldir=$(dirname "$(find / -xdev -name 'libnccl.so.2' 2>/dev/null | head -n 1)" 2>/dev/null)
libs="$kit/lib:$cudalib${nccldir:+:$nccldir}"
# The machine's own OpenMPI 4.1 when it has one (same libmpi.so.40 ABI); else Debian's from
# the kit, at its own paths, never overwriting anything.
if ldconfig -p | grep -q 'libmpi\.so\.40 ' && command -v mpirun >/dev/null; then
  mpi_from=machine
elif [ ! -d "$kit/mpilib" ]; then
  mpi_from=none
  echo "device.sh: no OpenMPI 4.1 on this machine and none in the kit (bench/gpu/kit.sh without --no-mpi)"
else
  mpi_from=kit
  cp -an "$kit/root/." / 2>/dev/null
  libs="$libs:$kit/mpilib"
fi
# Only our binaries see these (PyTorch brings its own cuDNN and NCCL).
export LD_LIBRARY_PATH="$libs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export OMPI_MCA_mca_base_component_show_load_errors=0 OMPI_MCA_btl=self,vader
export PATH="$kit/bin:$PATH"
mp="$kit/bin/meshplan"

step_probe() {
  nvidia-smi
  nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm,power.limit,memory.total --format=csv
  grep PRETTY /etc/os-release; ldd --version | head -n 1; nproc
  ls $cudalib | grep -E 'cudart|cublasLt|nccl|cudnn' | head -20
  echo "nccl dir: $nccldir; OpenMPI from the $mpi_from"
  mpirun --version | head -n 1; ls -la "$(command -v mpirun)"; ldconfig -p | grep -E 'libmpi\.so|libpmix' 
  env -u LD_LIBRARY_PATH python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "cudnn", torch.backends.cudnn.version(), "nccl", torch.cuda.nccl.version())'
  for b in mpirun bazel gnuplot sqlite3 nvcc; do printf '%s: %s\n' "$b" "$(command -v $b || echo none)"; done
  ldd "$mp" | grep -E 'not found' || echo "meshplan: all libraries found"
  "$mp" --version
}
step_kernels() {
  local rc=0
  for t in "$kit"/bin/*_test; do
    echo "== $(basename "$t")"
    timeout 120 "$t" --gtest_brief=1 || rc=1
  done
  return $rc
}
step_kbench() { timeout 300 "$kit/bin/kernels_bench"; }
step_attnsweep() {
  timeout 400 "$kit/bin/attention_bench" | tee "$out/attn_sweep.txt"
  local best
  best=$(grep '^best: ' "$out/attn_sweep.txt" | tail -n 1 | sed 's/^best: //')
  [ -n "$best" ] && printf 'export %s\n' "$best" >"$out/attn_best.env"
}
step_torch() { PYTHONUNBUFFERED=1 timeout 300 env -u LD_LIBRARY_PATH python3 bench/gpu/torch_llama.py --out "$out/torch.jsonl"; }
step_cpprobe() { PYTHONUNBUFFERED=1 timeout 300 env -u LD_LIBRARY_PATH python3 bench/gpu/cp_probe.py --out "$out/cp_probe.jsonl"; }
step_tpmem() {
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True PYTHONUNBUFFERED=1 timeout 400 env -u LD_LIBRARY_PATH \
    python3 bench/gpu/tp_mem_probe.py --out "$out/tp_mem.jsonl"
}
step_power() { PYTHONUNBUFFERED=1 timeout 120 env -u LD_LIBRARY_PATH python3 bench/gpu/power_probe.py --out "$out/power.jsonl"; }
step_trainpower() {
  nvidia-smi --query-gpu=timestamp,power.draw,clocks.sm,clocks_event_reasons.active --format=csv,noheader,nounits \
    -lms 200 >"$out/smi_train.csv" &
  local smi=$!
  timeout 120 "$mp" train --model llama-1b-bench --device cuda --seq 2048 --micro-batch 4 --global-batch 4 \
    --steps 120 --data synthetic --quiet
  local rc=$?
  kill $smi
  return $rc
}
step_gputrain() { timeout 900 python3 tests/runtime/gpu_parity.py "$mp"; }
step_gpusingle() { MP_GPU_PARITY_SINGLE_ONLY=1 timeout 900 python3 tests/runtime/gpu_parity.py "$mp"; }
step_calib() { rm -f "$out/calib.db"; timeout 300 "$mp" calibrate --device cuda --db "$out/calib.db"; }
step_bench() {
  local db=/tmp/bench.db
  rm -f $db; [ -f "$out/calib.db" ] && cp "$out/calib.db" $db
  local reuse=()
  [ -s "$out/torch.jsonl" ] && reuse=(--torch-json "$out/torch.jsonl") # the torch step ran in this call
  [ ${#reuse[@]} -eq 0 ] && [ -s "$kit/torch.jsonl" ] && reuse=(--torch-json "$kit/torch.jsonl") # an earlier call's
  PYTHONUNBUFFERED=1 timeout 900 python3 bench/gpu/bench.py --meshplan "$mp" --db $db --out "$out/bench.md" "${reuse[@]}" "$@"
}
step_benchmp() { step_bench --skip-torch; }
step_mpi() {
  timeout 120 mpirun -np 2 "$mp" train --model tiny-dense --mesh dp_shard=2 --steps 3 --seq 64 --micro-batch 2
}

rc=0
for s in "$@"; do
  echo "=== $s ($(date -u +%H:%M:%S))"
  t0=$(date +%s)
  [ -f "$out/attn_best.env" ] && . "$out/attn_best.env"
  "step_$s" >"$out/$s.log" 2>&1
  r=$?
  echo "=== $s: exit $r in $(($(date +%s) - t0)) s"
  [ $r -ne 0 ] && rc=1
done
for s in "$@"; do
  echo "----- $s (tail)"
  tail -n 40 "$out/$s.log"
done
exit $rc
