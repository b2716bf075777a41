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
# 2T (4H + 6144 + H + 3f) + 8T + 128T = 16384 x 69632 + 65536 + 1048576 = 1,141,964,800 bytes,
# the fused SwiGLU's input among them). The peak, at the head's backward, loses 16 of them; the
# copies take 1,141,964,800 / 63e9 = 18.1 ms each.
LAYER = 1141964800
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

# Megatron-Bridge's Llama 3.1 405B GB200 FP8 layout under Megatron FSDP
# (scripts/performance/configs/llama/llama31_workload_base_configs.py
# LLAMA31_405B_PRETRAIN_CONFIG_GB200_FP8_CS_V1 at c8327cfc2^: 128 GPUs, tp 2, pp 1, seq 8192,
# micro-batch 1, global batch 64, use_megatron_fsdp, cpu_offloading_num_layers 92 with
# activations only; llama31_llm_pretrain.py: fsdp_double_buffer; fp8_cs: tensorwise with
# fp8_param_gather; its two optimizer instances, Megatron FSDP's hybrid sharding, below; here
# dp_shard 64). One layer's saved tensors a rank (T 8192, Ts = T / tp 4096,
# H 16384, f / tp 26624, q / tp 8192, kv / tp 512, 64 heads a rank; the float8 Linears save
# their inputs' 1-byte copies, the projection its bf16 input, the attention's output):
#   block input 2TsH 134,217,728; q/k/v's rstd 4Ts 16,384 and normed input TsH 67,108,864;
#   q, k, v 2T(q + 2kv) 150,994,944; output 2Tq 134,217,728; softmax statistics 4T x 64
#   2,097,152; fc1's input 2TsH 134,217,728, rstd 16,384, normed input 67,108,864; the SwiGLU's
#   input 2T x 2f 872,415,232; fc2's input Tf 218,103,808: 1,780,514,816 bytes.
# Every one of them is marked, so an offloaded layer holds nothing on the GPU while its tensors
# are on the host. The peak falls in the last micro-batch's backward just past the top layer's
# (its gradients' reduce-scatter buffers out): the 33 kept layers below it (92 .. 124) and the
# one group Transformer Engine has copied back ahead (layer 91's, whose window is 91 + 34 =
# 125), 34 x 1,780,514,816 = 60,537,503,744 bytes (56.38 GiB). Were the SwiGLU's input left on
# the GPU the 91 offloaded layers still on the host would add 91 x 872,415,232 bytes (73.94 GiB)
# and the plan would not fit. Eight layers more offloaded take 8 kept layers off that peak.
BIG = ["--model", "llama3.1-405b", "--gpus", "128", "--gpu", "gb200", "--nvlink-domain", "72", "--stack",
       "megatron-core", "--mesh", "tp=2,dp_shard=64", "--seq", "8192", "--micro-batch", "1", "--global-batch", "64",
       "--data-parallel-sharding-strategy", "optim_grads_params", "--fp8", "current", "--fp8-param-gather",
       "--fsdp-double-buffer", "--json"]
BIG_LAYER = 1780514816
big = [run("simulate", *BIG, "--cpu-offload-layers", n) for n in ("92", "100")]
big = [json.loads(p.stdout) if p.returncode == 0 else {} for p in big]
check(big[0].get("mem_at_peak_bytes", {}).get("activations") == 34 * BIG_LAYER and big[0].get("fits"),
      f"405B GB200 layout: {big[0].get('mem_at_peak_bytes')}, fits {big[0].get('fits')}")
check(big[0] and big[1] and big[0]["peak_mem_bytes"] - big[1]["peak_mem_bytes"] == 8 * BIG_LAYER,
      f"92 -> 100 offloaded: {big[0].get('peak_mem_bytes')} -> {big[1].get('peak_mem_bytes')}")
# The recipe's layout itself: num_distributed_optimizer_instances 2 (llama31_llm_pretrain.py
# under use_megatron_fsdp), dp_replicate 2 over dp_shard 32. Each rank's shard is 1/32 of its
# tp half, 6,341,523,968 parameters (explain's count), twice dp_shard 64's 1/64 (every row
# count divides by 64): the fp32 main weights and bf16/float8 model weights, the fp32 main
# gradients (4 x 6,341,523,968 = 25,366,095,872) and Adam (8 x = 50,732,191,744) twice
# theirs; the activations the same 34 layers. The recipe's grad_reduce_in_fp32 False
# (set_llama31_common_configs) halves the main gradients: 2 x 6,341,523,968.
N_HSDP = 6341523968
HY = [a if a != "tp=2,dp_shard=64" else "dp_replicate=2,dp_shard=32,tp=2" for a in BIG]
hy = run("simulate", *HY, "--cpu-offload-layers", "92")
hy = json.loads(hy.stdout).get("mem_at_peak_bytes", {}) if hy.returncode == 0 else {}
flat = big[0].get("mem_at_peak_bytes", {})
check(hy.get("grads") == 4 * N_HSDP and hy.get("optimizer") == 8 * N_HSDP and flat
      and all(hy.get(k) == 2 * flat.get(k, -1) for k in ("params", "optimizer", "grads"))
      and hy.get("activations") == 34 * BIG_LAYER, f"405B hybrid: {hy} against dp_shard 64's {flat}")
hb = run("simulate", *HY, "--cpu-offload-layers", "92", "--fsdp-reduce-dtype", "bf16")
hb = json.loads(hb.stdout).get("mem_at_peak_bytes", {}) if hb.returncode == 0 else {}
check(hb.get("grads") == 2 * N_HSDP, f"405B hybrid, bf16 main gradients: {hb}")

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
