#!/usr/bin/env python3
"""DeepSeek-V3 and DeepSeek-V2-Lite (multi-head latent attention, shared and routed experts,
leading dense layers) through the binary: simulate's FLOPs per token against the hand count,
a plausible MFU, plan's table with the runtime's verdict, --hf-config giving the figures of
meshplan's own files, and context parallelism simulated.

Usage: deepseek_cli_test.py MESHPLAN HF_DIR"""
import json
import os
import sys
import tempfile

import cli_check
from cli_check import check, fails, run

cli_check.BIN, HF = sys.argv[1], sys.argv[2]


# ---- simulate: DeepSeek-V3 on 256 H100s, FSDP over all, 64-way EP, full AC, seq 4096 ----
# The MFU is model FLOPs over step time x peak (989.4 TFLOP/s bf16, data/gpus/h100-sxm.json),
# so mfu x step x peak x GPUs / tokens gives back the FLOPs per token the run used:
# tests/exec/model_test.cc's hand count, 6 x 36,625,603,584 activated parameters without the
# input embedding + 6 x 61 x 128 x (192 + 128) x 4096 = 281,158,232,064, and its MTP module's
# 10,695,309,312 (Megatron's count: its block, norms, eh_proj and head, and its attention):
# 291,853,541,376; with --mtp-num-layers 0 the first figure.
SIM = ["simulate", "--gpus", "256", "--gpu", "h100-sxm", "--mesh", "dp_shard=256,ep=64",
       "--ac", "full", "--seq", "4096", "--json"]
p = run(*SIM, "--model", "deepseek-v3")
if p.returncode == 0:
    d = json.loads(p.stdout)
    tokens = d["global_batch"] * d["seq"]
    fpt = d["mfu"] * d["step_time_s"] * 989.4e12 * 256 / tokens
    check(abs(fpt / 291853541376 - 1) < 1e-9, f"V3 FLOPs per token {fpt:.6g}, want 291853541376")
    z = run(*SIM, "--model", "deepseek-v3", "--mtp-num-layers", "0")
    if z.returncode == 0:
        e = json.loads(z.stdout)
        fpt0 = e["mfu"] * e["step_time_s"] * 989.4e12 * 256 / tokens
        check(abs(fpt0 / 281158232064 - 1) < 1e-9, f"V3 without MTP: FLOPs per token {fpt0:.6g}")
        check(e["step_time_s"] < d["step_time_s"] and e["peak_mem_bytes"] < d["peak_mem_bytes"],
              "V3 without its MTP module is not faster and smaller")
    # Plausible: published large-MoE training on H800/H100 runs at 20-45 % MFU; full AC and
    # FSDP's gathers over 256 ranks put this plan in that band, never above the compute bound.
    check(0.15 < d["mfu"] < 0.55, f"V3 MFU {d['mfu']:.3f} outside 0.15..0.55")
    check(d["fits"], "V3 on 256 GPUs with full AC does not fit")
    check(d["compute_s"] <= d["step_time_s"], "compute longer than the step")
    # The published config gives the same prediction (--hf-config on simulate).
    q = run(*SIM, "--hf-config", f"{HF}/deepseek-v3.json")
    if q.returncode == 0:
        h = json.loads(q.stdout)
        check(h["step_time_s"] == d["step_time_s"] and h["peak_mem_bytes"] == d["peak_mem_bytes"],
              "V3 --hf-config predicts otherwise than deepseek-v3.json")
    check("not modelled" not in q.stderr, f"V3's config read with a notice: {q.stderr.strip()}")
# --mtp-num-layers takes 0..512 - n_layers; the runtime refuses MTP by name
p = run("simulate", "--model", "deepseek-v3", "--mtp-num-layers", "-1", want_rc=2)
check("--mtp-num-layers '-1': expected an integer in 0..451" in p.stderr, f"--mtp-num-layers -1: {p.stderr.strip()}")
p = run("train", "--model", "deepseek-v3", "--steps", "1", want_rc=2)
check("multi-token-prediction module" in p.stderr and "--mtp-num-layers 0" in p.stderr,
      f"train does not refuse MTP by name: {p.stderr.strip()[:300]}")

# ---- plan: DeepSeek-V2-Lite on 8 H100s ------------------------------------------------
p = run("plan", "--model", "deepseek-v2-lite", "--gpus", "8", "--gpu", "h100-sxm", "--no-db")
check("multi-head latent attention is executed by the runtime's CPU backend only" in p.stdout,
      "plan does not say why the runtime does not run the MLA plans on GPUs")
rows = [l for l in p.stdout.splitlines() if l.strip()[:1].isdigit() and l.rstrip().endswith((" no", " yes"))]
check(len(rows) > 0 and all(r.rstrip().endswith(" no") for r in rows),
      "every MLA plan should be runs: no")
p = run("plan", "--model", "deepseek-v2-lite", "--gpus", "8", "--gpu", "h100-sxm", "--no-db", "--json",
        "--top", "0")
if p.returncode == 0:
    d = json.loads(p.stdout)
    check(d["feasible"] > 0, "no V2-Lite plan fits on 8 H100s")
    best = d["plans"][0] if d["plans"] else {}
    check(0.2 < best.get("mfu", 0) < 0.7, f"V2-Lite best MFU {best.get('mfu')} outside 0.2..0.7")
    q = run("plan", "--hf-config", f"{HF}/deepseek-v2-lite.json", "--gpus", "8", "--gpu", "h100-sxm",
            "--no-db", "--json", "--top", "0")
    if q.returncode == 0:
        h = json.loads(q.stdout)
        check([x["step_time_s"] for x in h["plans"]] == [x["step_time_s"] for x in d["plans"]],
              "V2-Lite --hf-config ranks otherwise than deepseek-v2-lite.json")

# ---- context parallelism with MLA: ring attention over the decompressed K and V ---------
p = run("plan", "--model", "deepseek-v2-lite", "--gpus", "8", "--gpu", "h100-sxm", "--no-db", "--json",
        "--top", "0", "--fix", "cp=2")
if p.returncode == 0:
    d = json.loads(p.stdout)
    rules = {r["rule"]: r["count"] for r in d["rejected"]}
    check("eval_error" not in rules, f"cp=2 with MLA refused by the simulator: {rules}")
    check(d["simulated"] > 0, "no cp=2 plan of V2-Lite simulated")

# ---- explain's counts: total and activated, with and without the input embedding -------
# tests/exec/model_test.cc's hand counts: 671,026,404,352 total; 37,552,282,624 activated
# with both embeddings, 36,625,603,584 without the input embedding's row lookup (the count
# that rounds to DeepSeek's published 37B).
p = run("explain", "--model", "deepseek-v3", "--gpus", "8", "--gpu", "h100-sxm", "--json")
if p.returncode == 0:
    d = json.loads(p.stdout)
    check((d["model_params"], d["model_active_params"], d["model_active_params_without_lookup"]) ==
          (671026404352, 37552282624, 36625603584), "explain --json's DeepSeek-V3 counts")
p = run("explain", "--model", "deepseek-v3", "--gpus", "8", "--gpu", "h100-sxm")
check("37.55B of 671.03B parameters activated per token" in p.stdout and "36.63B without" in p.stdout,
      "explain does not print V3's activated parameters")

# ---- explain's parameter table: the FQN column as wide as its longest name ------------
# "layers.0-60.attention.kv_a_proj_with_mqa.weight" is 47 characters, one more than the
# llama names the column was sized for; every row's shape column starts where the header's
# "global" does.
p = run("explain", "--model", "deepseek-v3", "--gpus", "256", "--gpu", "h100-sxm", "--mesh",
        "dp_shard=256,ep=32", "--ac", "full", "--seq", "4096")
if p.returncode == 0:
    lines = p.stdout.splitlines()
    head = [i for i, l in enumerate(lines) if l.lstrip().startswith("FQN ")]
    check(len(head) == 1, "explain prints no parameter table header")
    if head:
        col = lines[head[0]].index("global")
        table = []
        for l in lines[head[0] + 1:]:
            if not l.strip():
                break
            table.append(l)
        check(any("kv_a_proj_with_mqa" in l for l in table), "kv_a_proj_with_mqa missing from the table")
        bad = [l for l in table if l[col - 1] != " " or l[col] != "["]
        check(not bad, f"rows whose shape is not under 'global': {bad[:2]}")

# ---- validate's mtp_layers column: empty is the model's (1), 0 plans without the module ----
# each row's prediction is simulate's with the same options and --mtp-num-layers
HDR = ("case,source,model,gpus,gpu,gpus_per_node,inter_node_gbps_per_gpu,dp_replicate,dp_shard,tp,pp,"
       "pp_schedule,pp_virtual,cp,ep,seq,local_batch,micro_batch,global_batch,ac,fp8,sp,async_tp,stack,metric,"
       "value,notes,mtp_layers")
ROW = "v3_{0},test,deepseek-v3,256,h100-sxm,8,400,1,256,1,1,,,1,64,4096,1,1,256,full,0,0,,torchtitan-compile,"\
      "tokens_per_s_per_gpu,1000,test,{1}"
tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
csv_path = os.path.join(tmp, "mtp.csv")
with open(csv_path, "w") as f:
    f.write(HDR + "\n" + ROW.format("model", "") + "\n" + ROW.format("none", "0") + "\n")
p = run("validate", csv_path, "--json")
if p.returncode == 0:
    got = {r["case"]: r["predicted"] for r in json.loads(p.stdout)["rows"]}
    for case, mtp in (("v3_model", "1"), ("v3_none", "0")):
        q = run("simulate", "--model", "deepseek-v3", "--gpus", "256", "--gpu", "h100-sxm", "--mesh",
                "dp_shard=256,ep=64", "--ac", "full", "--seq", "4096", "--micro-batch", "1", "--global-batch", "256",
                "--stack", "torchtitan-compile", "--mtp-num-layers", mtp, "--json")
        if q.returncode == 0:
            want = json.loads(q.stdout)["tokens_per_s_per_gpu"]
            check(abs(got.get(case, 0) / want - 1) < 1e-12, f"validate {case}: {got.get(case)}, simulate {want}")
    check(got.get("v3_none", 0) > got.get("v3_model", 0), "the mtp_layers column changes nothing")

# ---- NeMo's H100 DeepSeek-V3 pre-training config (settings only) ----------------------
# NVIDIA/NeMo scripts/performance/recommended_model_configs/model_configs_h100.csv: 1024 H100,
# TP 2, PP 16, EP 64 (ETP 1), seq 4096, MBS 1, GBS 8192, recompute_modules mla_up_proj/mlp/moe,
# bf16 and fp8; pretrain_deepseek_v3.py: DeepEP (flex) on H100; the (16, 1) layout of
# Megatron-Bridge's recipes/deepseek/h100/deepseek_v3.py, [E + 4 decoder] + 14 x [4 decoder] +
# [decoder, mtp, loss]. It plans under the megatron-core stack, mlp recomputing the three dense
# layers and moe the MoE layers: less memory, a longer step than mla_up_proj alone.
NEMO = ["simulate", "--model", "deepseek-v3", "--gpus", "1024", "--gpu", "h100-sxm", "--mesh",
        "dp_replicate=32,tp=2,pp=16,ep=64", "--pp-schedule", "1f1b", "--pp-layout", "Et*4|(t*4|)*14tmL",
        "--seq", "4096", "--micro-batch", "1", "--global-batch", "8192", "--stack", "megatron-core",
        "--moe-dispatcher", "deepep", "--json"]
base = run(*NEMO, "--recompute-modules", "mla_up_proj")
for fp8 in ([], ["--fp8"]):
    p = run(*NEMO, "--recompute-modules", "mla_up_proj/mlp/moe", *fp8)
    check(p.returncode == 0, f"NeMo's DSv3 H100 config {fp8}: {p.stderr.strip()[:300]}")
    if p.returncode == 0 and base.returncode == 0 and not fp8:
        d, b = json.loads(p.stdout), json.loads(base.stdout)
        check(d["recompute_modules"] == "mla_up_proj mlp moe", f"modules {d.get('recompute_modules')}")
        check(d["peak_mem_bytes"] < b["peak_mem_bytes"] and d["step_time_s"] > b["step_time_s"],
              "mlp and moe neither save memory nor cost time")

for f in fails:
    print("FAIL:", f)
print(f"{len(fails)} failures")
sys.exit(1 if fails else 0)
