#!/usr/bin/env bash
# Stands in for a test that needs MPI (mpi.h, libmpi or mpirun) in a build without MPI
# (tests/defs.bzl, mp_mpi_*): says so and passes. Usage: skip_without_mpi.sh PACKAGE:NAME
echo "SKIP ${1:-this test}: meshplan was built without MPI (mpicc was not found, or" \
  "MESHPLAN_NO_MPI=1, when it was built); install libopenmpi-dev and openmpi-bin and" \
  "rebuild to run it"
exit 0
