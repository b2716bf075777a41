#!/usr/bin/env python3
"""train --db PATH --plan-id ID through the binary: the stored plan is what trains.

One rank (no mpirun): `plan --gpus 1 --gpu cpu` on tiny-dense (max_seq 64, train's default
micro-batch 4) at seq 16 and global batch 4 stores plans with micro-batches 4, 2 and 1; train
--plan-id of the micro-batch-2 plan, with no --seq, --micro-batch or --global-batch given,
runs seq 16 and 4 / (2 x dp 1) = 2 micro-batches, and records its 2 steps under that plan
(and no run of its own). train --auto --db records its pick, and --plan-id of that pick
trains the same settings. Each refusal is one line, exit 2: a missing ID, a missing database
(not created), a foreign SQLite file and a corrupt one (both left as they were), a plan of
another model, of another world size, a --mesh and a --micro-batch that contradict the plan;
a --mesh equal to the plan's is accepted.

With `mpi` (2 ranks under mpirun): `plan --gpus 2 --gpu cpu` stores pp=2 and tp=2 plans, a
tiny-moe dp_shard=2 x ep=2 plan and a tiny-moe-pp pp=2 x 2 chunks (interleaved) plan; each
trains on its own mesh (the run's printed mesh) with its micro-batch and schedule; a --mesh
equal to the plan's is accepted and another (and a --pp-virtual) refused naming both; a
Megatron-Core plan with dopt=2 and an H100 plan with float8 on pp=2 (which
`plan --fp8 on --fix pp=2` ranks) are refused by what the runtime builds and checks (exec/plan.c:
distributed-optimizer instances need Megatron-LM's DDP; exec/runtime/check.c: float8 with pipeline parallelism is not
executed), named as the plan's.

Usage: train_plan_id_test.py MESHPLAN [mpi]"""
import os
import re
import sqlite3
import subprocess
import sys
import tempfile

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]
MPI = len(sys.argv) > 2 and sys.argv[2] == "mpi"
tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
os.environ["OMP_NUM_THREADS"] = "1"
TRAIN = ["train", "--model", "tiny-dense", "--steps", "2"]


def q(db, sql, *args):
    with sqlite3.connect(db) as c:
        return c.execute(sql, args).fetchall()


def plan_id(db, **where):
    """The id of the plan whose columns equal where (exactly one such plan)."""
    cond = " AND ".join(f"{k}=?" for k in where)
    rows = q(db, f"SELECT id FROM plans WHERE {cond}", *where.values())
    check(len(rows) == 1, f"{db}: one plan with {where}, got {rows}")
    return rows[0][0] if rows else 0


def refused(args, want, mpirun=None):
    """args exits 2 with one line holding want."""
    p = mpirun(args) if mpirun else run(*args, want_rc=2)
    err = p.stderr.strip()
    if mpirun:
        check(p.returncode != 0, f"{args}: exit {p.returncode}, want a refusal")
        err = p.stdout + p.stderr
        check(want in err, f"{args}: want '{want}' in: {err[:400]}")
        return
    check(len(err.splitlines()) == 1 and want in err, f"{args}: want one line with '{want}', got: {err}")


def one_rank():
    db = os.path.join(tmp, "one.db")
    run("plan", "--model", "tiny-dense", "--gpus", "1", "--gpu", "cpu", "--seq", "16", "--global-batch", "4",
        "--executable-only", "--top", "0", "--db", db)
    pid = plan_id(db, micro_batch=2)
    out = run(*TRAIN, "--db", db, "--plan-id", str(pid)).stdout
    check(re.search(r"on mesh single \(1 rank\), ac none, seq 16, micro-batch 2, global batch 4 \(2 micro-batches\)",
                    out), f"plan {pid}: the plan's seq and micro-batch: {out}")
    check(f"plan {pid} of {db} (run 1: tiny-dense on 1xcpu, cpu profile): mesh single, micro-batch 2" in out,
          f"plan {pid}'s line: {out}")
    check(q(db, "SELECT count(*) FROM measurements WHERE plan_id=?", pid) == [(2,)], "2 steps under the plan")
    check(q(db, "SELECT count(*) FROM runs") == [(1,)], "no run of train's own")
    run(*TRAIN, "--db", db, "--plan-id", str(pid), "--mesh", "dp_shard=1")  # the same mesh: accepted
    # --auto picks and records a plan; --plan-id of it trains the same settings
    auto = run(*TRAIN, "--auto", "--seq", "16", "--global-batch", "4", "--db", db).stdout
    m = re.search(r"\(plan id (\d+)\)", auto)
    check(m is not None, f"--auto records its plan: {auto}")
    if m:
        mb = re.search(r"micro-batch (\d+)", auto).group(1)
        again = run(*TRAIN, "--db", db, "--plan-id", m.group(1)).stdout
        check(f"seq 16, micro-batch {mb}, global batch 4" in again, f"--auto's plan {m.group(1)} again: {again}")
    return db, pid


def refusals(db, pid):
    refused([*TRAIN, "--db", db, "--plan-id", "999"], f"{db} has no plan 999")
    missing = os.path.join(tmp, "missing.db")
    refused([*TRAIN, "--db", missing, "--plan-id", "1"], f"{missing} does not exist")
    check(not os.path.exists(missing), "a missing database is not created")
    foreign = os.path.join(tmp, "foreign.db")
    with sqlite3.connect(foreign) as c:
        c.execute("CREATE TABLE songs (title TEXT)")
    before = open(foreign, "rb").read()
    refused([*TRAIN, "--db", foreign, "--plan-id", "1"], "is not a meshplan database or is corrupt")
    check(open(foreign, "rb").read() == before, "a foreign database is left as it was")
    corrupt = os.path.join(tmp, "corrupt.db")
    with open(corrupt, "wb") as fh:
        fh.write(b"SQLite format 3\0" + b"\xff" * 200)
    refused([*TRAIN, "--db", corrupt, "--plan-id", "1"], "is not a meshplan database or is corrupt")
    refused(["train", "--model", "tiny-moe", "--steps", "1", "--db", db, "--plan-id", str(pid)],
            f"--plan-id {pid} is a plan for model tiny-dense (run 1 of {db}), not tiny-moe")
    two = os.path.join(tmp, "two.db")
    run("plan", "--model", "tiny-dense", "--gpus", "2", "--gpu", "cpu", "--seq", "16", "--global-batch", "4",
        "--executable-only", "--db", two)
    refused([*TRAIN, "--db", two, "--plan-id", "1"], "is a plan for 2 ranks (run 1 of")
    refused([*TRAIN, "--db", db, "--plan-id", str(pid), "--mesh", "tp=2"],
            f"--mesh tp=2 contradicts plan {pid}'s mesh single")
    refused([*TRAIN, "--db", db, "--plan-id", str(pid), "--micro-batch", "4"],
            f"--micro-batch 4 contradicts plan {pid}'s 2")
    refused([*TRAIN, "--db", db, "--plan-id", str(pid), "--seq", "32"], f"--seq 32 contradicts plan {pid}'s 16")
    refused([*TRAIN, "--db", db, "--plan-id", str(pid), "--auto"], "--auto chooses the mesh itself")


def mpirun(args):
    root = ["--allow-run-as-root"] if os.getuid() == 0 else []
    env = dict(os.environ, OMPI_MCA_btl="self,vader", TMPDIR=tmp)
    for k in ("TEST_PREMATURE_EXIT_FILE", "XML_OUTPUT_FILE", "GTEST_OUTPUT"):
        env.pop(k, None)
    # OpenMPI leaks at finalize inside modules it has already unloaded (no suppression can
    # name them), as tests/runtime/parity.sh says; leak checking stays on for one rank
    if env.get("ASAN_OPTIONS"):
        env["ASAN_OPTIONS"] += ":detect_leaks=0"
    cmd = ["mpirun", *root, "-np", "2", "--oversubscribe", "--bind-to", "none", "--mca", "btl", "self,vader",
           "--mca", "btl_vader_backing_directory", tmp, cli_check.BIN, *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120, env=env)


def two_ranks():
    db = os.path.join(tmp, "mpi.db")
    run("plan", "--model", "tiny-dense", "--gpus", "2", "--gpu", "cpu", "--seq", "16", "--global-batch", "4",
        "--executable-only", "--top", "0", "--db", db)
    # the pp=2 plan with micro-batch 2: 4 / (2 x dp 1) = 2 micro-batches; the tp=2 one with 4: 1
    for mesh, where, mb, n_micro in (("pp=2", {"pp": 2}, 2, "2 micro-batches"), ("tp=2", {"tp": 2}, 4, "1 micro-batch")):
        pid = plan_id(db, micro_batch=mb, **where)
        p = mpirun([*TRAIN, "--db", db, "--plan-id", str(pid)])
        check(p.returncode == 0, f"plan {pid} on 2 ranks: exit {p.returncode}: {p.stdout}{p.stderr}")
        check(f"on mesh {mesh} (2 ranks), ac none, seq 16, micro-batch {mb}, global batch 4 ({n_micro})" in p.stdout,
              f"plan {pid} trains on {mesh}: {p.stdout}")
        check(q(db, "SELECT count(*) FROM measurements WHERE plan_id=?", pid) == [(2,)], f"plan {pid}'s 2 steps")
        p = mpirun([*TRAIN, "--db", db, "--plan-id", str(pid), "--mesh", mesh])
        check(p.returncode == 0, f"--mesh {mesh} equal to plan {pid}'s accepted: {p.stderr}")
    pid = plan_id(db, micro_batch=2, pp=2)
    refused([*TRAIN, "--db", db, "--plan-id", str(pid), "--mesh", "dp_shard=2"],
            f"--mesh dp_shard=2 contradicts plan {pid}'s mesh pp=2", mpirun)
    # tiny-moe's dp_shard=2 x ep=2 plan with micro-batch 2: 4 / (2 x dp 2) = 1 micro-batch
    moe = os.path.join(tmp, "moe.db")
    run("plan", "--model", "tiny-moe", "--gpus", "2", "--gpu", "cpu", "--seq", "16", "--global-batch", "4",
        "--executable-only", "--top", "0", "--db", moe)
    pid = plan_id(moe, dp_shard=2, ep=2, micro_batch=2, reshard=0)
    p = mpirun(["train", "--model", "tiny-moe", "--steps", "2", "--db", moe, "--plan-id", str(pid)])
    check("on mesh dp_shard=2,ep=2 (2 ranks), ac none, seq 16, micro-batch 2, global batch 4 (1 micro-batch)"
          in p.stdout, f"tiny-moe plan {pid} on its expert mesh: {p.stdout}{p.stderr}")
    p = mpirun(["train", "--model", "tiny-moe", "--steps", "1", "--db", moe, "--plan-id", str(pid), "--ep", "2"])
    check(p.returncode == 0, f"--ep 2, plan {pid}'s ep, accepted: {p.stdout}{p.stderr}")
    refused(["train", "--model", "tiny-moe", "--steps", "1", "--db", moe, "--plan-id", str(pid), "--ep", "1"],
            f"--ep 1 contradicts plan {pid}'s 2", mpirun)
    # tiny-moe-pp (4 layers) interleaved on pp=2 x 2 chunks: the plan's chunks reach the run
    iv = os.path.join(tmp, "iv.db")
    run("plan", "--model", "tiny-moe-pp", "--gpus", "2", "--gpu", "cpu", "--seq", "16", "--global-batch", "4",
        "--executable-only", "--fix", "pp=2,pp_virtual=2", "--top", "0", "--db", iv)
    pid = plan_id(iv, micro_batch=2)
    p = mpirun(["train", "--model", "tiny-moe-pp", "--steps", "2", "--db", iv, "--plan-id", str(pid)])
    check(p.returncode == 0 and "on mesh pp=2 (2 ranks)" in p.stdout and
          "mesh pp=2, micro-batch 2, ac none, float8 off, interleaved schedule, 2 chunks a stage" in p.stdout,
          f"tiny-moe-pp's interleaved plan {pid}: {p.stdout}{p.stderr}")
    refused(["train", "--model", "tiny-moe-pp", "--steps", "1", "--db", iv, "--plan-id", str(pid), "--pp-virtual",
             "4", "--pp-schedule", "interleaved"], f"--pp-virtual 4 contradicts plan {pid}'s 2", mpirun)
    # a Megatron-Core plan with 2 distributed-optimizer instances: the runtime runs FSDP
    dopt = os.path.join(tmp, "dopt.db")
    run("plan", "--model", "tiny-dense", "--gpus", "2", "--gpu", "h100-sxm", "--stack", "megatron-core", "--seq", "16",
        "--global-batch", "4", "--mesh", "dp_replicate=2,dopt=2", "--top", "1", "--db", dopt)
    refused([*TRAIN, "--db", dopt, "--plan-id", "1"], f"plan 1 of {dopt}: dopt=2: distributed-optimizer instances", mpirun)
    h100 = os.path.join(tmp, "h100.db")
    run("plan", "--model", "tiny-dense", "--gpus", "2", "--gpu", "h100-sxm", "--seq", "16", "--global-batch", "4",
        "--fp8", "on", "--fix", "pp=2", "--top", "1", "--db", h100)
    refused([*TRAIN, "--db", h100, "--plan-id", "1"],
            f"plan 1 of {h100}: mesh pp=2: float8 with pipeline parallelism is not executed", mpirun)


if MPI:
    two_ranks()
else:
    refusals(*one_rank())
for f in fails:
    print("FAIL:", f)
print(f"{len(fails)} failures")
sys.exit(1 if fails else 0)
