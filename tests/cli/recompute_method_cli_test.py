#!/usr/bin/env python3
"""Megatron-Core's recompute method through the binary: validate's recompute_method and
recompute_num_layers columns are simulate's --recompute-method and --recompute-num-layers, an
empty pair is full (every layer alone), a malformed method names the row (exit 2) and a count
Megatron-Core refuses is the row's refusal. The
case: Megatron-Bridge's Llama 3 8B H100 FP8 preset (recompute_num_layers 5, set as the block
method by scripts/performance/utils/overrides.py at b7b4e11b0) on one pipeline stage of 32
layers: block 5 recomputes 5 of them, so its step is shorter than full's and longer than
no recompute's, and uniform 1 is full.

Usage: recompute_method_cli_test.py MESHPLAN"""
import json
import sys

import cli_check
from cli_check import check, fails, run, validate_csv

cli_check.BIN = sys.argv[1]

SIM = ["--model", "llama3-8b", "--gpus", "8", "--gpu", "h100-sxm", "--mesh", "dp_replicate=8", "--seq", "8192",
       "--micro-batch", "1", "--global-batch", "128", "--stack", "megatron-core"]


def step(*extra):
    p = run("simulate", *SIM, *extra, "--json")
    return json.loads(p.stdout)["step_time_s"] if p.returncode == 0 else None


full, block5, none = step("--ac", "full"), step("--ac", "full", "--recompute-method", "block",
                                                 "--recompute-num-layers", "5"), step("--ac", "none")
uniform1 = step("--ac", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1")
check(None not in (full, block5, none) and none < block5 < full, f"none {none} < block 5 {block5} < full {full}")
check(uniform1 == full, f"uniform 1 {uniform1} is full {full}")

HDR = ("case,source,model,gpus,gpu,gpus_per_node,inter_node_gbps_per_gpu,dp_replicate,dp_shard,tp,pp,"
       "pp_schedule,pp_virtual,cp,ep,seq,local_batch,micro_batch,global_batch,ac,fp8,sp,async_tp,stack,metric,"
       "value,notes,recompute_method,recompute_num_layers\n")
ROW = "{0},test,llama3-8b,8,h100-sxm,8,,8,1,1,1,,,1,1,8192,16,1,128,full,0,0,,megatron-core,"\
      "step_time_s,1,test,{1},{2}\n"
p = validate_csv(HDR + ROW.format("block5", "block", "5") + ROW.format("full", "", ""))
if p.returncode == 0:
    rows = {r["case"]: r.get("predicted") for r in json.loads(p.stdout)["rows"]}
    check(rows["block5"] == block5, f"recompute_method block 5: {rows['block5']}, want simulate's {block5}")
    check(rows["full"] == full, f"empty columns: {rows['full']}, want full's {full}")
p = validate_csv(HDR + ROW.format("bad_method", "blocks", "5"), want_rc=2)
check("bad_method" in p.stderr and "recompute_method 'blocks'" in p.stderr, f"recompute_method blocks: {p.stderr!r}")
# a plan Megatron-Core refuses is the row's refusal, as validate reports any refused plan
p = validate_csv(HDR + ROW.format("bad_uniform", "uniform", "5"))
refused = json.loads(p.stdout)["rows"][0].get("refused", "") if p.returncode == 0 else ""
check("which 5 does not divide" in refused, f"uniform 5 of 32: {refused!r}")

for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
