#!/usr/bin/env python3
"""The routed experts' cost from the command line against hand-derived figures: explain's
"routed experts" section (the rows an expert computes, padded to the stack's grouped-GEMM
tile, and the efficiency those GEMMs reach), the slowest EP rank's rows under --moe-imbalance
and --moe-capacity-factor in explain, simulate, plan and validate's moe_imbalance and
moe_capacity_factor columns, and the one-line refusals of nonsense (exit 2).

Usage: explain_moe_test.py MESHPLAN"""
import json
import os
import sys
import tempfile

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]
QWEN = ("--model", "qwen3-30b-a3b", "--gpus", "8", "--stack", "torchtitan-compile")


def moe(*args):
    p = run("explain", *QWEN, *args, "--json")
    return json.loads(p.stdout).get("routed_experts", {}) if p.returncode == 0 else {}


# Qwen3-30B-A3B (128 experts, top-8, d_ff_expert 768, d_model 2048) without EP at seq 512: a rank
# routes 512 x 8 / 128 = 32 rows to each of its 128 experts; torchtitan's torch._grouped_mm tile
# is 64 rows (data/stacks/torchtitan-compile.json), so 64 are computed. The gate GEMM's bytes,
# 128 x ((32 x 2048 + 2048 x 768) x 2 + 32 x 768 x 2) = 425,721,856, take 149.50 us at the H100
# SXM's 3350 GB/s x the stack's hbm_eff 0.85, longer than its padded FLOPs at any efficiency the
# stack reaches (2 x 64 x 768 x 2048 x 128 = 2.58e10 at <= 0.5 x 989.4e12: >= 52 us), so the
# useful FLOPs 2 x 32 x 768 x 2048 x 128 = 12,884,901,888 reach 12.885e9 x 3350e9 x 0.85 /
# (989.4e12 x 425,721,856) = 8.71 % of the bf16 peak. All 4096 rows as one dense GEMM read the
# weight once and run compute-bound, far above.
f = moe("--mesh", "dp_shard=8", "--seq", "512")
check(f.get("experts_local") == 128 and f.get("rows_per_expert") == 32 and f.get("rows_computed") == 64,
      "qwen ep=1 seq 512: 128 experts of 32 rows, 64 computed: %s" % f)
want = 12884901888 * 3350e9 * 0.85 / (989.4e12 * 425721856)
check(abs(f.get("grouped_gemm_eff", 0) - want) < 1e-4 * want,
      "qwen ep=1 seq 512: grouped GEMM efficiency %s, want %.5f" % (f.get("grouped_gemm_eff"), want))
check(f.get("dense_gemm_eff", 0) > 4 * want, "qwen ep=1 seq 512: a dense GEMM of the same FLOPs should run "
      "over 4x as efficiently: %s" % f)
check("balanced routing; dropless" in f.get("note", ""), "qwen: the default routing's words: %s" % f.get("note"))

# ep 8 at seq 4096: 4096 x 8 x 8 / 128 = 2048 rows an expert, 16 experts a rank. An imbalance of
# 1.5 gives the slowest rank 3072; a capacity of 1.25 keeps at most ceil(256 x 1.25) = 320 of a
# rank's rows an expert, 8 x 320 = 2560 (load 1.25), the same when padded whatever the imbalance.
EP8 = ("--mesh", "dp_shard=8,ep=8", "--seq", "4096")
f = moe(*EP8)
check(f.get("experts_local") == 16 and f.get("rows_per_expert") == 2048 and f.get("load") == 1,
      "qwen ep=8: 16 experts of 2048 rows: %s" % f)
f = moe(*EP8, "--moe-imbalance", "1.5")
check(f.get("rows_per_expert") == 3072 and f.get("load") == 1.5, "qwen ep=8 imbalance 1.5: 3072 rows: %s" % f)
check("imbalance 1.5: the slowest EP rank gets 1.5 x the mean rows" in f.get("note", ""),
      "qwen ep=8 imbalance 1.5: the note says so: %s" % f.get("note"))
f = moe(*EP8, "--moe-imbalance", "1.5", "--moe-capacity-factor", "1.25")
check(f.get("rows_per_expert") == 2560 and f.get("load") == 1.25 and "with the excess dropped" in f.get("note", ""),
      "qwen ep=8 imbalance 1.5, capacity 1.25: 2560 rows, dropped: %s" % f)
f = moe(*EP8, "--moe-capacity-factor", "1.25", "--moe-pad-expert-input-to-capacity")
check(f.get("rows_per_expert") == 2560 and "padded to capacity" in f.get("note", ""),
      "qwen ep=8 capacity 1.25 padded: 2560 rows: %s" % f)

# simulate: the slowest rank's longer experts and all-to-alls lengthen the step; the capacity
# bounds them back


def tps(*args):
    p = run("simulate", *QWEN, *EP8, "--ac", "full", "--global-batch", "8", "--micro-batch", "1", "--json", *args)
    return json.loads(p.stdout)["tokens_per_s_per_gpu"] if p.returncode == 0 else 0.0


base, skewed, capped = tps(), tps("--moe-imbalance", "1.5"), tps("--moe-imbalance", "1.5", "--moe-capacity-factor", "1.25")
check(0 < skewed < capped < base, "simulate: balanced %g > capped %g > imbalance 1.5 %g tokens/s" % (base, capped, skewed))

# nonsense, refused in one line with exit 2
for args, words in ((("--moe-imbalance", "0.5"), "--moe-imbalance '0.5': expected a number in [1,"),
                    (("--moe-capacity-factor", "0"), "--moe-capacity-factor '0': expected a number in (0,"),
                    (("--moe-capacity-factor", "-1"), "--moe-capacity-factor '-1'"),
                    (("--moe-pad-expert-input-to-capacity",), "give --moe-capacity-factor C too"),
                    (("--moe-imbalance", "9"), "MoE imbalance 9 exceeds 8")):
    for cmd in ("simulate", "explain"):
        p = run(cmd, *QWEN, *EP8, *args, want_rc=2)
        check(words in p.stderr and p.stderr.count("\n") == 1, "%s %s: %r" % (cmd, " ".join(args), p.stderr))
p = run("simulate", "--model", "llama3.1-8b", "--gpus", "8", "--stack", "torchtitan-compile", "--moe-imbalance", "1.5",
        want_rc=2)
check("has no routed experts" in p.stderr, "simulate: an imbalance on a dense model: %r" % p.stderr)
p = run("plan", "--model", "llama3.1-8b", "--gpus", "8", "--no-db", "--moe-capacity-factor", "1", want_rc=2)
check("has none: drop them" in p.stderr, "plan: a capacity on a dense model: %r" % p.stderr)
p = run("plan", "--model", "qwen3-30b-a3b", "--gpus", "8", "--seq", "4096", "--stack", "torchtitan-compile", "--no-db",
        "--top", "1", "--moe-imbalance", "1.5", "--json")
check(p.returncode == 0, "plan --moe-imbalance 1.5 runs")

# validate's columns: the same row balanced and at imbalance 1.5 (a lower prediction); an
# imbalance below 1 refused naming the column
HDR = ("case,source,model,gpus,gpu,gpus_per_node,inter_node_gbps_per_gpu,dp_replicate,dp_shard,tp,pp,pp_schedule,"
       "pp_virtual,cp,ep,seq,local_batch,micro_batch,global_batch,ac,fp8,sp,stack,metric,value,notes,moe_imbalance,"
       "moe_capacity_factor\n")
ROW = "%s,test,qwen3-30b-a3b,8,h100-sxm,8,400,1,8,1,1,,,1,8,4096,1,1,8,full,0,0,torchtitan-compile,tokens_per_s_per_gpu,1000,x,%s,%s\n"
with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "rows.csv")
    with open(path, "w") as fh:
        fh.write(HDR + ROW % ("even", "", "") + ROW % ("skew", "1.5", "") + ROW % ("cap", "1.5", "1.25"))
    p = run("validate", path, "--json")
    rows = {r["case"]: r["predicted"] for r in json.loads(p.stdout)["rows"]} if p.returncode == 0 else {}
    check(rows and rows["skew"] < rows["cap"] < rows["even"], "validate: moe_imbalance and moe_capacity_factor "
          "columns: %s" % rows)
    check(rows and abs(rows["skew"] - skewed) < 1e-6 * skewed, "validate's imbalance 1.5 row = simulate's: %s vs %g"
          % (rows, skewed))
    with open(path, "w") as fh:
        fh.write(HDR + ROW % ("low", "0.5", ""))
    p = run("validate", path, "--json", want_rc=2)
    check("column 'moe_imbalance' = '0.5': expected at least 1" in p.stderr, "validate: imbalance 0.5: %r" % p.stderr)

for f in fails:
    print("FAIL:", f)
print(f"explain_moe_test: {len(fails)} failures")
sys.exit(1 if fails else 0)
