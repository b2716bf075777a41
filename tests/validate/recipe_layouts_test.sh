#!/bin/bash
# meshplan validate on tests/data/validation/recipe_layouts.csv: the layouts of
# Megatron-Bridge's performance recipes (settings only; the value column is a placeholder,
# so no error or published figure is read). Holds, per row:
#   - the row simulates: a layout Megatron-Core runs and meshplan starts refusing fails here;
#   - its MFU (model FLOPs over the GPU's dense bf16 peak, the ratio meshplan simulate --json
#     reports for the same model, GPU and seq) inside the plausible band: at least 0.15, and
#     at most 0.75 for a bf16 row, 1.5 for a float8 or NVFP4 row (their GEMMs run on at
#     least twice the bf16 peak, but attention, norms and communication do not, so a model
#     MFU above 1.5 of the bf16 peak would need more than 75 % of the float8 peak end to
#     end). Rows below 0.15 by their layout's own choice are listed in LOW with the reason
#     and held to at least 0.05; a listed row back inside the band fails too, so the list
#     stays exact.
# Runs from the runfiles root.
set -u
exec /usr/bin/python3 - <<'PY'
import csv, io, json, subprocess, sys
MP, CSV = "app/meshplan", "tests/data/validation/recipe_layouts.csv"
# gpt-oss-20b v3: 512 GPUs for a global batch of 64 x 8192 tokens, 1,024 tokens a GPU a
# step (strong scaling); gpt-oss-120b B200 v1: EP 64 over eight 8-GPU nodes with NCCL's
# all-to-all (its v2 preset runs EP 8 inside a node)
LOW = {"bridge-gpt_oss_20b-gb200-fp8_mx_v3", "bridge-gpt_oss_20b-gb300-fp8_mx_v3",
       "bridge-gpt_oss_120b-b200-bf16_v1", "bridge-gpt_oss_120b-b200-fp8_mx_v1"}
out = subprocess.run([MP, "validate", "--json", CSV], capture_output=True, text=True)
if out.returncode != 0:
    sys.exit(f"FAIL: validate {CSV} exited {out.returncode}: {out.stderr.strip()}")
pred = {r["case"]: r for r in json.loads(out.stdout)["rows"]}
text = "\n".join(l for l in open(CSV) if not l.startswith("#"))
rows = list(csv.DictReader(io.StringIO(text)))
per_token = {}  # (model, gpu, seq) -> MFU per token/s per GPU
bad = []
for r in rows:
    p = pred[r["case"]]
    if "refused" in p:
        bad.append(f"{r['case']}: refused: {p['refused']}")
        continue
    key = (r["model"], r["gpu"], r["seq"])
    if key not in per_token:
        s = subprocess.run([MP, "simulate", "--model", r["model"], "--gpus", "8", "--gpu", r["gpu"],
                            "--seq", r["seq"], "--stack", "megatron-core", "--json"],
                           capture_output=True, text=True)
        if s.returncode != 0:
            sys.exit(f"FAIL: simulate {key}: {s.stderr.strip()}")
        d = json.loads(s.stdout)
        per_token[key] = d["mfu"] / d["tokens_per_s_per_gpu"]
    mfu = p["predicted"] * per_token[key]
    lo, hi = (0.05 if r["case"] in LOW else 0.15), (1.5 if r["fp8"] == "1" else 0.75)
    if not lo <= mfu <= hi:
        bad.append(f"{r['case']}: MFU {mfu:.3f} outside [{lo}, {hi}]")
    elif r["case"] in LOW and mfu >= 0.15:
        bad.append(f"{r['case']}: MFU {mfu:.3f} back inside the band: drop it from LOW")
# simulate on a megatron stack takes Megatron's embedding-and-loss split for 128 chunks of
# 126 layers (126 + 2 = 128, one a chunk, the first and last chunk the embedding and the loss
# alone); torchtitan's stack keeps the refusal, which names the layout to state
sim = [MP, "simulate", "--model", "llama3.1-405b", "--gpus", "128", "--gpu", "b200", "--mesh",
       "tp=4,pp=16,dp_replicate=2", "--pp", "16", "--pp-schedule", "interleaved", "--pp-virtual", "8",
       "--seq", "8192", "--global-batch", "64"]
s = subprocess.run(sim + ["--stack", "megatron-core"], capture_output=True, text=True)
if s.returncode != 0 or "layout E|(t|)*126L" not in s.stdout:
    bad.append(f"simulate 405B pp 16 x 8 megatron-core: rc {s.returncode}, {s.stdout[:300]} {s.stderr.strip()}")
s = subprocess.run(sim + ["--stack", "torchtitan-compile"], capture_output=True, text=True)
if s.returncode == 0 or "E|(t|)*126L" not in s.stderr:
    bad.append(f"simulate 405B pp 16 x 8 torchtitan-compile: rc {s.returncode}, not refused naming the layout")
if len(rows) < 170 or bad:
    sys.exit(f"FAIL: {len(rows)} rows\n" + "\n".join(bad))
print(f"recipe_layouts.csv: {len(rows)} rows simulated, every MFU in its band")
PY
