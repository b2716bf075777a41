#!/usr/bin/env python3
"""Megatron-Core's TP comm overlap (--tp-comm-overlap) off through the binary, one layout
(Llama 3.1 8B on 8 H100s, TP 2 with SP, DP 4, seq 4096, MBS 1, GBS 32, megatron-core):
- simulate --no-async-tp predicts what validate predicts for the row with async_tp 0, and
  simulate's default (the stack runs the overlap) what it predicts with async_tp 1 or empty;
- explain --no-async-tp drops the overlap from the TP pass, and plan --no-async-tp prices its
  plans without it, on the cluster given and on each size of a sweep;
- the Megatron-LM arguments simulate --emit megatron writes carry --tp-comm-overlap only with
  the overlap on, and --from reads each file back to its own prediction: a file without the
  flag (Megatron-LM's default: --tp-comm-overlap is store_true in
  megatron/training/arguments.py, core_v0.14.0) is read as --no-async-tp, not refused;
- the flag on a stack that cannot run it (megatron-lm) is still refused, and so are
  --async-tp and --no-async-tp together, one line with exit 2 on each command;
- torchtitan's enable_async_tensor_parallel = false reads back as the plan without AsyncTP.

Usage: tp_overlap_cli_test.py MESHPLAN"""
import json
import os
import sys
import tempfile

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]
tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))

HDR = ("case,source,model,gpus,gpu,gpus_per_node,inter_node_gbps_per_gpu,dp_replicate,dp_shard,tp,pp,"
       "pp_schedule,pp_virtual,cp,ep,seq,local_batch,micro_batch,global_batch,ac,fp8,sp,async_tp,stack,metric,"
       "value,notes")
# local batch 32 / dp 4 = 8 sequences, 8 micro-batches of 1
ROW = "{0},test,llama3.1-8b,8,h100-sxm,8,400,4,1,2,1,,,1,1,4096,8,1,32,none,0,1,{1},megatron-core," \
      "tokens_per_s_per_gpu,1000,test"
SIM = ["--model", "llama3.1-8b", "--gpus", "8", "--gpu", "h100-sxm", "--mesh", "dp_replicate=4,tp=2",
       "--stack", "megatron-core", "--seq", "4096", "--micro-batch", "1", "--global-batch", "32"]
CLUSTER = ["--gpus", "8", "--gpu", "h100-sxm"]


def simulate(*args):
    p = run("simulate", *args, "--json")
    return json.loads(p.stdout) if p.returncode == 0 else {}


def same(a, b):
    return a is not None and b is not None and abs(a / b - 1) < 1e-12


def emit(name, *extra):
    """simulate SIM EXTRA --emit megatron: (the --json prediction, the arguments file's path)."""
    out = os.path.join(tmp, name)
    os.makedirs(out, exist_ok=True)
    p = run("simulate", *SIM, *extra, "--emit", "megatron", "--out", out, "--json")
    return (json.loads(p.stdout) if p.returncode == 0 else {}), os.path.join(out, "plan.args")


def one_line_usage(cmd, *args, want):
    p = run(cmd, *args, want_rc=2)
    err = p.stderr.strip()
    check(err.count("\n") == 0 and want in err, f"{cmd} {' '.join(args)}: stderr {err!r}, want one line with {want!r}")


# ---- validate's async_tp column and simulate's flags: the same prediction ----
path = os.path.join(tmp, "rows.csv")
with open(path, "w") as fh:
    fh.write(HDR + "\n" + "\n".join(ROW.format(c, v) for c, v in (("off", "0"), ("on", "1"), ("dflt", ""))) + "\n")
p = run("validate", path, "--json")
rows = {r["case"]: r.get("predicted") for r in json.loads(p.stdout)["rows"]} if p.returncode == 0 else {}
off, on = simulate(*SIM, "--no-async-tp"), simulate(*SIM)
check(off.get("async_tp") is False and on.get("async_tp") is True, f"simulate's async_tp: off {off}, on {on}")
check(same(rows.get("off"), off.get("tokens_per_s_per_gpu")), f"async_tp 0: validate {rows}, simulate {off}")
check(same(rows.get("on"), on.get("tokens_per_s_per_gpu")), f"async_tp 1: validate {rows}, simulate {on}")
check(same(rows.get("dflt"), on.get("tokens_per_s_per_gpu")), f"async_tp empty: validate {rows}, simulate {on}")
# With the overlap each SP all-gather and reduce-scatter ([4096 / 2, 4096] bf16 halves, 16 MiB
# each, four a layer each way) runs in 2 chunks beside its GEMM and shows only where it exceeds
# it; without it they run on NCCL apart, so the step is strictly longer.
if off and on:
    check(off["step_time_s"] > on["step_time_s"], f"--no-async-tp step {off['step_time_s']} not above {on['step_time_s']}")

# ---- explain: the TP pass names the overlap only when it runs ----
e_on, e_off = run("explain", *SIM), run("explain", *SIM, "--no-async-tp")
check("tp comm overlap" in e_on.stdout, "explain: the TP pass lacks the overlap by default")
check("tp comm overlap" not in e_off.stdout, "explain --no-async-tp: the TP pass still names the overlap")

# ---- plan: every plan priced without it (the layout fixed: one plan, simulate's figure) ----
FIX = ["--model", "llama3.1-8b", "--gpu", "h100-sxm", "--stack", "megatron-core", "--seq", "4096",
       "--global-batch", "32", "--fix", "tp=2,dp_replicate=4,pp=1,ac=none,micro_batch=1", "--no-db", "--json"]
for gpus in ("8", "8..16"):
    for extra, want in (((), on), (("--no-async-tp",), off)):
        p = run("plan", "--gpus", gpus, *FIX, *extra)
        text = p.stdout if p.returncode == 0 else ""
        # the step time as simulate --json writes it, in the plan's JSON (one plan or the sweep's row at 8)
        check(want and json.dumps(want.get("step_time_s")) in text,
              f"plan --gpus {gpus} {' '.join(extra)}: no plan at simulate's step {want.get('step_time_s')}")

# ---- --emit megatron and --from: the flag only with the overlap, each file its own prediction ----
for name, extra, pred in (("on", (), on), ("off", ("--no-async-tp",), off)):
    got, args_path = emit(name, *extra)
    text = open(args_path).read() if got else ""
    check(("--tp-comm-overlap" in text) == (name == "on"), f"emit {name}: --tp-comm-overlap in the file: {text!r}")
    check(same(got.get("tokens_per_s_per_gpu"), pred.get("tokens_per_s_per_gpu")), f"emit {name}: {got}")
    back = run("simulate", *CLUSTER, "--from", args_path, "--json")
    tok = json.loads(back.stdout)["tokens_per_s_per_gpu"] if back.returncode == 0 else None
    check(same(tok, pred.get("tokens_per_s_per_gpu")), f"--from the {name} file: {tok}, want {pred}")
    check(("--no-async-tp" in back.stderr) == (name == "off"), f"--from the {name} file's note: {back.stderr!r}")
    if name == "off":
        one_line_usage("simulate", *CLUSTER, "--from", args_path, "--async-tp",
                       want="--async-tp and --no-async-tp contradict each other")
        p = run("plan", *CLUSTER, "--from", args_path, "--no-db", "--json")
        check(p.returncode == 0 and json.dumps(off.get("step_time_s")) in p.stdout, "plan --from the off file")

# ---- the flag where the stack cannot run it: refused ----
LM = ["--num-layers 32", "--hidden-size 4096", "--ffn-hidden-size 14336", "--num-attention-heads 32",
      "--group-query-attention", "--num-query-groups 8", "--max-position-embeddings 131072",
      "--vocab-size 128256", "--position-embedding-type rope", "--rotary-base 500000", "--swiglu",
      "--normalization RMSNorm", "--disable-bias-linear", "--norm-epsilon 1e-05",
      "--untie-embeddings-and-output-weights", "--tensor-model-parallel-size 2", "--sequence-parallel",
      "--seq-length 4096", "--micro-batch-size 1", "--global-batch-size 32", "--attention-backend unfused"]
one_line_usage("simulate", *CLUSTER, "--from-args", " ".join(LM + ["--tp-comm-overlap"]),
               want="--tp-comm-overlap is given, but meshplan's megatron-lm stack")
lm = run("simulate", *CLUSTER, "--from-args", " ".join(LM), "--json")
check(lm.returncode == 0 and "--no-async-tp" not in lm.stderr, f"megatron-lm without the flag: {lm.stderr!r}")

# ---- both flags: one line, exit 2, on each command ----
for cmd in ("simulate", "explain"):
    one_line_usage(cmd, *SIM, "--async-tp", "--no-async-tp", want="--async-tp and --no-async-tp contradict each other")
one_line_usage("plan", *FIX, "--gpus", "8", "--async-tp", "--no-async-tp",
               want="--async-tp and --no-async-tp contradict each other")

# ---- torchtitan: enable_async_tensor_parallel = false reads back without AsyncTP ----
TT = ["--model", "llama3.1-8b", "--gpus", "8", "--gpu", "h100-sxm", "--mesh", "dp_shard=4,tp=2",
      "--stack", "torchtitan-compile", "--seq", "4096", "--global-batch", "32", "--ac", "selective-op"]
out = os.path.join(tmp, "tt")
os.makedirs(out, exist_ok=True)
tt = run("simulate", *TT, "--emit", "torchtitan", "--out", out, "--json")
toml = open(os.path.join(out, "plan.toml")).read() if tt.returncode == 0 else ""
check("enable_async_tensor_parallel = false" in toml, "torchtitan: the TOML lacks AsyncTP off")
tt_async = simulate(*TT, "--async-tp").get("tokens_per_s_per_gpu")
tt_back = simulate(*CLUSTER, "--from", os.path.join(out, "plan.toml"))
if tt.returncode == 0:
    want = json.loads(tt.stdout)["tokens_per_s_per_gpu"]
    check(tt_back.get("async_tp") is False and same(tt_back.get("tokens_per_s_per_gpu"), want),
          f"torchtitan --from: {tt_back}, want {want} without AsyncTP")
    check(not same(want, tt_async), "torchtitan: AsyncTP changes nothing on this layout")

for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
