"""Finds OpenMPI's headers and library (Debian's libopenmpi-dev) through mpicc --showme."""

def _mpi_configure_impl(rctx):
    res = rctx.execute(["mpicc", "--showme:incdirs"])
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    if res.return_code != 0:
        fail("OpenMPI not found (mpicc --showme failed). Run scripts/setup, or: apt-get install libopenmpi-dev openmpi-bin")
    incdirs = res.stdout.strip().split(" ")
    libs = rctx.execute(["mpicc", "--showme:libdirs"]).stdout.strip().split(" ")
    hdrs = []
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

mpi_configure = repository_rule(implementation = _mpi_configure_impl, local = True)
