#!/bin/bash
# meshplan validate on tests/data/validation/published_check.csv: published multi-dimensional
# runs outside the dev set (torchtitan's TP, PP and CP tables, its A100 and H200 runs,
# Megatron-LM's selective-recompute iteration times, Megatron-Core's H100 weak-scaling table),
# checked, never fitted. Every row's prediction stays
# within 1 % of the one recorded in check_expected.txt, so a change that moves a published
# prediction fails here and updates that file on purpose; per metric the mean absolute
# percentage error and Kendall's tau stay within the bounds below, which are the errors
# docs/validation.md states (rows over 10 % are explained there), not targets. Runs from
# the runfiles root.
set -u
BIN=planner/meshplan
out=$(mktemp)
trap 'rm -f "$out"' EXIT
if ! "$BIN" validate tests/data/validation/published_check.csv >"$out" 2>&1; then
  echo "FAIL: meshplan validate exited non-zero:" >&2
  cat "$out" >&2
  exit 1
fi
cat "$out"
awk -v expected=tests/validate/check_expected.txt -v pub_band=0 -v min_rows=57 -v label=check_test \
  -v limits="tokens_per_s_per_gpu:9.3:0.95,peak_mem_gib:9.1:0.45,step_time_s:3.8:0.95" \
  -f tests/validate/bands.awk "$out"
