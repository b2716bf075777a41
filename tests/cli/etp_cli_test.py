#!/usr/bin/env python3
"""Expert tensor parallelism (etp in --mesh, validate's etp column) through the binary:
- NeMo's recommended H100 layouts for Llama 4 (scripts/performance/recommended_model_configs/
  model_configs_h100.csv, settings only: Scout on 256 H100 TP 4 EP 16 ETP 4, Maverick on 512
  TP 4 EP 128 ETP 4, seq 8192, MBS 1, GBS 1024, no FSDP) are accepted by validate under
  megatron-core, each row's prediction simulate's with the same mesh;
- torchtitan's Llama 4 configs (torchtitan/models/llama4/train_configs/llama4_17bx16e.toml and
  llama4_17bx128e.toml at v0.2.0: tensor_parallel_degree 8, expert_tensor_parallel_degree 8,
  expert_parallel_degree 1, AC full) are accepted under torchtitan-eager;
- a refused row says why (torchtitan's etp other than 1 or tp);
- the Megatron-LM arguments simulate --emit writes carry --expert-tensor-parallel-size, and
  --from-args reads it back to the same prediction; without the flag Megatron-LM's default
  (the tp size) is read; the torchtitan TOML carries expert_tensor_parallel_degree likewise;
- explain shows each expert weight's etp split and the rank's expert-TP index;
- plan --fix etp=2 ranks expert-grid plans written "4g2";
- the flex dispatcher (DeepEP, HybridEP) under etp: explain's dispatch rows against the
  all-to-all's, Megatron-LM arguments round-tripped, plan --moe-dispatcher deepep's search.

Usage: etp_cli_test.py MESHPLAN"""
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
       "value,notes,etp")
# case, model, gpus, dp_replicate, dp_shard, tp, pp, ep, local_batch, micro_batch, global_batch, ac, stack, etp
ROW = "{0},test,{1},{2},h100-sxm,8,400,{3},{4},{5},{6},,,1,{7},8192,{8},{9},{10},{11},0,1,,{12}," \
      "tokens_per_s_per_gpu,1000,test,{13}"
NEMO = [("scout", "llama4-scout-17b-16e", 256, 64, 1, 4, 1, 16, 16, 1, 1024, "none", "megatron-core", 4),
        ("maverick", "llama4-maverick-17b-128e", 512, 128, 1, 4, 1, 128, 8, 1, 1024, "none", "megatron-core", 4)]
TITAN = [("tt_scout", "llama4-scout-17b-16e", 64, 1, 8, 8, 1, 1, 8, 8, 64, "full", "torchtitan-eager", 8),
         ("tt_maverick", "llama4-maverick-17b-128e", 128, 1, 4, 8, 4, 1, 1, 1, 4, "full", "torchtitan-eager", 8)]


def validate(rows):
    path = os.path.join(tmp, "rows.csv")
    with open(path, "w") as f:
        f.write(HDR + "\n" + "\n".join(ROW.format(*r) for r in rows) + "\n")
    p = run("validate", path, "--json")
    return {r["case"]: r for r in json.loads(p.stdout)["rows"]} if p.returncode == 0 else {}


def sim_args(r):
    _, model, gpus, dpr, dps, tp, pp, ep, _, mb, gb, ac, stack, etp = r
    return ["--model", model, "--gpus", str(gpus), "--gpu", "h100-sxm",
            "--mesh", f"pp={pp},dp_replicate={dpr},dp_shard={dps},tp={tp},ep={ep},etp={etp}", "--seq", "8192",
            "--micro-batch", str(mb), "--global-batch", str(gb), "--ac", ac, "--stack", stack]


def emit_round_trip(target, args, gpus, line):
    """simulate ARGS --emit TARGET: the file holds `line`, and simulate --from it predicts what
    was emitted; returns (the --json prediction, the file's text)."""
    out = os.path.join(tmp, target)
    os.makedirs(out, exist_ok=True)
    p = run("simulate", *args, "--emit", target, "--out", out, "--json")
    path = os.path.join(out, "plan." + ("toml" if target == "torchtitan" else "args"))
    text = open(path).read() if p.returncode == 0 else ""
    check(line in text, f"{target}: the file lacks {line!r}")
    back = run("simulate", "--gpus", gpus, "--from", path, "--json")
    if p.returncode == 0 and back.returncode == 0:
        check(json.loads(back.stdout)["tokens_per_s_per_gpu"] == json.loads(p.stdout)["tokens_per_s_per_gpu"],
              f"{target}: simulate --from the emitted file is not the emitted prediction")
    return (json.loads(p.stdout) if p.returncode == 0 else None), text


def simulate(args):
    p = run("simulate", *args, "--json")
    return json.loads(p.stdout) if p.returncode == 0 else None


# ---- the NeMo and torchtitan Llama 4 layouts: accepted, predicted as simulate predicts ----
rows = validate(NEMO + TITAN)
for r in NEMO + TITAN:
    got = rows.get(r[0], {})
    check("refused" not in got and got.get("predicted"), f"{r[0]}: not predicted: {got}")
    want = simulate(sim_args(r))
    check(want is not None and abs(got.get("predicted", 0) / want["tokens_per_s_per_gpu"] - 1) < 1e-12,
          f"{r[0]}: validate {got.get('predicted')}, simulate {want and want['tokens_per_s_per_gpu']}")

# etp 4 keeps a quarter of a rank's experts: Scout's 16 routed experts over EP 16 leave one a
# layer, 48 layers x 3 x 5120 x 8192 = 6.04e9 parameters at etp 1, a quarter of that at etp 4,
# so the resident parameters fall by at least 3/4 x 6.04e9 x 2 bytes (the bf16 weights)
one = simulate(sim_args(NEMO[0][:-1] + (1,)))
four = simulate(sim_args(NEMO[0]))
if one and four:
    drop = one["mem_at_peak_bytes"]["params"] - four["mem_at_peak_bytes"]["params"]
    check(drop >= 0.75 * 48 * 3 * 5120 * 8192 * 2, f"etp 4 frees {drop} bytes of parameters")

# ---- a refused row names the rule ----
bad = validate([("bad", "llama4-scout-17b-16e", 64, 1, 16, 4, 1, 2, 1, 1, 16, "full", "torchtitan-eager", 2)])
check("torchtitan supports expert_tensor_parallel_degree 1 or tp only" in bad.get("bad", {}).get("refused", ""),
      f"torchtitan etp 2 under tp 4: {bad}")

# ---- Megatron-LM arguments: written, read back, and Megatron's default etp = tp ----
# (Llama 4's chunked attention is not written as Megatron-LM arguments: Qwen3-30B-A3B on 16
# GPUs, dp_replicate 4 x tp 4, ep 4 x etp 4)
mg, text = emit_round_trip("megatron", ["--model", "qwen3-30b-a3b", "--gpus", "16", "--mesh",
                                        "dp_replicate=4,tp=4,ep=4,etp=4", "--seq", "4096", "--global-batch", "64",
                                        "--stack", "megatron-core"], "16", "--expert-tensor-parallel-size 4\n")
args = " ".join(line for line in text.splitlines() if not line.startswith("#"))
dflt = run("simulate", "--gpus", "16", "--from-args", args.replace("--expert-tensor-parallel-size 4", ""), "--json")
if mg and dflt.returncode == 0:
    check(json.loads(dflt.stdout)["tokens_per_s_per_gpu"] == mg["tokens_per_s_per_gpu"],
          "without --expert-tensor-parallel-size Megatron-LM's default (tp = 4) is not read")

# ---- torchtitan TOML: Qwen3-30B-A3B, dp_shard 4 x tp 2, ep 2 with etp = tp = 2 ----
emit_round_trip("torchtitan", ["--model", "qwen3-30b-a3b", "--gpus", "8", "--mesh", "dp_shard=4,tp=2,ep=2,etp=2",
                               "--seq", "4096", "--global-batch", "8", "--ac", "full", "--stack", "torchtitan-compile"],
                "8", "expert_tensor_parallel_degree = 2\n")

# ---- explain: the tiles and the rank's expert-TP index (rank 5 = expert grid e 1, t 1) ----
ex = run("explain", "--model", "llama4-scout-17b-16e", "--gpus", "256", "--mesh", "dp_replicate=64,tp=4,ep=16,etp=4",
         "--stack", "megatron-core", "--rank", "5").stdout
check("ep 1, efsdp 0), cp 0, tp 1 (etp 1, expert-DP 0 of 4)" in ex, "explain's mesh line lacks the etp index")
check("[1, 2048, 5120]        40.00 MiB  ep:S(0) etp:S(1)" in ex, "explain's gate tile is not [1, 2048, 5120] etp:S(1)")
check("[1, 5120, 2048]        40.00 MiB  ep:S(0) etp:S(2)" in ex, "explain's down tile is not [1, 5120, 2048] etp:S(2)")

# ---- plan: the search's expert grid at etp = tp ----
pl = run("plan", "--model", "qwen3-30b-a3b", "--gpus", "16", "--stack", "megatron-core", "--seq", "4096",
         "--global-batch", "256", "--fix", "tp=2,etp=2", "--top", "1", "--db", os.path.join(tmp, "p.db")).stdout
check(" 4g2 " in pl, f"plan --fix tp=2,etp=2 does not rank an etp 2 plan: {pl[:600]}")

# ---- the flex dispatcher under etp (MoEFlexTokenDispatcher, token_dispatcher.py, core_v0.14.0:
# its group expert-TP x EP, each token's routing replicated over the etp ranks of its expert) ----
# Qwen3-30B-A3B (128 experts, top 8, d_ff_expert 768) on 16 GPUs, dp_replicate 8 x tp 2 with
# ep 4 x etp 2, seq 4096, micro-batch 1, SP: a rank routes its 4096 / 2 = 2048-token shard x 8
# = 16,384 rows. The all-to-all dispatcher sends those 16,384 and its etp all-gather makes
# them 32,768; DeepEP and HybridEP send each to both expert-TP ranks of its expert, 32,768
# rows, with no all-gather. The experts' rows are the same either way: 32,768 over the rank's
# 128 / 4 = 32 experts, 1,024 each.
flex = ["--model", "qwen3-30b-a3b", "--gpus", "16", "--mesh", "dp_replicate=8,tp=2,ep=4,etp=2", "--seq", "4096",
        "--global-batch", "64", "--stack", "megatron-core"]
for d, sent, gathered in (("alltoall", 16384, 32768), ("deepep", 32768, 0), ("hybridep", 32768, 0)):
    p = run("explain", *flex, "--moe-dispatcher", d, "--json")
    mo = json.loads(p.stdout).get("routed_experts", {}) if p.returncode == 0 else {}
    check((mo.get("dispatch_rows"), mo.get("etp_gather_rows"), mo.get("experts_local"), mo.get("rows_per_expert")) ==
          (sent, gathered, 32, 1024), f"explain --moe-dispatcher {d}: routed_experts {mo}")
# the rows DeepEP delivers are those the all-to-all dispatcher's etp all-gather makes, the
# experts' saved input either way: the same peak memory
peaks = [simulate(flex + ["--moe-dispatcher", d]) for d in ("alltoall", "deepep")]
check(all(peaks) and peaks[0]["peak_mem_bytes"] == peaks[1]["peak_mem_bytes"],
      f"peak memory under deepep and etp 2 differs from the all-to-all's: {[p and p['peak_mem_bytes'] for p in peaks]}")
# Megatron-LM's arguments for it: written and read back (the flex dispatcher with etp 2)
_, text = emit_round_trip("megatron", flex + ["--moe-dispatcher", "deepep"], "16",
                          "--moe-token-dispatcher-type flex\n--moe-enable-deepep\n")
check("--expert-tensor-parallel-size 2\n" in text, "the DeepEP plan's arguments lack --expert-tensor-parallel-size 2")
# the planner's search under DeepEP: expert grids of etp 2 where --fix names it, every plan ep > 1
pl = run("plan", "--no-db", "--model", "qwen3-30b-a3b", "--gpus", "16", "--stack", "megatron-core", "--seq", "4096",
         "--global-batch", "64", "--moe-dispatcher", "deepep", "--fix", "tp=2,etp=2", "--top", "3", "--json")
plans = json.loads(pl.stdout)["plans"] if pl.returncode == 0 else []
check(plans and all(q["mesh"]["etp"] == 2 and q["mesh"]["ep"] > 1 for q in plans),
      f"plan --moe-dispatcher deepep --fix tp=2,etp=2: {[q['mesh'] for q in plans]} {pl.stderr[:300]}")
pl = run("plan", "--no-db", "--model", "qwen3-30b-a3b", "--gpus", "16", "--stack", "megatron-core", "--seq", "4096",
         "--global-batch", "64", "--moe-dispatcher", "deepep", "--top", "50", "--json")
plans = json.loads(pl.stdout)["plans"] if pl.returncode == 0 else []
check(plans and all(q["mesh"]["ep"] > 1 for q in plans), "plan --moe-dispatcher deepep ranks a plan with ep 1")
bad = run("plan", "--no-db", "--model", "qwen3-30b-a3b", "--gpus", "16", "--stack", "torchtitan-eager",
          "--moe-dispatcher", "deepep", want_rc=2)
check( "stack torchtitan-eager does not run it" in bad.stderr,
      f"plan --moe-dispatcher deepep on torchtitan: {bad.returncode} {bad.stderr[:300]}")

for f in fails:
    print("FAIL:", f)
print(f"{len(fails)} failures")
sys.exit(1 if fails else 0)
