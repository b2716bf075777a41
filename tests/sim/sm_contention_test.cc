// SM contention: an NCCL collective's kernel holds one SM per channel of its communicator
// while it runs, and the compute stream's flops-bound kernels beside it run on the SMs it
// leaves (sim/engine.c, contended_end; sim/network.c, mp_sim_nccl_ring_channels); Transformer
// Engine's userbuffers reduce-scatter holds its num_sm beside the GEMM it overlaps
// (sim/cost.c, price_fused), and so do its bulk overlaps beside whole GEMMs (price_bulk), each
// GEMM by its own userbuffers config (sim/ub_cfg.c).
// Every figure below is worked by hand in its comment.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "sim/sim.h"
#include "tests/sim/round_figures.h"

namespace {

// An H100 SXM's SMs and NVLink (132 SMs; 18 links of 25 GB/s a direction) on the round
// cluster of round_figures.h: one node of 8, 100 GB/s a GPU between them.
mp_cluster H100Node(int gpus = 8) {
  mp_cluster c = Cluster(gpus, 8);
  c.gpu.sms = 132;
  c.gpu.nvlink_GBps_per_dir = 450;
  c.gpu.compute_capability = 90;
  return c;
}

mp_stack_profile Contended() {
  mp_stack_profile p = Profile();
  p.nccl_sm_contention = 1;
  return p;
}

// One rank's forward, op by op: GEMMs on the compute stream, all-gathers of dp_shard=8 on
// the gather stream, in issue order.
struct Forward {
  mp_plan plan;
  std::vector<mp_op> ops;
  mp_segment seg;
  mp_schedule s;

  explicit Forward(const char *mesh = "dp_shard=8") {
    memset(&plan, 0, sizeof plan);
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    EXPECT_EQ(mp_mesh_parse(&ctx, mesh, 0, &plan.mesh), MP_OK) << mp_errmsg(&ctx);
    plan.opts.pp_virtual = 1;
  }
  mp_op &Add(int type, int stream) {
    mp_op o;
    memset(&o, 0, sizeof o);
    o.type = (uint8_t)type;
    o.phase = MP_PHASE_FORWARD;
    o.stream = (uint8_t)stream;
    o.when = MP_WHEN_EVERY_MICRO;
    o.dtype = MP_DTYPE_BF16;
    o.module = o.layer = o.unit = -1;
    o.batch = 1;
    ops.push_back(o);
    return ops.back();
  }
  // A bf16 GEMM of t seconds on the round cluster (efficiency 0.5 of 1e15), no HBM bytes:
  // flops-bound.
  void Gemm(double t) {
    mp_op &o = Add(MP_OP_COMPUTE, MP_STREAM_COMPUTE);
    o.kernel = MP_KERNEL_GEMM;
    o.m = o.n = o.k = 1024;
    o.flops = t * 0.5e15;
  }
  // A residual add of t seconds: its HBM bytes at 0.5 of 1000 GB/s, no FLOPs.
  void Add_(double t) {
    mp_op &o = Add(MP_OP_COMPUTE, MP_STREAM_COMPUTE);
    o.kernel = MP_KERNEL_RESIDUAL;
    o.bytes = t * 0.5e12;
  }
  // An all-gather of t seconds over 8 ranks at 100 GB/s: NCCL's latency and bytes x 7/8 / bw.
  void Gather(double t) {
    mp_op &o = Add(MP_OP_COMM, MP_STREAM_GATHER);
    o.coll = MP_COLL_ALL_GATHER;
    o.group = MP_GROUP_DP_SHARD;
    o.bytes = (t - kNodeGatherLat) * 100e9 * 8.0 / 7.0;
  }
  const mp_schedule *Get() {
    memset(&seg, 0, sizeof seg);
    seg.n_ops = (int32_t)ops.size();
    seg.repeat = 1;
    seg.phase = MP_PHASE_FORWARD;
    memset(&s, 0, sizeof s);
    s.plan = &plan;
    s.ops = ops.data();
    s.n_ops = (int32_t)ops.size();
    s.segs = &seg;
    s.n_segs = 1;
    s.n_micro = 1;
    s.micro_batch = 1;
    s.seq = 1024;
    s.tokens_per_step_per_rank = 1024;
    return &s;
  }
};

mp_sim_result Simulate(Forward &f, const mp_cluster &c, const mp_stack_profile &p, int trace = 0) {
  return SimulateSchedule(f.Get(), c, p, trace);
}

mp_sim_link Link(int n, int nodes, int per_node, double nic_GBps) {
  mp_sim_link l;
  memset(&l, 0, sizeof l);
  l.n = n;
  l.nodes = nodes;
  l.per_node = per_node;
  l.inter_GBps = nic_GBps;
  return l;
}

}  // namespace

// NCCL 2.21's ring channels, worked from src/graph/search.cc and connect.cc:
//   H100 SXM, one node: 18 links x 20.6 = 370.8 GB/s; 6 rings at 60 (360; 50 gives 7 x 50 =
//     350, 40 gives 9 x 40 = 360, 30 gives 12 x 30 = 360: none more; 24 / 60 < 0.49 stops);
//     duplicated (60 >= 50) to 12, doubled by ncclTopoPostset: 24, what NCCL_DEBUG=INFO
//     prints on 8-GPU H100 nodes ("24 coll channels").
//   H800, one node: 8 links = 164.8; 60: 2 (120), 50: 3 (150), 40: 4 (160), 30: 5 (150),
//     24: 6 (144), 20: 8 (160, not more), 15 / 40 < 0.49 stops: 4 at 40, duplicated (4 is
//     not over 4) to 8, doubled: 16, what NCCL_DEBUG=INFO prints on 8-GPU H800 nodes.
//   A100, one node: 12 links x 20 = 240; 6 at 40 fill it; duplicated (sm80) to 12: 24.
//   Across nodes at 50 GB/s a NIC (sm90): a ring a NIC at 48; 8 a node are not duplicated
//     (sm90, under 50, over 4): 16; 1 a node is (2 at 24): 4; 2 a node: 8.
TEST(NcclChannels, RingChannelsAsNcclBuildsThem) {
  mp_gpu h100 = H100Node().gpu, h800 = h100, a100 = h100;
  h800.nvlink_GBps_per_dir = 200;
  a100.nvlink_GBps_per_dir = 300;
  a100.compute_capability = 80;
  const mp_sim_link node = Link(8, 1, 8, 50);
  EXPECT_EQ(mp_sim_nccl_ring_channels(&h100, &node, 0), 24);
  EXPECT_EQ(mp_sim_nccl_ring_channels(&h800, &node, 0), 16);
  EXPECT_EQ(mp_sim_nccl_ring_channels(&a100, &node, 0), 24);
  const mp_sim_link eight = Link(128, 16, 8, 50), one = Link(16, 16, 1, 50), two = Link(32, 16, 2, 50);
  EXPECT_EQ(mp_sim_nccl_ring_channels(&h100, &eight, 0), 16);
  EXPECT_EQ(mp_sim_nccl_ring_channels(&h100, &one, 0), 4);
  EXPECT_EQ(mp_sim_nccl_ring_channels(&h100, &two, 0), 8);
  // A100 at 25 GB/s a NIC (HDR): rings at 24, under 25 so not duplicated: 2 a NIC.
  const mp_sim_link hdr = Link(128, 16, 8, 25);
  EXPECT_EQ(mp_sim_nccl_ring_channels(&a100, &hdr, 0), 16);
  // NCCL_MAX_CTAS caps them.
  EXPECT_EQ(mp_sim_nccl_ring_channels(&h100, &node, 8), 8);
}

// A 3 ms GEMM issued beside a 1 ms all-gather of dp_shard=8 inside an H100 node: the
// gather holds 24 of 132 SMs over [0, 1 ms], so the GEMM runs at 108/132 = 9/11 of its rate
// there (9/11 ms of its work) and finishes the other 24/11 ms alone: 1 + 24/11 = 35/11 ms.
// The 2/11 ms it lost shows as exposed communication.
TEST(SmContention, GemmBesideAllGatherRunsOnTheSmsLeft) {
  Forward f;
  f.Gather(1e-3);
  f.Gemm(3e-3);
  const mp_sim_result r = Simulate(f, H100Node(), Contended());
  EXPECT_NEAR(r.step_time_s, 35e-3 / 11, 1e-12);
  EXPECT_NEAR(r.compute_s, 3e-3, 1e-12);
  EXPECT_NEAR(r.exposed_comm_s, 2e-3 / 11, 1e-12);
  // The trace's path (op by op) prices it the same.
  EXPECT_NEAR(Simulate(f, H100Node(), Contended(), 1).step_time_s, 35e-3 / 11, 1e-12);
}

// The stack's switch off, or a GPU whose profile states no SMs: the GEMM hides the gather.
TEST(SmContention, OffWithoutTheSwitchOrTheGpusSms) {
  Forward f;
  f.Gather(1e-3);
  f.Gemm(3e-3);
  EXPECT_NEAR(Simulate(f, H100Node(), Profile()).step_time_s, 3e-3, 1e-15);
  mp_cluster no_sms = H100Node();
  no_sms.gpu.sms = 0;
  EXPECT_NEAR(Simulate(f, no_sms, Contended()).step_time_s, 3e-3, 1e-15);
}

// Kernels across the gather's end: a 3 ms gather, GEMM A of 1 ms runs wholly beside it,
// 11/9 ms; GEMM B of 2 ms starts at 11/9 ms, does (3 - 11/9) x 9/11 = 16/11 ms of work by
// 3 ms and the other 6/11 ms alone: it ends at 3 + 6/11 = 39/11 ms.
TEST(SmContention, KernelsAcrossTheCollectivesEnd) {
  Forward f;
  f.Gather(3e-3);
  f.Gemm(1e-3);
  f.Gemm(2e-3);
  EXPECT_NEAR(Simulate(f, H100Node(), Contended()).step_time_s, 39e-3 / 11, 1e-12);
}

// A bandwidth-bound kernel keeps its pace beside the gather (fewer SMs still draw the HBM
// bandwidth it is bound by): a 2 ms residual add hides a 1 ms gather.
TEST(SmContention, BandwidthBoundKernelKeepsItsPace) {
  Forward f;
  f.Gather(1e-3);
  f.Add_(2e-3);
  EXPECT_NEAR(Simulate(f, H100Node(), Contended()).step_time_s, 2e-3, 1e-15);
}

// A collective issued after the kernel it runs beside (a prefetch issued once the layer's
// kernels are in the stream): GEMM A (2 ms) is priced alone, then the gather starts at 0
// on its own stream and holds 24 SMs over [0, 1 ms] of A: A lost 24/132 x 1 ms = 2/11 ms of
// work, done after it; GEMM B (1 ms) follows: 2 + 2/11 + 1 = 35/11 ms, as with the gather
// issued first.
TEST(SmContention, CollectiveIssuedAfterTheKernelItRunsBeside) {
  Forward f;
  f.Gemm(2e-3);
  f.Gather(1e-3);
  f.Gemm(1e-3);
  EXPECT_NEAR(Simulate(f, H100Node(), Contended()).step_time_s, 35e-3 / 11, 1e-12);
  EXPECT_NEAR(Simulate(f, H100Node(), Contended(), 1).step_time_s, 35e-3 / 11, 1e-12);
}

// Transformer Engine's userbuffers (ub_sms 16 under tp_comm_overlap) on a fused GEMM ->
// reduce-scatter pair of tp=8: the GEMM (8 ms whole, 1 ms a chunk of 128 rows: eff 0.5
// at any size, its bytes far below) runs its 8 chunks on 132 - 16 = 116 SMs, 8 x 132/116 ms;
// the 1 ms reduce-scatter hides under the 7 chunks after the first. Without ub_sms: 8 ms.
TEST(SmContention, UserbuffersReduceScatterTakesItsSms) {
  Forward f("tp=8");
  f.plan.opts.tp_comm_fused = 1;
  f.Gemm(8e-3);
  f.ops.back().fused = MP_FUSE_SCATTER;
  f.ops.back().layer = 0;
  mp_op &rs = f.Add(MP_OP_COMM, MP_STREAM_COMPUTE);
  rs.coll = MP_COLL_REDUCE_SCATTER;
  rs.group = MP_GROUP_TP;
  rs.fused = MP_FUSE_SCATTER;
  rs.layer = 0;
  rs.bytes = 1e-3 * 100e9 * 8.0 / 7.0;
  mp_stack_profile p = Profile();
  p.tp_comm_overlap = 1;
  const double plain = Simulate(f, H100Node(), p).step_time_s;
  p.ub_sms = 16;
  const double ub = Simulate(f, H100Node(), p).step_time_s;
  // the chunks' own HBM bytes: each reads the whole 2 MiB weight (eff 0.5 of 1000 GB/s: 4.2
  // us), under its 1 ms of arithmetic
  EXPECT_NEAR(plain, 8e-3, 1e-12);
  EXPECT_NEAR(ub, 8e-3 * 132.0 / 116.0, 1e-12);
  // Under the run's own config, a ring_exchange reduce-scatter (fc2_fprop:ring_exchange; the
  // op's module -1 is the MLP's): its sends run on the copy engines, so the 8 chunks keep
  // every SM, 8 ms, the 1 ms of sends hidden under the 7 after the first; then the reduction
  // of the tp partial outputs on the compute stream (CommOverlapP2PBase::split_overlap_rs,
  // TE v2.0) reads the whole output, the collective's 1e-3 x 100e9 x 8/7 bytes, and writes an
  // eighth, x 9/8, at 1000 GB/s x hbm_eff 0.5: 1e-3 x 100 x 9/7 / 500 s = 9/35 ms (no launch
  // overhead in Profile()): 8 + 9/35 ms. A pipeline entry of 24 SMs with the margin runs the
  // 8 chunks on 108 SMs and no reduction kernel: 8 x 132/108 ms.
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_sim_ub_cfg_parse(&ctx, "fc2_fprop:ring_exchange", p.ub_cfg), MP_OK) << mp_errmsg(&ctx);
  EXPECT_NEAR(Simulate(f, H100Node(), p).step_time_s, 8e-3 + 9e-3 / 35.0, 1e-12);
  ASSERT_EQ(mp_sim_ub_cfg_parse(&ctx, "fc2_fprop:pipeline:24:1", p.ub_cfg), MP_OK);
  EXPECT_NEAR(Simulate(f, H100Node(), p).step_time_s, 8e-3 * 132.0 / 108.0, 1e-12);
}

// Transformer Engine's bulk overlaps (ub_sms 16 under tp_comm_overlap, tp=8) in a
// column-parallel Linear's backward: the 3 ms re-gather of its input beside its 2 ms
// input-gradient GEMM, the 1 ms reduce-scatter of the input gradient beside its 2 ms
// weight-gradient GEMM, each GEMM whole on 132 - 16 = 116 SMs (2 x 132/116 ms) and the
// compute stream waiting for the collective where the GEMM ends: max(264/116, 3) +
// max(264/116, 1) = 3 + 264/116 ms. The all-gather takes only the input-gradient GEMM and
// the reduce-scatter only the weight-gradient one (without the marks: 3 + 2 + 2 + 1 = 8 ms);
// without ub_sms the GEMMs keep their 2 ms: 3 + 2 = 5 ms.
TEST(SmContention, UserbuffersBulkOverlapsRunBesideWholeGemms) {
  Forward f("tp=8");
  f.plan.opts.tp_comm_fused = 1;
  const auto tp = [&](mp_coll c, double t) {
    mp_op &o = f.Add(MP_OP_COMM, MP_STREAM_COMPUTE);
    o.coll = (uint8_t)c;
    o.group = MP_GROUP_TP;
    o.layer = 0;
    // all-gather and reduce-scatter alike: NCCL's latency and bytes x 7/8 / bw
    o.bytes = (t - kNodeGatherLat) * 100e9 * 8.0 / 7.0;
  };
  const auto gemm = [&](mp_variant v, double t) {
    f.Gemm(t);
    f.ops.back().variant = (uint8_t)v;
    f.ops.back().layer = 0;
  };
  tp(MP_COLL_ALL_GATHER, 3e-3);
  gemm(MP_VAR_DGRAD, 2e-3);
  gemm(MP_VAR_WGRAD, 2e-3);
  tp(MP_COLL_REDUCE_SCATTER, 1e-3);
  mp_stack_profile p = Profile();
  p.tp_comm_overlap = 1;
  p.ub_sms = 16;
  EXPECT_NEAR(Simulate(f, H100Node(), p).step_time_s, 8e-3, 1e-12);
  for (mp_op &o : f.ops)
    if (o.type == MP_OP_COMM || o.kernel == MP_KERNEL_GEMM) o.fused = MP_FUSE_BULK;
  EXPECT_NEAR(Simulate(f, H100Node(), p).step_time_s, 3e-3 + 2e-3 * 132.0 / 116.0, 1e-12);
  p.ub_sms = 0;
  EXPECT_NEAR(Simulate(f, H100Node(), p).step_time_s, 5e-3, 1e-12);
  // A published config (TE launches an overlap's GEMM on sm_count - num_sm SMs under
  // set_sm_margin, on every SM without it: comm_gemm_overlap.cpp CommOverlapCore, v2.0), on
  // the MLP's GEMMs (module -1). fc1_dgrad bulk on 2 SMs without margin: the 2 ms
  // input-gradient GEMM runs beside the 3 ms re-gather at 130/132 of its pace, 2 x 132/130 =
  // 2.03 ms, inside the 3 ms: 3 ms. fc1_wgrad bulk on 4 SMs without margin: the 1 ms
  // reduce-scatter leaves the 2 ms weight-gradient GEMM 128/132 of its pace while it runs, 1
  // ms doing 128/132 ms of its work, then the rest, 2 - 128/132 ms, at full pace: 3 - 128/132
  // ms. In all 6 - 128/132 ms. With fc1_wgrad's margin (bulk:4:1) the GEMM runs whole on 128
  // SMs, 2 x 132/128 ms, past the 1 ms: 3 + 264/128 ms. The attention's entries leave the
  // MLP's GEMMs on TE's default (16 SMs with the margin): 3 + 264/116 ms.
  p.ub_sms = 16;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_sim_ub_cfg_parse(&ctx, "fc1_dgrad:bulk:2:0 fc1_wgrad:bulk:4:0", p.ub_cfg), MP_OK) << mp_errmsg(&ctx);
  EXPECT_NEAR(Simulate(f, H100Node(), p).step_time_s, 6e-3 - 1e-3 * 128.0 / 132.0, 1e-12);
  ASSERT_EQ(mp_sim_ub_cfg_parse(&ctx, "fc1_dgrad:bulk:2:0 fc1_wgrad:bulk:4:1", p.ub_cfg), MP_OK);
  EXPECT_NEAR(Simulate(f, H100Node(), p).step_time_s, 3e-3 + 2e-3 * 132.0 / 128.0, 1e-12);
  ASSERT_EQ(mp_sim_ub_cfg_parse(&ctx, "qkv_dgrad:bulk:2:0 qkv_wgrad:bulk:4:0", p.ub_cfg), MP_OK);
  EXPECT_NEAR(Simulate(f, H100Node(), p).step_time_s, 3e-3 + 2e-3 * 132.0 / 116.0, 1e-12);
}

TEST(SmContention, UserbuffersConfigRejectsMalformedItems) {
  mp_stack_profile p = Profile();
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  for (const char *bad : {"fc3_fprop:bulk:4:0", "qkv_dgrad:bulk", "qkv_dgrad:bulk:4", "qkv_dgrad:bulk:4:2",
                          "qkv_dgrad:split:4:0", "qkv_dgrad:bulk:x:0"})
    EXPECT_EQ(mp_sim_ub_cfg_parse(&ctx, bad, p.ub_cfg), MP_ERR_USAGE) << bad;
  ASSERT_EQ(mp_sim_ub_cfg_parse(&ctx, " qkv_wgrad:bulk:8:0  proj_fprop:ring_exchange ", p.ub_cfg), MP_OK);
  EXPECT_EQ(p.ub_cfg[MP_UB_QKV_WGRAD].sms, 8);
  EXPECT_EQ(p.ub_cfg[MP_UB_QKV_WGRAD].margin, 0);
  EXPECT_EQ(p.ub_cfg[MP_UB_PROJ_FPROP].method, MP_UB_RING_EXCHANGE);
  EXPECT_EQ(p.ub_cfg[MP_UB_PROJ_FPROP].sms, 1);
  // an unnamed GEMM takes TE's default: fc2_fprop pipeline on ub_sms with the margin
  p.ub_sms = 16;
  const mp_ub_overlap d = mp_sim_ub_overlap(&p, MP_UB_FC2_FPROP);
  EXPECT_EQ(d.method, MP_UB_PIPELINE);
  EXPECT_EQ(d.sms, 16);
  EXPECT_EQ(d.margin, 1);
}

namespace {

// A column-parallel region's backward as Transformer Engine's Linear runs it without the
// bulk overlaps, on one rank of tp=8 inside an H100 node: GEMMs of `module` (2 ms a GEMM at
// eff 0.5, flops-bound) and the input gradient's reduce-scatter of t_rs seconds on the
// compute stream (NCCL's in-node latency and bytes x 7/8 / 100 GB/s), all of layer 0 in the
// backward.
struct Region {
  Forward f{"tp=8"};
  void Gemm(int module, mp_variant v, double t) {
    f.Gemm(t);
    f.ops.back().module = module;
    f.ops.back().variant = (uint8_t)v;
    f.ops.back().layer = 0;
    f.ops.back().phase = MP_PHASE_BACKWARD;
  }
  void ReduceScatter(double t) { Collective(MP_COLL_REDUCE_SCATTER, (t - kNodeGatherLat) * 100e9 * 8.0 / 7.0); }
  // without SP: an all-reduce of t seconds, NCCL's ring (its latency and 2 x 7/8 x bytes / bw;
  // its tree's 2 x bytes / bw is slower at these sizes)
  void AllReduce(double t) { Collective(MP_COLL_ALL_REDUCE, (t - kNodeAllReduceLat) * 100e9 * 8.0 / 14.0); }
  void Collective(mp_coll c, double bytes) {
    mp_op &o = f.Add(MP_OP_COMM, MP_STREAM_COMPUTE);
    o.coll = (uint8_t)c;
    o.group = MP_GROUP_TP;
    o.module = MP_MOD_Q;
    o.layer = 0;
    o.phase = MP_PHASE_BACKWARD;
    o.bytes = bytes;
  }
};

mp_stack_profile AsyncDgrad(int contended) {
  mp_stack_profile p = contended ? Contended() : Profile();
  p.tp_dgrad_async = 1;
  return p;
}

}  // namespace

// The input gradient's reduce-scatter (1 ms) beside the region's 2 ms weight-gradient GEMM,
// its NCCL kernel holding the 24 channels' SMs of an H100 node (the ring channels worked
// above): the GEMM runs at 108/132 of its pace for the 1 ms the collective runs, so it does
// 108/132 ms of work there and ends 1 + (2 - 108/132) = 2 + 24/132 ms after it starts; the
// collective ended beneath it. With the 2 ms input-gradient GEMM first: 4 + 24/132 ms.
// Without the contention priced: max(2, 1) + 2 = 4 ms; serial (a stack without
// tp_dgrad_async, or the plan's fused TP collectives, whose bulk pairs this region does not
// carry): 2 + 2 + 1 = 5 ms. Under Megatron-Core's per-communicator cap tp:8 (the MLPerf v5.0
// 405B config's max_ctas) the kernel holds 8 SMs: 4 + 8/132 ms; NCCL_MAX_CTAS 4 (the stack's
// nccl_max_ctas) overrides the communicator's config: 4 + 4/132 ms.
TEST(SmContention, AsyncInputGradientBesideWeightGradient) {
  Region r;
  r.Gemm(MP_MOD_Q, MP_VAR_DGRAD, 2e-3);
  r.Gemm(MP_MOD_Q, MP_VAR_WGRAD, 2e-3);
  r.ReduceScatter(1e-3);
  const mp_cluster c = H100Node();
  EXPECT_NEAR(Simulate(r.f, c, AsyncDgrad(1)).step_time_s, 4e-3 + 24e-3 / 132, 1e-12);
  EXPECT_NEAR(Simulate(r.f, c, AsyncDgrad(0)).step_time_s, 4e-3, 1e-12);
  EXPECT_NEAR(Simulate(r.f, c, Contended()).step_time_s, 5e-3, 1e-12);
  r.f.plan.opts.tp_comm_fused = 1;
  EXPECT_NEAR(Simulate(r.f, c, AsyncDgrad(1)).step_time_s, 5e-3, 1e-12);
  r.f.plan.opts.tp_comm_fused = 0;
  mp_stack_profile p = AsyncDgrad(1);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_sim_nccl_ctas_parse(&ctx, "dp_cp:8 tp:8 pp:2", p.nccl_group_ctas), MP_OK) << mp_errmsg(&ctx);
  EXPECT_NEAR(Simulate(r.f, c, p).step_time_s, 4e-3 + 8e-3 / 132, 1e-12);
  p.nccl_max_ctas = 4;
  EXPECT_NEAR(Simulate(r.f, c, p).step_time_s, 4e-3 + 4e-3 / 132, 1e-12);
}

// Two weight-gradient GEMMs of the region (v's 0.5 ms, q's 2 ms) beside a 1 ms
// reduce-scatter: v's ends within the collective, 0.5 x 132/108 = 0.6111 ms; q's runs the
// collective's last 1 - 0.6111 ms at 108/132 (0.3182 ms of work) and its remaining 1.6818 ms
// whole: 0.6111 + 0.3889 + 1.6818 = 2.6818 ms = 2.5 + 24/132, the collective's 1 ms costing
// 24/132 of a ms. A reduce-scatter of 3 ms outlasts q's 2 ms GEMM (2 x 132/108 = 2.444 ms
// within it) and the pair takes the collective's 3 ms; o's 1 ms weight gradient before the
// region is not beside it (the walk stops at another module): 1 + 2 + 3 = 6 ms (walked in,
// it would take 5.5455). Without SP, the all-reduce in its place: serial 3.5 ms, beside them
// 2.5 + 24/132 ms.
TEST(SmContention, AsyncInputGradientWalksTheRegion) {
  Region a;
  a.Gemm(MP_MOD_V, MP_VAR_WGRAD, 0.5e-3);
  a.Gemm(MP_MOD_Q, MP_VAR_WGRAD, 2e-3);
  a.ReduceScatter(1e-3);
  EXPECT_NEAR(Simulate(a.f, H100Node(), AsyncDgrad(1)).step_time_s, 2.5e-3 + 24e-3 / 132, 1e-12);
  Region b;
  b.Gemm(MP_MOD_O, MP_VAR_WGRAD, 1e-3);
  b.Gemm(MP_MOD_Q, MP_VAR_DGRAD, 2e-3);
  b.Gemm(MP_MOD_Q, MP_VAR_WGRAD, 2e-3);
  b.ReduceScatter(3e-3);
  EXPECT_NEAR(Simulate(b.f, H100Node(), AsyncDgrad(1)).step_time_s, 6e-3, 1e-12);
  Region c;
  c.Gemm(MP_MOD_V, MP_VAR_WGRAD, 0.5e-3);
  c.Gemm(MP_MOD_Q, MP_VAR_WGRAD, 2e-3);
  c.AllReduce(1e-3);
  EXPECT_NEAR(Simulate(c.f, H100Node(), Contended()).step_time_s, 3.5e-3, 1e-12);
  EXPECT_NEAR(Simulate(c.f, H100Node(), AsyncDgrad(1)).step_time_s, 2.5e-3 + 24e-3 / 132, 1e-12);
}

// Megatron-Core's communicator names into the schedule's groups: dp_cp also names the
// data-parallel replicas Megatron's DDP reduces over at cp 1 (its dp_cp communicator) and
// the group Megatron FSDP gathers and reduce-scatters the dense weights on (the schedule's
// fsdp group: mcore_fsdp_adapter.py, core_v0.14.0, builds its dp_cp mesh dimension from
// get_data_parallel_group(with_context_parallel=True)); ep_dp the experts' (efsdp: the
// core_v0.16.0 adapter's expt_dp, get_expert_data_parallel_group()); refusals name the item.
TEST(NcclCtas, ParsesMegatronCommunicators) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  int caps[MP_GROUP_COUNT];
  ASSERT_EQ(mp_sim_nccl_ctas_parse(&ctx, " dp:8  dp_cp:6 tp:4 pp:2 ", caps), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(caps[MP_GROUP_DP], 8);
  EXPECT_EQ(caps[MP_GROUP_DP_CP], 6);
  EXPECT_EQ(caps[MP_GROUP_DP_REPLICATE], 6);
  EXPECT_EQ(caps[MP_GROUP_FSDP], 6);
  EXPECT_EQ(caps[MP_GROUP_EFSDP], 0);
  EXPECT_EQ(caps[MP_GROUP_EDP], 0);
  EXPECT_EQ(caps[MP_GROUP_TP], 4);
  EXPECT_EQ(caps[MP_GROUP_PP], 2);
  EXPECT_EQ(caps[MP_GROUP_CP], 0);
  int ep_caps[MP_GROUP_COUNT];
  ASSERT_EQ(mp_sim_nccl_ctas_parse(&ctx, "ep_dp:4", ep_caps), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(ep_caps[MP_GROUP_EDP], 4);
  EXPECT_EQ(ep_caps[MP_GROUP_EFSDP], 4);
  EXPECT_EQ(ep_caps[MP_GROUP_FSDP], 0);
  mp_stack_profile p = Profile();
  memcpy(p.nccl_group_ctas, caps, sizeof caps);
  EXPECT_EQ(mp_sim_nccl_cap(&p, MP_GROUP_TP), 4);
  EXPECT_EQ(mp_sim_nccl_cap(&p, MP_GROUP_EP), 0);
  p.nccl_max_ctas = 16;
  EXPECT_EQ(mp_sim_nccl_cap(&p, MP_GROUP_TP), 16);
  for (const char *bad : {"tp:0", "tp:65", "mp:2", "tp8", "tp:8x", "tp:"}) {
    EXPECT_EQ(mp_sim_nccl_ctas_parse(&ctx, bad, caps), MP_ERR_USAGE) << bad;
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find(bad), std::string::npos) << mp_errmsg(&ctx);
  }
}
