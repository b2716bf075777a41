// NCCL's cost model as sim/network.c carries it (mp_sim_nccl_collective_s): per collective
// and size the fastest of ring and tree, LL, LL128 and Simple, each priced as NCCL's tuning
// model prices it (NVIDIA/nccl v2.27.7-1 src/graph/tuning.cc: baseLat, hwLat, the net post
// overhead, nsteps and nInterSteps, the protocols' bandwidths), against hand derivations.
#include <gtest/gtest.h>

#include <cstring>

#include "sim/sim.h"
#include "tests/sim/round_figures.h"

namespace {

const double kGiB = 1073741824.0;

mp_gpu H100() {
  mp_gpu g;
  memset(&g, 0, sizeof g);
  g.api = MP_GPU_API_CUDA;
  g.nvlink_GBps_per_dir = 450;
  g.compute_capability = 90;
  return g;
}

// A group of n ranks, per_node a node, its bandwidth bw (GB/s) and a NIC's nic (GB/s).
mp_sim_link Link(int n, int per_node, double bw, double nic) {
  mp_sim_link l;
  memset(&l, 0, sizeof l);
  l.n = n;
  l.per_node = per_node;
  l.nodes = n / per_node;
  l.GBps = bw;
  l.intra_GBps = 450;
  l.inter_GBps = nic;
  l.lat_s = 10e-6;
  return l;
}

// NCCL's time for collective c of bytes over link l's n ranks at its bandwidth on g.
double Nccl(mp_coll c, double bytes, const mp_sim_link &l, const mp_gpu &g = H100()) {
  return mp_sim_nccl_collective_s(c, bytes, l.n, &l, l.GBps, &g, 0, 0);
}

}  // namespace

// 128 ranks over 16 nodes, 8 a node (a data-parallel group of 16 DGX H100 nodes), a
// reduce-scatter: nsteps = 127, of which nInterSteps = 16 - 1 = 15 cross the network.
//   Simple: baseLat 8.4 + 112 x max(NVLink 3.4, net post 1.0 x 3) + 15 x net 14.0
//           = 8.4 + 380.8 + 210 = 599.2 us
//   LL128:  14.0 + 112 x max(1.9, 1.0) + 15 x 4.0 = 14 + 212.8 + 60 = 286.8 us, 0.92 x bw
//   LL:     6.6 + 112 x max(0.6, 1.0) + 15 x 2.7 = 6.6 + 112 + 40.5 = 159.1 us,
//           min(llMaxBw 20.4 (Intel host, 3+ nodes), 0.5 x bw) GB/s
// At 320 GB/s, 8 GiB: Simple's 127/128 x 8 GiB / 320e9 = 26.63 ms + 0.599 ms beats LL128's
// 26.63 / 0.92 + 0.287 = 29.23 ms. 1 MiB: LL's 159.1 us + 1040384 / 20.4e9 = 210.1 us beats
// LL128's 286.8 + 3.5 us and Simple's 599.2 + 3.3 us. The alpha-beta ring with the
// network's 10 us on all 127 steps would charge 1270 us.
TEST(NcclModel, RingAcrossSixteenNodesChargesOnlyNodeCrossingsAtTheNetworkLatency) {
  const mp_sim_link l = Link(128, 8, 320, 50);
  const double big = 8 * kGiB, small = 1048576;
  EXPECT_NEAR(Nccl(MP_COLL_REDUCE_SCATTER, big, l),
              599.2e-6 + 127.0 / 128 * big / 320e9, 1e-9);
  EXPECT_NEAR(Nccl(MP_COLL_ALL_GATHER, small, l),
              159.1e-6 + 127.0 / 128 * small / 20.4e9, 1e-9);
  EXPECT_NEAR(159.1e-6 + 127.0 / 128 * small / 20.4e9, 210.1e-6, 0.1e-6);
}

// Between the bulk and the small, LL128: 256 MiB over the same group, 127/128 x 256 MiB /
// 320e9 = 0.8323 ms: LL128 0.2868 + 0.8323 / 0.92 = 1.1915 ms against Simple's 0.5992 +
// 0.8323 = 1.4315 ms.
TEST(NcclModel, Ll128TakesTheMiddleSizesAcrossNodes) {
  const mp_sim_link l = Link(128, 8, 320, 50);
  const double b = 256.0 * 1048576;
  EXPECT_NEAR(Nccl(MP_COLL_REDUCE_SCATTER, b, l),
              286.8e-6 + 127.0 / 128 * b / (0.92 * 320e9), 1e-9);
  // sm60 has no LL128: Simple's
  mp_gpu p100 = H100();
  p100.compute_capability = 60;
  EXPECT_NEAR(Nccl(MP_COLL_REDUCE_SCATTER, b, l, p100),
              599.2e-6 + 127.0 / 128 * b / 320e9, 1e-9);
}

// Inside one node (8 ranks, NVLink, no net post): Simple's ring latency 8.4 + 7 x 3.4 =
// 32.2 us; 1 GiB of all-gather at 360 GB/s, 7/8 x 1 GiB / 360e9 = 2.61 ms, LL128's 8%
// more bandwidth time (0.21 ms) outweighs its 4.9 us less latency (14 + 7 x 1.9 = 27.3).
TEST(NcclModel, OneNodeRingPaysBaseLatencyAndNvlinkHops) {
  const mp_sim_link l = Link(8, 8, 360, 50);
  EXPECT_NEAR(Nccl(MP_COLL_ALL_GATHER, kGiB, l),
              32.2e-6 + 7.0 / 8 * kGiB / 360e9, 1e-9);
}

// An all-reduce of 4 KiB over the 16 nodes: the tree's LL, 6.8 + 2 x (7 x 0.6 + log2 16 x
// 5.0) = 55.2 us, at min(0.92 x 320 / 3.8, 20.4) = 20.4 GB/s x treeCorrectionFactor 0.7
// (LL, 4096 / 64 = 2^6): 8192 / 14.28e9 = 0.57 us; the ring's LL needs 6.6 + (254 - 30) x
// 1.0 + 30 x 2.7 = 311.6 us. 8 GiB: the ring's Simple, its latency x 1.4 (the plateau of
// an inter-node Simple all-reduce): 8.4 + 224 x 3.4 + 30 x 14 = 1190 us x 1.4 = 1666 us,
// plus 2 x 127/128 x 8 GiB / 320e9 = 53.26 ms, where the tree's Simple pays 2 x 8 GiB /
// (0.92 x 320e9) = 58.4 ms.
TEST(NcclModel, AllReduceTakesTheTreeSmallAndTheRingLarge) {
  const mp_sim_link l = Link(128, 8, 320, 50);
  EXPECT_NEAR(Nccl(MP_COLL_ALL_REDUCE, 4096, l),
              55.2e-6 + 8192 / (20.4e9 * 0.7), 1e-9);
  const double big = 8 * kGiB;
  EXPECT_NEAR(Nccl(MP_COLL_ALL_REDUCE, big, l),
              1.4 * 1190.0e-6 + 2.0 * 127 / 128 * big / 320e9, 1e-9);
}

// One rank a node (16 ranks, 16 nodes): every hop is the network's, at the tree's network
// latency (tuning.cc: "with ppn=1 latencies are fully exposed"): Simple 8.4 + 15 x 14 =
// 218.4 us for a reduce-scatter; 8 GiB at 40 GB/s: 15/16 x 8 GiB / 40e9 = 201.3 ms, LL128
// 8% slower there, PAT (the whole 8 GiB at 0.75 x 40 GB/s) 286 ms.
TEST(NcclModel, OneRankANodeChargesEveryStepAtTheNetwork) {
  const mp_sim_link l = Link(16, 1, 40, 50);
  const double big = 8 * kGiB;
  EXPECT_NEAR(Nccl(MP_COLL_REDUCE_SCATTER, big, l),
              218.4e-6 + 15.0 / 16 * big / 40e9, 1e-9);
}

// PAT, for one rank a node: an all-gather of 1 MiB over 16 nodes at 40 GB/s pays 8 +
// log2 16 x 14 / 3.5 + 16 x 2.8 = 68.8 us and 1048576 / (0.75 x 40e9) = 34.95 us, 103.7 us,
// where the ring's LL pays 6.6 + 15 x 5.0 (the tree's network LL latency, one rank a node)
// = 81.6 us and 15/16 x 1 MiB / min(20.4, 20) GB/s = 49.2 us, 130.8 us. A reduce-scatter
// of it too; with two ranks a node there is no PAT: the ring's LL, 6.6 + 16 x 1.0 + 15 x
// 2.7 = 63.1 us and 31/32 x 1 MiB / 20 GB/s = 50.8 us.
TEST(NcclModel, PatForOneRankANode) {
  const double b = 1048576;
  const mp_sim_link one = Link(16, 1, 40, 50), two = Link(32, 2, 40, 50);
  EXPECT_NEAR(Nccl(MP_COLL_ALL_GATHER, b, one), 68.8e-6 + b / 30e9, 1e-9);
  EXPECT_NEAR(Nccl(MP_COLL_REDUCE_SCATTER, b, one), 68.8e-6 + b / 30e9, 1e-9);
  EXPECT_NEAR(Nccl(MP_COLL_ALL_GATHER, b, two),
              63.1e-6 + 31.0 / 32 * b / 20e9, 1e-9);
}

// The NCCL a run used decides PAT (sim/network.c, pat_bw_share; NVIDIA/nccl src/graph/
// tuning.cc): an all-gather of 8 MiB over 16 nodes of one rank each at 40 GB/s, 4 ring
// channels (one NIC a node at 48 GB/s a ring, doubled at half speed, doubled again).
//   ring LL128: 14.0 + 15 x 8.5 (the tree's network LL128 latency, one rank a node) = 141.5 us
//               and 15/16 x 8 MiB / min(0.92 x 40, 4 x 36.7) GB/s = 213.7 us: 355.2 us
//   ring Simple: 8.4 + 15 x 14 = 218.4 us and 15/16 x 8 MiB / 40 GB/s = 196.6 us: 415.0 us
//   ring LL: 6.6 + 15 x 5.0 = 81.6 us and 15/16 x 8 MiB / min(20.4, 20) GB/s = 393.2 us: 474.8 us
//   PAT: 8 + log2 16 x 14 / 3.5 + 16 x 2.8 = 68.8 us and the whole 8 MiB at 0.85 x 40 GB/s
//        (v2.23.4-1) = 246.7 us: 315.5 us; at 0.75 x 40 (v2.24.3-1 on) 279.6 us: 348.4 us
// NCCL 2.22 (no PAT) takes the ring's LL128, 2.23.4 and the newest (0) PAT; a reduce-scatter
// alike; two ranks a node never take PAT, whatever the version.
TEST(NcclModel, PatOnlyFromNccl223) {
  const mp_gpu g = H100();
  const double b = 8.0 * 1048576;
  const mp_sim_link one = Link(16, 1, 40, 50);
  const double ll128 = 141.5e-6 + 15.0 / 16 * b / 36.8e9;
  EXPECT_NEAR(ll128, 355.2e-6, 0.1e-6);
  for (mp_coll c : {MP_COLL_ALL_GATHER, MP_COLL_REDUCE_SCATTER}) {
    EXPECT_NEAR(mp_sim_nccl_collective_s(c, b, 16, &one, 40, &g, 22200, 0), ll128, 1e-10) << c;
    EXPECT_NEAR(mp_sim_nccl_collective_s(c, b, 16, &one, 40, &g, 22005, 0), ll128, 1e-10) << c;
    EXPECT_NEAR(mp_sim_nccl_collective_s(c, b, 16, &one, 40, &g, 22304, 0), 68.8e-6 + b / 34e9, 1e-10) << c;
    EXPECT_NEAR(mp_sim_nccl_collective_s(c, b, 16, &one, 40, &g, 22400, 0), 68.8e-6 + b / 30e9, 1e-10) << c;
    EXPECT_NEAR(mp_sim_nccl_collective_s(c, b, 16, &one, 40, &g, 0, 0), 68.8e-6 + b / 30e9, 1e-10) << c;
  }
  EXPECT_NEAR(68.8e-6 + b / 34e9, 315.5e-6, 0.1e-6);
  EXPECT_NEAR(68.8e-6 + b / 30e9, 348.4e-6, 0.1e-6);
  const mp_sim_link two = Link(32, 2, 40, 50);
  EXPECT_EQ(mp_sim_nccl_collective_s(MP_COLL_ALL_GATHER, b, 32, &two, 40, &g, 22200, 0),
            mp_sim_nccl_collective_s(MP_COLL_ALL_GATHER, b, 32, &two, 40, &g, 0, 0));
}

// NCCL's src/enqueue.cc (v2.23.4-1 to v2.30.7-1) skips PAT for a reduce-scatter whose op is
// ncclAvg (PreMulSum on floats) or a PreMulSum: the 8 MiB reduce-scatter of one rank a node
// above takes PAT summed (315.5 us at 2.23.4, 348.4 us from 2.24.3) and the ring's LL128
// averaged (355.2 us); before 2.23 both the ring's LL128. An all-gather has no op: PAT alike.
TEST(NcclModel, PatNotForAveragingReduceScatter) {
  const mp_gpu g = H100();
  const double b = 8.0 * 1048576;
  const mp_sim_link one = Link(16, 1, 40, 50);
  const double ll128 = 141.5e-6 + 15.0 / 16 * b / 36.8e9;
  const mp_coll rs = MP_COLL_REDUCE_SCATTER, ag = MP_COLL_ALL_GATHER;
  EXPECT_NEAR(mp_sim_nccl_collective_s(rs, b, 16, &one, 40, &g, 22304, 0), 315.5e-6, 0.1e-6);
  EXPECT_NEAR(mp_sim_nccl_collective_s(rs, b, 16, &one, 40, &g, 22304, 1), ll128, 1e-10);
  EXPECT_NEAR(mp_sim_nccl_collective_s(rs, b, 16, &one, 40, &g, 22703, 0), 348.4e-6, 0.1e-6);
  EXPECT_NEAR(mp_sim_nccl_collective_s(rs, b, 16, &one, 40, &g, 22703, 1), ll128, 1e-10);
  EXPECT_NEAR(mp_sim_nccl_collective_s(rs, b, 16, &one, 40, &g, 0, 1), ll128, 1e-10);
  EXPECT_EQ(mp_sim_nccl_collective_s(rs, b, 16, &one, 40, &g, 22200, 1),
            mp_sim_nccl_collective_s(rs, b, 16, &one, 40, &g, 22200, 0));
  EXPECT_NEAR(mp_sim_nccl_collective_s(rs, b, 16, &one, 40, &g, 22200, 1), ll128, 1e-10);
  EXPECT_NEAR(mp_sim_nccl_collective_s(ag, b, 16, &one, 40, &g, 0, 1), 348.4e-6, 0.1e-6);
}

// NCCL versions as X.Y or X.Y.Z, into major x 10000 + minor x 100 + patch.
TEST(NcclModel, VersionParse) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  int v = -1;
  ASSERT_EQ(mp_sim_nccl_version_parse(&ctx, "2.23.4", &v), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(v, 22304);
  ASSERT_EQ(mp_sim_nccl_version_parse(&ctx, "2.21", &v), MP_OK);
  EXPECT_EQ(v, 22100);
  ASSERT_EQ(mp_sim_nccl_version_parse(&ctx, "2.9.9", &v), MP_OK);
  EXPECT_EQ(v, 20909);
  for (const char *bad : {"", "2", "2.", "2.21.", ".21", "2.21.5-1", "v2.21", "2.100", "0.21", "2.21.5.1", "2..1"}) {
    v = -1;
    EXPECT_EQ(mp_sim_nccl_version_parse(&ctx, bad, &v), MP_ERR_USAGE) << bad;
    EXPECT_EQ(v, -1) << bad;
    EXPECT_NE(strstr(mp_errmsg(&ctx), "NCCL version"), nullptr) << bad;
  }
}

// The pair of a 128-rank group's ends (its first and last pipeline stages) spans two nodes,
// one rank each: a 4-byte all-reduce takes the ring's LL, 6.6 + 2 steps x 5.0 (the tree's
// network LL latency, one rank a node) = 16.6 us at min(llMaxBw 39 (two nodes), 160) GB/s,
// against the tree's LL 6.8 + 2 x log2 2 x 5.0 = 16.8 us.
TEST(NcclModel, PairOfAGroupAcrossNodes) {
  const mp_gpu g = H100();
  const mp_sim_link l = Link(128, 8, 320, 50);
  EXPECT_NEAR(mp_sim_nccl_collective_s(MP_COLL_ALL_REDUCE, 4, 2, &l, 320, &g, 0, 0), 16.6e-6 + 4 / 39e9, 1e-12);
}

// The layout: dp_shard=64 x cp=2 on 128 GPUs of 8 a node (cp the inner dimension, so a
// data-parallel group takes every other rank): 64 members, 4 a node on 16 nodes, on
// min(NVLink 100, 4 x the NIC's 10) = 40 GB/s. Its reduce-scatter's Simple latency is
// 8.4 + (63 - 15) x 3.4 + 15 x 14 = 381.6 us; of 8 GiB, Simple beats LL128 (8 % of 211 ms
// against 216 us of latency).
TEST(NcclModel, DataParallelGroupAsTheMeshLaysItOut) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  const mp_cluster c = Cluster(128, 8);
  mp_mesh m;
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_shard=64,cp=2", 128, &m), MP_OK) << mp_errmsg(&ctx);
  mp_sim_link l;
  ASSERT_EQ(mp_sim_group_link(&ctx, &c, &m, MP_GROUP_DP_SHARD, 0, &l), MP_OK);
  ASSERT_EQ(l.n, 64);
  ASSERT_EQ(l.per_node, 4);
  ASSERT_EQ(l.nodes, 16);
  EXPECT_DOUBLE_EQ(l.GBps, 40.0);
  const double big = 8 * kGiB;
  EXPECT_NEAR(Nccl(MP_COLL_REDUCE_SCATTER, big, l, c.gpu), 381.6e-6 + 63.0 / 64 * big / 40e9, 1e-9);
}

// Sends and all-to-alls keep the alpha-beta figure on the link's own latency.
TEST(NcclModel, PointToPointKeepsTheLinkLatency) {
  const mp_sim_link l = Link(128, 8, 320, 50);
  EXPECT_EQ(Nccl(MP_COLL_SEND, 1e6, l),
            mp_sim_collective_s(MP_COLL_SEND, 1e6, 2, 320, 10e-6));
}
