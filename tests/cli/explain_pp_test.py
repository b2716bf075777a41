#!/usr/bin/env python3
"""meshplan explain's pipeline section against hand-derived figures: the layer split over the
model chunks, the rank's warm-up and in-flight chunks in the stack's schedule implementation,
the bubble of equal stages and the bytes at a stage boundary; --pp-schedule and --pp-virtual;
and, in explain and simulate alike, the micro-batching a stack states for its pipelines.

Usage: explain_pp_test.py MESHPLAN"""
import json
import os
import sys

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]

# Llama 3.1 405B (126 layers, d_model 16384) as torchtitan's Table 5 ran it: pp=8, tp=8 with
# SP, local batch 32 in 8 micro-batches of 4 x 8192 tokens. 16 chunks: 126 / 16 = 7 and 14 left
# over, one each to chunks 1..14: 7, 8 x 14, 7. The last rank (stage 7) holds chunks 7 (layers
# 7 + 6 x 8 ... = 55-62) and 15 (119-125). torch.distributed.pipelining warms it up with
# (v - 1) x pp + 0 = 8 forwards, the first steady forward makes 9 before a backward, and 9
# chunks held at most; Megatron-LM's order runs all 16 forwards first when m == pp. Bubble
# (pp - 1) / (v m) = 7 / 16 = 0.4375. The boundary: 4 x 8192 / 8 tokens x 16384 x 2 bytes =
# 134,217,728 = 128 MiB.
base = ["explain", "--model", "llama3.1-405b", "--gpus", "512", "--gpu", "h100-96gb-500w",
        "--mesh", "pp=8,dp_shard=8,tp=8", "--pp-schedule", "interleaved", "--micro-batch", "4",
        "--global-batch", "256", "--ac", "full", "--rank", "511"]
p = run(*base)
check(p.returncode == 0, "405B interleaved: explain failed: " + p.stderr)
check("interleaved 1F1B x2 as torch.distributed.pipelining runs it (stack torchtitan-compile), "
      "8 micro-batches a step; layers 7, 8 x 14, 7 over the 16 model chunks" in p.stdout,
      "405B interleaved: the schedule, micro-batches or split")
check("rank 511 (stage 7) holds layers 55-62 and 119-125, runs 9 forwards before its first backward "
      "and holds at most 9 chunk activations" in p.stdout, "405B interleaved: the last rank's warm-up")
check("(pp - 1) / (v m) = 0.438" in p.stdout, "405B interleaved: the bubble")
check("128.00 MiB a micro-batch each way" in p.stdout, "405B interleaved: the boundary bytes")
# Megatron-LM replicates parameters over data parallelism: the same pipeline on dp_replicate
mg_base = [a if a != "pp=8,dp_shard=8,tp=8" else "pp=8,dp_replicate=8,tp=8" for a in base]
p = run(*mg_base, "--stack", "megatron-lm", "--gpu", "a100-80gb-sxm")
check("as Megatron-LM runs it" in p.stdout and "runs 16 forwards before its first backward and holds "
      "at most 16 chunk activations" in p.stdout, "405B interleaved, Megatron-LM: every forward first")
p = run(*base, "--json")
if p.returncode == 0:
    pl = json.loads(p.stdout).get("pipeline", {})
    check(pl.get("chunk_layers") == [7] + [8] * 14 + [7], "--json chunk_layers")
    check(pl.get("warmup_forwards") == 9 and pl.get("max_chunks_in_flight") == 9, "--json warm-up")
    check(pl.get("order") == "torch" and pl.get("pp_virtual") == 2 and pl.get("n_micro") == 8,
          "--json order, chunks, micro-batches")
    check(pl.get("boundary_bytes") == 134217728, "--json boundary bytes")

# 1F1B on 8B (32 layers) over pp=4 without TP, 8 sequences a rank in micro-batches of 1: 8
# layers a stage, rank 0 runs pp - 0 = 4 forwards and holds 4 micro-batches; bubble 3 / 8;
# the boundary [8192, 4096] bf16 = 64 MiB.
p = run("explain", "--model", "llama3.1-8b", "--mesh", "pp=4,dp_shard=2", "--global-batch", "16",
        "--micro-batch", "1")
check("pp=4, 1F1B as torch.distributed.pipelining runs it" in p.stdout and "layers 8 x 4 over the 4 "
      "model chunks; rank 0 (stage 0) holds layers 0-7, runs 4 forwards before its first backward "
      "and holds at most 4 chunk activations" in p.stdout, "8B 1F1B: split or warm-up")
check("(pp - 1) / m = 0.375" in p.stdout and "[T, H] bf16 activation" in p.stdout and
      "64.00 MiB a micro-batch" in p.stdout, "8B 1F1B: bubble or boundary")
check("the remainder" not in p.stdout, "an even split says nothing of a remainder")

# Without --micro-batch, torchtitan's profiles split the local batch into pp micro-batches
# (its pipeline_parallel_microbatches default): 256 over dp_shard 8 is 32 a rank, 8 of 4.
# Megatron-LM's micro-batch is a required setting, so its profile keeps the default 1; an
# explicit --micro-batch wins.
tt = ["--model", "llama3.1-405b", "--gpus", "512", "--gpu", "h100-96gb-500w", "--mesh",
      "pp=8,dp_shard=8,tp=8", "--ac", "full", "--global-batch", "256"]
for cmd in ("explain", "simulate"):
    p = run(cmd, *tt)
    check("32 sequences per data-parallel rank as 8 micro-batches of 4: stack torchtitan-compile" in p.stdout,
          cmd + ": torchtitan's pipeline micro-batching not taken or not said")
    p = run(cmd, *tt, "--micro-batch", "2")
    check("micro-batches of 4" not in p.stdout and "micro-batch 2" in p.stdout.replace("micro-batches of 2", "micro-batch 2"),
          cmd + ": an explicit --micro-batch must win")
p = run("simulate", *tt)
check("micro-batch 4, global batch 256" in p.stdout, "simulate: the plan line's micro-batch")
mg = ["--model", "gpt3-175b", "--gpus", "64", "--gpu", "a100-80gb-sxm", "--stack", "megatron-lm", "--mesh",
      "pp=8,tp=8", "--seq", "2048", "--global-batch", "64"]
p = run("simulate", *mg)
check("micro-batch 1, global batch 64" in p.stdout and "splits the local batch" not in p.stdout,
      "simulate, Megatron-LM: the micro-batch stays 1")

# refusals: an unknown schedule, and the interleaved schedule's groups of pp micro-batches
p = run("explain", "--pp-schedule", "zigzag", want_rc=2)
check(p.returncode == 2 and "choose 1f1b, interleaved, gpipe, dualpipe, zbv or interleaved_zb" in p.stderr,
      "unknown --pp-schedule")
p = run("explain", "--model", "llama3.1-8b", "--mesh", "pp=4,dp_shard=2", "--pp-schedule", "interleaved",
        "--global-batch", "12", want_rc=2)
check(p.returncode == 2 and "groups of pp=4" in p.stderr, "interleaved with 6 micro-batches on pp=4")
# DualPipe (deepseek-ai/DualPipe) on Llama-3.1-8B, pp=4 x dp_shard=2, 8 micro-batches a replica:
# rank 0 (half_rank 0 of 2) runs 2 (2 - 0 - 1) = 2 forwards of its direction, then one of each
# (4 in all) before its first backward, holds pp + 1 = 5 at most, and also runs stage 3's layers
# 24-31 for the micro-batches entering at the last stage. Bubble (pp / 2 - 1)(F&B + B) over
# m (F + B) with F = B and nothing hidden: 1 x 3 / 16 = 0.1875.
p = run("explain", "--model", "llama3.1-8b", "--mesh", "pp=4,dp_shard=2", "--pp-schedule", "dualpipe",
        "--global-batch", "16", "--micro-batch", "1", "--ac", "full")
check(p.returncode == 0, "dualpipe: explain failed: " + p.stderr)
check("DualPipe as deepseek-ai/DualPipe runs it" in p.stdout and "holds layers 0-7, runs 4 forwards before "
      "its first backward and holds at most 5 chunk activations" in p.stdout, "dualpipe: the first rank's order")
check("(pp / 2 - 1)(F&B + B) / (m (F + B)) = 0.188" in p.stdout, "dualpipe: the bubble")
check("through layers 24-31 (stage 3's)" in p.stdout, "dualpipe: the rank's second stage")
p = run("explain", "--model", "llama3.1-8b", "--mesh", "pp=4,dp_shard=2", "--pp-schedule", "dualpipe",
        "--global-batch", "12", "--micro-batch", "1", want_rc=2)
check(p.returncode == 2 and "at least 2 x pp" in p.stderr, "dualpipe with 6 micro-batches on pp=4")
# ZBV (torch's ScheduleZBVZeroBubble) on Llama-3.1-8B, pp=4 x dp_shard=2, 8 micro-batches a
# replica: 8 chunks of 4 layers in a V, rank 0 holding model chunks 0 and 7 (layers 0-3 and
# 28-31); it runs 2 x 4 - 1 = 7 forwards of chunk 0 and one of chunk 1 before its first B, and
# holds 2 pp = 8 chunks until their W's. Bubble with F = B = W: the fill, (pp - 1) F over a
# busy v m (F + B + W): 3 / (3 x 2 x 8) = 0.0625. Torch's class name reads as the same.
for name in ("zbv", "ZBVZeroBubble"):
    p = run("explain", "--model", "llama3.1-8b", "--mesh", "pp=4,dp_shard=2", "--pp-schedule", name,
            "--global-batch", "16", "--micro-batch", "1", "--ac", "full")
    check(p.returncode == 0, "zbv: explain failed: " + p.stderr)
    check("ZBV zero bubble (2 chunks a rank in a V)" in p.stdout and "holds layers 0-3 and 28-31, runs 8 forwards "
          "before its first backward and holds at most 8 chunk activations" in p.stdout, "zbv: rank 0's order")
    check("(pp - 1) / (3 v m) with F = B = W = 0.062" in p.stdout, "zbv: the bubble")
# the interleaved zero-bubble schedule takes fewer micro-batches than pp (torch's one round of
# m): 2 on pp=4 x 2 chunks, stage 0 warms up with min((v - 1) m + pp - 1, m v) = min(5, 4) = 4
# forwards, every chunk step, and holds all 4
p = run("explain", "--model", "llama3.1-8b", "--mesh", "pp=4,dp_shard=2", "--pp-schedule", "interleaved_zb",
        "--global-batch", "4", "--micro-batch", "1", "--ac", "full")
check(p.returncode == 0 and "runs 4 forwards before its first backward and holds at most 4 chunk activations"
      in p.stdout, "interleaved_zb with 2 micro-batches on pp=4: " + p.stderr)
# 9 micro-batches make 2 rounds, which torch refuses
p = run("explain", "--model", "llama3.1-8b", "--mesh", "pp=4,dp_shard=2", "--pp-schedule", "interleaved_zb",
        "--global-batch", "18", "--micro-batch", "1", want_rc=2)
check(p.returncode == 2 and "choose a multiple of 2 micro-batches" in p.stderr, "interleaved_zb with 9 micro-batches")
# DeepSeek-V3's other two mechanisms refuse what they cannot be
p = run("simulate", "--model", "qwen3-30b-a3b", "--mesh", "dp_shard=8,ep=8", "--moe-fp8-dispatch", want_rc=2)
check(p.returncode == 2 and "float8 dispatch" in p.stderr, "float8 dispatch without --fp8")
p = run("simulate", "--model", "qwen3-30b-a3b", "--mesh", "dp_shard=8,ep=8", "--recompute-modules", "shared_experts",
        want_rc=2)
check(p.returncode == 2 and "has no shared experts" in p.stderr, "recompute module shared_experts")
# explain says what the whole-module recompute does (exec/pass_ac.c's note)
p = run("explain", "--model", "qwen3-30b-a3b", "--gpus", "8", "--mesh", "dp_replicate=4,ep=4,tp=2", "--stack",
        "megatron-core", "--recompute-modules", "moe,layernorm")
check(p.returncode == 0 and "recompute modules layernorm moe: the output-discarding ones" in p.stdout
      and "the checkpointed ones keep their input and re-run their forward, collectives included" in p.stdout,
      "explain: the recompute modules' note")
p = run("simulate", "--model", "llama3.1-8b", "--recompute-modules", "mla_up_proj", want_rc=2)
check(p.returncode == 2 and "no multi-head latent attention" in p.stderr, "mla_up_proj without MLA")
# DeepSeek-V3's low-precision storage (sec. 3.3.3): the activation cache needs the blockwise
# recipe under megatron-core, the moments take fp32 or bf16, and bf16 moments halve the
# optimizer state the simulator reports
p = run("simulate", "--model", "qwen3-30b-a3b", "--mesh", "dp_shard=8,ep=8", "--fp8", "--fp8-act-cache",
        want_rc=2)
check(p.returncode == 2 and "activation cache" in p.stderr, "activation cache under torchtitan's recipe")
p = run("simulate", "--model", "llama3.1-8b", "--optimizer-moments", "fp16", want_rc=2)
check(p.returncode == 2 and "choose fp32 or bf16" in p.stderr, "fp16 moments")
mem = {}
for d in ("fp32", "bf16"):
    p = run("simulate", "--model", "llama3.1-8b", "--stack", "megatron-core", "--mesh", "dp_replicate=8",
            "--optimizer-moments", d, "--json")
    if p.returncode == 0:
        mem[d] = json.loads(p.stdout)
if len(mem) == 2:
    check(mem["bf16"].get("optimizer_moments") == "bf16" and "optimizer_moments" not in mem["fp32"],
          "optimizer_moments in the JSON")
    got = mem["fp32"]["mem_at_peak_bytes"]["optimizer"], mem["bf16"]["mem_at_peak_bytes"]["optimizer"]
    check(got[0] == 2 * got[1] > 0, f"bf16 moments halve the optimizer state: {got}")
else:
    check(False, "simulate --optimizer-moments fp32|bf16 ran")

# FSDP's reduction dtype: bf16 as FSDP1's MixedPrecision runs it (IBM's fms-fsdp), refused by name
# by the torchtitan emit; under HSDP over 2 nodes (Llama 3.1 8B,
# dp_shard 8 a node) the gradient collectives carry half the bytes, so the reduce stream's busy
# time halves (the same alpha-beta links, the per-collective latency aside) and the step is no slower
hsdp = ["simulate", "--model", "llama3.1-8b", "--gpus", "16", "--mesh", "dp_replicate=2,dp_shard=8", "--json"]
p = run("simulate", "--model", "llama3.1-8b", "--fsdp-reduce-dtype", "fp16", want_rc=2)
check(p.returncode == 2 and "choose fp32 or bf16" in p.stderr, "fp16 FSDP reduction")
# under Megatron's DDP it is --grad-reduce-in-bf16: the main_grad buffer (8,030,261,248
# parameters, whole on each rank) at 2 bytes a parameter where fp32 keeps 4
grads = {}
for d in ("fp32", "bf16"):
    p = run("simulate", "--model", "llama3.1-8b", "--stack", "megatron-core", "--mesh", "dp_replicate=8",
            "--fsdp-reduce-dtype", d, "--json")
    if p.returncode == 0:
        grads[d] = json.loads(p.stdout)["mem_at_peak_bytes"]["grads"]
check(grads.get("fp32") == 4 * 8030261248 and grads.get("bf16") == 2 * 8030261248,
      f"bf16 main gradients under Megatron's DDP: {grads}")
p = run("simulate", "--model", "llama3.1-8b", "--fsdp-reduce-dtype", "bf16", "--emit", "torchtitan",
        "--out", os.path.join(os.environ.get("TEST_TMPDIR", "/tmp"), "emit-refused"), want_rc=2)
check(p.returncode == 2 and "mixed_precision_reduce" in p.stderr, "emit torchtitan with bf16 reduction: " + p.stderr)
red = {}
for d in ("fp32", "bf16"):
    p = run(*hsdp, "--fsdp-reduce-dtype", d)
    if p.returncode == 0:
        red[d] = json.loads(p.stdout)
if len(red) == 2:
    check(red["bf16"].get("fsdp_reduce_dtype") == "bf16" and "fsdp_reduce_dtype" not in red["fp32"],
          "fsdp_reduce_dtype in the JSON")
    r32, r16 = red["fp32"]["comm_s"]["reduce"], red["bf16"]["comm_s"]["reduce"]
    check(0.45 * r32 < r16 < 0.55 * r32, f"bf16 reduction halves the reduce stream: {r32} -> {r16}")
    check(red["bf16"]["step_time_s"] <= red["fp32"]["step_time_s"], "bf16 reduction is no slower")
else:
    check(False, "simulate --fsdp-reduce-dtype fp32|bf16 ran")

# no pipeline, no section
p = run("explain", "--model", "llama3.1-8b", "--json")
if p.returncode == 0:
    check("pipeline" not in json.loads(p.stdout), "pp=1 should have no pipeline section")

for f in fails:
    print("FAIL:", f)
print(f"explain_pp_test: {len(fails)} failures")
sys.exit(1 if fails else 0)
