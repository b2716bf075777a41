"""Test macros.

mp_cc_test: a GoogleTest test linked against Debian's libgtest (libgtest-dev).

MPI is optional at build time (third_party/mpi/mpi_configure.bzl: MPI_AVAILABLE). Targets
that compile against mpi.h or run under mpirun are declared with the mp_mpi_* macros
(mp_mpi_gtest_*: GoogleTest binaries with their own main): with MPI they are the plain
rule; without it a binary or library is left out, and a test
becomes a stand-in of the same name (tests/skip_without_mpi.sh) that prints why it skips
and passes, so the test list and its count stay the same in both builds.
"""

load("@local_mpi//:defs.bzl", "MPI_AVAILABLE")

def mp_cc_test(name, srcs, deps = [], data = [], tags = [], size = "small", **kwargs):
    native.cc_test(
        name = name,
        srcs = srcs,
        deps = deps,
        data = data,
        tags = tags,
        size = size,
        copts = ["-Wno-missing-field-initializers"],
        linkopts = ["-lgtest", "-lgtest_main", "-lpthread"],
        **kwargs
    )

def _skip_without_mpi(name, size, tags):
    native.sh_test(
        name = name,
        size = size,
        srcs = ["//tests:skip_without_mpi.sh"],
        args = [native.package_name() + ":" + name],
        tags = tags,
    )

def mp_mpi_cc_library(name, **kwargs):
    """A cc_library that includes mpi.h; absent without MPI."""
    if MPI_AVAILABLE:
        native.cc_library(name = name, **kwargs)

def mp_mpi_gtest_binary(name, **kwargs):
    """A GoogleTest binary with its own main (tests/mpi_gtest.h: MPI, one verdict for the
    world), run under mpirun by an mp_mpi_sh_test; absent without MPI."""
    if MPI_AVAILABLE:
        native.cc_binary(
            name = name,
            testonly = True,
            copts = ["-Wno-missing-field-initializers"],
            linkopts = ["-lgtest", "-lpthread"],
            **kwargs
        )

def mp_mpi_gtest_test(name, size = "small", tags = [], **kwargs):
    """The same binary as a test of its own (it also runs alone, without mpirun); without
    MPI, a stand-in that says why it skips."""
    if MPI_AVAILABLE:
        native.cc_test(
            name = name,
            size = size,
            tags = tags,
            copts = ["-Wno-missing-field-initializers"],
            linkopts = ["-lgtest", "-lpthread"],
            **kwargs
        )
    else:
        _skip_without_mpi(name, size, tags)

def mp_mpi_sh_test(name, size = "small", tags = [], **kwargs):
    """An sh_test that runs mpirun or an MPI binary; without MPI, a stand-in that says why
    it skips."""
    if MPI_AVAILABLE:
        native.sh_test(name = name, size = size, tags = tags, **kwargs)
    else:
        _skip_without_mpi(name, size, tags)
