#!/bin/bash
# Runs the comm test binary under mpirun with N ranks (N=1: directly, as an OpenMPI
# singleton, with no launcher). Fails if any rank fails (the binary all-reduces its
# verdict, and mpirun exits non-zero when any rank does); never hangs: `timeout 120`.
#
# Usage: run_mpi.sh BINARY NP [ARGS...]; MP_MPI_TIMEOUT_S overrides the 120 s limit
# (exit 124 when it strikes).
#
# Sandbox notes (Bazel's linux-sandbox gives each test its own PID namespace):
# - No network is needed: `--mca btl self,vader` (shared memory within the node), no TCP.
# - vader's backing files must go to the test's private TMPDIR, not the shared /dev/shm:
#   OpenMPI names them after the job id, which derives from mpirun's PID, and two
#   sandboxed mpiruns running at once both have small, equal PIDs; sharing /dev/shm they
#   mapped each other's segments (segfault in mca_btl_vader_poll_handle_frag, or a hang).
# - `--allow-run-as-root` only when running as root (CI containers); the
#   OMPI_ALLOW_RUN_AS_ROOT variables in .bazelrc do the same.
set -u
bin="$1"
np="$2"
shift 2
limit="${MP_MPI_TIMEOUT_S:-120}"
# Under --config=asan: OpenMPI itself leaks at MPI_Finalize (allocations of MCA components
# it has dlclose'd, so no suppression can name them); leak checking stays on for
# comm_single_test, and AddressSanitizer's other checks stay on here.
if [ -n "${ASAN_OPTIONS:-}" ]; then export ASAN_OPTIONS="$ASAN_OPTIONS:detect_leaks=0"; fi
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
# The same BTL choice for the singleton run (np 1), which has no mpirun command line.
export OMPI_MCA_btl="self,vader"
if [ "$np" = "1" ]; then
  exec timeout -k 10 "$limit" "$bin" "$@"
fi
# Bazel's per-test files would be written (and removed) by every rank at once; the sh_test's
# own exit status and log are the result.
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE GTEST_OUTPUT
root=()
if [ "$(id -u)" = "0" ]; then root=(--allow-run-as-root); fi
exec timeout -k 10 "$limit" mpirun "${root[@]}" -np "$np" --oversubscribe --bind-to none \
  --mca btl self,vader --mca btl_vader_backing_directory "$TMPDIR" "$bin" "$@"
