#!/bin/bash
# CLI error contract of meshplan: bad input and bad usage give exactly one line on stderr
# and exit 2; --version and every subcommand's --help exit 0.
# Runs from the runfiles root, where app/meshplan and tests/data/ are.
set -u

BIN=app/meshplan
fails=0
n=0
out=$(mktemp)
err=$(mktemp)
trap 'rm -f "$out" "$err"' EXIT

fail() {
  echo "FAIL: $*" >&2
  echo "  stdout: $(head -c 2000 "$out")" >&2
  echo "  stderr: $(head -c 2000 "$err")" >&2
  fails=$((fails + 1))
}

# run NAME CMD...: runs the binary, leaves status in $rc and output in $out/$err.
run() {
  n=$((n + 1))
  "$BIN" "$@" >"$out" 2>"$err"
  rc=$?
}

# expect_error WANT_TEXT ARGS...: exit 2, exactly one line on stderr, containing WANT_TEXT.
expect_error() {
  local want=$1
  shift
  run "$@"
  local lines
  lines=$(wc -l <"$err")
  if [ "$rc" -ne 2 ]; then
    fail "meshplan $*: exit $rc, want 2"
  elif [ "$lines" -ne 1 ]; then
    fail "meshplan $*: $lines lines on stderr, want 1"
  elif ! grep -qF -- "$want" "$err"; then
    fail "meshplan $*: stderr lacks '$want'"
  fi
}

[ -x "$BIN" ] || { echo "FAIL: $BIN not built" >&2; exit 1; }

# Input errors.
expect_error "tests/data/bad.json: malformed JSON at line 3, column 2" \
  plan --model tests/data/bad.json
expect_error "'hidden_size'" plan --hf-config tests/data/hf/llama-missing-hidden-size.json
run plan --hf-config tests/data/hf/llama-missing-hidden-size.json
grep -qF "tests/data/hf/llama-missing-hidden-size.json" "$err" || fail "HF error does not name the file"
expect_error "unknown model 'no-such-model'" plan --model no-such-model
run plan --model no-such-model
grep -qF "llama3.1-8b" "$err" || fail "unknown model message does not list the known models"

# Usage errors: the flag is named, and for a missing value what it takes.
expect_error "unknown flag '--bogus'" plan --bogus
expect_error "unknown flag '--bogus'" plan --bogus=3
expect_error "--model needs a value" plan --model
expect_error "--cluster needs a value" plan --model tiny-dense --cluster
expect_error "unknown command 'frobnicate'" frobnicate

# No command: usage on stderr, exit 2.
run
[ "$rc" -eq 2 ] || fail "meshplan with no command: exit $rc, want 2"

# --version
run --version
if [ "$rc" -ne 0 ] || ! grep -qE '^meshplan [0-9]+\.[0-9]+\.[0-9]+$' "$out"; then
  fail "meshplan --version: exit $rc"
fi

# --help of the program and of every subcommand: exit 0, usage on stdout, nothing on stderr.
run --help
[ "$rc" -eq 0 ] && grep -q "usage: meshplan" "$out" || fail "meshplan --help"
for cmd in plan simulate explain train calibrate report validate; do
  for h in --help -h; do
    run "$cmd" "$h"
    if [ "$rc" -ne 0 ]; then
      fail "meshplan $cmd $h: exit $rc, want 0"
    elif ! grep -q "usage: meshplan $cmd" "$out"; then
      fail "meshplan $cmd $h: no usage line on stdout"
    elif [ -s "$err" ]; then
      fail "meshplan $cmd $h: wrote to stderr"
    fi
  done
done

# The embedded default runs (the README's first command).
run plan
[ "$rc" -eq 0 ] && [ -s "$out" ] || fail "meshplan plan (embedded default): exit $rc"

# Sequence parallelism asked for twice over, or of a stack that does not run it.
expect_error "--sp and --no-sp contradict each other" simulate --model tiny-dense --mesh dp_shard=4,tp=2 --sp --no-sp
expect_error "stack llm.c does not run sequence parallelism" \
  simulate --model tiny-dense --mesh dp_shard=4,tp=2 --sp --stack llm.c

# A Megatron-Core plan names what the stack runs: TP comm overlap and the distributed
# optimizer; explain states Megatron's data parallelism and its optimizer's shard.
run plan --no-db --model tiny-dense --gpus 8 --stack megatron-core
[ "$rc" -eq 0 ] && head -n 1 "$out" | grep -qF "TP comm overlap on its TP plans and the distributed optimizer" ||
  fail "meshplan plan --stack megatron-core: header does not name TP comm overlap and the distributed optimizer"
run explain --model tiny-dense --gpus 8 --mesh dp_replicate=4,tp=2 --stack megatron-core
[ "$rc" -eq 0 ] && grep -qF "DDP: parameters replicated over dp_replicate x cp = 4" "$out" &&
  grep -qF "master weights" "$out" && grep -qF "(1/4)" "$out" && ! grep -qF "FSDP units" "$out" ||
  fail "meshplan explain --stack megatron-core: no Megatron data-parallel note or optimizer shard"

# The routed experts under 2 distributed-optimizer instances (tiny-moe, dp_replicate=8, ep=2):
# explain places rank 0 in its instance and its experts' slice, and shards the masters over
# the instance's 4 dense ranks and the experts' slice of 2: 83,264 / 4 + 49,152 / 2 = 45,392
# elements (2 layers x 8 experts x 3 x 64 x 32 = 98,304 routed, half a rank). Instances not
# dividing the expert-DP size (ep=8 on 8 ranks: 1) are refused as Megatron asserts.
run explain --model tiny-moe --gpus 8 --mesh dp_replicate=8,ep=2,dopt=2 --stack megatron-core --seq 64 --global-batch 8
[ "$rc" -eq 0 ] && grep -qF "distributed-optimizer instance 0 of 2: rank 0 of its 4 dense ranks, 0 of the 2" "$out" &&
  grep -qF "45392 elements (1/4 of 83264 dense, 1/2 of 49152 routed-expert)" "$out" ||
  fail "meshplan explain: the routed experts' distributed-optimizer instance or their masters' shard"
expect_error "dopt=2 does not divide the expert-DP size 1" \
  explain --model tiny-moe --gpus 8 --mesh dp_replicate=8,ep=8,dopt=2 --stack megatron-core --seq 64

# An unknown mesh dim through `meshplan explain --mesh`: one line, exit 2, naming 'foo'.
expect_error "'foo'" explain --model tiny-dense --mesh foo=2

echo "$((n)) invocations, $fails failures"
[ "$fails" -eq 0 ]
