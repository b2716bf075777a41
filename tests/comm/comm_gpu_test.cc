// GPU tests of exec/comm (Bazel tag "gpu"): the "nccl" backend, the overlap API on it, its
// timeout, the staged backends on the real CUDA backend, and the backend selection.
//
// One binary, run without a launcher (world size 1: NCCL on the one GPU, every group has
// one rank) and under mpirun -np 2 by run_mpi.sh (two ranks on one GPU: the selection must
// stage through MPI, and mp_comm_create_nccl must refuse on every rank; with two GPUs the
// same binary runs NCCL for real across them). Without a CUDA device, or without NCCL in
// the build, the tests that need them skip.
//
// Expected values are computed by hand from the group's ranks: reductions use small
// integers (exact in fp32 and bf16, so the order NCCL adds in does not matter); gathers,
// all-to-all and broadcast move raw bit patterns that encode sender, destination and
// position. Results are read back with the CUDA backend's memcpy_d2h, which runs on the
// compute stream: a collective that were not ordered against it would show here.
#include <gtest/gtest.h>
#include <mpi.h>
#include <unistd.h>

#ifdef MP_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "exec/comm/comm.h"
#include "exec/comm/comm_backend.h"
#include "exec/mesh.h"
#include "kernels/cuda/cuda.h"
#include "kernels/ops.h"
#include "tests/mpi_gtest.h"

namespace {

int g_rank = 0, g_world = 1;
bool g_launched = false;

const mp_group kAllGroups[] = {MP_GROUP_PP,    MP_GROUP_DP_REPLICATE, MP_GROUP_DP_SHARD,
                               MP_GROUP_CP,    MP_GROUP_TP,           MP_GROUP_EP,
                               MP_GROUP_EFSDP, MP_GROUP_DP,           MP_GROUP_FSDP,
                               MP_GROUP_WORLD};
const mp_comm_dtype kTypes[] = {MP_COMM_DTYPE_FP32, MP_COMM_DTYPE_BF16, MP_COMM_DTYPE_INT64};

mp_mesh Mesh(const std::string &spec) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  EXPECT_EQ(mp_mesh_parse(&ctx, spec.c_str(), 0, &m), MP_OK) << mp_errmsg(&ctx);
  return m;
}

std::vector<int> GroupRanks(const mp_mesh &m, mp_group g) {
  std::vector<int> r(mp_mesh_group_size(&m, g));
  mp_mesh_group_ranks(&m, g, g_rank, r.data());
  return r;
}

// Raw element of dtype t holding the small integer v (exact in all three dtypes).
std::vector<uint8_t> Small(mp_comm_dtype t, const std::vector<int> &v) {
  size_t eb = mp_comm_dtype_bytes(t);
  std::vector<uint8_t> b(v.size() * eb);
  for (size_t i = 0; i < v.size(); i++) {
    float f = (float)v[i];
    int64_t l = v[i];
    uint16_t h = mp_bf16_from_f32(f);
    std::memcpy(&b[i * eb], t == MP_COMM_DTYPE_FP32 ? (void *)&f
                            : t == MP_COMM_DTYPE_BF16 ? (void *)&h
                                                      : (void *)&l,
                eb);
  }
  return b;
}

// Raw bit pattern of dtype t for (who, where, k): data movement only, no arithmetic, so any
// bits are fine (bf16 patterns include NaN encodings on purpose).
std::vector<uint8_t> Bits(mp_comm_dtype t, size_t n, int who, int where) {
  size_t eb = mp_comm_dtype_bytes(t);
  std::vector<uint8_t> b(n * eb);
  for (size_t k = 0; k < n; k++)
    for (size_t j = 0; j < eb; j++)
      b[k * eb + j] = (uint8_t)(who * 37 + where * 11 + (int)k * 5 + (int)j * 3 + 1);
  return b;
}

// The CUDA backend on this rank's GPU (node-local rank modulo the visible GPUs), with
// device buffers freed at the end of each test.
class Gpu : public ::testing::Test {
 public:  // EveryCollective uses the helpers
  void SetUp() override {
    if (mp_cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    be = mp_cuda_backend();
    ASSERT_NE(be, nullptr);
    mp_ctx_init(&err);
    mp_ctx_init(&ctx);
    kc.err = &err;
    int lr = mp_comm_local_rank_from_env();
    device = (lr < 0 ? 0 : lr) % mp_cuda_device_count();
    ASSERT_EQ(be->init(&kc, device), MP_OK) << mp_errmsg(&err);
    stream = mp_cuda_stream(&kc);
  }
  void TearDown() override {
    if (be == nullptr) return;
    if (kc.impl) {
      EXPECT_EQ(be->synchronize(&kc), MP_OK) << mp_errmsg(&err);
    }
    for (void *p : bufs) be->free(&kc, p);
    be->shutdown(&kc);
  }
  void *Up(const std::vector<uint8_t> &h) {
    void *p = nullptr;
    EXPECT_EQ(be->alloc(&kc, &p, h.empty() ? 1 : h.size()), MP_OK) << mp_errmsg(&err);
    bufs.push_back(p);
    if (!h.empty()) {
      EXPECT_EQ(be->memcpy_h2d(&kc, p, h.data(), h.size()), MP_OK) << mp_errmsg(&err);
    }
    return p;
  }
  void *Zeros(size_t bytes) { return Up(std::vector<uint8_t>(bytes, 0)); }
  std::vector<uint8_t> Down(const void *p, size_t bytes) {
    std::vector<uint8_t> h(bytes);
    if (bytes) {
      EXPECT_EQ(be->memcpy_d2h(&kc, h.data(), p, bytes), MP_OK) << mp_errmsg(&err);
    }
    return h;
  }
  // NCCL needs one GPU per rank; true when this run has them (single node).
  bool NcclRunnable(std::string *why) {
    if (!mp_comm_nccl_built()) return *why = "built without NCCL", false;
    if (mp_cuda_device_count() < g_world)
      return *why = std::to_string(g_world) + " ranks share " +
                    std::to_string(mp_cuda_device_count()) + " GPU(s)",
             false;
    return true;
  }

  const mp_backend *be = nullptr;
  mp_ctx err, ctx;
  mp_kctx kc = {nullptr, nullptr, 0};
  int device = 0;
  void *stream = nullptr;
  std::vector<void *> bufs;
};

// Every collective on every group kind and dtype, checked against hand-computed values;
// c works on device buffers (nccl, or a staged backend on the CUDA backend).
void EveryCollective(Gpu *t, mp_comm *c, const mp_mesh &m) {
  mp_ctx &ctx = t->ctx;
  for (mp_group g : kAllGroups) {
    const std::vector<int> R = GroupRanks(m, g);
    const int n = (int)R.size(), me = mp_mesh_group_index(&m, g, g_rank);
    for (mp_comm_dtype ty : kTypes) {
      SCOPED_TRACE(std::string("group ") + mp_group_name(g) + " " + mp_comm_dtype_name(ty));
      const size_t eb = mp_comm_dtype_bytes(ty), count = 37;
      auto x = [](int q, int i) { return q * 3 + i % 5 + 1; };
      auto w = [](int q, int i) { return ((q * 7 + i * 3) % 11) - 5; };
      std::vector<int> mine(count), sum(count, 0), mx(count, -100), wv(count);
      for (size_t i = 0; i < count; i++) {
        mine[i] = x(g_rank, (int)i);
        wv[i] = w(g_rank, (int)i);
        for (int q : R) sum[i] += x(q, (int)i), mx[i] = std::max(mx[i], w(q, (int)i));
      }
      // all_reduce: sum out of place, max in place
      void *s = t->Up(Small(ty, mine)), *r = t->Zeros(count * eb);
      ASSERT_EQ(mp_comm_all_reduce(&ctx, c, g, s, r, count, ty, MP_COMM_OP_SUM), MP_OK)
          << mp_errmsg(&ctx);
      EXPECT_EQ(t->Down(r, count * eb), Small(ty, sum));
      void *ip = t->Up(Small(ty, wv));
      ASSERT_EQ(mp_comm_all_reduce(&ctx, c, g, ip, ip, count, ty, MP_COMM_OP_MAX), MP_OK)
          << mp_errmsg(&ctx);
      EXPECT_EQ(t->Down(ip, count * eb), Small(ty, mx));

      // all_gather: out of place, then in place
      const size_t gc = 5;
      std::vector<uint8_t> want;
      for (int k = 0; k < n; k++) {
        std::vector<uint8_t> b = Bits(ty, gc, R[k], 0);
        want.insert(want.end(), b.begin(), b.end());
      }
      void *gs = t->Up(Bits(ty, gc, g_rank, 0)), *gr = t->Zeros(gc * n * eb);
      ASSERT_EQ(mp_comm_all_gather(&ctx, c, g, gs, gr, gc, ty), MP_OK) << mp_errmsg(&ctx);
      EXPECT_EQ(t->Down(gr, gc * n * eb), want);
      std::vector<uint8_t> pre(gc * n * eb, 0xEE);
      std::vector<uint8_t> b = Bits(ty, gc, g_rank, 0);
      std::memcpy(&pre[gc * me * eb], b.data(), b.size());
      uint8_t *gi = static_cast<uint8_t *>(t->Up(pre));
      ASSERT_EQ(mp_comm_all_gather(&ctx, c, g, gi + gc * me * eb, gi, gc, ty), MP_OK)
          << mp_errmsg(&ctx);
      EXPECT_EQ(t->Down(gi, gc * n * eb), want);

      // reduce_scatter sum: chunk k of rank q holds (q + k + i) % 4
      const size_t ch = 6;
      std::vector<int> rs_in(ch * n), rs_want(ch, 0);
      for (int k = 0; k < n; k++)
        for (size_t i = 0; i < ch; i++) rs_in[k * ch + i] = (g_rank + k + (int)i) % 4;
      for (int q : R)
        for (size_t i = 0; i < ch; i++) rs_want[i] += (q + me + (int)i) % 4;
      void *rs = t->Up(Small(ty, rs_in)), *rr = t->Zeros(ch * eb);
      ASSERT_EQ(mp_comm_reduce_scatter(&ctx, c, g, rs, rr, ch, ty, MP_COMM_OP_SUM), MP_OK)
          << mp_errmsg(&ctx);
      EXPECT_EQ(t->Down(rr, ch * eb), Small(ty, rs_want));

      // all_to_all_v: uneven counts (zeros included), gaps after each send segment, receive
      // segments in reverse order with gaps whose bytes must survive
      auto cnt = [](int i, int j) { return (int64_t)((i * 2 + j * 3 + 1) % 4); };
      std::vector<int64_t> sc(n), sd(n), rc(n), rd(n);
      std::vector<uint8_t> sbuf;
      for (int j = 0; j < n; j++) {
        sc[j] = cnt(me, j);
        sd[j] = (int64_t)(sbuf.size() / eb);
        std::vector<uint8_t> seg = Bits(ty, (size_t)sc[j], g_rank, j);
        sbuf.insert(sbuf.end(), seg.begin(), seg.end());
        sbuf.insert(sbuf.end(), eb, 0x77);  // gap
      }
      int64_t roff = 1;
      for (int j = n - 1; j >= 0; j--) rc[j] = cnt(j, me), rd[j] = roff, roff += rc[j] + 1;
      std::vector<uint8_t> rwant((size_t)(roff + 1) * eb, 0x5C);
      for (int j = 0; j < n; j++) {
        std::vector<uint8_t> seg = Bits(ty, (size_t)rc[j], R[j], me);
        if (!seg.empty()) std::memcpy(&rwant[(size_t)rd[j] * eb], seg.data(), seg.size());
      }
      void *as = t->Up(sbuf), *ar = t->Up(std::vector<uint8_t>(rwant.size(), 0x5C));
      ASSERT_EQ(mp_comm_all_to_all_v(&ctx, c, g, as, sc.data(), sd.data(), ar, rc.data(),
                                     rd.data(), ty),
                MP_OK)
          << mp_errmsg(&ctx);
      EXPECT_EQ(t->Down(ar, rwant.size()), rwant);

      // broadcast from the last group index
      void *bb = t->Up(Bits(ty, count, g_rank, 9));
      ASSERT_EQ(mp_comm_broadcast(&ctx, c, g, bb, count, ty, n - 1), MP_OK) << mp_errmsg(&ctx);
      EXPECT_EQ(t->Down(bb, count * eb), Bits(ty, count, R[n - 1], 9));
      EXPECT_EQ(mp_comm_barrier(&ctx, c, g), MP_OK) << mp_errmsg(&ctx);
    }
  }
  // point-to-point over the world: a backward ring with sendrecv (self at world size 1),
  // then a chain of sends
  const int W = mp_mesh_world(&m), dst = (g_rank + W - 1) % W, src = (g_rank + 1) % W;
  void *so = t->Up(Bits(MP_COMM_DTYPE_INT64, 4, g_rank, 1)), *ri = t->Zeros(32);
  ASSERT_EQ(mp_comm_sendrecv(&ctx, c, so, 4, dst, ri, 4, src, MP_COMM_DTYPE_INT64), MP_OK)
      << mp_errmsg(&ctx);
  EXPECT_EQ(t->Down(ri, 32), Bits(MP_COMM_DTYPE_INT64, 4, src, 1));
  if (W > 1) {
    void *pb = t->Up(Bits(MP_COMM_DTYPE_BF16, 9, g_rank, 2));
    if (g_rank > 0) {
      ASSERT_EQ(mp_comm_recv(&ctx, c, pb, 9, MP_COMM_DTYPE_BF16, g_rank - 1), MP_OK)
          << mp_errmsg(&ctx);
    }
    if (g_rank < W - 1) {
      ASSERT_EQ(mp_comm_send(&ctx, c, pb, 9, MP_COMM_DTYPE_BF16, g_rank + 1), MP_OK)
          << mp_errmsg(&ctx);
    }
    EXPECT_EQ(t->Down(pb, 18), Bits(MP_COMM_DTYPE_BF16, 9, 0, 2));  // rank 0's, passed on
  }
  EXPECT_EQ(mp_comm_synchronize(&ctx, c), MP_OK) << mp_errmsg(&ctx);
}

// ---- NCCL ----

class Nccl : public Gpu {
 protected:
  void SetUp() override {
    Gpu::SetUp();
    if (IsSkipped()) return;
    std::string why;
    if (!NcclRunnable(&why)) GTEST_SKIP() << why;
  }
  mp_comm *Create(const std::string &spec) {
    mp_mesh m = Mesh(spec);
    mp_comm *c = nullptr;
    EXPECT_EQ(mp_comm_create_nccl(&ctx, &m, device, stream, &c), MP_OK) << mp_errmsg(&ctx);
    return c;
  }
};

TEST_F(Nccl, EveryCollectiveAndDtype) {
  int mpi_before = 0;
  MPI_Initialized(&mpi_before);
  const std::string spec = "dp_shard=" + std::to_string(g_world);
  mp_comm *c = Create(spec);
  ASSERT_NE(c, nullptr);
  if (!mpi_before && !g_launched) {
    int now = 1;
    MPI_Initialized(&now);
    EXPECT_EQ(now, 0) << "world size 1 without a launcher must not start MPI";
  }
  EXPECT_STREQ(mp_comm_backend_name(c), "nccl");
  EXPECT_EQ(mp_comm_world_rank(c), g_rank);
  // dp_shard, dp, fsdp, efsdp and world are the world; the other kinds are single ranks
  EXPECT_EQ(mp_comm_nccl_comm_count(c), g_world == 1 ? 1 : 2);
  EveryCollective(this, c, Mesh(spec));
  mp_comm_destroy(c);
}

TEST_F(Nccl, SplitsEveryGroupKindWhenAsked) {
  setenv("MESHPLAN_NCCL_SPLIT_EVERY_GROUP", "1", 1);
  const std::string spec = "dp_shard=" + std::to_string(g_world);
  mp_comm *c = Create(spec);
  unsetenv("MESHPLAN_NCCL_SPLIT_EVERY_GROUP");
  ASSERT_NE(c, nullptr);
  EXPECT_EQ(mp_comm_nccl_comm_count(c), 1 + MP_GROUP_COUNT);
  EveryCollective(this, c, Mesh(spec));
  mp_comm_destroy(c);
}

// Kernel-free ordering check: a chain of large device copies on the compute stream writes
// the input last; the collective must see it (it waits for the compute stream), and the
// read after it (on the compute stream) must see the output.
TEST_F(Nccl, OrderedAgainstTheComputeStream) {
  mp_comm *c = Create("dp_shard=" + std::to_string(g_world));
  ASSERT_NE(c, nullptr);
  const size_t n = 16u << 20, bytes = n * sizeof(float);  // 64 MiB per buffer
  void *a = Zeros(bytes), *b = Zeros(bytes), *d = Zeros(bytes), *src = Zeros(bytes),
       *dst = Zeros(bytes), *out = Zeros(bytes);
  void *full = Zeros(bytes * g_world);
  for (int round = 1; round <= 3; round++) {
    std::vector<float> pat(n);
    for (size_t i = 0; i < n; i++) pat[i] = (float)((i * 7 + round) % 1000);
    ASSERT_EQ(be->memcpy_h2d(&kc, a, pat.data(), bytes), MP_OK);
    ASSERT_EQ(be->memset_zero(&kc, src, bytes), MP_OK);
    ASSERT_EQ(be->memcpy_d2d(&kc, b, a, bytes), MP_OK);  // queued, not waited for
    ASSERT_EQ(be->memcpy_d2d(&kc, d, b, bytes), MP_OK);
    ASSERT_EQ(be->memcpy_d2d(&kc, src, d, bytes), MP_OK);
    ASSERT_EQ(mp_comm_all_reduce(&ctx, c, MP_GROUP_DP_SHARD, src, dst, n, MP_COMM_DTYPE_FP32,
                                 MP_COMM_OP_MAX),
              MP_OK)
        << mp_errmsg(&ctx);
    ASSERT_EQ(be->memcpy_d2d(&kc, out, dst, bytes), MP_OK);  // compute reads the output
    std::vector<float> got(n);
    ASSERT_EQ(be->memcpy_d2h(&kc, got.data(), out, bytes), MP_OK);
    EXPECT_EQ(std::memcmp(got.data(), pat.data(), bytes), 0) << "round " << round;

    // the same through an async batch, waited for before the compute stream reads
    ASSERT_EQ(be->memset_zero(&kc, src, bytes), MP_OK);
    ASSERT_EQ(be->memcpy_d2d(&kc, src, a, bytes), MP_OK);
    mp_comm_req req = {0};
    ASSERT_EQ(mp_comm_async_begin(&ctx, c), MP_OK);
    ASSERT_EQ(mp_comm_all_gather(&ctx, c, MP_GROUP_DP_SHARD, src, full, n, MP_COMM_DTYPE_FP32),
              MP_OK)
        << mp_errmsg(&ctx);
    ASSERT_EQ(mp_comm_async_end(&ctx, c, &req), MP_OK);
    EXPECT_NE(req.seq, 0u);
    ASSERT_EQ(be->memcpy_d2d(&kc, b, d, bytes), MP_OK);  // unrelated compute meanwhile
    ASSERT_EQ(mp_comm_wait(&ctx, c, &req), MP_OK) << mp_errmsg(&ctx);
    ASSERT_EQ(be->memcpy_d2d(&kc, out, (char *)full + (size_t)g_rank * bytes, bytes), MP_OK);
    ASSERT_EQ(be->memcpy_d2h(&kc, got.data(), out, bytes), MP_OK);
    EXPECT_EQ(std::memcmp(got.data(), pat.data(), bytes), 0) << "async round " << round;
  }
  EXPECT_EQ(mp_comm_synchronize(&ctx, c), MP_OK) << mp_errmsg(&ctx);
  mp_comm_destroy(c);
}

TEST_F(Nccl, AsyncRequests) {
  mp_comm *c = Create("dp_shard=" + std::to_string(g_world));
  ASSERT_NE(c, nullptr);
  mp_comm_req zero = {0}, r1 = {0}, r2 = {0}, empty = {5};
  EXPECT_EQ(mp_comm_wait(&ctx, c, &zero), MP_OK);
  std::vector<int> v(1000);
  for (int i = 0; i < 1000; i++) v[i] = i % 7;
  void *x = Up(Small(MP_COMM_DTYPE_FP32, v)), *y = Zeros(4000), *z = Zeros(4000 * g_world);
  ASSERT_EQ(mp_comm_async_begin(&ctx, c), MP_OK);
  EXPECT_EQ(mp_comm_async_begin(&ctx, c), MP_ERR_INVALID);
  ASSERT_EQ(mp_comm_all_reduce(&ctx, c, MP_GROUP_WORLD, x, y, 1000, MP_COMM_DTYPE_FP32,
                               MP_COMM_OP_MAX),
            MP_OK);
  ASSERT_EQ(mp_comm_async_end(&ctx, c, &r1), MP_OK);
  ASSERT_EQ(mp_comm_async_begin(&ctx, c), MP_OK);
  ASSERT_EQ(mp_comm_all_gather(&ctx, c, MP_GROUP_FSDP, y, z, 1000, MP_COMM_DTYPE_FP32), MP_OK);
  ASSERT_EQ(mp_comm_async_end(&ctx, c, &r2), MP_OK);
  EXPECT_GT(r1.seq, 0u);
  EXPECT_GT(r2.seq, r1.seq);
  ASSERT_EQ(mp_comm_async_begin(&ctx, c), MP_OK);
  ASSERT_EQ(mp_comm_async_end(&ctx, c, &empty), MP_OK);
  EXPECT_EQ(empty.seq, 0u) << "an empty batch has nothing to wait for";
  // out of order and twice
  ASSERT_EQ(mp_comm_wait(&ctx, c, &r2), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_comm_wait(&ctx, c, &r1), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_comm_wait(&ctx, c, &r2), MP_OK) << mp_errmsg(&ctx);
  std::vector<uint8_t> want;
  for (int q = 0; q < g_world; q++) {
    std::vector<uint8_t> b = Small(MP_COMM_DTYPE_FP32, v);
    want.insert(want.end(), b.begin(), b.end());
  }
  EXPECT_EQ(Down(z, 4000 * g_world), want);
  EXPECT_EQ(mp_comm_synchronize(&ctx, c), MP_OK);
  EXPECT_EQ(mp_comm_wait(&ctx, c, &r1), MP_OK);  // complete by now
  mp_comm_req bogus = {r2.seq + 1000};
  EXPECT_EQ(mp_comm_wait(&ctx, c, &bogus), MP_ERR_INVALID);
  EXPECT_EQ(mp_comm_async_end(&ctx, c, &r1), MP_ERR_INVALID);
  // many batches never waited for: the FIFO grows past its first size and synchronize
  // completes them all
  for (int i = 0; i < 300; i++) {
    mp_comm_req r;
    ASSERT_EQ(mp_comm_async_begin(&ctx, c), MP_OK);
    ASSERT_EQ(mp_comm_all_reduce(&ctx, c, MP_GROUP_TP, x, y, 1000, MP_COMM_DTYPE_FP32,
                                 MP_COMM_OP_SUM),
              MP_OK);
    ASSERT_EQ(mp_comm_async_end(&ctx, c, &r), MP_OK);
  }
  EXPECT_EQ(mp_comm_synchronize(&ctx, c), MP_OK) << mp_errmsg(&ctx);
  mp_comm_destroy(c);
}

#ifdef MP_HAVE_CUDA
void CUDART_CB Sleep3s(void *) { sleep(3); }
#endif

// A collective that cannot start (its compute stream is held by a 3 s host callback) with
// a 1 s timeout: synchronize must give up, name the rank, the collective and the group,
// abort, and every later call must fail at once.
TEST_F(Nccl, TimeoutNamesRankCollectiveAndGroup) {
#ifndef MP_HAVE_CUDA
  GTEST_SKIP() << "not built with CUDA";
#else
  if (g_world != 1) GTEST_SKIP() << "world size 1 only (the other ranks would not stall)";
  setenv("MESHPLAN_COMM_TIMEOUT_S", "1", 1);
  mp_comm *c = Create("dp_shard=1");
  unsetenv("MESHPLAN_COMM_TIMEOUT_S");
  ASSERT_NE(c, nullptr);
  void *x = Zeros(4096), *y = Zeros(4096);
  ASSERT_EQ(cudaLaunchHostFunc((cudaStream_t)stream, Sleep3s, nullptr), cudaSuccess);
  ASSERT_EQ(mp_comm_all_gather(&ctx, c, MP_GROUP_DP_SHARD, x, y, 1024, MP_COMM_DTYPE_FP32),
            MP_OK)
      << "issuing must not wait";
  EXPECT_EQ(mp_comm_synchronize(&ctx, c), MP_ERR_NCCL);
  std::string msg = mp_errmsg(&ctx);
  EXPECT_NE(msg.find("rank 0: all_gather of 1024 fp32 elements on group dp_shard (world rank 0) "
                     "did not complete within 1 s: a peer rank died or is stuck"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("MESHPLAN_COMM_TIMEOUT_S"), std::string::npos) << msg;
  EXPECT_NE(msg.find("the NCCL communicators were aborted"), std::string::npos) << msg;
  EXPECT_EQ(mp_comm_all_reduce(&ctx, c, MP_GROUP_TP, x, y, 1, MP_COMM_DTYPE_FP32,
                               MP_COMM_OP_SUM),
            MP_ERR_NCCL);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("aborted after an earlier failure"),
            std::string::npos)
      << mp_errmsg(&ctx);
  EXPECT_EQ(mp_comm_synchronize(&ctx, c), MP_ERR_NCCL);
  mp_comm_destroy(c);
  EXPECT_EQ(be->synchronize(&kc), MP_OK) << mp_errmsg(&err);  // the stream drains
#endif
}

TEST_F(Gpu, NcclRefusedWhenRanksShareAGpu) {
  if (!mp_comm_nccl_built()) GTEST_SKIP() << "built without NCCL";
  if (mp_cuda_device_count() >= g_world) GTEST_SKIP() << "every rank has its own GPU";
  mp_mesh m = Mesh("dp_shard=" + std::to_string(g_world));
  mp_comm *c = reinterpret_cast<mp_comm *>(&m);
  EXPECT_EQ(mp_comm_create_nccl(&ctx, &m, device, stream, &c), MP_ERR_UNSUPPORTED);
  EXPECT_EQ(c, nullptr);
  std::string want = std::to_string(g_world) + " ranks share " +
                     std::to_string(mp_cuda_device_count()) + " GPU";
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find(want), std::string::npos) << mp_errmsg(&ctx);
}

// ---- staged backends on the real CUDA backend ----

TEST_F(Gpu, SingleStagedEveryCollective) {
  if (g_world != 1) GTEST_SKIP() << "world size 1 only";
  mp_mesh m = Mesh("tp=1");
  mp_comm *c = nullptr;
  ASSERT_EQ(mp_comm_create_single_staged(&ctx, &m, be, &kc, &c), MP_OK) << mp_errmsg(&ctx);
  EveryCollective(this, c, m);
  mp_comm_destroy(c);
}

TEST_F(Gpu, MpiStagedEveryCollective) {
  const std::string spec = "dp_shard=" + std::to_string(g_world);
  mp_mesh m = Mesh(spec);
  mp_comm *c = nullptr;
  ASSERT_EQ(mp_comm_create_mpi_staged(&ctx, &m, be, &kc, &c), MP_OK) << mp_errmsg(&ctx);
  EXPECT_STREQ(mp_comm_backend_name(c), "mpi-staged");
  EveryCollective(this, c, m);
  mp_comm_destroy(c);
}

// Inexact fp32 and bf16 sums: "mpi-staged" on CUDA memory gives the bits "mpi" gives on
// host memory.
TEST_F(Gpu, MpiStagedIsBitwiseMpi) {
  mp_mesh m = Mesh("dp_shard=" + std::to_string(g_world));
  mp_comm *host = nullptr, *dev = nullptr;
  ASSERT_EQ(mp_comm_create_mpi(&ctx, &m, &host), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_comm_create_mpi_staged(&ctx, &m, be, &kc, &dev), MP_OK) << mp_errmsg(&ctx);
  const size_t n = 4099;
  std::vector<float> f(n);
  std::vector<uint16_t> h(n);
  for (size_t i = 0; i < n; i++) {
    f[i] = 1.0f / (float)(3 + g_rank * 7 + (int)i) + 1e-3f * (float)i;
    h[i] = mp_bf16_from_f32(f[i] * 37.0f);
  }
  std::vector<float> fr(n);
  std::vector<uint16_t> hr(n);
  ASSERT_EQ(mp_comm_all_reduce(&ctx, host, MP_GROUP_WORLD, f.data(), fr.data(), n,
                               MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM),
            MP_OK);
  ASSERT_EQ(mp_comm_all_reduce(&ctx, host, MP_GROUP_WORLD, h.data(), hr.data(), n,
                               MP_COMM_DTYPE_BF16, MP_COMM_OP_SUM),
            MP_OK);
  std::vector<uint8_t> fb(n * 4), hb(n * 2);
  std::memcpy(fb.data(), f.data(), fb.size());
  std::memcpy(hb.data(), h.data(), hb.size());
  void *df = Up(fb), *dh = Up(hb), *dfr = Zeros(n * 4), *dhr = Zeros(n * 2);
  ASSERT_EQ(mp_comm_all_reduce(&ctx, dev, MP_GROUP_WORLD, df, dfr, n, MP_COMM_DTYPE_FP32,
                               MP_COMM_OP_SUM),
            MP_OK);
  ASSERT_EQ(mp_comm_all_reduce(&ctx, dev, MP_GROUP_WORLD, dh, dhr, n, MP_COMM_DTYPE_BF16,
                               MP_COMM_OP_SUM),
            MP_OK);
  std::vector<uint8_t> got_f = Down(dfr, n * 4), got_h = Down(dhr, n * 2);
  EXPECT_EQ(std::memcmp(got_f.data(), fr.data(), n * 4), 0);
  EXPECT_EQ(std::memcmp(got_h.data(), hr.data(), n * 2), 0);
  mp_comm_destroy(dev);
  mp_comm_destroy(host);
}

// ---- selection ----

TEST_F(Gpu, SelectionForCuda) {
  mp_mesh m = Mesh("dp_shard=" + std::to_string(g_world));
  char notice[256] = "x";
  mp_comm *c = nullptr;
  ASSERT_EQ(mp_comm_create_for_device(&ctx, &m, 1, be, &kc, stream, &c, notice, sizeof notice),
            MP_OK)
      << mp_errmsg(&ctx);
  std::string why;
  const bool nccl = NcclRunnable(&why);
  const std::string name = mp_comm_backend_name(c);
  if (nccl) {
    EXPECT_EQ(name, "nccl");
    EXPECT_STREQ(notice, "");
  } else if (!mp_comm_nccl_built()) {
    EXPECT_EQ(name, g_launched ? "mpi-staged" : "single-staged");
    EXPECT_NE(std::string(notice).find("this build has no NCCL"), std::string::npos) << notice;
  } else {  // ranks share the GPU
    EXPECT_EQ(name, "mpi-staged");
    std::string want = std::to_string(g_world) + " ranks share " +
                       std::to_string(mp_cuda_device_count()) + " GPU";
    EXPECT_NE(std::string(notice).find(want + (mp_cuda_device_count() == 1 ? "" : "s") +
                                       " on this node; NCCL refuses two ranks of one "
                                       "communicator on one GPU, so collectives go through MPI "
                                       "with host staging"),
              std::string::npos)
        << notice;
  }
  // it works: a world all-reduce of each rank's number
  std::vector<int> one = {g_rank + 1};
  void *d = Up(Small(MP_COMM_DTYPE_INT64, one));
  ASSERT_EQ(mp_comm_all_reduce(&ctx, c, MP_GROUP_WORLD, d, d, 1, MP_COMM_DTYPE_INT64,
                               MP_COMM_OP_SUM),
            MP_OK)
      << mp_errmsg(&ctx);
  ASSERT_EQ(mp_comm_synchronize(&ctx, c), MP_OK);
  EXPECT_EQ(Down(d, 8), Small(MP_COMM_DTYPE_INT64, {g_world * (g_world + 1) / 2}));
  mp_comm_destroy(c);

  setenv("MESHPLAN_NO_NCCL", "1", 1);
  ASSERT_EQ(mp_comm_create_for_device(&ctx, &m, 1, be, &kc, stream, &c, notice, sizeof notice),
            MP_OK)
      << mp_errmsg(&ctx);
  unsetenv("MESHPLAN_NO_NCCL");
  EXPECT_STREQ(mp_comm_backend_name(c), g_launched ? "mpi-staged" : "single-staged");
  mp_comm_destroy(c);
}

}  // namespace

int main(int argc, char **argv) {
  return mp_test::MpiMain(&argc, &argv, "comm_gpu_test", true, &g_rank, &g_world, &g_launched);
}
