#!/usr/bin/env python3
"""meshplan explain's context-parallel section against hand-derived figures: the chunks a rank
holds, the K and V it contributes to the ring's all-gather, the gathered total and the fp32
dK, dV it passes on; the alltoall rotate method's shifts and what they hold; Megatron-LM's
ring of grouped K and V and its all_gather and a2a forms (--cp-comm-type); --cp-rotate's refusals. Then the same sizes in what the schedule
prices (exec/schedule_cp.c): each layer's CP collectives in `explain --schedule --json`, their
pass, kind, payload, count and stream.

Usage: explain_cp_test.py MESHPLAN"""
import json
import sys

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]

# Llama 3.1 8B, seq 32768 over cp=4: 8 chunks of 4096, a rank holds 2 of them = 8192 tokens.
# torchtitan expands K and V to the 32 query heads: 2 bytes x 8192 x (4096 + 4096) =
# 134,217,728 = 128 MiB a rank, 4 x that gathered, the fp32 gradients twice that.
p = run("explain", "--model", "llama3.1-8b", "--gpus", "8", "--mesh", "dp_shard=2,cp=4", "--seq", "32768")
check("rank i holding chunks i and 7 - i (8192 tokens a micro-batch)" in p.stdout,
      "8B cp=4: chunks or tokens a rank missing from explain")
check("expanded to every query head, all-gathered on the CP group once per pass (128.00 MiB a rank, "
      "512.00 MiB gathered" in p.stdout, "8B cp=4: the gathered K, V sizes")
check("the fp32 dK, dV (256.00 MiB)" in p.stdout, "8B cp=4: the dK, dV size")
p = run("explain", "--model", "llama3.1-8b", "--gpus", "8", "--mesh", "dp_shard=2,cp=4", "--seq", "32768",
        "--json")
if p.returncode == 0:
    check("128.00 MiB a rank" in json.loads(p.stdout).get("context_parallel", ""),
          "8B cp=4: --json has no context_parallel note")
p = run("explain", "--model", "llama3.1-8b", "--gpus", "8", "--json")
if p.returncode == 0:
    check("context_parallel" not in json.loads(p.stdout), "cp=1 should have no context_parallel note")

# DeepSeek-V2-Lite (MLA, 16 heads), seq 8192 over cp=2: 4096 tokens a rank; K is 16 x 192 =
# 3072 wide and V 16 x 128 = 2048, nothing to expand: 2 x 4096 x 5120 = 41,943,040 = 40 MiB.
p = run("explain", "--model", "deepseek-v2-lite", "--gpus", "8", "--mesh", "dp_shard=4,cp=2", "--seq", "8192")
check("K and V at their decompressed widths, all-gathered on the CP group once per pass (40.00 MiB a "
      "rank, 80.00 MiB gathered" in p.stdout, "V2-Lite cp=2: the decompressed K, V sizes")
check("repeat_kv" not in p.stdout, "V2-Lite: MLA has no repeat_kv")

# The alltoall rotate method (torchtitan's other context_parallel_rotate_method): the same
# 128 MiB a rank shifted before every step but the last; at cp=4 the K, V in use, the copy
# sent and the one arriving are held, 3 x 128 MiB; at cp=2 two (only step 0 sends).
for cp, held in ((4, "384.00 MiB"), (2, "256.00 MiB")):
    p = run("explain", "--model", "llama3.1-8b", "--gpus", "8", "--mesh", "dp_shard=%d,cp=%d" % (8 // cp, cp),
            "--seq", str(8192 * cp), "--cp-rotate", "alltoall")
    check("copied and passed to the next rank before every step but the last" in p.stdout and
          "(%s held" % held in p.stdout and "alltoall rotate method" in p.stdout,
          "8B cp=%d alltoall: the shifted K, V and what is held" % cp)
    check("all-gathered" not in p.stdout, "8B cp=%d alltoall: no all-gather" % cp)
# a rotate method that does not exist, and the runtimes' own ring: refused, exit 2
p = run("explain", "--mesh", "dp_shard=4,cp=2", "--cp-rotate", "ring", want_rc=2)
check("--cp-rotate 'ring': choose allgather or alltoall" in p.stderr,
      "explain --cp-rotate ring: refused with the two names")
p = run("simulate", "--model", "tiny-dense", "--gpus", "2", "--gpu", "cpu", "--mesh", "cp=2", "--stack", "meshplan-cpu",
        "--cp-rotate", "alltoall", want_rc=2)
check("stack meshplan-cpu runs meshplan's own" in p.stderr,
      "simulate --cp-rotate under meshplan-cpu: refused")
# simulate takes it and predicts the ring's shifts (the default allgather otherwise)
a = run("simulate", "--model", "llama3.1-8b", "--gpus", "8", "--mesh", "dp_shard=2,cp=4", "--seq", "32768", "--json")
b = run("simulate", "--model", "llama3.1-8b", "--gpus", "8", "--mesh", "dp_shard=2,cp=4", "--seq", "32768", "--json",
        "--cp-rotate", "alltoall")
if a.returncode == 0 and b.returncode == 0:
    ja, jb = json.loads(a.stdout), json.loads(b.stdout)
    check(ja["step_time_s"] != jb["step_time_s"], "simulate --cp-rotate alltoall: the same step as allgather")
else:
    check(False, "simulate with --cp-rotate failed: " + a.stderr + b.stderr)

# Megatron-LM (--stack megatron-lm): Transformer Engine's p2p ring passes the grouped K and V,
# 8 kv heads x 128 = 1024 wide each: 2 x 8192 x (1024 + 1024) = 33,554,432 = 32 MiB a rank at
# seq 32768 over cp=4, every step's kept until the pass ends (4 x 32 = 128 MiB, as
# Transformer Engine's p2p_comm_buffers list holds them), the fp32 gradients twice that; explain and
# simulate build the plan the stack runs, so both refuse FSDP and PyTorch's ring's rotate method there
# (Megatron-Core's form is --cp-comm-type).
mg = ["--model", "llama3.1-8b", "--gpus", "8", "--gpu", "a100-80gb-sxm", "--stack", "megatron-lm",
      "--seq", "32768"]
p = run("explain", *mg, "--mesh", "dp_replicate=2,cp=4")
check("K and V of the kv heads (32.00 MiB a rank), passed to the next rank before every "
      "step but the last" in p.stdout and "(128.00 MiB held" in p.stdout and
      "the fp32 dK, dV (64.00 MiB)" in p.stdout and "all-reduced over dp_replicate x cp" in p.stdout,
      "8B cp=4 under Megatron-LM: the grouped K, V and the gradient all-reduce")
for cmd in ("explain", "simulate"):
    p = run(cmd, *mg, "--mesh", "dp_shard=2,cp=4", want_rc=2)
    check("use dp_replicate=2 instead of dp_shard=2" in p.stderr, cmd + " --stack megatron-lm on dp_shard: refused")
    p = run(cmd, *mg, "--mesh", "dp_replicate=2,cp=4", "--cp-rotate", "allgather", want_rc=2)
    check("choose its form with --cp-comm-type p2p, all_gather or a2a" in p.stderr,
          cmd + " --stack megatron-lm --cp-rotate allgather: refused")

# What the schedule prices (exec/schedule_cp.c), op by op, not explain's prose: the CP group's
# collectives of one layer in `explain --schedule --json`, against the sizes derived above.
# Per layer, at seq 32768 over cp=4 (8192 tokens a rank):
#   torchtitan, allgather: forward one all-gather of the 4 ranks' expanded K, V, 4 x 128 MiB =
#     536,870,912 B, backward the same once more (K, V gathered again for the backward pass),
#     and the fp32 dK, dV, 8192 x (4096 + 4096) x 4 = 268,435,456 B, passed on after each of
#     the 4 backward steps; compiled with the block (torchtitan-compile, the H100's default):
#     every transfer on the compute stream;
#   torchtitan, alltoall: the 128 MiB K, V shifted before every step but the last, 3 in
#     forward and 3 in backward, beside the 4 dK, dV shifts;
#   Megatron-LM: the grouped K, V, 8192 x (1024 + 1024) x 2 = 33,554,432 B, 3 shifts a pass,
#     the fp32 dK, dV 67,108,864 B 4 times, on Transformer Engine's own (p2p) stream.
def cp_ops(*args):
    p = run("explain", *args, "--schedule", "--json")
    if p.returncode != 0:
        return None
    ops = json.loads(p.stdout)["schedule"]["ops"]
    per_layer = {}
    for o in ops:
        if o.get("group") == "cp":
            k = (o["phase"], o["coll"], o["bytes"], o["stream"])
            per_layer.setdefault(o["layer"], {})
            per_layer[o["layer"]][k] = per_layer[o["layer"]].get(k, 0) + (o.get("count") or 1)
    return per_layer


base = ["--model", "llama3.1-8b", "--gpus", "8", "--mesh", "dp_shard=2,cp=4", "--seq", "32768"]
for args, want in (
        (base, {("forward", "all_gather", 536870912, "compute"): 1,
                ("backward", "all_gather", 536870912, "compute"): 1,
                ("backward", "sendrecv", 268435456, "compute"): 4}),
        (base + ["--cp-rotate", "alltoall"], {("forward", "sendrecv", 134217728, "compute"): 3,
                                              ("backward", "sendrecv", 134217728, "compute"): 3,
                                              ("backward", "sendrecv", 268435456, "compute"): 4}),
        (mg + ["--mesh", "dp_replicate=2,cp=4"], {("forward", "sendrecv", 33554432, "p2p"): 3,
                                                   ("backward", "sendrecv", 33554432, "p2p"): 3,
                                                   ("backward", "sendrecv", 67108864, "p2p"): 4}),
        # Megatron-Core's all_gather: the grouped K and V gathered apiece, 4 x 8192 x 1024 x 2 =
        # 67,108,864 B each, in forward and again in backward, dK and dV reduce-scattered from as
        # many, every one waited for where it is issued (the compute stream)
        (mg + ["--mesh", "dp_replicate=2,cp=4", "--cp-comm-type", "all_gather"],
         {("forward", "all_gather", 67108864, "compute"): 2, ("backward", "all_gather", 67108864, "compute"): 2,
          ("backward", "reduce_scatter", 67108864, "compute"): 2}),
        # a2a: Q (8192 x 4096 x 2 = 67,108,864 B), K and V (16,777,216 B each) and the output
        # (67,108,864 B); backward the output, its gradient and dQ (67,108,864 B), dK and dV
        (mg + ["--mesh", "dp_replicate=2,cp=4", "--cp-comm-type", "a2a"],
         {("forward", "all_to_all", 67108864, "compute"): 2, ("forward", "all_to_all", 16777216, "compute"): 2,
          ("backward", "all_to_all", 67108864, "compute"): 3, ("backward", "all_to_all", 16777216, "compute"): 2})):
    got = cp_ops(*args)
    what = " ".join(a for a in args if a.startswith("--") is False)[-60:]
    check(got is not None and sorted(got) == list(range(32)),
          "schedule of %s: the CP ops of 32 layers (got layers %s)" % (what, sorted(got) if got else None))
    if got:
        bad = {l: v for l, v in got.items() if v != want}
        check(not bad, "schedule of %s: per layer %s, want %s" % (what, next(iter(bad.values()), None), want))

# simulate names the form it priced, and the forms differ in step time; plan prices its plans so
p = {c: run("simulate", *mg, "--mesh", "dp_replicate=2,cp=4", "--cp-comm-type", c, "--json") for c in ("p2p", "all_gather", "a2a")}
if all(x.returncode == 0 for x in p.values()):
    j = {c: json.loads(x.stdout) for c, x in p.items()}
    check(all(j[c].get("cp_comm_type") == c for c in j), "simulate --json: cp_comm_type not the one asked for")
    check(len({j[c]["step_time_s"] for c in j}) == 3, "simulate: the three cp comm types price the same step")
pl = run("plan", "--no-db", "--model", "llama3.1-8b", "--gpus", "16", "--stack", "megatron-core", "--seq", "131072",
         "--cp-comm-type", "all_gather")
check("stack megatron-core with cp comm type all_gather" in pl.stdout, "plan --cp-comm-type: not named: " + pl.stdout[:300])

for f in fails:
    print("FAIL:", f)
print(f"explain_cp_test: {len(fails)} failures")
sys.exit(1 if fails else 0)
