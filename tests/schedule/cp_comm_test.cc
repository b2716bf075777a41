// Megatron-Core's context parallelism in Transformer Engine's collective forms
// (--cp-comm-type all_gather and a2a, exec/schedule_cp_te.c): per layer, the bytes each
// collective moves, the stream that exposes it, the attention's FLOPs and the buffers it
// holds, derived by hand from transformer_engine/pytorch/attention/dot_product_attention/
// context_parallel.py (AttnFuncWithCPAndKVAllGather, AttnFuncWithCPAndQKVOA2A); and the
// plan's refusals of the forms a mesh or a stack cannot run.
//
// The fixture: llama3.1-8b (32 heads, 8 kv heads of 128, d_model 4096) on
// dp_replicate=2 x cp=4 with seq 8192 under the megatron memory model, no AC. A rank holds
// T = 8192 / 4 = 2048 tokens; its Q is 2048 x 4096 wide, its grouped K and V 2048 x 1024
// each (8 kv heads x 128, no repeat_kv), the attention output 2048 x 4096; bf16 throughout.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "built.h"

using namespace sched_test;

namespace {

constexpr double kMiB = 1024.0 * 1024.0;
constexpr int kCp = 4;
constexpr double kT = 2048;
constexpr double kQ = 2.0 * kT * 4096, kK = 2.0 * kT * 1024, kV = kK, kO = 2.0 * kT * 4096;  // bytes
// the rank's causal attention, forward: 2 x T queries x seq / 2 keys x 32 heads x (128 + 128)
constexpr double kCoreFlops = 2.0 * kT * (8192 / 2) * 32 * (128 + 128);

Opts Megatron(mp_cp_comm c) {
  Opts o;
  o.mesh = "dp_replicate=2,cp=4";
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.cp_rotate = MP_CP_ROTATE_ALLTOALL;  // the megatron memory model's ring (plan.c)
  o.cp_comm = c;
  return o;
}

struct LayerOps {
  std::vector<const mp_op *> comm[2];  // the CP group's collectives, forward and backward
  double attn_flops[2] = {0, 0};       // the attention kernel's FLOPs
  std::vector<const mp_op *> attn[2];
  int64_t comm_held[2] = {0, 0};  // the most COMM bytes the layer's ops hold at once
};

LayerOps Layer(const mp_schedule *s, int layer) {
  LayerOps l;
  int64_t held[2] = {0, 0};
  for (const Inst &x : Expand(s)) {
    if (x.layer != layer || x.op->phase == MP_PHASE_RECOMPUTE) continue;
    const int bwd = x.op->phase == MP_PHASE_BACKWARD;
    if (x.op->type == MP_OP_COMM && x.op->group == MP_GROUP_CP) l.comm[bwd].push_back(x.op);
    if (x.op->type == MP_OP_COMPUTE && x.op->kernel == MP_KERNEL_ATTENTION && x.op->n > 0) {
      l.attn_flops[bwd] += x.op->flops;
      l.attn[bwd].push_back(x.op);
    }
    if (x.op->mem_cat == MP_MEM_COMM && (x.op->type == MP_OP_ALLOC || x.op->type == MP_OP_FREE)) {
      held[bwd] += x.op->type == MP_OP_ALLOC ? x.op->mem_bytes : -x.op->mem_bytes;
      if (held[bwd] > l.comm_held[bwd]) l.comm_held[bwd] = held[bwd];
    }
  }
  return l;
}

}  // namespace

TEST(CpComm, AllGatherGathersKAndVAndReduceScattersTheirGradientsExposed) {
  // Forward: K and V all-gathered, cp x 2 T kw = 4 x 4 MiB = 16 MiB each (sim/network.c's
  // all-gather bytes are the gathered ones); backward: gathered again, and dK, dV
  // reduce-scattered from 16 MiB each. gather_along_first_dim and
  // reduce_scatter_along_first_dim are synchronous in TE: every one on the compute stream.
  Built b;
  Build(&b, Megatron(MP_CP_COMM_ALL_GATHER));
  const LayerOps l = Layer(b.s, 5);
  ASSERT_EQ(l.comm[0].size(), 2u);
  ASSERT_EQ(l.comm[1].size(), 4u);
  const mp_coll want[2][4] = {{MP_COLL_ALL_GATHER, MP_COLL_ALL_GATHER},
                              {MP_COLL_ALL_GATHER, MP_COLL_ALL_GATHER, MP_COLL_REDUCE_SCATTER, MP_COLL_REDUCE_SCATTER}};
  double wire_fwd = 0;
  for (int bwd = 0; bwd < 2; bwd++)
    for (size_t i = 0; i < l.comm[bwd].size(); i++) {
      const mp_op *op = l.comm[bwd][i];
      EXPECT_EQ(op->coll, want[bwd][i]) << bwd << " " << i;
      EXPECT_EQ(op->bytes, kCp * kK) << "16 MiB: " << op->bytes / kMiB;
      EXPECT_EQ(op->stream, MP_STREAM_COMPUTE) << "TE waits for it where it is issued";
      if (!bwd) wire_fwd += (kCp - 1.0) / kCp * op->bytes;
    }
  // on the wire the forward's gathers move what the p2p ring's cp - 1 shifts of one rank's
  // K, V move, 3 x 8 MiB: the forms differ in what overlaps, not in bytes
  EXPECT_DOUBLE_EQ(wire_fwd, (kCp - 1) * (kK + kV));
  // the rank's causal work in two launches (its two query chunks), backward twice it
  EXPECT_EQ(l.attn[0].size(), 2u);
  EXPECT_DOUBLE_EQ(l.attn_flops[0], kCoreFlops);
  EXPECT_DOUBLE_EQ(l.attn_flops[1], 2.0 * kCoreFlops);
  // buffers: forward the gathered K, V (32 MiB) and a reorder copy of one (16 MiB);
  // backward the gathered K, V, the full dK, dV (32 MiB each), the chunks' own dK, dV over
  // (i + 1) T / 2 + (2cp - i) T / 2 = (2cp + 1) T / 2 keys (4.5 x 8 MiB) and a reorder copy
  EXPECT_EQ(l.comm_held[0], (int64_t)(kCp * (kK + kV) + kCp * kK));
  EXPECT_EQ(l.comm_held[1], (int64_t)(2 * kCp * (kK + kV) + (2 * kCp + 1) / 2.0 * (kK + kV) + kCp * kK));
}

TEST(CpComm, AllGatherSavesItsChunksOutputsBesideTheOutput) {
  // AttnFuncWithCPAndKVAllGather saves out_per_step (the two chunks' outputs) for backward
  // and returns a copy of them: 2 T x 4096 bf16 = 16 MiB a layer more than the ring saves
  Built p2p, ag;
  Build(&p2p, Megatron(MP_CP_COMM_P2P));
  Build(&ag, Megatron(MP_CP_COMM_ALL_GATHER));
  EXPECT_EQ(SavedByBlock(ag.s, 5) - SavedByBlock(p2p.s, 5), (int64_t)kO);
}

TEST(CpComm, A2ATradesTheSequenceForTheHeads) {
  // Forward: Q, K, V all-to-all'd (16, 4, 4 MiB: the rank's own tensors), the output back
  // (16 MiB); backward: the saved output and its gradient (16 MiB each), then dQ, dK, dV
  // (16, 4, 4 MiB). flash_attn_a2a_communicate makes the compute stream wait for them all.
  // The attention: the whole sequence (T x cp = 8192 queries) on 32 / 4 = 8 heads, the same
  // FLOPs as the rank's causal share.
  Built b;
  Build(&b, Megatron(MP_CP_COMM_A2A));
  const LayerOps l = Layer(b.s, 5);
  const std::vector<double> want[2] = {{kQ, kK, kV, kO}, {kO, kO, kQ, kK, kV}};
  for (int bwd = 0; bwd < 2; bwd++) {
    ASSERT_EQ(l.comm[bwd].size(), want[bwd].size()) << bwd;
    for (size_t i = 0; i < want[bwd].size(); i++) {
      EXPECT_EQ(l.comm[bwd][i]->coll, MP_COLL_ALL_TO_ALL);
      EXPECT_EQ(l.comm[bwd][i]->bytes, want[bwd][i]) << bwd << " " << i;
      EXPECT_EQ(l.comm[bwd][i]->stream, MP_STREAM_COMPUTE);
    }
  }
  ASSERT_EQ(l.attn[0].size(), 1u);
  EXPECT_EQ(l.attn[0][0]->m, 8192);
  EXPECT_EQ(l.attn[0][0]->batch, 8);
  EXPECT_DOUBLE_EQ(l.attn_flops[0], kCoreFlops);
  EXPECT_DOUBLE_EQ(l.attn_flops[1], 2.0 * kCoreFlops);
  // the Q, K, V all-to-alls' send copies and receive buffers, 2 x 24 MiB
  EXPECT_EQ(l.comm_held[0], (int64_t)(2 * (kQ + kK + kV)));
}

namespace {

// The plan's refusal of cp_comm c on `mesh` under memory model mm ("" when it builds).
std::string Refusal(const char *mesh_spec, mp_mem_model mm, mp_cp_comm c, int64_t seq) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  EXPECT_EQ(mp_model_load(&ctx, "llama3.1-8b", &m), MP_OK);
  mp_mesh mesh;
  EXPECT_EQ(mp_mesh_parse(&ctx, mesh_spec, 0, &mesh), MP_OK);
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.mem_model = mm;
  o.cp_rotate = mm == MP_MEM_MODEL_MEGATRON ? MP_CP_ROTATE_ALLTOALL : MP_CP_ROTATE_ALLGATHER;
  o.cp_comm = c;
  o.seq = seq;
  mp_plan *p = nullptr;
  const mp_status st = mp_build_plan(&ctx, &m, &mesh, &o, &p);
  mp_plan_destroy(p);
  return st == MP_OK ? "" : mp_errmsg(&ctx);
}

}  // namespace

TEST(CpComm, RefusesWhatNoStackRuns) {
  // a2a: cp = 16 does not divide the 8 kv heads (TE asserts k.shape[-2] % cp_size == 0)
  EXPECT_EQ(Refusal("cp=16", MP_MEM_MODEL_MEGATRON, MP_CP_COMM_A2A, 131072),
            "cp comm type a2a splits each rank's heads over cp: cp=16 does not divide its 32 query heads "
            "and 8 key heads (n_heads / tp, n_kv_heads / tp); choose p2p or all_gather, or a cp dividing both");
  // with tp = 2 the rank has 16 query heads and 4 kv heads: cp = 8 divides the first only,
  // cp = 4 both
  EXPECT_NE(Refusal("tp=2,cp=8", MP_MEM_MODEL_MEGATRON, MP_CP_COMM_A2A, 131072), "");
  EXPECT_EQ(Refusal("tp=2,cp=4", MP_MEM_MODEL_MEGATRON, MP_CP_COMM_A2A, 131072), "");
  EXPECT_EQ(Refusal("cp=16", MP_MEM_MODEL_MEGATRON, MP_CP_COMM_ALL_GATHER, 131072), "");
  EXPECT_NE(Refusal("cp=4", MP_MEM_MODEL_MEGATRON, MP_CP_COMM_A2A_P2P, 32768).find("a2a+p2p is hierarchical"),
            std::string::npos);
  EXPECT_NE(Refusal("dp_shard=2,cp=4", MP_MEM_MODEL_TORCHTITAN, MP_CP_COMM_ALL_GATHER, 32768)
                .find("cp comm type all_gather is Megatron-Core's"),
            std::string::npos);
}
