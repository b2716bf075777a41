#!/usr/bin/env python3
"""Nemotron-H's per-GPU memory under NeMo's recommended H100 layouts
(scripts/performance/recommended_model_configs/model_configs_h100.csv at NeMo 8cfedd7: 8B on 8
GPUs TP 1, 47B and 56B on 64 GPUs TP 8; MBS 1, seq 8192, fp8, cuda_graphs 1, no recompute)
through the binary, with the settings NeMo's perf scripts give them: the distributed fused Adam
(recipes/optim/adam.py: use_distributed_optimizer), bf16_with_fp8_mixed (delayed scaling,
fp8_param_gather True: recipes/precision/mixed_precision.py), grad_reduce_in_fp32 False
(scripts/performance/helpers.py, set_precision_configs) and Transformer Engine's cross-entropy
(helpers.py, set_perf_optimization_configs: cross_entropy_fusion_impl "te", with SSMConfig's
cross_entropy_loss_fusion True). The 8B's peak is derived by hand below; the
--cross-entropy-fusion-impl option's refusals.

Usage: hybrid_memory_cli_test.py MESHPLAN"""
import json
import os
import sys
import tempfile

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]

RECIPE = ["--fp8", "--cuda-graphs", "layers", "--stack", "megatron-core", "--seq", "8192", "--micro-batch", "1",
          "--fp8-param-gather", "--fsdp-reduce-dtype", "bf16", "--cross-entropy-loss-fusion",
          "--cross-entropy-fusion-impl", "te"]


def simulate(model, gpus, mesh, gbs, extra):
    p = run("simulate", "--model", model, "--gpus", str(gpus), "--mesh", mesh, "--global-batch", str(gbs),
            *extra, "--json")
    return json.loads(p.stdout)


# Nemotron-H 8B, N = 8,100,852,736 parameters (tests/schedule/hybrid_test.cc), of which the
# float8 Linears' F = 24 x (76,021,760 + 33,554,432) (Mamba in_proj, out_proj) + 4 x 41,943,040
# (q, k, v, o) + 24 x 176,160,768 (up, down) = 7,025,459,200; dp 8, T = 8192 tokens:
#   params      F x 1 (float8 model weights) + (N - F) x 2 + N x 4 / 8 (fp32 masters' shard)
#               = 7,025,459,200 + 2,150,787,072 + 4,050,426,368 = 13,226,672,640
#   optimizer   N x 8 / 8 (Adam's two fp32 moments' shard) = 8,100,852,736
#   grads       N x 2 (the bf16 main_grad buffer, whole on each rank) = 16,201,705,472
#   fp8         F x 1 (Transformer Engine's transposed copies, Hopper) = 7,025,459,200
#   activations T x 4,160,976 (the layers' bytes a token, hybrid_test.cc) + the head's final
#               norm input 2TH, rstd 4T and GEMM input 2TH = 34,086,715,392 + 134,250,496
#               = 34,220,965,888
#   logits      2 T V, the bf16 logits holding their own gradient = 2,147,483,648
# allocated 80,923,139,584 (75.37 GiB) + the 2.5 GiB runtime overhead = 83,607,494,144 bytes
# (77.87 GiB)
WANT_8B = {"params": 13226672640, "optimizer": 8100852736, "grads": 16201705472, "fp8": 7025459200,
           "activations": 34220965888, "logits": 2147483648}
r = simulate("nemotron-h-8b", 8, "dp_replicate=8", 128, RECIPE)
at = r["mem_at_peak_bytes"]
for k, v in WANT_8B.items():
    check(at.get(k) == v, f"8B {k}: {at.get(k)} != {v}")
alloc = sum(WANT_8B.values())
check(r["peak_mem_bytes"] == alloc + int(2.5 * 2**30), f"8B peak {r['peak_mem_bytes']} != {alloc} + 2.5 GiB")
# 77.87 GiB: inside the H100's 80 GiB, beyond the 5 % headroom simulate keeps by default (76 GiB)
check(not r["fits"] and r["capacity_bytes"] == int(80 * 0.95 * 2**30), "8B against 76 GiB")
r0 = simulate("nemotron-h-8b", 8, "dp_replicate=8", 128, RECIPE + ["--headroom", "0"])
check(r0["fits"] and r0["peak_mem_bytes"] <= 80 * 2**30, f"8B within 80 GiB: {r0['peak_mem_bytes']}")

# Megatron-Core's native fused cross-entropy instead keeps an fp32 copy of the logits, the
# softmax turned into the gradient in place (4 T V), beside the bf16 logits at the loss:
# 2 T V + 4 T V = 6,442,450,944 at the peak.
native = [a for a in RECIPE if a not in ("--cross-entropy-fusion-impl", "te")]
r1 = simulate("nemotron-h-8b", 8, "dp_replicate=8", 128, native)
check(r1["mem_at_peak_bytes"]["logits"] == 6 * 8192 * 131072, f"native logits {r1['mem_at_peak_bytes']}")
check(r1["peak_mem_bytes"] - r["peak_mem_bytes"] == 4 * 8192 * 131072, "te spares the fp32 copy, 4 T V")

# 47B and 56B at TP 8 with SP fit the H100's 76 GiB with room to spare.
for model in ("nemotron-h-47b", "nemotron-h-56b"):
    r = simulate(model, 64, "dp_replicate=8,tp=8", 192, RECIPE)
    check(r["fits"] and r["peak_mem_bytes"] < 60 * 2**30, f"{model}: {r['peak_mem_bytes'] / 2**30:.2f} GiB")

# --cross-entropy-fusion-impl picks --cross-entropy-loss-fusion's kernels: refused without it,
# refused for another name, written back by --emit megatron.
base = ["simulate", "--model", "tiny-hybrid", "--gpus", "1", "--mesh", "dp_shard=1", "--stack", "megatron-core",
        "--seq", "64"]
p = run(*base, "--cross-entropy-fusion-impl", "te", want_rc=2)
check("picks the kernels of --cross-entropy-loss-fusion" in p.stderr, f"impl alone: {p.stderr.strip()}")
p = run(*base, "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "liger", want_rc=2)
check("choose native or te" in p.stderr, f"impl liger: {p.stderr.strip()}")
out = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))
base[2] = "tiny-dense"  # meshplan writes no Megatron-LM arguments for Mamba-2 layers
run(*base, "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te", "--emit", "megatron", "--out", out)
path = os.path.join(out, "plan.args")
text = open(path).read() if os.path.exists(path) else ""
check("--cross-entropy-loss-fusion\n--cross-entropy-fusion-impl te\n" in text, f"--emit megatron: {text[:400]}")
# read back by --from-args: the same plan, the same logits memory
args = " ".join(l for l in text.splitlines() if not l.startswith("#")).split()
direct = json.loads(run(*base, "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te", "--json").stdout)
back = json.loads(run("simulate", "--gpus", "1", "--from-args", " ".join(args), "--json").stdout)
check(back["peak_mem_bytes"] == direct["peak_mem_bytes"] and back["step_time_s"] == direct["step_time_s"],
      f"--from-args: {back['peak_mem_bytes']} {back['step_time_s']} != {direct['peak_mem_bytes']} {direct['step_time_s']}")

for f in fails:
    print("FAIL:", f)
print(f"{len(fails)} failures")
sys.exit(1 if fails else 0)
