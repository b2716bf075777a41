#!/usr/bin/env python3
"""A graph-safe MoE dispatch from the command line: Megatron-Bridge's performance recipes run
full-iteration CUDA graphs over Qwen3 and DeepSeek-V3 with the flex dispatcher's HybridEP backend
(scripts/performance/configs/qwen/qwen3_workload_base_configs.py, GB200 FP8_MX: hybridep,
cuda_graph_impl full_iteration) and set moe_expert_rank_capacity_factor 1.5 with paged stashing
for them (set_full_iter_cg_configs, at c8327cfc2^; settings only: each row's value is a
placeholder 1, no measurement). validate reads such a row with no capacity column at that rank
capacity, marked moe_capacity_from, the figure the row stating it gets (per-layer graphs, which no
recipe runs over HybridEP, read nothing and are refused unless the row states it); DeepEP under the same
graphs is refused naming its host list; simulate takes --moe-expert-rank-capacity-factor, and
explain says the host reads no count and each expert's rows are padded to 256 under float8.

Usage: moe_graph_safe_test.py MESHPLAN"""
import json
import sys

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]
HDR = ("case,source,model,gpus,gpu,gpus_per_node,inter_node_gbps_per_gpu,dp_replicate,dp_shard,tp,pp,pp_schedule,"
       "pp_virtual,cp,ep,seq,local_batch,micro_batch,global_batch,ac,fp8,sp,stack,metric,value,notes,etp,"
       "cuda_graphs,moe_dispatcher,fp8_recipe,moe_rank_capacity_factor\n")


# Qwen3-30B-A3B on 8 GB200 with ep 8, micro-batch 4, global batch 512 (Bridge's GB200 FP8_MX V1)
def row(case, dispatcher, rank_capacity, graphs="iteration"):
    return (f"{case},test,qwen3-30b-a3b,8,gb200,4,400,8,1,1,1,,,1,8,4096,64,4,512,none,1,0,megatron-core,"
            f"step_time_s,1,placeholder,1,{graphs},{dispatcher},mxfp8,{rank_capacity}\n")


def validate(rows, want_rc=0):
    return cli_check.validate_csv(HDR + "".join(rows), want_rc)


p = validate([row("read", "hybridep", ""), row("stated", "hybridep", "1.5"), row("deepep", "deepep", "")])
rs = {r["case"]: r for r in json.loads(p.stdout)["rows"]} if p.returncode == 0 else {}
read, stated, deepep = rs.get("read", {}), rs.get("stated", {}), rs.get("deepep", {})
check(read.get("moe_capacity_from") == "cuda_graphs" and "moe_capacity_from" not in stated and
      read.get("predicted", 0) > 0 and read.get("predicted") == stated.get("predicted"),
      "rank capacity read from the graphs: %s %s" % (read, stated))
check("num_worst_tokens" in deepep.get("refused", ""), "DeepEP under iteration graphs refused: %s" % deepep)
# per-layer graphs over HybridEP: no recipe states a budget for them, so none is read
p = validate([row("layers", "hybridep", "", "layers"), row("layers_stated", "hybridep", "1.5", "layers")])
rs = {r["case"]: r for r in json.loads(p.stdout)["rows"]} if p.returncode == 0 else {}
check("no rank capacity" in rs.get("layers", {}).get("refused", "") and rs.get("layers_stated", {}).get("predicted", 0) > 0,
      "layers over HybridEP: %s" % rs)
# a rank capacity on the alltoall dispatcher is HybridEP's option only
p = validate([row("alltoall", "alltoall", "1.5")])
r = json.loads(p.stdout)["rows"][0] if p.returncode == 0 else {}
check("'hybridep'" in r.get("refused", ""), "rank capacity on alltoall: %s" % r)

ARGS = ("--model", "qwen3-30b-a3b", "--gpus", "8", "--gpu", "b200", "--ep", "8", "--stack", "megatron-core",
        "--moe-dispatcher", "hybridep", "--fp8", "mxfp8", "--cuda-graphs", "iteration",
        "--no-check-for-nan-in-loss-and-grad", "--seq", "4096", "--micro-batch", "1", "--global-batch", "64")
p = run("simulate", *ARGS, want_rc=2)
check("HybridEP and no rank capacity" in p.stderr and p.stderr.count("\n") == 1, "no budget: %r" % p.stderr)
p = run("simulate", *ARGS, "--moe-expert-rank-capacity-factor", "1.5", "--json")
check(p.returncode == 0 and json.loads(p.stdout).get("step_time_s", 0) > 0, "simulate with the budget: %r" % p.stderr)
# explain: 4096 x 8 x 8 / 128 = 2048 rows an expert, a multiple of 256 (no padding here)
p = run("explain", *ARGS, "--moe-expert-rank-capacity-factor", "1.5", "--json")
note = json.loads(p.stdout).get("routed_experts", {}).get("note", "") if p.returncode == 0 else ""
check("2048.0 rows each" in note and "HybridEP rank capacity 1.5" in note and "the host reads no count" in note and
      "multiple of 256 rows (float8)" in note, "explain: %r" % note)

for f in fails:
    print("FAIL:", f)
print(f"moe_graph_safe_test: {len(fails)} failures")
sys.exit(1 if fails else 0)
