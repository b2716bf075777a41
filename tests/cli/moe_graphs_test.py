#!/usr/bin/env python3
"""CUDA graphs over MoE layers from the command line: NeMo's performance recipes that turn
CUDA graphs on for MoE models (scripts/performance/recommended_model_configs, cuda_graphs 1:
Megatron-Core's --enable-cuda-graph, per-layer graphs) run their MoE layers padded to a
capacity (nemo/lightning/pytorch/callbacks/moe_token_drop.py, MegatronTokenDropCallback:
capacity factor 1.0 with --moe-pad-expert-input-to-capacity, which the recipes add: the
Mixtral 8x7B and Llama 4 e16 performance_optimizations, the Qwen3 and DeepSeek-V3 scripts),
so the alltoall dispatcher reads no count on the host and the whole layer is captured;
validate takes those layouts (settings only: each row's value is a placeholder 1, no
measurement) with cuda_graphs layers, moe_capacity_factor 1 and moe_pad_to_capacity 1, the
Llama 4 e16 H100 one with its expert tensor parallelism (ETP 4) among them.
Megatron-Bridge's scope list for dropless MoE (attn moe_router moe_preprocess) validates as
attn+moe_router+moe_preprocess; the dropless layout under layers is a refused row naming the
dispatcher's host synchronisation, a padding without a capacity a one-line error naming the
column.

Usage: moe_graphs_test.py MESHPLAN"""
import json
import sys

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]
HDR = ("case,source,model,gpus,gpu,gpus_per_node,inter_node_gbps_per_gpu,dp_replicate,dp_shard,tp,pp,pp_schedule,"
       "pp_virtual,cp,ep,seq,local_batch,micro_batch,global_batch,ac,fp8,sp,stack,metric,value,notes,etp,"
       "cuda_graphs,moe_capacity_factor,moe_pad_to_capacity\n")
# case, model, gpus, gpu, per node, dp, tp, pp, schedule, virtual, ep, seq, local, micro, global, sp, etp
NEMO = (("mixtral_b200", "mixtral-8x7b", 64, "b200", 8, 64, 1, 1, "", "", 8, 4096, 4, 2, 256, 0, ""),
        ("qwen30b_b200", "qwen3-30b-a3b", 8, "b200", 8, 8, 1, 1, "", "", 8, 4096, 64, 1, 512, 0, ""),
        ("dsv3_gb200", "deepseek-v3", 1024, "gb200", 4, 128, 2, 4, "interleaved", 4, 64, 4096, 64, 1, 8192, 1, 1),
        ("qwen235_gb200", "qwen3-235b-a22b", 64, "gb200", 4, 32, 2, 1, "", "", 64, 4096, 32, 1, 1024, 1, 1),
        ("l4e16_h100", "llama4-scout-17b-16e", 256, "h100-sxm", 8, 64, 4, 1, "", "", 16, 8192, 16, 1, 1024, 1, 4))


def row(r, graphs, cap, pad):
    case, model, gpus, gpu, per, dp, tp, pp, sched, v, ep, seq, lb, mb, gb, sp, etp = r
    return (f"{case}_{graphs}_{cap or 'dropless'},test,{model},{gpus},{gpu},{per},400,{dp},1,{tp},{pp},{sched},{v},1,"
            f"{ep},{seq},{lb},{mb},{gb},none,0,{sp},megatron-core,step_time_s,1,placeholder,{etp},{graphs},{cap},{pad}\n")


def validate(rows, want_rc=0):
    return cli_check.validate_csv(HDR + "".join(rows), want_rc)


# every NeMo layout padded to capacity 1 under per-layer graphs, and the same dropless under
# Bridge's scope list: each row predicted
rows = [row(r, g, c, c) for r in NEMO for g, c in (("layers", "1"), ("attn+moe_router+moe_preprocess", ""))]
p = validate(rows)
out = {r["case"]: r for r in json.loads(p.stdout)["rows"]} if p.returncode == 0 else {}
for case, r in out.items():
    check(r.get("predicted", 0) > 0 and "refused" not in r, "%s: predicted: %s" % (case, r))
check(len(out) == 10, "NeMo's MoE layouts with graphs: %d rows" % len(out))

# per-layer graphs over layers stated dropless (moe_pad_to_capacity 0): the dispatcher reads
# its counts on the host, which no capture holds
p = validate([row(NEMO[1], "layers", "", "0")])
r = json.loads(p.stdout)["rows"][0] if p.returncode == 0 else {}
check("synchronises the host" in r.get("refused", "") and "MegatronTokenDropCallback" in r.get("refused", ""),
      "layers over dropless MoE refused: %s" % r)
# a row stating the graphs and neither capacity column ran padded (no run completes dropless
# under them): it takes capacity 1 with padding, NeMo's setting, and says so; the figure is
# the stated capacity-1 row's
p = validate([row(NEMO[1], "layers", "", ""), row(NEMO[1], "layers", "1", "1")])
rs = json.loads(p.stdout)["rows"] if p.returncode == 0 else [{}, {}]
check(rs[0].get("moe_capacity_from") == "cuda_graphs" and "moe_capacity_from" not in rs[1] and
      rs[0].get("predicted") == rs[1].get("predicted"), "capacity read from the graphs: %s" % rs)
# a padding with no capacity names the column
p = validate([row(NEMO[1], "layers", "", "1")], want_rc=2)
check("moe_pad_to_capacity 1" in p.stderr and p.stderr.count("\n") == 1, "padding without a capacity: %r" % p.stderr)
# the moe_router scopes on a dense model are refused by name
p = run("simulate", "--model", "llama3.1-8b", "--gpus", "8", "--stack", "megatron-core", "--cuda-graphs",
        "attn+moe_router", want_rc=2)
check("has no MoE layer" in p.stderr and p.stderr.count("\n") == 1, "moe_router on a dense model: %r" % p.stderr)

# explain says what the graphs hold of a MoE layer and that the host reads the counts between
QWEN = ("--model", "qwen3-30b-a3b", "--gpus", "8", "--gpu", "b200", "--ep", "8", "--stack", "megatron-core", "--json")
p = run("explain", *QWEN, "--cuda-graphs", "attn+moe_router+moe_preprocess")
note = json.loads(p.stdout).get("routed_experts", {}).get("note", "") if p.returncode == 0 else ""
check("router and shared experts in one graph, the dispatch, experts and combine eager after the host reads the "
      "routed counts" in note, "explain: %r" % note)
p = run("explain", *QWEN, "--cuda-graphs", "layers", "--moe-capacity-factor", "1", "--moe-pad-expert-input-to-capacity")
note = json.loads(p.stdout).get("routed_experts", {}).get("note", "") if p.returncode == 0 else ""
check("the whole MoE layer captured" in note, "explain: %r" % note)

for f in fails:
    print("FAIL:", f)
print(f"moe_graphs_test: {len(fails)} failures")
sys.exit(1 if fails else 0)
