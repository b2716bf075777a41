#!/bin/bash
# Checks that the MPI test harness cannot pass by accident: a failure injected on one rank
# fails the whole mpirun (and rank 0 names it), and a stuck rank ends in the timeout
# rather than a hang.
set -u
run="$1"
bin="$2"
filter=--gtest_filter=CommMpi.FaultInjection
fails=0

out=$(MP_COMM_TEST_FAIL_RANK=3 "$run" "$bin" 4 "$filter" 2>&1)
rc=$?
if [ "$rc" = 0 ]; then echo "FAIL: a failure on rank 3 left mpirun with exit 0"; fails=1; fi
if ! grep -q "injected failure on rank 3" <<<"$out"; then
  echo "FAIL: rank 3's failure was not printed"; fails=1
fi
if ! grep -q "passed here but failed on another rank" <<<"$out"; then
  echo "FAIL: the other ranks did not learn of rank 3's failure"; fails=1
fi

start=$(date +%s)
out2=$(MP_COMM_TEST_HANG_RANK=2 MP_MPI_TIMEOUT_S=5 "$run" "$bin" 4 "$filter" 2>&1)
rc2=$?
took=$(($(date +%s) - start))
if [ "$rc2" != 124 ] && [ "$rc2" != 137 ]; then
  echo "FAIL: a stuck rank gave exit $rc2, not the timeout's 124"; fails=1
fi
if [ "$took" -gt 30 ]; then echo "FAIL: the timeout took ${took}s"; fails=1; fi

if [ "$fails" != 0 ]; then
  echo "--- output with a failing rank (exit $rc) ---"; echo "$out"
  echo "--- output with a stuck rank (exit $rc2) ---"; echo "$out2"
  exit 1
fi
echo "ok: failing rank -> exit $rc; stuck rank -> exit $rc2 after ${took}s"
