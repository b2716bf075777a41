#!/bin/bash
# meshplan train's loop on 4 MPI ranks (mpirun --oversubscribe, shared memory only):
#   - bit-identical resume: 12 steps straight == 6 steps, kill -9 of one rank at step 8,
#     --resume latest to 12 (losses, grad norms, lr and every rank's final shard file),
#     dense (dp_shard x tp), MoE (ep) and float8 (FSDP)
#   - kill -9 of rank 2 half way through writing its shard of step 12: step 6 loads
#   - resharding: a checkpoint saved on dp_shard=4 resumes on tp=2 x dp_shard=2,
#     dp_replicate=2 x dp_shard=2, tp=4 and one rank; an MoE one saved on dp_shard=4 x ep=4
#     resumes on dp_shard=2 x ep=2 x dp_replicate=2, on dp_replicate=2 x tp=2 x ep=4 x etp=1
#     (EP reaching into dp_replicate), on tp=4 x ep=2 x etp=2 and on one rank, one saved on
#     that grid resumes on one rank, one saved on tp=4 x ep=2 x etp=2 on one rank and on
#     dp_shard=4 x ep=2 x etp=2, the dense one also on
#     pp=2 x dp_shard=2; a tied model saved on pp=4 resumes on one rank and on pp=2 x
#     dp_shard=2: every loss within 1e-5 (relative) of the straight run's (the
#     reductions' order changes with the mesh)
#   - the OpenMP threads line: without OMP_NUM_THREADS each rank takes its share of the
#     cores; an explicit OMP_NUM_THREADS is honoured
# Usage: train_loop_mpi_test.sh MESHPLAN
set -u
bin="$1"
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
export OMPI_MCA_btl="self,vader"
export ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE GTEST_OUTPUT
tmp="$TMPDIR/loop"
rm -rf "$tmp"; mkdir -p "$tmp"
PY=/usr/bin/python3
root=()
if [ "$(id -u)" = "0" ]; then root=(--allow-run-as-root); fi
mpi() {
  timeout -k 10 120 mpirun "${root[@]}" -np 4 --oversubscribe --bind-to none \
    --mca btl self,vader --mca btl_vader_backing_directory "$TMPDIR" "$@"
}
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; else echo "ok   $1"; fi; }
common=(train --steps 12 --seq 32 --micro-batch 2 --global-batch 8 --lr 3e-3 --lr-schedule cosine --warmup 2
        --shuffle --quiet)

# losses A B TOL: B's steps are A's, each loss within TOL relative (0: bit for bit, with the
# grad norms and lr), B ending at A's last step
losses() {
  $PY - "$1" "$2" "$3" <<'EOF'
import json, sys
a = {o["step"]: o for o in map(json.loads, open(sys.argv[1]))}
b = [json.loads(l) for l in open(sys.argv[2])]
tol = float(sys.argv[3])
def same(x, y):
    if tol == 0: return (x["loss"], x["grad_norm"], x["lr"]) == (y["loss"], y["grad_norm"], y["lr"])
    return abs(x["loss"] - y["loss"]) <= tol * abs(y["loss"])
bad = [o["step"] for o in b if o["step"] not in a or not same(o, a[o["step"]])]
worst = max((abs(o["loss"] - a[o["step"]]["loss"]) / abs(a[o["step"]]["loss"]) for o in b if o["step"] in a), default=1)
ok = not bad and b and b[-1]["step"] == max(a)
print("  %d steps compared, largest relative loss difference %.2e%s" % (len(b), worst, "" if ok else ", differing %s" % bad))
sys.exit(0 if ok else 1)
EOF
}

same_shards() { # every rank file of step 12 equal
  local ok=0
  for f in "$1"/step_00000012/rank_*.bin; do cmp -s "$f" "$2/step_00000012/$(basename "$f")" || ok=1; done
  return $ok
}

resume_case() {
  local name="$1"; shift
  local d="$tmp/$name"
  mkdir -p "$d"
  mpi "$bin" "${common[@]}" "$@" --checkpoint-dir "$d/a" --checkpoint-every 6 --metrics "$d/a.jsonl" >"$d/a.out" 2>&1
  check "$name: straight run" "[ -d $d/a/step_00000012 ]"
  MESHPLAN_TEST_KILL=step:8:1 mpi "$bin" "${common[@]}" "$@" --checkpoint-dir "$d/b" --checkpoint-every 6 \
    --metrics "$d/b.jsonl" >"$d/kill.out" 2>&1
  local rc=$?
  check "$name: rank 1 killed at step 8" "[ $rc -ne 0 ] && [ $rc -ne 124 ] && [ -d $d/b/step_00000006 ] && [ ! -d $d/b/step_00000012 ]"
  mpi "$bin" "${common[@]}" "$@" --checkpoint-dir "$d/b" --checkpoint-every 6 --metrics "$d/b.jsonl" \
    --resume latest >"$d/b.out" 2>&1
  check "$name: resumed: bit-identical losses, grad norms and lr" "losses $d/a.jsonl $d/b.jsonl 0"
  check "$name: every rank's final shard bit-identical" "same_shards $d/a $d/b"
}
export OMP_NUM_THREADS=1
resume_case dense --model tiny-dense --mesh dp_shard=2,tp=2
resume_case moe --model tiny-moe --mesh dp_shard=4,ep=2
resume_case fp8 --model tiny-dense --mesh dp_shard=4 --fp8

# kill -9 of rank 2 in the middle of its shard of step 12
k="$tmp/savekill"
MESHPLAN_TEST_KILL=save:shard_half:12:2 mpi "$bin" "${common[@]}" --model tiny-dense --mesh dp_shard=2,tp=2 \
  --checkpoint-dir "$k" --checkpoint-every 6 --metrics "$k.jsonl" >"$k.out" 2>&1
check "save killed on rank 2: step 12 not published, step 6 is the newest" \
  "[ \"\$(ls $k | grep '^step_' | tail -1)\" = step_00000006 ]"
mpi "$bin" "${common[@]}" --model tiny-dense --mesh dp_shard=2,tp=2 --checkpoint-dir "$k" --checkpoint-every 6 \
  --metrics "$k.jsonl" --resume latest >"$k.resume" 2>&1
check "save killed on rank 2: resumed, bit-identical to the straight run" \
  "losses $tmp/dense/a.jsonl $k.jsonl 0 && same_shards $tmp/dense/a $k"

# resharding: step 6 saved on one mesh resumes on others
reshard() { # NAME MODEL SAVED_DIR STRAIGHT_JSONL NP MESH
  local r="$tmp/reshard_$1"
  mkdir -p "$r"
  cp -r "$3/step_00000006" "$r/"
  if [ "$5" = 1 ]; then
    "$bin" "${common[@]}" --model "$2" --checkpoint-dir "$r" --resume latest --metrics "$r.jsonl" >"$r.out" 2>&1
  else
    mpi "$bin" "${common[@]}" --model "$2" --mesh "$6" --checkpoint-dir "$r" --resume latest \
      --metrics "$r.jsonl" >"$r.out" 2>&1
  fi
  check "resharded to $6: losses within 1e-5 of the straight run" "grep -q 'saved by mesh' $r.out && losses $4 $r.jsonl 1e-5"
}
s="$tmp/saved4"
mpi "$bin" "${common[@]}" --model tiny-dense --mesh dp_shard=4 --checkpoint-dir "$s" --checkpoint-every 6 \
  --metrics "$s.jsonl" >/dev/null 2>&1
reshard tp2 tiny-dense "$s" "$s.jsonl" 4 tp=2,dp_shard=2
reshard hsdp tiny-dense "$s" "$s.jsonl" 4 dp_replicate=2,dp_shard=2
reshard tp4 tiny-dense "$s" "$s.jsonl" 4 tp=4
reshard one tiny-dense "$s" "$s.jsonl" 1 single
reshard pp2 tiny-dense "$s" "$s.jsonl" 4 pp=2,dp_shard=2
# a tied model saved by pipeline stages (the last stage's head copy is the embedding, saved
# once) resumes on one rank and on other stages
t="$tmp/savedtied"
mpi "$bin" "${common[@]}" --model tiny-tied --mesh pp=4 --checkpoint-dir "$t" --checkpoint-every 6 \
  --metrics "$t.jsonl" >/dev/null 2>&1
reshard tied_one tiny-tied "$t" "$t.jsonl" 1 single
reshard tied_pp2 tiny-tied "$t" "$t.jsonl" 4 pp=2,dp_shard=2
m="$tmp/savedmoe"
mpi "$bin" "${common[@]}" --model tiny-moe --mesh dp_shard=4,ep=4 --checkpoint-dir "$m" --checkpoint-every 6 \
  --metrics "$m.jsonl" >/dev/null 2>&1
reshard moe_ep2 tiny-moe "$m" "$m.jsonl" 4 dp_replicate=2,dp_shard=2,ep=2
reshard moe_one tiny-moe "$m" "$m.jsonl" 1 single
# EP reaching into dp_replicate (dp_replicate=2 x tp=2, ep=4, etp=1): ranks 2 and 3 hold
# experts 4-7 and own them in the checkpoint (their expert-DP group is themselves, not
# dp_replicate's), so the one-rank resume finds every expert; and the dp_shard=4 x ep=4
# checkpoint resumes onto that grid
g="$tmp/savedgrid"
mpi "$bin" "${common[@]}" --model tiny-moe --mesh dp_replicate=2,tp=2,ep=4,etp=1 --checkpoint-dir "$g" \
  --checkpoint-every 6 --metrics "$g.jsonl" >/dev/null 2>&1
reshard grid_one tiny-moe "$g" "$g.jsonl" 1 single
reshard moe_grid tiny-moe "$m" "$m.jsonl" 4 dp_replicate=2,tp=2,ep=4,etp=1
# expert tensor parallelism below tp (tp=4 x ep=2 x etp=2: each expert's gate/up rows and
# down columns split over an expert-TP group of half a tp group): its checkpoint resumes on
# one rank and with etp=2 over tp=1 (dp_shard=4 x ep=2), and the dp_shard=4 x ep=4 one onto it
x="$tmp/savedetp"
mpi "$bin" "${common[@]}" --model tiny-moe --mesh tp=4,ep=2,etp=2 --checkpoint-dir "$x" --checkpoint-every 6 \
  --metrics "$x.jsonl" >/dev/null 2>&1
reshard etp_one tiny-moe "$x" "$x.jsonl" 1 single
reshard etp_tp1 tiny-moe "$x" "$x.jsonl" 4 dp_shard=4,ep=2,etp=2
reshard moe_etp tiny-moe "$m" "$m.jsonl" 4 tp=4,ep=2,etp=2

# --eval-only under any mesh: the dp_shard=4 checkpoint's eval loss (no --val-data: the
# training data's first batches) on tp=2 x dp_shard=2 and on one rank, within 1e-5
"$bin" "${common[@]}" --model tiny-dense --checkpoint-dir "$s" --resume "$s/step_00000006" --eval-only \
  --metrics "$tmp/eval1.jsonl" >/dev/null 2>&1
mpi "$bin" "${common[@]}" --model tiny-dense --mesh tp=2,dp_shard=2 --checkpoint-dir "$s" --resume "$s/step_00000006" \
  --eval-only --metrics "$tmp/eval4.jsonl" >/dev/null 2>&1
check "--eval-only on tp=2 x dp_shard=2 and on one rank: the same eval loss within 1e-5" "$PY -c \"
import json, sys
a, b = (json.loads(open(p).read()) for p in ('$tmp/eval1.jsonl', '$tmp/eval4.jsonl'))
sys.exit(0 if a['step'] == b['step'] == 6 and abs(a['eval_loss'] - b['eval_loss']) <= 1e-5 * abs(a['eval_loss']) else 1)\""

# --profile's FSDP calls beside the schedule's ops: tiny-dense on dp_shard=4, 2 blocks of 9
# parameter tensors and a root unit of 3 (embedding, final norm, head). The schedule has one
# op per unit: 3 forward gathers, 2 backward gathers (the blocks reshard after forward;
# the root is kept) and 3 reduce-scatters = 8. The runtime issues one call per tensor:
# 9 + 9 + 3 + 9 + 9 + 9 + 9 + 3 = 60. The table shows 60 calls beside 8 predicted, and the
# note the runtime's own count of unit ops, 8, the schedule's.
out=$(mpi "$bin" train --model tiny-dense --mesh dp_shard=4 --steps 3 --seq 16 --micro-batch 2 --profile --quiet 2>&1)
echo "$out" | grep 'fsdp'
check "--profile: fsdp 60 calls against 8 ops predicted, and the runtime's 8 unit ops said" \
  "echo \"\$out\" | grep -Eq '^  collectives fsdp +60\.0 +[0-9.]+ +8\.0 ' && echo \"\$out\" | grep -q 'its 60.0 calls are 8.0 unit ops, one per unit as the schedule counts them'"

# one run in the database across meshes: 6 steps on dp_shard=4, resumed to 12 on
# tp=2 x dp_shard=2; report shows one run, the whole curve (the plot's data too) and the
# resume marked in its segments
o="$tmp/onerun"
orun=(train --model tiny-dense --seq 32 --micro-batch 2 --global-batch 8 --lr 3e-3 --quiet --checkpoint-dir "$o/ck"
      --checkpoint-every 6 --db "$o/r.db")
mkdir -p "$o"
mpi "$bin" "${orun[@]}" --steps 6 --mesh dp_shard=4 >"$o/a.out" 2>&1
mpi "$bin" "${orun[@]}" --steps 12 --mesh tp=2,dp_shard=2 --resume latest >"$o/b.out" 2>&1
rep=$("$bin" report --db "$o/r.db" --run 1 2>&1)
echo "$rep" | tail -4
check "resumed on another mesh: one run in the database" "[ \$(\"$bin\" report --db $o/r.db | grep -c 'tiny-dense') -eq 1 ]"
check "resumed on another mesh: the 12 steps in one curve, the resume marked" \
  "echo \"\$rep\" | grep -q '^training: 12 measured steps' && echo \"\$rep\" | grep -Eq '^ +2 +[0-9]+ +dp_shard=2,tp=2 +2 +7\.\.12, resumed from step 6\$'"
if command -v gnuplot >/dev/null; then
  "$bin" report --db "$o/r.db" --run 1 --plot "$o/plots" >/dev/null 2>&1
  check "resumed on another mesh: the plot's data holds steps 1..12" \
    "[ \"\$(awk '/^#/ {b++} b == 1 && /^[0-9]/ {print \$1}' $o/plots/training.dat | tr '\n' ' ')\" = '1 2 3 4 5 6 7 8 9 10 11 12 ' ]"
fi

# threads: each of 4 ranks gets max(1, cores / 4) without OMP_NUM_THREADS; 3 with it
cores=$($PY -c 'import os; print(len(os.sched_getaffinity(0)))')
unset OMP_NUM_THREADS
out=$(mpi "$bin" train --model tiny-dense --mesh dp_shard=4 --steps 1 --seq 16 --micro-batch 1 --quiet 2>&1)
echo "$out" | grep '^threads'
check "threads without OMP_NUM_THREADS: the cores' share per rank" \
  "echo \"\$out\" | grep -Eq '^threads: [0-9]+ OpenMP threads? per rank: [0-9]+ cores?, 4 ranks on this node'"
out=$(OMP_NUM_THREADS=3 mpi "$bin" train --model tiny-dense --mesh dp_shard=4 --steps 1 --seq 16 --micro-batch 1 --quiet 2>&1)
check "an explicit OMP_NUM_THREADS is honoured" "echo \"\$out\" | grep -q '^threads: 3 OpenMP threads per rank (OMP_NUM_THREADS)'"
echo "(this machine: $cores logical CPUs)"
exit $fail
