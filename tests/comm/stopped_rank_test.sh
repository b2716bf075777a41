#!/bin/bash
# A stopped rank does not hang the job: 4 CPU ranks train under mpirun with
# MESHPLAN_COMM_TIMEOUT_S=5; one rank gets SIGSTOP. Every other rank must print what it
# waited on, and the job must end (MPI_Abort, non-zero exit) within the timeout + 10 s.
# dp_shard=2 x tp=2, each rank naming the collective and the mesh group: rank 3 stopped,
# then rank 0 (the one that prints the steps). Pipeline stages (tiny-odd on pp=4, 1F1B),
# each rank naming its stage, the transfer, the peer and group pp (or the collective and
# group it waited in): a middle stage (rank 2) stopped, then the last one (rank 3, which
# computes the loss).
# Usage: stopped_rank_test.sh MESHPLAN
set -u
bin="$1"
export TMPDIR="${TEST_TMPDIR:-${TMPDIR:-/tmp}}"
unset TEST_PREMATURE_EXIT_FILE XML_OUTPUT_FILE GTEST_OUTPUT
root=()
if [ "$(id -u)" = "0" ]; then root=(--allow-run-as-root); fi
timeout_s=5
fails=0

descendants() { for c in $(pgrep -P "$1"); do echo "$c"; descendants "$c"; done; }
rank_of() { tr '\0' '\n' <"/proc/$1/environ" 2>/dev/null | sed -n 's/^OMPI_COMM_WORLD_RANK=//p'; }

# run_case VICTIM MODEL MESH: train MODEL on MESH (4 ranks), stop rank VICTIM
run_case() {
  local victim=$1 model=$2 mesh=$3 out="$TMPDIR/stop$1_$3.out" err="$TMPDIR/stop$1_$3.err"
  MESHPLAN_COMM_TIMEOUT_S=$timeout_s OMP_NUM_THREADS=1 timeout -k 5 120 \
    mpirun "${root[@]}" -np 4 --oversubscribe --bind-to none --mca btl self,vader \
    --mca btl_vader_backing_directory "$TMPDIR" \
    "$bin" train --model "$model" --mesh "$mesh" --steps 1000000 --seq 16 --micro-batch 2 --global-batch 8 \
    >"$out" 2>"$err" &
  local job=$!
  # training is under way once rank 0 has printed a few steps
  for _ in $(seq 1 600); do
    [ "$(grep -c '^step ' "$out" 2>/dev/null)" -ge 5 ] && break
    kill -0 "$job" 2>/dev/null || break
    sleep 0.1
  done
  local pid="" p
  for p in $(descendants "$job"); do
    [ "$(rank_of "$p")" = "$victim" ] && pid=$p
  done
  if [ -z "$pid" ]; then
    echo "FAIL: rank $victim not found (did training start?)"; cat "$err"; kill "$job" 2>/dev/null; wait "$job"
    fails=$((fails + 1)); return
  fi
  local start; start=$(date +%s%N)
  kill -STOP "$pid"
  wait "$job"
  local rc=$? ms took
  ms=$((($(date +%s%N) - start) / 1000000))
  took=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))
  kill -CONT "$pid" 2>/dev/null; kill -9 "$pid" 2>/dev/null
  echo "$mesh: rank $victim stopped: the job ended after ${took} s with exit $rc (limit $((timeout_s + 10)) s)"
  grep 'did not complete within' "$err" | sed 's/^/  /'
  if [ "$rc" = 0 ] || [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
    echo "FAIL: exit $rc: want the non-zero exit of MPI_Abort, not 0 nor the harness's timeout"; fails=$((fails + 1))
  fi
  if [ "$ms" -gt $(((timeout_s + 10) * 1000)) ]; then
    echo "FAIL: took ${took} s, more than the timeout + 10 s"; fails=$((fails + 1))
  fi
  local r
  for r in 0 1 2 3; do
    [ "$r" = "$victim" ] && continue
    # a collective: "rank R: all_reduce of N fp32 elements on group tp (world ranks 2 3) did not
    # complete ..."; a pipeline transfer: "pipeline stage R of pp=4: recv_x from world rank P on
    # group pp: rank R: recv of N fp32 elements from rank P did not complete ..."
    if ! grep -Eq "(rank $r: [a-z_]+ of [0-9]+ [a-z0-9]+ elements on group [a-z_]+ \(world ranks?( [0-9]+)+\)|pipeline stage $r of pp=4: [a-z_]+ (from|to) world rank [0-9]+( with a receive)? on group pp: rank $r: (send|recv|sendrecv) of [0-9]+ fp32 elements (from|to|with) rank [0-9]+) did not complete within $timeout_s s" "$err"; then
      echo "FAIL: rank $r did not name what it waited on"; fails=$((fails + 1))
    fi
  done
  if [ "$fails" != 0 ]; then echo "--- stderr ---"; cat "$err"; fi
}

run_case 3 tiny-dense dp_shard=2,tp=2
run_case 0 tiny-dense dp_shard=2,tp=2
run_case 2 tiny-odd pp=4
run_case 3 tiny-odd pp=4
exit $fails
