// Tests of exec/comm's "single" backend (world size 1 with no MPI): every collective is the
// identity on one rank, argument errors are caught by the front end, and MPI is never
// started (checked with MPI_Initialized at the end of each test).
#include <gtest/gtest.h>
#include <mpi.h>

#include <string>
#include <vector>

#include "exec/comm/comm.h"

namespace {

class CommSingle : public ::testing::Test {
 protected:
  void SetUp() override {
    mp_ctx_init(&ctx);
    mp_mesh_init(&mesh);
    ASSERT_EQ(mp_comm_create_single(&ctx, &mesh, &c), MP_OK) << mp_errmsg(&ctx);
  }
  void TearDown() override {
    mp_comm_destroy(c);
    int inited = 1;
    MPI_Initialized(&inited);
    EXPECT_EQ(inited, 0) << "the single backend must not start MPI";
  }
  mp_ctx ctx;
  mp_mesh mesh;
  mp_comm *c = nullptr;
};

TEST_F(CommSingle, EveryGroupIsThisRankAlone) {
  EXPECT_STREQ(mp_comm_backend_name(c), "single");
  EXPECT_EQ(mp_comm_world_rank(c), 0);
  EXPECT_EQ(mp_comm_world_size(c), 1);
  EXPECT_EQ(mp_comm_local_rank(c), 0);
  EXPECT_EQ(mp_comm_local_size(c), 1);
  for (int g = 0; g < MP_GROUP_COUNT; g++) {
    EXPECT_EQ(mp_comm_group_size(c, (mp_group)g), 1);
    EXPECT_EQ(mp_comm_group_index(c, (mp_group)g), 0);
  }
}

TEST_F(CommSingle, CollectivesAreTheIdentity) {
  std::vector<float> s = {1.5f, -2.0f, 3.25f}, r(3, 0);
  for (int g = 0; g < MP_GROUP_COUNT; g++) {
    mp_group gg = (mp_group)g;
    std::fill(r.begin(), r.end(), 0);
    ASSERT_EQ(mp_comm_all_reduce(&ctx, c, gg, s.data(), r.data(), 3, MP_COMM_DTYPE_FP32,
                                 MP_COMM_OP_SUM),
              MP_OK);
    EXPECT_EQ(r, s);
    std::fill(r.begin(), r.end(), 0);
    ASSERT_EQ(mp_comm_all_gather(&ctx, c, gg, s.data(), r.data(), 3, MP_COMM_DTYPE_FP32), MP_OK);
    EXPECT_EQ(r, s);
    std::fill(r.begin(), r.end(), 0);
    ASSERT_EQ(mp_comm_reduce_scatter(&ctx, c, gg, s.data(), r.data(), 3, MP_COMM_DTYPE_FP32,
                                     MP_COMM_OP_MAX),
              MP_OK);
    EXPECT_EQ(r, s);
    ASSERT_EQ(mp_comm_broadcast(&ctx, c, gg, r.data(), 3, MP_COMM_DTYPE_FP32, 0), MP_OK);
    EXPECT_EQ(r, s);
    EXPECT_EQ(mp_comm_barrier(&ctx, c, gg), MP_OK);
  }
  // in place
  std::vector<int64_t> a = {1LL << 40, 7};
  ASSERT_EQ(mp_comm_all_reduce(&ctx, c, MP_GROUP_TP, a.data(), a.data(), 2, MP_COMM_DTYPE_INT64,
                               MP_COMM_OP_SUM),
            MP_OK);
  EXPECT_EQ(a[0], 1LL << 40);
  EXPECT_EQ(a[1], 7);
  EXPECT_EQ(mp_comm_synchronize(&ctx, c), MP_OK);
}

TEST_F(CommSingle, AllToAllVHonoursDisplacements) {
  std::vector<uint16_t> s = {9, 1, 2, 3, 9}, r(6, 0);
  int64_t sc = 3, sd = 1, rc = 3, rd = 2;
  ASSERT_EQ(mp_comm_all_to_all_v(&ctx, c, MP_GROUP_EP, s.data(), &sc, &sd, r.data(), &rc, &rd,
                                 MP_COMM_DTYPE_BF16),
            MP_OK);
  EXPECT_EQ(r, (std::vector<uint16_t>{0, 0, 1, 2, 3, 0}));
  rc = 2;
  EXPECT_EQ(mp_comm_all_to_all_v(&ctx, c, MP_GROUP_EP, s.data(), &sc, &sd, r.data(), &rc, &rd,
                                 MP_COMM_DTYPE_BF16),
            MP_ERR_INVALID);
}

TEST_F(CommSingle, PointToPointOnlyWithOneself) {
  float x = 4, y = 0;
  EXPECT_EQ(mp_comm_sendrecv(&ctx, c, &x, 1, 0, &y, 1, 0, MP_COMM_DTYPE_FP32), MP_OK);
  EXPECT_EQ(y, 4);
  EXPECT_EQ(mp_comm_send(&ctx, c, &x, 1, MP_COMM_DTYPE_FP32, 0), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("mp_comm_sendrecv"), std::string::npos);
  EXPECT_EQ(mp_comm_recv(&ctx, c, &y, 1, MP_COMM_DTYPE_FP32, 1), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("outside the world of 1"), std::string::npos);
}

TEST_F(CommSingle, BadArgumentsAreRejected) {
  float x = 0;
  EXPECT_EQ(mp_comm_broadcast(&ctx, c, MP_GROUP_TP, &x, 1, MP_COMM_DTYPE_FP32, 1),
            MP_ERR_INVALID);
  EXPECT_EQ(mp_comm_all_reduce(&ctx, c, MP_GROUP_TP, &x, &x, 1, (mp_comm_dtype)99,
                               MP_COMM_OP_SUM),
            MP_ERR_INVALID);
  EXPECT_EQ(mp_comm_all_reduce(&ctx, c, MP_GROUP_TP, &x, &x, 1, MP_COMM_DTYPE_FP32,
                               (mp_comm_op)7),
            MP_ERR_INVALID);
  EXPECT_EQ(mp_comm_all_gather(&ctx, c, MP_GROUP_TP, &x, nullptr, 1, MP_COMM_DTYPE_FP32),
            MP_ERR_INVALID);
  // zero elements with NULL buffers is fine (nothing to move)
  EXPECT_EQ(mp_comm_all_gather(&ctx, c, MP_GROUP_TP, nullptr, nullptr, 0, MP_COMM_DTYPE_FP32),
            MP_OK);
}

TEST(CommSingleCreate, RefusesAMeshOfMoreThanOneRank) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  mp_mesh_init(&m);
  m.size[MP_DIM_DP_SHARD] = 2;
  m.size[MP_DIM_TP] = 2;
  mp_comm *c = reinterpret_cast<mp_comm *>(&m);  // must be reset to NULL on failure
  EXPECT_EQ(mp_comm_create_single(&ctx, &m, &c), MP_ERR_INVALID);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("mesh dp_shard=2,tp=2 has 4 ranks"),
            std::string::npos)
      << mp_errmsg(&ctx);
  mp_comm_destroy(nullptr);  // no-op
}

TEST(CommDtype, SizesAndNames) {
  EXPECT_EQ(mp_comm_dtype_bytes(MP_COMM_DTYPE_FP32), 4u);
  EXPECT_EQ(mp_comm_dtype_bytes(MP_COMM_DTYPE_INT64), 8u);
  EXPECT_EQ(mp_comm_dtype_bytes(MP_COMM_DTYPE_BF16), 2u);
  EXPECT_EQ(mp_comm_dtype_bytes(MP_COMM_DTYPE_COUNT), 0u);
  EXPECT_STREQ(mp_comm_dtype_name(MP_COMM_DTYPE_BF16), "bf16");
  EXPECT_STREQ(mp_comm_op_name(MP_COMM_OP_MAX), "max");
}

}  // namespace
