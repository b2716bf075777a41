#!/usr/bin/env python3
"""The embedded models that published 2024-2026 training benchmarks run (Mixtral-8x22B,
Qwen2-57B-A14B, Qwen3-14B/32B/235B-A22B, DeepSeek-V2, Nemotron-4 15B/340B, Llama 4 Scout and Maverick)
through the binary: simulate runs each by name with the FLOPs per token of the hand count;
Nemotron-4's squared-ReLU MLP and LayerNorms are planned and simulated, written as Megatron-LM
arguments and refused by the runtime by name; Llama 4 is simulated within one attention
chunk and refused beyond it.

Usage: models_cli_test.py MESHPLAN"""
import json
import os
import sys
import tempfile

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]

# FLOPs per token at seq 4096, 6 x (activated parameters without the input embedding) +
# the attention term (tests/exec/model_test.cc counts the parameters by hand):
#   nemotron4-340b 6 x 336,310,603,776 + 12 x 96 x 96 x 192 x 4096   = 2,104,836,710,400
#   nemotron4-15b  6 x 14,055,911,424 + 12 x 32 x 48 x 128 x 4096    =    93,999,144,960
#   qwen3-32b      6 x 31,984,210,944 + 12 x 64 x 64 x 128 x 4096    =   217,675,069,440
#   qwen3-14b      6 x 13,990,394,880 + 12 x 40 x 40 x 128 x 4096    =    94,008,698,880
#   mixtral-8x22b  6 x 38,960,142,336 + 12 x 56 x 48 x 128 x 4096    =   250,672,287,744
#   qwen2-57b-a14b 6 x 13,704,631,808 + 12 x 28 x 28 x 128 x 4096    =    87,160,292,352
#     (14,249,170,432 activated less the input embedding 151936 x 3584 = 544,538,624)
#   qwen3-235b-a22b 6 x 21,568,433,664 + 12 x 94 x 64 x 128 x 4096   =   167,260,001,280
#   deepseek-v2    6 x 20,851,512,320 + 6 x 60 x 128 x (192 + 128) x 4096 = 185,507,051,520
# and at seq 8192, one Llama 4 attention chunk:
#   llama4-scout-17b-16e     6 x 16,138,421,248 + 12 x 48 x 40 x 128 x 8192 = 120,989,718,528
#   llama4-maverick-17b-128e 6 x 16,150,205,440 + 12 x 48 x 40 x 128 x 8192 = 121,060,423,680
# The MFU is model FLOPs over step time x peak (989.4 TFLOP/s bf16, data/gpus/h100-sxm.json),
# so mfu x step x peak x GPUs / tokens gives the FLOPs per token back.
CASES = [
    ("nemotron4-340b", 256, "dp_shard=256", 2104836710400),
    ("nemotron4-15b", 8, "dp_shard=8", 93999144960),
    ("qwen3-32b", 8, "dp_shard=8", 217675069440),
    ("qwen3-14b", 8, "dp_shard=8", 94008698880),
    ("mixtral-8x22b", 64, "dp_shard=64,ep=8", 250672287744),
    ("qwen2-57b-a14b", 64, "dp_shard=64,ep=8", 87160292352),
    ("qwen3-235b-a22b", 256, "dp_shard=256,ep=64", 167260001280),
    ("deepseek-v2", 128, "dp_shard=128,ep=8", 185507051520),
    ("llama4-scout-17b-16e", 64, "dp_shard=64,ep=16", 120989718528, 8192),
    ("llama4-maverick-17b-128e", 256, "dp_shard=256,ep=64", 121060423680, 8192),
]
for name, gpus, mesh, want, *seq in CASES:
    p = run("simulate", "--model", name, "--gpus", str(gpus), "--gpu", "h100-sxm", "--mesh", mesh,
            "--ac", "full", "--seq", str(seq[0] if seq else 4096), "--json")
    if p.returncode != 0:
        continue
    d = json.loads(p.stdout)
    fpt = d["mfu"] * d["step_time_s"] * 989.4e12 * gpus / (d["global_batch"] * d["seq"])
    check(abs(fpt / want - 1) < 1e-9, f"{name}: FLOPs per token {fpt:.6g}, want {want}")
    check(0 < d["mfu"] < 1 and d["compute_s"] <= d["step_time_s"], f"{name}: MFU {d['mfu']}")

# Llama 4's chunked attention is modelled within one chunk: a longer sequence is refused with
# the chunk named (three of four blocks would attend within chunks), and the runtime refuses
# the model by name.
p = run("simulate", "--model", "llama4-scout-17b-16e", "--gpus", "64", "--mesh", "dp_shard=64,ep=16",
        "--seq", "16384", want_rc=2)
check("longer than its attention chunk (attn_chunk 8192" in p.stderr, f"seq 16384 on Scout: {p.stderr.strip()}")
for name in ("llama4-scout-17b-16e", "llama4-maverick-17b-128e"):
    p = run("train", "--model", name, "--steps", "1", want_rc=2)
    check("Llama 4's chunked attention" in p.stderr, f"train does not refuse {name} by name: {p.stderr.strip()[:300]}")

# Nemotron-4's MLP and norms are the runtime's to refuse by name: train exits 2 with the
# reason, plan marks every plan runs: no.
p = run("train", "--model", "nemotron4-15b", "--steps", "1", want_rc=2)
check("squared-ReLU MLP and LayerNorms are not implemented in the runtime" in p.stderr,
      f"train does not refuse Nemotron-4 by name: {p.stderr.strip()[:300]}")
p = run("plan", "--model", "nemotron4-15b", "--gpus", "8", "--gpu", "h100-sxm", "--no-db")
rows = [l for l in p.stdout.splitlines() if l.strip()[:1].isdigit() and l.rstrip().endswith((" no", " yes"))]
check(len(rows) > 0 and all(r.rstrip().endswith(" no") for r in rows),
      "every Nemotron-4 plan should be runs: no")

# Megatron-LM's arguments say its MLP and norms (arguments.py, core_v0.14.0: --squared-relu,
# --normalization LayerNorm), never --swiglu.
out = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
p = run("simulate", "--model", "nemotron4-15b", "--gpus", "8", "--gpu", "h100-sxm", "--mesh", "dp_shard=8",
        "--stack", "megatron-core", "--seq", "4096", "--emit", "megatron", "--out", out)
path = os.path.join(out, "plan.args")
text = open(path).read() if os.path.exists(path) else ""
check("--squared-relu\n" in text and "--normalization LayerNorm\n" in text and "--swiglu" not in text,
      f"--emit megatron does not write Nemotron-4's MLP and norms: {text[:600]}")

for f in fails:
    print("FAIL:", f)
print(f"{len(fails)} failures")
sys.exit(1 if fails else 0)
