"""cuda_library: compiles .cu files with nvcc through a genrule, links them as a cc_library.

Without CUDA (see cuda_configure.bzl) the library is empty and MP_HAVE_CUDA is not
defined, so the CPU path builds alone.
"""

load("@local_cuda//:defs.bzl", "CUDA_ARCHS", "CUDA_AVAILABLE", "NVCC")

def cuda_library(name, srcs, hdrs = [], deps = [], extra_hdrs = [], nvcc_flags = [], **kwargs):
    if not CUDA_AVAILABLE:
        native.cc_library(name = name, hdrs = hdrs, deps = deps, **kwargs)
        return
    gencode = " ".join(["-gencode arch=compute_%s,code=sm_%s" % (a, a) for a in CUDA_ARCHS])
    objs = []
    for src in srcs:
        base = src.replace("/", "_").replace(".cu", "")
        obj = "_%s_%s.o" % (name, base)
        native.genrule(
            name = "%s_%s_nvcc" % (name, base),
            srcs = [src] + hdrs + extra_hdrs,
            outs = [obj],
            cmd = ("%s -std=c++17 -O3 -Xcompiler -fPIC -Xcompiler -Wall %s -I. -I$(GENDIR) " +
                   "-DMP_HAVE_CUDA=1 %s -c $(location %s) -o $@") % (NVCC, gencode, " ".join(nvcc_flags), src),
            tags = ["local"],
        )
        objs.append(obj)
    native.cc_library(
        name = name,
        srcs = objs,
        hdrs = hdrs,
        deps = deps + ["@local_cuda//:cudart"],
        defines = ["MP_HAVE_CUDA=1"],
        **kwargs
    )
