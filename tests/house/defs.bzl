"""house_sources(): a package's C and C++ sources as data for //tests/house:size_test.

Bazel's globs stop at package boundaries, so each package that holds sources outside the
exempt folders (kernels/, third_party/, tests/) calls this once and tests/house/BUILD lists
the result; size_test.py fails if a folder of sources is left out.
"""

HOUSE_SOURCE_PATTERNS = ["**/*." + ext for ext in ["c", "h", "cc", "cu", "cuh", "cpp", "hpp"]]

def house_sources():
    native.filegroup(
        name = "house_sources",
        srcs = native.glob(HOUSE_SOURCE_PATTERNS),
        visibility = ["//tests/house:__pkg__"],
    )
