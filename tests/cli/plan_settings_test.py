#!/usr/bin/env python3
"""The settings a plan is predicted under beyond its candidate's fields, through the binary:
`plan --db` stores each plan's stack, --loss-chunks and --nccl-version (planner/store.h,
schema 11), `report` reads them back, and the stored prediction is the one `simulate` makes of
the same plan under them, to the last bit, and not the one it makes without them (so a setting
dropped on the way would show).

  - Chunked loss: Llama 3.1 8B on 8 H100s, dp_shard=8, micro-batch 1, torchtitan-eager with
    --loss-chunks 8: one chunk's fp32 logits live at a time instead of the micro-batch's, so
    the peak differs from the unchunked plan's.
  - NCCL: Nemotron-4 15B at dp_replicate=288 x tp=8 on 2,304 H100s, megatron-core (the case of
    nccl_version_cli_test.py): the data-parallel group holds one rank a node, so NCCL 2.22
    (before PAT, which ships in 2.23) prices its collectives slower than the newest NCCL.
    2.22 is stored as 2 x 10000 + 22 x 100 = 22200.
  - Experts' load: tiny-moe on 4 H100s at dp_shard=4 x ep=4 with --moe-imbalance 1.5 and
    --moe-capacity-factor 1.25: the busiest EP rank's experts take 1.5 times the mean, cut to
    the capacity, which the balanced plan does not price.
  - Float8 recipe: the Llama plan with --fp8 rowwise stores rowwise, and its prediction is
    simulate's under rowwise, not under tensorwise (the runtime's one recipe).
  - Stack: the profile named is stored by name; without --stack, the default for an H100
    (torchtitan-compile) and for the CPU (meshplan-cpu), with NCCL 0 (the newest modelled)
    and 1 loss chunk.

train --plan-id carries a stored chunked loss into the plan it runs, so the plan's own rule
refuses it (exec/plan_loss.c: the runtime's memory models compute the loss on the whole
micro-batch) in one line, exit 2, naming loss_chunks and the plan; a plan without one trains
and its plan line states the settings it was predicted under. A stored expert capacity factor
is the runtime's drop rule: train --plan-id of a tiny-moe plan ranked with
--moe-capacity-factor 1.25 trains with that factor (its header line says so), and a
--moe-capacity-factor given that says otherwise is refused naming both. A stored float8 recipe
goes into the plan too: a rowwise plan is refused by the float8 pass's rule (the runtime runs
tensorwise only), a tensorwise one trains and says so, and a --fp8 RECIPE given that says
otherwise is refused naming both. The model's multi-token-prediction depth is stored with the
plan (the model is stored by name): a tiny-dense plan with --mtp-num-layers 1 is refused for a
run of tiny-dense without it, naming the depth.

Usage: plan_settings_test.py MESHPLAN"""
import json
import os
import sqlite3
import sys
import tempfile

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]
tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
os.environ["OMP_NUM_THREADS"] = "1"


def stored(db):
    """The first ranked plan of run 1 as report --json reads it back."""
    p = run("report", "--db", db, "--run", "1", "--json")
    return json.loads(p.stdout)["plans"][0] if p.returncode == 0 else {}


def simulated(args, *extra):
    p = run("simulate", *args, *extra, "--json")
    return json.loads(p.stdout) if p.returncode == 0 else {}


def round_trip(name, args, given, want_stack, want_chunks, want_nccl, pin=()):
    """plan args + given (+ pin, the --fix that makes its best plan simulate's default) into a
    fresh database: the stored settings are the wanted ones and the stored prediction is
    simulate's of the same plan with given, not without."""
    db = os.path.join(tmp, name + ".db")
    run("plan", *args, *given, *pin, "--db", db, "--top", "1")
    p = stored(db)
    check((p.get("stack"), p.get("loss_chunks"), p.get("nccl_version")) == (want_stack, want_chunks, want_nccl),
          f"{name}: stored settings {p.get('stack')}, {p.get('loss_chunks')}, {p.get('nccl_version')}")
    with_them, without = simulated(args, *given), simulated(args)
    check(p.get("step_time_s") == with_them.get("step_time_s"),
          f"{name}: stored step {p.get('step_time_s')!r}, simulate's with {given} {with_them.get('step_time_s')!r}")
    check(p.get("peak_mem_bytes") == with_them.get("peak_mem_bytes"),
          f"{name}: stored peak {p.get('peak_mem_bytes')}, simulate's {with_them.get('peak_mem_bytes')}")
    if given:
        check((p.get("step_time_s"), p.get("peak_mem_bytes")) != (without.get("step_time_s"),
                                                                   without.get("peak_mem_bytes")),
              f"{name}: {given} changes nothing, so the round trip proves nothing")
    return db


LLAMA = ["--model", "llama3.1-8b", "--gpus", "8", "--gpu", "h100-sxm", "--mesh", "dp_shard=8", "--ac", "none",
         "--micro-batch", "1", "--stack", "torchtitan-eager"]
NEMOTRON = ["--model", "nemotron4-15b", "--gpus", "2304", "--gpu", "h100-sxm", "--mesh", "dp_replicate=288,tp=8",
            "--seq", "4096", "--micro-batch", "4", "--global-batch", "1152", "--stack", "megatron-core", "--ac", "none"]
db = round_trip("chunks", LLAMA, ["--loss-chunks", "8"], "torchtitan-eager", 8, 0)
r = run("report", "--db", db, "--run", "1")
check("predicted under stack torchtitan-eager, the newest NCCL modelled, loss in 8 chunks\n" in r.stdout,
      "report's settings line: " + r.stdout)
round_trip("nccl", NEMOTRON, ["--nccl-version", "2.22"], "megatron-core", 1, 22200)
r = run("report", "--db", os.path.join(tmp, "nccl.db"), "--run", "1")
check("predicted under stack megatron-core, NCCL 2.22.0\n" in r.stdout, "report's settings line: " + r.stdout)
db = os.path.join(tmp, "rowwise.db")
FULL_AC = [("full" if a == "none" else a) for a in LLAMA]  # without chunked loss only full AC fits
run("plan", *FULL_AC, "--fp8", "rowwise", "--db", db, "--top", "1")
p = stored(db)
rowwise, tensorwise = simulated(FULL_AC, "--fp8", "rowwise"), simulated(FULL_AC, "--fp8", "tensorwise")
check((p.get("fp8"), p.get("fp8_recipe")) == (True, "rowwise"), f"rowwise: stored {p}")
check((p.get("step_time_s"), p.get("peak_mem_bytes")) == (rowwise.get("step_time_s"), rowwise.get("peak_mem_bytes")),
      f"rowwise: stored {p.get('step_time_s')!r}, simulate's {rowwise.get('step_time_s')!r}")
check(rowwise.get("step_time_s") != tensorwise.get("step_time_s"), "rowwise and tensorwise price the same")
MOE = ["--model", "tiny-moe", "--gpus", "4", "--gpu", "h100-sxm", "--mesh", "dp_shard=4,ep=4", "--seq", "64",
       "--global-batch", "16", "--micro-batch", "1", "--ac", "none"]
# reshard pinned on, simulate's default (the search ranks reshard off first on this mesh)
db = round_trip("moe", MOE, ["--moe-imbalance", "1.5", "--moe-capacity-factor", "1.25"], "torchtitan-compile", 1, 0,
                pin=["--fix", "reshard=1"])
p = stored(db)
check((p.get("moe_imbalance"), p.get("moe_capacity_factor")) == (1.5, 1.25), f"moe: stored load {p}")
H100 = ["--model", "llama3.1-8b", "--gpus", "8", "--gpu", "h100-sxm", "--mesh", "dp_shard=8", "--ac", "none",
        "--micro-batch", "1"]
round_trip("default_gpu", H100, [], "torchtitan-compile", 1, 0)

# ---- train --plan-id ----
CPU = ["--model", "tiny-dense", "--gpus", "1", "--gpu", "cpu", "--seq", "16", "--global-batch", "4",
       "--micro-batch", "2"]
db = round_trip("default_cpu", CPU, [], "meshplan-cpu", 1, 0)
p = run("train", "--model", "tiny-dense", "--steps", "1", "--db", db, "--plan-id", "1")
check(f"plan 1 of {db} (run 1: " in p.stdout and "; predicted under stack meshplan-cpu, the newest NCCL modelled\n"
      in p.stdout, "train's plan line: " + p.stdout)
db = os.path.join(tmp, "chunked_tiny.db")
run("plan", "--model", "tiny-dense", "--gpus", "1", "--gpu", "h100-sxm", "--micro-batch", "1", "--loss-chunks", "2",
    "--db", db, "--top", "1")
with sqlite3.connect(db) as c:
    check(c.execute("SELECT loss_chunks, stack FROM plans WHERE id=1").fetchall() == [(2, "torchtitan-compile")],
          "tiny-dense's chunked plan row")
p = run("train", "--model", "tiny-dense", "--steps", "1", "--db", db, "--plan-id", "1", want_rc=2)
lines = p.stderr.strip().splitlines()
check(len(lines) == 1 and f"plan 1 of {db}" in lines[0] and "loss_chunks 2 is torchtitan's ChunkedLossWrapper"
      in lines[0] and "meshplan-cpu memory model" in lines[0], f"train of a chunked-loss plan: {p.stderr!r}")
with sqlite3.connect(db) as c:
    check(c.execute("SELECT count(*) FROM measurements").fetchone() == (0,), "a refused plan recorded steps")
for recipe, cluster in [("rowwise", "h100-sxm"), ("on", "cpu")]:
    db = os.path.join(tmp, f"fp8_{recipe}.db")
    run("plan", "--model", "tiny-dense", "--gpus", "1", "--gpu", cluster, "--micro-batch", "1", "--global-batch", "4",
        "--fp8", recipe, "--db", db, "--top", "1")
    TINY = ["train", "--model", "tiny-dense", "--steps", "1", "--db", db, "--plan-id", "1"]
    if recipe == "rowwise":
        p = run(*TINY, want_rc=2)
        check(p.stderr.strip() == f"meshplan train: plan 1 of {db}: float8 recipe rowwise is not one meshplan's "
              "runtime runs (it runs tensorwise); choose one of those, or a stack that runs rowwise", repr(p.stderr))
        continue
    p = run(*TINY)
    check(", float8 tensorwise, no pipeline; predicted under stack meshplan-cpu" in p.stdout, "float8 plan: " + p.stdout)
    p = run(*TINY, "--fp8", "rowwise", want_rc=2)
    check(p.stderr.strip() == f"meshplan train: --fp8 rowwise contradicts plan 1's float8 recipe tensorwise ({db}); "
          "drop --fp8 to train the plan as stored, or drop --plan-id", repr(p.stderr))
db = os.path.join(tmp, "mtp.db")
run("plan", "--model", "tiny-dense", "--gpus", "1", "--gpu", "h100-sxm", "--micro-batch", "1", "--global-batch", "4",
    "--mtp-num-layers", "1", "--db", db, "--top", "1")
check(stored(db).get("mtp_layers") == 1, "mtp: stored " + str(stored(db)))
p = run("train", "--model", "tiny-dense", "--steps", "1", "--db", db, "--plan-id", "1", want_rc=2)
check(p.stderr.strip() == f"meshplan train: --plan-id 1 is a plan of tiny-dense with 1 multi-token-prediction "
      f"modules (run 1 of {db}), this run's has 0; give --mtp-num-layers 1, or a plan of this model", repr(p.stderr))
db = os.path.join(tmp, "capacity_tiny.db")
run("plan", "--model", "tiny-moe", "--gpus", "1", "--gpu", "h100-sxm", "--seq", "64", "--global-batch", "4",
    "--micro-batch", "1", "--moe-capacity-factor", "1.25", "--db", db, "--top", "1")
TINY_MOE = ["train", "--model", "tiny-moe", "--steps", "1", "--db", db, "--plan-id", "1"]
p = run(*TINY_MOE)
check(p.stdout.splitlines()[0].endswith(", expert capacity factor 1.25") if p.stdout else False,
      "train of a plan with a capacity factor: " + p.stdout)
p = run(*TINY_MOE, "--moe-capacity-factor", "2", want_rc=2)
check(p.stderr.strip() == f"meshplan train: --moe-capacity-factor 2 contradicts plan 1's 1.25 ({db}; 0: dropless); "
      "drop --moe-capacity-factor to train the plan as stored, or drop --plan-id", repr(p.stderr))

for f in fails:
    print("FAIL:", f)
print(f"{len(fails)} failures")
sys.exit(1 if fails else 0)
