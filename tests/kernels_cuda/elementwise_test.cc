// The non-GEMM CUDA kernels (kernels/cuda/{elementwise,norm,rope,moe,loss,optim,fp8}.cu,
// the float8 transpose of matmul.cu and the conversions in backend.cu) against the CPU
// reference backend.
//
// Method, for every op: fresh random inputs at several shapes, ragged ones included
// (N = 1, 7, 333; C not a multiple of 32), rounded through bf16 first so both backends see
// the same values (the CPU in fp32, the GPU as bf16 X tensors). Outputs that an op writes
// (=) are poisoned with 0xFF bytes (NaN for bf16 and fp32, -1 for int32) before the GPU
// run, so an element the kernel forgets stays NaN and fails. Outputs an op accumulates
// into (+=) start from the same random prior on both sides, scaled like the op's own
// contribution (rms of the CPU result from zero), so a kernel that overwrites instead of
// adding, or adds the wrong amount, moves the result by O(1) relative. Comparison is the
// relative L2 error ||gpu - cpu|| / ||cpu|| under a per-op bound, and any NaN fails:
//   bf16 outputs   1e-2: one bf16 rounding of the result is 2^-9 relative (~2e-3 worst,
//                  ~1e-3 rms), plus fp32 accumulation order; 1e-2 leaves 5x margin and
//                  is still far below what a wrong formula gives.
//   fp32 outputs   1e-5 unless stated: fp32 reductions in a different order than the
//                  CPU's double ones; the error grows like eps * sqrt(terms) ~ 1e-6.
//   copies, maxima, int32 outputs, float8 codes: exact.
// Memory-bound kernels have a 16-byte vector path and a scalar path chosen by alignment and
// shape; the *VectorPath* tests pick shapes and pointer offsets that take each of them
// (offsets of 0 or 8 elements keep 16-byte alignment, 1 element breaks it), and lengths
// that leave ragged tails, against the same CPU reference and bounds.
// The fused amax ops are checked against their plain op plus f8_amax bit for bit (see the
// section "fused amax").
// Without a CUDA device (or without a CUDA build) every test skips.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "common/status.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda.h"
#include "kernels/ops.h"

namespace {

using Vec = std::vector<float>;
using IVec = std::vector<int32_t>;

float bf(float x) { return mp_bf16_to_f32(mp_bf16_from_f32(x)); }

// Uniform [lo, hi), rounded through bf16.
Vec rnd(size_t n, float lo, float hi, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  Vec v(n);
  for (auto &x : v) x = bf(d(g));
  return v;
}

IVec rnd_int(size_t n, int lo, int hi, uint64_t seed) {  // [lo, hi)
  std::mt19937_64 g(seed);
  std::uniform_int_distribution<int> d(lo, hi - 1);
  IVec v(n);
  for (auto &x : v) x = d(g);
  return v;
}

double rms(const Vec &v) {
  double s = 0.0;
  for (float x : v) s += (double)x * x;
  return v.empty() ? 0.0 : std::sqrt(s / v.size());
}

// A random prior for a += output, on the scale of the op's own contribution `delta`.
Vec prior_like(const Vec &delta, uint64_t seed) {
  float r = (float)std::max(rms(delta), 1e-3);
  return rnd(delta.size(), -r, r, seed);
}

// Relative L2 error of got against ref, failing on any NaN in either.
::testing::AssertionResult Close(const std::string &what, const Vec &got, const Vec &ref,
                                 double bound) {
  if (got.size() != ref.size())
    return ::testing::AssertionFailure() << what << ": size " << got.size() << " vs "
                                         << ref.size();
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); i++) {
    if (std::isnan(got[i]))
      return ::testing::AssertionFailure() << what << ": NaN at " << i << " (unwritten or "
                                           << "wrong); reference " << ref[i];
    if (std::isnan(ref[i]))
      return ::testing::AssertionFailure() << what << ": reference NaN at " << i;
    double d = (double)got[i] - ref[i];
    num += d * d;
    den += (double)ref[i] * ref[i];
  }
  double rel = den > 0.0 ? std::sqrt(num / den) : std::sqrt(num);
  if (rel <= bound) return ::testing::AssertionSuccess();
  size_t worst = 0;
  for (size_t i = 0; i < got.size(); i++)
    if (std::fabs(got[i] - ref[i]) > std::fabs(got[worst] - ref[worst])) worst = i;
  return ::testing::AssertionFailure()
         << what << ": relative L2 error " << rel << " > bound " << bound << "; worst at "
         << worst << ": gpu " << got[worst] << " cpu " << ref[worst];
}

template <typename T>
::testing::AssertionResult Same(const std::string &what, const std::vector<T> &got,
                                const std::vector<T> &ref) {
  if (got.size() != ref.size()) return ::testing::AssertionFailure() << what << ": size";
  for (size_t i = 0; i < got.size(); i++)
    if (got[i] != ref[i])
      return ::testing::AssertionFailure() << what << ": differs at " << i << ": gpu "
                                           << (long long)got[i] << " cpu "
                                           << (long long)ref[i];
  return ::testing::AssertionSuccess();
}

class CudaOps : public ::testing::Test {
 protected:
  void SetUp() override {
    if (mp_cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (or no CUDA build)";
    mp_ctx_init(&ctx_);
    g_ = mp_cuda_backend();
    c_ = mp_backend_cpu();
    ASSERT_NE(g_, nullptr);
    gk_.err = &ctx_;
    ck_.err = &ctx_;
    ASSERT_EQ(g_->init(&gk_, 0), MP_OK) << mp_errmsg(&ctx_);
    ASSERT_EQ(c_->init(&ck_, 0), MP_OK) << mp_errmsg(&ctx_);
    ready_ = true;
  }
  void TearDown() override {
    if (!ready_) return;
    for (void *p : bufs_) g_->free(&gk_, p);
    g_->shutdown(&gk_);
  }

  // Checks a status; after a GPU op also synchronizes so asynchronous faults surface here.
  void Ok(mp_status s) { ASSERT_EQ(s, MP_OK) << mp_errmsg(&ctx_); }
  void Gpu(mp_status s) {
    ASSERT_EQ(s, MP_OK) << mp_errmsg(&ctx_);
    ASSERT_EQ(g_->synchronize(&gk_), MP_OK) << mp_errmsg(&ctx_);
  }

  void *Dev(size_t bytes) {
    void *p = nullptr;
    EXPECT_EQ(g_->alloc(&gk_, &p, bytes), MP_OK) << mp_errmsg(&ctx_);
    bufs_.push_back(p);
    return p;
  }
  void *X(const Vec &v) {
    void *p = Dev(v.size() * 2);
    Ok(g_->to_device_f32(&gk_, p, v.data(), v.size()));
    return p;
  }
  float *F(const Vec &v) {
    float *p = (float *)Dev(v.size() * 4);
    Ok(g_->memcpy_h2d(&gk_, p, v.data(), v.size() * 4));
    return p;
  }
  int32_t *I(const IVec &v) {
    int32_t *p = (int32_t *)Dev(v.size() * 4);
    Ok(g_->memcpy_h2d(&gk_, p, v.data(), v.size() * 4));
    return p;
  }
  void *Poison(size_t bytes) {
    void *p = Dev(bytes);
    std::vector<uint8_t> ff(bytes, 0xFF);
    Ok(g_->memcpy_h2d(&gk_, p, ff.data(), bytes));
    return p;
  }
  void *PX(size_t n) { return Poison(n * 2); }
  float *PF(size_t n) { return (float *)Poison(n * 4); }
  int32_t *PI(size_t n) { return (int32_t *)Poison(n * 4); }
  // An X tensor starting `off` elements into its allocation: off 0 or 8 keeps it 16-byte
  // aligned (vector paths), off 1 makes it 2-byte aligned only (scalar paths).
  void *XAt(const Vec &v, size_t off) {
    char *p = (char *)Dev((v.size() + off) * 2) + off * 2;
    Ok(g_->to_device_f32(&gk_, p, v.data(), v.size()));
    return p;
  }
  void *PXAt(size_t n, size_t off) { return (char *)Poison((n + off) * 2) + off * 2; }
  float *FAt(const Vec &v, size_t off) {
    float *p = (float *)Dev((v.size() + off) * 4) + off;
    Ok(g_->memcpy_h2d(&gk_, p, v.data(), v.size() * 4));
    return p;
  }
  Vec GetX(const void *p, size_t n) {
    Vec v(n);
    Ok(g_->from_device_f32(&gk_, v.data(), p, n));
    return v;
  }
  Vec GetF(const float *p, size_t n) {
    Vec v(n);
    Ok(g_->memcpy_d2h(&gk_, v.data(), p, n * 4));
    return v;
  }
  IVec GetI(const int32_t *p, size_t n) {
    IVec v(n);
    Ok(g_->memcpy_d2h(&gk_, v.data(), p, n * 4));
    return v;
  }

  mp_ctx ctx_;
  mp_kctx gk_ = {nullptr, nullptr, 0}, ck_ = {nullptr, nullptr, 0};
  const mp_backend *g_ = nullptr, *c_ = nullptr;
  bool ready_ = false;
  std::vector<void *> bufs_;
};

// ---- conversions ----------------------------------------------------------------------

TEST_F(CudaOps, ConversionsRoundToNearestEvenLikeTheHostHelper) {
  // More than one 8 MiB staging chunk (2^21 floats), and values that are not bf16 already,
  // so the device rounding must equal mp_bf16_from_f32 bit for bit.
  for (size_t n : {size_t(1), size_t(333), (size_t(1) << 21) + 7}) {
    std::mt19937_64 g(n);
    std::uniform_real_distribution<float> d(-3.0f, 3.0f);
    Vec h(n), want(n);
    for (size_t i = 0; i < n; i++) {
      h[i] = d(g);
      want[i] = bf(h[i]);
    }
    void *x = PX(n);
    Ok(g_->to_device_f32(&gk_, x, h.data(), n));
    EXPECT_TRUE(Close("to/from_device_f32", GetX(x, n), want, 0.0)) << n;
    float *src = F(h), *back = PF(n);
    void *x2 = PX(n);
    Gpu(g_->x_from_f32(&gk_, x2, src, n));
    Gpu(g_->x_to_f32(&gk_, back, x2, n));
    EXPECT_TRUE(Close("x_from_f32/x_to_f32", GetF(back, n), want, 0.0)) << n;
  }
}

// ---- embedding --------------------------------------------------------------------------

TEST_F(CudaOps, EmbeddingForwardBackwardWholeAndVocabParallel) {
  struct S { int N, C, V, vs, ve; } shapes[] = {
      {1, 7, 5, 0, 5}, {7, 45, 11, 0, 11}, {333, 101, 50, 10, 30}};
  uint64_t seed = 1;
  for (auto s : shapes) {
    int rows = s.ve - s.vs;
    Vec wte = rnd((size_t)rows * s.C, -1, 1, seed++);
    IVec tok = rnd_int(s.N, 0, s.V, seed++);
    Vec ref((size_t)s.N * s.C);
    Ok(c_->embedding_forward(&ck_, ref.data(), tok.data(), wte.data(), s.N, s.C, s.vs, s.ve));
    void *out = PX((size_t)s.N * s.C);
    Gpu(g_->embedding_forward(&gk_, out, I(tok), X(wte), s.N, s.C, s.vs, s.ve));
    // A copy of bf16 values (or zeros): exact.
    EXPECT_TRUE(Close("embedding_forward", GetX(out, ref.size()), ref, 0.0)) << s.N;

    Vec dout = rnd((size_t)s.N * s.C, -1, 1, seed++);
    Vec delta(wte.size(), 0.0f);
    Ok(c_->embedding_backward(&ck_, delta.data(), dout.data(), tok.data(), s.N, s.C, s.vs,
                              s.ve));
    Vec dw = prior_like(delta, seed++), dref = dw;
    Ok(c_->embedding_backward(&ck_, dref.data(), dout.data(), tok.data(), s.N, s.C, s.vs,
                              s.ve));
    float *ddw = F(dw);
    Gpu(g_->embedding_backward(&gk_, ddw, X(dout), I(tok), s.N, s.C, s.vs, s.ve));
    // fp32 atomics: the same terms in another order.
    EXPECT_TRUE(Close("embedding_backward", GetF(ddw, dw.size()), dref, 1e-5)) << s.N;
  }
}

// ---- normalisation ----------------------------------------------------------------------

TEST_F(CudaOps, LayerNormForwardBackward) {
  struct S { int N, C; bool bias; } shapes[] = {
      {1, 7, true}, {7, 45, false}, {333, 200, true}, {5, 1031, true}};
  uint64_t seed = 100;
  for (auto s : shapes) {
    size_t nc = (size_t)s.N * s.C;
    // Offset mean so the centring matters.
    Vec x = rnd(nc, -1.5f, 2.5f, seed++), w = rnd(s.C, 0.5f, 1.5f, seed++);
    Vec b = rnd(s.C, -0.5f, 0.5f, seed++);
    const float eps = 1e-5f;
    Vec out(nc), mean(s.N), rstd(s.N);
    Ok(c_->layernorm_forward(&ck_, out.data(), mean.data(), rstd.data(), x.data(), w.data(),
                             s.bias ? b.data() : nullptr, s.N, s.C, eps));
    void *dx_in = X(x), *dw_in = X(w), *db_in = X(b);
    void *gout = PX(nc);
    float *gmean = PF(s.N), *grstd = PF(s.N);
    Gpu(g_->layernorm_forward(&gk_, gout, gmean, grstd, dx_in, dw_in, s.bias ? db_in : nullptr,
                              s.N, s.C, eps));
    EXPECT_TRUE(Close("layernorm out", GetX(gout, nc), out, 1e-2)) << s.N << "x" << s.C;
    EXPECT_TRUE(Close("layernorm mean", GetF(gmean, s.N), mean, 1e-5)) << s.C;
    EXPECT_TRUE(Close("layernorm rstd", GetF(grstd, s.N), rstd, 1e-5)) << s.C;

    Vec dout = rnd(nc, -1, 1, seed++);
    Vec zdx(nc, 0.0f), zdw(s.C, 0.0f), zdb(s.C, 0.0f);
    Ok(c_->layernorm_backward(&ck_, zdx.data(), zdw.data(), zdb.data(), dout.data(), x.data(),
                              w.data(), mean.data(), rstd.data(), s.N, s.C));
    Vec dx0 = prior_like(zdx, seed++), dw0 = prior_like(zdw, seed++),
        db0 = prior_like(zdb, seed++);
    Vec rdx = dx0, rdw = dw0, rdb = db0;
    Ok(c_->layernorm_backward(&ck_, rdx.data(), rdw.data(), rdb.data(), dout.data(), x.data(),
                              w.data(), mean.data(), rstd.data(), s.N, s.C));
    void *gdx = X(dx0);
    float *gdw = F(dw0), *gdb = F(db0);
    // Saved statistics from the CPU forward go to both backends: the backward is tested
    // on identical inputs.
    Gpu(g_->layernorm_backward(&gk_, gdx, gdw, gdb, X(dout), dx_in, dw_in, F(mean), F(rstd),
                               s.N, s.C));
    EXPECT_TRUE(Close("layernorm dx", GetX(gdx, nc), rdx, 1e-2)) << s.N << "x" << s.C;
    EXPECT_TRUE(Close("layernorm dw", GetF(gdw, s.C), rdw, 1e-5)) << s.N << "x" << s.C;
    EXPECT_TRUE(Close("layernorm db", GetF(gdb, s.C), rdb, 1e-5)) << s.N << "x" << s.C;
  }
}

TEST_F(CudaOps, RmsNormForwardBackward) {
  struct S { int N, C; } shapes[] = {{1, 7}, {7, 45}, {333, 200}, {5, 1031}};
  uint64_t seed = 200;
  for (auto s : shapes) {
    size_t nc = (size_t)s.N * s.C;
    Vec x = rnd(nc, -2, 2, seed++), w = rnd(s.C, 0.5f, 1.5f, seed++);
    const float eps = 1e-6f;
    Vec out(nc), rstd(s.N);
    Ok(c_->rmsnorm_forward(&ck_, out.data(), rstd.data(), x.data(), w.data(), s.N, s.C, eps));
    void *gx = X(x), *gw = X(w), *gout = PX(nc);
    float *grstd = PF(s.N);
    Gpu(g_->rmsnorm_forward(&gk_, gout, grstd, gx, gw, s.N, s.C, eps));
    EXPECT_TRUE(Close("rmsnorm out", GetX(gout, nc), out, 1e-2)) << s.N << "x" << s.C;
    EXPECT_TRUE(Close("rmsnorm rstd", GetF(grstd, s.N), rstd, 1e-5)) << s.C;

    Vec dout = rnd(nc, -1, 1, seed++);
    Vec zdx(nc, 0.0f), zdw(s.C, 0.0f);
    Ok(c_->rmsnorm_backward(&ck_, zdx.data(), zdw.data(), dout.data(), x.data(), w.data(),
                            rstd.data(), s.N, s.C));
    Vec dx0 = prior_like(zdx, seed++), dw0 = prior_like(zdw, seed++);
    Vec rdx = dx0, rdw = dw0;
    Ok(c_->rmsnorm_backward(&ck_, rdx.data(), rdw.data(), dout.data(), x.data(), w.data(),
                            rstd.data(), s.N, s.C));
    void *gdx = X(dx0);
    float *gdw = F(dw0);
    Gpu(g_->rmsnorm_backward(&gk_, gdx, gdw, X(dout), gx, gw, F(rstd), s.N, s.C));
    EXPECT_TRUE(Close("rmsnorm dx", GetX(gdx, nc), rdx, 1e-2)) << s.N << "x" << s.C;
    EXPECT_TRUE(Close("rmsnorm dw", GetF(gdw, s.C), rdw, 1e-5)) << s.N << "x" << s.C;
  }
}

// Row lengths that take every vector-path variant: a warp per row holding 1..16 vectors
// a lane (C 256..4096), a block per row (C 8192), the backward's grid-stride over more
// rows than its 1024 blocks (N 1100) with several chunks of partial column sums; and the
// scalar path through a 2-byte offset.
TEST_F(CudaOps, NormVectorPathShapesAndOffsets) {
  struct S { int N, C; size_t off; } shapes[] = {
      {64, 2048, 0}, {3, 4096, 8}, {2, 8192, 0}, {1100, 256, 0}, {17, 2048, 1}, {9, 48, 8}};
  uint64_t seed = 250;
  for (auto s : shapes) {
    for (int ln = 0; ln < 2; ln++) {
      const std::string at = std::string(ln ? "layernorm " : "rmsnorm ") +
                              std::to_string(s.N) + "x" + std::to_string(s.C) + " off " +
                              std::to_string(s.off);
      size_t nc = (size_t)s.N * s.C;
      Vec x = rnd(nc, -1.5f, 2.5f, seed++), w = rnd(s.C, 0.5f, 1.5f, seed++);
      Vec b = rnd(s.C, -0.5f, 0.5f, seed++);
      const float eps = 1e-5f;
      Vec out(nc), mean(s.N), rstd(s.N);
      if (ln)
        Ok(c_->layernorm_forward(&ck_, out.data(), mean.data(), rstd.data(), x.data(),
                                 w.data(), b.data(), s.N, s.C, eps));
      else
        Ok(c_->rmsnorm_forward(&ck_, out.data(), rstd.data(), x.data(), w.data(), s.N, s.C,
                               eps));
      void *gx = XAt(x, s.off), *gw = XAt(w, s.off), *gb = XAt(b, s.off);
      void *gout = PXAt(nc, s.off);
      float *gmean = PF(s.N), *grstd = PF(s.N);
      if (ln)
        Gpu(g_->layernorm_forward(&gk_, gout, gmean, grstd, gx, gw, gb, s.N, s.C, eps));
      else
        Gpu(g_->rmsnorm_forward(&gk_, gout, grstd, gx, gw, s.N, s.C, eps));
      EXPECT_TRUE(Close("out", GetX(gout, nc), out, 1e-2)) << at;
      EXPECT_TRUE(Close("rstd", GetF(grstd, s.N), rstd, 1e-5)) << at;
      if (ln) {
        EXPECT_TRUE(Close("mean", GetF(gmean, s.N), mean, 1e-5)) << at;
      }

      Vec dout = rnd(nc, -1, 1, seed++);
      Vec zdx(nc, 0.0f), zdw(s.C, 0.0f), zdb(s.C, 0.0f);
      if (ln)
        Ok(c_->layernorm_backward(&ck_, zdx.data(), zdw.data(), zdb.data(), dout.data(),
                                  x.data(), w.data(), mean.data(), rstd.data(), s.N, s.C));
      else
        Ok(c_->rmsnorm_backward(&ck_, zdx.data(), zdw.data(), dout.data(), x.data(), w.data(),
                                rstd.data(), s.N, s.C));
      Vec dx0 = prior_like(zdx, seed++), dw0 = prior_like(zdw, seed++),
          db0 = prior_like(zdb, seed++);
      Vec rdx = dx0, rdw = dw0, rdb = db0;
      if (ln)
        Ok(c_->layernorm_backward(&ck_, rdx.data(), rdw.data(), rdb.data(), dout.data(),
                                  x.data(), w.data(), mean.data(), rstd.data(), s.N, s.C));
      else
        Ok(c_->rmsnorm_backward(&ck_, rdx.data(), rdw.data(), dout.data(), x.data(), w.data(),
                                rstd.data(), s.N, s.C));
      void *gdx = XAt(dx0, s.off), *gdout = XAt(dout, s.off);
      float *gdw = F(dw0), *gdb = F(db0);
      if (ln)
        Gpu(g_->layernorm_backward(&gk_, gdx, gdw, gdb, gdout, gx, gw, F(mean), F(rstd), s.N,
                                   s.C));
      else
        Gpu(g_->rmsnorm_backward(&gk_, gdx, gdw, gdout, gx, gw, F(rstd), s.N, s.C));
      EXPECT_TRUE(Close("dx", GetX(gdx, nc), rdx, 1e-2)) << at;
      EXPECT_TRUE(Close("dw", GetF(gdw, s.C), rdw, 1e-5)) << at;
      if (ln) {
        EXPECT_TRUE(Close("db", GetF(gdb, s.C), rdb, 1e-5)) << at;
      }

      // Parameter gradients alone (dx NULL), and dx alone (dw NULL): each output is still
      // right and the other is not touched.
      Vec rdw2 = dw0;
      if (ln) {
        Vec rdb2 = db0;
        Ok(c_->layernorm_backward(&ck_, nullptr, rdw2.data(), rdb2.data(), dout.data(),
                                  x.data(), w.data(), mean.data(), rstd.data(), s.N, s.C));
        float *gdw2 = F(dw0), *gdb2 = F(db0);
        Gpu(g_->layernorm_backward(&gk_, nullptr, gdw2, gdb2, gdout, gx, gw, F(mean),
                                   F(rstd), s.N, s.C));
        EXPECT_TRUE(Close("dw only", GetF(gdw2, s.C), rdw2, 1e-5)) << at;
        EXPECT_TRUE(Close("db only", GetF(gdb2, s.C), rdb2, 1e-5)) << at;
      } else {
        Ok(c_->rmsnorm_backward(&ck_, nullptr, rdw2.data(), dout.data(), x.data(), w.data(),
                                rstd.data(), s.N, s.C));
        float *gdw2 = F(dw0);
        Gpu(g_->rmsnorm_backward(&gk_, nullptr, gdw2, gdout, gx, gw, F(rstd), s.N, s.C));
        EXPECT_TRUE(Close("dw only", GetF(gdw2, s.C), rdw2, 1e-5)) << at;
        void *gdx2 = XAt(dx0, s.off);
        Gpu(g_->rmsnorm_backward(&gk_, gdx2, nullptr, gdout, gx, gw, F(rstd), s.N, s.C));
        EXPECT_TRUE(Close("dx only", GetX(gdx2, nc), rdx, 1e-2)) << at;
      }
    }
  }
}

// ---- RoPE ---------------------------------------------------------------------------------

TEST_F(CudaOps, RopeForwardInPlaceAndBackward) {
  struct S { int B, T, nh, hd; } shapes[] = {{1, 1, 1, 2}, {2, 7, 3, 10}, {1, 33, 5, 64}};
  uint64_t seed = 300;
  for (auto s : shapes) {
    size_t n = (size_t)s.B * s.T * s.nh * s.hd;
    Vec cs((size_t)s.T * s.hd / 2), sn(cs.size());
    mp_rope_tables(cs.data(), sn.data(), s.T, s.hd, 10000.0f, 3);
    Vec x = rnd(n, -1, 1, seed++), out(n);
    Ok(c_->rope_forward(&ck_, out.data(), x.data(), cs.data(), sn.data(), s.B, s.T, s.nh,
                        s.hd));
    float *gc = F(cs), *gs = F(sn);
    void *gx = X(x), *gout = PX(n);
    Gpu(g_->rope_forward(&gk_, gout, gx, gc, gs, s.B, s.T, s.nh, s.hd));
    EXPECT_TRUE(Close("rope out", GetX(gout, n), out, 1e-2)) << s.T << "x" << s.hd;
    Gpu(g_->rope_forward(&gk_, gx, gx, gc, gs, s.B, s.T, s.nh, s.hd));  // in place
    EXPECT_TRUE(Close("rope in place", GetX(gx, n), out, 1e-2)) << s.T << "x" << s.hd;

    Vec dout = rnd(n, -1, 1, seed++), zdx(n, 0.0f);
    Ok(c_->rope_backward(&ck_, zdx.data(), dout.data(), cs.data(), sn.data(), s.B, s.T, s.nh,
                         s.hd));
    Vec dx0 = prior_like(zdx, seed++), rdx = dx0;
    Ok(c_->rope_backward(&ck_, rdx.data(), dout.data(), cs.data(), sn.data(), s.B, s.T, s.nh,
                         s.hd));
    void *gdx = X(dx0);
    Gpu(g_->rope_backward(&gk_, gdx, X(dout), gc, gs, s.B, s.T, s.nh, s.hd));
    EXPECT_TRUE(Close("rope dx", GetX(gdx, n), rdx, 1e-2)) << s.T << "x" << s.hd;
  }
}

// ---- activations, residual, accumulation ----------------------------------------------------

TEST_F(CudaOps, GeluAndSwigluForwardBackward) {
  uint64_t seed = 400;
  for (size_t n : {size_t(1), size_t(7), size_t(333), size_t(100003)}) {
    Vec x = rnd(n, -5, 5, seed++), up = rnd(n, -2, 2, seed++), dout = rnd(n, -1, 1, seed++);
    void *gx = X(x), *gup = X(up), *gdout = X(dout);
    Vec out(n);
    Ok(c_->gelu_forward(&ck_, out.data(), x.data(), n));
    void *gout = PX(n);
    Gpu(g_->gelu_forward(&gk_, gout, gx, n));
    EXPECT_TRUE(Close("gelu out", GetX(gout, n), out, 1e-2)) << n;

    Vec z(n, 0.0f);
    Ok(c_->gelu_backward(&ck_, z.data(), dout.data(), x.data(), n));
    Vec dx0 = prior_like(z, seed++), rdx = dx0;
    Ok(c_->gelu_backward(&ck_, rdx.data(), dout.data(), x.data(), n));
    void *gdx = X(dx0);
    Gpu(g_->gelu_backward(&gk_, gdx, gdout, gx, n));
    EXPECT_TRUE(Close("gelu dx", GetX(gdx, n), rdx, 1e-2)) << n;

    Ok(c_->swiglu_forward(&ck_, out.data(), x.data(), up.data(), n));
    gout = PX(n);
    Gpu(g_->swiglu_forward(&gk_, gout, gx, gup, n));
    EXPECT_TRUE(Close("swiglu out", GetX(gout, n), out, 1e-2)) << n;

    Vec zg(n, 0.0f), zu(n, 0.0f);
    Ok(c_->swiglu_backward(&ck_, zg.data(), zu.data(), dout.data(), x.data(), up.data(), n));
    Vec dg0 = prior_like(zg, seed++), du0 = prior_like(zu, seed++);
    Vec rdg = dg0, rdu = du0;
    Ok(c_->swiglu_backward(&ck_, rdg.data(), rdu.data(), dout.data(), x.data(), up.data(), n));
    void *gdg = X(dg0), *gdu = X(du0);
    Gpu(g_->swiglu_backward(&gk_, gdg, gdu, gdout, gx, gup, n));
    EXPECT_TRUE(Close("swiglu dgate", GetX(gdg, n), rdg, 1e-2)) << n;
    EXPECT_TRUE(Close("swiglu dup", GetX(gdu, n), rdu, 1e-2)) << n;
    // One gradient not wanted: the other is still right and NULL is not touched.
    void *gdg2 = X(dg0);
    Gpu(g_->swiglu_backward(&gk_, gdg2, nullptr, gdout, gx, gup, n));
    EXPECT_TRUE(Close("swiglu dgate only", GetX(gdg2, n), rdg, 1e-2)) << n;
  }
}

TEST_F(CudaOps, ResidualAccumulateAndScale) {
  uint64_t seed = 500;
  for (size_t n : {size_t(1), size_t(7), size_t(333), size_t(100003)}) {
    Vec a = rnd(n, -1, 1, seed++), b = rnd(n, -1, 1, seed++), out(n);
    Ok(c_->residual_forward(&ck_, out.data(), a.data(), b.data(), n));
    void *ga = X(a), *gb = X(b), *gout = PX(n);
    Gpu(g_->residual_forward(&gk_, gout, ga, gb, n));
    EXPECT_TRUE(Close("residual", GetX(gout, n), out, 1e-2)) << n;

    Vec y = a;
    Ok(c_->accumulate(&ck_, y.data(), b.data(), n));
    Gpu(g_->accumulate(&gk_, ga, gb, n));
    EXPECT_TRUE(Close("accumulate", GetX(ga, n), y, 1e-2)) << n;

    // fp32: one fp32 add per element, the same as the CPU's: exact.
    Vec fa = rnd(n, -1, 1, seed++), fb = rnd(n, -1e-3f, 1e-3f, seed++), fy = fa;
    Ok(c_->accumulate_f32(&ck_, fy.data(), fb.data(), n));
    float *gfa = F(fa);
    Gpu(g_->accumulate_f32(&gk_, gfa, F(fb), n));
    EXPECT_TRUE(Close("accumulate_f32", GetF(gfa, n), fy, 0.0)) << n;

    Ok(c_->scale_f32(&ck_, fy.data(), n, 0.37f));
    Gpu(g_->scale_f32(&gk_, gfa, n, 0.37f));
    EXPECT_TRUE(Close("scale_f32", GetF(gfa, n), fy, 0.0)) << n;  // one fp32 multiply
  }
}

// The vector paths of the activation, residual and accumulation ops (16-byte aligned
// operands; n = 100003 leaves a tail of 3) and their scalar fallbacks (one operand 2 bytes
// off), against the CPU with the bounds above.
TEST_F(CudaOps, ElementwiseVectorPathAndOffsets) {
  const size_t n = 100003;
  uint64_t seed = 450;
  struct O { size_t in, out; } offs[] = {{0, 0}, {8, 0}, {0, 8}, {1, 0}, {0, 1}};
  for (auto o : offs) {
    const std::string at = "offsets in " + std::to_string(o.in) + " out " +
                           std::to_string(o.out);
    Vec x = rnd(n, -5, 5, seed++), up = rnd(n, -2, 2, seed++), dout = rnd(n, -1, 1, seed++);
    void *gx = XAt(x, o.in), *gup = XAt(up, o.in), *gdout = XAt(dout, o.in);
    Vec ref(n);
    Ok(c_->swiglu_forward(&ck_, ref.data(), x.data(), up.data(), n));
    void *gout = PXAt(n, o.out);
    Gpu(g_->swiglu_forward(&gk_, gout, gx, gup, n));
    EXPECT_TRUE(Close("swiglu out", GetX(gout, n), ref, 1e-2)) << at;

    Vec zg(n, 0.0f), zu(n, 0.0f);
    Ok(c_->swiglu_backward(&ck_, zg.data(), zu.data(), dout.data(), x.data(), up.data(), n));
    Vec dg0 = prior_like(zg, seed++), du0 = prior_like(zu, seed++), rdg = dg0, rdu = du0;
    Ok(c_->swiglu_backward(&ck_, rdg.data(), rdu.data(), dout.data(), x.data(), up.data(), n));
    void *gdg = XAt(dg0, o.out), *gdu = XAt(du0, o.out);
    Gpu(g_->swiglu_backward(&gk_, gdg, gdu, gdout, gx, gup, n));
    EXPECT_TRUE(Close("swiglu dgate", GetX(gdg, n), rdg, 1e-2)) << at;
    EXPECT_TRUE(Close("swiglu dup", GetX(gdu, n), rdu, 1e-2)) << at;
    void *gdu2 = XAt(du0, o.out);
    Gpu(g_->swiglu_backward(&gk_, nullptr, gdu2, gdout, gx, gup, n));
    EXPECT_TRUE(Close("swiglu dup only", GetX(gdu2, n), rdu, 1e-2)) << at;

    Ok(c_->gelu_forward(&ck_, ref.data(), x.data(), n));
    gout = PXAt(n, o.out);
    Gpu(g_->gelu_forward(&gk_, gout, gx, n));
    EXPECT_TRUE(Close("gelu out", GetX(gout, n), ref, 1e-2)) << at;
    Vec z(n, 0.0f);
    Ok(c_->gelu_backward(&ck_, z.data(), dout.data(), x.data(), n));
    Vec dx0 = prior_like(z, seed++), rdx = dx0;
    Ok(c_->gelu_backward(&ck_, rdx.data(), dout.data(), x.data(), n));
    void *gdx = XAt(dx0, o.out);
    Gpu(g_->gelu_backward(&gk_, gdx, gdout, gx, n));
    EXPECT_TRUE(Close("gelu dx", GetX(gdx, n), rdx, 1e-2)) << at;

    Ok(c_->residual_forward(&ck_, ref.data(), x.data(), up.data(), n));
    gout = PXAt(n, o.out);
    Gpu(g_->residual_forward(&gk_, gout, gx, gup, n));
    EXPECT_TRUE(Close("residual", GetX(gout, n), ref, 1e-2)) << at;
    Vec y = dout;
    Ok(c_->accumulate(&ck_, y.data(), up.data(), n));
    void *gy = XAt(dout, o.out);
    Gpu(g_->accumulate(&gk_, gy, gup, n));
    EXPECT_TRUE(Close("accumulate", GetX(gy, n), y, 1e-2)) << at;

    Vec fa = rnd(n, -1, 1, seed++), fb = rnd(n, -1e-3f, 1e-3f, seed++), fy = fa;
    Ok(c_->accumulate_f32(&ck_, fy.data(), fb.data(), n));
    float *gfa = FAt(fa, o.out);
    Gpu(g_->accumulate_f32(&gk_, gfa, FAt(fb, o.in), n));
    EXPECT_TRUE(Close("accumulate_f32", GetF(gfa, n), fy, 0.0)) << at;  // one add: exact
  }
}

// ---- MoE router, plan, permute -------------------------------------------------------------

TEST_F(CudaOps, RouterForwardBackwardAndAuxLoss) {
  struct S { int N, E, k, norm; } shapes[] = {
      {1, 4, 1, 0}, {7, 8, 2, 1}, {333, 60, 4, 1}, {64, 33, 3, 0}};
  uint64_t seed = 600;
  for (auto s : shapes) {
    size_t ne = (size_t)s.N * s.E, nk = (size_t)s.N * s.k;
    // bf16 logits repeat values, so exact probability ties occur and exercise the
    // lower-index-first rule; distinct bf16 logits differ far beyond fp32 rounding, so the
    // top-k sets must agree exactly.
    Vec logits = rnd(ne, -3, 3, seed++);
    Vec probs(ne), tw(nk);
    IVec idx(nk);
    Ok(c_->router_forward(&ck_, probs.data(), idx.data(), tw.data(), logits.data(), s.N, s.E,
                          s.k, s.norm));
    float *gp = PF(ne), *gtw = PF(nk);
    int32_t *gidx = PI(nk);
    Gpu(g_->router_forward(&gk_, gp, gidx, gtw, X(logits), s.N, s.E, s.k, s.norm));
    EXPECT_TRUE(Same("router topk_idx", GetI(gidx, nk), idx)) << s.N << "x" << s.E;
    EXPECT_TRUE(Close("router probs", GetF(gp, ne), probs, 1e-5)) << s.N << "x" << s.E;
    EXPECT_TRUE(Close("router topk_w", GetF(gtw, nk), tw, 1e-5)) << s.N << "x" << s.E;

    // Backward on the CPU's forward results, with and without dprobs.
    Vec dtw = rnd(nk, -1, 1, seed++), dprobs = rnd(ne, -0.5f, 0.5f, seed++);
    for (int with_dprobs = 0; with_dprobs < 2; with_dprobs++) {
      const float *dp = with_dprobs ? dprobs.data() : nullptr;
      Vec z(ne, 0.0f);
      Ok(c_->router_backward(&ck_, z.data(), dtw.data(), dp, probs.data(), idx.data(), s.N,
                             s.E, s.k, s.norm));
      Vec d0 = prior_like(z, seed++), rd = d0;
      Ok(c_->router_backward(&ck_, rd.data(), dtw.data(), dp, probs.data(), idx.data(), s.N,
                             s.E, s.k, s.norm));
      void *gd = X(d0);
      Gpu(g_->router_backward(&gk_, gd, F(dtw), with_dprobs ? F(dprobs) : nullptr, F(probs),
                              I(idx), s.N, s.E, s.k, s.norm));
      EXPECT_TRUE(Close("router dlogits", GetX(gd, ne), rd, 1e-2))
          << s.N << "x" << s.E << " dprobs " << with_dprobs;
    }

    float aux = 0.0f;
    Vec f(s.E);
    Ok(c_->router_aux_loss_forward(&ck_, &aux, f.data(), probs.data(), idx.data(), s.N, s.E,
                                   s.k));
    float *gaux = PF(1), *gf = PF(s.E);
    Gpu(g_->router_aux_loss_forward(&gk_, gaux, gf, F(probs), I(idx), s.N, s.E, s.k));
    EXPECT_TRUE(Close("aux f", GetF(gf, s.E), f, 0.0)) << s.E;  // count / N, same division
    EXPECT_TRUE(Close("aux loss", GetF(gaux, 1), Vec{aux}, 1e-6)) << s.E;  // double inside

    Vec dpr0 = rnd(ne, -1, 1, seed++), rdpr = dpr0;
    Ok(c_->router_aux_loss_backward(&ck_, rdpr.data(), f.data(), 0.01f, s.N, s.E));
    float *gdpr = F(dpr0);
    Gpu(g_->router_aux_loss_backward(&gk_, gdpr, F(f), 0.01f, s.N, s.E));
    EXPECT_TRUE(Close("aux dprobs", GetF(gdpr, ne), rdpr, 1e-6)) << s.E;
  }
}

TEST_F(CudaOps, MoePlanPermuteUnpermute) {
  struct S { int N, E, k, C; } shapes[] = {
      {1, 4, 1, 7}, {7, 8, 2, 45}, {333, 60, 4, 33}, {1000, 7, 2, 5}};
  uint64_t seed = 700;
  for (auto s : shapes) {
    size_t nk = (size_t)s.N * s.k;
    // Any valid expert indices (repeats within a token included): the plan must be the
    // CPU's stable counting sort exactly. 1000 x 2 pairs span several 256-pair chunks.
    IVec idx = rnd_int(nk, 0, s.E, seed++);
    IVec perm(nk), inv(nk), counts(s.E);
    Ok(c_->moe_plan(&ck_, perm.data(), inv.data(), counts.data(), idx.data(), s.N, s.E, s.k));
    int32_t *gperm = PI(nk), *ginv = PI(nk), *gcounts = PI(s.E);
    Gpu(g_->moe_plan(&gk_, gperm, ginv, gcounts, I(idx), s.N, s.E, s.k));
    EXPECT_TRUE(Same("moe_plan perm", GetI(gperm, nk), perm)) << s.N;
    EXPECT_TRUE(Same("moe_plan inv", GetI(ginv, nk), inv)) << s.N;
    EXPECT_TRUE(Same("moe_plan counts", GetI(gcounts, s.E), counts)) << s.N;

    size_t nc = (size_t)s.N * s.C, rc = nk * s.C;
    Vec x = rnd(nc, -1, 1, seed++), out(rc);
    Ok(c_->permute_forward(&ck_, out.data(), x.data(), perm.data(), s.N, s.k, s.C));
    void *gout = PX(rc);
    int32_t *dperm = I(perm), *dinv = I(inv);
    Gpu(g_->permute_forward(&gk_, gout, X(x), dperm, s.N, s.k, s.C));
    EXPECT_TRUE(Close("permute out", GetX(gout, rc), out, 0.0)) << s.N;  // a gather: exact

    Vec dout = rnd(rc, -1, 1, seed++), z(nc, 0.0f);
    Ok(c_->permute_backward(&ck_, z.data(), dout.data(), inv.data(), s.N, s.k, s.C));
    Vec dx0 = prior_like(z, seed++), rdx = dx0;
    Ok(c_->permute_backward(&ck_, rdx.data(), dout.data(), inv.data(), s.N, s.k, s.C));
    void *gdx = X(dx0);
    Gpu(g_->permute_backward(&gk_, gdx, X(dout), dinv, s.N, s.k, s.C));
    EXPECT_TRUE(Close("permute dx", GetX(gdx, nc), rdx, 1e-2)) << s.N;

    Vec y = rnd(rc, -1, 1, seed++), tw = rnd(nk, 0, 1, seed++), uo(nc);
    Ok(c_->unpermute_forward(&ck_, uo.data(), y.data(), tw.data(), inv.data(), s.N, s.k, s.C));
    void *guo = PX(nc), *gy = X(y);
    float *gtw = F(tw);
    Gpu(g_->unpermute_forward(&gk_, guo, gy, gtw, dinv, s.N, s.k, s.C));
    EXPECT_TRUE(Close("unpermute out", GetX(guo, nc), uo, 1e-2)) << s.N;

    Vec ud = rnd(nc, -1, 1, seed++), zdy(rc, 0.0f), zdw(nk, 0.0f);
    Ok(c_->unpermute_backward(&ck_, zdy.data(), zdw.data(), ud.data(), y.data(), tw.data(),
                              inv.data(), s.N, s.k, s.C));
    Vec dy0 = prior_like(zdy, seed++), dw0 = prior_like(zdw, seed++);
    Vec rdy = dy0, rdw = dw0;
    Ok(c_->unpermute_backward(&ck_, rdy.data(), rdw.data(), ud.data(), y.data(), tw.data(),
                              inv.data(), s.N, s.k, s.C));
    void *gdy = X(dy0);
    float *gdw = F(dw0);
    Gpu(g_->unpermute_backward(&gk_, gdy, gdw, X(ud), gy, gtw, dinv, s.N, s.k, s.C));
    EXPECT_TRUE(Close("unpermute dy", GetX(gdy, rc), rdy, 1e-2)) << s.N;
    // Dot products of C bf16 products in fp32 (CPU: double): ~eps * sqrt(C).
    EXPECT_TRUE(Close("unpermute dtopk_w", GetF(gdw, nk), rdw, 1e-5)) << s.N;
  }
}

// ---- cross-entropy -------------------------------------------------------------------------

TEST_F(CudaOps, CrossEntropyFusedVocabParallelAndBackward) {
  struct S { int N, V; } shapes[] = {{1, 5}, {7, 333}, {33, 5003}};
  uint64_t seed = 800;
  for (auto s : shapes) {
    size_t nv = (size_t)s.N * s.V;
    Vec logits = rnd(nv, -4, 4, seed++);
    IVec tgt = rnd_int(s.N, 0, s.V, seed++);
    if (s.N > 2) tgt[2] = -1;  // ignored row
    Vec losses(s.N), lse(s.N);
    float mean = 0.0f;
    Ok(c_->cross_entropy_forward(&ck_, losses.data(), &mean, lse.data(), logits.data(),
                                 tgt.data(), s.N, s.V));
    void *gl = X(logits);
    int32_t *gt = I(tgt);
    float *glosses = PF(s.N), *gmean = PF(1), *glse = PF(s.N);
    Gpu(g_->cross_entropy_forward(&gk_, glosses, gmean, glse, gl, gt, s.N, s.V));
    EXPECT_TRUE(Close("ce losses", GetF(glosses, s.N), losses, 1e-5)) << s.V;
    EXPECT_TRUE(Close("ce loss_mean", GetF(gmean, 1), Vec{mean}, 1e-5)) << s.V;
    EXPECT_TRUE(Close("ce lse", GetF(glse, s.N), lse, 1e-5)) << s.V;

    // Vocab-parallel pieces on one shard [vs, vs + Vl), same inputs on both backends.
    int vs = s.V / 3, Vl = s.V - vs;
    Vec shard((size_t)s.N * Vl);
    for (int n = 0; n < s.N; n++)
      for (int v = 0; v < Vl; v++) shard[(size_t)n * Vl + v] = logits[(size_t)n * s.V + vs + v];
    void *gsh = X(shard);
    Vec lmax(s.N), lsum(s.N), ltgt(s.N);
    Ok(c_->ce_local_max(&ck_, lmax.data(), shard.data(), s.N, Vl));
    float *glmax = PF(s.N);
    Gpu(g_->ce_local_max(&gk_, glmax, gsh, s.N, Vl));
    EXPECT_TRUE(Close("ce_local_max", GetF(glmax, s.N), lmax, 0.0)) << s.V;  // exact
    Vec gmax_in = rnd(s.N, 3.0f, 4.0f, seed++);  // a "global" max at or above the local one
    for (int n = 0; n < s.N; n++) gmax_in[n] = std::max(gmax_in[n], lmax[n]);
    Ok(c_->ce_local_sumexp(&ck_, lsum.data(), shard.data(), gmax_in.data(), s.N, Vl));
    float *glsum = PF(s.N), *dgmax = F(gmax_in);
    Gpu(g_->ce_local_sumexp(&gk_, glsum, gsh, dgmax, s.N, Vl));
    EXPECT_TRUE(Close("ce_local_sumexp", GetF(glsum, s.N), lsum, 1e-5)) << s.V;
    Ok(c_->ce_local_target(&ck_, ltgt.data(), shard.data(), tgt.data(), s.N, Vl, vs));
    float *gltgt = PF(s.N);
    Gpu(g_->ce_local_target(&gk_, gltgt, gsh, gt, s.N, Vl, vs));
    EXPECT_TRUE(Close("ce_local_target", GetF(gltgt, s.N), ltgt, 0.0)) << s.V;  // a copy

    Vec closs(s.N), clse(s.N);
    float cmean = 0.0f;
    Ok(c_->ce_vp_combine(&ck_, closs.data(), &cmean, clse.data(), gmax_in.data(), lsum.data(),
                         ltgt.data(), tgt.data(), s.N));
    float *gcl = PF(s.N), *gcm = PF(1), *gcz = PF(s.N);
    Gpu(g_->ce_vp_combine(&gk_, gcl, gcm, gcz, dgmax, F(lsum), F(ltgt), gt, s.N));
    EXPECT_TRUE(Close("ce_vp_combine losses", GetF(gcl, s.N), closs, 1e-5)) << s.V;
    EXPECT_TRUE(Close("ce_vp_combine mean", GetF(gcm, 1), Vec{cmean}, 1e-5)) << s.V;
    EXPECT_TRUE(Close("ce_vp_combine lse", GetF(gcz, s.N), clse, 1e-5)) << s.V;

    // Backward, whole vocabulary and on the shard, with the global lse.
    float dloss = 1.0f / s.N;
    struct B { const Vec *l; void *gl; int Vl, vs; } bs[] = {{&logits, gl, s.V, 0},
                                                           {&shard, gsh, Vl, vs}};
    float *dlse = F(lse);
    for (auto b : bs) {
      size_t m = (size_t)s.N * b.Vl;
      Vec z(m, 0.0f);
      Ok(c_->ce_backward(&ck_, z.data(), b.l->data(), lse.data(), tgt.data(), dloss, s.N, b.Vl,
                         b.vs));
      Vec d0 = prior_like(z, seed++), rd = d0;
      Ok(c_->ce_backward(&ck_, rd.data(), b.l->data(), lse.data(), tgt.data(), dloss, s.N,
                         b.Vl, b.vs));
      void *gd = X(d0);
      Gpu(g_->ce_backward(&gk_, gd, b.gl, dlse, gt, dloss, s.N, b.Vl, b.vs));
      EXPECT_TRUE(Close("ce dlogits", GetX(gd, m), rd, 1e-2)) << s.V << " vs " << b.vs;
    }
  }
}

// Large vocabularies through the one-pass forward (16-byte aligned rows at V = 32000, rows
// of every alignment at V = 50257), with rows built to stress the running max: ascending
// (a new max in every vector, so the sum is rescaled each time), descending, one huge
// logit, and constant. The backward runs on the vector rows and, with dlogits 2 bytes off
// the logits' alignment, on the elementwise fallback.
TEST_F(CudaOps, CrossEntropyVectorPathLargeVocab) {
  struct S { int N, V; } shapes[] = {{16, 32000}, {6, 50257}};
  uint64_t seed = 850;
  for (auto s : shapes) {
    size_t nv = (size_t)s.N * s.V;
    Vec logits = rnd(nv, -8, 8, seed++);
    std::sort(logits.begin(), logits.begin() + s.V);                          // row 0 ascending
    std::sort(logits.begin() + s.V, logits.begin() + 2 * (size_t)s.V, std::greater<float>());
    logits[2 * (size_t)s.V + s.V / 2] = 60.0f;                                 // row 2: one spike
    for (int v = 0; v < s.V; v++) logits[3 * (size_t)s.V + v] = -3.0f;         // row 3: flat
    IVec tgt = rnd_int(s.N, 0, s.V, seed++);
    tgt[1] = -1;  // ignored row
    tgt[2] = s.V / 2;
    Vec losses(s.N), lse(s.N);
    float mean = 0.0f;
    Ok(c_->cross_entropy_forward(&ck_, losses.data(), &mean, lse.data(), logits.data(),
                                 tgt.data(), s.N, s.V));
    void *gl = X(logits);
    int32_t *gt = I(tgt);
    float *glosses = PF(s.N), *gmean = PF(1), *glse = PF(s.N);
    Gpu(g_->cross_entropy_forward(&gk_, glosses, gmean, glse, gl, gt, s.N, s.V));
    EXPECT_TRUE(Close("ce losses", GetF(glosses, s.N), losses, 1e-5)) << s.V;
    EXPECT_TRUE(Close("ce loss_mean", GetF(gmean, 1), Vec{mean}, 1e-5)) << s.V;
    EXPECT_TRUE(Close("ce lse", GetF(glse, s.N), lse, 1e-5)) << s.V;

    Vec lmax(s.N), lsum(s.N);
    Ok(c_->ce_local_max(&ck_, lmax.data(), logits.data(), s.N, s.V));
    float *glmax = PF(s.N);
    Gpu(g_->ce_local_max(&gk_, glmax, gl, s.N, s.V));
    EXPECT_TRUE(Close("ce_local_max", GetF(glmax, s.N), lmax, 0.0)) << s.V;
    Ok(c_->ce_local_sumexp(&ck_, lsum.data(), logits.data(), lmax.data(), s.N, s.V));
    float *glsum = PF(s.N);
    Gpu(g_->ce_local_sumexp(&gk_, glsum, gl, F(lmax), s.N, s.V));
    EXPECT_TRUE(Close("ce_local_sumexp", GetF(glsum, s.N), lsum, 1e-5)) << s.V;

    float dloss = 1.0f / s.N;
    Vec zd(nv, 0.0f);
    Ok(c_->ce_backward(&ck_, zd.data(), logits.data(), lse.data(), tgt.data(), dloss, s.N, s.V,
                       0));
    Vec d0 = prior_like(zd, seed++), rd = d0;
    Ok(c_->ce_backward(&ck_, rd.data(), logits.data(), lse.data(), tgt.data(), dloss, s.N, s.V,
                       0));
    for (size_t off : {size_t(0), size_t(1)}) {
      void *gd = XAt(d0, off);
      Gpu(g_->ce_backward(&gk_, gd, gl, F(lse), gt, dloss, s.N, s.V, 0));
      EXPECT_TRUE(Close("ce dlogits", GetX(gd, nv), rd, 1e-2)) << s.V << " off " << off;
    }
  }
}

// ---- optimizer and gradient norm ------------------------------------------------------------

TEST_F(CudaOps, AdamWMatchesTheCpuStep) {
  uint64_t seed = 900;
  for (size_t n : {size_t(1), size_t(7), size_t(333), size_t(100003)}) {
    for (int step : {1, 7}) {
      Vec p = rnd(n, -1, 1, seed++), g = rnd(n, -1, 1, seed++), m = rnd(n, -0.1f, 0.1f, seed++);
      Vec v = rnd(n, 0, 0.01f, seed++);
      Vec rp = p, rm = m, rv = v;
      const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
      Ok(c_->adamw_update(&ck_, rp.data(), g.data(), rm.data(), rv.data(), n, lr, b1, b2, eps,
                          wd, step, gs));
      float *gp = F(p), *gm = F(m), *gv = F(v);
      Gpu(g_->adamw_update(&gk_, gp, F(g), gm, gv, n, lr, b1, b2, eps, wd, step, gs));
      Vec op = GetF(gp, n);
      // fp32 throughout on both; FMA contraction on the GPU moves the last bit.
      EXPECT_TRUE(Close("adamw m", GetF(gm, n), rm, 1e-6)) << n;
      EXPECT_TRUE(Close("adamw v", GetF(gv, n), rv, 1e-6)) << n;
      EXPECT_TRUE(Close("adamw param", op, rp, 1e-6)) << n;
      // The update itself (~lr), which the param comparison alone would dilute: its error
      // is dominated by the ulp of |p| ~ 1 over lr: 1.2e-7 / 1e-2 ~ 1e-5.
      Vec dg(n), dr(n);
      for (size_t i = 0; i < n; i++) {
        dg[i] = op[i] - p[i];
        dr[i] = rp[i] - p[i];
      }
      EXPECT_TRUE(Close("adamw update", dg, dr, 1e-4)) << n << " step " << step;
    }
  }
}

TEST_F(CudaOps, SumSquaresIsAccurateAndDeterministic) {
  uint64_t seed = 1000;
  for (size_t n : {size_t(1), size_t(7), size_t(333), (size_t(1) << 20) + 3}) {
    Vec x = rnd(n, -1, 1, seed++);
    float ref = 1.5f;
    Ok(c_->sum_squares(&ck_, &ref, x.data(), n));
    float *gx = F(x), *gs = F(Vec{1.5f}), *gs2 = F(Vec{1.5f});
    Gpu(g_->sum_squares(&gk_, gs, gx, n));
    Gpu(g_->sum_squares(&gk_, gs2, gx, n));
    Vec a = GetF(gs, 1), b = GetF(gs2, 1);
    // Both sum in double and round once: within an ulp or two of fp32.
    EXPECT_TRUE(Close("sum_squares", a, Vec{ref}, 1e-6)) << n;
    EXPECT_EQ(std::memcmp(a.data(), b.data(), 4), 0) << "not deterministic at n=" << n;
  }
}

// ---- float8 ------------------------------------------------------------------------------------

TEST_F(CudaOps, Float8CastsMatchTheCpuEncoding) {
  uint64_t seed = 1100;
  for (mp_f8_format fmt : {MP_F8_E4M3, MP_F8_E5M2}) {
    for (size_t n : {size_t(1), size_t(7), size_t(333), size_t(100003)}) {
      // Values over many binades (subnormals of the format after scaling included).
      std::mt19937_64 g(seed++);
      std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
      std::uniform_int_distribution<int> ex(-20, 4);
      Vec x(n);
      for (auto &v : x) v = bf(std::ldexp(mant(g), ex(g)));
      void *gx = X(x);

      float amax = 0.0f, scale = 0.0f;
      Ok(c_->f8_amax(&ck_, &amax, x.data(), n));
      float *gamax = PF(1), *gscale = PF(1);
      Gpu(g_->f8_amax(&gk_, gamax, gx, n));
      EXPECT_TRUE(Close("f8_amax", GetF(gamax, 1), Vec{amax}, 0.0)) << n;  // a max: exact
      Ok(c_->f8_scale_from_amax(&ck_, &scale, &amax, fmt));
      Gpu(g_->f8_scale_from_amax(&gk_, gscale, gamax, fmt));
      EXPECT_TRUE(Close("f8_scale", GetF(gscale, 1), Vec{scale}, 0.0)) << n;  // one division

      // Codes: exact, with the dynamic scale and with 4x that scale (saturation).
      for (float mul : {1.0f, 4.0f}) {
        float s = scale * mul;
        float *ds = F(Vec{s});
        std::vector<uint8_t> codes(n);
        Ok(c_->f8_quantize(&ck_, codes.data(), x.data(), &s, n, fmt));
        uint8_t *gc = (uint8_t *)Poison(n);
        Gpu(g_->f8_quantize(&gk_, gc, gx, ds, n, fmt));
        std::vector<uint8_t> got(n);
        Ok(g_->memcpy_d2h(&gk_, got.data(), gc, n));
        EXPECT_TRUE(Same("f8_quantize codes", got, codes)) << n << " fmt " << fmt << " x" << mul;

        // Dequantize the CPU's codes: decode / s, rounded to bf16 once.
        Vec deq(n);
        Ok(c_->f8_dequantize(&ck_, deq.data(), codes.data(), &s, n, fmt));
        uint8_t *dc = (uint8_t *)Dev(n);
        Ok(g_->memcpy_h2d(&gk_, dc, codes.data(), n));
        void *gdeq = PX(n);
        Gpu(g_->f8_dequantize(&gk_, gdeq, dc, ds, n, fmt));
        EXPECT_TRUE(Close("f8_dequantize", GetX(gdeq, n), deq, 1e-2)) << n << " fmt " << fmt;

        Vec fq(n);
        Ok(c_->f8_fake_quantize(&ck_, fq.data(), x.data(), &s, n, fmt));
        void *gfq = PX(n);
        Gpu(g_->f8_fake_quantize(&gk_, gfq, gx, ds, n, fmt));
        EXPECT_TRUE(Close("f8_fake_quantize", GetX(gfq, n), fq, 1e-2)) << n << " fmt " << fmt;
      }
    }
  }
}

TEST_F(CudaOps, Float8SpecialValues) {
  // Zeros, infinities (saturate), NaN (the format's NaN code), values at and beyond max,
  // the smallest subnormals and exact rounding ties, scale 1.
  const float specials[] = {0.0f, -0.0f, INFINITY, -INFINITY, NAN, 448.0f, 464.0f, 480.0f,
                            -1e6f, 57344.0f, 61440.0f, 1e-9f, 0.001953125f, 0.0009765625f,
                            -0.0029296875f, 1.0625f, 1.1875f, 3.0e-5f, 1.52587890625e-05f,
                            2.25f, 2.75f};
  Vec x;
  for (float v : specials) x.push_back(bf(v));
  size_t n = x.size();
  for (mp_f8_format fmt : {MP_F8_E4M3, MP_F8_E5M2}) {
    float s = 1.0f;
    std::vector<uint8_t> codes(n), got(n);
    Ok(c_->f8_quantize(&ck_, codes.data(), x.data(), &s, n, fmt));
    uint8_t *gc = (uint8_t *)Poison(n);
    Gpu(g_->f8_quantize(&gk_, gc, X(x), F(Vec{s}), n, fmt));
    Ok(g_->memcpy_d2h(&gk_, got.data(), gc, n));
    EXPECT_TRUE(Same("f8 special codes", got, codes)) << "fmt " << fmt;
    // Independent of the CPU: NaN gives the canonical NaN, inf saturates to max.
    EXPECT_EQ(got[4], fmt == MP_F8_E4M3 ? 0x7F : 0x7E);
    EXPECT_EQ(mp_f8_decode(got[2], fmt), mp_f8_max(fmt));
    EXPECT_EQ(mp_f8_decode(got[3], fmt), -mp_f8_max(fmt));
    float amax = 0.0f;
    float *ga = PF(1);
    Gpu(g_->f8_amax(&gk_, ga, X(x), n));
    amax = GetF(ga, 1)[0];
    EXPECT_TRUE(std::isnan(amax)) << "NaN anywhere must make amax NaN";
  }
}

// ---- fused amax (rmsnorm_forward_amax, swiglu_forward_amax, swiglu_backward_amax) ---------
// Each fused op must be its plain op plus f8_amax of the output as stored, bit for bit: the
// outputs (and rstd) are compared as raw bf16 / fp32 bits with a plain run on the same
// device and inputs, and the amax with f8_amax of the plain output and with the max of the
// stored bits computed on the host (NaN: both NaN). Paths: offsets 0 and 8 elements keep
// every operand 16-byte aligned (vector kernels, with a scalar tail of n % 8 for the
// elementwise ops), offset 1 takes the scalar kernels. A value injected at the first, a
// middle and the last element (the tail on the vector path when n % 8 != 0, the last
// block's last warp for the norms) is made the strict maximum, so a kernel that leaves a
// region or a block out of its amax fails; then a NaN there must give a NaN amax. The amax
// slots start poisoned (0xFF: an unsigned pattern above every float), so a fused op that
// max-combined into the slot without zeroing it first would leave NaN. Against the CPU
// backend's fused ops: outputs within the bf16 bound, the amax within 1e-2 relative (the
// max of bf16-rounded values against the max of the CPU's fp32 ones).

// The raw bits of n bf16 values.
std::vector<uint16_t> BitsOf(const mp_backend *g, mp_kctx *k, const void *p, size_t n) {
  std::vector<uint16_t> b(n);
  EXPECT_EQ(g->synchronize(k), MP_OK);
  EXPECT_EQ(g->memcpy_d2h(k, b.data(), p, n * 2), MP_OK);
  return b;
}

float FloatOfBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// |v| of a stored bf16 pattern, exactly.
float AbsOfBf16(uint16_t b) { return FloatOfBits((uint32_t)(b & 0x7FFFu) << 16); }

// max |v| over stored bf16 patterns, computed on the host: NaN when any is NaN.
float HostAmax(const std::vector<uint16_t> &b) {
  uint32_t m = 0;
  for (uint16_t v : b) m = std::max<uint32_t>(m, v & 0x7FFFu);
  return m > 0x7F80u ? NAN : FloatOfBits(m << 16);
}

// Both NaN, or the same bits.
::testing::AssertionResult SameAmax(const std::string &what, float got, float ref) {
  if (std::isnan(ref) && std::isnan(got)) return ::testing::AssertionSuccess();
  if (std::memcmp(&got, &ref, 4) == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": amax " << got << " vs " << ref;
}

// A value written into an X tensor on the device at element pos.
void PokeX(const mp_backend *g, mp_kctx *k, void *x, size_t pos, float v) {
  EXPECT_EQ(g->to_device_f32(k, (char *)x + pos * 2, &v, 1), MP_OK);
}

TEST_F(CudaOps, SwigluForwardAmaxIsPlainOpPlusF8Amax) {
  ASSERT_NE(g_->swiglu_forward_amax, nullptr);
  ASSERT_NE(c_->swiglu_forward_amax, nullptr);
  uint64_t seed = 1600;
  for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(9), size_t(333), size_t(100003),
                   (size_t(1) << 21) + 13}) {
    // |out| <= 5 sigmoid(5) 2 < 10 for these; the injected 8, 4 gives ~32.
    Vec gate = rnd(n, -5, 5, seed++), up = rnd(n, -2, 2, seed++);
    Vec ref(n);
    float ref_amax = -1.0f;
    Ok(c_->swiglu_forward_amax(&ck_, ref.data(), gate.data(), up.data(), n, &ref_amax));
    for (size_t off : {size_t(0), size_t(8), size_t(1)}) {
      void *gg = XAt(gate, off), *gu = XAt(up, off);
      // One plain and one fused run on the current inputs; returns the fused results.
      auto run = [&](const std::string &at, std::vector<uint16_t> *bits, float *amax) {
        void *o1 = PXAt(n, off), *o2 = PXAt(n, off);
        float *a1 = PF(1), *a2 = PF(1);
        Gpu(g_->swiglu_forward(&gk_, o1, gg, gu, n));
        Gpu(g_->f8_amax(&gk_, a1, o1, n));
        Gpu(g_->swiglu_forward_amax(&gk_, o2, gg, gu, n, a2));
        std::vector<uint16_t> b1 = BitsOf(g_, &gk_, o1, n), b2 = BitsOf(g_, &gk_, o2, n);
        EXPECT_TRUE(Same("swiglu_forward_amax out bits", b2, b1)) << at;
        *amax = GetF(a2, 1)[0];
        EXPECT_TRUE(SameAmax("vs f8_amax", *amax, GetF(a1, 1)[0])) << at;
        EXPECT_TRUE(SameAmax("vs host max of the stored out", *amax, HostAmax(b2))) << at;
        *bits = b2;
        return o2;
      };
      const std::string at = "n " + std::to_string(n) + " offset " + std::to_string(off);
      std::vector<uint16_t> bits;
      float amax = 0.0f;
      void *o2 = run(at, &bits, &amax);
      EXPECT_TRUE(Close("swiglu_forward_amax out vs cpu", GetX(o2, n), ref, 1e-2)) << at;
      EXPECT_TRUE(Close("swiglu_forward_amax amax vs cpu", Vec{amax}, Vec{ref_amax}, 1e-2)) << at;
      for (size_t pos : {size_t(0), n / 2, n - 1}) {
        const std::string ap = at + " injected at " + std::to_string(pos);
        PokeX(g_, &gk_, gg, pos, 8.0f);
        PokeX(g_, &gk_, gu, pos, 4.0f);
        run(ap, &bits, &amax);
        EXPECT_GT(amax, 20.0f) << ap;
        EXPECT_EQ(amax, AbsOfBf16(bits[pos])) << ap << ": the injected maximum is missed";
        PokeX(g_, &gk_, gg, pos, NAN);
        run(ap + " (NaN)", &bits, &amax);
        EXPECT_TRUE(std::isnan(amax)) << ap << ": NaN in the output must make amax NaN";
        PokeX(g_, &gk_, gg, pos, gate[pos]);
        PokeX(g_, &gk_, gu, pos, up[pos]);
      }
    }
  }
  // n == 0: amax is still written, 0 (a max over nothing, as f8_amax gives).
  float *a0 = PF(1);
  Gpu(g_->swiglu_forward_amax(&gk_, nullptr, nullptr, nullptr, 0, a0));
  EXPECT_EQ(GetF(a0, 1)[0], 0.0f);
  EXPECT_EQ(g_->swiglu_forward_amax(&gk_, PX(8), X(Vec(8, 1.0f)), X(Vec(8, 1.0f)), 8, nullptr),
            MP_ERR_INVALID);
}

TEST_F(CudaOps, SwigluBackwardAmaxIsPlainOpPlusF8Amax) {
  ASSERT_NE(g_->swiglu_backward_amax, nullptr);
  ASSERT_NE(c_->swiglu_backward_amax, nullptr);
  uint64_t seed = 1700;
  for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(9), size_t(333), size_t(100003),
                   (size_t(1) << 21) + 13}) {
    Vec gate = rnd(n, -5, 5, seed++), up = rnd(n, -2, 2, seed++), dout = rnd(n, -1, 1, seed++);
    Vec zg(n, 0.0f), zu(n, 0.0f);
    Ok(c_->swiglu_backward(&ck_, zg.data(), zu.data(), dout.data(), gate.data(), up.data(), n));
    // Priors on the scale of the update (|update| < 2 here): +-64 and +-96 injected into
    // them are the strict maxima of the updated gradients.
    const Vec dg0 = prior_like(zg, seed++), du0 = prior_like(zu, seed++);
    Vec rdg = dg0, rdu = du0;
    float ref_ag = -1.0f, ref_au = -1.0f;
    Ok(c_->swiglu_backward_amax(&ck_, rdg.data(), rdu.data(), dout.data(), gate.data(),
                                up.data(), n, &ref_ag, &ref_au));
    for (size_t off : {size_t(0), size_t(8), size_t(1)}) {
      void *gg = XAt(gate, off), *gu = XAt(up, off), *gd = XAt(dout, off);
      // Plain and fused runs from the priors pg, pu; returns the fused outputs.
      auto run = [&](const std::string &at, const Vec &pg, const Vec &pu,
                     std::vector<uint16_t> *bg, std::vector<uint16_t> *bu, float *ag,
                     float *au) {
        void *g1 = XAt(pg, off), *u1 = XAt(pu, off), *g2 = XAt(pg, off), *u2 = XAt(pu, off);
        float *ag1 = PF(1), *au1 = PF(1), *ag2 = PF(1), *au2 = PF(1);
        Gpu(g_->swiglu_backward(&gk_, g1, u1, gd, gg, gu, n));
        Gpu(g_->f8_amax(&gk_, ag1, g1, n));
        Gpu(g_->f8_amax(&gk_, au1, u1, n));
        Gpu(g_->swiglu_backward_amax(&gk_, g2, u2, gd, gg, gu, n, ag2, au2));
        std::vector<uint16_t> bg1 = BitsOf(g_, &gk_, g1, n), bu1 = BitsOf(g_, &gk_, u1, n);
        *bg = BitsOf(g_, &gk_, g2, n);
        *bu = BitsOf(g_, &gk_, u2, n);
        EXPECT_TRUE(Same("swiglu_backward_amax dgate bits", *bg, bg1)) << at;
        EXPECT_TRUE(Same("swiglu_backward_amax dup bits", *bu, bu1)) << at;
        *ag = GetF(ag2, 1)[0];
        *au = GetF(au2, 1)[0];
        EXPECT_TRUE(SameAmax("dgate vs f8_amax", *ag, GetF(ag1, 1)[0])) << at;
        EXPECT_TRUE(SameAmax("dup vs f8_amax", *au, GetF(au1, 1)[0])) << at;
        EXPECT_TRUE(SameAmax("dgate vs host max", *ag, HostAmax(*bg))) << at;
        EXPECT_TRUE(SameAmax("dup vs host max", *au, HostAmax(*bu))) << at;
        return std::make_pair(g2, u2);
      };
      const std::string at = "n " + std::to_string(n) + " offset " + std::to_string(off);
      std::vector<uint16_t> bg, bu;
      float ag = 0.0f, au = 0.0f;
      auto outs = run(at, dg0, du0, &bg, &bu, &ag, &au);
      EXPECT_TRUE(Close("dgate vs cpu", GetX(outs.first, n), rdg, 1e-2)) << at;
      EXPECT_TRUE(Close("dup vs cpu", GetX(outs.second, n), rdu, 1e-2)) << at;
      EXPECT_TRUE(Close("amax dgate vs cpu", Vec{ag}, Vec{ref_ag}, 1e-2)) << at;
      EXPECT_TRUE(Close("amax dup vs cpu", Vec{au}, Vec{ref_au}, 1e-2)) << at;
      for (size_t pos : {size_t(0), n / 2, n - 1}) {
        const std::string ap = at + " injected at " + std::to_string(pos);
        Vec pg = dg0, pu = du0;
        pg[pos] = 64.0f;
        pu[pos] = -96.0f;
        run(ap, pg, pu, &bg, &bu, &ag, &au);
        EXPECT_GT(ag, 60.0f) << ap;
        EXPECT_GT(au, 90.0f) << ap;
        EXPECT_EQ(ag, AbsOfBf16(bg[pos])) << ap << ": dgate's injected maximum is missed";
        EXPECT_EQ(au, AbsOfBf16(bu[pos])) << ap << ": dup's injected maximum is missed";
        // NaN in dgate only: its amax is NaN, dup's stays finite (the slots are separate).
        pg[pos] = NAN;
        run(ap + " (NaN in dgate)", pg, pu, &bg, &bu, &ag, &au);
        EXPECT_TRUE(std::isnan(ag)) << ap;
        EXPECT_FALSE(std::isnan(au)) << ap;
        EXPECT_EQ(au, AbsOfBf16(bu[pos])) << ap;
      }
    }
  }
  float *a0 = PF(1), *a1 = PF(1);
  Gpu(g_->swiglu_backward_amax(&gk_, PX(8), PX(8), nullptr, nullptr, nullptr, 0, a0, a1));
  EXPECT_EQ(GetF(a0, 1)[0], 0.0f);
  EXPECT_EQ(GetF(a1, 1)[0], 0.0f);
  void *x = X(Vec(8, 1.0f));
  EXPECT_EQ(g_->swiglu_backward_amax(&gk_, PX(8), nullptr, x, x, x, 8, a0, a1), MP_ERR_INVALID);
  EXPECT_EQ(g_->swiglu_backward_amax(&gk_, PX(8), PX(8), x, x, x, 8, a0, nullptr),
            MP_ERR_INVALID);
}

TEST_F(CudaOps, RmsNormForwardAmaxIsPlainOpPlusF8Amax) {
  ASSERT_NE(g_->rmsnorm_forward_amax, nullptr);
  ASSERT_NE(c_->rmsnorm_forward_amax, nullptr);
  // Scalar path (C % 8 != 0, offset 1, C > 16384), the vector path with a warp per row
  // (N % 8 != 0 leaves idle warps in the last block, which must still reach the block's
  // amax reduction), with a block per row (C 8192), and grids of many blocks (N 1100).
  struct S { int N, C; size_t off; } shapes[] = {
      {1, 7, 0},     {7, 45, 0},   {333, 200, 0}, {5, 1031, 0},   {1, 8, 0},
      {13, 96, 0},   {64, 2048, 0}, {3, 4096, 8}, {2, 8192, 0},   {1100, 256, 0},
      {17, 2048, 1}, {9, 48, 8},    {4, 20000, 0}};
  uint64_t seed = 1800;
  const float eps = 1e-6f;
  for (auto s : shapes) {
    const size_t nc = (size_t)s.N * s.C;
    const Vec x = rnd(nc, -2, 2, seed++), w = rnd(s.C, 0.5f, 1.5f, seed++);
    Vec ref(nc), ref_rstd(s.N);
    float ref_amax = -1.0f;
    Ok(c_->rmsnorm_forward_amax(&ck_, ref.data(), ref_rstd.data(), x.data(), w.data(), s.N, s.C,
                                eps, &ref_amax));
    const std::string at = std::to_string(s.N) + "x" + std::to_string(s.C) + " offset " +
                           std::to_string(s.off);
    // Plain and fused runs on inputs xi, wi; returns the fused out.
    auto run = [&](const std::string &ap, const Vec &xi, const Vec &wi,
                   std::vector<uint16_t> *bits, float *amax, float **rstd) {
      void *gx = XAt(xi, s.off), *gw = XAt(wi, s.off);
      void *o1 = PXAt(nc, s.off), *o2 = PXAt(nc, s.off);
      float *r1 = PF(s.N), *r2 = PF(s.N), *a1 = PF(1), *a2 = PF(1);
      Gpu(g_->rmsnorm_forward(&gk_, o1, r1, gx, gw, s.N, s.C, eps));
      Gpu(g_->f8_amax(&gk_, a1, o1, nc));
      Gpu(g_->rmsnorm_forward_amax(&gk_, o2, r2, gx, gw, s.N, s.C, eps, a2));
      *bits = BitsOf(g_, &gk_, o2, nc);
      EXPECT_TRUE(Same("rmsnorm_forward_amax out bits", *bits, BitsOf(g_, &gk_, o1, nc))) << ap;
      Vec h1 = GetF(r1, s.N), h2 = GetF(r2, s.N);
      EXPECT_EQ(std::memcmp(h1.data(), h2.data(), h1.size() * 4), 0) << ap << ": rstd bits";
      *amax = GetF(a2, 1)[0];
      EXPECT_TRUE(SameAmax("vs f8_amax", *amax, GetF(a1, 1)[0])) << ap;
      EXPECT_TRUE(SameAmax("vs host max of the stored out", *amax, HostAmax(*bits))) << ap;
      *rstd = r2;
      return o2;
    };
    std::vector<uint16_t> bits;
    float amax = 0.0f, *grstd = nullptr;
    void *o2 = run(at, x, w, &bits, &amax, &grstd);
    EXPECT_TRUE(Close("rmsnorm_forward_amax out vs cpu", GetX(o2, nc), ref, 1e-2)) << at;
    EXPECT_TRUE(Close("rmsnorm_forward_amax rstd vs cpu", GetF(grstd, s.N), ref_rstd, 1e-5)) << at;
    EXPECT_TRUE(Close("rmsnorm_forward_amax amax vs cpu", Vec{amax}, Vec{ref_amax}, 1e-2)) << at;
    // The strict maximum at (r, c): row r a single spike (|x| rstd = sqrt(C), which no
    // other row reaches) in the column of the largest weight (2 > 1.5).
    const int rows[] = {0, s.N / 2, s.N - 1}, cols[] = {0, s.C / 2, s.C - 1};
    for (int i = 0; i < 3; i++) {
      const int r = rows[i], c = cols[i];
      const size_t pos = (size_t)r * s.C + c;
      const std::string ap = at + " injected at (" + std::to_string(r) + ", " +
                             std::to_string(c) + ")";
      Vec xi = x, wi = w;
      for (int j = 0; j < s.C; j++) xi[(size_t)r * s.C + j] = 0.0f;
      xi[pos] = 1.5f;
      wi[c] = 2.0f;
      run(ap, xi, wi, &bits, &amax, &grstd);
      EXPECT_GT(amax, 1.9f * std::sqrt((float)s.C)) << ap;
      EXPECT_EQ(amax, AbsOfBf16(bits[pos])) << ap << ": the injected maximum is missed";
      xi = x;
      xi[pos] = NAN;  // the whole row becomes NaN
      run(ap + " (NaN)", xi, w, &bits, &amax, &grstd);
      EXPECT_TRUE(std::isnan(amax)) << ap << ": NaN in the output must make amax NaN";
    }
  }
  float *a0 = PF(1), *r0 = PF(1);
  Gpu(g_->rmsnorm_forward_amax(&gk_, nullptr, r0, nullptr, nullptr, 0, 8, eps, a0));
  EXPECT_EQ(GetF(a0, 1)[0], 0.0f);
  EXPECT_EQ(g_->rmsnorm_forward_amax(&gk_, PX(8), r0, X(Vec(8, 1.0f)), X(Vec(8, 1.0f)), 1, 8,
                                     eps, nullptr),
            MP_ERR_INVALID);
}

// ---- float8 vector paths ------------------------------------------------------------------
// amax, quantize, quantize_t and transpose have 16-byte vector paths chosen by alignment and
// shape (kernels/cuda/fp8.cu, matmul.cu) and scalar paths for the rest; each case below
// names the path its offsets and shape take. Codes are compared with the CPU backend bit
// for bit. Code outputs are poisoned with 0xFF, which no cast produces (E4M3 -NaN and E5M2
// -NaN: the casts give the positive canonical NaN and saturate infinities), so an
// unwritten code fails; the transpose, which moves arbitrary bytes, runs from two poisons.

// n values over many binades, rounded to bf16; with `specials`, about 1 in 23 is NaN,
// +-inf or +-1e6 (beyond both formats' max at any scale >= 1).
Vec f8_values(size_t n, uint64_t seed, bool specials) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-20, 4);
  Vec x(n);
  for (size_t i = 0; i < n; i++) {
    x[i] = bf(std::ldexp(mant(g), ex(g)));
    if (!specials) continue;
    switch (g() % 23) {
      case 0: x[i] = i % 2 ? NAN : -NAN; break;
      case 1: x[i] = i % 2 ? INFINITY : -INFINITY; break;
      case 2: x[i] = i % 2 ? 1e6f : -1e6f; break;
      default: break;
    }
  }
  return x;
}

TEST_F(CudaOps, Float8AmaxVectorPathOffsetsAndNan) {
  // Offsets 0 and 8 keep x 16-byte aligned; 1, 3 and 7 leave a scalar head of 7, 5 and 1
  // elements. Lengths: shorter than a vector, around it, ragged tails, and 2^22 + 5, whose
  // grid is capped at 8 blocks per SM so every thread runs the unrolled loop and its
  // remainder.
  uint64_t seed = 1200;
  for (size_t n : {size_t(1), size_t(7), size_t(8), size_t(9), size_t(333), size_t(100003),
                   (size_t(1) << 22) + 5}) {
    Vec x = f8_values(n, seed++, false);
    float ref = 0.0f;
    Ok(c_->f8_amax(&ck_, &ref, x.data(), n));
    for (size_t off : {0, 1, 3, 7, 8}) {
      const std::string at = "n " + std::to_string(n) + " offset " + std::to_string(off);
      char *gx = (char *)XAt(x, off);
      float *ga = PF(1);
      Gpu(g_->f8_amax(&gk_, ga, gx, n));
      EXPECT_EQ(GetF(ga, 1)[0], ref) << at;  // a max of bf16 values: exact
      // The maximum, then a NaN, at the first element (the head when off is odd), the
      // middle (a vector) and the last (the tail unless (n - head) % 8 == 0): each part
      // of the kernel must carry them. -2 * ref is a bf16 value (ref is).
      for (size_t pos : {size_t(0), n / 2, n - 1}) {
        float big = ref > 0.0f ? -2.0f * ref : -1.0f, nan = NAN;
        Ok(g_->to_device_f32(&gk_, gx + pos * 2, &big, 1));
        Gpu(g_->f8_amax(&gk_, ga, gx, n));
        EXPECT_EQ(GetF(ga, 1)[0], std::fabs(big)) << at << " max at " << pos;
        Ok(g_->to_device_f32(&gk_, gx + pos * 2, &nan, 1));
        Gpu(g_->f8_amax(&gk_, ga, gx, n));
        EXPECT_TRUE(std::isnan(GetF(ga, 1)[0])) << at << " NaN at " << pos;
        Ok(g_->to_device_f32(&gk_, gx + pos * 2, &x[pos], 1));
      }
    }
  }
}

TEST_F(CudaOps, Float8QuantizeVectorPathOffsets) {
  // (x, codes) offsets in elements: (0,0) (8,0) (0,8) vector path; (1,1) (3,3) vector
  // after a scalar head of 7 / 5 elements; (1,0) (0,4) scalar (codes after the head not
  // 8-byte aligned). Scale fmt_max / 4: values up to 16 in magnitude reach 4x the max.
  struct O { size_t in, out; } offs[] = {{0, 0}, {8, 0}, {0, 8}, {1, 1}, {3, 3}, {1, 0}, {0, 4}};
  uint64_t seed = 1300;
  for (mp_f8_format fmt : {MP_F8_E4M3, MP_F8_E5M2}) {
    const float s = mp_f8_max(fmt) / 4.0f;
    float *ds = F(Vec{s});
    for (size_t n : {size_t(1), size_t(7), size_t(9), size_t(333), size_t(100003)}) {
      Vec x = f8_values(n, seed++, true);
      std::vector<uint8_t> ref(n), got(n);
      Ok(c_->f8_quantize(&ck_, ref.data(), x.data(), &s, n, fmt));
      for (auto o : offs) {
        uint8_t *gc = (uint8_t *)Poison(n + o.out) + o.out;
        Gpu(g_->f8_quantize(&gk_, gc, XAt(x, o.in), ds, n, fmt));
        Ok(g_->memcpy_d2h(&gk_, got.data(), gc, n));
        EXPECT_TRUE(Same("f8_quantize codes", got, ref))
            << "n " << n << " fmt " << fmt << " offsets " << o.in << "," << o.out;
      }
    }
  }
}

TEST_F(CudaOps, Float8QuantizeTMatchesCpu) {
  // Shapes: R % 16 == 0 and C % 8 == 0 take the tiled vector kernel (full and partial
  // 64 x 64 tiles: 48 x 200, 1040 x 72); the rest the scalar tiled kernel. Offsets
  // (x elements, codes bytes, codes_t bytes): (0,0,0) as the shape says; (1,0,0) x not
  // 16-byte aligned, (0,0,8) codes_t only 8-byte aligned, (0,4,0) codes only 4-byte
  // aligned: scalar. Each with both outputs, codes only (the f8_quantize path) and
  // codes_t only.
  const int shapes[][2] = {{1, 1},  {7, 33},   {16, 16},   {33, 130}, {64, 64},
                           {130, 7}, {16, 8},  {48, 200},  {1040, 72}, {130, 64}};
  struct O { size_t x, q, qt; } offs[] = {{0, 0, 0}, {1, 0, 0}, {0, 0, 8}, {0, 4, 0}};
  uint64_t seed = 1400;
  for (mp_f8_format fmt : {MP_F8_E4M3, MP_F8_E5M2}) {
    const float s = mp_f8_max(fmt) / 4.0f;
    float *ds = F(Vec{s});
    for (auto &sh : shapes) {
      const int R = sh[0], C = sh[1];
      const size_t n = (size_t)R * C;
      Vec x = f8_values(n, seed++, true);
      std::vector<uint8_t> ref(n), ref_t(n), got(n);
      Ok(c_->f8_quantize_t(&ck_, ref.data(), ref_t.data(), x.data(), &s, R, C, fmt));
      for (auto o : offs) {
        void *gx = XAt(x, o.x);
        for (int outputs = 0; outputs < 3; outputs++) {  // both, codes only, codes_t only
          const std::string at = std::to_string(R) + "x" + std::to_string(C) + " fmt " +
                                 std::to_string(fmt) + " offsets " + std::to_string(o.x) +
                                 "," + std::to_string(o.q) + "," + std::to_string(o.qt) +
                                 " outputs " + std::to_string(outputs);
          uint8_t *gq = outputs == 2 ? nullptr : (uint8_t *)Poison(n + o.q) + o.q;
          uint8_t *gqt = outputs == 1 ? nullptr : (uint8_t *)Poison(n + o.qt) + o.qt;
          Gpu(g_->f8_quantize_t(&gk_, gq, gqt, gx, ds, R, C, fmt));
          if (gq) {
            Ok(g_->memcpy_d2h(&gk_, got.data(), gq, n));
            EXPECT_TRUE(Same("f8_quantize_t codes", got, ref)) << at;
          }
          if (gqt) {
            Ok(g_->memcpy_d2h(&gk_, got.data(), gqt, n));
            EXPECT_TRUE(Same("f8_quantize_t codes_t", got, ref_t)) << at;
          }
        }
      }
    }
  }
  uint8_t *q = (uint8_t *)Dev(16);
  EXPECT_EQ(g_->f8_quantize_t(&gk_, nullptr, nullptr, q, F(Vec{1.0f}), 2, 2, MP_F8_E4M3),
            MP_ERR_INVALID);
  EXPECT_EQ(g_->f8_quantize_t(&gk_, q, q, q, F(Vec{1.0f}), 2, 2, MP_F8_E4M3), MP_ERR_INVALID);
}

TEST_F(CudaOps, Float8TransposeVectorAndScalarPaths) {
  // R and C multiples of 16 with 16-byte aligned operands take the vector kernel (64 x 128
  // tiles: 48 x 208 and 80 x 144 leave partial ones); other shapes, or an operand offset
  // by 8, 4 or 1 bytes, the byte-wise kernel. Random bytes (every value is a code here).
  const int shapes[][2] = {{16, 16}, {48, 208}, {64, 128}, {80, 144}, {1024, 2064},
                           {7, 33},  {130, 70}, {16, 24},  {24, 16}};
  struct O { size_t in, out; } offs[] = {{0, 0}, {16, 0}, {0, 16}, {8, 0}, {0, 4}, {1, 1}};
  std::mt19937_64 g(1500);
  for (auto &sh : shapes) {
    const int R = sh[0], C = sh[1];
    const size_t n = (size_t)R * C;
    std::vector<uint8_t> in(n), ref(n), got(n);
    for (auto &b : in) b = (uint8_t)g();
    Ok(c_->f8_transpose(&ck_, ref.data(), in.data(), R, C));
    for (auto o : offs) {
      uint8_t *gin = (uint8_t *)Dev(n + o.in) + o.in;
      Ok(g_->memcpy_h2d(&gk_, gin, in.data(), n));
      for (uint8_t poison : {uint8_t(0x00), uint8_t(0xFF)}) {
        uint8_t *gout = (uint8_t *)Dev(n + o.out) + o.out;
        std::vector<uint8_t> fill(n, poison);
        Ok(g_->memcpy_h2d(&gk_, gout, fill.data(), n));
        Gpu(g_->f8_transpose(&gk_, gout, gin, R, C));
        Ok(g_->memcpy_d2h(&gk_, got.data(), gout, n));
        EXPECT_TRUE(Same("f8_transpose", got, ref))
            << R << "x" << C << " offsets " << o.in << "," << o.out << " poison "
            << (int)poison;
      }
    }
  }
}

}  // namespace
