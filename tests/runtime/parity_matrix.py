"""Multi-rank parity matrix for the CPU runtime: a wrong order or sharding must not give
wrong gradients silently.

Every plan of the matrix (ROWS) is trained with `mpirun -np N meshplan train --mesh ...`
and compared with the single-rank run of the same model, AC mode, float8 setting and global
batch (same seed, micro-batch and data):
  - per-step losses over STEPS steps equal within 1e-5 relative;
  - the full gradients after step 1 (gathered from the shards by --dump-grads) equal
    within 1e-5 relative, per parameter, twice: the L2 norm of the difference over the L2
    norm, and the largest element-wise difference over the tensor's largest magnitude (a
    few wrong elements of a large tensor hide in the L2 norm, not in the max).
Multi-head latent attention (tiny-mla, tiny-mla-q): dp_shard=2, tp=2, dp_shard=2 x tp=2,
ep=2 (dp_shard=2), ep=2 x tp=2 (dp_shard=2), each AC mode, and tp=2 without SP; a dense
MLA model (tiny-mla-dense) on pp=2 and pp=2 x dp_shard=2 x tp=2 (AC none and full), and
pp=2 under GPipe.
Meshes: 1 rank (the reference), dp_shard=4, dp_replicate=2 x dp_shard=2, tp=2, tp=4,
dp_shard=2 x tp=2; for the MoE model also ep=2 (dp_shard=2), ep=4 (dp_shard=4) and
ep=2 x tp=2; for the dense model also cp=2, cp=4, dp_shard=2 x cp=2 x tp=2 and pp=2 x cp=2
(ring attention over 2 x cp load-balanced chunks); each with AC none, selective-core and full.
Plans with tp > 1 run sequence parallelism (the default); tp=2, the MoE's ep=2 x tp=2 and
pp x tp x dp_shard also run without it (--no-sp, the all-reduce form). Float8 on for
dp_shard=2 x tp=2 (dense, without SP: the runtime's float8 Linears run without it) against
the single-rank float8 run. Pipelines (exec/runtime/runtime_pp.c): pp=2 and pp=4 under
1F1B, GPipe and the interleaved schedule (pp_virtual 2), pp x dp_shard, pp x tp x dp_shard,
a tied model (tiny-tied: the first and last stage each hold the embedding), uneven stages
and padded shards (tiny-odd: 8 layers on pp=3, vocab 250 and d_ff 136 on dp_shard=3 and 4).
MoE in pipelines (tiny-moe-pp: a dense first layer, 3 MoE layers): pp=2 under 1F1B and
interleaved, pp=4, uneven stages (--pp-layers 1,3 and 3,1 with GPipe), pp x dp_shard x ep
(ep=2 and 4, with tp=2 with and without SP). The expert grid (etp=1: EP spans the tp ranks,
each routing its own sequence shard): tp=2 x ep=2, dp_shard=2 x tp=2 x ep=4 and x ep=2 on
tiny-moe, pp=2 x tp=2 x ep=2 on tiny-moe-pp, tp=2 x ep=2 on tiny-mla; with dp_replicate:
dp_replicate=2 x tp=2 x ep=2, and EP reaching into dp_replicate (the experts' gradients
summed over the expert-DP group): dp_replicate=2 x tp=2 x ep=4, dp_replicate=4 x tp=2 x
ep=4, dp_replicate=2 x dp_shard=2 x ep=4 and, with etp=2, dp_replicate=2 x tp=2 x ep=2.
Expert tensor
parallelism (etp=2: each local expert split over its expert-TP group, the received rows
all-gathered over it and the outputs reduce-scattered): dp_shard=2 x tp=2 x ep=2 on
tiny-moe, and on 8 ranks with an expert-FSDP group of 2 and with dp_replicate=2; inside
pipeline stages, tiny-moe-pp on pp=2 x dp_shard=2 x tp=2 x ep=2 x etp=2 under 1F1B and
interleaved and pp=2 x dp_replicate=2 x tp=2 x ep=2 x etp=2 under GPipe. etp other than
tp: tp=4 x ep=2 x etp=2, with dp_shard=2 and dp_replicate=2 (8 ranks) and inside pp=2
stages; etp=2 with tp=1 on dp_shard=4 and dp_shard=8 x ep=2; etp=4 above tp=2 on
dp_shard=4 x tp=2 x ep=2.
Every run is under `timeout` and MESHPLAN_COMM_TIMEOUT_S: a hang fails the test, naming the
rank, group and operation.

Quick and full. Each row says whether it is `quick`: the quick set (one AC policy per
parallelism, each schedule once, the uneven meshes) runs in scripts/test through
//tests/runtime:parity_test; the full set (every row) is //tests/runtime:parity_full_test,
tagged manual and nightly (`scripts/test --full`, or bazel test it by name). docs/testing.md
lists both with their times on the 2-core machine. `--only S` keeps the rows whose name
contains S.

Memory (the measured peak memory per rank equals the simulator's prediction to the byte):
every run, the single-rank references included, also records the plan's prediction (train
--db: the planner on the meshplan-cpu stack, whose memory model is the runtime's layout,
exec/act_layout.h) and prints its measured peak (the largest rank's, over the 20 steps).
Non-EP plans: predicted == measured (MEM_TOL 0: both count the same allocations; the layout
itself is held to hand-derived sizes by tests/schedule:runtime_layout_test). EP plans: see
ep_mem_bound.

Usage: parity_matrix.py MESHPLAN [--quick] [--fp8-only] [--only S]
"""
import itertools
import json
import os
import re
import sqlite3
import struct
import subprocess
import sys
import tempfile

import numpy as np

STEPS = 20
TOL = 1e-5
# Float8 plans: step-1 gradients at TOL, losses over the 20 steps at FP8_LOSS_TOL. E4M3 has
# 3 mantissa bits, so quantization is discontinuous: the ~1e-8 differences that reduction
# order leaves in the weights (reduce-scatter sums ranks in another order than one rank
# accumulates micro-batches; tp splits every GEMM's sum) flip individual E4M3 codes after
# a few steps, and each flip moves a value by up to 1/16 of it. The losses then wander
# apart at 1e-4 to 1e-3 over 20 steps: bounded, not a wrong gradient (a wrong gradient shows at
# step 1, which is held to 1e-5).
FP8_LOSS_TOL = 5e-3
# Float8 plans' step-1 gradients, element by element: the same ~1e-8 differences can flip an
# E4M3 code of an activation already in step 1's forward (a value at a rounding boundary).
# A flip moves that element by one E4M3 step, at most 2^-3 of it, and a weight gradient
# element sums MICRO_BATCH x SEQ = 64 token rows, one of which carries the flip: at most
# 2^-3 / 64 = 2.0e-3 of the tensor's largest element. The L2 check stays at TOL.

MEM_TOL = 0  # non-EP plans: the prediction is the runtime's allocations, byte for byte
# EP plans: the expert side of a MoE layer (received rows; their gate, up and hidden; the
# outputs before the combine; the backward workspace) is sized by the rows routing sends to
# a rank, known only at run time. The prediction assumes balanced routing, R = NR x top_k rows
# per rank and layer (NR the tokens a rank routes: N = micro-batch x seq, or under the expert
# grid its sequence shard N / tp): the mean over the EP group, exactly, since every row sent
# is received. Hence, with sizes linear in R (tiny-moe's d_model and
# expert d_ff are multiples of 16, so the runtime's 16-float alignment adds nothing):
#   - lower bound: at the predicted peak's point of the step every rank holds the same
#     buffers, and their mean size over the EP group is the balanced one, so the busiest
#     rank holds at least the prediction: measured >= predicted;
#   - upper bound: with R_max the most rows any rank received in one layer (train prints it),
#     no live buffer grows by more than (R_max - N x top_k) rows; at most every MoE layer's
#     saved expert side (d_model + 3 d_ff_expert floats a row) and one transient (outputs,
#     d_model, or the backward workspace, 2 d_model + 3 d_ff_expert) are live at once.
# tiny-moe (data/models/tiny-moe.json): d_model 64, d_ff_expert 32, top_k 2, 2 MoE layers.
# Under a pipeline a stage holds the saved expert sides of every micro-batch in flight (its
# forward run, its backward not): at most the rank's micro-batches, so the saved term is
# counted that many times (in_flight).
# tiny-moe-pp: the same experts in 4 layers, the first dense (3 MoE layers).
# tiny-mla, tiny-mla-q (data/models): d_model 64, d_ff_expert 16, top_k 2, 2 MoE layers of 3.
# With the experts' capacity (--moe-capacity-factor) the rows dropped are sent nowhere, so
# the mean over the EP group falls below the balanced R and the lower bound goes: a rank's
# expert side holds at least no rows, so no buffer shrinks by more than its N x top_k rows
# (the same per-row sizes): measured >= predicted - N x top_k rows of them.
MOE_DIMS = {"tiny-moe": dict(C=64, Fe=32, K=2, L_moe=2), "tiny-moe-pp": dict(C=64, Fe=32, K=2, L_moe=3),
            "tiny-mla": dict(C=64, Fe=16, K=2, L_moe=2), "tiny-mla-q": dict(C=64, Fe=16, K=2, L_moe=2)}
SEQ, MICRO_BATCH = 32, 2
FP8_GRAD_MAXABS_TOL = 2.0 ** -3 / (MICRO_BATCH * SEQ)
# The experts' capacity keeps an expert's assignments of the largest routing weight: a
# discrete choice, like float8's codes. Two assignments of one expert whose weights differ
# by ~1e-8 at the capacity's edge swap places between runs whose reductions differ in
# order: the single-rank tiny-mla run at factor 1.0 has such a pair (weights 1.5e-8 apart)
# in its 9th step, after which the losses part at ~1e-4. Capacity rows: losses at TOL over
# the first CAPACITY_STRICT_STEPS steps, at CAPACITY_LOSS_TOL after; step-1 gradients at TOL.
CAPACITY_STRICT_STEPS = 5
CAPACITY_LOSS_TOL = 5e-3


def mesh_dims(mesh):
    return {k: int(v) for k, v in (kv.split("=") for kv in (mesh or "").split(",") if kv)}


def routed_tokens(mesh):
    """Tokens a rank routes: the micro-batch's, or under the expert grid (etp given) with tp
    its sequence shard (exec/act_layout.h, NR)."""
    d = mesh_dims(mesh)
    return MICRO_BATCH * SEQ // (d.get("tp", 1) if "etp" in d else 1)


def expert_side_tokens(mesh):
    """Tokens whose rows an expert side holds when routing is balanced: the rank's routed
    ones, x etp under expert tensor parallelism, whose group all-gathers its ranks' received
    rows (exec/runtime/runtime_etp.c). An expert's width is Fe / etp there, so ep_mem_bound's
    whole-Fe rows overstate each excess row: the bound stays an upper one."""
    return routed_tokens(mesh) * mesh_dims(mesh).get("etp", 1)


def ep_mem_bound(model, rows_max, in_flight=1, routed=MICRO_BATCH * SEQ):
    """Largest excess (bytes) of the measured peak over the balanced prediction."""
    d = MOE_DIMS[model]
    assert d["C"] % 16 == 0 and d["Fe"] % 16 == 0, "sizes not linear in the rows: extend the bound"
    per_row = 4 * (in_flight * d["L_moe"] * (d["C"] + 3 * d["Fe"]) + max(d["C"], 2 * d["C"] + 3 * d["Fe"]))
    return max(0, rows_max - routed * d["K"]) * per_row


def micro_batches_per_rank(mesh, gb):
    """A rank's micro-batches: the global batch over the data-parallel ranks, in micro-batches."""
    dp = 1
    for kv in (mesh or "").split(","):
        if kv:
            k, v = kv.split("=")
            if k in ("dp_shard", "dp_replicate"):
                dp *= int(v)
    return gb // (dp * MICRO_BATCH)


def read_wfile(path):
    b = open(path, "rb").read()
    assert b[:4] == b"MPWT", "bad magic in %s" % path
    ver, count = struct.unpack_from("<II", b, 4)
    pos, out = 12, {}
    for _ in range(count):
        (nl,) = struct.unpack_from("<I", b, pos); pos += 4
        name = b[pos:pos + nl].decode(); pos += nl
        (nd,) = struct.unpack_from("<I", b, pos); pos += 4
        shape = struct.unpack_from("<%dq" % nd, b, pos); pos += 8 * nd
        n = int(np.prod(shape))
        out[name] = np.frombuffer(b, dtype="<f4", count=n, offset=pos).reshape(shape).astype(np.float64)
        pos += 4 * n
    return out


def row(model, mesh, ac="none", fp8=False, quick=False, gb=8, args=(), mem_gap=0, ref_args=()):
    """ref_args: options the single-rank reference takes too (the experts' capacity)."""
    return dict(model=model, mesh=mesh, ac=ac, fp8=fp8, quick=quick, gb=gb, args=list(args) + list(ref_args),
                mem_gap=mem_gap, ref_args=list(ref_args))


# The simulator's in-flight memory of the interleaved schedule (sim/pipeline.c,
# mp_sim_pp_held_extra) adds to one micro-batch's replayed peak what the schedule holds
# beyond it at its fullest point. When that replay peaks in another chunk's backward than
# the one where the stage holds the most (stage 1 of tiny-moe-pp on pp=2 x pp_virtual 2
# under full AC: the head chunk's backward against chunk 0's with three chunk-0 inputs
# held), the sum falls short of the true peak by less than one chunk's held tensors: one
# layer's saved input under full AC, N x d_model fp32 (N = micro-batch x seq). Such a row
# checks predicted <= measured <= predicted + that (MEM_GAP_FULL_AC_CHUNK) and says so.
MEM_GAP_FULL_AC_CHUNK = {"tiny-moe-pp": 4 * MICRO_BATCH * SEQ * MOE_DIMS["tiny-moe-pp"]["C"]}


def build_rows():
    """The matrix. quick: in scripts/test's parity_test; every row: parity_full_test."""
    rows = []
    dense_meshes = ["dp_shard=4", "dp_replicate=2,dp_shard=2", "tp=2", "tp=4", "dp_shard=2,tp=2"]
    moe_meshes = dense_meshes + ["dp_shard=2,ep=2", "dp_shard=4,ep=4", "dp_shard=2,ep=2,tp=2"]
    for model, meshes in (("tiny-dense", dense_meshes), ("tiny-moe", moe_meshes)):
        for ac in ("none", "selective-core", "full"):
            for mesh in meshes:
                rows.append(row(model, mesh, ac, quick=ac == "selective-core"))
    # context parallelism (ring attention over 2 x cp load-balanced chunks); with tp, SP;
    # inside a pipeline
    for ac in ("none", "selective-core", "full"):
        for mesh in ("cp=2", "cp=4", "dp_shard=2,cp=2,tp=2", "pp=2,cp=2"):
            # quick: cp=2, and cp=4, whose ring tells its two directions apart (on two ranks
            # the previous rank is the next)
            rows.append(row("tiny-dense", mesh, ac, quick=ac == "full" and mesh in ("cp=2", "cp=4", "pp=2,cp=2")))
    # tensor parallelism without SP: the all-reduce form
    for ac in ("none", "full"):
        rows.append(row("tiny-dense", "tp=2", ac, args=["--no-sp"], quick=ac == "full"))
    rows.append(row("tiny-moe", "dp_shard=2,ep=2,tp=2", "selective-core", args=["--no-sp"]))
    rows.append(row("tiny-dense", "dp_shard=2,tp=2", "selective-core", fp8=True, quick=True))
    rows.append(row("tiny-dense", "dp_shard=4", "none", fp8=True))
    # Pipelines. Schedules: 1F1B (the default), GPipe, interleaved (2 model chunks per
    # stage: 4 chunks on pp=2, 8 on pp=4, so the 8-layer tiny-odd); the global batch of 8
    # is 4 micro-batches of 2 (a multiple of pp, as the interleaved schedule needs).
    gpipe, inter = ["--pp-schedule", "gpipe"], ["--pp-schedule", "interleaved", "--pp-virtual", "2"]
    for ac in ("none", "selective-core", "full"):
        q = ac == "none"
        rows.append(row("tiny-dense", "pp=2", ac, quick=q))
        rows.append(row("tiny-dense", "pp=2", ac, args=gpipe, quick=q))
        rows.append(row("tiny-dense", "pp=2,dp_shard=2", ac, quick=q))
        rows.append(row("tiny-odd", "pp=4", ac))
        rows.append(row("tiny-odd", "pp=4", ac, args=gpipe))
        rows.append(row("tiny-odd", "pp=2", ac, args=inter, quick=q))
        # quick: pp=4 interleaved, 8 model chunks over 4 stages with as many micro-batches
        # as stages (the warm-up runs every forward first), transfers between middle stages
        rows.append(row("tiny-odd", "pp=4", ac, args=inter, quick=q))
        rows.append(row("tiny-tied", "pp=2", ac, quick=q))
        rows.append(row("tiny-tied", "pp=4", ac))
        rows.append(row("tiny-tied", "pp=2", ac, args=inter))
        rows.append(row("tiny-tied", "pp=2,dp_shard=2", ac, args=gpipe))
    # pp x tp x dp_shard (8 ranks), with sequence parallelism (the default) and without
    rows.append(row("tiny-dense", "pp=2,dp_shard=2,tp=2", "selective-core"))
    rows.append(row("tiny-dense", "pp=2,dp_shard=2,tp=2", "selective-core", args=["--no-sp"]))
    # Uneven: sizes the mesh does not divide. tiny-odd on pp=3 (3, 3 and 2 layers), on
    # dp_shard=3 (vocab 250 and d_ff 136 in padded shards: ceil, not floor) and on dp_shard=4;
    # a global batch of 6: 3 micro-batches on pp=3, one per rank on dp_shard=3
    rows.append(row("tiny-odd", "pp=3", "none", quick=True, gb=6))
    rows.append(row("tiny-odd", "pp=3", "full", gb=6, args=gpipe))
    rows.append(row("tiny-odd", "dp_shard=3", "none", quick=True, gb=6))
    rows.append(row("tiny-odd", "dp_shard=3", "full", gb=6))
    rows.append(row("tiny-odd", "dp_shard=4", "selective-core"))
    rows.append(row("tiny-odd", "pp=2,dp_shard=2", "none", quick=True))
    # interleaved inside FSDP: the root unit's gradients begun by one micro-batch's backward
    # and still held when the next one's begins (4 micro-batches per rank: a global batch of 16)
    rows.append(row("tiny-odd", "pp=2,dp_shard=2", "none", gb=16, args=inter))
    rows.append(row("tiny-tied", "pp=2,dp_shard=2", "selective-core", gb=16, args=inter))
    rows.append(row("tiny-tied", "dp_shard=3", "none", gb=6))
    # a layout per model chunk (Megatron-LM's --pipeline-model-parallel-layout "Et|t*3|t*3|tL")
    rows.append(row("tiny-odd", "pp=2", "none", args=inter + ["--pp-layers", "1,3,3,1"], quick=True))
    rows.append(row("tiny-odd", "pp=2", "selective-core", args=inter + ["--pp-layers", "3,1,1,3"]))
    # MoE inside pipelines (tiny-moe-pp: a dense first layer, then 3 MoE layers): each
    # micro-batch's routing kept from a block's forward to its backward while the stage runs
    # others, the load-balancing loss added by the stage that runs its layer; EP's
    # all-to-alls inside a stage (pp x dp_shard x ep); uneven stages (--pp-layers: the dense
    # layer alone, or with two MoE layers). pp x dp_shard x ep at a global batch of 16: at 8
    # the run's losses leave the single-rank run's at step 4 (4e-5) although each of steps
    # 1-3 started from the single-rank run's checkpoint gives its gradients within 1.6e-7
    # and step 4 from the same weights its loss: the ~1e-7 differences that reduction order
    # leaves in the weights over steps 1-3 are amplified at step 4 (top-k routing is
    # discontinuous in the router's logits).
    layers = lambda s: ["--pp-layers", s]
    for ac in ("none", "selective-core", "full"):
        rows.append(row("tiny-moe-pp", "pp=2", ac))
        gap = MEM_GAP_FULL_AC_CHUNK["tiny-moe-pp"] if ac == "full" else 0
        rows.append(row("tiny-moe-pp", "pp=2", ac, args=inter, mem_gap=gap))
        rows.append(row("tiny-moe-pp", "pp=2,dp_shard=2,ep=2", ac, gb=16, args=inter, quick=ac == "full"))
        rows.append(row("tiny-moe-pp", "pp=2", ac, args=layers("1,3"), quick=ac == "full"))
    rows.append(row("tiny-moe-pp", "pp=4", "selective-core"))
    rows.append(row("tiny-moe-pp", "pp=2", "none", args=gpipe + layers("3,1")))
    rows.append(row("tiny-moe-pp", "pp=2,dp_shard=2,ep=2", "none", gb=16))
    rows.append(row("tiny-moe-pp", "pp=2,dp_shard=4,ep=4", "full", gb=16))
    rows.append(row("tiny-moe-pp", "pp=2,dp_shard=2,ep=2,tp=2", "selective-core", gb=16))
    rows.append(row("tiny-moe-pp", "pp=2,dp_shard=2,ep=2,tp=2", "selective-core", gb=16, args=["--no-sp"]))
    # the expert grid (etp=1): EP spans the tp ranks, each routing its own sequence shard
    # (the load-balancing loss's counts and probabilities summed over tp, the router's
    # gradient likewise), experts whole on a rank
    for ac in ("none", "selective-core", "full"):
        rows.append(row("tiny-moe", "tp=2,ep=2,etp=1", ac, quick=ac == "full"))
        rows.append(row("tiny-moe", "dp_shard=2,tp=2,ep=4,etp=1", ac))
    # ep=2 over dp_shard=2 x tp=2: each expert sharded over its FSDP group of 2 (dp_shard x tp / ep)
    rows.append(row("tiny-moe", "dp_shard=2,tp=2,ep=2,etp=1", "none"))
    # with dp_replicate: ep=2 inside tp=2, each expert's gradient all-reduced over
    # dp_replicate (its two replicas); and EP reaching into dp_replicate (Megatron-Core's
    # expert grid over its whole data-parallel group: ep x etp a multiple of dp_shard x tp),
    # the experts whole on a rank and their gradients summed over the expert-DP group
    # (mp_mesh_expert_replica_group): one rank on dp_replicate=2 x tp=2 x ep=4 and on
    # dp_replicate=2 x dp_shard=2 x ep=4 (nothing to sum), {r, r + 4} on dp_replicate=4 x tp=2
    # x ep=4, and with expert tensor parallelism (etp=2) on dp_replicate=2 x tp=2 x ep=2;
    # the dense weights' gradients over dp_replicate throughout
    rows.append(row("tiny-moe", "dp_replicate=2,tp=2,ep=2,etp=1", "selective-core"))
    rows.append(row("tiny-moe", "dp_replicate=2,tp=2,ep=4,etp=1", "selective-core", quick=True))
    rows.append(row("tiny-moe", "dp_replicate=4,tp=2,ep=4,etp=1", "none", gb=16))
    rows.append(row("tiny-moe", "dp_replicate=2,tp=2,ep=2,etp=2", "none"))
    rows.append(row("tiny-moe", "dp_replicate=2,dp_shard=2,ep=4,etp=1", "full"))
    rows.append(row("tiny-moe-pp", "pp=2,tp=2,ep=2,etp=1", "selective-core", gb=16))
    rows.append(row("tiny-mla", "tp=2,ep=2,etp=1", "selective-core"))
    # expert tensor parallelism (etp=2, exec/runtime/runtime_etp.c): each local expert's
    # gate/up split column-wise and down row-wise over its expert-TP group, the received rows
    # all-gathered over the group and the down projection's partial sums reduce-scattered
    # back (etp = tp: each tp rank routes its shard); on 8 ranks the expert weights sharded
    # over an expert-FSDP group of 2, and their gradients all-reduced over dp_replicate=2
    for ac in ("none", "selective-core", "full"):
        rows.append(row("tiny-moe", "dp_shard=2,tp=2,ep=2,etp=2", ac, quick=ac == "full"))
    rows.append(row("tiny-moe", "dp_shard=4,tp=2,ep=2,etp=2", "selective-core", gb=16))
    rows.append(row("tiny-moe", "dp_replicate=2,dp_shard=2,tp=2,ep=2,etp=2", "none", gb=16))
    # etp other than tp (Megatron-Core's --expert-tensor-parallel-size apart from tp: the
    # expert grid [edp, ep, etp], etp innermost, over the stage's ranks, parallel_state.py
    # core_v0.14.0). Every rank routes its own rows (under tp with SP its sequence shard),
    # so an expert-TP group gathers rows of ranks that hold other shards or other batches:
    # tp=4 x ep=2 x etp=2 (ETP {0,1} {2,3}, EP {0,2} {1,3}: half a tp group each), and on 8
    # ranks with an expert-FSDP group of 2 (dp_shard=2; the experts' reduce-scatter) and an
    # expert-DP group of 2 (dp_replicate=2; the experts' all-reduce), inside pipeline
    # stages; etp=2 with tp=1 (ETP groups of two dp_shard ranks: two micro-batches
    # gathered), alone and with an expert-FSDP group of 2; etp=4 above tp=2
    rows.append(row("tiny-moe", "tp=4,ep=2,etp=2", "selective-core", quick=True))
    rows.append(row("tiny-moe", "dp_shard=2,tp=4,ep=2,etp=2", "none", gb=16))
    rows.append(row("tiny-moe", "dp_replicate=2,tp=4,ep=2,etp=2", "full", gb=16))
    rows.append(row("tiny-moe-pp", "pp=2,tp=4,ep=2,etp=2", "selective-core", gb=16))
    rows.append(row("tiny-moe", "dp_shard=4,ep=2,etp=2", "none", quick=True))
    rows.append(row("tiny-moe", "dp_shard=8,ep=2,etp=2", "selective-core", gb=16))
    # quick: an expert-TP ring of 4, where a rank's previous and next peers differ (at etp=2
    # they are one rank, so the quick rows above cannot tell the directions apart)
    rows.append(row("tiny-moe", "dp_shard=4,tp=2,ep=2,etp=4", "none", gb=16, quick=True))
    # inside pipeline stages (tiny-moe-pp, 8 ranks): each micro-batch's per-block counts kept
    # from its forward to its backward, under 1F1B, interleaved and GPipe; the GPipe row's EP
    # x ETP block of 4 reaches into dp_replicate (expert-DP of one rank)
    rows.append(row("tiny-moe-pp", "pp=2,dp_shard=2,tp=2,ep=2,etp=2", "selective-core", gb=16, quick=True))
    rows.append(row("tiny-moe-pp", "pp=2,dp_shard=2,tp=2,ep=2,etp=2", "full", gb=16, args=inter))
    rows.append(row("tiny-moe-pp", "pp=2,dp_replicate=2,tp=2,ep=2,etp=2", "none", gb=16, args=gpipe))
    # multi-head latent attention (exec/runtime/runtime_mla.c) with MoE and a leading dense
    # layer: tiny-mla (q_proj, whose input gradient is reduced over tp beside the latent
    # path's whole one) and tiny-mla-q (a query latent: nothing to reduce); quick: tiny-mla
    # on dp_shard x ep x tp with SP
    for model in ("tiny-mla", "tiny-mla-q"):
        for ac in ("none", "selective-core", "full"):
            for mesh in ("dp_shard=2", "tp=2", "dp_shard=2,tp=2", "dp_shard=2,ep=2", "dp_shard=2,ep=2,tp=2"):
                rows.append(row(model, mesh, ac, quick=model == "tiny-mla" and ac == "selective-core" and
                                mesh == "dp_shard=2,ep=2,tp=2"))
        rows.append(row(model, "tp=2", "none", args=["--no-sp"]))
    # MLA with MoE inside pipeline stages: tiny-mla's dense first layer and two MoE layers on
    # 2 stages, alone and with EP inside each stage
    rows.append(row("tiny-mla", "pp=2", "selective-core"))
    rows.append(row("tiny-mla", "pp=2,dp_shard=2,ep=2", "none", gb=16))
    # MLA inside pipeline stages: tiny-mla-dense, 4 layers on 2 stages
    for ac in ("none", "full"):
        rows.append(row("tiny-mla-dense", "pp=2", ac))
        rows.append(row("tiny-mla-dense", "pp=2,dp_shard=2,tp=2", ac))
    rows.append(row("tiny-mla-dense", "pp=2", "selective-core", args=["--pp-schedule", "gpipe"]))
    # the experts' capacity (train --moe-capacity-factor; exec/runtime/runtime_moe.c): it is
    # counted over the tokens a rank routes in one micro-batch, so a data-parallel rank's
    # micro-batch drops what the single rank's same micro-batch drops (the single rank runs
    # the global batch as micro-batches in the ranks' order), tp ranks outside the expert
    # grid route the same rows, and a pipeline stage the same micro-batches: each such plan
    # equals the single-rank run with the same factor. Under the expert grid each tp rank
    # counts the capacity over its sequence shard (Megatron-Core's router under SP), which
    # no single-rank run does: no row.
    cap = ["--moe-capacity-factor", "1.0"]
    rows.append(row("tiny-moe", "dp_shard=2,ep=2", "none", quick=True, ref_args=cap))
    rows.append(row("tiny-moe", "dp_shard=2,ep=2,tp=2", "full", ref_args=cap))
    rows.append(row("tiny-moe", "dp_replicate=2,dp_shard=2,ep=2", "selective-core", ref_args=cap))
    rows.append(row("tiny-moe-pp", "pp=2,dp_shard=2,ep=2", "full", gb=16, ref_args=["--moe-capacity-factor", "1.25"]))
    rows.append(row("tiny-mla", "dp_shard=2,ep=2", "none", ref_args=cap))
    return rows


ROWS = build_rows()


def main():
    meshplan = os.path.abspath(sys.argv[1])
    quick = "--quick" in sys.argv
    tmp = os.environ.get("TEST_TMPDIR") or tempfile.mkdtemp()
    env = dict(os.environ, OMP_NUM_THREADS="1", OMPI_MCA_btl="self,vader", TMPDIR=tmp)
    env["ASAN_OPTIONS"] = (env.get("ASAN_OPTIONS", "") + ":detect_leaks=0").lstrip(":")
    for k in ("TEST_PREMATURE_EXIT_FILE", "XML_OUTPUT_FILE", "GTEST_OUTPUT"):
        env.pop(k, None)
    mpirun = ["timeout", "-k", "10", "180", "mpirun", "-np", None, "--oversubscribe", "--bind-to", "none",
              "--mca", "btl", "self,vader", "--mca", "btl_vader_backing_directory", tmp]
    if os.getuid() == 0:
        mpirun.insert(5, "--allow-run-as-root")
    env["MESHPLAN_COMM_TIMEOUT_S"] = "60"  # a stuck peer fails its run, named, well inside `timeout`
    common = ["train", "--steps", str(STEPS), "--seq", str(SEQ), "--micro-batch", str(MICRO_BATCH),
              "--lr", "3e-3", "--quiet"]

    def run(model, mesh, ac, fp8, tag, gb=8, extra=(), mem_gap=0):
        capacity = "--moe-capacity-factor" in extra
        losses, grads = os.path.join(tmp, tag + ".losses.json"), os.path.join(tmp, tag + ".grads.bin")
        db = os.path.join(tmp, tag + ".db")
        args = common + ["--global-batch", str(gb), "--model", model, "--ac", ac, "--dump-losses", losses,
                         "--dump-grads", grads, "--db", db] + list(extra)
        if fp8:
            args.append("--fp8")
        np_ = 1
        if mesh:
            args += ["--mesh", mesh]
            np_ = 1
            for kv in mesh.split(","):
                k, v = kv.split("=")
                if k not in ("ep", "etp"):  # the expert grid is carved from the ranks
                    np_ *= int(v)
        if np_ == 1:
            cmd = ["timeout", "-k", "10", "180", meshplan] + args
        else:
            cmd = [c if c is not None else str(np_) for c in mpirun] + [meshplan] + args
        p = subprocess.run(cmd, env=env, capture_output=True, text=True)
        if p.returncode != 0:
            return None, "exit %d: %s" % (p.returncode, (p.stderr or p.stdout).strip().splitlines()[-1:])
        in_flight = micro_batches_per_rank(mesh, gb) if mesh and "pp=" in mesh else 1
        mem = memory(model, (mesh or "1 rank") + "".join(" " + e for e in extra), ac, fp8, db, p.stdout, in_flight,
                     mem_gap, capacity)
        return (json.load(open(losses))["losses"], read_wfile(grads), mem), None

    def memory(model, mesh, ac, fp8, db, out, in_flight, mem_gap, capacity=False):
        """(ok, line): the run's predicted vs measured peak."""
        name = "%-10s %-44s ac=%-9s fp8=%d" % (model, mesh, ac, fp8)
        m = re.search(r"peak memory (\d+) bytes per rank", out)
        try:
            con = sqlite3.connect(db, timeout=60)  # a loaded machine may still hold the lock
            row = con.execute("SELECT peak_mem_bytes - coalesce(mem_overhead_bytes, 0) FROM predictions").fetchall()
            con.close()
        except sqlite3.Error as e:
            row = [str(e)]
        if not m or len(row) != 1 or not isinstance(row[0], tuple):
            return False, "FAIL mem  %s: no measured peak or not one prediction (%s)" % (name, row)
        meas, pred = int(m.group(1)), int(row[0][0])
        err = (pred - meas) / meas
        r = re.search(r"expert rows: at most (\d+) received", out)
        if r:
            rows = int(r.group(1))
            routed = expert_side_tokens(mesh.split(" ")[0])
            bound = ep_mem_bound(model, rows, in_flight, routed)
            low = ep_mem_bound(model, 2 * routed * MOE_DIMS[model]["K"], in_flight, routed) if capacity else 0
            ok = pred - low <= meas <= pred + bound
            why = "balanced routing; busiest rank got %d rows vs %d: measured within [predicted -%d, +%d]" % (
                rows, routed * MOE_DIMS[model]["K"], low, bound)
        elif mem_gap:
            ok = pred <= meas <= pred + mem_gap
            why = "interleaved in-flight estimate: measured within [predicted, +%d]" % mem_gap
        else:
            ok = abs(err) <= MEM_TOL
            why = "within %.0f%%" % (100 * MEM_TOL)
        return ok, "%s mem  %s: predicted %d measured %d bytes (%+.3f%%; %s)" % (
            "ok  " if ok else "FAIL", name, pred, meas, 100 * err, why)

    rows = [r for r in ROWS if r["quick"] or not quick]
    if "--fp8-only" in sys.argv:
        rows = [r for r in rows if r["fp8"]]
    if "--only" in sys.argv:
        only = sys.argv[sys.argv.index("--only") + 1]
        rows = [r for r in rows if only in "%s %s %s %s" % (r["model"], r["mesh"], r["ac"], " ".join(r["args"]))]

    refs, fails, n_ok = {}, 0, 0
    mem_n = {True: 0, False: 0}  # memory predictions within their bound, and off
    for row in rows:
        model, mesh, ac, fp8, gb, extra = row["model"], row["mesh"], row["ac"], row["fp8"], row["gb"], row["args"]
        key = (model, ac, fp8, gb, " ".join(row["ref_args"]))
        if key not in refs:
            refs[key], err = run(model, None, ac, fp8, ("%s-%s-%d-gb%d-ref" % key[:4]) +
                                 "".join(a.lstrip("-") for a in row["ref_args"]), gb, row["ref_args"])
            if err:
                print("FAIL reference %s ac=%s fp8=%d global batch %d: %s" % (model, ac, fp8, gb, err))
                fails += 1
                continue
            mem_ok, mem_line = refs[key][2]
            print(mem_line)
            mem_n[mem_ok] += 1
        ref = refs[key]
        if ref is None:
            continue
        tag = "%s-%s-%s-%d-%s" % (model, mesh.replace(",", "_").replace("=", ""), ac, fp8,
                                  "_".join(e.lstrip("-") for e in extra))
        got, err = run(model, mesh, ac, fp8, tag, gb, extra, row["mem_gap"])
        name = "%-10s %-44s ac=%-9s fp8=%d" % (model, mesh + "".join(" " + e for e in extra), ac, fp8)
        if err:
            print("FAIL %s: %s" % (name, err))
            fails += 1
            continue
        (la, ga, _), (lb, gb, (mem_ok, mem_line)) = ref, got
        print(mem_line)
        mem_n[mem_ok] += 1
        ltol = FP8_LOSS_TOL if fp8 else TOL
        worst_l = max(abs(x - y) / abs(x) for x, y in zip(la, lb))
        if row["ref_args"]:
            def step_tol(i):
                return TOL if i < CAPACITY_STRICT_STEPS else CAPACITY_LOSS_TOL
            ltol = CAPACITY_LOSS_TOL
        else:
            def step_tol(i):
                return ltol
        bad = [(i + 1, x, y) for i, (x, y) in enumerate(zip(la, lb)) if abs(x - y) > step_tol(i) * abs(x)]
        worst_g, worst_name, worst_m, worst_mname = 0.0, "", 0.0, ""
        for pname, g in ga.items():
            h = gb.get(pname)
            if h is None or h.shape != g.shape:
                bad.append(("grad", pname, "missing or wrong shape"))
                continue
            den = np.linalg.norm(g)
            rel = np.linalg.norm(g - h) / den if den > 0 else np.linalg.norm(h)
            scale = np.max(np.abs(g)) if g.size else 0.0
            relm = np.max(np.abs(g - h)) / scale if scale > 0 else (np.max(np.abs(h)) if h.size else 0.0)
            if rel > worst_g:
                worst_g, worst_name = rel, pname
            if relm > worst_m:
                worst_m, worst_mname = relm, pname
        if worst_g > TOL:
            bad.append(("grad", worst_name, worst_g))
        if worst_m > (FP8_GRAD_MAXABS_TOL if fp8 else TOL):
            bad.append(("grad max-abs", worst_mname, worst_m))
        if bad or len(la) != len(lb):
            # the first losses that differ, and every gradient that does
            print("FAIL %s: %s" % (name, bad[:3] + [b for b in bad[3:] if b[0] in ("grad", "grad max-abs")]))
            fails += 1
        else:
            n_ok += 1
            print("ok   %s: %d losses within %.0e (worst %.1e; %.6f..%.6f), step-1 gradients worst rel %.1e (%s), "
                  "max-abs %.1e" % (name, len(lb), ltol, worst_l, lb[0], lb[-1], worst_g, worst_name, worst_m))
    print("%d plans match, %d fail; peak memory: %d predictions within their bound, %d off"
          % (n_ok, fails, mem_n[True], mem_n[False]))
    sys.exit(1 if fails or mem_n[False] else 0)


if __name__ == "__main__":
    main()
