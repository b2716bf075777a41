#!/usr/bin/env bash
# meshplan train on one rank without mpirun: trains, writes its dump files in their
# documented formats, and refuses what this build cannot do with a clear message.
set -u
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }

out=$(OMP_NUM_THREADS=1 timeout 60 "$bin" train --model tiny-dense --steps 3 --seq 16 --micro-batch 2 \
      --global-batch 4 --dump-weights "$tmp/w.bin" --dump-losses "$tmp/l.json" --dump-data "$tmp/d.bin" 2>&1)
rc=$?
echo "$out"
check "train exits 0" "[ $rc -eq 0 ]"
check "three step lines" "[ \$(echo \"\$out\" | grep -c '^step ') -eq 3 ]"
check "summary has tokens/s and peak" "echo \"\$out\" | grep -q 'tokens/s.*peak memory [0-9]* bytes'"
check "weight file magic" "[ \"\$(head -c 4 $tmp/w.bin)\" = MPWT ]"
check "losses json" "grep -q '\"losses\": \[' $tmp/l.json"
# llm.c shard: int32 magic 20240520 = 0x0134E8F8 little-endian
check "shard magic" "[ \"\$(od -An -td4 -N4 $tmp/d.bin | tr -d ' ')\" = 20240520 ]"
# Training again from the written shard gives the same losses (data path == synthetic path).
OMP_NUM_THREADS=1 timeout 60 "$bin" train --model tiny-dense --steps 3 --seq 16 --micro-batch 2 --global-batch 4 \
  --data "$tmp/d.bin" --dump-losses "$tmp/l2.json" --quiet >/dev/null 2>&1
check "same losses from the shard" "cmp -s $tmp/l.json $tmp/l2.json"

err=$("$bin" train --model tiny-dense --device cuda 2>&1); rc=$?
check "cuda refused" "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'not available in this build'"
err=$("$bin" train --model tiny-dense --mesh dp_shard=2 2>&1); rc=$?
check "mesh larger than world refused" "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'mpirun -np 2'"
err=$("$bin" train --model tiny-dense --db "$tmp/x.db" 2>&1); rc=$?
check "--db without --plan-id refused" "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'plan-id'"
err=$("$bin" train --model tiny-dense --seq 65 --steps 1 2>&1); rc=$?
check "seq beyond max_seq refused" "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'max_seq'"
exit $fail
