#!/bin/sh
echo "bazel coverage is not supported offline; run gcov outside Bazel" >&2
exit 1
