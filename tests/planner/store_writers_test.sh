#!/usr/bin/env bash
# The planner database under load, through the meshplan binary:
#  1. eight concurrent `meshplan plan --db --log-all` writers of the full 405B search on
#     16,384 GPUs (every candidate it enumerates logged: the heaviest write) on one fresh
#     database all complete, each run whole;
#  2. `meshplan plan --db` killed with SIGKILL at random points (during the search, the
#     write, the commit) leaves a database that passes PRAGMA integrity_check, holds only
#     whole runs, and takes the next run.
# Usage: store_writers_test.sh MESHPLAN
set -u
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
check() { if ! eval "$2"; then echo "FAIL: $1"; fail=1; fi; }
sql() { sqlite3 -batch "$1" "$2"; }
search=(plan --model llama3.1-405b --cluster h100-16k --top 1 --log-all)

# 1. eight writers at once
db="$tmp/writers.db"
rm -f "$db" "$db-wal" "$db-shm"
start=$(date +%s%N)
pids=()
for i in 1 2 3 4 5 6 7 8; do
  timeout 300 "$bin" "${search[@]}" --db "$db" >"$tmp/w$i.out" 2>"$tmp/w$i.err" &
  pids+=($!)
done
ok=0
for i in "${!pids[@]}"; do
  if wait "${pids[$i]}"; then ok=$((ok + 1)); else echo "writer $((i + 1)) failed:"; cat "$tmp/w$((i + 1)).err"; fi
done
ms=$((($(date +%s%N) - start) / 1000000))
took=$(printf '%d.%03d' $((ms / 1000)) $((ms % 1000)))
echo "8 concurrent writers: $ok exited 0 in ${took} s"
check "all 8 writers exit 0" "[ $ok -eq 8 ]"
check "8 runs recorded" "[ \"\$(sql $db 'SELECT count(*) FROM runs')\" = 8 ]"
# each run whole: its counts written at commit, every candidate the search printed as
# enumerated (writer 1's summary line) there
n=$(sed -n 's/^candidates: \([0-9]*\) enumerated.*/\1/p' "$tmp/w1.out")
echo "candidates per run: ${n:-?}"
check "the writer printed its candidate count" "[ -n \"$n\" ] && [ \"$n\" -gt 10000 ]"
check "every run has its $n candidates" \
  "[ \"\$(sql $db 'SELECT count(*) FROM runs r WHERE n_candidates = ${n:-0} AND (SELECT count(*) FROM plans p WHERE p.run_id = r.id) = ${n:-0}')\" = 8 ]"
check "integrity_check ok" "[ \"\$(sql $db 'PRAGMA integrity_check')\" = ok ]"
check "report lists the 8 runs" "[ \"\$(\"$bin\" report --db $db | grep -c llama3.1-405b)\" = 8 ]"

# 2. kill -9 at random points
db="$tmp/killed.db"
rm -f "$db" "$db-wal" "$db-shm"
"$bin" "${search[@]}" --db "$db" >/dev/null 2>&1
check "first run completes" "[ \"\$(sql $db 'SELECT count(*) FROM runs')\" = 1 ]"
RANDOM=20261126
for k in $(seq 1 12); do
  "$bin" "${search[@]}" --db "$db" >/dev/null 2>&1 &
  pid=$!
  # 0..2.5 s: the search takes 1..1.5 s on 2 cores, its write about 0.3 s after it
  t=$((RANDOM % 2500))
  sleep "$(printf '%d.%03d' $((t / 1000)) $((t % 1000)))"
  kill -9 "$pid" 2>/dev/null
  wait "$pid" 2>/dev/null
  r=$(sql "$db" 'PRAGMA integrity_check')
  if [ "$r" != ok ]; then echo "FAIL: integrity_check after kill $k: $r"; fail=1; fi
done
check "only whole runs after the kills" \
  "[ \"\$(sql $db 'SELECT count(*) FROM runs r WHERE n_candidates IS NULL OR n_candidates <> (SELECT count(*) FROM plans p WHERE p.run_id = r.id)')\" = 0 ]"
check "no rows of a run that was not committed" \
  "[ \"\$(sql $db 'SELECT count(*) FROM plans WHERE run_id NOT IN (SELECT id FROM runs)')\" = 0 ]"
n_before=$(sql "$db" 'SELECT count(*) FROM runs')
"$bin" "${search[@]}" --db "$db" >/dev/null 2>"$tmp/after.err"
check "the database takes a run after the kills" "[ \$? -eq 0 ] && [ \"\$(sql $db 'SELECT count(*) FROM runs')\" = $((n_before + 1)) ]"
echo "kill -9: $((n_before - 1)) of 12 killed runs had committed before the kill; integrity_check ok after each"
exit $fail
