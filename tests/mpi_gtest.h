// GoogleTest under mpirun, shared by the suites whose tests are collective (tests/comm,
// tests/runtime:schedule_memory_mpi_test): every rank runs every test; a failure on any
// rank fails that test on every rank (and the ranks that passed say it failed elsewhere),
// so every rank exits non-zero and no rank reports success for a collective that broke
// on another; only rank 0 prints GoogleTest's report.
#ifndef MP_TESTS_MPI_GTEST_H
#define MP_TESTS_MPI_GTEST_H

namespace mp_test {

// Runs the tests as the main of a test binary named `name`: initializes GoogleTest, then
// MPI (through mp_comm_mpi_init) and the world's verdict; *rank and *world receive this
// process's place. mpi_optional: without a launcher (no OMPI_COMM_WORLD_SIZE or PMI_SIZE)
// MPI is left to the tests that start it, and the binary runs as rank 0 of 1; *launched
// (if given) says which. Returns the exit code every rank agrees on.
int MpiMain(int *argc, char ***argv, const char *name, bool mpi_optional, int *rank, int *world,
            bool *launched = nullptr);

}  // namespace mp_test

#endif
