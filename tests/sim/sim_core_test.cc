// Simulator core on schedules built by hand: network and compute formulas, the event
// simulation (overlap, dependencies, repeated segments, micro-batches), memory replay,
// pipeline bubble and the output figures, each against a hand calculation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>
#include <vector>

#include "sim/gemm_table.h"
#include "sim/sim.h"
#include "sim/stack.h"
#include "tests/sim/round_figures.h"

namespace {

const double kGiB = 1073741824.0;


// Builds schedules op by op.
struct Builder {
  mp_plan plan;
  std::vector<mp_op> ops;
  std::vector<mp_segment> segs;
  mp_schedule s;

  explicit Builder(const char *mesh = "dp_shard=8") {
    memset(&plan, 0, sizeof plan);
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    EXPECT_EQ(mp_mesh_parse(&ctx, mesh, 0, &plan.mesh), MP_OK) << mp_errmsg(&ctx);
    plan.opts.pp_virtual = 1;
    memset(&s, 0, sizeof s);
    s.n_micro = 1;
    s.micro_batch = 1;
    s.seq = 1024;
    s.tokens_per_step_per_rank = 1024;
  }
  mp_op Base(int type, int phase, int stream) {
    mp_op o;
    memset(&o, 0, sizeof o);
    o.type = (uint8_t)type;
    o.phase = (uint8_t)phase;
    o.stream = (uint8_t)stream;
    o.when = MP_WHEN_EVERY_MICRO;
    o.dtype = MP_DTYPE_BF16;
    o.module = -1;
    o.layer = -1;
    o.unit = -1;
    o.batch = 1;
    return o;
  }
  // A bf16 GEMM taking exactly t seconds on Cluster() with Profile(): eff 0.5 of 1e15.
  int Gemm(double t, int phase = MP_PHASE_FORWARD) {
    mp_op o = Base(MP_OP_COMPUTE, phase, MP_STREAM_COMPUTE);
    o.kernel = MP_KERNEL_GEMM;
    o.m = o.n = o.k = 1024;
    o.flops = t * 0.5e15;
    o.bytes = 0;
    return Push(o);
  }
  // A collective on `group` taking t seconds: all-gather over 8 at 100 GB/s, 7/8 factor.
  int Gather(double t, int stream = MP_STREAM_GATHER, int group = MP_GROUP_DP_SHARD) {
    mp_op o = Base(MP_OP_COMM, MP_PHASE_FORWARD, stream);
    o.coll = MP_COLL_ALL_GATHER;
    o.group = (uint8_t)group;
    o.bytes = (t - kNodeGatherLat) * 100e9 * 8.0 / 7.0;  // t in all, NCCL's latency with it
    return Push(o);
  }
  int Mem(int type, int cat, int64_t bytes, int when = MP_WHEN_EVERY_MICRO,
          int phase = MP_PHASE_FORWARD) {
    mp_op o = Base(type, phase, MP_STREAM_COMPUTE);
    o.mem_cat = (uint8_t)cat;
    o.mem_bytes = bytes;
    o.when = (uint8_t)when;
    return Push(o);
  }
  int Push(const mp_op &o) {
    ops.push_back(o);
    return (int)ops.size() - 1;
  }
  void Dep(int op, int on, int flags = 0) {
    mp_op &o = ops[op];
    o.dep[o.n_dep] = on;
    o.dep_flags[o.n_dep] = (uint8_t)flags;
    o.n_dep++;
  }
  // Closes a segment over the ops pushed since `first`.
  void Seg(int first, int repeat, int phase, int layer_step = 0, int chunk = 0) {
    mp_segment g;
    memset(&g, 0, sizeof g);
    g.first_op = first;
    g.n_ops = (int)ops.size() - first;
    g.repeat = repeat;
    g.layer_step = layer_step;
    g.phase = (uint8_t)phase;
    g.chunk = (uint8_t)chunk;
    segs.push_back(g);
  }
  const mp_schedule *Get() {
    s.plan = &plan;
    s.ops = ops.data();
    s.n_ops = (int)ops.size();
    s.segs = segs.data();
    s.n_segs = (int)segs.size();
    return &s;
  }
};

mp_sim_result Simulate(Builder &b, const mp_cluster &c, const mp_stack_profile &p, int trace = 0) {
  return SimulateSchedule(b.Get(), c, p, trace);
}

}  // namespace

// ---- network --------------------------------------------------------------------------

TEST(Network, RingAllReduceOneGiBOverEight) {
  const double bw = 100.0, lat = 5e-6, bytes = kGiB;
  double want = 2.0 * 7.0 / 8.0 * bytes / (bw * 1e9) + 14 * lat;  // 0.018790 s + 70 us
  EXPECT_NEAR(mp_sim_collective_s(MP_COLL_ALL_REDUCE, bytes, 8, bw, lat), want, 1e-12);
  EXPECT_NEAR(want, 0.0188607, 1e-6);
}

TEST(Network, GatherScatterAllToAllSendFactors) {
  const double bw = 50.0, lat = 1e-5, b = 4e9;
  EXPECT_NEAR(mp_sim_collective_s(MP_COLL_ALL_GATHER, b, 4, bw, lat), 0.75 * b / 50e9 + 3 * lat, 1e-12);
  EXPECT_NEAR(mp_sim_collective_s(MP_COLL_REDUCE_SCATTER, b, 4, bw, lat), 0.06 + 3e-5, 1e-12);
  EXPECT_NEAR(mp_sim_collective_s(MP_COLL_ALL_TO_ALL, b, 2, bw, lat), 0.5 * b / 50e9 + lat, 1e-12);
  EXPECT_NEAR(mp_sim_collective_s(MP_COLL_SEND, b, 2, bw, lat), b / 50e9 + lat, 1e-12);
  EXPECT_EQ(mp_sim_collective_s(MP_COLL_ALL_REDUCE, b, 1, bw, lat), 0.0);
}

TEST(Network, GroupLinkIntraInterHierarchical) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster c = Cluster(32, 8);  // 4 nodes; NIC 80 Gbit/s = 10 GB/s per GPU
  c.intra_node_latency_us = 2;
  c.inter_node_latency_us = 7;
  mp_mesh m;
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_shard=4,tp=8", 32, &m), MP_OK);
  mp_sim_link l;
  // TP = ranks 0..7: one node, NVLink.
  ASSERT_EQ(mp_sim_group_link(&ctx, &c, &m, MP_GROUP_TP, 0, &l), MP_OK);
  EXPECT_EQ(l.n, 8);
  EXPECT_EQ(l.nodes, 1);
  EXPECT_DOUBLE_EQ(l.GBps, 100.0);
  EXPECT_DOUBLE_EQ(l.lat_s, 2e-6);
  // FSDP = {0, 8, 16, 24}: one per node, the NIC.
  ASSERT_EQ(mp_sim_group_link(&ctx, &c, &m, MP_GROUP_DP_SHARD, 0, &l), MP_OK);
  EXPECT_EQ(l.nodes, 4);
  EXPECT_EQ(l.per_node, 1);
  EXPECT_DOUBLE_EQ(l.GBps, 10.0);
  EXPECT_DOUBLE_EQ(l.lat_s, 7e-6);
  // dp_shard=32: 8 per node over 4 nodes: min(NVLink 100, 8 NICs x 10 = 80).
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_shard=32", 32, &m), MP_OK);
  ASSERT_EQ(mp_sim_group_link(&ctx, &c, &m, MP_GROUP_DP_SHARD, 0, &l), MP_OK);
  EXPECT_EQ(l.per_node, 8);
  EXPECT_EQ(l.nodes, 4);
  EXPECT_DOUBLE_EQ(l.GBps, 80.0);
  // dp_shard=16,tp=2: 4 FSDP members per node: min(100, 40).
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_shard=16,tp=2", 32, &m), MP_OK);
  ASSERT_EQ(mp_sim_group_link(&ctx, &c, &m, MP_GROUP_DP_SHARD, 3, &l), MP_OK);
  EXPECT_EQ(l.per_node, 4);
  EXPECT_DOUBLE_EQ(l.GBps, 40.0);
}

TEST(Network, AllToAllAcrossNodesBoundByNic) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster c = Cluster(32, 8);  // 4 nodes of 8; NVLink 100 GB/s, NIC 10 GB/s per GPU
  c.intra_node_latency_us = 2;
  c.inter_node_latency_us = 7;
  mp_mesh m;
  mp_sim_link l;
  const double b = 4e9, lat = 7e-6;
  // ep=32 over 4 nodes, 8 per node: a rank sends b/32 to each member, 7/32 of b over NVLink
  // (7/32 x 4e9 / 100e9 = 8.75 ms) and 24/32 of b through its NIC
  // (24/32 x 4e9 / 10e9 = 0.3 s), side by side: 0.3 s + 31 steps of 7 us. The ring bound
  // min(NVLink, 8 NICs) = 80 GB/s would give 31/32 x 4e9 / 80e9 = 48.4 ms, as if the node's
  // eight NICs served one rank.
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_shard=32,ep=32", 32, &m), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_sim_group_link(&ctx, &c, &m, MP_GROUP_EP, 0, &l), MP_OK);
  ASSERT_EQ(l.per_node, 8);
  ASSERT_EQ(l.nodes, 4);
  EXPECT_NEAR(mp_sim_alltoall_s(b, &l, 1.0, 24.0 / 32.0, 7.0 / 32.0), 0.3 + 31 * lat, 1e-12);
  // half the bytes leaving the node: NIC 0.2 s still bounds the NVLink's 8.75 ms
  EXPECT_NEAR(mp_sim_alltoall_s(b, &l, 0.5, 0.25, 7.0 / 32.0), 0.25 * b / 5e9 + 31 * lat, 1e-12);
  // inside one node (ep=8): the collective's own figure on NVLink
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_shard=32,ep=8", 32, &m), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_sim_group_link(&ctx, &c, &m, MP_GROUP_EP, 0, &l), MP_OK);
  ASSERT_EQ(l.nodes, 1);
  EXPECT_NEAR(mp_sim_alltoall_s(b, &l, 1.0, 0.0, 0.0), 7.0 / 8.0 * b / 100e9 + 7 * 2e-6, 1e-12);
}

namespace {

// An EP link of n members, per_node a node over `nodes` nodes (no bandwidth: the shares only),
// and a model routing top_k of `experts`.
mp_sim_link ShareLink(int n, int per_node, int nodes) {
  mp_sim_link l;
  memset(&l, 0, sizeof l);
  l.n = n, l.per_node = per_node, l.nodes = nodes;
  return l;
}
mp_model Routing(int64_t experts, int64_t top_k) {
  mp_model m;
  memset(&m, 0, sizeof m);
  m.n_experts = experts, m.top_k = top_k;
  return m;
}

}  // namespace

TEST(Network, DeepEpSendsATokenOncePerRemoteNode) {
  // DeepSeek-V3 on EP 64 over 8 nodes of 8: 256 experts, 32 a node, top 8.
  mp_sim_link l = ShareLink(64, 8, 8);
  mp_model m = Routing(256, 8);
  double nic, nvl;
  // NCCL's all-to-all: every copy to a rank of another node crosses the NIC, 56/64.
  mp_sim_ep_shares(&l, &m, MP_MOE_DISPATCH_ALLTOALL, &nic, &nvl);
  EXPECT_DOUBLE_EQ(nic, 56.0 / 64.0);
  EXPECT_DOUBLE_EQ(nvl, 7.0 / 64.0);
  // DeepEP without a group limit: a node holds none of a token's 8 of 256 experts with
  // probability C(224,8)/C(256,8) = 0.33817, so the token reaches 8 x 0.66183 = 5.2947
  // nodes, 7/8 of them remote: 4.6328 network copies of 8, a share of 0.57910.
  mp_sim_ep_shares(&l, &m, MP_MOE_DISPATCH_DEEPEP, &nic, &nvl);
  EXPECT_NEAR(nic, 0.5791026, 1e-6);
  EXPECT_DOUBLE_EQ(nvl, 7.0 / 8.0);
  // HybridEP moves a token as DeepEP does (RDMA once to a node, NVLink inside it): the same
  double hnic, hnvl;
  mp_sim_ep_shares(&l, &m, MP_MOE_DISPATCH_HYBRIDEP, &hnic, &hnvl);
  EXPECT_DOUBLE_EQ(hnic, nic);
  EXPECT_DOUBLE_EQ(hnvl, nvl);
  // node-limited routing (8 groups, one a node; 4 used): D = 4 candidate nodes of 128
  // experts; none of 8 on a node with probability C(96,8)/C(128,8) = 0.092747: 3.6290
  // nodes reached, 3.1754 remote, a share of 0.39692 (DeepSeek-V3 sec. 3.2.2 bounds it at 4)
  m.n_group = 8, m.topk_group = 4;
  mp_sim_ep_shares(&l, &m, MP_MOE_DISPATCH_DEEPEP, &nic, &nvl);
  EXPECT_NEAR(nic, 0.3969231, 1e-6);
  // inside one node DeepEP sends a token once to each other GPU holding one of its experts
  // (csrc/kernels/intranode.cu, is_token_in_rank): EP 8 of the same model, 32 experts a
  // GPU, one group a GPU, 4 groups used: the same D = 4 holders of 32 experts as above,
  // 3.1754 remote GPUs of 8 copies, all on NVLink
  l.n = 8, l.per_node = 8, l.nodes = 1;
  mp_sim_ep_shares(&l, &m, MP_MOE_DISPATCH_DEEPEP, &nic, &nvl);
  EXPECT_DOUBLE_EQ(nic, 0.0);
  EXPECT_NEAR(nvl, 0.3969231, 1e-6);
  // NCCL's all-to-all inside the node: a copy per expert, 7/8 of them to other GPUs
  mp_sim_ep_shares(&l, &m, MP_MOE_DISPATCH_ALLTOALL, &nic, &nvl);
  EXPECT_DOUBLE_EQ(nvl, 7.0 / 8.0);
}

// The flex dispatcher at expert-TP size etp (mp_sim_ep_shares_etp): its bytes count
// top_k x etp copies of a token, one to each expert-TP rank of each expert picked
// (token_dispatcher.py MoEFlexTokenDispatcher._initialize_metadata, core_v0.14.0).
// Inside one node: tp 2, ep 4, etp 2 on 8 GPUs, 8 experts of top 2 (Mixtral's routing): the
// EP link has 4 members, a shard 2 experts. A shard holds neither of a token's 2 experts with
// probability C(6,2)/C(8,2) = 15/28, so a token reaches R = 4 x 13/28 = 13/7 shards, 26/7
// ranks, its own with probability R/4 = 13/28: 26/7 - 13/28 = 91/28 remote copies of
// 2 x 2 = 4, an NVLink share of 13/16 = 0.8125 (at etp 1: 13/7 x 3/4 of 2 = 39/56). Per rank
// and dispatch of 64 rows x 64 x 2 B: DeepEP puts 16,384 x 13/16 = 13,312 B on NVLink; the
// all-to-all dispatcher 8,192 x 3/4 = 6,144 B in its EP all-to-all and 16,384 / 2 = 8,192 B
// received in its ETP all-gather, 14,336 B.
TEST(SimCore, FlexDispatchSharesUnderExpertTp) {
  mp_sim_link l = ShareLink(4, 4, 1);
  mp_model m = Routing(8, 2);
  double nic, nvl;
  mp_sim_ep_shares_etp(&l, &m, MP_MOE_DISPATCH_DEEPEP, 2, &nic, &nvl);
  EXPECT_DOUBLE_EQ(nic, 0.0);
  EXPECT_NEAR(nvl, 13.0 / 16.0, 1e-12);
  EXPECT_NEAR(16384.0 * nvl, 13312.0, 1e-9);
  // on H100's 450 GB/s NVLink at efficiency 1 and 2 us a step: 13,312 B / 450e9 + one step
  l.intra_GBps = 450, l.lat_s = 2e-6;
  EXPECT_NEAR(mp_sim_deepep_s(16384.0, &l, 1.0, nic, nvl), 13312.0 / 450e9 + 2e-6, 1e-15);
  mp_sim_ep_shares_etp(&l, &m, MP_MOE_DISPATCH_DEEPEP, 1, &nic, &nvl);
  EXPECT_NEAR(nvl, 39.0 / 56.0, 1e-12);
  double nvl1;
  mp_sim_ep_shares(&l, &m, MP_MOE_DISPATCH_DEEPEP, &nic, &nvl1);
  EXPECT_DOUBLE_EQ(nvl1, nvl);
  // the all-to-all's shares do not depend on etp: 3/4 of its EP copies leave the GPU
  mp_sim_ep_shares_etp(&l, &m, MP_MOE_DISPATCH_ALLTOALL, 2, &nic, &nvl);
  EXPECT_DOUBLE_EQ(nvl, 3.0 / 4.0);
  // across 2 nodes (ep 8 x etp 2 on 16 GPUs, 4 EP ranks a node; 256 experts of top 8): the
  // network copy goes once to the other node when it holds one of the token's experts, as
  // at etp 1, at etp 2 of twice the bytes (half the share); NVLink carries every copy but those
  // landing where they arrive, 7/8 of the node's 8 expert-TP x EP ranks (3/4 at etp 1)
  l = ShareLink(8, 4, 2);
  m = Routing(256, 8);
  double nic2, nvl2;
  mp_sim_ep_shares_etp(&l, &m, MP_MOE_DISPATCH_DEEPEP, 1, &nic, &nvl);
  mp_sim_ep_shares_etp(&l, &m, MP_MOE_DISPATCH_DEEPEP, 2, &nic2, &nvl2);
  EXPECT_DOUBLE_EQ(nic2, nic / 2.0);
  EXPECT_DOUBLE_EQ(nvl, 3.0 / 4.0);
  EXPECT_DOUBLE_EQ(nvl2, 7.0 / 8.0);
}

namespace {

// An EP group's link on 8-GPU H100 nodes (NVLink 450 GB/s, a 400 Gb/s NIC per GPU): n
// members over `nodes` nodes, `lat_s` a step.
mp_sim_link H100EpLink(int n, int nodes, double lat_s) {
  mp_sim_link l;
  memset(&l, 0, sizeof l);
  l.n = n, l.nodes = nodes, l.per_node = n / nodes;
  l.intra_GBps = 450, l.inter_GBps = 50;
  l.GBps = nodes > 1 ? 50 : 450;
  l.lat_s = lat_s;
  return l;
}

// One dispatch of `bytes` on l under Qwen3-235B-A22B's routing (top 8 of 128 experts, no
// group limit) at link efficiency 0.8: DeepEP's shares and time, and NCCL's all-to-all's time.
struct Dispatch {
  double nic, nvl, deepep_s, alltoall_s;
};
Dispatch Qwen235Dispatch(const mp_sim_link &l, double bytes) {
  mp_model m;
  memset(&m, 0, sizeof m);
  m.n_experts = 128, m.top_k = 8;
  Dispatch d;
  mp_sim_ep_shares(&l, &m, MP_MOE_DISPATCH_DEEPEP, &d.nic, &d.nvl);
  d.deepep_s = mp_sim_deepep_s(bytes, &l, 0.8, d.nic, d.nvl);
  double nic, nvl;
  mp_sim_ep_shares(&l, &m, MP_MOE_DISPATCH_ALLTOALL, &nic, &nvl);
  d.alltoall_s = mp_sim_alltoall_s(bytes, &l, 0.8, nic, nvl);
  return d;
}

}  // namespace

// Qwen3-235B-A22B's dispatch under TP 4 x EP 8 in one H100 node: 1,024 tokens a rank, top 8
// of 128 experts, 16 a GPU, hidden 4096 in bf16: the all-to-all's bytes 1024 x 8 x 4096 x 2
// = 67,108,864. A GPU holds none of a token's 8 experts with probability C(112,8) /
// C(128,8) = 0.332580, so the token reaches 8 x 0.667420 = 5.33936 GPUs, 7/8 of them other
// ones: 4.67194 copies of 8, a share of 0.583992. On NVLink at 450 GB/s x 0.8 behind one
// step of 3 us: 0.583992 x 67,108,864 / 360e9 + 3e-6 = 111.864 us, where NCCL's all-to-all
// (mp_sim_alltoall_s: every copy, 7 steps) takes 7/8 x 67,108,864 / 360e9 + 21e-6 =
// 184.112 us.
TEST(Network, DeepEpInsideANodeSendsATokenOncePerGpu) {
  const Dispatch d = Qwen235Dispatch(H100EpLink(8, 1, 3e-6), 67108864.0);
  EXPECT_DOUBLE_EQ(d.nic, 0.0);
  EXPECT_NEAR(d.nvl, 0.5839922, 1e-6);
  EXPECT_NEAR(d.deepep_s, 111.86403e-6, 1e-10);
  EXPECT_NEAR(d.alltoall_s, 184.111822e-6, 1e-10);
}

// DeepEP across nodes: its kernels serve every peer at once, one step of latency where
// NCCL's all-to-all counts n - 1. Qwen3-235B-A22B on EP 32 over 4 nodes of 8: 2,048 tokens a
// rank, bytes 2048 x 8 x 4096 x 2 = 134,217,728; a node holds none of 8 of 128 experts with
// probability C(96,8) / C(128,8) = 0.092747, 4 x 0.907253 = 3.62901 nodes reached, 3/4 of
// them remote: 2.72176 network copies of 8, a share of 0.340220. NIC 50 GB/s x 0.8:
// 0.340220 x 134,217,728 / 40e9 = 1,141.59 us; NVLink 7/8 of the bytes at 360 GB/s,
// 326.22 us, runs beside it; plus one step of 10 us: 1,151.59 us. NCCL's all-to-all sends
// every copy, 24/32 of them through the NIC, 2,516.58 us, in 31 steps: 2,826.58 us.
TEST(Network, DeepEpAcrossNodesPaysOneLatencyStep) {
  const Dispatch d = Qwen235Dispatch(H100EpLink(32, 4, 10e-6), 134217728.0);
  EXPECT_NEAR(d.nic, 0.3402198, 1e-6);
  EXPECT_DOUBLE_EQ(d.nvl, 7.0 / 8.0);
  EXPECT_NEAR(d.deepep_s, 1151.588e-6, 1e-8);
  EXPECT_NEAR(d.alltoall_s, 2826.5824e-6, 1e-8);
}

// ---- compute --------------------------------------------------------------------------

TEST(Compute, GemmAtKnownEfficiency) {
  mp_cluster c = Cluster();
  mp_stack_profile p = Profile();
  p.kernel_overhead_s = 3e-6;
  mp_op o;
  memset(&o, 0, sizeof o);
  o.type = MP_OP_COMPUTE;
  o.kernel = MP_KERNEL_GEMM;
  o.dtype = MP_DTYPE_BF16;
  o.m = 8192, o.n = 4096, o.k = 4096, o.batch = 1;
  o.flops = 2.0 * 8192 * 4096 * 4096;  // 2.749e11
  o.bytes = 2.0 * (8192.0 * 4096 + 4096.0 * 4096 + 8192.0 * 4096);
  // eff 0.5 at any size (half 0): 2.749e11 / 5e14 = 0.5498 ms; bytes 0.167 ms: compute-bound
  EXPECT_NEAR(mp_sim_compute_op_s(&o, &c.gpu, &p), o.flops / 5e14 + 3e-6, 1e-12);
  // Half efficiency at m n k = gemm_eff_half_mnk.
  p.gemm_eff_half_mnk = (double)o.m * o.n * o.k;
  EXPECT_NEAR(mp_sim_compute_op_s(&o, &c.gpu, &p), o.flops / 2.5e14 + 3e-6, 1e-12);
  // float8 at the fp8 peak x fp8_gemm_eff_max (x the same size factor).
  p.gemm_eff_half_mnk = 0;
  o.dtype = MP_DTYPE_FP8_E4M3;
  EXPECT_NEAR(mp_sim_compute_op_s(&o, &c.gpu, &p), o.flops / (2e15 * 0.25) + 3e-6, 1e-12);
  // Element-wise: memory-bound at HBM x hbm_eff.
  o.kernel = MP_KERNEL_RESIDUAL;
  o.dtype = MP_DTYPE_BF16;
  o.flops = 1e6;
  o.bytes = 1e9;
  EXPECT_NEAR(mp_sim_compute_op_s(&o, &c.gpu, &p), 1e9 / 0.5e12 + 3e-6, 1e-12);
  // Attention: bf16 peak x attention_eff.
  o.kernel = MP_KERNEL_ATTENTION;
  o.flops = 4e12;
  o.bytes = 1e6;
  EXPECT_NEAR(mp_sim_compute_op_s(&o, &c.gpu, &p), 4e12 / 4e14 + 3e-6, 1e-12);
}

TEST(Compute, GemmTablesByDtype) {
  // Two by-shape tables on the round-number profile: the bf16 one halves the forward
  // efficiency at (8192, 4096, 4096), the float8 one takes a quarter off it (forward) and
  // lifts dgrad at the same shape by a fifth. Each GEMM takes the table of its dtype
  // (E4M3 and E5M2 alike), batch-1 GEMMs only; a float8 GEMM on a GPU without an fp8 peak
  // runs on the bf16 curve, neither table.
  mp_cluster c = Cluster();
  mp_stack_profile p = Profile();
  mp_gemm_table bf16, fp8;
  memset(&bf16, 0, sizeof bf16);
  memset(&fp8, 0, sizeof fp8);
  bf16.n = 1;
  bf16.pt[0] = {MP_VAR_FWD, 13, 12, 12, std::log2(0.5)};
  fp8.n = 2;
  fp8.pt[0] = {MP_VAR_FWD, 13, 12, 12, std::log2(0.75)};
  fp8.pt[1] = {MP_VAR_DGRAD, 13, 12, 12, std::log2(1.2)};
  p.gemm_table = &bf16;
  p.fp8_gemm_table = &fp8;
  mp_op o;
  memset(&o, 0, sizeof o);
  o.type = MP_OP_COMPUTE;
  o.kernel = MP_KERNEL_GEMM;
  o.variant = MP_VAR_FWD;
  o.m = 8192, o.n = 4096, o.k = 4096, o.batch = 1;
  o.flops = 2.0 * 8192 * 4096 * 4096;
  o.dtype = MP_DTYPE_BF16;  // bf16 peak 1e15 x 0.5 x 0.5
  EXPECT_NEAR(mp_sim_compute_op_s(&o, &c.gpu, &p), o.flops / (1e15 * 0.5 * 0.5), 1e-15);
  o.dtype = MP_DTYPE_FP8_E4M3;  // fp8 peak 2e15 x 0.25 x 0.75
  EXPECT_NEAR(mp_sim_compute_op_s(&o, &c.gpu, &p), o.flops / (2e15 * 0.25 * 0.75), 1e-15);
  o.variant = MP_VAR_DGRAD;
  o.dtype = MP_DTYPE_FP8_E5M2;  // x 1.2
  EXPECT_NEAR(mp_sim_compute_op_s(&o, &c.gpu, &p), o.flops / (2e15 * 0.25 * 1.2), 1e-15);
  o.dtype = MP_DTYPE_BF16;  // no bf16 dgrad point: the curve
  EXPECT_NEAR(mp_sim_compute_op_s(&o, &c.gpu, &p), o.flops / (1e15 * 0.5), 1e-15);
  o.variant = MP_VAR_WGRAD;  // no float8 wgrad point: the float8 curve
  o.dtype = MP_DTYPE_FP8_E5M2;
  EXPECT_NEAR(mp_sim_compute_op_s(&o, &c.gpu, &p), o.flops / (2e15 * 0.25), 1e-15);
  // grouped (expert) GEMMs: neither table
  o.variant = MP_VAR_FWD;
  o.batch = 2;
  o.flops *= 2;
  EXPECT_NEAR(mp_sim_compute_op_s(&o, &c.gpu, &p), o.flops / (2e15 * 0.25), 1e-15);
  o.dtype = MP_DTYPE_BF16;
  EXPECT_NEAR(mp_sim_compute_op_s(&o, &c.gpu, &p), o.flops / (1e15 * 0.5), 1e-15);
  // no float8 units: a float8 GEMM runs as bf16 at the bf16 curve, no table
  o.batch = 1;
  o.flops /= 2;
  o.dtype = MP_DTYPE_FP8_E4M3;
  c.gpu.peak_tflops[MP_DTYPE_FP8_E4M3] = 0;
  EXPECT_NEAR(mp_sim_compute_op_s(&o, &c.gpu, &p), o.flops / (1e15 * 0.5), 1e-15);
  // without tables: the curves
  c = Cluster();
  p.gemm_table = nullptr;
  p.fp8_gemm_table = nullptr;
  EXPECT_NEAR(mp_sim_compute_op_s(&o, &c.gpu, &p), o.flops / (2e15 * 0.25), 1e-15);
}

// A schedule prices each distinct collective once and reuses the figure where the same
// collective (group, kind, members, bytes) comes again (sim/cost.c). 300 collectives on
// dp_shard=8 (one node of Cluster(): NVLink 100 GB/s): 100 byte sizes, each as an
// all-gather, an all-reduce and a reduce-scatter, the whole list twice, more distinct ones
// than the reuse table's 64 slots, so entries are evicted and looked up again. Each op's
// traced duration must be, bit for bit, what the network model gives for that collective
// alone (mp_sim_nccl_collective_s at the link's bandwidth x link_eff 1, plus comm_overhead
// 5 us). Anchor, by hand: the all-gather of Builder::Gather(t) for t = 1 ms + 10 us k takes
// t + 5 us overhead (kNodeGatherLat plus 7/8 of its bytes at 100 GB/s, the Simple ring).
TEST(Network, RepeatedCollectivesPricedAsEachAlone) {
  Builder b;
  const int kinds[3] = {MP_COLL_ALL_GATHER, MP_COLL_ALL_REDUCE, MP_COLL_REDUCE_SCATTER};
  for (int pass = 0; pass < 2; pass++)
    for (int k = 0; k < 100; k++)
      for (int c = 0; c < 3; c++) {
        const int i = b.Gather(1e-3 + 1e-5 * k, MP_STREAM_REDUCE);
        b.ops[i].coll = (uint8_t)kinds[c];
      }
  b.Seg(0, 1, MP_PHASE_BACKWARD);
  const mp_cluster cl = Cluster();
  mp_stack_profile st = Profile();
  st.comm_overhead_s = 5e-6;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_sim_link l;
  ASSERT_EQ(mp_sim_group_link(&ctx, &cl, &b.plan.mesh, MP_GROUP_DP_SHARD, 0, &l), MP_OK) << mp_errmsg(&ctx);
  mp_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.cluster = &cl;
  cfg.stack = &st;
  cfg.record_trace = 1;
  mp_sim_result r;
  mp_sim_trace *t = NULL;
  const mp_schedule *s = b.Get();
  ASSERT_EQ(mp_simulate(&ctx, s, &cfg, &r, &t), MP_OK) << mp_errmsg(&ctx);
  std::vector<double> dur(s->n_ops);
  mp_sim_trace_op_durations(t, dur.data(), s->n_ops);
  mp_sim_trace_destroy(t);
  for (int i = 0; i < s->n_ops; i++) {
    const mp_op &o = s->ops[i];
    const double alone = mp_sim_nccl_collective_s((mp_coll)o.coll, o.bytes, 8, &l, l.GBps, &cl.gpu, 0, 0) + 5e-6;
    EXPECT_EQ(dur[i], alone) << "op " << i;
  }
  for (int k = 0; k < 100; k++) EXPECT_NEAR(dur[3 * k], 1e-3 + 1e-5 * k + 5e-6, 1e-12) << "all-gather " << k;
}

// ---- event simulation -------------------------------------------------------------------

TEST(Overlap, SingleGemm) {
  Builder b;
  b.Gemm(2e-3);
  b.Seg(0, 1, MP_PHASE_FORWARD);
  mp_sim_result r = Simulate(b, Cluster(), Profile());
  EXPECT_NEAR(r.step_time_s, 2e-3, 1e-12);
  EXPECT_NEAR(r.compute_s, 2e-3, 1e-12);
  EXPECT_NEAR(r.exposed_comm_s, 0, 1e-12);
  // 1024 tokens / 2 ms / 1 GPU per replica
  EXPECT_NEAR(r.tokens_per_s_per_gpu, 512000.0, 1e-6);
}

TEST(Overlap, GatherOnItsStreamHidesUnderGemm) {
  Builder b;
  b.Gather(1e-3);
  b.Gemm(3e-3);
  b.Seg(0, 1, MP_PHASE_FORWARD);
  mp_sim_result r = Simulate(b, Cluster(), Profile());
  EXPECT_NEAR(r.step_time_s, 3e-3, 1e-12);
  EXPECT_NEAR(r.exposed_comm_s, 0, 1e-12);
  EXPECT_NEAR(r.comm_s[MP_STREAM_GATHER], 1e-3, 1e-12);
}

TEST(Overlap, DependencySerialises) {
  Builder b;
  int g = b.Gather(1e-3);
  int m = b.Gemm(3e-3);
  b.Dep(m, g);
  b.Seg(0, 1, MP_PHASE_FORWARD);
  mp_sim_result r = Simulate(b, Cluster(), Profile());
  EXPECT_NEAR(r.step_time_s, 4e-3, 1e-12);
  EXPECT_NEAR(r.compute_s, 3e-3, 1e-12);
  EXPECT_NEAR(r.exposed_comm_s, 1e-3, 1e-12);
}

TEST(Overlap, CollectiveOnComputeStreamIsExposed) {
  Builder b("tp=8");
  b.Gemm(2e-3);
  b.Gather(1e-3, MP_STREAM_COMPUTE, MP_GROUP_TP);
  b.Gemm(2e-3);
  b.Seg(0, 1, MP_PHASE_FORWARD);
  mp_sim_result r = Simulate(b, Cluster(), Profile());
  EXPECT_NEAR(r.step_time_s, 5e-3, 1e-12);
  EXPECT_NEAR(r.exposed_comm_s, 1e-3, 1e-12);
  // 1024 tokens per replica of 8 GPUs over 5 ms
  EXPECT_NEAR(r.tokens_per_s_per_gpu, 1024.0 / 5e-3 / 8, 1e-6);
}

TEST(Overlap, TailCollectiveWithoutDependencyExtendsTheStep) {
  Builder b;
  b.Gemm(2e-3);
  int rs = b.Gather(3e-3, MP_STREAM_REDUCE);
  b.Dep(rs, 0);
  b.Seg(0, 1, MP_PHASE_BACKWARD);
  mp_sim_result r = Simulate(b, Cluster(), Profile());
  EXPECT_NEAR(r.step_time_s, 5e-3, 1e-12);
  EXPECT_NEAR(r.exposed_comm_s, 3e-3, 1e-12);
}

// A forward over L blocks with FSDP-style prefetch and a two-buffer limit: block 0's
// gather runs first; repetition l runs block l's GEMM (after block l's gather) and then
// issues the gather of block l+1, which may start only once block l-1's GEMM is done (its
// buffer is reused). As a COMPACT segment both dependencies point at the previous
// repetition (MP_DEP_PREV_REP); expanded, they name the ops of the previous copy.
namespace {
struct Prefetch {
  double gather_s, gemm_s;
  int L;
};

int Prologue(Builder &b, const Prefetch &p) {
  b.Mem(MP_OP_ALLOC, MP_MEM_PARAMS, 1000, MP_WHEN_ONCE, MP_PHASE_PROLOGUE);
  b.Seg(0, 1, MP_PHASE_PROLOGUE);
  int first = (int)b.ops.size();
  b.Mem(MP_OP_ALLOC, MP_MEM_GATHERED, 300);
  int g0 = b.Gather(p.gather_s);
  b.Seg(first, 1, MP_PHASE_FORWARD);
  return g0;
}

// One block: GEMM, save activations, free this block's gathered buffer, allocate and
// gather the next one's. Returns {gemm, gather}.
std::pair<int, int> Block(Builder &b, const Prefetch &p, int layer) {
  int m = b.Gemm(p.gemm_s);
  b.Mem(MP_OP_ALLOC, MP_MEM_ACTIVATIONS, 50);
  b.Mem(MP_OP_FREE, MP_MEM_GATHERED, 300);
  b.Mem(MP_OP_ALLOC, MP_MEM_GATHERED, 300);
  int g = b.Gather(p.gather_s);
  b.ops[m].layer = b.ops[g].layer = layer;
  return {m, g};
}

void Backward(Builder &b, const Prefetch &p, int L, int repeat) {
  int first = (int)b.ops.size();
  b.Mem(MP_OP_FREE, MP_MEM_GATHERED, 300, MP_WHEN_EVERY_MICRO, MP_PHASE_BACKWARD);
  b.Seg(first, 1, MP_PHASE_BACKWARD);
  for (int i = 0; i < L / repeat; i++) {
    first = (int)b.ops.size();
    int bm = b.Gemm(2 * p.gemm_s, MP_PHASE_BACKWARD);
    b.ops[bm].layer = L - 1 - i;
    b.Mem(MP_OP_FREE, MP_MEM_ACTIVATIONS, 50, MP_WHEN_EVERY_MICRO, MP_PHASE_BACKWARD);
    b.Seg(first, repeat, MP_PHASE_BACKWARD, -1);
  }
}

void BuildCompact(Builder &b, const Prefetch &p) {
  int g0 = Prologue(b, p);
  int first = (int)b.ops.size();
  std::pair<int, int> mg = Block(b, p, 0);
  b.Dep(mg.first, g0);
  b.Dep(mg.first, mg.second, MP_DEP_PREV_REP);
  b.Dep(mg.second, mg.first, MP_DEP_PREV_REP);
  b.Seg(first, p.L, MP_PHASE_FORWARD, 1);
  Backward(b, p, p.L, p.L);
}

void BuildExpanded(Builder &b, const Prefetch &p) {
  int g_prev = Prologue(b, p), m_prev = -1;
  for (int l = 0; l < p.L; l++) {
    int first = (int)b.ops.size();
    std::pair<int, int> mg = Block(b, p, l);
    b.Dep(mg.first, g_prev);
    if (m_prev >= 0) b.Dep(mg.second, m_prev);
    b.Seg(first, 1, MP_PHASE_FORWARD, 1);
    g_prev = mg.second;
    m_prev = mg.first;
  }
  Backward(b, p, p.L, 1);
}
}  // namespace

TEST(Periodic, CompactEqualsExpandedComputeBound) {
  Prefetch p = {1e-3, 3e-3, 40};
  Builder c, e;
  BuildCompact(c, p);
  BuildExpanded(e, p);
  mp_sim_result rc = Simulate(c, Cluster(), Profile()), re = Simulate(e, Cluster(), Profile());
  // Hand: gather 0 exposed (1 ms), then GEMMs back to back: 1 + 40 x 3 + 40 x 6 ms.
  EXPECT_NEAR(re.step_time_s, 1e-3 + 40 * 3e-3 + 40 * 6e-3, 1e-9);
  EXPECT_NEAR(rc.step_time_s, re.step_time_s, 1e-9 * re.step_time_s);
  EXPECT_NEAR(rc.exposed_comm_s, re.exposed_comm_s, 1e-12);
  EXPECT_NEAR(rc.compute_s, re.compute_s, 1e-9);
  EXPECT_NEAR(rc.comm_s[MP_STREAM_GATHER], 41e-3, 1e-9);  // block 0 + 40 prefetches
  // Memory: in the last forward block 40 x 50 activations + 300 gathered + 1000 params.
  EXPECT_EQ(re.peak_mem_bytes, 1000 + 300 + 40 * 50);
  EXPECT_EQ(rc.peak_mem_bytes, re.peak_mem_bytes);
  EXPECT_EQ(rc.mem_at_peak[MP_MEM_ACTIVATIONS], 40 * 50);
  EXPECT_EQ(rc.mem_at_peak[MP_MEM_GATHERED], 300);
  EXPECT_EQ(rc.mem_at_peak[MP_MEM_PARAMS], 1000);
}

TEST(Periodic, CompactEqualsExpandedCommBound) {
  // Gathers slower than GEMMs: each block waits for its gather, gathers run back to back
  // (block l-1's GEMM is always done in time). Hand: block l's GEMM ends at 5(l+1) + 1 ms,
  // the last at 201 ms; the spare gather issued by the last block ends at 205 ms, hidden
  // under the 80 ms backward: 281 ms.
  Prefetch p = {5e-3, 1e-3, 40};
  Builder c, e;
  BuildCompact(c, p);
  BuildExpanded(e, p);
  mp_sim_result rc = Simulate(c, Cluster(), Profile()), re = Simulate(e, Cluster(), Profile());
  EXPECT_NEAR(re.step_time_s, 40 * 5e-3 + 1e-3 + 40 * 2e-3, 1e-9);
  EXPECT_NEAR(rc.step_time_s, re.step_time_s, 1e-9 * re.step_time_s);
  EXPECT_NEAR(re.exposed_comm_s, 40 * 5e-3 - 39 * 1e-3, 1e-9);
  EXPECT_NEAR(rc.exposed_comm_s, re.exposed_comm_s, 1e-9);
}

// With NCCL's SMs priced (sim/engine.c): each prefetch gather, issued after the GEMM it runs
// beside, holds 24 of the H100's 132 SMs; skipping the steady repetitions moves the gathers
// in flight with their stream, so the compact segment still equals the expanded one, and
// the forward is longer than without contention by what the GEMMs lost: (the 40 hidden
// gathers' 1 ms) x 24/132 each, 40 x 2/11 ms.
TEST(Periodic, CompactEqualsExpandedWithSmContention) {
  Prefetch p = {1e-3, 3e-3, 40};
  Builder c, e;
  BuildCompact(c, p);
  BuildExpanded(e, p);
  mp_cluster cl = Cluster();
  cl.gpu.sms = 132;
  cl.gpu.nvlink_GBps_per_dir = 450;  // 18 NVLinks: NCCL's 24 channels inside the node
  mp_stack_profile st = Profile();
  st.nccl_sm_contention = 1;
  mp_sim_result rc = Simulate(c, cl, st), re = Simulate(e, cl, st);
  EXPECT_NEAR(re.step_time_s, 1e-3 + 40 * 3e-3 + 40 * 2e-3 / 11 + 40 * 6e-3, 1e-9);
  EXPECT_NEAR(rc.step_time_s, re.step_time_s, 1e-9 * re.step_time_s);
  EXPECT_NEAR(rc.exposed_comm_s, re.exposed_comm_s, 1e-9);
}

TEST(MicroBatches, WhenAndExtrapolationMatchFullReplay) {
  // Per micro-batch: forward GEMM 2 ms saving 100 bytes; backward GEMM 4 ms freeing them;
  // gradients (400 bytes) allocated in the first micro-batch only and kept; a gradient
  // all-reduce (3 ms, reduce stream) only in the last micro-batch after its backward.
  Builder b("dp_replicate=8");
  b.s.n_micro = 16;
  b.s.tokens_per_step_per_rank = 16 * 1024;
  b.Mem(MP_OP_ALLOC, MP_MEM_PARAMS, 1000, MP_WHEN_ONCE, MP_PHASE_PROLOGUE);
  b.Seg(0, 1, MP_PHASE_PROLOGUE);
  int first = (int)b.ops.size();
  b.Gemm(2e-3);
  b.Mem(MP_OP_ALLOC, MP_MEM_ACTIVATIONS, 100);
  b.Seg(first, 1, MP_PHASE_FORWARD, 1);
  first = (int)b.ops.size();
  b.Mem(MP_OP_ALLOC, MP_MEM_GRADS, 400, MP_WHEN_FIRST_MICRO, MP_PHASE_BACKWARD);
  int bw = b.Gemm(4e-3, MP_PHASE_BACKWARD);
  b.Mem(MP_OP_FREE, MP_MEM_ACTIVATIONS, 100, MP_WHEN_EVERY_MICRO, MP_PHASE_BACKWARD);
  int ar = b.Gather(3e-3 * 7.0 / 8.0 * 0.5, MP_STREAM_REDUCE, MP_GROUP_DP_REPLICATE);
  b.ops[ar].coll = MP_COLL_ALL_REDUCE;  // 2(n-1)/n: twice the all-gather time = 3 ms
  b.ops[ar].bytes = (3e-3 - kNodeAllReduceLat) * 100e9 * 8.0 / 14.0;
  b.ops[ar].when = MP_WHEN_LAST_MICRO;
  b.Dep(ar, bw);
  b.Seg(first, 1, MP_PHASE_BACKWARD, -1);
  first = (int)b.ops.size();
  int opt = b.Gemm(1e-3, MP_PHASE_OPTIMIZER);
  b.ops[opt].when = MP_WHEN_ONCE;
  b.Dep(opt, ar);
  b.Seg(first, 1, MP_PHASE_OPTIMIZER);
  mp_sim_result fast = Simulate(b, Cluster(), Profile(), 0);
  mp_sim_result full = Simulate(b, Cluster(), Profile(), 1);  // a trace turns extrapolation off
  double want = 16 * 6e-3 + 3e-3 + 1e-3;
  EXPECT_NEAR(full.step_time_s, want, 1e-12);
  EXPECT_NEAR(fast.step_time_s, want, 1e-9 * want);
  EXPECT_NEAR(fast.compute_s, 16 * 6e-3, 1e-9);
  EXPECT_NEAR(fast.optimizer_s, 1e-3, 1e-12);
  EXPECT_NEAR(fast.exposed_comm_s, 3e-3, 1e-9);
  EXPECT_EQ(full.peak_mem_bytes, 1000 + 400 + 100);
  EXPECT_EQ(fast.peak_mem_bytes, full.peak_mem_bytes);
  EXPECT_EQ(fast.mem_at_peak[MP_MEM_GRADS], 400);
  EXPECT_NEAR(fast.tokens_per_s_per_gpu, 16 * 1024 / want, 1e-6);
}

TEST(Memory, PeakBreakdownFragmentationOverheadAndFit) {
  Builder b;
  b.Mem(MP_OP_ALLOC, MP_MEM_PARAMS, 10 * (int64_t)kGiB, MP_WHEN_ONCE, MP_PHASE_PROLOGUE);
  b.Mem(MP_OP_ALLOC, MP_MEM_OPTIMIZER, 20 * (int64_t)kGiB, MP_WHEN_ONCE, MP_PHASE_PROLOGUE);
  b.Seg(0, 1, MP_PHASE_PROLOGUE);
  int first = (int)b.ops.size();
  b.Mem(MP_OP_ALLOC, MP_MEM_ACTIVATIONS, 30 * (int64_t)kGiB);
  b.Mem(MP_OP_ALLOC, MP_MEM_TEMP, 5 * (int64_t)kGiB);
  b.Mem(MP_OP_FREE, MP_MEM_TEMP, 5 * (int64_t)kGiB);
  b.Mem(MP_OP_FREE, MP_MEM_ACTIVATIONS, 30 * (int64_t)kGiB);
  b.Mem(MP_OP_ALLOC, MP_MEM_LOGITS, 2 * (int64_t)kGiB);  // lower than the peak above
  b.Mem(MP_OP_FREE, MP_MEM_LOGITS, 2 * (int64_t)kGiB);
  b.Seg(first, 1, MP_PHASE_FORWARD);
  mp_cluster c = Cluster();
  c.gpu.runtime_overhead_gib = 2.0;
  mp_stack_profile p = Profile();
  p.frag_factor = 1.1;
  mp_sim_result r = Simulate(b, c, p);
  // 65 GiB allocated at the peak x 1.1 + 2 GiB = 73.5 GiB; capacity 80 GiB.
  EXPECT_EQ(r.mem_at_peak[MP_MEM_PARAMS], 10 * (int64_t)kGiB);
  EXPECT_EQ(r.mem_at_peak[MP_MEM_OPTIMIZER], 20 * (int64_t)kGiB);
  EXPECT_EQ(r.mem_at_peak[MP_MEM_ACTIVATIONS], 30 * (int64_t)kGiB);
  EXPECT_EQ(r.mem_at_peak[MP_MEM_TEMP], 5 * (int64_t)kGiB);
  EXPECT_EQ(r.mem_at_peak[MP_MEM_LOGITS], 0);
  EXPECT_EQ(r.mem_max[MP_MEM_LOGITS], 2 * (int64_t)kGiB);  // its own high-water mark
  EXPECT_EQ(r.mem_max[MP_MEM_TEMP], 5 * (int64_t)kGiB);
  EXPECT_NEAR((double)r.peak_mem_bytes, 73.5 * kGiB, 1.0);
  EXPECT_NEAR((double)r.overhead_bytes, 8.5 * kGiB, 1.0);
  EXPECT_EQ(r.capacity_bytes, 80 * (int64_t)kGiB);
  EXPECT_TRUE(r.fits);
  // A stack keeping half the saved activations: 15 GiB of them at the peak.
  p.saved_act_factor = 0.5;
  r = Simulate(b, c, p);
  EXPECT_EQ(r.mem_at_peak[MP_MEM_ACTIVATIONS], 15 * (int64_t)kGiB);
  p.saved_act_factor = 1.0;
  // With 10 % headroom capacity is 72 GiB: it does not fit.
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.cluster = &c;
  cfg.stack = &p;
  cfg.mem_headroom = 0.1;
  ASSERT_EQ(mp_simulate(&ctx, b.Get(), &cfg, &r, NULL), MP_OK);
  EXPECT_FALSE(r.fits);
}

TEST(Memory, CachingAllocatorReplayAddsItsGap) {
  // U = 1000 MiB (50 pages of 20 MiB). A 2U, B 4U, C 4U at 0, 2U, 6U; B and A freed leave
  // a 6U hole at 0. D of 2U + 512 B splits it, leaving 4U - 512 B, which E of 4U does not
  // fit: the segment grows by 4U behind C. Allocated peak 10U + 512 B, reserved 14U: the
  // gap is 4U - 512 B and the reported peak the reserved 14U (frag_factor 1, no runtime
  // overhead). D of exactly 2U leaves 4U, E fits it, and the gap is 0.
  const int64_t U = 1000LL << 20;
  const int64_t sizes[] = {2 * U, 4 * U, 4 * U};
  for (int exact = 0; exact < 2; exact++) {
    Builder b;
    for (int i = 0; i < 3; i++) b.ops[b.Mem(MP_OP_ALLOC, MP_MEM_ACTIVATIONS, sizes[i])].buf = i;
    b.ops[b.Mem(MP_OP_FREE, MP_MEM_ACTIVATIONS, 4 * U)].buf = 1;
    b.ops[b.Mem(MP_OP_FREE, MP_MEM_ACTIVATIONS, 2 * U)].buf = 0;
    const int64_t d = exact ? 2 * U : 2 * U + 512;
    b.ops[b.Mem(MP_OP_ALLOC, MP_MEM_TEMP, d)].buf = 3;
    b.ops[b.Mem(MP_OP_ALLOC, MP_MEM_TEMP, 4 * U)].buf = 4;
    b.Seg(0, 1, MP_PHASE_FORWARD);
    mp_cluster c = Cluster();
    c.gpu.runtime_overhead_gib = 0.0;
    mp_stack_profile p = Profile();
    p.frag_factor = 1.0;
    EXPECT_EQ(Simulate(b, c, p).peak_mem_bytes, 4 * U + d + 4 * U);
    p.alloc_replay = 1;
    EXPECT_EQ(Simulate(b, c, p).peak_mem_bytes, exact ? 10 * U : 14 * U);
  }
}

TEST(Pipeline, TimelineAndInflightActivations) {
  // A stage of pp=4 running 8 micro-batches of 1 ms forward (leaving 100 bytes of
  // activations held) and 2 ms backward, every stage alike, and a 2 MiB send of each chunk's
  // activations and gradient on the pp group (100 GB/s NVLink, 20.97 us). 1F1B: (m + p - 1)
  // (f + b) = 33 ms, plus the transfers of the fill and drain and of the steady state (the
  // timeline's, tested in tests/sim/pipeline_test.cc); interleaved with two chunks of half
  // the time each: m (f + b) + (p - 1)(f + b)/2 = 28.5 ms plus transfers. Stage 0 holds pp
  // micro-batches under 1F1B, (pp - 1) x 2 + (v - 1) x pp + 1 = 11 chunks of 50 bytes
  // interleaved.
  for (int interleaved = 0; interleaved <= 1; interleaved++) {
    Builder b("pp=4,dp_shard=2");
    b.plan.opts.pp_schedule = interleaved ? MP_PP_INTERLEAVED : MP_PP_1F1B;
    b.plan.opts.pp_virtual = interleaved ? 2 : 1;
    b.s.n_micro = 8;
    b.s.tokens_per_step_per_rank = 8 * 1024;
    const int v = interleaved ? 2 : 1;
    const double p2p = 2.0 * 1024 * 1024 / 100e9;
    auto send = [&b](mp_phase ph) { /* the chunk's 2 MiB to the neighbouring stage */
      mp_op o = b.Base(MP_OP_COMM, ph, MP_STREAM_P2P);
      o.coll = MP_COLL_SEND;
      o.group = MP_GROUP_PP;
      o.bytes = 2.0 * 1024 * 1024;
      b.Push(o);
    };
    for (int c = 0; c < v; c++) {
      int first = (int)b.ops.size();
      b.Gemm(1e-3 / v);
      b.Mem(MP_OP_ALLOC, MP_MEM_ACTIVATIONS, 100 / v);
      send(MP_PHASE_FORWARD);
      b.Seg(first, 1, MP_PHASE_FORWARD, 0, c);
    }
    for (int c = v - 1; c >= 0; c--) {
      int first = (int)b.ops.size();
      b.Gemm(2e-3 / v, MP_PHASE_BACKWARD);
      b.Mem(MP_OP_FREE, MP_MEM_ACTIVATIONS, 100 / v, MP_WHEN_EVERY_MICRO, MP_PHASE_BACKWARD);
      send(MP_PHASE_BACKWARD);
      b.Seg(first, 1, MP_PHASE_BACKWARD, 0, c);
    }
    mp_sim_result r = Simulate(b, Cluster(), Profile());
    // the same timeline from the stage's times
    mp_pp_stage_times t;
    memset(&t, 0, sizeof t);
    for (int c = 0; c < v; c++) t.f[c] = 1e-3 / v, t.b[c] = 2e-3 / v;
    t.send_f = t.send_b = p2p;
    const mp_pp_stage_times *st[4] = {&t, &t, &t, &t};
    double finish[4];
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    ASSERT_EQ(mp_sim_pipeline(&ctx, b.plan.opts.pp_schedule, MP_PP_FLAVOR_MEGATRON, 4, v, 8, st, finish), MP_OK);
    EXPECT_NEAR(r.step_time_s, *std::max_element(finish, finish + 4), 1e-12);
    const double free_transfers = interleaved ? 28.5e-3 : 33e-3;
    EXPECT_GT(r.step_time_s, free_transfers);
    EXPECT_LT(r.step_time_s, free_transfers + 2 * 8 * v * p2p + 6 * p2p);
    EXPECT_NEAR(r.bubble_s, r.step_time_s - 24e-3, 1e-12);
    EXPECT_EQ(r.mem_at_peak[MP_MEM_ACTIVATIONS], interleaved ? 11 * 50 : 4 * 100);
    // tokens per replica (pp=4 GPUs) per step
    EXPECT_NEAR(r.tokens_per_s_per_gpu, 8 * 1024 / r.step_time_s / 4, 1e-6);
  }
}

TEST(Stacks, RequiredProfilesLoadWithSources) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  const char *names[] = {"torchtitan-eager", "torchtitan-compile", "llm.c", "meshplan-cuda",
                         "meshplan-cpu"};
  for (const char *n : names) {
    mp_stack_profile p;
    ASSERT_EQ(mp_stack_load(&ctx, n, &p), MP_OK) << n << ": " << mp_errmsg(&ctx);
    EXPECT_STREQ(p.name, n);
    EXPECT_GT(strlen(p.source), 40u) << n;
    EXPECT_GE(p.frag_factor, 1.0);
    // meshplan's runtimes name their own memory layouts; the other GPU stacks keep the
    // torchtitan model their figures were validated with
    EXPECT_EQ(p.mem_model, strcmp(n, "meshplan-cpu") == 0    ? MP_MEM_MODEL_MESHPLAN_CPU
                           : strcmp(n, "meshplan-cuda") == 0 ? MP_MEM_MODEL_MESHPLAN_CUDA
                                                             : MP_MEM_MODEL_TORCHTITAN)
        << n;
  }
  mp_stack_profile p;
  EXPECT_EQ(mp_stack_from_text(&ctx,
                               "{\"name\":\"x\",\"gemm_eff_max\":0.5,\"gemm_eff_half_mnk\":0,"
                               "\"fp8_gemm_eff_max\":0.5,\"attention_eff\":0.5,\"hbm_eff\":0.5,"
                               "\"link_eff\":0.5,\"kernel_overhead_us\":0,\"comm_overhead_us\":0,"
                               "\"frag_factor\":1,\"source\":\"s\",\"memory_model\":\"tpu\"}",
                               "x.json", &p),
            MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "memory_model 'tpu'"), nullptr) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_stack_load(&ctx, "no-such-stack", &p), MP_ERR_NOT_FOUND);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "torchtitan-eager"), nullptr);
  EXPECT_EQ(mp_stack_from_text(&ctx,
                               "{\"name\":\"x\",\"gemm_eff_max\":1.5,\"gemm_eff_half_mnk\":0,"
                               "\"fp8_gemm_eff_max\":0.5,\"attention_eff\":0.5,\"hbm_eff\":0.5,"
                               "\"link_eff\":0.5,\"kernel_overhead_us\":0,\"comm_overhead_us\":0,"
                               "\"frag_factor\":1,\"source\":\"s\"}",
                               "x.json", &p),
            MP_ERR_INVALID);
}
