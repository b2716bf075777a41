#!/bin/bash
# meshplan train --elastic (app/train_elastic.c; docs/runtime.md, "Elastic training"), on 4
# CPU ranks (mpirun --oversubscribe, shared memory only), tiny-dense at seq 32 with a global
# batch of 12 sequences (a multiple of 4, 3 and 2 data-parallel ranks), 30 steps,
# checkpoints every 5, against one uninterrupted 4-rank run:
#   - rank 2 killed (SIGKILL) before step 12: the supervisor re-plans for 3 ranks and
#     resumes from step 10 without a person acting; every step's loss within 1e-5
#     (relative) of the uninterrupted run's (the data order is a function of the global
#     sequence index only, exec/runtime/dataset.h; the reductions' order changes with the
#     mesh), 1 step lost (<= the interval), the restart in the database and in `report`
#   - rank 2 stopped (SIGSTOP) before step 12 with MESHPLAN_COMM_TIMEOUT_S=3: the others
#     report it, the same recovery
#   - pp=2 x dp_shard=2 with rank 2 killed: the same on whatever the planner picks for 3
#   - a second failure during recovery (rank 1 killed before the restart's first step):
#     a second restart, on 2 ranks, the losses still the uninterrupted run's; the one
#     restart row (the failed recovery recorded none) says it
#   - --spares 1: after rank 2 is killed the job goes on at once on 3 ranks and grows back
#     to 4 at its next checkpoint (step 15), no step lost there, the same losses
#   - rank 1 killed half way through writing its shard of step 15: the torn checkpoint is
#     not used (step 10 is), the losses still the uninterrupted run's
#   - --min-ranks 4: the first failure stops the job with exit 1 naming the rule; nothing
#     lost: step 10's checkpoint resumes on 2 ranks to the uninterrupted run's losses
#   - a global batch the ranks left cannot keep is refused (exit 1) naming one that works;
#     without --checkpoint-every the interval is Young/Daly's, printed
#   - a divergence (--lr 1000 --clip 0) is not retried: exit 1, one attempt
# Usage: train_elastic_mpi_test.sh MESHPLAN
set -u
bin="$1"
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
export OMPI_MCA_btl="self,vader" OMPI_MCA_btl_vader_backing_directory="$TMPDIR"
export OMP_NUM_THREADS=1
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE GTEST_OUTPUT SLURM_JOB_ID
tmp="$TMPDIR/elastic"
rm -rf "$tmp"; mkdir -p "$tmp"
PY=/usr/bin/python3
root=()
if [ "$(id -u)" = "0" ]; then root=(--allow-run-as-root); fi
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; else echo "ok   $1"; fi; }
common=(train --model tiny-dense --steps 30 --seq 32 --micro-batch 1 --global-batch 12 --lr 3e-3 --quiet)

# losses REF RUN: RUN's metrics hold steps 1..30 once each, every loss within 1e-5 relative
# of REF's
losses() {
  $PY - "$1" "$2" <<'EOF'
import json, sys
a = {o["step"]: o["loss"] for o in map(json.loads, open(sys.argv[1]))}
b = [json.loads(l) for l in open(sys.argv[2])]
steps = [o["step"] for o in b]
worst = max(abs(o["loss"] - a[o["step"]]) / abs(a[o["step"]]) for o in b)
print("  %d steps, largest relative loss difference %.2e" % (len(b), worst))
sys.exit(0 if steps == list(range(1, 31)) and worst <= 1e-5 else 1)
EOF
}
# restarts DB: "attempt failed_after resumed lost" per row
restarts() {
  $PY - "$1" <<'EOF'
import sqlite3, sys
for r in sqlite3.connect(sys.argv[1]).execute(
        "SELECT attempt, failed_after_step, step_resumed, steps_lost, recover_s > 0 FROM restarts ORDER BY id"):
    print(*r)
EOF
}

timeout -k 10 120 mpirun "${root[@]}" -np 4 --oversubscribe --bind-to none "$bin" "${common[@]}" \
  --mesh dp_shard=4 --metrics "$tmp/ref.jsonl" >"$tmp/ref.out" 2>&1
check "the uninterrupted run" "[ \$(wc -l <$tmp/ref.jsonl) -eq 30 ]"

# elastic NAME KILL [ARGS...]: the supervised run with MESHPLAN_TEST_KILL=KILL; rc in $rc
elastic() {
  local name="$1" kill="$2"; shift 2
  MESHPLAN_TEST_KILL="$kill" timeout -k 10 200 "$bin" "${common[@]}" --elastic --checkpoint-dir "$tmp/$name" \
    --checkpoint-every 5 --metrics "$tmp/$name.jsonl" --db "$tmp/$name.db" "$@" >"$tmp/$name.out" 2>&1
  rc=$?
}

elastic kill "step:12:2" --mesh dp_shard=4 --min-ranks 2
check "kill: exit 0, on 3 ranks" "[ $rc -eq 0 ] && grep -q '^elastic: attempt 1: 3 ranks' $tmp/kill.out"
check "kill: losses match the uninterrupted run" "losses $tmp/ref.jsonl $tmp/kill.jsonl"
check "kill: one restart recorded, after step 11, from 10, 1 step lost" "[ \"\$(restarts $tmp/kill.db)\" = '1 11 10 1 1' ]"
"$bin" report --db "$tmp/kill.db" --run 1 >"$tmp/kill.report" 2>&1
check "kill: report shows the restart" "grep -q '^restarts: 1' $tmp/kill.report && grep -q 'a rank was killed' $tmp/kill.report"

MESHPLAN_COMM_TIMEOUT_S=3 elastic stop "step:12:2:stop" --mesh dp_shard=4 --min-ranks 2
check "stop: exit 0, on 3 ranks" "[ $rc -eq 0 ] && grep -q '^elastic: attempt 1: 3 ranks' $tmp/stop.out"
check "stop: reported as a stopped rank" "grep -q 'failed after step 11: a rank stopped answering' $tmp/stop.out"
check "stop: losses match the uninterrupted run" "losses $tmp/ref.jsonl $tmp/stop.jsonl"
check "stop: one restart recorded, 1 step lost" "[ \"\$(restarts $tmp/stop.db)\" = '1 11 10 1 1' ]"

elastic pp "step:12:2" --mesh pp=2,dp_shard=2 --min-ranks 2
check "pp=2 x dp_shard=2: exit 0, on 3 ranks" "[ $rc -eq 0 ] && grep -q '^elastic: attempt 1: 3 ranks' $tmp/pp.out"
check "pp=2 x dp_shard=2: losses match the uninterrupted run" "losses $tmp/ref.jsonl $tmp/pp.jsonl"

elastic twice "step:12:2:kill:0;step:11:1:kill:1" --mesh dp_shard=4 --min-ranks 2
check "second failure in recovery: exit 0, on 2 ranks" "[ $rc -eq 0 ] && grep -q '^elastic: attempt 2: 2 ranks' $tmp/twice.out"
check "second failure in recovery: losses match" "losses $tmp/ref.jsonl $tmp/twice.jsonl"
check "second failure in recovery: one restart row (attempt 2, from step 10) naming the failed recovery" \
  "[ \"\$(restarts $tmp/twice.db)\" = '2 11 10 1 1' ] && grep -q \"during restart 1's recovery\" $tmp/twice.out"

elastic spare "step:12:2" --mesh dp_shard=4 --min-ranks 2 --spares 1
check "spare: exit 0, 3 ranks from step 10, back to 4 from step 15" \
  "[ $rc -eq 0 ] && grep -q '^elastic: attempt 1: 3 ranks' $tmp/spare.out && grep -q '^elastic: attempt 2: 4 ranks' $tmp/spare.out && grep -q '^resumed from .*step_00000015: step 15' $tmp/spare.out"
check "spare: losses match the uninterrupted run" "losses $tmp/ref.jsonl $tmp/spare.jsonl"
check "spare: two restart rows, the second (the spare's) losing no step" \
  "[ \"\$(restarts $tmp/spare.db | tr '\n' ' ')\" = '1 11 10 1 1 2 15 15 0 1 ' ]"

elastic save "save:shard_half:15:1" --mesh dp_shard=4 --min-ranks 2
check "failure in a checkpoint write: exit 0, resumed from step 10" \
  "[ $rc -eq 0 ] && grep -q '^resumed from .*step_00000010: step 10' $tmp/save.out"
check "failure in a checkpoint write: losses match" "losses $tmp/ref.jsonl $tmp/save.jsonl"

elastic min "step:12:2" --mesh dp_shard=4 --min-ranks 4
check "below --min-ranks: exit 1 naming the rule, one attempt" \
  "[ $rc -eq 1 ] && grep -q 'below --min-ranks 4: stopping; nothing is lost' $tmp/min.out && ! grep -q '^elastic: attempt 1' $tmp/min.out"
timeout -k 10 120 mpirun "${root[@]}" -np 2 --oversubscribe --bind-to none "$bin" "${common[@]}" \
  --mesh dp_shard=2 --checkpoint-dir "$tmp/min" --resume latest --metrics "$tmp/min.jsonl" >"$tmp/min2.out" 2>&1
check "below --min-ranks: nothing lost (step 10 resumes on 2 ranks to the same losses)" \
  "grep -q 'resumed from .*step_00000010' $tmp/min2.out && losses $tmp/ref.jsonl $tmp/min.jsonl"

# a global batch of 4 on 4 ranks, then 3 left: no plan keeps it; the interval Young/Daly's
MESHPLAN_TEST_KILL=step:5:2 timeout -k 10 120 "$bin" train --model tiny-dense --steps 8 --seq 32 --micro-batch 1 \
  --global-batch 4 --quiet --elastic --mesh dp_shard=4 --checkpoint-dir "$tmp/batch" >"$tmp/batch.out" 2>&1
rc=$?
check "a global batch 3 ranks cannot keep: exit 1, one line naming the rule and a batch that works" \
  "[ $rc -eq 1 ] && grep -q '^meshplan train: no plan the runtime executes on 3 ranks keeps the global batch of 4 sequences.*a multiple of 12' $tmp/batch.out"
check "without --checkpoint-every: Young/Daly's interval printed" \
  "grep -q '^elastic: checkpoint every 8 steps: Young/Daly sqrt(2 x C x MTBF) = .* (50677 h per rank over 4 ranks)' $tmp/batch.out"

MESHPLAN_TEST_KILL= timeout -k 10 120 "$bin" train --model tiny-dense --steps 30 --seq 32 --micro-batch 1 \
  --global-batch 12 --lr 1000 --clip 0 --quiet --elastic --mesh dp_shard=4 --checkpoint-dir "$tmp/nan" \
  --checkpoint-every 5 >"$tmp/nan.out" 2>&1
rc=$?
check "divergence: exit 1, not restarted" \
  "[ $rc -eq 1 ] && grep -q 'diverged.*not restarted' $tmp/nan.out && ! grep -q '^elastic: attempt 1' $tmp/nan.out"

if [ $fail -ne 0 ]; then
  for f in "$tmp"/*.out; do echo "==== $f"; tail -25 "$f"; done
fi
exit $fail
