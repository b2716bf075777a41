#!/bin/bash
# OpenMP threads per rank under MPI (exec/runtime/threads.h): the 4-rank tiny-dense run's
# throughput with OpenMP's default (one thread per CPU in every rank, forced here with
# OMP_NUM_THREADS=<CPUs> as it is without the runtime's choice) beside the runtime's
# choice (OMP_NUM_THREADS unset), alternating, REPS times each; prints every run, the
# medians and their ratio.
# Usage: bench/train_threads.sh [MESHPLAN] [REPS]   (default bazel-bin/app/meshplan, 5)
set -u
bin="${1:-bazel-bin/app/meshplan}"
reps="${2:-5}"
cpus=$(nproc)
root=()
if [ "$(id -u)" = "0" ]; then root=(--allow-run-as-root); fi
run() { # prints the run's tokens/s (steps 2..)
  mpirun "${root[@]}" -np 4 --oversubscribe --mca btl self,vader "$bin" train --model tiny-dense \
    --mesh dp_shard=4 --steps 8 --quiet 2>&1 | sed -n 's/.*, \([0-9]*\) tokens\/s.*/\1/p'
}
median() { sort -n | awk '{a[NR]=$1} END {print (NR % 2) ? a[(NR+1)/2] : (a[NR/2] + a[NR/2+1]) / 2}'; }
before=(); after=()
for i in $(seq "$reps"); do
  b=$(OMP_NUM_THREADS=$cpus run)
  a=$(env -u OMP_NUM_THREADS bash -c "$(declare -f run); bin='$bin'; root=(${root[*]}); run")
  echo "run $i: OpenMP default ($cpus threads per rank) $b tokens/s, runtime's choice $a tokens/s"
  before+=("$b"); after+=("$a")
done
mb=$(printf '%s\n' "${before[@]}" | median); ma=$(printf '%s\n' "${after[@]}" | median)
echo "median of $reps: OpenMP default $mb tokens/s, runtime's choice $ma tokens/s, ratio $(awk -v a="$ma" -v b="$mb" 'BEGIN {printf "%.1f", (b > 0 ? a / b : 0)}')x ($cpus CPUs, 4 ranks, load average $(cut -d' ' -f1 /proc/loadavg))"
