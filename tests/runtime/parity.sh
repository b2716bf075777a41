#!/bin/bash
# Multi-rank parity: per-step losses of `mpirun -np N meshplan train --mesh MESH` equal the
# single-rank run's (same model, seed, global batch and micro-batch) within 1e-5 relative.
# In this build the runtime executes pure data replication (dp_replicate) across ranks;
# the other meshes (dp_shard, tp, ep) are refused by the runtime with a clear message on
# every rank, which this script also checks (exit non-zero, no hang). Never hangs:
# `timeout`. MPI flags as tests/comm/run_mpi.sh explains (shared memory only, private
# backing directory, --allow-run-as-root when root).
#
# Usage: parity.sh MESHPLAN
set -u
bin="$1"
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
export OMPI_MCA_btl="self,vader"
export OMP_NUM_THREADS=1
# OpenMPI leaks at finalize inside modules it has already unloaded (no suppression can
# name them); leak checking stays on in the single-process tests.
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE GTEST_OUTPUT
root=()
if [ "$(id -u)" = "0" ]; then root=(--allow-run-as-root); fi
mpi() {
  local np="$1"; shift
  timeout -k 10 120 mpirun "${root[@]}" -np "$np" --oversubscribe --bind-to none \
    --mca btl self,vader --mca btl_vader_backing_directory "$TMPDIR" "$@"
}
common=(train --steps 6 --seq 32 --micro-batch 2 --global-batch 8 --lr 3e-3 --quiet)
fail=0
compare() { # file file name
  /usr/bin/env python3 - "$1" "$2" "$3" <<'PY' || fail=1
import json, sys
a = json.load(open(sys.argv[1]))["losses"]; b = json.load(open(sys.argv[2]))["losses"]
bad = [(i + 1, x, y) for i, (x, y) in enumerate(zip(a, b)) if abs(x - y) > 1e-5 * abs(y)]
if len(a) != len(b) or bad:
    print("FAIL %s: %s" % (sys.argv[3], bad or "step counts differ")); sys.exit(1)
print("ok   %s: %d steps, losses %.6f .. %.6f equal within 1e-5" % (sys.argv[3], len(a), a[0], a[-1]))
PY
}
for model in tiny-dense tiny-moe; do
  timeout 120 "$bin" "${common[@]}" --model "$model" --dump-losses "$TMPDIR/$model-1.json" || { echo "FAIL: single rank $model"; fail=1; }
  for np in 2 4; do
    mpi "$np" "$bin" "${common[@]}" --model "$model" --mesh "dp_replicate=$np" \
      --dump-losses "$TMPDIR/$model-r$np.json" || { echo "FAIL: dp_replicate=$np $model exited non-zero"; fail=1; continue; }
    compare "$TMPDIR/$model-1.json" "$TMPDIR/$model-r$np.json" "$model dp_replicate=$np"
  done
done
# Not executed yet: refused on every rank, clearly, without hanging.
out=$(mpi 2 "$bin" "${common[@]}" --model tiny-dense --mesh dp_shard=2 2>&1); rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ] || ! echo "$out" | grep -q "not implemented yet"; then
  echo "FAIL: dp_shard=2 should be refused clearly (rc $rc): $out"; fail=1
else
  echo "ok   dp_shard=2 refused: $(echo "$out" | grep -m1 'not implemented')"
fi
out=$(mpi 3 "$bin" "${common[@]}" --model tiny-dense --mesh dp_replicate=2 2>&1); rc=$?
if [ $rc -eq 0 ] || [ $rc -eq 124 ]; then echo "FAIL: mesh/world mismatch not refused (rc $rc)"; fail=1;
else echo "ok   mesh of 2 on 3 ranks refused: $(echo "$out" | grep -m1 meshplan)"; fi
exit $fail
