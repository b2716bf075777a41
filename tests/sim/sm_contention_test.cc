// SM contention: an NCCL collective's kernel holds one SM per channel of its communicator
// while it runs, and the compute stream's flops-bound kernels beside it run on the SMs it
// leaves (sim/engine.c, contended_end; sim/network.c, mp_sim_nccl_ring_channels); Transformer
// Engine's userbuffers reduce-scatter holds its num_sm beside the GEMM it overlaps
// (sim/cost.c, price_fused), and so do its bulk overlaps beside whole GEMMs (price_bulk).
// Every figure below is worked by hand in its comment.
#include <gtest/gtest.h>

#include <cstring>
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
}
