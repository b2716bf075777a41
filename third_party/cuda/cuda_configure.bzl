"""Detects the CUDA toolkit and NCCL, so that a machine without them builds the CPU path.

Looks at $CUDA_HOME, then /usr/local/cuda. The generated repository @local_cuda holds:
  defs.bzl   CUDA_AVAILABLE, NVCC, CUDA_HOME, CUDA_ARCHS
  BUILD      :cuda_headers, :cudart, :cublaslt, :nccl (empty libraries without CUDA)
"""

_ARCHS = ["80", "90"]

def _find_lib(rctx, home, name):
    for d in [home + "/lib64", home + "/lib", "/usr/local/lib", "/usr/lib/x86_64-linux-gnu"]:
        if rctx.path(d + "/lib" + name + ".so").exists:
            return d
    return None

def _cuda_configure_impl(rctx):
    home = rctx.os.environ.get("CUDA_HOME", "/usr/local/cuda")
    nvcc = home + "/bin/nvcc"
    have = rctx.path(nvcc).exists and rctx.path(home + "/include/cuda_runtime.h").exists
    if rctx.os.environ.get("MESHPLAN_NO_CUDA", "") == "1":
        have = False
    libdir = _find_lib(rctx, home, "cudart") if have else None
    ltdir = _find_lib(rctx, home, "cublasLt") if have else None
    nccl_lib = _find_lib(rctx, home, "nccl") if have else None
    nccl_inc = None
    if have:
        for d in [home + "/include", "/usr/local/include", "/usr/include"]:
            if rctx.path(d + "/nccl.h").exists:
                nccl_inc = d
                break
    have = have and libdir != None and ltdir != None
    have_nccl = have and nccl_lib != None and nccl_inc != None

    rctx.file("defs.bzl", "\n".join([
        "CUDA_AVAILABLE = %s" % ("True" if have else "False"),
        "NCCL_AVAILABLE = %s" % ("True" if have_nccl else "False"),
        "NVCC = %r" % nvcc,
        "CUDA_HOME = %r" % home,
        "CUDA_ARCHS = %r" % _ARCHS,
        "",
    ]))
    build = ['package(default_visibility = ["//visibility:public"])', ""]
    if have:
        rctx.symlink(home + "/include", "cuda_include")
        build.append("""cc_library(
    name = "cuda_headers",
    hdrs = glob(["cuda_include/*.h", "cuda_include/crt/*.h", "cuda_include/*.hpp", "cuda_include/crt/*.hpp", "cuda_include/cuda/std/**"], allow_empty = True),
    includes = ["cuda_include"],
)
cc_library(name = "cudart", deps = [":cuda_headers"], linkopts = ["-L%s", "-Wl,-rpath,%s", "-lcudart"])
cc_library(name = "cublaslt", deps = [":cuda_headers"], linkopts = ["-L%s", "-Wl,-rpath,%s", "-lcublasLt"])
""" % (libdir, libdir, ltdir, ltdir))
    else:
        build.append('cc_library(name = "cuda_headers")\ncc_library(name = "cudart")\ncc_library(name = "cublaslt")\n')
    if have_nccl:
        if nccl_inc != home + "/include":
            rctx.symlink(nccl_inc + "/nccl.h", "nccl_include/nccl.h")
            build.append('cc_library(name = "nccl_headers", hdrs = ["nccl_include/nccl.h"], includes = ["nccl_include"])')
        else:
            build.append('cc_library(name = "nccl_headers", deps = [":cuda_headers"])')
        build.append('cc_library(name = "nccl", deps = [":nccl_headers"], linkopts = ["-L%s", "-Wl,-rpath,%s", "-lnccl"])' % (nccl_lib, nccl_lib))
    else:
        build.append('cc_library(name = "nccl")')
    rctx.file("BUILD", "\n".join(build) + "\n")

cuda_configure = repository_rule(
    implementation = _cuda_configure_impl,
    environ = ["CUDA_HOME", "MESHPLAN_NO_CUDA"],
    local = True,
)
