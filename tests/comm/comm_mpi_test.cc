// Tests of exec/comm's "mpi" backend, run under mpirun (tests/comm/run_mpi.sh): every
// collective on every group kind of several meshes for the world size it was started with,
// against values computed by hand from the ranks that mp_mesh_group_ranks lists.
//
// Element values encode who sent them (world rank, destination, position), so a result
// shows not only that data arrived but that it came from the right rank in the right order.
// Values are small integers (exact in fp32 and bf16), so sums are exact whatever order MPI
// adds them in; one test uses inexact values to check that every rank of a group gets a
// bitwise identical all-reduce.
//
// The staged backend ("mpi-staged": device buffers through host staging) runs the same
// collectives with the CPU backend's memcpy standing in for a device (fake_device.h) and
// must give bitwise what "mpi" gives on host buffers. The overlap API and the backend
// selection are checked here too, since both depend on how the process was launched.
//
// Cross-rank failures: a listener all-reduces each test's verdict over the world, so a
// failure on any rank fails the test on every rank and every rank exits non-zero (mpirun
// then exits non-zero). Collective calls are never skipped by an early ASSERT return on
// one rank only: checks on data use EXPECT, ASSERT is kept for statuses that every rank
// shares.
#include <gtest/gtest.h>
#include <mpi.h>

#include <stdlib.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "exec/comm/comm.h"
#include "exec/comm/mpi_check.h"
#include "exec/mesh.h"
#include "tests/comm/fake_device.h"
#include "tests/mpi_gtest.h"

namespace {

int g_rank = 0, g_world = 1;

const mp_group kAllGroups[] = {MP_GROUP_PP,    MP_GROUP_DP_REPLICATE, MP_GROUP_DP_SHARD,
                               MP_GROUP_CP,    MP_GROUP_TP,           MP_GROUP_EP,
                               MP_GROUP_EFSDP, MP_GROUP_DP,           MP_GROUP_FSDP,
                               MP_GROUP_WORLD};

// Meshes exercised for each world size: every dim and ep appear with size > 1 somewhere.
std::vector<std::string> MeshesFor(int world) {
  if (world == 1) return {"tp=1"};
  if (world == 4)
    return {"dp_shard=4",      "tp=4",          "dp_shard=2,tp=2", "dp_replicate=2,dp_shard=2",
            "pp=2,tp=2",       "pp=4",          "dp_shard=4,ep=2", "dp_shard=4,ep=4",
            "cp=2,dp_shard=2", "pp=2,dp_shard=2,ep=2"};
  if (world == 8)
    return {"dp_shard=2,tp=4",
            "dp_shard=4,ep=2,tp=2",
            "pp=2,dp_replicate=2,dp_shard=2",
            "dp_shard=8,ep=4",
            "dp_replicate=2,dp_shard=4,ep=2",
            "pp=2,dp_shard=2,tp=2",
            "cp=2,dp_shard=2,tp=2",
            "pp=8"};
  return {"dp_shard=" + std::to_string(world), "tp=" + std::to_string(world)};
}

mp_mesh Parse(const std::string &spec) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  mp_status s = mp_mesh_parse(&ctx, spec.c_str(), 0, &m);
  EXPECT_EQ(s, MP_OK) << spec << ": " << mp_errmsg(&ctx);
  return m;
}

std::vector<int> GroupRanks(const mp_mesh &m, mp_group g, int rank) {
  std::vector<int> r(mp_mesh_group_size(&m, g));
  mp_mesh_group_ranks(&m, g, rank, r.data());
  return r;
}

// Runs body once per mesh for this world size with a fresh "mpi" comm.
void ForEachMesh(const std::function<void(mp_comm *, const mp_mesh &)> &body) {
  for (const std::string &spec : MeshesFor(g_world)) {
    SCOPED_TRACE("mesh " + spec);
    mp_mesh m = Parse(spec);
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_comm *c = nullptr;
    ASSERT_EQ(mp_comm_create_mpi(&ctx, &m, &c), MP_OK) << mp_errmsg(&ctx);
    body(c, m);
    mp_comm_destroy(c);
  }
}

std::string Where(const mp_mesh &m, mp_group g) {
  char f[128];
  mp_mesh_format(&m, f, sizeof f);
  return std::string(f) + " group " + mp_group_name(g) + " rank " + std::to_string(g_rank);
}

float Val(int rank, int i) { return (float)(rank * 1000 + i); }

// ---- creation ----

TEST(CommMpi, WorldAndGroupsMatchTheMesh) {
  ForEachMesh([](mp_comm *c, const mp_mesh &m) {
    EXPECT_STREQ(mp_comm_backend_name(c), "mpi");
    EXPECT_EQ(mp_comm_world_rank(c), g_rank);
    EXPECT_EQ(mp_comm_world_size(c), g_world);
    for (mp_group g : kAllGroups) {
      EXPECT_EQ(mp_comm_group_size(c, g), mp_mesh_group_size(&m, g)) << Where(m, g);
      EXPECT_EQ(mp_comm_group_index(c, g), mp_mesh_group_index(&m, g, g_rank)) << Where(m, g);
    }
    // One node: every rank is local, numbered as in the world.
    EXPECT_EQ(mp_comm_local_size(c), g_world);
    EXPECT_EQ(mp_comm_local_rank(c), g_rank);
    if (getenv("OMPI_COMM_WORLD_LOCAL_RANK")) {
      EXPECT_EQ(mp_comm_local_rank_from_env(), mp_comm_local_rank(c));
    }
  });
}

TEST(CommMpi, MeshLargerThanWorldFailsOnEveryRank) {
  mp_mesh m;
  mp_mesh_init(&m);
  m.size[MP_DIM_DP_SHARD] = 2;
  m.size[MP_DIM_TP] = g_world;  // 2 * world ranks
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_comm *c = nullptr;
  EXPECT_EQ(mp_comm_create_mpi(&ctx, &m, &c), MP_ERR_INVALID);
  EXPECT_EQ(c, nullptr);
  char f[64];
  mp_mesh_format(&m, f, sizeof f);
  std::string want = std::string("mesh ") + f + " has " + std::to_string(2 * g_world) + " ranks";
  std::string msg = mp_errmsg(&ctx);
  EXPECT_NE(msg.find(want), std::string::npos) << msg;
  if (getenv("OMPI_COMM_WORLD_SIZE")) {
    EXPECT_NE(msg.find("but mpirun started " + std::to_string(g_world) + ";"), std::string::npos)
        << msg;
  } else {
    EXPECT_NE(msg.find("without mpirun"), std::string::npos) << msg;
  }
  // Every rank saw the error: count them.
  int failed = mp_errmsg(&ctx)[0] != '\0', n = 0;
  MPI_Allreduce(&failed, &n, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
  EXPECT_EQ(n, g_world);
  // The world is still usable afterwards (nothing was left half split).
  ForEachMesh([](mp_comm *, const mp_mesh &) {});
}

TEST(CommMpi, RanksWithDifferentMeshesAllFail) {
  if (g_world < 2) GTEST_SKIP() << "needs two ranks";
  mp_mesh m;
  mp_mesh_init(&m);
  m.size[g_rank == 0 ? MP_DIM_TP : MP_DIM_DP_SHARD] = g_world;  // same world, other layout
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_comm *c = nullptr;
  EXPECT_EQ(mp_comm_create_mpi(&ctx, &m, &c), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("different meshes"), std::string::npos)
      << mp_errmsg(&ctx);
}

TEST(CommMpi, InvalidMeshFailsOnEveryRank) {
  mp_mesh m;
  mp_mesh_init(&m);
  m.size[MP_DIM_DP_SHARD] = g_world;
  m.ep = 3 * g_world;  // neither divides dp_shard nor fits the world
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_comm *c = nullptr;
  EXPECT_EQ(mp_comm_create_mpi(&ctx, &m, &c), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("expert parallelism takes ep consecutive ranks"), std::string::npos)
      << mp_errmsg(&ctx);
}

// MP_MPI_CHECK turns an MPI error into MP_ERR_MPI with the call, file:line and MPI's string
// (MPI_ERRORS_RETURN is set, so the process survives the error).
mp_status BadMpiCall(mp_ctx *ctx) {
  int n = 0;
  MP_MPI_CHECK(ctx, MPI_Type_size(MPI_DATATYPE_NULL, &n));
  return MP_OK;
}

TEST(CommMpi, MpiErrorsComeBackAsStatus) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(BadMpiCall(&ctx), MP_ERR_MPI);
  std::string msg = mp_errmsg(&ctx);
  EXPECT_NE(msg.find("comm_mpi_test.cc:"), std::string::npos) << msg;
  EXPECT_NE(msg.find("MPI_Type_size(MPI_DATATYPE_NULL, &n) failed: MPI_ERR_TYPE"),
            std::string::npos)
      << msg;
}

TEST(CommMpi, ArgumentErrorsAreRejectedBeforeCommunicating) {
  ForEachMesh([](mp_comm *c, const mp_mesh &m) {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    float x = 0;
    int n = mp_mesh_group_size(&m, MP_GROUP_TP);
    EXPECT_EQ(mp_comm_broadcast(&ctx, c, MP_GROUP_TP, &x, 1, MP_COMM_DTYPE_FP32, n),
              MP_ERR_INVALID);
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find("root"), std::string::npos);
    EXPECT_EQ(mp_comm_all_reduce(&ctx, c, (mp_group)MP_GROUP_COUNT, &x, &x, 1,
                                 MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM),
              MP_ERR_INVALID);
    EXPECT_EQ(mp_comm_all_reduce(&ctx, c, MP_GROUP_TP, nullptr, &x, 1, MP_COMM_DTYPE_FP32,
                                 MP_COMM_OP_SUM),
              MP_ERR_INVALID);
    EXPECT_EQ(mp_comm_send(&ctx, c, &x, 1, MP_COMM_DTYPE_FP32, g_rank), MP_ERR_INVALID);
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find("itself"), std::string::npos);
    EXPECT_EQ(mp_comm_recv(&ctx, c, &x, 1, MP_COMM_DTYPE_FP32, g_world), MP_ERR_INVALID);
    std::vector<int64_t> cnt(mp_mesh_group_size(&m, MP_GROUP_EP), 0);
    cnt[0] = -1;
    EXPECT_EQ(mp_comm_all_to_all_v(&ctx, c, MP_GROUP_EP, &x, cnt.data(), cnt.data(), &x,
                                   cnt.data(), cnt.data(), MP_COMM_DTYPE_FP32),
              MP_ERR_INVALID);
  });
}

// ---- collectives ----

TEST(CommMpi, AllReduceSumAndMaxOnEveryGroup) {
  const int count = 37;
  ForEachMesh([&](mp_comm *c, const mp_mesh &m) {
    for (mp_group g : kAllGroups) {
      std::vector<int> ranks = GroupRanks(m, g, g_rank);
      mp_ctx ctx;
      mp_ctx_init(&ctx);
      // fp32 sum, out of place
      std::vector<float> s(count), r(count, -1);
      for (int i = 0; i < count; i++) s[i] = Val(g_rank, i);
      ASSERT_EQ(mp_comm_all_reduce(&ctx, c, g, s.data(), r.data(), count, MP_COMM_DTYPE_FP32,
                                   MP_COMM_OP_SUM),
                MP_OK)
          << mp_errmsg(&ctx);
      for (int i = 0; i < count; i++) {
        float want = 0;
        for (int q : ranks) want += Val(q, i);
        EXPECT_EQ(r[i], want) << Where(m, g) << " i=" << i;
      }
      // fp32 max, in place; the maximum is not always held by the highest rank
      auto w = [](int q, int i) { return (float)(((q * 7 + i * 3) % 11) - 5); };
      for (int i = 0; i < count; i++) s[i] = w(g_rank, i);
      ASSERT_EQ(mp_comm_all_reduce(&ctx, c, g, s.data(), s.data(), count, MP_COMM_DTYPE_FP32,
                                   MP_COMM_OP_MAX),
                MP_OK)
          << mp_errmsg(&ctx);
      for (int i = 0; i < count; i++) {
        float want = -1e30f;
        for (int q : ranks) want = std::fmax(want, w(q, i));
        EXPECT_EQ(s[i], want) << Where(m, g) << " i=" << i;
      }
      // int64 sum and max: values beyond 32 bits
      std::vector<int64_t> a(count), b(count), mx(count);
      for (int i = 0; i < count; i++) a[i] = ((int64_t)g_rank << 40) + i;
      ASSERT_EQ(mp_comm_all_reduce(&ctx, c, g, a.data(), b.data(), count, MP_COMM_DTYPE_INT64,
                                   MP_COMM_OP_SUM),
                MP_OK);
      ASSERT_EQ(mp_comm_all_reduce(&ctx, c, g, a.data(), mx.data(), count, MP_COMM_DTYPE_INT64,
                                   MP_COMM_OP_MAX),
                MP_OK);
      for (int i = 0; i < count; i++) {
        int64_t want = 0;
        for (int q : ranks) want += ((int64_t)q << 40) + i;
        EXPECT_EQ(b[i], want) << Where(m, g);
        EXPECT_EQ(mx[i], ((int64_t)ranks.back() << 40) + i) << Where(m, g);
      }
      // bf16 (raw 16-bit): small integers are exact; 1.0 = 0x3F80
      std::vector<uint16_t> h(count), hs(count), hm(count);
      auto bf = [](int v) {  // bf16 bits of a small non-negative integer
        float f = (float)v;
        uint32_t u;
        std::memcpy(&u, &f, 4);
        return (uint16_t)(u >> 16);
      };
      for (int i = 0; i < count; i++) h[i] = bf(g_rank + i % 4);
      ASSERT_EQ(mp_comm_all_reduce(&ctx, c, g, h.data(), hs.data(), count, MP_COMM_DTYPE_BF16,
                                   MP_COMM_OP_SUM),
                MP_OK);
      ASSERT_EQ(mp_comm_all_reduce(&ctx, c, g, h.data(), hm.data(), count, MP_COMM_DTYPE_BF16,
                                   MP_COMM_OP_MAX),
                MP_OK);
      for (int i = 0; i < count; i++) {
        int want = 0;
        for (int q : ranks) want += q + i % 4;
        EXPECT_EQ(hs[i], bf(want)) << Where(m, g) << " i=" << i;
        EXPECT_EQ(hm[i], bf(ranks.back() + i % 4)) << Where(m, g);
      }
    }
  });
}

// Inexact fp32 sums: every rank of a group must hold the same bits (replicas that differ
// in the last bit drift apart over training).
TEST(CommMpi, AllReduceIsBitwiseIdenticalAcrossTheGroup) {
  const int count = 1000;
  ForEachMesh([&](mp_comm *c, const mp_mesh &m) {
    for (mp_group g : kAllGroups) {
      mp_ctx ctx;
      mp_ctx_init(&ctx);
      std::vector<float> x(count);
      for (int i = 0; i < count; i++) x[i] = 1.0f / (float)(3 + g_rank * 7 + i) + 1e-3f * i;
      ASSERT_EQ(mp_comm_all_reduce(&ctx, c, g, x.data(), x.data(), count, MP_COMM_DTYPE_FP32,
                                   MP_COMM_OP_SUM),
                MP_OK);
      std::vector<float> all((size_t)count * g_world);
      MPI_Allgather(x.data(), count, MPI_FLOAT, all.data(), count, MPI_FLOAT, MPI_COMM_WORLD);
      for (int q : GroupRanks(m, g, g_rank))
        EXPECT_EQ(std::memcmp(&all[(size_t)q * count], x.data(), count * sizeof(float)), 0)
            << Where(m, g) << " differs from rank " << q;
      // and close to the sum in double
      for (int i = 0; i < count; i += 97) {
        double want = 0;
        for (int q : GroupRanks(m, g, g_rank)) want += 1.0f / (float)(3 + q * 7 + i) + 1e-3f * i;
        EXPECT_NEAR(x[i], want, 1e-6 * std::fabs(want) + 1e-7) << Where(m, g);
      }
    }
  });
}

TEST(CommMpi, AllGatherInGroupIndexOrder) {
  const int count = 5;
  ForEachMesh([&](mp_comm *c, const mp_mesh &m) {
    for (mp_group g : kAllGroups) {
      std::vector<int> ranks = GroupRanks(m, g, g_rank);
      int n = (int)ranks.size(), me = mp_mesh_group_index(&m, g, g_rank);
      mp_ctx ctx;
      mp_ctx_init(&ctx);
      std::vector<float> s(count), r((size_t)count * n, -1);
      for (int i = 0; i < count; i++) s[i] = Val(g_rank, i);
      ASSERT_EQ(mp_comm_all_gather(&ctx, c, g, s.data(), r.data(), count, MP_COMM_DTYPE_FP32),
                MP_OK)
          << mp_errmsg(&ctx);
      for (int k = 0; k < n; k++)
        for (int i = 0; i < count; i++)
          EXPECT_EQ(r[(size_t)k * count + i], Val(ranks[k], i)) << Where(m, g) << " chunk " << k;
      // in place: this rank's chunk already sits at its index
      std::vector<float> ip((size_t)count * n, -1);
      for (int i = 0; i < count; i++) ip[(size_t)me * count + i] = Val(g_rank, i);
      ASSERT_EQ(mp_comm_all_gather(&ctx, c, g, ip.data() + (size_t)me * count, ip.data(), count,
                                   MP_COMM_DTYPE_FP32),
                MP_OK);
      EXPECT_EQ(ip, r) << Where(m, g);
      // bf16 raw bits travel unchanged (gathers do no arithmetic)
      uint16_t hb = (uint16_t)(0x8001 + g_rank * 3);
      std::vector<uint16_t> hr(n);
      ASSERT_EQ(mp_comm_all_gather(&ctx, c, g, &hb, hr.data(), 1, MP_COMM_DTYPE_BF16), MP_OK);
      for (int k = 0; k < n; k++) EXPECT_EQ(hr[k], 0x8001 + ranks[k] * 3) << Where(m, g);
    }
  });
}

TEST(CommMpi, ReduceScatterGivesEachRankItsChunk) {
  const int chunk = 6;
  ForEachMesh([&](mp_comm *c, const mp_mesh &m) {
    for (mp_group g : kAllGroups) {
      std::vector<int> ranks = GroupRanks(m, g, g_rank);
      int n = (int)ranks.size(), me = mp_mesh_group_index(&m, g, g_rank);
      auto v = [](int q, int k, int i) { return (float)(q * 100 + k * 10 + i); };
      std::vector<float> s((size_t)chunk * n), r(chunk, -1);
      for (int k = 0; k < n; k++)
        for (int i = 0; i < chunk; i++) s[(size_t)k * chunk + i] = v(g_rank, k, i);
      mp_ctx ctx;
      mp_ctx_init(&ctx);
      ASSERT_EQ(mp_comm_reduce_scatter(&ctx, c, g, s.data(), r.data(), chunk, MP_COMM_DTYPE_FP32,
                                       MP_COMM_OP_SUM),
                MP_OK)
          << mp_errmsg(&ctx);
      for (int i = 0; i < chunk; i++) {
        float want = 0;
        for (int q : ranks) want += v(q, me, i);
        EXPECT_EQ(r[i], want) << Where(m, g) << " i=" << i;
      }
    }
  });
}

TEST(CommMpi, AllToAllVWithUnevenCountsAndDisplacements) {
  ForEachMesh([&](mp_comm *c, const mp_mesh &m) {
    for (mp_group g : kAllGroups) {
      std::vector<int> ranks = GroupRanks(m, g, g_rank);
      int n = (int)ranks.size(), me = mp_mesh_group_index(&m, g, g_rank);
      // Index i sends cnt(i, j) elements to index j: 0..3, zeros included.
      auto cnt = [](int i, int j) { return (int64_t)((i * 2 + j * 3 + 1) % 4); };
      mp_ctx ctx;
      mp_ctx_init(&ctx);

      // Metadata exchange as MoE dispatch does it: equal all-to-all of int64 counts.
      std::vector<int64_t> ones(n, 1), seq(n), mine(n), theirs(n, -1);
      for (int j = 0; j < n; j++) seq[j] = j, mine[j] = cnt(me, j);
      ASSERT_EQ(mp_comm_all_to_all_v(&ctx, c, g, mine.data(), ones.data(), seq.data(),
                                     theirs.data(), ones.data(), seq.data(), MP_COMM_DTYPE_INT64),
                MP_OK)
          << mp_errmsg(&ctx);
      for (int j = 0; j < n; j++) EXPECT_EQ(theirs[j], cnt(j, me)) << Where(m, g);

      // Payload: send segments with a one-element gap between them; receive segments in
      // reverse group order, so displacements (not packing) decide where data lands.
      std::vector<int64_t> sc(n), sd(n), rc(n), rd(n);
      int64_t off = 0;
      for (int j = 0; j < n; j++) sc[j] = cnt(me, j), sd[j] = off, off += sc[j] + 1;
      std::vector<float> s(off + 1, -2);
      for (int j = 0; j < n; j++)
        for (int64_t k = 0; k < sc[j]; k++) s[sd[j] + k] = (float)(g_rank * 10000 + j * 100 + k);
      int64_t roff = 0;
      for (int j = n - 1; j >= 0; j--) rc[j] = theirs[j], rd[j] = roff, roff += rc[j];
      std::vector<float> r(roff + 1, -1);
      ASSERT_EQ(mp_comm_all_to_all_v(&ctx, c, g, s.data(), sc.data(), sd.data(), r.data(),
                                     rc.data(), rd.data(), MP_COMM_DTYPE_FP32),
                MP_OK)
          << mp_errmsg(&ctx);
      for (int j = 0; j < n; j++)
        for (int64_t k = 0; k < rc[j]; k++)
          EXPECT_EQ(r[rd[j] + k], (float)(ranks[j] * 10000 + me * 100 + k))
              << Where(m, g) << " from index " << j << " k=" << k;
      EXPECT_EQ(r[roff], -1) << "wrote past the received data";
    }
  });
}

TEST(CommMpi, BroadcastFromEveryRoot) {
  const int count = 4;
  ForEachMesh([&](mp_comm *c, const mp_mesh &m) {
    for (mp_group g : kAllGroups) {
      std::vector<int> ranks = GroupRanks(m, g, g_rank);
      int me = mp_mesh_group_index(&m, g, g_rank);
      for (int root = 0; root < (int)ranks.size(); root++) {
        std::vector<float> b(count, -7);
        if (me == root)
          for (int i = 0; i < count; i++) b[i] = Val(g_rank, i);
        mp_ctx ctx;
        mp_ctx_init(&ctx);
        ASSERT_EQ(mp_comm_broadcast(&ctx, c, g, b.data(), count, MP_COMM_DTYPE_FP32, root),
                  MP_OK)
            << mp_errmsg(&ctx);
        for (int i = 0; i < count; i++)
          EXPECT_EQ(b[i], Val(ranks[root], i)) << Where(m, g) << " root " << root;
      }
    }
  });
}

// Pipeline: stage s receives from s-1 and sends to s+1 along its pp group (peers by world
// rank from mp_mesh_rank_of); each stage adds its own rank, so the last stage holds the
// sum of the chain. Then a sendrecv ring backwards (every stage sends and receives at once).
TEST(CommMpi, SendRecvAlongPipeline) {
  const int count = 3;
  ForEachMesh([&](mp_comm *c, const mp_mesh &m) {
    int co[MP_MESH_NDIMS];
    mp_mesh_coords(&m, g_rank, co);
    int pp = m.size[MP_DIM_PP], s = co[MP_DIM_PP];
    auto peer = [&](int stage) {
      int x[MP_MESH_NDIMS];
      std::memcpy(x, co, sizeof x);
      x[MP_DIM_PP] = (stage + pp) % pp;
      return mp_mesh_rank_of(&m, x);
    };
    std::vector<int> chain = GroupRanks(m, MP_GROUP_PP, g_rank);
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    std::vector<float> b(count, 0);
    if (s > 0) {
      ASSERT_EQ(mp_comm_recv(&ctx, c, b.data(), count, MP_COMM_DTYPE_FP32, peer(s - 1)), MP_OK)
          << mp_errmsg(&ctx);
    }
    for (int i = 0; i < count; i++) {
      float want = 0;
      for (int k = 0; k < s; k++) want += Val(chain[k], i);
      EXPECT_EQ(b[i], want) << "stage " << s << " i=" << i;
      b[i] += Val(g_rank, i);
    }
    if (s < pp - 1) {
      ASSERT_EQ(mp_comm_send(&ctx, c, b.data(), count, MP_COMM_DTYPE_FP32, peer(s + 1)), MP_OK)
          << mp_errmsg(&ctx);
    }

    // Backward ring (gradients flow from stage s+1 to s); with pp == 1 it is a self copy.
    std::vector<int64_t> out(count), in(count, -1);
    for (int i = 0; i < count; i++) out[i] = (int64_t)g_rank * 100 + i;
    ASSERT_EQ(mp_comm_sendrecv(&ctx, c, out.data(), count, peer(s - 1), in.data(), count,
                               peer(s + 1), MP_COMM_DTYPE_INT64),
              MP_OK)
        << mp_errmsg(&ctx);
    for (int i = 0; i < count; i++) EXPECT_EQ(in[i], (int64_t)peer(s + 1) * 100 + i);
  });
}

TEST(CommMpi, ShortMessageIsAnError) {
  if (g_world < 2) GTEST_SKIP() << "needs two ranks";
  mp_mesh m;
  mp_mesh_init(&m);
  m.size[MP_DIM_PP] = g_world;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_comm *c = nullptr;
  ASSERT_EQ(mp_comm_create_mpi(&ctx, &m, &c), MP_OK) << mp_errmsg(&ctx);
  float b[5] = {1, 2, 3, 4, 5};
  if (g_rank == 0) {
    EXPECT_EQ(mp_comm_send(&ctx, c, b, 3, MP_COMM_DTYPE_FP32, 1), MP_OK);
  } else if (g_rank == 1) {
    EXPECT_EQ(mp_comm_recv(&ctx, c, b, 5, MP_COMM_DTYPE_FP32, 0), MP_ERR_INVALID);
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find("expected 5 fp32 elements from rank 0 but "
                                                 "received 3"),
              std::string::npos)
        << mp_errmsg(&ctx);
  }
  mp_comm_destroy(c);
}

// The deadline (MESHPLAN_COMM_TIMEOUT_S, read when the comm is created): a receive that
// nobody sends and an all-reduce that one rank has not joined come back as MP_ERR_TIMEOUT
// naming the rank, the call, its size and the group or peer, instead of waiting forever;
// the comm then refuses every call. The late partners then make their calls, so every
// request MPI still holds completes before the comms are freed.
TEST(CommMpi, WaitsAreBoundedByTheDeadline) {
  if (g_world < 2) GTEST_SKIP() << "needs two ranks";
  setenv("MESHPLAN_COMM_TIMEOUT_S", "0.5", 1);
  mp_mesh m;
  mp_mesh_init(&m);
  m.size[MP_DIM_DP_SHARD] = g_world;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_comm *c = nullptr, *c2 = nullptr;
  ASSERT_EQ(mp_comm_create_mpi(&ctx, &m, &c), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_comm_create_mpi(&ctx, &m, &c2), MP_OK) << mp_errmsg(&ctx);
  unsetenv("MESHPLAN_COMM_TIMEOUT_S");
  static float rbuf[5], ar[2];
  const float sbuf[5] = {1, 2, 3, 4, 5};
  if (g_rank == 1) {
    EXPECT_EQ(mp_comm_recv(&ctx, c, rbuf, 5, MP_COMM_DTYPE_FP32, 0), MP_ERR_TIMEOUT);
    EXPECT_EQ(std::string(mp_errmsg(&ctx)),
              "rank 1: recv of 5 fp32 elements from rank 0 did not complete within 0.5 s: the peer "
              "rank died, is stuck, or never made the matching call; every rank of a group must make "
              "the same collective calls in the same order (MESHPLAN_COMM_TIMEOUT_S sets the limit in "
              "seconds)");
    EXPECT_EQ(mp_comm_barrier(&ctx, c, MP_GROUP_WORLD), MP_ERR_TIMEOUT);
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find("rank 1: barrier refused: an earlier collective timed out"),
              std::string::npos)
        << mp_errmsg(&ctx);
  }
  // every rank but 0 waits for rank 0's all-reduce on c2 and gives up
  if (g_rank != 0) {
    EXPECT_EQ(mp_comm_all_reduce(&ctx, c2, MP_GROUP_DP_SHARD, ar, ar, 2, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM),
              MP_ERR_TIMEOUT);
    std::string want = "rank " + std::to_string(g_rank) + ": all_reduce of 2 fp32 elements on group dp_shard "
                       "(world ranks 0 1";
    EXPECT_EQ(std::string(mp_errmsg(&ctx)).rfind(want, 0), 0u) << mp_errmsg(&ctx);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  // the late partners: rank 0's send and all-reduce complete the requests the others left
  if (g_rank == 0) {
    EXPECT_EQ(mp_comm_send(&ctx, c, sbuf, 5, MP_COMM_DTYPE_FP32, 1), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(mp_comm_all_reduce(&ctx, c2, MP_GROUP_DP_SHARD, ar, ar, 2, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM),
              MP_OK)
        << mp_errmsg(&ctx);
  }
  MPI_Barrier(MPI_COMM_WORLD);
  mp_comm_destroy(c);
  mp_comm_destroy(c2);
}

TEST(CommMpi, BarrierOnEveryGroup) {
  ForEachMesh([&](mp_comm *c, const mp_mesh &m) {
    for (mp_group g : kAllGroups) {
      mp_ctx ctx;
      mp_ctx_init(&ctx);
      EXPECT_EQ(mp_comm_barrier(&ctx, c, g), MP_OK) << Where(m, g) << mp_errmsg(&ctx);
    }
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    EXPECT_EQ(mp_comm_synchronize(&ctx, c), MP_OK);
  });
}


// ---- staged backend: bitwise the results of "mpi" ----

// Every collective on every group kind and dtype, on buffers from dev (host memory either
// way; for a staged comm it plays device memory). Returns each output buffer as bytes, in
// call order, so two communicators' runs compare bitwise. Inputs are inexact (fp32
// fractions, bf16 rounded from them, int64 beyond 32 bits), so reduction order shows.
std::vector<std::vector<uint8_t>> RunEverything(mp_comm *c, const mp_mesh &m, FakeDevice &dev) {
  std::vector<std::vector<uint8_t>> out;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  auto keep = [&](const void *p, size_t bytes) {
    const uint8_t *b = static_cast<const uint8_t *>(p);
    out.emplace_back(b, b + bytes);
  };
  const mp_comm_dtype types[] = {MP_COMM_DTYPE_FP32, MP_COMM_DTYPE_BF16, MP_COMM_DTYPE_INT64};
  for (mp_group g : kAllGroups) {
    const int n = mp_mesh_group_size(&m, g), me = mp_mesh_group_index(&m, g, g_rank);
    for (mp_comm_dtype t : types) {
      SCOPED_TRACE(Where(m, g) + " " + mp_comm_dtype_name(t));
      const size_t eb = mp_comm_dtype_bytes(t);
      // element i of a buffer that rank q fills, as raw bytes of dtype t
      auto fill = [&](std::vector<uint8_t> &b, size_t count, int q, int salt) {
        b.assign(count * eb, 0);
        for (size_t i = 0; i < count; i++) {
          float f = 1.0f / (float)(3 + q * 7 + (int)i + salt) + 1e-3f * (float)i - 0.01f * salt;
          if (t == MP_COMM_DTYPE_FP32) std::memcpy(&b[i * eb], &f, 4);
          if (t == MP_COMM_DTYPE_BF16) {
            uint16_t h = mp_bf16_from_f32(f * 100.0f);
            std::memcpy(&b[i * eb], &h, 2);
          }
          if (t == MP_COMM_DTYPE_INT64) {
            int64_t v = ((int64_t)(q + 1) << 40) - (int64_t)i * 12345 * (salt + 1);
            std::memcpy(&b[i * eb], &v, 8);
          }
        }
      };
      std::vector<uint8_t> h;
      const size_t count = 37, chunk = 6, gcount = 5;

      // all_reduce sum, out of place; max, in place
      fill(h, count, g_rank, 0);
      void *s = dev.Upload(h), *r = dev.Alloc(count * eb);
      EXPECT_EQ(mp_comm_all_reduce(&ctx, c, g, s, r, count, t, MP_COMM_OP_SUM), MP_OK)
          << mp_errmsg(&ctx);
      keep(r, count * eb);
      EXPECT_EQ(mp_comm_all_reduce(&ctx, c, g, s, s, count, t, MP_COMM_OP_MAX), MP_OK)
          << mp_errmsg(&ctx);
      keep(s, count * eb);

      // all_gather, out of place and in place
      fill(h, gcount, g_rank, 1);
      void *gs = dev.Upload(h), *gr = dev.Alloc(gcount * n * eb);
      EXPECT_EQ(mp_comm_all_gather(&ctx, c, g, gs, gr, gcount, t), MP_OK) << mp_errmsg(&ctx);
      keep(gr, gcount * n * eb);
      std::vector<uint8_t> big(gcount * n * eb, 0xAB);
      std::memcpy(&big[gcount * me * eb], h.data(), gcount * eb);
      uint8_t *ip = static_cast<uint8_t *>(dev.Upload(big));
      EXPECT_EQ(mp_comm_all_gather(&ctx, c, g, ip + gcount * me * eb, ip, gcount, t), MP_OK)
          << mp_errmsg(&ctx);
      keep(ip, gcount * n * eb);

      // reduce_scatter sum and max
      fill(h, chunk * n, g_rank, 2);
      void *rs = dev.Upload(h), *rr = dev.Alloc(chunk * eb);
      EXPECT_EQ(mp_comm_reduce_scatter(&ctx, c, g, rs, rr, chunk, t, MP_COMM_OP_SUM), MP_OK)
          << mp_errmsg(&ctx);
      keep(rr, chunk * eb);
      EXPECT_EQ(mp_comm_reduce_scatter(&ctx, c, g, rs, rr, chunk, t, MP_COMM_OP_MAX), MP_OK)
          << mp_errmsg(&ctx);
      keep(rr, chunk * eb);

      // all_to_all_v: uneven counts, a gap after every send segment, receive segments in
      // reverse order with a gap between them (the gaps' bytes must survive)
      auto cnt = [](int i, int j) { return (int64_t)((i * 2 + j * 3 + 1) % 4); };
      std::vector<int64_t> sc(n), sd(n), rc(n), rd(n);
      int64_t off = 0;
      for (int j = 0; j < n; j++) sc[j] = cnt(me, j), sd[j] = off, off += sc[j] + 1;
      fill(h, (size_t)off + 1, g_rank, 3);
      void *as = dev.Upload(h);
      int64_t roff = 1;
      for (int j = n - 1; j >= 0; j--) rc[j] = cnt(j, me), rd[j] = roff, roff += rc[j] + 1;
      std::vector<uint8_t> sentinel((size_t)(roff + 1) * eb, 0x5C);
      void *ar = dev.Upload(sentinel);
      EXPECT_EQ(mp_comm_all_to_all_v(&ctx, c, g, as, sc.data(), sd.data(), ar, rc.data(),
                                     rd.data(), t),
                MP_OK)
          << mp_errmsg(&ctx);
      keep(ar, (size_t)(roff + 1) * eb);

      // broadcast from the last group index
      fill(h, count, g_rank, 4);
      void *bb = dev.Upload(h);
      EXPECT_EQ(mp_comm_broadcast(&ctx, c, g, bb, count, t, n - 1), MP_OK) << mp_errmsg(&ctx);
      keep(bb, count * eb);
    }
  }
  // point-to-point along pp: a chain of sends, then a backward sendrecv ring
  int co[MP_MESH_NDIMS];
  mp_mesh_coords(&m, g_rank, co);
  const int pp = m.size[MP_DIM_PP], st = co[MP_DIM_PP];
  auto peer = [&](int stage) {
    int x[MP_MESH_NDIMS];
    std::memcpy(x, co, sizeof x);
    x[MP_DIM_PP] = (stage + pp) % pp;
    return mp_mesh_rank_of(&m, x);
  };
  std::vector<float> v(9);
  for (int i = 0; i < 9; i++) v[i] = Val(g_rank, i) / 7.0f;
  float *pb = dev.Upload(v);
  if (st > 0) {
    EXPECT_EQ(mp_comm_recv(&ctx, c, pb, 9, MP_COMM_DTYPE_FP32, peer(st - 1)), MP_OK);
  }
  if (st < pp - 1) {
    EXPECT_EQ(mp_comm_send(&ctx, c, pb, 9, MP_COMM_DTYPE_FP32, peer(st + 1)), MP_OK);
  }
  keep(pb, 9 * sizeof(float));
  std::vector<int64_t> o(4);
  for (int i = 0; i < 4; i++) o[i] = (int64_t)g_rank * 1000003 + i;
  int64_t *so = dev.Upload(o), *ri = static_cast<int64_t *>(dev.Alloc(4 * sizeof(int64_t)));
  EXPECT_EQ(mp_comm_sendrecv(&ctx, c, so, 4, peer(st - 1), ri, 4, peer(st + 1),
                             MP_COMM_DTYPE_INT64),
            MP_OK)
      << mp_errmsg(&ctx);
  keep(ri, 4 * sizeof(int64_t));
  EXPECT_EQ(mp_comm_barrier(&ctx, c, MP_GROUP_WORLD), MP_OK);
  EXPECT_EQ(mp_comm_synchronize(&ctx, c), MP_OK);
  return out;
}

TEST(CommStaged, GivesBitwiseTheResultsOfMpi) {
  for (const std::string &spec : MeshesFor(g_world)) {
    SCOPED_TRACE("mesh " + spec);
    mp_mesh m = Parse(spec);
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    FakeDevice host_side;  // plain "mpi" gets the same kind of buffers, used as host memory
    mp_comm *c = nullptr;
    ASSERT_EQ(mp_comm_create_mpi(&ctx, &m, &c), MP_OK) << mp_errmsg(&ctx);
    std::vector<std::vector<uint8_t>> want = RunEverything(c, m, host_side);
    mp_comm_destroy(c);
    EXPECT_EQ(host_side.h2d + host_side.d2h + host_side.d2d, 0);

    FakeDevice dev;
    mp_comm *sc = nullptr;
    ASSERT_EQ(mp_comm_create_mpi_staged(&ctx, &m, dev.backend(), dev.kc(), &sc), MP_OK)
        << mp_errmsg(&ctx);
    EXPECT_STREQ(mp_comm_backend_name(sc), "mpi-staged");
    EXPECT_EQ(mp_comm_world_rank(sc), g_rank);
    EXPECT_EQ(mp_comm_local_size(sc), g_world);
    std::vector<std::vector<uint8_t>> got = RunEverything(sc, m, dev);
    mp_comm_destroy(sc);
    ASSERT_EQ(got.size(), want.size());
    for (size_t k = 0; k < got.size(); k++) EXPECT_EQ(got[k], want[k]) << "output " << k;
    EXPECT_EQ(dev.bad, 0) << "a copy had a host pointer where a device pointer belongs";
    EXPECT_GT(dev.d2h, 0);
    EXPECT_GT(dev.h2d, 0);
  }
}

// The hand-computed values of the "mpi" tests hold for staged too (a sanity check that
// "bitwise the same as mpi" is not "the same wrong answer").
TEST(CommStaged, AllReduceSumIsTheGroupSum) {
  for (const std::string &spec : MeshesFor(g_world)) {
    mp_mesh m = Parse(spec);
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    FakeDevice dev;
    mp_comm *c = nullptr;
    ASSERT_EQ(mp_comm_create_mpi_staged(&ctx, &m, dev.backend(), dev.kc(), &c), MP_OK);
    for (mp_group g : kAllGroups) {
      std::vector<float> s(11);
      for (int i = 0; i < 11; i++) s[i] = Val(g_rank, i);
      float *d = dev.Upload(s);
      ASSERT_EQ(mp_comm_all_reduce(&ctx, c, g, d, d, 11, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM),
                MP_OK);
      std::vector<float> r = dev.Download(d, 11);
      for (int i = 0; i < 11; i++) {
        float want = 0;
        for (int q : GroupRanks(m, g, g_rank)) want += Val(q, i);
        EXPECT_EQ(r[i], want) << Where(m, g);
      }
    }
    mp_comm_destroy(c);
  }
}

TEST(CommStaged, NeedsTheMemoryFunctions) {
  mp_mesh m = Parse("dp_shard=" + std::to_string(g_world));
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_comm *c = reinterpret_cast<mp_comm *>(&m);
  EXPECT_EQ(mp_comm_create_mpi_staged(&ctx, &m, nullptr, nullptr, &c), MP_ERR_INVALID);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("kernel backend"), std::string::npos);
}

// ---- overlap API on blocking backends: requests are complete at once ----

TEST(CommAsync, BlockingBackendsCompleteAtOnce) {
  mp_mesh m = Parse("dp_shard=" + std::to_string(g_world));
  FakeDevice dev;
  for (int staged = 0; staged < 2; staged++) {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_comm *c = nullptr;
    ASSERT_EQ(staged ? mp_comm_create_mpi_staged(&ctx, &m, dev.backend(), dev.kc(), &c)
                     : mp_comm_create_mpi(&ctx, &m, &c),
              MP_OK)
        << mp_errmsg(&ctx);
    mp_comm_set_stream(c, nullptr);  // ignored by host backends
    std::vector<float> s = {Val(g_rank, 0), Val(g_rank, 1)};
    float *ds = dev.Upload(s), *dr = static_cast<float *>(dev.Alloc(2 * g_world * sizeof(float)));
    mp_comm_req req = {0};
    ASSERT_EQ(mp_comm_async_begin(&ctx, c), MP_OK);
    EXPECT_EQ(mp_comm_async_begin(&ctx, c), MP_ERR_INVALID);  // batches do not nest
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find("do not nest"), std::string::npos);
    ASSERT_EQ(mp_comm_all_gather(&ctx, c, MP_GROUP_DP_SHARD, ds, dr, 2, MP_COMM_DTYPE_FP32),
              MP_OK);
    // blocking: the output is there before the batch even ends
    std::vector<float> r = dev.Download(dr, 2 * g_world);
    for (int q = 0; q < g_world; q++) EXPECT_EQ(r[2 * q + 1], Val(q, 1));
    req.seq = 77;  // async_end overwrites whatever was there
    ASSERT_EQ(mp_comm_async_end(&ctx, c, &req), MP_OK);
    EXPECT_EQ(req.seq, 0u);
    EXPECT_EQ(mp_comm_wait(&ctx, c, &req), MP_OK);
    EXPECT_EQ(mp_comm_wait(&ctx, c, &req), MP_OK);  // twice is fine
    EXPECT_EQ(mp_comm_async_end(&ctx, c, &req), MP_ERR_INVALID);  // no batch open
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find("no batch is open"), std::string::npos);
    EXPECT_EQ(mp_comm_wait(&ctx, c, nullptr), MP_ERR_INVALID);
    mp_comm_req zero = {0};
    EXPECT_EQ(mp_comm_wait(&ctx, c, &zero), MP_OK);
    // an empty batch
    ASSERT_EQ(mp_comm_async_begin(&ctx, c), MP_OK);
    ASSERT_EQ(mp_comm_async_end(&ctx, c, &req), MP_OK);
    EXPECT_EQ(mp_comm_wait(&ctx, c, &req), MP_OK);
    mp_comm_destroy(c);
  }
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(mp_comm_async_begin(&ctx, nullptr), MP_ERR_INVALID);
  mp_comm_set_stream(nullptr, nullptr);  // no-op
}

// ---- selection ----

TEST(CommSelect, ChoosesByLauncherAndDevice) {
  const bool launched = getenv("OMPI_COMM_WORLD_SIZE") != nullptr;
  mp_mesh m = Parse("dp_shard=" + std::to_string(g_world));
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  char notice[256] = "x";
  mp_comm *c = nullptr;
  // CPU: "mpi" under mpirun, "single" for the singleton run without a launcher
  ASSERT_EQ(mp_comm_create_for_device(&ctx, &m, 0, nullptr, nullptr, nullptr, &c, notice,
                                      sizeof notice),
            MP_OK)
      << mp_errmsg(&ctx);
  EXPECT_STREQ(mp_comm_backend_name(c), launched ? "mpi" : "single");
  EXPECT_STREQ(notice, "");
  mp_comm_destroy(c);

  // CUDA without NCCL (forced with MESHPLAN_NO_NCCL where this build has it): the staged
  // backends, with a notice saying why; collectives then work on "device" buffers
  FakeDevice dev;
  setenv("MESHPLAN_NO_NCCL", "1", 1);
  ASSERT_EQ(mp_comm_create_for_device(&ctx, &m, 1, dev.backend(), dev.kc(), nullptr, &c, notice,
                                      sizeof notice),
            MP_OK)
      << mp_errmsg(&ctx);
  unsetenv("MESHPLAN_NO_NCCL");
  EXPECT_STREQ(mp_comm_backend_name(c), launched ? "mpi-staged" : "single-staged");
  std::string why = notice;
  EXPECT_NE(why.find(mp_comm_nccl_built() ? "MESHPLAN_NO_NCCL=1" : "this build has no NCCL"),
            std::string::npos)
      << why;
  EXPECT_NE(why.find(launched ? "through MPI with host staging" : "device-to-device copies"),
            std::string::npos)
      << why;
  std::vector<int64_t> one = {(int64_t)g_rank + 1};
  int64_t *d = dev.Upload(one);
  ASSERT_EQ(mp_comm_all_reduce(&ctx, c, MP_GROUP_WORLD, d, d, 1, MP_COMM_DTYPE_INT64,
                               MP_COMM_OP_SUM),
            MP_OK);
  EXPECT_EQ(dev.Download(d, 1)[0], (int64_t)g_world * (g_world + 1) / 2);
  EXPECT_EQ(dev.bad, 0);
  mp_comm_destroy(c);

  // device buffers need the backend that owns them
  EXPECT_EQ(mp_comm_create_for_device(&ctx, &m, 1, nullptr, nullptr, nullptr, &c, notice,
                                      sizeof notice),
            MP_ERR_INVALID);
}

// Fault injection for tests/comm/expect_failure.sh (skipped otherwise): a failure on one
// rank must fail the whole run, and a stuck rank must end in the launcher's timeout.
TEST(CommMpi, FaultInjection) {
  const char *fail = getenv("MP_COMM_TEST_FAIL_RANK"), *hang = getenv("MP_COMM_TEST_HANG_RANK");
  if (!fail && !hang) GTEST_SKIP() << "set MP_COMM_TEST_FAIL_RANK or MP_COMM_TEST_HANG_RANK";
  if (fail && atoi(fail) == g_rank) ADD_FAILURE() << "injected failure on rank " << g_rank;
  if (hang && atoi(hang) == g_rank)
    for (;;) sleep(1);  // the others wait in the next collective
}

}  // namespace

int main(int argc, char **argv) {
  return mp_test::MpiMain(&argc, &argv, "comm_mpi_test", false, &g_rank, &g_world);
}
