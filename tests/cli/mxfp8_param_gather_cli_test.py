#!/usr/bin/env python3
"""Megatron-Core's --fp8-param-gather with the MXFP8 recipe through the binary: Llama 3.1 8B on
8 B200s, the distributed optimizer on dp_replicate (megatron-core's default), with and without
the option, as Megatron-Bridge's bf16_with_mxfp8_mixed runs it (fp8_param_gather with
reuse_grad_buf_for_mxfp8_param_ag); validate's fp8_param_gather column on an mxfp8 row
predicts simulate's; Megatron FSDP with it is refused.

Usage: mxfp8_param_gather_cli_test.py MESHPLAN"""
import json
import sys

import cli_check
from cli_check import check, fails, run, validate_csv

cli_check.BIN = sys.argv[1]

SIM = ["--model", "llama3.1-8b", "--gpus", "8", "--gpu", "b200", "--mesh", "dp_replicate=8", "--stack",
       "megatron-core", "--no-sp", "--fp8", "mxfp8", "--seq", "8192", "--micro-batch", "1", "--global-batch", "128"]


def simulate(*extra):
    p = run("simulate", *SIM, *extra, "--json")
    return json.loads(p.stdout) if p.returncode == 0 else None


# Llama 3.1 8B: N = 8,030,261,248 parameters, F = 6,979,321,856 of them in the 224 float8
# Linears (tests/schedule/fp8_param_gather_test.cc). Without the option a float8 element holds
# its bf16 weight (2) and Transformer Engine's MXFP8 workspace (1 + 1 and the scales); with it
# the MXFP8 weight alone (1 + 1 and the same scales): 2F saved. The N - F bf16 parameters keep
# their own storage beside their buffer's param_data (reuse_grad_buf_for_mxfp8_param_ag leaves
# them off it: param_and_grad_buffer.py core_v0.14.0), 2 bytes more each. The peak (the same
# moment) falls by 2F - 2(N - F) = 11,856,764,928 bytes; the forward's casts are the same
# (quantized from the gathered bf16 once a step), so the compute time is unchanged.
N, F = 8030261248, 6979321856
off, on = simulate(), simulate("--fp8-param-gather")
if off and on:
    check(on.get("fp8_param_gather") is True and on.get("fp8_recipe") == "mxfp8", f"not mxfp8 with the option: {on}")
    check(off["peak_mem_bytes"] - on["peak_mem_bytes"] == 2 * F - 2 * (N - F),
          f"peak {off['peak_mem_bytes']} -> {on['peak_mem_bytes']}, want a drop of {2 * F - 2 * (N - F)}")
    check(off["compute_s"] == on["compute_s"], f"compute {off['compute_s']} -> {on['compute_s']}")
    check(on["optimizer_s"] > off["optimizer_s"], "the gathered bf16 view's zeroing is not priced")

# validate: the same run as a row, with the column 1 and 0
HDR = ("case,source,model,gpus,gpu,gpus_per_node,inter_node_gbps_per_gpu,dp_replicate,dp_shard,tp,pp,"
       "pp_schedule,pp_virtual,cp,ep,seq,local_batch,micro_batch,global_batch,ac,fp8,sp,async_tp,stack,metric,"
       "value,notes,fp8_recipe,fp8_param_gather")
ROW = "{0},test,llama3.1-8b,8,b200,8,400,8,1,1,1,,,1,1,8192,16,1,128,none,1,0,,megatron-core," \
      "tokens_per_s_per_gpu,1000,test,mxfp8,{1}"
p = validate_csv(HDR + "\n" + ROW.format("pg_on", "1") + "\n" + ROW.format("pg_off", "0") + "\n")
if p.returncode == 0:
    rows = {r["case"]: r for r in json.loads(p.stdout)["rows"]}
    want_on = on
    check(not rows["pg_on"].get("refused"), f"mxfp8 row refused: {rows['pg_on']}")
    got = rows["pg_on"].get("predicted")
    check(want_on is not None and got is not None and abs(got / want_on["tokens_per_s_per_gpu"] - 1) < 1e-12,
          f"row {got}, simulate {want_on and want_on['tokens_per_s_per_gpu']}")
    check(got != rows["pg_off"].get("predicted"), "the column changes no mxfp8 prediction")

# Megatron FSDP keeps its own MXFP8 buffers: refused by name
p = run("simulate", *[a if a != "dp_replicate=8" else "dp_shard=8" for a in SIM], "--fp8-param-gather", want_rc=2)
check("Megatron FSDP's MXFP8 buffers are not priced" in p.stderr, f"Megatron FSDP: {p.stderr.strip()}")

for f in fails:
    print("FAIL:", f)
print(f"{len(fails)} failures")
sys.exit(1 if fails else 0)
