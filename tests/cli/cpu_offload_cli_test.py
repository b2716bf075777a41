#!/usr/bin/env python3
"""Megatron-Core's CPU offloading through the binary: simulate's --cpu-offload-layers lowers the
peak by the offloaded layers' marked tensors and adds the copies that outlast their windows
(llama3.1-8b on 8 H100s, seq 8192: 31 of 32 layers offloaded, one layer of compute beside each
copy over PCIe Gen5, so the copies show); explain's schedule states the copies; validate's cpu_offload_layers
column is the flag; Megatron's --cpu-offloading-num-layers (core_v0.16.0's argument) reads back
as it; emit and the refusals say why by name (exit 2).

Usage: cpu_offload_cli_test.py MESHPLAN"""
import json
import os
import sys
import tempfile

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]
tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
SIM = ["--model", "llama3.1-8b", "--gpus", "8", "--gpu", "h100-sxm", "--mesh", "dp_replicate=8", "--seq", "8192",
       "--micro-batch", "1", "--global-batch", "16", "--stack", "megatron-core"]


def simulate(*extra):
    p = run("simulate", *SIM, *extra, "--json")
    return json.loads(p.stdout) if p.returncode == 0 else {}


# One layer's marked tensors at T = 8192 (tests/sim/cpu_offload_test.cc derives them at 4096:
# 2T (4H + 6144 + H + f) + 8T + 128T = 16384 x 40960 + 65536 + 1048576 = 672,202,752 bytes).
# The peak, at the head's backward, loses 16 of them; the copies take 672,202,752 / 63e9 =
# 10.7 ms each.
LAYER = 672202752
base, off16, off31 = simulate(), simulate("--cpu-offload-layers", "16"), simulate("--cpu-offload-layers", "31")
check(base and off16 and base["peak_mem_bytes"] - off16["peak_mem_bytes"] == 16 * LAYER,
      f"peak with 16 layers offloaded: {base.get('peak_mem_bytes')} -> {off16.get('peak_mem_bytes')}")
check(off16.get("cpu_offload_layers") == 16 and "offload_exposed_s" in off16, f"--json fields: {sorted(off16)}")
# 31 groups of 32 layers: each copy beside one layer's compute, which is shorter than 10.7 ms
# forward at this size, so the copies show and the step grows by them
check(off31.get("offload_exposed_s", 0) > 0, f"31 layers: {off31.get('offload_exposed_s')}")
check(off31 and abs(off31["step_time_s"] - base["step_time_s"] - off31["offload_exposed_s"]) < 1e-9,
      f"step {base.get('step_time_s')} + exposed {off31.get('offload_exposed_s')} != {off31.get('step_time_s')}")
check(off31.get("offload_exposed_s", 1) < 2 * 31 * 2 * LAYER / 63e9,
      "exposed past all the copies of the step's two micro-batches")

# explain's schedule states one layer's copy and the step's exposed copies, simulate's figure
p = run("explain", *SIM, "--cpu-offload-layers", "31", "--schedule", "--json")
sch = json.loads(p.stdout).get("schedule", {}) if p.returncode == 0 else {}
check(sch.get("offload_bytes_per_layer") == LAYER and sch.get("offload_exposed_s") == off31.get("offload_exposed_s"),
      f"explain --schedule --json: {sch.get('offload_bytes_per_layer')}, {sch.get('offload_exposed_s')}")
p = run("explain", *SIM, "--cpu-offload-layers", "31", "--schedule", "--summary")
check("CPU offloading: the first 31 layers' marked tensors" in p.stdout, "explain --summary: no offloading line")

# validate's column is the flag
HDR = ("case,source,model,gpus,gpu,gpus_per_node,inter_node_gbps_per_gpu,dp_replicate,dp_shard,tp,pp,pp_schedule,"
       "pp_virtual,cp,ep,seq,local_batch,micro_batch,global_batch,ac,fp8,sp,async_tp,stack,metric,value,notes,"
       "cpu_offload_layers")
ROW = "{0},test,llama3.1-8b,8,h100-sxm,8,400,8,1,1,1,,,1,1,8192,2,1,16,none,0,0,,{1},tokens_per_s_per_gpu,8000,t,{2}"
path = os.path.join(tmp, "rows.csv")
with open(path, "w") as f:
    f.write("\n".join([HDR, ROW.format("off31", "megatron-core", "31"), ROW.format("none", "megatron-core", ""),
                       ROW.format("all", "megatron-core", "32")]) + "\n")
p = run("validate", path, "--json")
if p.returncode == 0:
    rows = {r["case"]: r for r in json.loads(p.stdout)["rows"]}
    check(abs(rows["off31"].get("predicted", 0) / off31.get("tokens_per_s_per_gpu", 1) - 1) < 1e-12,
          f"cpu_offload_layers 31: {rows['off31']}, want {off31.get('tokens_per_s_per_gpu')}")
    check(abs(rows["none"].get("predicted", 0) / base.get("tokens_per_s_per_gpu", 1) - 1) < 1e-12,
          f"empty column: {rows['none']}")
    check("fewer layers than the model has" in (rows["all"].get("refused") or ""), f"32 of 32: {rows['all']}")
with open(path, "w") as f:
    f.write(HDR + "\n" + ROW.format("tt", "torchtitan-compile", "4").replace(",8,1,1,1,,", ",1,8,1,1,,") + "\n")
p = run("validate", path, "--json", want_rc=2)
check("cpu_offload_layers 4 is Megatron-Core's" in p.stderr, "torchtitan row: " + p.stderr)

# Megatron's argument read back: the prediction is the flag's
args = os.path.join(tmp, "plan")
os.makedirs(args, exist_ok=True)
run("simulate", *SIM, "--emit", "megatron", "--out", args)
text = open(os.path.join(args, "plan.args")).read() if os.path.exists(os.path.join(args, "plan.args")) else ""
with open(os.path.join(args, "off.args"), "w") as f:
    f.write(text + "--cpu-offloading-num-layers 31\n")
p = run("simulate", "--from", os.path.join(args, "off.args"), "--json")
check(p.returncode == 0 and json.loads(p.stdout).get("step_time_s") == off31.get("step_time_s"),
      "--from with --cpu-offloading-num-layers 31: " + p.stderr)

# refusals, one line each, exit 2
for extra, says in ((["--cpu-offload-layers", "4", "--emit", "megatron", "--out", args], "no pretrain_gpt.py argument"),
                    (["--cpu-offload-layers", "4", "--ac", "full"], "activation recomputation"),
                    (["--cpu-offload-layers", "4", "--cuda-graphs", "layers"], "--enable-cuda-graph"),
                    (["--cpu-offload-layers", "x"], "expected an integer")):
    p = run("simulate", *SIM, *extra, want_rc=2)
    check(says in p.stderr and p.stderr.count("\n") <= 1, f"{extra}: {p.stderr!r}")
p = run("simulate", *[a if a != "megatron-core" else "torchtitan-compile" for a in SIM], "--cpu-offload-layers", "4",
        want_rc=2)
check("Megatron-Core's CPU offloading" in p.stderr, "torchtitan: " + p.stderr)

for f in fails:
    print("FAIL:", f)
print(f"cpu_offload_cli_test: {len(fails)} failures")
sys.exit(1 if fails else 0)
