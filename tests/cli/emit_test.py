#!/usr/bin/env python3
"""meshplan's plans as framework configurations and back (app/emit.h, app/from_config.h):

- the files `simulate --emit` writes, against hand-derived content: a torchtitan v0.2.0 TOML
  (keys of torchtitan/config/job_config.py at tag v0.2.0) and Megatron-LM core_v0.14.0
  arguments (megatron/training/arguments.py at that tag), each headed by the prediction;
- round trips: for plans across tp/sp, interleaved pipelines, cp, FSDP with and without
  resharding, float8 recipes, AC policies, MoE with ep and two stacks per framework, the
  prediction of `simulate --from FILE` is the prediction the file was emitted with, field for
  field in --json; --from-args, explain --from and plan --from agree with it;
- plan --emit: the best plan (and --top K's K) written with the figures of its table row;
- a hand-written torchtitan TOML read with torchtitan's defaults (dp_shard -1, AC selective 2);
- the note listing the keys ignored as cost-free.
The refusals (with their one-line messages) are rows of hostile_cli_test.sh.

Usage: emit_test.py MESHPLAN"""
import json
import os
import sys
import tempfile

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]
tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


def emitted(target, *args):
    """simulate ARGS --emit TARGET: (its --json prediction, the file's text)."""
    out = os.path.join(tmp, target)
    os.makedirs(out, exist_ok=True)
    p = run("simulate", *args, "--emit", target, "--out", out, "--json")
    path = os.path.join(out, "plan." + ("toml" if target == "torchtitan" else "args"))
    if p.returncode != 0 or not os.path.exists(path):
        return None, ""
    return json.loads(p.stdout), open(path).read()


def body(text):
    return "\n".join(l for l in text.splitlines() if not l.startswith("#"))


# ---- torchtitan: the file, by hand ---------------------------------------------------------
# Llama 3.1 8B on 8 GPUs, pp=2 x dp_shard=2 x tp=2, interleaved with 2 chunks a rank, full AC
# every 2nd block, float8 tensorwise, micro-batch 2; the default batch rule gives 512 sequences
# (4M tokens of 8192). With a pipeline the local batch is 512 / dp 2 = 256, run as micro-batches
# of 2; torchtitan counts the embedding and output as a layer each: (32 + 2) / 4 stages ->
# ceil(8.5) = 9 layers a stage, and ceil(34 / 9) = 4 stages = pp x 2. Full AC every 2nd block is
# torchtitan's selective with option "2"; FSDP under a pipeline does not reshard.
TT_ARGS = ("--model", "llama3.1-8b", "--gpus", "8", "--mesh", "dp_shard=2,tp=2,pp=2", "--pp-schedule",
           "interleaved", "--ac", "full:2", "--fp8", "tensorwise", "--micro-batch", "2")
TT_BODY = """
[job]
description = "meshplan plan: llama3.1-8b"
dump_folder = "./outputs"

[model]
name = "llama3"
flavor = "8B"
converters = ["float8"]

[training]
local_batch_size = 256
global_batch_size = 512
seq_len = 8192
steps = 1000  # a placeholder: your run's length
mixed_precision_param = "bfloat16"
mixed_precision_reduce = "float32"

[parallelism]
data_parallel_replicate_degree = 1
data_parallel_shard_degree = 2
fsdp_reshard_after_forward = "never"
tensor_parallel_degree = 2
enable_async_tensor_parallel = false
pipeline_parallel_degree = 2
pipeline_parallel_schedule = "Interleaved1F1B"
pipeline_parallel_layers_per_stage = 9
pipeline_parallel_microbatch_size = 2
context_parallel_degree = 1
expert_parallel_degree = 1
expert_tensor_parallel_degree = 1

[activation_checkpoint]
mode = "selective"
selective_ac_option = "2"

[compile]
enable = true
components = ["model", "loss"]

[quantize.linear.float8]
recipe_name = "tensorwise"
enable_fsdp_float8_all_gather = false
precompute_float8_dynamic_scale_for_fsdp = false
filter_fqns = ["output"]"""
pred, text = emitted("torchtitan", *TT_ARGS)
check(body(text) == TT_BODY, "torchtitan file body differs from the hand-derived one:\n" + body(text))
if pred:
    # the header: the prediction as simulate prints it, the release, one node's torchrun line
    check(f"step time {pred['step_time_s']:.4f} s, {pred['tokens_per_s_per_gpu']:.0f} tokens/s per GPU, "
          f"peak memory {pred['peak_mem_bytes'] / 2**30:.2f} GiB per GPU" in text, "torchtitan header: prediction")
    check("# Schema: pytorch/torchtitan v0.2.0 (29624e37), torchtitan/config/job_config.py." in text,
          "torchtitan header: the release")
    check("# Launch: torchrun --nproc_per_node=8 -m torchtitan.train --job.config_file " in text,
          "torchtitan header: the torchrun line")
    check("# Command: meshplan simulate --model llama3.1-8b --gpus 8 " in text, "torchtitan header: the command")

# ---- Megatron-LM: the file, by hand --------------------------------------------------------
# Llama 3.1 8B (32 layers, 4096 wide, SwiGLU 14336, 32 heads in 8 groups, 131072 positions,
# rope 500000, untied) on 8 GPUs as tp=4 x dp_replicate=2 under megatron-core: SP with TP comm
# overlap, the distributed optimizer with both overlaps, selective recompute of core_attn,
# float8 tensorwise in the hybrid format.
MG_ARGS = ("--model", "llama3.1-8b", "--gpus", "8", "--mesh", "dp_replicate=2,tp=4", "--ac", "selective-core",
           "--fp8", "tensorwise", "--stack", "megatron-core")
MG_BODY = ("--num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 "
           "--group-query-attention --num-query-groups 8 --max-position-embeddings 131072 --vocab-size 128256 "
           "--position-embedding-type rope --rotary-base 500000 --swiglu --normalization RMSNorm "
           "--disable-bias-linear --norm-epsilon 1e-05 --untie-embeddings-and-output-weights "
           "--tensor-model-parallel-size 4 --sequence-parallel --tp-comm-overlap --pipeline-model-parallel-size 1 "
           "--context-parallel-size 1 --seq-length 8192 --micro-batch-size 1 --global-batch-size 512 "
           "--use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --bf16 --attention-backend "
           "flash --fp8-format hybrid --fp8-recipe tensorwise --recompute-granularity selective "
           "--recompute-modules core_attn --train-iters 1000")
pred, text = emitted("megatron", *MG_ARGS)
check(" ".join(body(text).split()) == MG_BODY, "megatron arguments differ from the hand-derived ones:\n" + body(text))
check("pretrain_gpt.py $(grep -v '^#' " in text and "# Data parallelism: the world over tp x pp x cp, 2 ranks" in text,
      "megatron header: the launch line and the data-parallel size")

# ---- round trips: emit, read back, the same prediction -------------------------------------
def round_trip(target, gpus, args, extra_from=()):
    pred, text = emitted(target, "--gpus", gpus, *args)
    check(pred is not None, f"{target} {args}: not emitted")
    if pred is None:
        return None
    path = os.path.join(tmp, target, "plan." + ("toml" if target == "torchtitan" else "args"))
    back = run("simulate", "--gpus", gpus, "--from", path, *extra_from, "--json")
    if back.returncode == 0:
        got = json.loads(back.stdout)
        diff = {k: (v, got.get(k)) for k, v in pred.items() if got.get(k) != v}
        check(not diff, f"{target} {' '.join(args)}: read back differs: {diff}")
        check("note: --from " in back.stderr, f"{target}: no --from note")
    return text


TT = [  # (GPUs, simulate's flags): FSDP, TP with AsyncTP, the pipeline, CP, replicate x shard, MoE
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_shard=8")),
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_shard=4,tp=2", "--ac", "selective-op", "--async-tp")),
    ("8", TT_ARGS[4:]),
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_shard=4,cp=2", "--seq", "16384", "--cp-rotate", "alltoall",
           "--ac", "full", "--stack", "torchtitan-eager")),
    ("16", ("--model", "llama3.1-8b", "--mesh", "dp_replicate=2,dp_shard=8", "--fp8", "rowwise", "--no-reshard")),
    # torchtitan's float8 FSDP all-gather (enable_fsdp_float8_all_gather), read back from the TOML
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_shard=8", "--fp8", "tensorwise", "--fp8-all-gather")),
    ("16", ("--model", "llama3.1-70b", "--mesh", "dp_shard=4,pp=4", "--pp-schedule", "1f1b", "--ac", "full")),
    # the zero-bubble schedules, written as torch's ZBVZeroBubble and InterleavedZeroBubble
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_shard=4,pp=2", "--pp-schedule", "zbv", "--ac", "full")),
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_shard=4,pp=2", "--pp-schedule", "interleaved_zb", "--ac", "full")),
    ("8", ("--model", "qwen3-30b-a3b", "--mesh", "dp_shard=8,ep=4", "--ac", "full")),
    # the expert grid: EP over whole tp (and cp) groups and part of dp_shard, torchtitan's
    # expert_tensor_parallel_degree 1
    ("16", ("--model", "qwen3-30b-a3b", "--mesh", "dp_shard=8,tp=2,ep=4,etp=1")),
    ("16", ("--model", "qwen3-30b-a3b", "--mesh", "dp_shard=4,cp=2,tp=2,ep=8,etp=1", "--seq", "16384")),
]
for gpus, args in TT:
    round_trip("torchtitan", gpus, args if "--model" in args else ("--model", "llama3.1-8b") + tuple(args))

MG = [  # DDP with the distributed optimizer, TP+SP float8, interleaved pipeline, CP, megatron-lm, GPT
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_replicate=8", "--stack", "megatron-core")),
    ("8", MG_ARGS[4:]),
    ("8", ("--model", "llama3.1-8b", "--mesh", "tp=2,pp=4", "--pp-schedule", "interleaved", "--ac", "full",
           "--fp8", "delayed", "--stack", "megatron-core")),
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_replicate=2,tp=2,cp=2", "--seq", "16384", "--fp8", "blockwise",
           "--stack", "megatron-core")),
    # Megatron-Core's collective context parallelism: Llama 3's all-gather, Ulysses' all-to-all
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_replicate=2,tp=2,cp=2", "--seq", "16384", "--cp-comm-type",
           "all_gather", "--stack", "megatron-core")),
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_replicate=2,cp=4", "--seq", "32768", "--cp-comm-type", "a2a",
           "--stack", "megatron-core")),
    ("8", ("--model", "llama2-7b", "--mesh", "dp_replicate=4,tp=2", "--no-sp", "--stack", "megatron-lm")),
    ("8", ("--model", "gpt2-124m", "--mesh", "dp_replicate=8", "--micro-batch", "4", "--stack", "megatron-core")),
    # a stated stage layout: Llama 3 405B's 126 layers, one fewer on the first and last stages
    ("2048", ("--model", "llama3.1-405b", "--mesh", "dp_replicate=16,tp=8,pp=16", "--stack", "megatron-core",
              "--global-batch", "2048", "--pp-layers", "7," + "8," * 14 + "7")),
    # one layer a chunk, the embedding and the loss alone (Llama 3's pipeline): the layout flag
    ("2048", ("--model", "llama3.1-405b", "--mesh", "dp_replicate=16,tp=8,pp=16", "--stack", "megatron-core",
              "--global-batch", "2048", "--pp-schedule", "interleaved", "--pp-virtual", "8",
              "--pp-layout", "E|(t|)*126L")),
    # middle stages off the even split: the layout flag
    ("64", ("--model", "llama3.1-8b", "--mesh", "dp_replicate=16,pp=4", "--stack", "megatron-core",
            "--pp-layers", "6,9,8,9")),
]
MG += [  # MoE: Megatron-Core's expert grid over DDP, DeepEP, the EP overlap, MLA, dense leading layers
    ("16", ("--model", "mixtral-8x7b", "--mesh", "dp_replicate=8,tp=2,ep=8", "--stack", "megatron-core")),
    ("16", ("--model", "deepseek-v2-lite", "--mesh", "dp_replicate=16,ep=8", "--stack", "megatron-core",
            "--moe-dispatcher", "deepep")),
    ("16", ("--model", "qwen3-30b-a3b", "--mesh", "dp_replicate=4,tp=2,pp=2,ep=8", "--stack", "megatron-core",
            "--pp-schedule", "interleaved", "--overlap-moe-comm")),
    ("2048", ("--model", "deepseek-v3", "--mesh", "pp=16,dp_replicate=128,ep=64", "--stack", "megatron-core",
              "--global-batch", "15360", "--seq", "4096", "--ac", "full")),
    # recompute by modules, alone and beside core_attn; the experts' capacity, padded or not
    ("16", ("--model", "deepseek-v2-lite", "--mesh", "dp_replicate=16,ep=8", "--stack", "megatron-core",
            "--recompute-modules", "layernorm,mla_up_proj,moe_act", "--moe-capacity-factor", "1.25",
            "--moe-pad-expert-input-to-capacity")),
    ("16", ("--model", "qwen3-30b-a3b", "--mesh", "dp_replicate=8,tp=2,ep=8", "--stack", "megatron-core",
            "--ac", "selective-core", "--recompute-modules", "moe_act,layernorm", "--moe-capacity-factor", "1")),
]
# Megatron FSDP: dp_shard on megatron-core, optim_grads_params (its default here) with and
# without the double buffer, under TP+SP with float8 and an interleaved pipeline
MG += [
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_shard=8", "--stack", "megatron-core")),
    ("16", ("--model", "llama3.1-8b", "--mesh", "dp_shard=8,tp=2", "--stack", "megatron-core",
            "--fsdp-double-buffer", "--data-parallel-sharding-strategy", "optim_grads_params")),
    ("64", ("--model", "llama3.1-70b", "--mesh", "dp_shard=4,tp=4,pp=4", "--stack", "megatron-core", "--fp8",
            "tensorwise", "--pp-schedule", "interleaved", "--pp-virtual", "5")),
    # Megatron-Core's float8 weights (--fp8-param-gather): the distributed optimizer's gather
    # under delayed scaling, Megatron FSDP's under blockwise
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_replicate=8", "--stack", "megatron-core", "--fp8", "delayed",
           "--fp8-param-gather")),
    ("16", ("--model", "llama3.1-8b", "--mesh", "dp_shard=8,tp=2", "--stack", "megatron-core", "--fp8",
            "blockwise", "--fp8-param-gather")),
]
# Megatron-Core's CUDA graphs: per layer under an interleaved pipeline, the full iteration
# (with the NaN check off, as Megatron-LM asserts), the attention alone beside MoE layers
MG += [
    ("8", ("--model", "llama3.1-8b", "--mesh", "tp=2,pp=4", "--pp-schedule", "interleaved", "--stack",
           "megatron-core", "--cuda-graphs", "layers")),
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_replicate=8", "--stack", "megatron-core", "--cuda-graphs",
           "iteration", "--no-check-for-nan-in-loss-and-grad")),
    ("16", ("--model", "mixtral-8x7b", "--mesh", "dp_replicate=8,tp=2,ep=8", "--stack", "megatron-core",
            "--cuda-graphs", "attn")),
]
# Megatron-LM's --grad-reduce-in-bf16 (bf16 main_grad buffers): written, read back as
# --fsdp-reduce-dtype bf16, the same prediction
MG += [
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_replicate=8", "--stack", "megatron-core",
           "--fsdp-reduce-dtype", "bf16")),
]
# Megatron-Core's recompute method under full recompute (transformer_block.py
# _checkpointed_forward, core_v0.14.0): block on each of the 4 x 2 chunks of 4 layers, uniform
# in groups of 2
MG += [
    ("8", ("--model", "llama3.1-8b", "--mesh", "tp=2,pp=4", "--pp-schedule", "interleaved", "--stack",
           "megatron-core", "--ac", "full", "--recompute-method", "block", "--recompute-num-layers", "2")),
    ("8", ("--model", "llama3.1-8b", "--mesh", "dp_replicate=2,pp=4", "--stack", "megatron-core", "--ac", "full",
           "--recompute-method", "uniform", "--recompute-num-layers", "2")),
]
for gpus, args in MG:
    a = args if "--model" in args else ("--model", "llama3.1-8b") + tuple(args)
    text = round_trip("megatron", gpus, a)
    check(text is None or ("--grad-reduce-in-bf16" in text) == ("bf16" in a),
          f"megatron {' '.join(a)}: --grad-reduce-in-bf16 written where the plan reduces in bf16 only")

# the recompute method as Megatron-LM's flags, and refused where Megatron-Core refuses it: uniform
# groups past a chunk's last layer (llama3.1-8b on pp 4: 8 layers a chunk), a method without
# full granularity (its config raises), a count without a method
rc_args = ("--gpus", "8", "--model", "llama3.1-8b", "--mesh", "dp_replicate=2,pp=4", "--stack", "megatron-core")
_, text = emitted("megatron", *rc_args, "--ac", "full", "--recompute-method", "block", "--recompute-num-layers", "3")
check("--recompute-granularity full\n--recompute-method block\n--recompute-num-layers 3\n" in (text or ""),
      "recompute method block 3 not written: " + str(text))
p = run("simulate", *rc_args, "--ac", "full", "--recompute-method", "uniform", "--recompute-num-layers", "3", want_rc=2)
check("holds 8 layers, which 3 does not divide" in p.stderr, "uniform 3 on 8-layer chunks: " + p.stderr)
p = run("simulate", *rc_args, "--ac", "selective-core", "--recompute-method", "block", "--recompute-num-layers", "1",
        want_rc=2)
check("applies to full AC" in p.stderr, "a method under selective-core: " + p.stderr)
p = run("simulate", *rc_args, "--ac", "full", "--recompute-num-layers", "2", want_rc=2)
check("without a recompute method" in p.stderr, "a count without a method: " + p.stderr)
p = run("simulate", "--gpus", "8", "--model", "llama3.1-8b", "--mesh", "dp_shard=2,pp=4", "--ac", "full",
        "--recompute-method", "block", "--recompute-num-layers", "2", want_rc=2)
check("Megatron-Core's TransformerBlock" in p.stderr, "a method on torchtitan: " + p.stderr)

# CUDA graphs as Megatron-LM's flags (megatron/training/arguments.py, core_v0.14.0), each scope
# read back from them, and from --external-cuda-graph's default scope (full: a layer a graph)
for scope, flags in (("layers", "--enable-cuda-graph\n"), ("attn", "--external-cuda-graph\n--cuda-graph-scope attn\n"),
                     ("iteration", "--enable-cuda-graph\n--cuda-graph-scope full_iteration\n")):
    extra = ("--no-check-for-nan-in-loss-and-grad",) if scope == "iteration" else ()
    pred, text = emitted("megatron", "--gpus", "8", "--model", "llama3.1-8b", "--mesh", "dp_replicate=8", "--stack",
                         "megatron-core", "--cuda-graphs", scope, *extra)
    check(flags in text and (pred or {}).get("cuda_graphs") == scope, f"--cuda-graphs {scope} not written: " + text)
# Transformer Engine's moe_router scope lists (core_v0.16.0 --cuda-graph-impl transformer_engine) on
# a MoE model, written and read back to the same prediction
for scope, words in (("attn+moe_router", "attn moe_router"), ("attn+moe_router+moe_preprocess",
                                                              "attn moe_router moe_preprocess")):
    text = round_trip("megatron", "8", ("--model", "tiny-moe", "--mesh", "dp_replicate=8", "--ep", "8", "--stack",
                                        "megatron-core", "--cuda-graphs", scope))
    check(text and "--cuda-graph-impl transformer_engine\n--cuda-graph-scope %s\n" % words in text,
          f"--cuda-graphs {scope} not written: {text}")
base = ("--model", "llama3.1-8b", "--mesh", "dp_replicate=8", "--stack", "megatron-core")
eager = json.loads(run("simulate", "--gpus", "8", *base, "--json").stdout)
layers = json.loads(run("simulate", "--gpus", "8", *base, "--cuda-graphs", "layers", "--json").stdout)
check(layers["step_time_s"] < eager["step_time_s"], "layer graphs do not shorten the eager step")
_, text = emitted("megatron", "--gpus", "8", *base)
ext = json.loads(run("simulate", "--gpus", "8", "--from-args", " ".join(body(text).split()) + " --external-cuda-graph",
                     "--json").stdout)
check(ext.get("cuda_graphs") == "layers" and ext["step_time_s"] == layers["step_time_s"],
      "--external-cuda-graph not read as layer graphs: " + str(ext.get("cuda_graphs")))
p = run("simulate", "--gpus", "8", "--from-args", " ".join(body(text).split()) + " --enable-cuda-graph --external-cuda-graph",
        want_rc=2)
check("refuses both at once" in p.stderr, "both graph flags read: " + p.stderr)

# --fp8-all-gather written as torchtitan's two float8 FSDP keys; the gathered float8 weight
# needs no cast after the gather and moves half the bytes, so the step is shorter
base = ("--model", "llama3.1-8b", "--mesh", "dp_shard=8", "--fp8", "tensorwise")
pred, text = emitted("torchtitan", "--gpus", "8", *base, "--fp8-all-gather")
check("enable_fsdp_float8_all_gather = true\nprecompute_float8_dynamic_scale_for_fsdp = true\n" in text and
      (pred or {}).get("fp8_all_gather") is True, "--fp8-all-gather not written: " + text)
plain = json.loads(run("simulate", "--gpus", "8", *base, "--json").stdout)
check(pred is not None and pred["step_time_s"] < plain["step_time_s"], "float8 all-gather does not shorten the step")

# --fp8-scope written as torchtitan v0.2.0's grouped-GEMM converter and its fqns ["experts"],
# read back to the same prediction (round_trip); refused under tensorwise and without --fp8
base = ("--model", "qwen3-30b-a3b", "--mesh", "dp_shard=8,ep=4", "--ac", "full", "--fp8", "rowwise")
for scope, conv in (("experts", '["quantize.grouped_mm.float8"]'),
                    ("all", '["quantize.linear.float8", "quantize.grouped_mm.float8"]')):
    text = round_trip("torchtitan", "8", base + ("--fp8-scope", scope)) or ""
    check(f"converters = {conv}\n" in text and '[quantize.grouped_mm.float8]\nfqns = ["experts"]\n' in text,
          f"--fp8-scope {scope} not written: " + text)
    check(("[quantize.linear.float8]" in text) == (scope == "all"), f"--fp8-scope {scope}: the Linears' table")
gmm = json.loads(run("simulate", "--gpus", "8", *base, "--fp8-scope", "experts", "--json").stdout)
lin = json.loads(run("simulate", "--gpus", "8", *base, "--json").stdout)
check(gmm.get("fp8_scope") == "experts" and "fp8_scope" not in lin, f"fp8_scope in --json: {gmm.get('fp8_scope')}")
p = run("simulate", "--gpus", "8", *base[:-1], "tensorwise", "--fp8-scope", "experts", want_rc=2)
check("rowwise or mxfp8" in p.stderr, "--fp8-scope experts under tensorwise: " + p.stderr)
p = run("simulate", "--gpus", "8", *base[:-2], "--fp8-scope", "all", want_rc=2)
check("needs a recipe" in p.stderr, "--fp8-scope without --fp8: " + p.stderr)

# --fp8-param-gather written as Megatron-LM's flag, and refused without float8 when read
_, text = emitted("megatron", "--gpus", "8", "--model", "llama3.1-8b", "--mesh", "dp_replicate=8", "--stack",
                  "megatron-core", "--fp8", "tensorwise", "--fp8-param-gather")
check("--fp8-recipe tensorwise\n--fp8-param-gather\n" in text, "--fp8-param-gather not written: " + text)
bare = " ".join(body(text).split()).replace("--fp8-format hybrid --fp8-recipe tensorwise", "")
p = run("simulate", "--gpus", "8", "--from-args", bare, want_rc=2)
check("--fp8-param-gather without --fp8-format" in p.stderr, "--fp8-param-gather read without float8: " + p.stderr)
# with mxfp8 the shared parameter/gradient buffer's flag beside it, read back to the same step
text = round_trip("megatron", "8", ("--gpu", "b200", "--model", "llama3.1-8b", "--mesh", "dp_replicate=8", "--stack",
                                    "megatron-core", "--fp8", "mxfp8", "--fp8-param-gather"), ("--gpu", "b200"))
check(text is not None and "--fp8-param-gather\n--reuse-grad-buf-for-mxfp8-param-ag\n" in text,
      "--reuse-grad-buf-for-mxfp8-param-ag not written with mxfp8: " + str(text))

# --fp8-dpa written as Megatron-Core's --fp8-dot-product-attention and read back to the same
# step; read without a float8 format it is refused (Transformer Engine's float8 attention runs
# under a float8 recipe)
dpa_args = ("--gpus", "8", "--gpu", "b200", "--model", "llama3.1-8b", "--mesh", "dp_replicate=8", "--stack",
            "megatron-core", "--fp8", "tensorwise", "--fp8-dpa")
pred, text = emitted("megatron", *dpa_args)
check("--fp8-recipe tensorwise\n--fp8-dot-product-attention\n" in text, "--fp8-dpa not written: " + text)
bare = " ".join(body(text).split())
p = run("simulate", "--gpus", "8", "--gpu", "b200", "--from-args", bare, "--json")
check(p.returncode == 0 and pred is not None and json.loads(p.stdout)["step_time_s"] == pred["step_time_s"],
      "--fp8-dot-product-attention not read back to --fp8-dpa's step: " + p.stderr)
p = run("simulate", "--gpus", "8", "--gpu", "b200", "--from-args",
        bare.replace("--fp8-format hybrid --fp8-recipe tensorwise", ""), want_rc=2)
check("--fp8-dot-product-attention without --fp8-format" in p.stderr, "fp8 attention read without float8: " + p.stderr)

# Megatron FSDP as Megatron-LM's flags (megatron/training/arguments.py, core_v0.14.0: its
# checkpoint format asserted), read back over dp_shard; its older name read the same
_, text = emitted("megatron", "--gpus", "16", "--model", "llama3.1-8b", "--mesh", "dp_shard=8,tp=2", "--stack",
                  "megatron-core", "--fsdp-double-buffer")
check("--use-megatron-fsdp\n--data-parallel-sharding-strategy optim_grads_params\n--fsdp-double-buffer\n"
      "--ckpt-format fsdp_dtensor\n" in text, "Megatron FSDP not written as Megatron-LM's flags: " + text)
legacy = " ".join(body(text).split()).replace("--use-megatron-fsdp", "--use-custom-fsdp")
p = run("simulate", "--gpus", "16", "--from-args", legacy)
check("dp_shard=8" in p.stderr and "--data-parallel-sharding-strategy optim_grads_params" in p.stderr,
      "--use-custom-fsdp not read as Megatron FSDP over dp_shard: " + p.stderr)
p = run("simulate", "--gpus", "16", "--from-args", legacy.replace("--use-custom-fsdp", ""), want_rc=2)
check("are Megatron FSDP's" in p.stderr, "the sharding strategy without Megatron FSDP: " + p.stderr)
# its hybrid sharding (--num-distributed-optimizer-instances, arguments.py core_v0.14.0):
# dp_replicate=2 over dp_shard=4 written as two instances, read back as the same mesh and
# step; without Megatron FSDP, or with instances not dividing the data parallelism, refused
pred, text = emitted("megatron", "--gpus", "16", "--model", "llama3.1-8b", "--mesh", "dp_replicate=2,dp_shard=4,tp=2",
                     "--stack", "megatron-core")
check("--use-megatron-fsdp\n" in text and "--num-distributed-optimizer-instances 2\n" in text,
      "Megatron FSDP's instances not written: " + text)
flat = " ".join(body(text).split())
p = run("simulate", "--gpus", "16", "--from-args", flat, "--json")
check(p.returncode == 0 and "dp_replicate=2,dp_shard=4," in p.stderr and pred is not None
      and json.loads(p.stdout)["step_time_s"] == pred["step_time_s"], "instances not read back: " + p.stderr)
p = run("simulate", "--gpus", "16", "--from-args", flat.replace("instances 2", "instances 3"), want_rc=2)
check("instances 3 does not divide the data parallelism 8 x cp" in p.stderr, "3 instances of 8: " + p.stderr)
bare = flat.replace("--use-megatron-fsdp", "").replace("--data-parallel-sharding-strategy optim_grads_params", "")
# without Megatron FSDP the flag is the distributed optimizer's instances: the mesh's dopt over
# dp_replicate 8 (x tp 2); without --use-distributed-optimizer refused, as Megatron asserts
bare = bare.replace("--ckpt-format fsdp_dtensor", "")
p = run("simulate", "--gpus", "16", "--from-args", bare)
check(p.returncode == 0 and "dp_replicate=8,dp_shard=1,cp=1,tp=2,ep=1,dopt=2" in p.stderr,
      "instances without Megatron FSDP: " + p.stderr)
p = run("simulate", "--gpus", "16", "--from-args", bare.replace("--use-distributed-optimizer", ""), want_rc=2)
check("instances 2 without --use-distributed-optimizer" in p.stderr and p.stderr.count("\n") <= 1,
      "instances without the distributed optimizer: " + p.stderr)
# the distributed optimizer's instances written from the mesh's dopt and read back as the same
# step; plan searches them where fixed (dp_replicate 8 x tp 2 on 16 GPUs), on a stack without
# the distributed optimizer refused by name
DOPT = ["--gpus", "16", "--model", "llama3.1-8b", "--mesh", "dp_replicate=8,tp=2,dopt=2", "--stack", "megatron-core"]
pred, text = emitted("megatron", *DOPT)
check("--use-distributed-optimizer\n" in text and "--num-distributed-optimizer-instances 2\n" in text
      and "--use-megatron-fsdp" not in text, "the distributed optimizer's instances not written: " + text)
p = run("simulate", "--gpus", "16", "--from-args", " ".join(body(text).split()), "--json")
check(p.returncode == 0 and pred is not None and json.loads(p.stdout)["step_time_s"] == pred["step_time_s"],
      "the distributed optimizer's instances not read back: " + p.stderr)
pe = os.path.join(tmp, "plan_dopt")
p = run("plan", *DOPT, "--no-db", "--emit", "megatron", "--out", pe)
check(p.returncode == 0 and "--num-distributed-optimizer-instances 2\n" in open(os.path.join(pe, "plan-1.args")).read(),
      "plan with dopt: " + p.stderr)
p = run("plan", "--gpus", "16", "--model", "llama3.1-8b", "--stack", "megatron-lm", "--fix", "dopt=2", "--no-db",
        want_rc=2)
check("need a stack running Megatron-LM's DDP with the distributed optimizer" in p.stderr, "plan dopt on megatron-lm: "
      + p.stderr)
# validate's columns run the same plan as simulate's options: the peak memory of a Megatron
# FSDP row with and without the double buffer is simulate's, and the two differ by the
# prefetch window's extra layers (2 x 436,224,000 bytes on 8B: schedule/megatron_fsdp_test)
hdr = ("case,model,gpu,gpus,gpus_per_node,inter_node_gbps_per_gpu,dp_replicate,dp_shard,tp,pp,pp_schedule,cp,ep,"
       "seq,local_batch,global_batch,ac,fp8,stack,metric,value,mfsdp_strategy,fsdp_double_buffer")
with open(os.path.join(tmp, "mfsdp.csv"), "w") as f:
    f.write(hdr + "\n")
    for db in ("", "1"):
        f.write(f"db{db},llama3.1-8b,h100-sxm,8,8,,1,8,1,1,,1,1,8192,1,8,none,0,megatron-core,peak_mem_gib,60,"
                f"optim_grads_params,{db}\n")
rows = json.loads(run("validate", "--json", os.path.join(tmp, "mfsdp.csv")).stdout)["rows"]
for r, extra in zip(rows, ((), ("--fsdp-double-buffer",))):
    sim = json.loads(run("simulate", "--gpus", "8", "--gpu", "h100-sxm", "--model", "llama3.1-8b", "--mesh", "dp_shard=8",
                         "--stack", "megatron-core", "--seq", "8192", "--global-batch", "8", "--json", *extra).stdout)
    # the row's figure is what the allocator holds at the peak: simulate's categories, its
    # runtime overhead left out
    held = sum(sim["mem_at_peak_bytes"].values())
    check(abs(r["predicted"] - held / 2**30) < 1e-9, f"validate {r['case']} vs simulate: {r} {sim}")
    check(sim["data_parallel_sharding_strategy"] == "optim_grads_params" and sim["fsdp_double_buffer"] == bool(extra),
          "simulate --json: Megatron FSDP's strategy and double buffer")
check(abs((rows[0]["predicted"] - rows[1]["predicted"]) * 2**30 - 2 * 436224000) < 1, "the prefetch window's two layers")
# a row over dp_replicate 2 x dp_shard 4 is its hybrid sharding (no column of its own): the
# same plan as simulate's, Adam's fp32 moments over a quarter, 8 x 8,030,261,248 / 4 bytes
with open(os.path.join(tmp, "hsdp.csv"), "w") as f:
    f.write(hdr + "\n" + "hy,llama3.1-8b,h100-sxm,8,8,,2,4,1,1,,1,1,8192,1,8,none,0,megatron-core,peak_mem_gib,60,"
            "optim_grads_params,\n")
r = json.loads(run("validate", "--json", os.path.join(tmp, "hsdp.csv")).stdout)["rows"][0]
sim = json.loads(run("simulate", "--gpus", "8", "--gpu", "h100-sxm", "--model", "llama3.1-8b", "--mesh",
                     "dp_replicate=2,dp_shard=4", "--stack", "megatron-core", "--seq", "8192", "--global-batch", "8",
                     "--json").stdout)
check(abs(r["predicted"] - sum(sim["mem_at_peak_bytes"].values()) / 2**30) < 1e-9
      and sim["mem_at_peak_bytes"]["optimizer"] == 8 * 8030261248 // 4, f"validate's hybrid row vs simulate: {r} {sim}")
# validate's dist_opt_instances column is the mesh's dopt: a row over dp_replicate 8 in 2
# instances is simulate's plan, Adam's fp32 moments over an instance's 4 ranks, 8 x
# 8,030,261,248 / 4 bytes (twice one instance's 8 x / 8)
dhdr = hdr.replace("mfsdp_strategy,fsdp_double_buffer", "dist_opt_instances")
with open(os.path.join(tmp, "dopt.csv"), "w") as f:
    f.write(dhdr + "\n")
    for n in ("2", ""):
        f.write(f"do{n},llama3.1-8b,h100-sxm,8,8,,8,1,1,1,,1,1,8192,1,8,none,0,megatron-core,peak_mem_gib,60,{n}\n")
rows = json.loads(run("validate", "--json", os.path.join(tmp, "dopt.csv")).stdout)["rows"]
for r, mesh in zip(rows, ("dp_replicate=8,dopt=2", "dp_replicate=8")):
    sim = json.loads(run("simulate", "--gpus", "8", "--gpu", "h100-sxm", "--model", "llama3.1-8b", "--mesh", mesh,
                         "--stack", "megatron-core", "--seq", "8192", "--global-batch", "8", "--json").stdout)
    check(abs(r["predicted"] - sum(sim["mem_at_peak_bytes"].values()) / 2**30) < 1e-9
          and sim["mem_at_peak_bytes"]["optimizer"] == 8 * 8030261248 // (4 if "dopt" in mesh else 8),
          f"validate's dist_opt_instances row vs simulate: {r} {sim}")
p = run("simulate", "--gpus", "8", "--model", "llama3.1-8b", "--mesh", "dp_shard=8", "--stack", "torchtitan-compile",
        "--fsdp-double-buffer", want_rc=2)
check("are Megatron FSDP's" in p.stderr, "--fsdp-double-buffer on torchtitan: " + p.stderr)

# DeepSeek-V3 (its config.json: 61 layers, the first 3 dense, 256 routed experts of 2048 and
# one shared of 2048, top-8 from 4 of 8 groups, MLA with q rank 1536, kv rank 512, q/k heads
# 128 + 64 of RoPE, values 128) as Megatron-LM's flags. Its aux loss weight 0.001 per
# meshplan's Mixtral form is 0.001 x top_k 8 = 0.008 in Megatron-LM's (which divides each
# expert's count by top_k x tokens); the experts whole on a rank (etp 1), EP 64, all-to-all.
_, text = emitted("megatron", "--gpus", "2048", "--model", "deepseek-v3", "--mesh", "pp=16,dp_replicate=128,ep=64",
                  "--stack", "megatron-core", "--global-batch", "15360", "--seq", "4096", "--ac", "full")
want = ("--multi-latent-attention --rope-type rope --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 "
        "--qk-pos-emb-head-dim 64 --v-head-dim 128 --num-experts 256 --moe-ffn-hidden-size 2048 --moe-router-topk 8 "
        "--moe-shared-expert-intermediate-size 2048 --moe-layer-freq ([0]*3+[1]*58) --moe-router-num-groups 8 "
        "--moe-router-group-topk 4 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 0.008 "
        "--moe-grouped-gemm")
check(want in " ".join(body(text).split()), "deepseek-v3's experts and MLA as Megatron-LM flags:\n" + body(text))
check("--expert-model-parallel-size 64\n--expert-tensor-parallel-size 1\n--moe-token-dispatcher-type alltoall\n"
      in text, "deepseek-v3's expert grid and dispatcher")
# DeepSeek-V2-Lite's router renormalises no top-k weights (norm_topk_prob false): Megatron-LM's
# softmax over every expert before the top k; DeepEP as the flex dispatcher
_, text = emitted("megatron", "--gpus", "16", "--model", "deepseek-v2-lite", "--mesh", "dp_replicate=16,ep=8",
                  "--stack", "megatron-core", "--moe-dispatcher", "deepep")
_, text2 = emitted("megatron", "--gpus", "16", "--model", "qwen3-30b-a3b", "--mesh", "dp_replicate=8,tp=2,ep=8",
                   "--stack", "megatron-core", "--ac", "selective-core", "--recompute-modules", "moe_act,layernorm",
                   "--moe-capacity-factor", "1")
check("--moe-expert-capacity-factor 1\n" in text2 and
      "--recompute-granularity selective\n--recompute-modules core_attn layernorm moe_act\n" in text2,
      "the capacity and the recompute modules as Megatron-LM flags: " + text2)
check("--moe-router-pre-softmax\n" in text and "--q-lora-rank" not in text and
      "--moe-token-dispatcher-type flex\n--moe-enable-deepep\n" in text, "deepseek-v2-lite as Megatron-LM flags: " + text)

# the cp comm type as Megatron-LM's flag, the ring's p2p where none is given
_, text = emitted("megatron", "--gpus", "8", "--model", "llama3.1-8b", "--mesh", "dp_replicate=2,tp=2,cp=2", "--seq",
                  "16384", "--cp-comm-type", "all_gather", "--stack", "megatron-core")
_, text2 = emitted("megatron", "--gpus", "8", "--model", "llama3.1-8b", "--mesh", "dp_replicate=2,tp=2,cp=2", "--seq",
                   "16384", "--stack", "megatron-core")
check("--context-parallel-size 2\n--cp-comm-type all_gather\n" in text and "--cp-comm-type p2p\n" in text2,
      "the cp comm type not written as Megatron-LM's --cp-comm-type: " + text)

# the layout as Megatron-LM states it: the first and last stages' counts, the rest even
_, text = emitted("megatron", "--gpus", "2048", "--model", "llama3.1-405b", "--mesh", "dp_replicate=16,tp=8,pp=16",
                  "--stack", "megatron-core", "--global-batch", "2048", "--pp-layers", "7," + "8," * 14 + "7")
check("--decoder-first-pipeline-num-layers 7\n" in text and "--decoder-last-pipeline-num-layers 7\n" in text,
      "the 7,8x14,7 layout not written as Megatron-LM's first/last stage flags")
_, text = emitted("megatron", "--gpus", "64", "--model", "llama3.1-8b", "--mesh", "dp_replicate=16,pp=4", "--stack",
                  "megatron-core", "--pp-layers", "6,9,8,9")
check('--pipeline-model-parallel-layout Et*6|t*9|t*8|t*9,L\n' in text and "decoder-first" not in text,
      "a middle stage off the even split not written as Megatron-LM's layout: " + text)
_, text = emitted("megatron", "--gpus", "2048", "--model", "llama3.1-405b", "--mesh", "dp_replicate=16,tp=8,pp=16",
                  "--stack", "megatron-core", "--global-batch", "2048", "--pp-schedule", "interleaved",
                  "--pp-virtual", "8", "--pp-layout", "E|(t|)*126L")
check('--pipeline-model-parallel-layout E|(t|)*126L\n' in text and "--num-virtual-stages" not in text,
      "Llama 3's per-chunk layout not written as Megatron-LM's layout alone: " + text)
p = run("simulate", "--gpus", "64", "--model", "llama3.1-8b", "--mesh", "dp_shard=16,pp=4", "--pp-layers", "7,9,9,7",
        "--emit", "torchtitan", "--out", os.path.join(tmp, "uneven"), want_rc=2)
check("a stated stage layout (--pp-layers)" in p.stderr, "torchtitan with --pp-layers: " + p.stderr)
# DeepSeek-V3's MTP module: Megatron-Core's --mtp-num-layers, and in a stated layout its 'm'
# on the last stage beside the loss; torchtitan v0.2.0 builds none and is refused by name
V3 = ("--gpus", "2048", "--model", "deepseek-v3", "--mesh", "pp=16,dp_replicate=128,ep=64", "--stack",
      "megatron-core", "--global-batch", "15360", "--seq", "4096", "--ac", "full")
_, text = emitted("megatron", *V3)
check("--mtp-num-layers 1\n" in text, "deepseek-v3's MTP module not written as --mtp-num-layers: " + text)
_, text = emitted("megatron", *V3[:-6], "--global-batch", "16384", "--seq", "4096", "--ac", "full", "--pp-schedule",
                  "interleaved", "--pp-virtual", "2", "--pp-layout", "Et*3|(tt|)*28t|t|mL")
check("--pipeline-model-parallel-layout Et*3|(t*2|)*28(t|)*2mL\n" in text,
      "deepseek-v3's layout not written with its MTP layer: " + text)
bad = os.path.join(tmp, "nomtp.args")
with open(bad, "w") as f:
    f.write(text.replace("--mtp-num-layers 1\n", ""))
p = run("simulate", "--from", bad, "--gpus", "2048", want_rc=2)
check("names 1 MTP layers (m) but --mtp-num-layers is 0" in p.stderr, "a layout's m without --mtp-num-layers: " + p.stderr)
_, text = emitted("megatron", *V3, "--mtp-num-layers", "0")
check("--mtp-num-layers" not in body(text), "--mtp-num-layers 0 written: " + text)
p = run("simulate", "--gpus", "2048", "--model", "deepseek-v3", "--mesh", "pp=16,dp_shard=128,ep=64", "--emit",
        "torchtitan", "--out", os.path.join(tmp, "mtp"), want_rc=2)
check("builds no multi-token-prediction module" in p.stderr and "--mtp-num-layers 0" in p.stderr,
      "torchtitan with MTP: " + p.stderr)
# --out makes its folder
fresh = os.path.join(tmp, "made", "")
run("simulate", "--gpus", "8", "--model", "llama3.1-8b", "--mesh", "dp_shard=8", "--emit", "torchtitan", "--out", fresh)
check(os.path.exists(os.path.join(fresh, "plan.toml")), "--out DIR not made")

# --from-args: the same arguments in one string (its value may open with "--"); explain and
# plan read them alike
pred, text = emitted("megatron", *MG_ARGS)
one = " ".join(body(text).split())
p = run("simulate", "--gpus", "8", "--from-args", one, "--json")
if p.returncode == 0 and pred:
    check(json.loads(p.stdout)["step_time_s"] == pred["step_time_s"], "--from-args: another step time")
p = run("explain", "--gpus", "8", "--from-args=" + one)
check("tp=4" in p.stdout and "dp_replicate=2" in p.stdout, "explain --from-args: the mesh is not the arguments'")
p = run("plan", "--gpus", "8", "--no-db", "--from-args=" + one, "--json")
if p.returncode == 0 and pred:
    best = json.loads(p.stdout)["plans"][0]
    check(abs(best["step_time_s"] - pred["step_time_s"]) < 1e-9, f"plan --from-args: best plan {best} is not the file's")

# a launcher's words before pretrain_gpt.py are skipped; the model is the given one when named
p = run("simulate", "--gpus", "8", "--from-args", "torchrun --nproc_per_node 8 pretrain_gpt.py " + one, "--model",
        "llama3.1-8b", "--json")
if p.returncode == 0 and pred:
    check(json.loads(p.stdout)["step_time_s"] == pred["step_time_s"], "--from-args after torchrun: another step time")

# ---- plan --emit ---------------------------------------------------------------------------
out = os.path.join(tmp, "plan")
os.makedirs(out)
p = run("plan", "--model", "llama3.1-8b", "--gpus", "8", "--no-db", "--top", "2", "--json", "--emit", "torchtitan",
        "--out", out)
if p.returncode == 0:
    plans = json.loads(p.stdout)["plans"]
    check(sorted(os.listdir(out)) == ["plan-1.toml", "plan-2.toml"], f"plan --top 2 --emit: files {os.listdir(out)}")
    for k in (1, 2):
        t = open(os.path.join(out, f"plan-{k}.toml")).read() if os.path.exists(os.path.join(out, f"plan-{k}.toml")) else ""
        check(f"step time {plans[k - 1]['step_time_s']:.4f} s" in t, f"plan-{k}.toml: not its row's step time")
        back = run("simulate", "--gpus", "8", "--from", os.path.join(out, f"plan-{k}.toml"), "--json")
        if back.returncode == 0:
            check(abs(json.loads(back.stdout)["step_time_s"] - plans[k - 1]["step_time_s"]) < 1e-9,
                  f"plan-{k}.toml read back: another step time")
out2 = os.path.join(tmp, "plan-best")
os.makedirs(out2)
p = run("plan", "--model", "llama3.1-8b", "--gpus", "8", "--no-db", "--emit", "torchtitan", "--out", out2)
check(os.listdir(out2) == ["plan-1.toml"] and "emit    plan 1: " in p.stdout, "plan --emit without --top: the best only")

# ---- a hand-written torchtitan file: torchtitan's defaults ---------------------------------
# dp_shard -1 is the rest of the 8 GPUs (tp=2: 4); AC's default is selective with option "2"
# (full:2); local_batch_size 2 with no global_batch_size is 2 x dp 4 = 8 sequences; no [compile]
# is the eager stack; the job, metrics and checkpoint keys change no cost and are noted.
hand = os.path.join(tmp, "hand.toml")
with open(hand, "w") as f:
    f.write('# a user\'s config\n[job]\ndump_folder = "./out"\n\n[metrics]\nlog_freq = 10\n\n[model]\nname = "llama3"\n'
            'flavor = "8B"\n\n[training]\nlocal_batch_size = 2\nseq_len = 4096\nsteps = 100\n\n[parallelism]\n'
            'tensor_parallel_degree = 2\n\n[checkpoint]\nenable = false\nfolder = "ckpt"\n')
p = run("simulate", "--gpus", "8", "--from", hand, "--json")
if p.returncode == 0:
    j = json.loads(p.stdout)
    check((j["mesh"], j["ac"], j["stack"], j["global_batch"], j["micro_batch"], j["seq"]) ==
          ("dp_shard=4,tp=2", "full:2", "torchtitan-eager", 8, 2, 4096), f"hand-written TOML read as {j}")
    check("ignored, as they change no cost: job.dump_folder, metrics.log_freq, training.steps, checkpoint.enable, "
          "checkpoint.folder" in p.stderr, "hand-written TOML: the note of ignored keys: " + p.stderr)

print(f"{len(fails)} failures")
for x in fails:
    print("FAIL:", x)
sys.exit(1 if fails else 0)
