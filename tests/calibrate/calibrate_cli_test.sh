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

out=$(calibrate --device cpu --reps 2 --db "$db" 2>&1)
rc=$?
echo "$out"
check "calibrate exits 0" "[ $rc -eq 0 ]"
check "names calibration #1 with $np rank(s)" "echo \"\$out\" | grep -qE '^calibration #1 cpu on .* x $np rank'"
check "five forward GEMM rows" "[ \$(echo \"\$out\" | grep -cE '^  matmul_forward +[0-9]+ +[0-9]+ +[0-9]+ +[0-9.]+$') -eq 5 ]"
check "five backward GEMM rows" "[ \$(echo \"\$out\" | grep -cE '^  matmul_backward +[0-9]+ +[0-9]+ +[0-9]+ +[0-9.]+$') -eq 5 ]"
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
out=$(calibrate --device cpu --reps 1 --db "$db" --json 2>&1)
rc=$?
check "json calibrate exits 0" "[ $rc -eq 0 ]"
check "json names id 2" "echo \"\$out\" | grep -qE '\"id\":[[:space:]]*2,'"
check "json world" "echo \"\$out\" | grep -qE '\"world\":[[:space:]]*$np,'"

sim=(simulate --model tiny-dense --gpus 2 --gpu cpu --mesh dp_shard=2 --seq 64 --micro-batch 4)
out=$("$bin" "${sim[@]}" --calibration "$db" 2>&1)
rc=$?
echo "$out"
check "simulate --calibration exits 0" "[ $rc -eq 0 ]"
check "applied line names the newest" "echo \"\$out\" | grep -qE '^calibration applied: #2 cpu on .* from $db$'"
if [ "$np" != 1 ]; then
  check "applied link" "echo \"\$out\" | grep -qE 'link [0-9.]+ GB/s [0-9.]+ us \(all_reduce, $np ranks\)'"
fi
out=$("$bin" "${sim[@]}" 2>&1)
check "no applied line without --calibration" "! echo \"\$out\" | grep -q 'calibration applied'"

# The file stays a planner database that report opens.
out=$("$bin" report --db "$db" 2>&1)
rc=$?
check "report opens the database" "[ $rc -eq 0 ]"
if command -v sqlite3 >/dev/null; then
  check "two calibrations stored" "[ \"\$(sqlite3 $db 'SELECT count(DISTINCT id) FROM calibrations')\" = 2 ]"
fi

# Refusals: one line, non-zero exit, before any measuring.
err=$("$bin" calibrate --device cuda 2>&1); rc=$?
check "cuda refused (exit 2)" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'comes with the GPU runtime issue'"
err=$("$bin" calibrate --device tpu 2>&1); rc=$?
check "unknown device is a usage error" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'choose cpu or cuda'"
printf 'this is not a database, just text that goes on for a while....' > "$tmp/bad.db"
err=$("$bin" calibrate --device cpu --db "$tmp/bad.db" 2>&1); rc=$?
check "corrupt db refused (exit 2)" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'not a meshplan database'"
check "refused before measuring (no table)" "! echo \"\$err\" | grep -q matmul"
err=$("$bin" "${sim[@]}" --calibration "$tmp/bad.db" 2>&1); rc=$?
check "simulate with corrupt calibration db fails" "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'not a meshplan database'"
err=$("$bin" "${sim[@]}" --calibration "$tmp/none.db" 2>&1); rc=$?
check "simulate with missing db fails" "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'meshplan calibrate --device cpu'"
err=$("$bin" simulate --model tiny-dense --cluster h100-8 --calibration "$db" 2>&1); rc=$?
check "cpu calibration refused on a GPU profile" "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'measured on cpu'"
exit $fail
