"""Finds OpenMPI's headers and library (Debian's libopenmpi-dev) through mpicc --showme.

MPI is optional: without mpicc on the PATH, or with MESHPLAN_NO_MPI=1 in the environment
of the build, the repository says so and the rest builds without it (as
third_party/cuda does for CUDA). The generated repository @local_mpi holds:
  defs.bzl   MPI_AVAILABLE
  BUILD      :mpi (an empty library without MPI)
exec/comm then compiles comm_mpi_stub.c instead of comm_mpi.c, and the tests that need
MPI or mpirun stand in with a test that prints why it skips (tests/defs.bzl).
"""

def _mpi_configure_impl(rctx):
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    mpicc = rctx.which("mpicc")
    have = mpicc != None and rctx.os.environ.get("MESHPLAN_NO_MPI", "") != "1"
    res = rctx.execute([mpicc, "--showme:incdirs"]) if have else None
    have = have and res.return_code == 0
    rctx.file("defs.bzl", "MPI_AVAILABLE = %s\n" % ("True" if have else "False"))
    if not have:
        build.append('cc_library(name = "mpi")')
        rctx.file("BUILD", "\n".join(build) + "\n")
        return
    incdirs = res.stdout.strip().split(" ")
    libs = rctx.execute([mpicc, "--showme:libdirs"]).stdout.strip().split(" ")
    for i, d in enumerate(incdirs):
        rctx.symlink(d, "inc%d" % i)
    build.append("""cc_library(
    name = "mpi",
    hdrs = glob(["inc*/**/*.h"]),
    includes = [%s],
    # C API only: mpi.h included from C++ would otherwise pull in the deprecated C++
    # bindings, which live in libmpi_cxx (not linked).
    defines = ["OMPI_SKIP_MPICXX=1", "MPICH_SKIP_MPICXX=1"],
    linkopts = [%s"-lmpi"],
)""" % (", ".join(['"inc%d"' % i for i in range(len(incdirs))]),
        "".join(['"-L%s", "-Wl,-rpath,%s", ' % (l, l) for l in libs if l])))
    rctx.file("BUILD", "\n".join(build) + "\n")

mpi_configure = repository_rule(
    implementation = _mpi_configure_impl,
    environ = ["MESHPLAN_NO_MPI"],
    local = True,
)
