#!/usr/bin/env bash
# meshplan calibrate end to end: measures (one rank without mpirun, or NP ranks under
# mpirun --oversubscribe), prints its table, saves to the database; a second calibration
# is the newest; meshplan simulate --calibration applies it and says so; the refusals
# (cuda, unusable database, GPU profile) are one clear line with a non-zero exit.
#
# Usage: calibrate_cli_test.sh MESHPLAN NP. mpirun flags as tests/comm/run_mpi.sh (see
# there why: shared-memory transport only, backing files in the test's private TMPDIR).
set -u
bin="$1"
np="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export TMPDIR="$tmp"
export OMPI_MCA_btl="self,vader"
# OpenMPI leaks at finalize inside modules it has already unloaded (no suppression can
# name them): leak checking off for the ranks under mpirun, as tests/runtime/parity.sh.
if [ "${2:-1}" -gt 1 ]; then export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"; fi
db="$tmp/x.db"
rm -f "$db" "$db-wal" "$db-shm"
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }

calibrate() {
  if [ "$np" = 1 ]; then
    timeout 120 "$bin" calibrate "$@"
  else
    unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE
    local root=()
    if [ "$(id -u)" = 0 ]; then root=(--allow-run-as-root); fi
    # One OpenMP thread per rank: NP ranks share the cores of this machine.
    OMP_NUM_THREADS=1 timeout 120 mpirun "${root[@]}" -np "$np" --oversubscribe --bind-to none \
      --mca btl self,vader --mca btl_vader_backing_directory "$tmp" "$bin" calibrate "$@"
  fi
}

# --quick: 4 GEMM shapes x fwd, dgrad, wgrad, 2 attention shapes, every element-wise
# kernel once (the full default set is minutes of test time on 2 cores under mpirun).
out=$(calibrate --device cpu --quick --reps 2 --db "$db" 2>&1)
rc=$?
echo "$out"
check "calibrate exits 0" "[ $rc -eq 0 ]"
check "names calibration #1 with $np rank(s) and its fit" \
  "echo \"\$out\" | grep -qE '^calibration #1 cpu on .* x $np rank.*gemm_eff_max [0-9.]+ .*kernel_overhead [0-9.]+ us'"
gemm_row='^  (fwd|dgrad|wgrad) +[0-9]+ +[0-9]+ +[0-9]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ +[-+][0-9.]+$'
for p in fwd dgrad wgrad; do
  check "four $p GEMM rows" "[ \$(echo \"\$out\" | grep -E '$gemm_row' | grep -cE '^  $p ') -eq 4 ]"
done
check "four attention rows" \
  "[ \$(echo \"\$out\" | grep -cE '^  (fwd|bwd) +([0-9]+ +){5}[0-9.]+ +[0-9.]+ +[-+][0-9.]+$') -eq 4 ]"
check "ten element-wise rows" "[ \$(echo \"\$out\" | grep -cE \
  '^  (rmsnorm|swiglu|rope|ce)_(fwd|bwd) +[0-9]+ +[0-9.]+ +[0-9.]+ +[-+][0-9.]+$|^  (adamw|residual) +[0-9]+ +[0-9.]+ +[0-9.]+ +[-+][0-9.]+$') -eq 10 ]"
check "kernel call figure" "echo \"\$out\" | grep -qE '^kernel call: [0-9.]+ us per call'"
check "the stack it fits" "echo \"\$out\" | grep -q '^meshplan-cpu under --calibration'"
check "copy bandwidth" "echo \"\$out\" | grep -qE '^memory copy: [0-9.]+ GB/s'"
if [ "$np" = 1 ]; then
  check "no collectives on one rank" "echo \"\$out\" | grep -q 'not measured with 1 rank'"
else
  for c in all_reduce all_gather reduce_scatter all_to_all; do
    check "$c at $np ranks: 5 sizes, alpha, beta" \
      "echo \"\$out\" | grep -qE '^ +$np $c( +[0-9.]+){8}$'"
  done
  check "link line" "echo \"\$out\" | grep -q 'all_reduce fit at $np ranks'"
fi

# A second calibration (JSON) is #2 and is the one simulate applies.
out=$(calibrate --device cpu --quick --reps 1 --db "$db" --json 2>&1)
rc=$?
check "json calibrate exits 0" "[ $rc -eq 0 ]"
check "json names id 2" "echo \"\$out\" | grep -qE '\"id\":[[:space:]]*2,'"
check "json world" "echo \"\$out\" | grep -qE '\"world\":[[:space:]]*$np,'"
check "json fit" "echo \"\$out\" | grep -qE '\"hbm_eff\":[[:space:]]*[0-9]'"
check "json element-wise points" "echo \"\$out\" | grep -qE '\"kernel\":[[:space:]]*\"residual\"'"

sim=(simulate --model tiny-dense --gpus 2 --gpu cpu --mesh dp_shard=2 --seq 64 --micro-batch 4)
out=$("$bin" "${sim[@]}" --calibration "$db" 2>&1)
rc=$?
echo "$out"
check "simulate --calibration exits 0" "[ $rc -eq 0 ]"
check "applied line names the newest" "echo \"\$out\" | grep -qE '^calibration applied: #2 cpu on .* from $db$'"
check "applied to the meshplan-cpu stack" "echo \"\$out\" | grep -qE '^stack +meshplan-cpu$'"
applied=$(echo "$out" | grep '^step')
if [ "$np" != 1 ]; then
  check "applied link" "echo \"\$out\" | grep -qE 'link [0-9.]+ GB/s [0-9.]+ us \(all_reduce, $np ranks\)'"
fi
out=$("$bin" "${sim[@]}" 2>&1)
check "no applied line without --calibration" "! echo \"\$out\" | grep -q 'calibration applied'"
check "the calibration changes the prediction" "[ -n \"$applied\" ] && ! echo \"\$out\" | grep -qF \"$applied\""

# The file stays a planner database that report opens.
out=$("$bin" report --db "$db" 2>&1)
rc=$?
check "report opens the database" "[ $rc -eq 0 ]"
if command -v sqlite3 >/dev/null; then
  check "two calibrations stored" "[ \"\$(sqlite3 $db 'SELECT count(DISTINCT id) FROM calibrations')\" = 2 ]"
fi

# A cuda calibration (written with SQL as `calibrate --device cuda` would on a GPU: the
# figures by hand) reaches a GPU profile's simulation through the meshplan-cuda stack.
if command -v sqlite3 >/dev/null; then
  row() { echo "INSERT INTO calibrations VALUES (3, '2026-11-02T10:00:00Z', 'cuda', 'gpuhost', 1, 1, '$1', 1, $2, '$3');"; }
  {
    echo "BEGIN;"
    row gemm.fwd.8192x4096x4096 5.5e14 FLOP/s
    row gpu.cc 90 sm; row ref.bf16_tflops 989.4 TFLOP/s; row ref.fp8_tflops 1978.9 TFLOP/s
    row ref.hbm_GBps 3350 GB/s; row launch 3e-6 s
    row fit.gemm_eff_max 0.5 1; row fit.gemm_eff_half_mnk 2e9 mnk; row fit.gemm_curve_rms 0 1
    row fit.gemm_table_rms 0 1; row fit.gemm_table 0 bool; row fit.fp8_gemm_eff_max 0 1
    row fit.attention_eff 0.3 1; row fit.hbm_eff 0.6 1; row fit.kernel_overhead_us 3 us
    echo "INSERT INTO calibration_notes VALUES (3, 'gpu.name', 'NVIDIA H100 80GB HBM3');"
    echo "INSERT INTO calibration_notes VALUES (3, 'gpu.profile', 'h100-sxm');"
    echo "COMMIT;"
  } | sqlite3 "$db"
  gsim=(simulate --model tiny-dense --gpus 1 --gpu h100-sxm --mesh dp_shard=1 --seq 64 --micro-batch 4)
  out=$("$bin" "${gsim[@]}" --calibration "$db" 2>&1); rc=$?
  echo "$out"
  check "cuda calibration: simulate exits 0" "[ $rc -eq 0 ]"
  check "cuda calibration: the meshplan-cuda stack by default" "echo \"\$out\" | grep -qE '^stack +meshplan-cuda$'"
  check "cuda calibration: applied line" \
    "echo \"\$out\" | grep -qE '^calibration applied: #3 cuda on gpuhost, NVIDIA H100 80GB HBM3 \\(h100-sxm, sm_90\\).*gemm_eff_max 0.500'"
  stated=$("$bin" "${gsim[@]}" --stack meshplan-cuda 2>&1 | grep '^step')
  check "cuda calibration: changes the prediction" "[ -n \"$stated\" ] && ! echo \"\$out\" | grep -qF \"$stated\""
  err=$("$bin" "${gsim[@]}" --stack torchtitan-compile --calibration "$db" 2>&1); rc=$?
  check "cuda calibration refused on another stack" "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'applies to the meshplan-cuda stack'"
  err=$("$bin" simulate --model tiny-dense --gpus 1 --gpu a100-80gb-sxm --mesh dp_shard=1 --seq 64 \
    --calibration "$db" 2>&1); rc=$?
  check "cuda calibration refused on another GPU" "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'fitted against profile h100-sxm'"
fi

# Refusals: one line, non-zero exit, before any measuring.
# --device cuda without a GPU (this machine, CI): one line naming what is missing, exit 2,
# and no database file. With a GPU (the lent machine) it would measure: skip the check.
if ! nvidia-smi -L >/dev/null 2>&1; then
  rm -f "$tmp/cuda.db"
  err=$("$bin" calibrate --device cuda --db "$tmp/cuda.db" 2>&1); rc=$?
  echo "$err"
  check "cuda without a device: exit 2" "[ $rc -eq 2 ]"
  check "cuda without a device: one line" "[ \$(echo \"\$err\" | wc -l) -eq 1 ]"
  check "cuda without a device: names what is missing" \
    "echo \"\$err\" | grep -qE 'no CUDA device visible( \\(cudaGetDeviceCount: |: this meshplan was built without CUDA)'"
  check "cuda without a device: no database written" "[ ! -e $tmp/cuda.db ]"
fi
err=$("$bin" calibrate --device tpu 2>&1); rc=$?
check "unknown device is a usage error" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'choose cpu, cuda or cuda:N'"
err=$("$bin" calibrate --device cpu --gpu h100-sxm 2>&1); rc=$?
check "cuda options refused on cpu" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'is for --device cuda'"
printf 'this is not a database, just text that goes on for a while....' > "$tmp/bad.db"
err=$("$bin" calibrate --device cpu --db "$tmp/bad.db" 2>&1); rc=$?
check "corrupt db refused (exit 2)" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'not a meshplan database'"
check "refused before measuring (no table)" "! echo \"\$err\" | grep -q 'GEMM, fp32'"
err=$("$bin" "${sim[@]}" --calibration "$tmp/bad.db" 2>&1); rc=$?
check "simulate with corrupt calibration db fails" "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'not a meshplan database'"
err=$("$bin" "${sim[@]}" --calibration "$tmp/none.db" 2>&1); rc=$?
check "simulate with missing db fails" "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'meshplan calibrate --device cpu'"
# A GPU profile takes the newest cuda calibration, and this file holds only cpu ones.
"$bin" calibrate --device cpu --quick --reps 1 --db "$tmp/cpu_only.db" >/dev/null 2>&1
err=$("$bin" simulate --model tiny-dense --cluster h100-8 --calibration "$tmp/cpu_only.db" 2>&1); rc=$?
check "cpu calibration not applied to a GPU profile" \
  "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'holds no cuda calibration; run .meshplan calibrate --device cuda'"
exit $fail
