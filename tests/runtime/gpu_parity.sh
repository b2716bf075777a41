#!/bin/bash
# Runs gpu_parity.py (see there) with the test's meshplan; MPI flags as parity.sh.
set -u
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
export OMPI_MCA_btl="self,vader"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE GTEST_OUTPUT
exec /usr/bin/python3 "$(dirname "$0")/gpu_parity.py" "$1"
