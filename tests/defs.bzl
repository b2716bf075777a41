"""mp_cc_test: a GoogleTest test linked against Debian's libgtest (libgtest-dev)."""

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
