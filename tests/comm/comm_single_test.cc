// Tests of exec/comm's "single" backend (world size 1 with no MPI): every collective is the
// identity on one rank, argument errors are caught by the front end, and MPI is never
// started (checked with MPI_Initialized at the end of each test where the build has MPI).
// Also here, because none of them needs MPI either: the "single-staged" backend on the CPU backend standing in for
// a device (fake_device.h), the overlap API on blocking backends, the backend choice
// (mp_comm_choose) for every combination of facts, and the NCCL and MPI entry points of a
// build without them. Builds and runs with or without MPI (MP_HAVE_MPI, tests/comm/BUILD).
#include <gtest/gtest.h>
#ifdef MP_HAVE_MPI
#include <mpi.h>
#endif

#include <cstring>
#include <string>
#include <vector>

#include "exec/comm/comm.h"
#include "exec/comm/comm_backend.h"
#include "tests/comm/fake_device.h"

namespace {

// Whether this process started MPI (never, in a build without it).
int MpiStarted() {
#ifdef MP_HAVE_MPI
  int inited = 1;
  MPI_Initialized(&inited);
  return inited;
#else
  return 0;
#endif
}

class CommSingle : public ::testing::Test {
 protected:
  void SetUp() override {
    mp_ctx_init(&ctx);
    mp_mesh_init(&mesh);
    ASSERT_EQ(mp_comm_create_single(&ctx, &mesh, &c), MP_OK) << mp_errmsg(&ctx);
  }
  void TearDown() override {
    mp_comm_destroy(c);
    EXPECT_EQ(MpiStarted(), 0) << "the single backend must not start MPI";
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

// ---- "single-staged": world size 1 on device buffers (device-to-device copies) ----

class CommSingleStaged : public ::testing::Test {
 protected:
  void SetUp() override {
    mp_ctx_init(&ctx);
    mp_mesh_init(&mesh);
    ASSERT_EQ(mp_comm_create_single_staged(&ctx, &mesh, dev.backend(), dev.kc(), &c), MP_OK)
        << mp_errmsg(&ctx);
  }
  void TearDown() override {
    mp_comm_destroy(c);
    EXPECT_EQ(dev.bad, 0) << "a copy touched memory outside the device allocations";
    EXPECT_EQ(dev.h2d + dev.d2h, 0) << "world size 1 must stay on the device";
    EXPECT_EQ(MpiStarted(), 0) << "single-staged must not start MPI";
  }
  mp_ctx ctx;
  mp_mesh mesh;
  FakeDevice dev;
  mp_comm *c = nullptr;
};

TEST_F(CommSingleStaged, CollectivesAreDeviceCopies) {
  EXPECT_STREQ(mp_comm_backend_name(c), "single-staged");
  EXPECT_EQ(mp_comm_world_size(c), 1);
  std::vector<float> s = {1.5f, -2.0f, 3.25f};
  for (int g = 0; g < MP_GROUP_COUNT; g++) {
    mp_group gg = (mp_group)g;
    float *ds = dev.Upload(s), *dr = dev.Upload(std::vector<float>(3, 0));
    ASSERT_EQ(mp_comm_all_reduce(&ctx, c, gg, ds, dr, 3, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM),
              MP_OK);
    EXPECT_EQ(dev.Download(dr, 3), s);
    dr = dev.Upload(std::vector<float>(3, 0));
    ASSERT_EQ(mp_comm_all_gather(&ctx, c, gg, ds, dr, 3, MP_COMM_DTYPE_FP32), MP_OK);
    EXPECT_EQ(dev.Download(dr, 3), s);
    dr = dev.Upload(std::vector<float>(3, 0));
    ASSERT_EQ(mp_comm_reduce_scatter(&ctx, c, gg, ds, dr, 3, MP_COMM_DTYPE_FP32, MP_COMM_OP_MAX),
              MP_OK);
    EXPECT_EQ(dev.Download(dr, 3), s);
    ASSERT_EQ(mp_comm_broadcast(&ctx, c, gg, ds, 3, MP_COMM_DTYPE_FP32, 0), MP_OK);
    EXPECT_EQ(dev.Download(ds, 3), s);
    EXPECT_EQ(mp_comm_barrier(&ctx, c, gg), MP_OK);
  }
  int copies = dev.d2d;
  // in place: nothing to copy
  std::vector<int64_t> a = {1LL << 40, 7};
  int64_t *da = dev.Upload(a);
  ASSERT_EQ(mp_comm_all_reduce(&ctx, c, MP_GROUP_TP, da, da, 2, MP_COMM_DTYPE_INT64,
                               MP_COMM_OP_SUM),
            MP_OK);
  ASSERT_EQ(mp_comm_all_gather(&ctx, c, MP_GROUP_TP, da, da, 2, MP_COMM_DTYPE_INT64), MP_OK);
  EXPECT_EQ(dev.Download(da, 2), a);
  EXPECT_EQ(dev.d2d, copies);
  EXPECT_EQ(mp_comm_synchronize(&ctx, c), MP_OK);
}

TEST_F(CommSingleStaged, AllToAllVAndSendRecvWithOneself) {
  std::vector<uint16_t> s = {9, 1, 2, 3, 9};
  uint16_t *ds = dev.Upload(s), *dr = dev.Upload(std::vector<uint16_t>(6, 0));
  int64_t sc = 3, sd = 1, rc = 3, rd = 2;
  ASSERT_EQ(mp_comm_all_to_all_v(&ctx, c, MP_GROUP_EP, ds, &sc, &sd, dr, &rc, &rd,
                                 MP_COMM_DTYPE_BF16),
            MP_OK);
  EXPECT_EQ(dev.Download(dr, 6), (std::vector<uint16_t>{0, 0, 1, 2, 3, 0}));
  rc = 2;
  EXPECT_EQ(mp_comm_all_to_all_v(&ctx, c, MP_GROUP_EP, ds, &sc, &sd, dr, &rc, &rd,
                                 MP_COMM_DTYPE_BF16),
            MP_ERR_INVALID);
  float x = 4;
  float *dx = dev.Upload(std::vector<float>{x}), *dy = dev.Upload(std::vector<float>{0});
  EXPECT_EQ(mp_comm_sendrecv(&ctx, c, dx, 1, 0, dy, 1, 0, MP_COMM_DTYPE_FP32), MP_OK);
  EXPECT_EQ(dev.Download(dy, 1)[0], 4);
  EXPECT_EQ(mp_comm_sendrecv(&ctx, c, dx, 1, 0, dy, 2, 0, MP_COMM_DTYPE_FP32), MP_ERR_INVALID);
  EXPECT_EQ(mp_comm_send(&ctx, c, dx, 1, MP_COMM_DTYPE_FP32, 0), MP_ERR_INVALID);
}

TEST(CommSingleStagedCreate, RefusesWithoutMemoryFunctionsOrWithManyRanks) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  mp_mesh_init(&m);
  mp_comm *c = reinterpret_cast<mp_comm *>(&m);
  EXPECT_EQ(mp_comm_create_single_staged(&ctx, &m, nullptr, nullptr, &c), MP_ERR_INVALID);
  EXPECT_EQ(c, nullptr);
  FakeDevice dev;
  mp_backend no_copy = *dev.backend();
  no_copy.memcpy_d2d = nullptr;
  EXPECT_EQ(mp_comm_create_single_staged(&ctx, &m, &no_copy, dev.kc(), &c), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("no memcpy entries"), std::string::npos);
  m.size[MP_DIM_TP] = 2;
  EXPECT_EQ(mp_comm_create_single_staged(&ctx, &m, dev.backend(), dev.kc(), &c), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("has 2 ranks"), std::string::npos);
}

// A failing device copy comes back as the copy's status, with the kernel backend's message
// (recorded on kc->err, a different context from the caller's).
static mp_status FailingCopy(mp_kctx *kc, void *, const void *, size_t) {
  return mp_error(kc->err, MP_ERR_CUDA, "fake device: copy failed");
}

TEST(CommSingleStagedCreate, CopyFailuresReachTheCaller) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  mp_mesh_init(&m);
  FakeDevice dev;
  mp_backend broken = *dev.backend();
  broken.memcpy_d2d = FailingCopy;
  mp_comm *c = nullptr;
  ASSERT_EQ(mp_comm_create_single_staged(&ctx, &m, &broken, dev.kc(), &c), MP_OK);
  float *a = dev.Upload(std::vector<float>{1}), *b = dev.Upload(std::vector<float>{0});
  EXPECT_EQ(mp_comm_all_reduce(&ctx, c, MP_GROUP_DP, a, b, 1, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM),
            MP_ERR_CUDA);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("all_reduce: fake device: copy failed"),
            std::string::npos)
      << mp_errmsg(&ctx);
  mp_comm_destroy(c);
}

// ---- overlap API on the single backends ----

TEST_F(CommSingle, AsyncRequestsAreCompleteAtOnce) {
  std::vector<float> s = {1, 2}, r(2, 0);
  mp_comm_req req = {12345};
  ASSERT_EQ(mp_comm_async_begin(&ctx, c), MP_OK);
  EXPECT_EQ(mp_comm_async_begin(&ctx, c), MP_ERR_INVALID);
  ASSERT_EQ(mp_comm_all_reduce(&ctx, c, MP_GROUP_FSDP, s.data(), r.data(), 2, MP_COMM_DTYPE_FP32,
                               MP_COMM_OP_SUM),
            MP_OK);
  EXPECT_EQ(r, s);  // blocking backend: done inside the call
  ASSERT_EQ(mp_comm_async_end(&ctx, c, &req), MP_OK);
  EXPECT_EQ(req.seq, 0u);
  EXPECT_EQ(mp_comm_wait(&ctx, c, &req), MP_OK);
  EXPECT_EQ(mp_comm_async_end(&ctx, c, &req), MP_ERR_INVALID);
  EXPECT_EQ(mp_comm_async_end(&ctx, c, nullptr), MP_ERR_INVALID);
  mp_comm_set_stream(c, reinterpret_cast<void *>(0x1234));  // ignored on the host
  EXPECT_EQ(mp_comm_synchronize(&ctx, c), MP_OK);
}

// ---- backend choice (pure: no MPI, no device) ----

struct Choice {
  mp_status st;
  mp_comm_kind kind;
  std::string notice;
};

Choice Choose(const char *mesh_spec, mp_comm_facts f) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  EXPECT_EQ(mp_mesh_parse(&ctx, mesh_spec, 0, &m), MP_OK);
  Choice ch{MP_OK, MP_COMM_KIND_SINGLE, ""};
  char notice[256] = "garbage";
  ch.st = mp_comm_choose(&ctx, &m, &f, &ch.kind, notice, sizeof notice);
  ch.notice = ch.st == MP_OK ? notice : mp_errmsg(&ctx);
  return ch;
}

mp_comm_facts Facts(int cuda, int launched, int nccl, int ranks, int gpus, int shared) {
  mp_comm_facts f;
  std::memset(&f, 0, sizeof f);
  f.device_is_cuda = cuda;
  f.launched = launched;
  f.nccl_built = nccl;
  f.node_ranks = ranks;
  f.node_gpus = gpus;
  f.shared_anywhere = shared;
  return f;
}

TEST(CommChoose, CpuIsMpiUnderALauncherElseSingle) {
  Choice a = Choose("dp_shard=4", Facts(0, 1, 1, 4, 0, 0));
  EXPECT_EQ(a.kind, MP_COMM_KIND_MPI);
  EXPECT_EQ(a.notice, "");
  Choice b = Choose("tp=1", Facts(0, 0, 1, 1, 0, 0));
  EXPECT_EQ(b.kind, MP_COMM_KIND_SINGLE);
  EXPECT_EQ(b.notice, "");
  Choice c = Choose("tp=1", Facts(0, 1, 0, 1, 0, 0));  // mpirun -np 1
  EXPECT_EQ(c.kind, MP_COMM_KIND_MPI);
  Choice d = Choose("dp_shard=2,tp=2", Facts(0, 0, 1, 1, 0, 0));
  EXPECT_EQ(d.st, MP_ERR_INVALID);
  EXPECT_NE(d.notice.find("mesh dp_shard=2,tp=2 has 4 ranks but this process runs alone; "
                          "launch it with mpirun -np 4"),
            std::string::npos)
      << d.notice;
}

TEST(CommChoose, CudaIsNcclWhenEveryRankHasItsOwnGpu) {
  Choice a = Choose("dp_shard=8", Facts(1, 1, 1, 8, 8, 0));
  EXPECT_EQ(a.kind, MP_COMM_KIND_NCCL);
  EXPECT_EQ(a.notice, "");
  Choice b = Choose("tp=1", Facts(1, 0, 1, 1, 1, 0));  // world 1, no launcher
  EXPECT_EQ(b.kind, MP_COMM_KIND_NCCL);
}

TEST(CommChoose, RanksSharingAGpuGoThroughMpiStaging) {
  Choice a = Choose("dp_shard=4", Facts(1, 1, 1, 4, 1, 1));
  EXPECT_EQ(a.kind, MP_COMM_KIND_MPI_STAGED);
  EXPECT_EQ(a.notice, "4 ranks share 1 GPU on this node; NCCL refuses two ranks of one "
                      "communicator on one GPU, so collectives go through MPI with host staging");
  Choice b = Choose("dp_shard=8", Facts(1, 1, 1, 8, 4, 1));
  EXPECT_EQ(b.kind, MP_COMM_KIND_MPI_STAGED);
  EXPECT_NE(b.notice.find("8 ranks share 4 GPUs on this node"), std::string::npos) << b.notice;
  // this node is fine but another is not: every rank still stages (all must agree)
  Choice c = Choose("dp_shard=8", Facts(1, 1, 1, 4, 4, 1));
  EXPECT_EQ(c.kind, MP_COMM_KIND_MPI_STAGED);
  EXPECT_NE(c.notice.find("ranks of another node share a GPU (this node: 4 ranks on 4 GPUs)"),
            std::string::npos)
      << c.notice;
}

TEST(CommChoose, NoNcclStagesWithANotice) {
  Choice a = Choose("dp_shard=2", Facts(1, 1, 0, 2, 2, 0));
  EXPECT_EQ(a.kind, MP_COMM_KIND_MPI_STAGED);
  EXPECT_NE(a.notice.find("this build has no NCCL"), std::string::npos) << a.notice;
  EXPECT_NE(a.notice.find("through MPI with host staging"), std::string::npos) << a.notice;
  Choice b = Choose("tp=1", Facts(1, 0, 0, 1, 1, 0));
  EXPECT_EQ(b.kind, MP_COMM_KIND_SINGLE_STAGED);
  EXPECT_NE(b.notice.find("device-to-device copies"), std::string::npos) << b.notice;
  mp_comm_facts f = Facts(1, 1, 1, 2, 2, 0);
  f.no_nccl_env = 1;
  Choice c = Choose("dp_shard=2", f);
  EXPECT_EQ(c.kind, MP_COMM_KIND_MPI_STAGED);
  EXPECT_NE(c.notice.find("MESHPLAN_NO_NCCL=1"), std::string::npos) << c.notice;
  // a NULL notice is allowed
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  mp_mesh_init(&m);
  mp_comm_kind k;
  EXPECT_EQ(mp_comm_choose(&ctx, &m, &f, &k, nullptr, 0), MP_OK);
}

TEST(CommSelectSingle, CpuWithoutLauncherIsSingle) {
  // Bazel runs this test without a launcher's environment.
  ASSERT_EQ(getenv("OMPI_COMM_WORLD_SIZE"), nullptr);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  mp_mesh_init(&m);
  mp_comm *c = nullptr;
  char notice[128];
  ASSERT_EQ(mp_comm_create_for_device(&ctx, &m, 0, nullptr, nullptr, nullptr, &c, notice,
                                      sizeof notice),
            MP_OK);
  EXPECT_STREQ(mp_comm_backend_name(c), "single");
  mp_comm_destroy(c);
  m.size[MP_DIM_DP_SHARD] = 2;
  EXPECT_EQ(mp_comm_create_for_device(&ctx, &m, 0, nullptr, nullptr, nullptr, &c, notice,
                                      sizeof notice),
            MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("launch it with mpirun -np 2"), std::string::npos);
  EXPECT_EQ(MpiStarted(), 0);
}

// The entry points of a library the build left out: a world-size-1 mesh, and a comm
// pointer that a refusing create must set to NULL.
class CommWithout : public ::testing::Test {
 protected:
  void SetUp() override {
    mp_ctx_init(&ctx);
    mp_mesh_init(&m);
    c = reinterpret_cast<mp_comm *>(&m);
  }
  mp_ctx ctx;
  mp_mesh m;
  mp_comm *c = nullptr;
};

TEST_F(CommWithout, NcclCreateSaysSo) {
  if (mp_comm_nccl_built()) GTEST_SKIP() << "this build has NCCL (tests/comm/comm_gpu_test.cc)";
  EXPECT_EQ(mp_comm_create_nccl(&ctx, &m, 0, nullptr, &c), MP_ERR_UNSUPPORTED);
  EXPECT_EQ(c, nullptr);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("built without NCCL"), std::string::npos);
  EXPECT_EQ(mp_comm_nccl_comm_count(nullptr), 0);
}

// A build without MPI (MESHPLAN_NO_MPI=1, or no mpicc): the MPI backends refuse with one
// message that says what to install; finalize has nothing to do; one rank still runs.
TEST_F(CommWithout, MpiCreateSaysSo) {
  if (mp_comm_mpi_built()) GTEST_SKIP() << "this build has MPI (tests/comm/comm_mpi_test.cc)";
  EXPECT_EQ(mp_comm_create_mpi(&ctx, &m, &c), MP_ERR_UNSUPPORTED);
  EXPECT_EQ(c, nullptr);
  const std::string msg = mp_errmsg(&ctx);
  EXPECT_NE(msg.find("built without MPI"), std::string::npos) << msg;
  EXPECT_NE(msg.find("install libopenmpi-dev"), std::string::npos) << msg;
  FakeDevice dev;
  c = reinterpret_cast<mp_comm *>(&m);
  EXPECT_EQ(mp_comm_create_mpi_staged(&ctx, &m, dev.backend(), dev.kc(), &c),
            MP_ERR_UNSUPPORTED);
  EXPECT_EQ(c, nullptr);
  int world = -1;
  EXPECT_EQ(mp_comm_mpi_world(&ctx, nullptr, &world), MP_ERR_UNSUPPORTED);
  EXPECT_EQ(mp_comm_mpi_init(&ctx, nullptr, nullptr), MP_ERR_UNSUPPORTED);
  EXPECT_EQ(mp_comm_mpi_finalize(&ctx), MP_OK);
  ASSERT_EQ(mp_comm_create_single(&ctx, &m, &c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_STREQ(mp_comm_backend_name(c), "single");
  mp_comm_destroy(c);
}

}  // namespace
