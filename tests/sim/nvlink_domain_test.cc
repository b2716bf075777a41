// NVLink domains across nodes (sim/cluster.h mp_cluster_nvlink_domain, sim/network.c): a
// GB200 NVL72 rack joins 18 compute trays of 4 GPUs in one NVLink 5 domain at 900 GB/s per
// direction a GPU (NVIDIA GB200 NVL72 datasheet), so a group inside one rack runs on NVLink
// whatever trays it spans and counts as one node to NCCL (multi-node NVLink, NCCL
// v2.27.7-1 src/mnnvl.cc ncclMnnvlCheck, src/init.cc nNodes); only a group spanning racks
// reaches the 400 Gbit/s (50 GB/s) NIC of each GPU. Figures derived by hand below.
#include <gtest/gtest.h>

#include <cstring>

#include "sim/sim.h"

namespace {

const double kGiB = 1073741824.0;

// n GB200 GPUs in trays of 4 (mp_cluster_make: the profile's NVLink 900 GB/s, 400 Gbit/s
// NICs, 3 us and 10 us a step), the NVLink domain the profile's unless told otherwise.
mp_cluster Gb200(int n, int domain = -1) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster c;
  memset(&c, 0, sizeof c);
  EXPECT_EQ(mp_cluster_make(&ctx, "gb200", n, 4, &c), MP_OK) << mp_errmsg(&ctx);
  if (domain >= 0) c.nvlink_domain = domain;
  return c;
}

int Domain(int n, int domain = -1) {
  const mp_cluster c = Gb200(n, domain);
  return mp_cluster_nvlink_domain(&c);
}

mp_sim_link GroupLink(const mp_cluster &c, const char *mesh, mp_group g) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  mp_sim_link l;
  memset(&l, 0, sizeof l);
  EXPECT_EQ(mp_mesh_parse(&ctx, mesh, mp_cluster_n_gpus(&c), &m), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_sim_group_link(&ctx, &c, &m, g, 0, &l), MP_OK) << mp_errmsg(&ctx);
  return l;
}

// l's members, NVLink domains, members a domain, ring bandwidth (GB/s) and step latency.
void ExpectLink(const mp_sim_link &l, int n, int nodes, int per_node, double GBps, double lat_s) {
  EXPECT_EQ(l.n, n);
  EXPECT_EQ(l.nodes, nodes);
  EXPECT_EQ(l.per_node, per_node);
  EXPECT_DOUBLE_EQ(l.GBps, GBps);
  EXPECT_DOUBLE_EQ(l.lat_s, lat_s);
}

// The gb200 profile is sold as NVL72: its clusters take a 72-GPU domain; the HGX B200's
// profile states none, so its domain is its 8-GPU node.
TEST(NvlinkDomain, ProfileDefaults) {
  const mp_cluster c = Gb200(144);
  EXPECT_EQ(c.gpus_per_node, 4);
  EXPECT_EQ(c.nvlink_domain, 72);
  EXPECT_EQ(mp_cluster_nvlink_domain(&c), 72);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster b;
  ASSERT_EQ(mp_cluster_make(&ctx, "b200", 64, 8, &b), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(b.nvlink_domain, 0);
  EXPECT_EQ(mp_cluster_nvlink_domain(&b), 8);
}

// A cluster file states its domain (NVL36x2: 36) or takes its GPU profile's (gb200: 72); a
// negative one is refused naming the field.
TEST(NvlinkDomain, ClusterFileField) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster c;
  const char *nvl36 =
      "{\"name\": \"t\", \"gpu\": \"gb200\", \"gpus_per_node\": 4, \"n_nodes\": 18, "
      "\"intra_node_GBps_per_gpu\": 900, \"inter_node_Gbitps_per_gpu\": 400, \"nvlink_domain\": 36}";
  ASSERT_EQ(mp_cluster_from_text(&ctx, nvl36, "t.json", &c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(c.nvlink_domain, 36);
  EXPECT_EQ(mp_cluster_nvlink_domain(&c), 36);
  const char *plain =
      "{\"name\": \"t\", \"gpu\": \"gb200\", \"gpus_per_node\": 4, \"n_nodes\": 18, "
      "\"intra_node_GBps_per_gpu\": 900, \"inter_node_Gbitps_per_gpu\": 400}";
  ASSERT_EQ(mp_cluster_from_text(&ctx, plain, "t.json", &c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(c.nvlink_domain, 72);
  const char *neg =
      "{\"name\": \"t\", \"gpu\": \"gb200\", \"gpus_per_node\": 4, \"n_nodes\": 18, "
      "\"intra_node_GBps_per_gpu\": 900, \"inter_node_Gbitps_per_gpu\": 400, \"nvlink_domain\": -4}";
  EXPECT_EQ(mp_cluster_from_text(&ctx, neg, "t.json", &c), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "nvlink_domain"), nullptr) << mp_errmsg(&ctx);
}

// A job's domains hold whole trays and the same share of it: 256 GPUs are 64 trays, and
// 18 trays a rack do not divide 64; 16 do (64 GPUs a rack). 36 GPUs (9 trays) fit in one
// rack, all of them one domain; a domain of 0 or at most a tray is the tray.
TEST(NvlinkDomain, JobDomainDividesTheTrays) {
  EXPECT_EQ(Domain(256), 64);
  EXPECT_EQ(Domain(36), 36);
  EXPECT_EQ(Domain(288, 36), 36);  // NVL36x2: 9 trays of 72
  EXPECT_EQ(Domain(144, 0), 4);
  EXPECT_EQ(Domain(144, 2), 4);
}

// 72 ranks of 18 trays in one rack (dp_shard=72 inside dp_replicate=2 on 144 GPUs: rank 0's
// group is ranks 0..71): one node at NVLink's 900 GB/s and 3 us. NCCL's ring all-gather of
// 8 GiB on it takes Simple: baseLat 8.4 us + 71 NVLink steps of 3.4 us = 249.8 us, plus
// 71/72 of the bytes at 900 GB/s (src/graph/tuning.cc, v2.27.7-1). With the domain the tray
// (4 GPUs), the same group spans 18 trays, 4 a tray, on min(900, 4 NICs x 50) = 200 GB/s
// at the network's 10 us.
TEST(NvlinkDomain, GroupInsideOneRackRunsOnNvlink) {
  const mp_cluster c = Gb200(144);
  const mp_sim_link l = GroupLink(c, "dp_replicate=2,dp_shard=72", MP_GROUP_DP_SHARD);
  ExpectLink(l, 72, 1, 72, 900.0, 3e-6);
  const double big = 8 * kGiB;
  EXPECT_NEAR(mp_sim_nccl_collective_s(MP_COLL_ALL_GATHER, big, 72, &l, l.GBps, &c.gpu, 0, 0),
              249.8e-6 + 71.0 / 72 * big / 900e9, 1e-9);
  const mp_sim_link t = GroupLink(Gb200(144, 0), "dp_replicate=2,dp_shard=72", MP_GROUP_DP_SHARD);
  ExpectLink(t, 72, 18, 4, 200.0, 10e-6);
}

// 144 ranks over two racks (dp_shard=144): two nodes of 72 to NCCL, the ring bound
// min(900, 72 NICs x 50) = 900 GB/s at the network's latency; its Simple ring crosses the
// network once in an all-gather's 143 steps: 8.4 + 142 x 3.4 + 1 x 14 (the network's
// Simple step) = 505.2 us.
TEST(NvlinkDomain, GroupAcrossTwoRacksCrossesTheNics) {
  const mp_cluster c = Gb200(144);
  const mp_sim_link l = GroupLink(c, "dp_shard=144", MP_GROUP_DP_SHARD);
  ExpectLink(l, 144, 2, 72, 900.0, 10e-6);
  const double big = 8 * kGiB;
  EXPECT_NEAR(mp_sim_nccl_collective_s(MP_COLL_ALL_GATHER, big, 144, &l, l.GBps, &c.gpu, 0, 0),
              505.2e-6 + 143.0 / 144 * big / 900e9, 1e-9);
}

// Megatron-Bridge's Llama 3.1 405B GB200 layout under Megatron FSDP with two optimizer
// instances (dp_replicate=2 over dp_shard=32, tp=2; 128 GPUs, domains of 64: 16 trays of the
// 32): parallel_state.py cuts the data-parallel ranks into 2 consecutive intra-instance groups
// of 32 (ranks 0..63 with tp, one rack: NVLink's 900 GB/s at 3 us), the inter-instance group
// {r, r + 64} crossing the racks, one rank each: the NIC's 50 GB/s at 10 us. A layer's fp32
// main-gradient shard, 4 x 1,593,868,288 / 32 = 199,233,536 bytes, all-reduced across the two
// instances: NCCL's Simple ring (src/graph/tuning.cc, v2.27.7-1) moves 2 x 1/2 of the bytes at
// 50 GB/s behind baseLat 8.4 us + 2 network steps of 14 us (one rank a node: the tree's
// network latency), x 1.4 past the inter-node plateau: 50.96 us + 3.98467 ms; the tree's
// bandwidth (at most 0.92 x 50) and LL/LL128's are lower. The reduce-scatter of the layer's
// 6,375,473,152 fp32 bytes inside the instance: Simple's 8.4 + 31 x 3.4 us + 31/32 of the
// bytes at 900 GB/s. Without the instances (dp_shard=64) the group spans both racks, 32 a
// rack: min(900, 32 x 50) = 900 GB/s at the network's latency.
TEST(NvlinkDomain, MegatronFsdpInstancesOneRackEach) {
  const mp_cluster c = Gb200(128, 72);
  ASSERT_EQ(mp_cluster_nvlink_domain(&c), 64);
  const mp_sim_link in = GroupLink(c, "dp_replicate=2,dp_shard=32,tp=2", MP_GROUP_DP_SHARD);
  ExpectLink(in, 32, 1, 32, 900.0, 3e-6);
  const mp_sim_link across = GroupLink(c, "dp_replicate=2,dp_shard=32,tp=2", MP_GROUP_DP_REPLICATE);
  ExpectLink(across, 2, 2, 1, 50.0, 10e-6);
  const double shard = 199233536.0, layer = 6375473152.0;
  EXPECT_NEAR(mp_sim_nccl_collective_s(MP_COLL_ALL_REDUCE, shard, 2, &across, across.GBps, &c.gpu, 0, 0),
              1.4 * (8.4 + 2 * 14.0) * 1e-6 + shard / 50e9, 1e-9);
  EXPECT_NEAR(mp_sim_nccl_collective_s(MP_COLL_REDUCE_SCATTER, layer, 32, &in, in.GBps, &c.gpu, 0, 0),
              (8.4 + 31 * 3.4) * 1e-6 + 31.0 / 32 * layer / 900e9, 1e-9);
  ExpectLink(GroupLink(c, "dp_shard=64,tp=2", MP_GROUP_DP_SHARD), 64, 2, 32, 900.0, 10e-6);
}

// Megatron-LM's distributed optimizer in two instances without FSDP (the mesh's dopt) on 256
// H100s in nodes of 8 (400 Gbit/s NICs: 50 GB/s at 10 us a step), Llama 3.1 70B's pp=4,
// dp_replicate=8, tp=8: tp fills a node, so the data-parallel ranks of rank 0 are 0, 8, ..,
// 56, one a node. parallel_state.py (core_v0.14.0) cuts them into 2 consecutive instances:
// {0, 8, 16, 24} over 4 nodes and the inter-instance group {0, 32} over 2; without the
// instances the distributed optimizer's group is all 8. A layer's fp32 gradient shard (its
// tp-local 106,971,136 parameters: 855,638,016 split weights / 8 and 16,384 norm weights
// whole; 4 x 106,971,136 / 4 bytes) all-reduced across the 2 instances runs NCCL's Simple
// ring as MegatronFsdpInstancesOneRackEach derives: 1.4 x (8.4 + 2 x 14) us + bytes / 50 GB/s.
TEST(NvlinkDomain, DistributedOptimizerInstancesConsecutiveNodes) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cluster c;
  memset(&c, 0, sizeof c);
  ASSERT_EQ(mp_cluster_make(&ctx, "h100-sxm", 256, 8, &c), MP_OK) << mp_errmsg(&ctx);
  const char *mesh = "pp=4,dp_replicate=8,tp=8,dopt=2";
  ExpectLink(GroupLink(c, mesh, MP_GROUP_DOPT), 4, 4, 1, 50.0, 10e-6);
  const mp_sim_link across = GroupLink(c, mesh, MP_GROUP_DOPT_INTER);
  ExpectLink(across, 2, 2, 1, 50.0, 10e-6);
  ExpectLink(GroupLink(c, "pp=4,dp_replicate=8,tp=8", MP_GROUP_DP_REPLICATE), 8, 8, 1, 50.0, 10e-6);
  const double shard = 106971136.0;
  EXPECT_NEAR(mp_sim_nccl_collective_s(MP_COLL_ALL_REDUCE, shard, 2, &across, across.GBps, &c.gpu, 0, 0),
              1.4 * (8.4 + 2 * 14.0) * 1e-6 + shard / 50e9, 1e-9);
}

// Expert parallelism's all-to-all of b = 4 GB a rank. EP 72 in one rack: NVLink alone,
// 71/72 x b / 900 GB/s + 71 steps of 3 us. EP 144 over two racks: a rank sends 72/144 of b
// to the other rack through its NIC (0.5 x 4e9 / 50e9 = 40 ms) beside 71/144 over NVLink
// (2.19 ms): the NIC bounds it, plus 143 steps of 10 us.
TEST(NvlinkDomain, ExpertAllToAllInsideTheRackOnNvlink) {
  const mp_cluster c = Gb200(144);
  const double b = 4e9;
  mp_model m;
  memset(&m, 0, sizeof m);
  double nic = 0, nvl = 0;
  const mp_sim_link in = GroupLink(c, "dp_shard=144,ep=72", MP_GROUP_EP);
  ASSERT_EQ(in.nodes, 1);
  mp_sim_ep_shares(&in, &m, MP_MOE_DISPATCH_ALLTOALL, &nic, &nvl);
  EXPECT_NEAR(mp_sim_alltoall_s(b, &in, 1.0, nic, nvl), 71.0 / 72 * b / 900e9 + 71 * 3e-6, 1e-12);
  const mp_sim_link across = GroupLink(c, "dp_shard=144,ep=144", MP_GROUP_EP);
  ASSERT_EQ(across.nodes, 2);
  mp_sim_ep_shares(&across, &m, MP_MOE_DISPATCH_ALLTOALL, &nic, &nvl);
  EXPECT_DOUBLE_EQ(nic, 0.5);
  EXPECT_DOUBLE_EQ(nvl, 71.0 / 144);
  EXPECT_NEAR(mp_sim_alltoall_s(b, &across, 1.0, nic, nvl), 0.5 * b / 50e9 + 143 * 10e-6, 1e-12);
}

}  // namespace
