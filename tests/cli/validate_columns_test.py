#!/usr/bin/env python3
"""validate's Megatron-Core run columns against simulate's flags through the binary:
cuda_graphs iteration with ddp_check_grads empty runs without the DDP's NaN check (Megatron-LM
asserts --no-check-for-nan-in-loss-and-grad under --cuda-graph-scope full_iteration), and
overlap_moe_comm 1 is simulate's --overlap-moe-comm, and recompute_modules split by '/' (NeMo
2.0's spelling) is the list split by spaces, and Megatron-Bridge's fp8_cs, fp8_mx and fp8_sc name
tensorwise, mxfp8 and blockwise, cp_rotate is simulate's --cp-rotate, and moe_dispatcher hybridep is --moe-dispatcher hybridep,
and fp8_amax_tp 1 is --fp8-amax-tp-only, and fp8_scope is --fp8-scope, and ce_fusion_impl te is
--cross-entropy-fusion-impl te (7.828 GiB below native on Llama 3 8B's logits);
each row's prediction is simulate's with the same
options.

Usage: validate_columns_test.py MESHPLAN"""
import json
import os
import sys
import tempfile

import cli_check
from cli_check import check, fails, run

cli_check.BIN = sys.argv[1]

HDR = ("case,source,model,gpus,gpu,gpus_per_node,inter_node_gbps_per_gpu,dp_replicate,dp_shard,tp,pp,"
       "pp_schedule,pp_virtual,cp,ep,seq,local_batch,micro_batch,global_batch,ac,fp8,sp,async_tp,stack,metric,"
       "value,notes,cuda_graphs,ddp_check_grads,overlap_moe_comm,recompute_modules,fp8_recipe,moe_dispatcher")
# Llama 3 8B on 8 B200s under plain data parallelism (Megatron-Bridge's llama3 8B B200 layout:
# GBS 128, MBS 2, seq 8192, cuda_graph_scope full_iteration), one row per NaN-check setting.
DENSE = "{0},test,llama3-8b,8,b200,8,400,8,1,1,1,,,1,1,8192,16,2,128,none,0,0,,megatron-core,"\
        "tokens_per_s_per_gpu,1000,test,{1},{2},,,,"
# Qwen3-30B-A3B on 16 H100s, EP 16 (Megatron-Bridge's H100 layout), with and without the overlap.
MOE = "{0},test,qwen3-30b-a3b,16,h100-sxm,8,400,16,1,1,1,,,1,16,4096,64,1,1024,none,0,0,,{1},"\
      "tokens_per_s_per_gpu,1000,test,,,{2},{3},,"
tmp = tempfile.mkdtemp(dir=os.environ.get("TEST_TMPDIR"))


def validate(rows, want_rc=0):
    path = os.path.join(tmp, "rows.csv")
    with open(path, "w") as f:
        f.write(HDR + "\n" + "\n".join(rows) + "\n")
    return run("validate", path, "--json", want_rc=want_rc)


def simulate(*extra):
    q = run("simulate", *extra, "--json")
    return json.loads(q.stdout)["tokens_per_s_per_gpu"] if q.returncode == 0 else None


def same(a, b):
    return a is not None and b is not None and abs(a / b - 1) < 1e-12


# ---- cuda_graphs iteration: ddp_check_grads empty is 0, 1 is refused, elsewhere empty is the stack's ----
SIM_DENSE = ["--model", "llama3-8b", "--gpus", "8", "--gpu", "b200", "--mesh", "dp_replicate=8", "--seq", "8192",
             "--micro-batch", "2", "--global-batch", "128", "--stack", "megatron-core", "--no-sp"]
p = validate([DENSE.format("it_empty", "iteration", ""), DENSE.format("it_off", "iteration", "0"),
              DENSE.format("it_on", "iteration", "1"), DENSE.format("eager", "", "")])
if p.returncode == 0:
    rows = {r["case"]: r for r in json.loads(p.stdout)["rows"]}
    want_it = simulate(*SIM_DENSE, "--cuda-graphs", "iteration", "--no-check-for-nan-in-loss-and-grad")
    check(same(rows["it_empty"].get("predicted"), want_it), f"iteration, check empty: {rows['it_empty']}, want {want_it}")
    check(same(rows["it_off"].get("predicted"), want_it), f"iteration, check 0: {rows['it_off']}, want {want_it}")
    check("NaN check" in (rows["it_on"].get("refused") or ""), f"iteration with the check on: {rows['it_on']}")
    # without graphs an empty column keeps the stack's check, which costs a norm a bucket:
    # the prediction is simulate's without the flag and differs from simulate's with it
    want_eager = simulate(*SIM_DENSE)
    check(same(rows["eager"].get("predicted"), want_eager), f"eager, check empty: {rows['eager']}, want {want_eager}")
    check(not same(want_eager, simulate(*SIM_DENSE, "--no-check-for-nan-in-loss-and-grad")),
          "the NaN check changes no prediction, so this test cannot tell the default")

# ---- overlap_moe_comm: 1 is simulate's --overlap-moe-comm, and changes the prediction ----
SIM_MOE = ["--model", "qwen3-30b-a3b", "--gpus", "16", "--gpu", "h100-sxm", "--mesh", "dp_replicate=16,ep=16",
           "--seq", "4096", "--micro-batch", "1", "--global-batch", "1024", "--stack", "megatron-core", "--no-sp"]
p = validate([MOE.format("ov_on", "megatron-core", "1", ""), MOE.format("ov_off", "megatron-core", "0", "")])
if p.returncode == 0:
    rows = {r["case"]: r.get("predicted") for r in json.loads(p.stdout)["rows"]}
    want_on, want_off = simulate(*SIM_MOE, "--overlap-moe-comm"), simulate(*SIM_MOE)
    check(same(rows["ov_on"], want_on), f"overlap_moe_comm 1: {rows['ov_on']}, want {want_on}")
    check(same(rows["ov_off"], want_off), f"overlap_moe_comm 0: {rows['ov_off']}, want {want_off}")
    check(not same(want_on, want_off), "--overlap-moe-comm changes no prediction, so the column is not tested")
# on a torchtitan row the column is an input error naming the row (exit 2)
p = validate([MOE.format("ov_tt", "torchtitan-compile", "1", "").replace("16,1,1,1,,,1,16", "1,16,1,1,,,1,16")],
             want_rc=2)
check("ov_tt" in p.stderr and "overlap_moe_comm 1 is Megatron-Core's" in p.stderr,
      f"overlap_moe_comm on torchtitan: {p.stderr.strip()}")

# ---- recompute_modules: "layernorm/moe_act" (NeMo 2.0's CSVs, split on '/' by its helpers.py) is
# "layernorm moe_act", and simulate's --recompute-modules takes either; both free outputs,
# so the peak memory differs from the row without ----
p = validate([MOE.format("rc_slash", "megatron-core", "", "layernorm/moe_act"),
              MOE.format("rc_space", "megatron-core", "", "layernorm moe_act")])
if p.returncode == 0:
    rows = {r["case"]: r.get("predicted") for r in json.loads(p.stdout)["rows"]}
    want = simulate(*SIM_MOE, "--recompute-modules", "layernorm,moe_act")
    check(same(rows["rc_slash"], want) and same(rows["rc_space"], want),
          f"recompute_modules: '/' {rows['rc_slash']}, ' ' {rows['rc_space']}, simulate {want}")
    check(same(simulate(*SIM_MOE, "--recompute-modules", "layernorm/moe_act"), want),
          "--recompute-modules layernorm/moe_act is not layernorm,moe_act")
    check(not same(want, simulate(*SIM_MOE)), "the recompute modules change no prediction")

# ---- fp8_recipe: Megatron-Bridge's compute dtypes on the dense row with float8 on; mxfp8 on
# the B200, the others on the H100 (on Blackwell blockwise runs as MXFP8, docs/validation.md,
# so only the H100 tells fp8_sc from fp8_mx's recipe) ----
FP8 = DENSE.replace(",none,0,0,,megatron-core,", ",none,1,0,,megatron-core,")
PAIRS = (("tensorwise", "fp8_cs", "h100-sxm"), ("mxfp8", "fp8_mx", "b200"), ("blockwise", "fp8_sc", "h100-sxm"),
         ("blockwise", "subchannel", "h100-sxm"), ("tensorwise", "fp8_cs", "b200"))
rows_in = []
for name, alias, gpu in PAIRS:
    row = FP8.replace(",b200,", f",{gpu},")
    # the recipe in the fp8_recipe column, the last but one
    rows_in += [row.format(f"r_{alias}_{gpu}", "", "")[:-1] + name + ",",
                row.format(f"a_{alias}_{gpu}", "", "")[:-1] + alias + ","]
p = validate(rows_in)
if p.returncode == 0:
    rows = {r["case"]: r.get("predicted") for r in json.loads(p.stdout)["rows"]}
    for name, alias, gpu in PAIRS:
        a, r = rows[f"a_{alias}_{gpu}"], rows[f"r_{alias}_{gpu}"]
        check(same(a, r), f"fp8_recipe {alias} on {gpu}: {a}, {name}: {r}")
    check(not same(rows["a_fp8_cs_h100-sxm"], rows["a_fp8_sc_h100-sxm"]), "fp8_cs and fp8_sc predict alike")
    check(not same(rows["a_fp8_cs_b200"], rows["a_fp8_mx_b200"]), "fp8_cs and fp8_mx predict alike")

# ---- cp_rotate: torchtitan's context_parallel_rotate_method, simulate's --cp-rotate ----
# Llama 3.1 8B on 8 H100s, cp 8 over a 32,768-token sequence, full AC (a torchtitan CP run)
CP_HDR = ("case,source,model,gpus,gpu,gpus_per_node,inter_node_gbps_per_gpu,dp_replicate,dp_shard,tp,pp,"
          "pp_schedule,pp_virtual,cp,ep,seq,local_batch,micro_batch,global_batch,ac,fp8,sp,async_tp,stack,metric,"
          "value,notes,cp_rotate")
CP = "{0},test,llama3.1-8b,8,h100-sxm,8,400,1,1,1,1,,,8,1,32768,1,1,1,full,0,0,,{1},tokens_per_s_per_gpu,1000,test,{2}"
path = os.path.join(tmp, "cp.csv")
with open(path, "w") as f:
    f.write(CP_HDR + "\n" + CP.format("cp_a2a", "torchtitan-compile", "alltoall") + "\n" +
            CP.format("cp_ag", "torchtitan-compile", "allgather") + "\n")
p = run("validate", path, "--json")
if p.returncode == 0:
    rows = {r["case"]: r.get("predicted") for r in json.loads(p.stdout)["rows"]}
    SIM_CP = ["--model", "llama3.1-8b", "--gpus", "8", "--gpu", "h100-sxm", "--mesh", "cp=8", "--cp", "8", "--seq",
              "32768", "--micro-batch", "1", "--global-batch", "1", "--ac", "full", "--stack", "torchtitan-compile"]
    want_a2a, want_ag = simulate(*SIM_CP, "--cp-rotate", "alltoall"), simulate(*SIM_CP, "--cp-rotate", "allgather")
    check(same(rows["cp_a2a"], want_a2a), f"cp_rotate alltoall: {rows['cp_a2a']}, want {want_a2a}")
    check(same(rows["cp_ag"], want_ag), f"cp_rotate allgather: {rows['cp_ag']}, want {want_ag}")
    check(not same(want_a2a, want_ag), "the rotate method changes no prediction, so the column is not tested")
with open(path, "w") as f:
    f.write(CP_HDR + "\n" + CP.format("cp_mc", "megatron-core", "alltoall") + "\n")
p = run("validate", path, "--json", want_rc=2)
check("cp_mc" in p.stderr and "cp_rotate 'alltoall'" in p.stderr, f"cp_rotate on megatron-core: {p.stderr.strip()}")

# ---- moe_dispatcher hybridep: DeepEP's movement on the stack's hybridep_sms (32) ----
# Qwen3-30B-A3B over 16 H100s (two nodes), EP 16: without the EP overlap the SMs price nothing
# and HybridEP's step is DeepEP's; with it the paired compute runs on 132 - 32 SMs instead of
# 132 - 20, 132/100 = 1.32 against 132/112 = 1.18 as long, so the step is no shorter.
MOE_D = MOE.replace(",1000,test,,,{2},{3},", ",1000,test,,,{2},{3},,{4}")
p = validate([MOE_D.format(f"{d}_{ov or 0}", "megatron-core", ov, "", d) for d in ("hybridep", "deepep")
              for ov in ("", "1")])
if p.returncode == 0:
    rows = {r["case"]: r.get("predicted") for r in json.loads(p.stdout)["rows"]}
    want = simulate(*SIM_MOE, "--moe-dispatcher", "hybridep")
    check(same(rows["hybridep_0"], want), f"moe_dispatcher hybridep: {rows['hybridep_0']}, simulate {want}")
    check(same(rows["hybridep_0"], rows["deepep_0"]), f"hybridep {rows['hybridep_0']} is not deepep's "
          f"{rows['deepep_0']} without the overlap")
    check(same(rows["hybridep_1"], simulate(*SIM_MOE, "--moe-dispatcher", "hybridep", "--overlap-moe-comm")),
          "hybridep with the overlap is not simulate's")
    check(rows["hybridep_1"] <= rows["deepep_1"] and not same(rows["hybridep_1"], rows["deepep_1"]),
          f"with the overlap hybridep's 32 SMs: {rows['hybridep_1']} tokens/s, deepep's 20: {rows['deepep_1']}")

# ---- fp8_recipe nvfp4 and nvfp4_rht: simulate's --fp8 nvfp4 and --nvfp4-no-rht on Blackwell,
# each changing the prediction; nvfp4_rht without nvfp4 refused; nvfp4 on the H100 refused by name ----
NV_HDR = HDR.replace(",fp8_recipe,moe_dispatcher", ",fp8_recipe,moe_dispatcher,nvfp4_rht")
NV = "{0},test,llama3-8b,8,{1},8,400,8,1,1,1,,,1,1,8192,16,2,128,none,1,0,,megatron-core,"\
     "tokens_per_s_per_gpu,1000,test,,,,,{2},,{3}"
path = os.path.join(tmp, "nv.csv")
with open(path, "w") as f:
    f.write(NV_HDR + "\n" + "\n".join([NV.format("nv_rht", "gb200", "nvfp4", ""), NV.format("nv_norht", "gb200", "nvfp4", "0"),
                                        NV.format("nv_mx", "gb200", "mxfp8", ""), NV.format("nv_h100", "h100-sxm", "nvfp4", "")]) + "\n")
p = run("validate", path, "--json")
if p.returncode == 0:
    out = json.loads(p.stdout)
    rows = {r["case"]: r for r in out["rows"]}
    SIM_NV = [a if a != "b200" else "gb200" for a in SIM_DENSE]
    want_rht, want_norht = simulate(*SIM_NV, "--fp8", "nvfp4"), simulate(*SIM_NV, "--fp8", "nvfp4", "--nvfp4-no-rht")
    check(same(rows["nv_rht"].get("predicted"), want_rht), f"nvfp4: {rows['nv_rht']}, want {want_rht}")
    check(same(rows["nv_norht"].get("predicted"), want_norht), f"nvfp4_rht 0: {rows['nv_norht']}, want {want_norht}")
    check(not same(want_rht, want_norht), "--nvfp4-no-rht changes no prediction")
    check(not same(want_rht, rows["nv_mx"].get("predicted")), "nvfp4 and mxfp8 predict alike")
    check("h100-sxm is 9.0" in (rows["nv_h100"].get("refused") or ""), f"nvfp4 on the H100: {rows['nv_h100']}")
else:
    check(False, f"validate of the nvfp4 rows: {p.stderr}")
with open(path, "w") as f:
    f.write(NV_HDR + "\n" + NV.format("nv_bad", "gb200", "mxfp8", "0") + "\n")
p = run("validate", path, "--json", want_rc=2)
check("nvfp4_rht" in p.stderr and "fp8_recipe nvfp4" in p.stderr, f"nvfp4_rht with mxfp8: {p.stderr}")

# ---- fp8_dpa: simulate's --fp8-dpa (Transformer Engine's float8 attention) on the B200, a
# shorter step than bf16 attention; refused without fp8, on the H100 (no FP8 attention price),
# under CP and off a megatron stack, each by name ----
DPA_HDR = HDR + ",fp8_dpa"
DPA = "{0},test,llama3-8b,8,{1},8,400,8,1,1,1,,,1,1,8192,16,2,128,none,{2},0,,{3},"\
      "tokens_per_s_per_gpu,1000,test,,,,,tensorwise,,{4}"
path = os.path.join(tmp, "dpa.csv")
with open(path, "w") as f:
    f.write(DPA_HDR + "\n" + "\n".join([DPA.format("dpa_on", "b200", "1", "megatron-core", "1"),
                                          DPA.format("dpa_off", "b200", "1", "megatron-core", ""),
                                          DPA.format("dpa_h100", "h100-sxm", "1", "megatron-core", "1"),
                                          DPA.format("dpa_tt", "b200", "1", "torchtitan-compile", "1")]) + "\n")
p = run("validate", path, "--json")
if p.returncode == 0:
    rows = {r["case"]: r for r in json.loads(p.stdout)["rows"]}
    want_on = simulate(*SIM_DENSE, "--fp8", "tensorwise", "--fp8-dpa")
    want_off = simulate(*SIM_DENSE, "--fp8", "tensorwise")
    check(same(rows["dpa_on"].get("predicted"), want_on), f"fp8_dpa 1: {rows['dpa_on']}, want {want_on}")
    check(same(rows["dpa_off"].get("predicted"), want_off), f"fp8_dpa empty: {rows['dpa_off']}, want {want_off}")
    check(want_on is not None and want_off is not None and want_on > want_off, "--fp8-dpa does not speed the step")
    check("compute capability 90" in (rows["dpa_h100"].get("refused") or ""),
          f"fp8_dpa on the H100: {rows['dpa_h100']}")
    check("use a megatron stack" in (rows["dpa_tt"].get("refused") or ""), f"fp8_dpa on torchtitan: {rows['dpa_tt']}")
else:
    check(False, f"validate of the fp8_dpa rows: {p.stderr}")
with open(path, "w") as f:
    f.write(DPA_HDR + "\n" + DPA.format("dpa_bf16", "b200", "0", "megatron-core", "1").replace(",tensorwise,", ",,")
            + "\n")
p = run("validate", path, "--json", want_rc=2)
check("fp8_dpa 1" in p.stderr and "fp8 1" in p.stderr, f"fp8_dpa without fp8: {p.stderr}")
SIM_CP = [a if a != "dp_replicate=8" else "dp_replicate=4,cp=2" for a in SIM_DENSE]
p = run("simulate", *SIM_CP, "--fp8", "tensorwise", "--fp8-dpa", want_rc=2)
check("--fp8-dpa with cp 2" in p.stderr, f"--fp8-dpa under CP: {p.stderr}")

# ---- fp8_amax_tp: simulate's --fp8-amax-tp-only (delayed scaling's amaxes over TP alone) on
# 8 H100s at dp_replicate 2 x tp 4: a shorter step than over the data-parallel group (one
# all-reduce over NVLink's 4 ranks for one over the network's 2, both on the compute stream);
# refused without fp8 and under current scaling, each by name ----
AMAX_HDR = HDR + ",fp8_amax_tp"
AMAX = "{0},test,llama3-8b,16,h100-sxm,8,400,4,1,4,1,,,1,1,8192,8,1,32,none,{1},1,,megatron-core,"\
       "tokens_per_s_per_gpu,1000,test,,,,,{2},,{3}"
SIM_AMAX = ["--model", "llama3-8b", "--gpus", "16", "--gpu", "h100-sxm", "--mesh", "dp_replicate=4,tp=4",
            "--seq", "8192", "--micro-batch", "1", "--global-batch", "32", "--stack", "megatron-core"]
path = os.path.join(tmp, "amax.csv")
with open(path, "w") as f:
    f.write(AMAX_HDR + "\n" + "\n".join([AMAX.format("amax_tp", "1", "delayed", "1"),
                                           AMAX.format("amax_dp", "1", "delayed", ""),
                                           AMAX.format("amax_cur", "1", "tensorwise", "1")]) + "\n")
p = run("validate", path, "--json")
if p.returncode == 0:
    rows = {r["case"]: r for r in json.loads(p.stdout)["rows"]}
    want_tp = simulate(*SIM_AMAX, "--fp8", "delayed", "--fp8-amax-tp-only")
    want_dp = simulate(*SIM_AMAX, "--fp8", "delayed")
    check(same(rows["amax_tp"].get("predicted"), want_tp), f"fp8_amax_tp 1: {rows['amax_tp']}, want {want_tp}")
    check(same(rows["amax_dp"].get("predicted"), want_dp), f"fp8_amax_tp empty: {rows['amax_dp']}, want {want_dp}")
    check(want_tp is not None and want_dp is not None and want_tp > want_dp,
          "--fp8-amax-tp-only does not speed the step")
    check("NVTE_DP_AMAX_REDUCE_INTERVAL" in (rows["amax_cur"].get("refused") or ""),
          f"fp8_amax_tp under current scaling: {rows['amax_cur']}")
else:
    check(False, f"validate of the fp8_amax_tp rows: {p.stderr}")
with open(path, "w") as f:
    f.write(AMAX_HDR + "\n" + AMAX.format("amax_bf16", "0", "", "1") + "\n")
p = run("validate", path, "--json", want_rc=2)
check("fp8_amax_tp 1" in p.stderr and "fp8 1" in p.stderr, f"fp8_amax_tp without fp8: {p.stderr}")

# ---- the optional integer columns' ranges (validate_csv.c opt_int): a value out of range is
# an input error, exit 2, naming the column, its value and the range, before any plan is
# built. dist_opt_instances counts Megatron-LM's --num-distributed-optimizer-instances, 1 and
# up (empty: one instance), so 0 is out; pp_virtual is bounded by MP_LIM_PP_VIRTUAL = 256
# (common/limits.h), so 257 is out (a plan would refuse it too, but as a row, not as input) ----
for col, val, rng in (("dist_opt_instances", "0", "1..1048576"), ("pp_virtual", "257", "1..256")):
    with open(path, "w") as f:
        f.write(HDR + ",dist_opt_instances\n")
        row = DENSE.format("range_" + col, "", "")
        if col == "pp_virtual":  # the 13th column, empty in DENSE
            cells = row.split(",")
            cells[12] = val
            row = ",".join(cells) + ","
        else:
            row += "," + val
        f.write(row + "\n")
    p = run("validate", path, "--json", want_rc=2)
    check(f"column '{col}' = '{val}'" in p.stderr and rng in p.stderr, f"{col} {val}: {p.stderr}")

# ---- fp8_scope: simulate's --fp8-scope (torchtitan's float8 grouped GEMMs) on Qwen3-30B-A3B,
# 8 H100s, dp_shard 8 x ep 8, rowwise: experts in float8 shorten the step against the Linears
# alone; refused without fp8 ----
SCOPE_HDR = HDR + ",fp8_scope"
SCOPE = "{0},test,qwen3-30b-a3b,8,h100-sxm,8,400,1,8,1,1,,,1,8,4096,2,1,16,full,{1},0,,torchtitan-compile,"\
        "tokens_per_s_per_gpu,1000,test,,,,,{2},,{3}"
SIM_SCOPE = ["--model", "qwen3-30b-a3b", "--gpus", "8", "--gpu", "h100-sxm", "--mesh", "dp_shard=8,ep=8",
             "--seq", "4096", "--micro-batch", "1", "--global-batch", "16", "--ac", "full",
             "--stack", "torchtitan-compile", "--fp8", "rowwise"]
path = os.path.join(tmp, "scope.csv")
with open(path, "w") as f:
    f.write(SCOPE_HDR + "\n" + "\n".join([SCOPE.format("sc_exp", "1", "rowwise", "experts"),
                                            SCOPE.format("sc_lin", "1", "rowwise", "")]) + "\n")
p = run("validate", path, "--json")
if p.returncode == 0:
    rows = {r["case"]: r for r in json.loads(p.stdout)["rows"]}
    want_exp = simulate(*SIM_SCOPE, "--fp8-scope", "experts")
    want_lin = simulate(*SIM_SCOPE)
    check(same(rows["sc_exp"].get("predicted"), want_exp), f"fp8_scope experts: {rows['sc_exp']}, want {want_exp}")
    check(same(rows["sc_lin"].get("predicted"), want_lin), f"fp8_scope empty: {rows['sc_lin']}, want {want_lin}")
    check(want_exp is not None and want_lin is not None and want_exp != want_lin,
          "--fp8-scope experts does not change the step")
else:
    check(False, f"validate of the fp8_scope rows: {p.stderr}")
with open(path, "w") as f:
    f.write(SCOPE_HDR + "\n" + SCOPE.format("sc_bf16", "0", "", "all") + "\n")
p = run("validate", path, "--json", want_rc=2)
check("fp8_scope all" in p.stderr and "fp8 1" in p.stderr, f"fp8_scope without fp8: {p.stderr}")

# ---- ce_fusion_impl te: Transformer Engine's cross-entropy, the fp32 softmax not kept ----
# Llama 3 8B on 8 B200s (dp_replicate 8, seq 8192, micro-batch 2: T = 16,384 rows of V =
# 128,256 logits), peak memory. Megatron-Core's native fused cross-entropy keeps the bf16
# logits (2 bytes an element) and the fp32 softmax it saves for backward (4); Transformer
# Engine's writes the gradient over the bf16 logits and keeps nothing else (2). The peak is at
# the loss, so te lowers it by 4 x 16,384 x 128,256 = 8,405,385,216 bytes = 7.828 GiB.
CE_HDR = ("case,source,model,gpus,gpu,gpus_per_node,inter_node_gbps_per_gpu,dp_replicate,dp_shard,tp,pp,"
          "pp_schedule,pp_virtual,cp,ep,seq,local_batch,micro_batch,global_batch,ac,fp8,sp,async_tp,stack,metric,"
          "value,notes,ce_fusion,ce_fusion_impl")
CE = "{0},test,llama3-8b,8,b200,8,400,8,1,1,1,,,1,1,8192,16,2,128,none,0,0,,megatron-core,"\
     "peak_mem_gib,100,test,{1},{2}"
path = os.path.join(tmp, "ce.csv")
with open(path, "w") as f:
    f.write(CE_HDR + "\n" + "\n".join([CE.format("ce_te", "1", "te"), CE.format("ce_native", "1", "native"),
                                         CE.format("ce_empty", "1", "")]) + "\n")
p = run("validate", path, "--json")
if p.returncode == 0:
    rows = {r["case"]: r.get("predicted") for r in json.loads(p.stdout)["rows"]}
    q = run("simulate", *SIM_DENSE, "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te", "--json")
    d = json.loads(q.stdout) if q.returncode == 0 else None  # validate's peak leaves the 3 GiB runtime out
    want_te = (d["peak_mem_bytes"] - 3 * 2**30) / 2**30 if d else None
    check(same(rows["ce_te"], want_te), f"ce_fusion_impl te: {rows['ce_te']} GiB, want simulate's {want_te}")
    check(same(rows["ce_native"], rows["ce_empty"]), f"ce_fusion_impl native is empty's: {rows}")
    check(rows["ce_native"] is not None and rows["ce_te"] is not None and
          abs((rows["ce_native"] - rows["ce_te"]) - 8405385216 / 2**30) < 1e-6,
          f"te spares the fp32 softmax, 7.828 GiB: {rows}")
else:
    check(False, f"validate of the ce_fusion_impl rows: {p.stderr}")
with open(path, "w") as f:
    f.write(CE_HDR + "\n" + CE.format("ce_nofuse", "", "te") + "\n")
p = run("validate", path, "--json", want_rc=2)
check("ce_fusion_impl te" in p.stderr and "ce_fusion 1" in p.stderr, f"ce_fusion_impl without ce_fusion: {p.stderr}")
with open(path, "w") as f:
    f.write(CE_HDR + "\n" + CE.format("ce_bad", "1", "triton") + "\n")
p = run("validate", path, "--json", want_rc=2)
check("native or te" in p.stderr, f"ce_fusion_impl triton: {p.stderr}")

for f in fails:
    print("FAIL:", f)
print(f"{len(fails)} failures")
sys.exit(1 if fails else 0)
