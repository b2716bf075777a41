#!/bin/bash
# Runs a test binary under mpirun with NP ranks; fails if any rank fails, never hangs
# (timeout). The same sandbox settings as tests/comm/run_mpi.sh: shared-memory transport
# with its backing files in the test's private TMPDIR, no network.
# Usage: run_mpi_test.sh BINARY NP [ARGS...]
set -u
bin="$1"
np="$2"
shift 2
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
if [ -n "${ASAN_OPTIONS:-}" ]; then export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"; fi
# every rank would write (and remove) Bazel's per-test files at once
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE GTEST_OUTPUT
root=()
if [ "$(id -u)" = "0" ]; then root=(--allow-run-as-root); fi
exec timeout -k 10 "${MP_MPI_TIMEOUT_S:-240}" mpirun "${root[@]}" -np "$np" --oversubscribe --bind-to none \
  --mca btl self,vader --mca btl_vader_backing_directory "$TMPDIR" "$bin" "$@"
