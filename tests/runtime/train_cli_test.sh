#!/usr/bin/env bash
# meshplan train on one rank without mpirun: trains, writes its dump files in their
# documented formats, records measurements beside predictions (--db, --auto), and refuses
# what this build cannot do with a clear message.
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

# Without a visible GPU (this machine, CI), --device cuda is one clear line naming why.
if ! nvidia-smi -L >/dev/null 2>&1; then
  err=$("$bin" train --model tiny-dense --device cuda 2>&1); rc=$?
  check "cuda refused without a device" "[ $rc -ne 0 ] && [ \$(echo \"\$err\" | wc -l) -eq 1 ] && echo \"\$err\" | grep -qE 'no CUDA device is visible|built without CUDA'"
fi
err=$("$bin" train --model tiny-dense --device tpu 2>&1); rc=$?
check "unknown device is a usage error" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'choose cpu or cuda'"
err=$("$bin" train --model tiny-dense --mesh dp_shard=2 2>&1); rc=$?
check "mesh larger than world refused" "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'mpirun -np 2'"
err=$("$bin" train --model tiny-dense --plan-id 3 2>&1); rc=$?
check "--plan-id without --db refused" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'needs --db'"
err=$("$bin" train --model tiny-moe --mesh dp_shard=2,ep=2 --ep 4 2>&1); rc=$?
check "--ep contradicting --mesh refused" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'contradicts ep=2 in --mesh'"
err=$("$bin" train --model tiny-dense --auto --mesh tp=2 2>&1); rc=$?
check "--auto with --mesh refused" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'auto chooses the mesh'"
err=$("$bin" train --model tiny-dense --pp-schedule zigzag 2>&1); rc=$?
check "unknown --pp-schedule is a usage error" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'choose 1f1b, interleaved or gpipe'"
err=$("$bin" train --model tiny-dense --mesh pp=2 --pp-virtual 2 2>&1); rc=$?
check "--pp-virtual without the interleaved schedule refused" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'needs --pp-schedule interleaved'"
# --pp-layers: a layout the model's layers do not fill, and one with --auto (which picks the
# mesh), are usage errors before anything runs
err=$("$bin" train --model tiny-moe-pp --mesh pp=2 --pp-layers 1,2 2>&1); rc=$?
check "--pp-layers not summing to the layers refused" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'sum to 3 layers but tiny-moe-pp has 4'"
err=$("$bin" train --model tiny-odd --mesh pp=2 --pp-schedule interleaved --pp-virtual 2 --pp-layers 0,4,4,0 2>&1); rc=$?
check "an empty model chunk refused by name" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'model chunk 0 no layers'"
err=$("$bin" train --model tiny-moe-pp --auto --pp-layers 1,3 2>&1); rc=$?
check "--pp-layers with --auto refused" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'choose the mesh themselves'"
# a plan the runtime does not execute, given with --mesh, is refused before anything runs,
# with the runtime's reason (exec/runtime/check.c), exit 2
err=$("$bin" train --model tiny-moe --mesh cp=2,dp_shard=2,ep=2 --db "$tmp/refused.db" 2>&1); rc=$?
check "cp with ep refused with the runtime's reason" "[ $rc -eq 2 ] && echo \"\$err\" | grep -q 'does not execute expert parallelism with context parallelism'"
# multi-head latent attention runs without cp (the runtime's rule book, exec/runtime/check.c)
err=$("$bin" train --model tiny-mla --mesh cp=2 --steps 1 2>&1); rc=$?
check "MLA with cp refused with the runtime's reason in one line" "[ $rc -eq 2 ] && [ \$(echo \"\$err\" | wc -l) -eq 1 ] && echo \"\$err\" | grep -q 'does not execute multi-head latent attention with context parallelism'"

# --db without --plan-id: the mesh is predicted (a one-plan run) and every step is recorded
# beside the prediction; --auto plans for the world (1 rank) and records its run too.
out=$(OMP_NUM_THREADS=1 timeout 60 "$bin" train --model tiny-dense --steps 3 --seq 16 --micro-batch 2 \
      --global-batch 4 --db "$tmp/m.db" 2>&1); rc=$?
echo "$out" | tail -3
check "train --db exits 0" "[ $rc -eq 0 ]"
check "prediction printed" "echo \"\$out\" | grep -q '^predicted vs measured: step time'"
rep=$("$bin" report --db "$tmp/m.db" --run 1 2>&1)
echo "$rep" | head -5
check "report shows 3 measured steps beside the prediction" "echo \"\$rep\" | grep -Eq '\\|  +3 +[0-9.]+ (us|ms|s) +[-+]?[0-9.]+'"
check "report names CPU ranks, not GPUs" "echo \"\$rep\" | grep -q 'CPU rank' && ! echo \"\$rep\" | grep -q 'GPUs'"
check "report shows a CPU run's memory in a unit that shows it (not 0.00 GiB)" "echo \"\$rep\" | grep -Eq '[0-9.]+ (KiB|MiB)' && ! echo \"\$rep\" | grep -q '0.00 GiB'"
out=$(OMP_NUM_THREADS=1 timeout 60 "$bin" train --model tiny-moe --auto --steps 2 --seq 16 --global-batch 4 \
      --db "$tmp/m.db" 2>&1); rc=$?
echo "$out" | grep -E '^(auto|train)'
check "train --auto exits 0" "[ $rc -eq 0 ]"
check "auto names its plan" "echo \"\$out\" | grep -q '^auto: best executable plan (meshplan-cpu profile) from [0-9]* candidates for 1 CPU rank'"
check "auto run recorded" "[ \"\$(\"$bin\" report --db \"$tmp/m.db\" | grep -c 'tiny-')\" -eq 2 ]"
# --profile: the kernel classes of rank 0 beside the simulator's, per step (2 layers: 30
# GEMM calls per micro-batch as the runtime issues them, 45 GEMM products in the schedule;
# kprof_test derives both), and no record in a database it was not given.
out=$(OMP_NUM_THREADS=1 timeout 60 "$bin" train --model tiny-dense --steps 3 --seq 16 --micro-batch 2 \
      --global-batch 2 --profile --quiet 2>&1); rc=$?
echo "$out" | grep -A3 '^profile'
check "train --profile exits 0" "[ $rc -eq 0 ]"
check "profile gemm row: 30 calls measured, 45 predicted" \
  "echo \"\$out\" | grep -Eq '^  gemm +30\\.0 +[0-9.]+ +45\\.0 +[0-9.]+ +[-+][0-9.]+%'"
check "profile totals" "echo \"\$out\" | grep -Eq '^  kernels +[0-9.]+ +[0-9.]+'"
# output noise: counts agree with their nouns, a one-step run has a throughput, a run of
# no step says why without inventing a checkpoint, and a resumed run whose schedule gives
# the remaining steps the same rates (a constant LR with only --steps changed) says nothing
out=$(OMP_NUM_THREADS=1 timeout 60 "$bin" train --model tiny-dense --steps 1 --seq 16 --micro-batch 2 \
      --global-batch 2 2>&1); rc=$?
check "one micro-batch is 'micro-batch'" "[ $rc -eq 0 ] && echo \"\$out\" | grep -q 'global batch 2 (1 micro-batch),'"
check "a one-step run: '1 step' and its own tokens/s, not 0" \
  "echo \"\$out\" | grep -Eq '^done: 1 step \(1\.\.1\), final loss [0-9.]+, [1-9][0-9]* tokens/s \(its one step'"
n=$(mktemp -d "$tmp/noise.XXXX")
out=$("$bin" train --model tiny-dense --steps 0 --seq 16 --checkpoint-dir "$n/ck" 2>&1)
check "--steps 0: no step run, the starting weights named, no checkpoint 'at step 0' invented" \
  "echo \"\$out\" | grep -q '^done: --steps 0: no step run; the starting weights are $n/ck/step_00000000' && ! echo \"\$out\" | grep -q 'the checkpoint is at step'"
out=$("$bin" train --model tiny-dense --steps 0 --seq 16 2>&1)
check "--steps 0 without checkpoints" "echo \"\$out\" | grep -q '^done: --steps 0: no step run\$'"
OMP_NUM_THREADS=1 "$bin" train --model tiny-dense --steps 4 --seq 16 --checkpoint-dir "$n/ck" --resume latest --quiet >/dev/null 2>&1
out=$(OMP_NUM_THREADS=1 "$bin" train --model tiny-dense --steps 6 --seq 16 --checkpoint-dir "$n/ck" --resume latest --quiet 2>&1)
check "constant LR, only --steps changed: no schedule note" "! echo \"\$out\" | grep -q 'schedule'"
out=$("$bin" train --model tiny-dense --steps 6 --seq 16 --checkpoint-dir "$n/ck" --resume latest 2>&1)
check "resumed at its last step: no step to run, and how to evaluate it" \
  "echo \"\$out\" | grep -q '^done: $n/ck/step_00000006 is at step 6 and --steps is 6: no step to run (train --eval-only evaluates it)'"
"$bin" train --model tiny-dense --steps 4 --seq 16 --lr-schedule cosine --checkpoint-dir "$n/cos" --quiet >/dev/null 2>&1
out=$(OMP_NUM_THREADS=1 "$bin" train --model tiny-dense --steps 6 --seq 16 --lr-schedule cosine --checkpoint-dir "$n/cos" \
      --resume latest --quiet 2>&1)
check "cosine with --steps changed: the schedule note" "echo \"\$out\" | grep -q \"^note: the checkpoint's schedule was cosine, lr 0.001 over 4 steps; this run's (cosine, lr 0.001 over 6) applies from step 5\""
err=$("$bin" train --model tiny-dense --seq 65 --steps 1 2>&1); rc=$?
check "seq beyond max_seq refused" "[ $rc -ne 0 ] && echo \"\$err\" | grep -q 'max_seq'"
exit $fail
