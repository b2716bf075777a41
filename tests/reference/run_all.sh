#!/usr/bin/env bash
# Builds the C drivers the PyTorch reference scripts need, then runs every
# tests/reference/*_ref.py with Debian's /usr/bin/python3 (it has torch; a pyenv python3
# on PATH may not). Prints "N passed, N failed" over the scripts and exits non-zero if
# any script fails or cannot run.
set -u
cd "$(dirname "$0")/../.."
PY=/usr/bin/python3
if ! "$PY" -c 'import torch, numpy' 2>/dev/null; then
  echo "run_all.sh: $PY lacks torch or numpy; install python3-torch and python3-numpy" >&2
  exit 1
fi
bazel build //tests/kernels:kernel_dump || { echo "run_all.sh: bazel build failed" >&2; exit 1; }
export MP_KERNEL_DUMP="$(bazel info bazel-bin 2>/dev/null)/tests/kernels/kernel_dump"
passed=0
failed=0
for script in tests/reference/*_ref.py; do
  echo "== $script"
  if "$PY" "$script"; then
    passed=$((passed + 1))
  else
    echo "FAILED: $script"
    failed=$((failed + 1))
  fi
done
echo "$passed passed, $failed failed"
[ "$failed" -eq 0 ]
