#!/usr/bin/env python3
"""meshplan report --import-log (app/import_log.h): torchtitan and Megatron-LM step lines stored
as measurements of a planned run's plan, against figures derived by hand from the log lines;
lines of neither kind skipped; the refusals.

Usage: import_log_test.py MESHPLAN"""
import json
import os
import sys
import tempfile

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]
tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
db = os.path.join(tmp, "m.db")
run("plan", "--model", "llama3.1-8b", "--gpus", "8", "--top", "2", "--db", db)
p = run("report", "--db", db, "--run", "1", "--json")
plans = json.loads(p.stdout)["plans"] if p.returncode == 0 else []

# torchtitan v0.2.0's MetricsProcessor.log lines (with its colours), a validation line and
# other lines. Rank 1 runs 512 sequences of 8192 tokens on 8 GPUs: tps 8,000 per GPU is
# 64,000 tokens/s, 4,194,304 / 64,000 = 65.536 s a step; tps 6,400 is 81.92 s. The median of
# 65.536, 65.536, 81.92 is 65.536; memory 60.00 GiB reserved is 64,424,509,440 bytes.
E = "\033"
tt = os.path.join(tmp, "tt.log")
with open(tt, "w") as f:
    f.write("[rank0]:[titan] 2025-10-20 INFO Starting job: Llama 3 8B training\n")
    for step, tps in ((1, "8,000"), (2, "8,000"), (3, "6,400")):
        f.write(f"[rank0]:[titan] 2025-10-20 INFO {E}[31mstep: {step:2}  {E}[32mloss:  9.1234  {E}[33mgrad_norm:  "
                f"1.5000  {E}[36mmemory: 60.00GiB(75.00%)  {E}[34mtps: {tps}  {E}[36mtflops: 380.00  "
                f"{E}[35mmfu: 38.42%{E}[39m\n")
    f.write(f"[rank0]:[titan] INFO {E}[33mvalidate step:  3  loss:  9.9  memory: 61.00GiB(76.00%)  tps: 20,000\n")
p = run("report", "--db", db, "--run", "1", "--import-log", tt)
check("imported 3 steps of " in p.stdout and "(torchtitan)" in p.stdout and "median step 65.5360 s" in p.stdout,
      "torchtitan import summary: " + p.stdout)

# Megatron-LM core_v0.14.0's training_log and report_memory lines for rank 2: elapsed 50,000,
# 40,000 and 60,000 ms a step, median 50 s; max reserved 61,440 MB (MiB) = 60 GiB.
mg = os.path.join(tmp, "mg.log")
with open(mg, "w") as f:
    f.write("building GPT model ...\n")
    for it, ms in ((10, "50000.0"), (20, "40000.0"), (30, "60000.0")):
        f.write(f" [2025-10-20 10:00:00] iteration {it:8d}/{1000:8d} | consumed samples: {it * 512:12d} | elapsed time "
                f"per iteration (ms): {ms} | throughput per GPU (TFLOP/s/GPU): 400.1 | learning rate: 3.000000E-04 | "
                f"global batch size:   512 | lm loss: 8.765432E+00 | loss scale: 1.0 | grad norm: 2.345 | number of "
                f"skipped iterations:   0 | number of nan iterations:   0 |\n")
        if it == 10:
            f.write("[Rank 0] (after 10 iterations) memory (MB) | allocated: 30000.0 | max allocated: 50000.0 | "
                    "reserved: 55000.0 | max reserved: 61440.0\n")
p = run("report", "--db", db, "--run", "1", "--import-log", mg, "--plan-rank", "2")
check("imported 3 steps of " in p.stdout and "(Megatron-LM)" in p.stdout and "median step 50.0000 s" in p.stdout,
      "Megatron-LM import summary: " + p.stdout)

p = run("report", "--db", db, "--run", "1", "--json")
if p.returncode == 0 and len(plans) == 2:
    got = json.loads(p.stdout)["plans"]
    check((got[0].get("measured_steps"), got[0].get("measured_step_time_s"), got[0].get("measured_peak_mem_bytes")) ==
          (3, 65.536, 60 * 2**30), f"rank 1 measured: {got[0]}")
    check((got[1].get("measured_steps"), got[1].get("measured_step_time_s"), got[1].get("measured_peak_mem_bytes")) ==
          (3, 50.0, 60 * 2**30), f"rank 2 measured: {got[1]}")
    check(abs(got[0]["step_time_error_pct"] - 100 * (plans[0]["step_time_s"] - 65.536) / 65.536) < 1e-6,
          "rank 1: the error against the prediction")

print(f"{len(fails)} failures")
for x in fails:
    print("FAIL:", x)
sys.exit(1 if fails else 0)
