#!/usr/bin/env python3
"""meshplan plan's rules a user acts on, through the binary: the default global batch
rule at 8, 64, 1,024 and 16,384 GPUs (planner/batch.h, figures derived by hand below),
the tie rule of the ranking, the rejection counts in text and JSON, the "no plan fits"
hint computed from the counts, and --why.

Usage: plan_rules_test.py MESHPLAN"""
import json
import sys

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]
MTOK = 1 << 20


def plan_json(*args):
    p = run("plan", "--no-db", "--json", "--top", "0", *args)
    return json.loads(p.stdout) if p.returncode == 0 else None


# ---- the default batch rule ----------------------------------------------------------
# max(by size, 1,024 tokens x GPUs) over seq 8192, each plan the nearest multiple of its dp:
#   llama3.1-8b (8.0B >= 5B: 4M) on 8 GPUs:       max(4M, 8K)   = 4M  -> 512 sequences
#   llama3.1-70b on 64 GPUs:                      max(4M, 64K)  = 4M  -> 512
#   llama3.1-70b on 1,024 GPUs:                   max(4M, 1M)   = 4M  -> 512; dp > 512 rejected
#   llama3.1-405b on 16,384 GPUs:                 max(4M, 16M)  = 16M -> 2,048 (Llama 3's 16M)
#   gpt2-124m (< 1B: 0.5M) on 8 GPUs, seq 1024:   max(0.5M, 8K) = 0.5M -> 512
cases = [
    (("--model", "llama3.1-8b", "--gpus", "8"), 512),
    (("--model", "llama3.1-70b", "--gpus", "64"), 512),
    (("--model", "llama3.1-70b", "--gpus", "1024"), 512),
    (("--model", "llama3.1-405b", "--gpus", "16384"), 2048),
    (("--model", "gpt2-124m", "--gpus", "8", "--seq", "1024"), 512),
]
for args, want in cases:
    j = plan_json(*args)
    if j is None:
        continue
    check(j.get("batch_target") == want, f"{args}: batch_target {j.get('batch_target')}, want {want}")
    check("batch_rule" in j and "tokens" in j["batch_rule"], f"{args}: no batch_rule in the JSON")
    check(len(j["plans"]) > 0, f"{args}: no plan ranked")
    for p in j["plans"]:
        m = p["mesh"]
        dp = m["dp_replicate"] * m["dp_shard"]
        gb = p["global_batch"]
        check(gb % dp == 0 and abs(gb - want) <= dp // 2 and dp <= want,
              f"{args}: plan {p['rank']} dp={dp} runs {gb} sequences, not the nearest multiple of dp to {want}")
    text = run("plan", "--no-db", *args).stdout
    check(f"global batch: {want} sequences" in text and "by the default rule" in text,
          f"{args}: the text does not state the rule's batch {want}")

# At 1,024 GPUs a mesh with dp > 512 cannot give each rank a sequence of the 512: rejected
# under the batch rule, counted, with the reason in words.
j = plan_json("--model", "llama3.1-70b", "--gpus", "1024")
if j:
    rej = {r["rule"]: r for r in j["rejected"]}
    check("batch" in rej and rej["batch"]["count"] > 0, "1024 GPUs: no batch rejections counted")
    check(sum(r["count"] for r in j["rejected"]) + j["feasible"] == j["candidates"],
          "1024 GPUs: rejected counts and feasible plans do not add up to the candidates")

# An explicit --global-batch is kept as given, and a batch no dp divides is the cause named
# (exit 1: accepted work that found nothing); dp_shard=64 with mb 1 needs a multiple of 64,
# and 64 is the hint, searched.
p = run("plan", "--no-db", "--model", "llama3.1-70b", "--gpus", "64", "--fix", "tp=1,cp=1,pp=1,dp_replicate=1",
        "--global-batch", "32", want_rc=1)
check("no plan fits: 6 of 6 candidates: the global batch does not divide over dp x micro-batch" in p.stdout,
      "the no-plan hint does not name the batch rule with its count: " + p.stdout)
check("the smallest change: --global-batch 64" in p.stdout, "the batch hint: " + p.stdout)

# ---- the tie rule --------------------------------------------------------------------
# Each ranked plan's time per sequence is within 1 % of the fastest plan ranked at or
# after it, and inside such a window a plan with cp, float8 or more mesh dims never comes
# before a simpler one (mp_candidate_simplicity's first keys).
j = plan_json("--model", "llama3.1-8b", "--gpus", "8", "--fp8", "auto")
if j:
    plans = j["plans"]
    cost = [p["step_time_s"] / p["global_batch"] for p in plans]
    tol = j["tie_tolerance"]
    check(tol == 0.01, f"tie tolerance {tol}, want 0.01")
    for r in range(len(plans)):
        check(cost[r] <= min(cost[r:]) * (1 + tol) * (1 + 1e-12), f"rank {r + 1} is outside 1 % of a later plan")

    def key(p):
        m = p["mesh"]
        dims = sum(1 for k in ("pp", "dp_replicate", "dp_shard", "cp", "tp", "ep") if m[k] > 1)
        return (m["cp"] > 1, p["fp8"], dims)
    for r in range(len(plans)):
        for q in range(r + 1, len(plans)):
            # q was in r's window (within 1 % of the fastest unranked at r) yet simpler
            if cost[q] <= min(cost[r:]) * (1 + tol) and key(plans[q]) < key(plans[r]):
                fails.append(f"rank {q + 1} {key(plans[q])} is simpler than rank {r + 1} {key(plans[r])} "
                             "within the tolerance but ranked after it")
                break
    check(any(p["fp8"] for p in plans), "--fp8 auto on an H100 searched no float8 plan")
j = plan_json("--model", "llama3.1-8b", "--gpus", "8")
if j:
    check(not any(p["fp8"] for p in j["plans"]), "float8 plans ranked without --fp8")
    check(all("runs" in p for p in j["plans"]), "a plan without the runs field")
    check(j.get("stack"), "no stack in the JSON")

# ---- the rejection summary in text ---------------------------------------------------
p = run("plan", "--no-db", "--model", "llama3.1-70b", "--gpus", "64")
tail = p.stdout.split("rejected by rule:")[-1]
check("simulated peak memory over capacity (memory)" in tail or "half the micro-batch" in tail,
      "the text's last lines do not count rejections in words")
check("runs" in p.stdout.splitlines()[3], "the table has no runs column")

# ---- --why -----------------------------------------------------------------------------
p = run("plan", "--no-db", "--model", "llama3.1-70b", "--gpus", "64", "--why", "dp_shard=64,tp=1,ac=none")
check("why dp_shard=64,tp=1,ac=none" in p.stdout, "--why printed no header")
check("YES  simulated peak memory over capacity" in p.stdout or "YES  half the micro-batch" in p.stdout
      or "YES  full AC is already" in p.stdout or "YES  fp32 parameters" in p.stdout,
      "--why does not say which memory rule rejected 70B unsharded activations on 64 GPUs: " + p.stdout[-800:])
p = run("plan", "--no-db", "--model", "llama3.1-8b", "--gpus", "8", "--why", "dp_shard=8,ac=none,mb=1,reshard=1")
check("rank: 1 of" in p.stdout or "rank: " in p.stdout, "--why of a ranked plan gives no rank")
check("prediction: step" in p.stdout, "--why of a simulated plan gives no prediction")
p = run("plan", "--no-db", "--why", "tp=3", want_rc=2)
check("no candidate of this search matches" in p.stderr, "--why of an impossible mesh: " + p.stderr)

if fails:
    print("\n".join("FAIL: " + f for f in fails))
    sys.exit(1)
print("plan rules: all checks passed")
