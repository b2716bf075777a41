#!/usr/bin/env python3
"""The NCCL a run used through the binary: simulate's --nccl-version and validate's nccl_version
column. A malformed version is a one-line usage error (exit 2) in simulate, explain and plan,
and an error naming the row in validate (exit 2); a well-formed one is simulate's flag with the
same value. The case: Nemotron-4 15B at TP 8 over 288 DGX H100 nodes (the report's third
batch-ramp stage), whose data-parallel group holds one rank a node, so its reduce-scatters and
all-gathers may take NCCL's PAT from 2.23 on (sim/network.c, pat_bw_share): a step under 2.22
is longer than under the newest NCCL, and 2.20 prices as 2.22 (no release before 2.23 has PAT).

Usage: nccl_version_cli_test.py MESHPLAN"""
import json
import sys

import cli_check
from cli_check import check, fails, run, validate_csv

cli_check.BIN = sys.argv[1]

SIM = ["--model", "nemotron4-15b", "--gpus", "2304", "--gpu", "h100-sxm", "--mesh", "dp_replicate=288,tp=8",
       "--seq", "4096", "--micro-batch", "4", "--global-batch", "1152", "--stack", "megatron-core"]


def step(*extra):
    p = run("simulate", *SIM, *extra, "--json")
    return json.loads(p.stdout)["step_time_s"] if p.returncode == 0 else None


# ---- malformed versions: one line on stderr, exit 2, in every command that takes the flag ----
for bad in ["2", "2.", "2.21.", "2.21.5-1", "v2.21", "2.100", "0.21", "2.21.5.1", ""]:
    p = run("simulate", *SIM, "--nccl-version", bad, want_rc=2)
    lines = p.stderr.strip().splitlines()
    check(len(lines) == 1 and "NCCL version" in lines[0] and "X.Y" in lines[0],
          f"--nccl-version '{bad}': want one line naming the version and the form, got {p.stderr!r}")
for cmd in ["explain", "plan"]:
    p = run(cmd, "--model", "nemotron4-15b", "--gpus", "16", "--gpu", "h100-sxm", "--seq", "4096",
            "--global-batch", "16", "--stack", "megatron-core", "--nccl-version", "2.x", want_rc=2)
    check(len(p.stderr.strip().splitlines()) == 1 and "NCCL version '2.x'" in p.stderr,
          f"{cmd} --nccl-version 2.x: {p.stderr!r}")

# ---- the version decides PAT for a group of one rank a node ----
newest, v222, v220 = step(), step("--nccl-version", "2.22"), step("--nccl-version", "2.20.5")
check(None not in (newest, v222, v220) and v222 > newest,
      f"2.22 (no PAT) {v222} should be slower than the newest NCCL's {newest}: the flag changes nothing")
check(v220 == v222, f"2.20.5 {v220} and 2.22 {v222}: no release before 2.23 has PAT, so they price alike")
check(step("--nccl-version", "2.27.7") == newest, "2.27.7 should price as the default, the newest NCCL modelled")

# ---- validate's nccl_version column: simulate's flag, and a malformed value names the row ----
HDR = ("case,source,model,gpus,gpu,gpus_per_node,inter_node_gbps_per_gpu,dp_replicate,dp_shard,tp,pp,"
       "pp_schedule,pp_virtual,cp,ep,seq,local_batch,micro_batch,global_batch,ac,fp8,sp,async_tp,stack,metric,"
       "value,notes,nccl_version\n")
ROW = "{0},test,nemotron4-15b,2304,h100-sxm,8,,288,1,8,1,,,1,1,4096,4,4,1152,none,0,1,,megatron-core,"\
      "step_time_s,0.64,test,{1}\n"
p = validate_csv(HDR + ROW.format("old", "2.22") + ROW.format("new", ""))
if p.returncode == 0:
    rows = {r["case"]: r.get("predicted") for r in json.loads(p.stdout)["rows"]}
    check(rows["old"] == v222, f"nccl_version 2.22: {rows['old']}, want simulate --nccl-version 2.22's {v222}")
    check(rows["new"] == newest, f"nccl_version empty: {rows['new']}, want the default's {newest}")
p = validate_csv(HDR + ROW.format("bad_version", "2.21.5-1"), want_rc=2)
check("bad_version" in p.stderr and "NCCL version '2.21.5-1'" in p.stderr and len(p.stderr.strip().splitlines()) == 1,
      f"nccl_version 2.21.5-1: want one line naming the row and the value, got {p.stderr!r}")

for f in fails:
    print("FAIL:", f)
sys.exit(1 if fails else 0)
