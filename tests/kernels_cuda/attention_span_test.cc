// CUDA span attention (kernels/cuda/attention.cu, attention_fa2.cu: attention_span_*),
// the building blocks of ring attention, against the CPU reference backend and against the
// CUDA monolithic kernels. Skips without CUDA or without a device.
//
// Ring: the sequence in 2cp chunks (cp = 1, 2, 4, uneven sizes), ranks holding chunks r
// and 2cp-1-r, every pair in ring order (tests/kernels/ring_attention.h), on the device;
// the reference is the CPU's monolithic attention on the same bf16-rounded inputs (the
// CPU ring equals it within 1e-6, tests/kernels/attention_span_test.cc), its backward run
// on the bf16-rounded output as the device stores it. Bounds, relative L2 over the tensor:
//   out: 1e-2. As the monolithic kernel: P rounded to bf16 before P V (<= 2^-9 relative
//     per element), the output once more; the merge itself is fp32 (acc) and exact to
//     ~1e-7. Expected ~3e-3.
//   lse: 1e-4. fp32 scores from exact bf16 products, fp32 sums and merges, 2-ulp exp2.
//   dq, dk, dv (from zero): each pair adds its share into the bf16 gradient with one
//     rounding, and a chunk meets up to 2cp pairs, so with P and dS rounded as GEMM
//     operands a gradient element takes up to 2cp + 2 independent roundings of <= 2^-9
//     relative: a random walk of sqrt(2cp + 2) 2^-9 (4e-3 at cp = 1, 6e-3 at cp = 4).
//     Bound: 3 sqrt(2cp + 2) 2^-9. A wrong mask, position or merge weight gives errors
//     of order 1.
// Head dims 64 and 128 run the tensor-core kernels, 8 (tiny-dense's) and 48 the scalar
// ones; the tensor-core span path is also checked against the scalar one on the device.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "kernels/cuda/attention_hooks.h"  // force_scalar (CUDA builds)
#include "kernels/cuda/cuda.h"
#include "tests/kernels/ring_attention.h"
#include "tests/kernels_cuda/cuda_fixture.h"
#include "tests/test_rng.h"

namespace {

using Vec = std::vector<float>;

using mp_test::rand_bf16;
using mp_test::rel_l2;
using mp_test::RingAttention;
using mp_test::RingProblem;
using mp_test::RingResult;
using mp_test::Rng;


struct Case {
  int B, T, nh, nkv, hd, cp;
};

std::string name_of(const Case &c) {
  return "B=" + std::to_string(c.B) + " T=" + std::to_string(c.T) + " nh=" + std::to_string(c.nh) +
         " nkv=" + std::to_string(c.nkv) + " hd=" + std::to_string(c.hd) + " cp=" + std::to_string(c.cp);
}

RingProblem make_problem(const Case &c, uint64_t seed) {
  RingProblem p{c.B, c.T, c.nh, c.nkv, c.hd, mp_test::even_bounds(c.T, c.cp), {}, {}, {}, {}};
  Rng r(seed);
  const size_t nq = (size_t)c.B * c.T * c.nh * c.hd, nk = (size_t)c.B * c.T * c.nkv * c.hd;
  p.q = rand_bf16(r, nq, -2, 2);
  p.k = rand_bf16(r, nk, -2, 2);
  p.v = rand_bf16(r, nk);
  p.dout = rand_bf16(r, nq);
  return p;
}

class CudaAttentionSpan : public mp_test::CudaVsCpu {
 protected:
  void TearDown() override {
#ifdef MP_HAVE_CUDA
    if (ready) mp_cuda_attention_force_scalar(0);
#endif
    CudaVsCpu::TearDown();
  }

  // The CPU monolithic reference: forward, then backward on the bf16-rounded output.
  RingResult reference(const RingProblem &p) {
    RingResult r;
    EXPECT_EQ(mp_test::monolithic_attention(cpu, &cpu_kc, p, true, &r), MP_OK) << mp_errmsg(&err);
    return r;
  }

  RingResult device_ring(const RingProblem &p) {
    RingResult r;
    RingAttention ra(be, &kc);
    EXPECT_EQ(ra.run(p, &r), MP_OK) << mp_errmsg(&err);
    return r;
  }

  void expect_close(const RingResult &got, const RingResult &want, int cp, const std::string &what) {
    const double g = 3.0 * std::sqrt(2.0 * cp + 2.0) / 512.0;
    EXPECT_LE(rel_l2(got.out, want.out), 1e-2) << "out " << what;
    EXPECT_LE(rel_l2(got.lse, want.lse), 1e-4) << "lse " << what;
    EXPECT_LE(rel_l2(got.dq, want.dq), g) << "dq " << what;
    EXPECT_LE(rel_l2(got.dk, want.dk), g) << "dk " << what;
    EXPECT_LE(rel_l2(got.dv, want.dv), g) << "dv " << what;
  }
};

// Tensor-core head dims with chunks shorter and longer than a tile (64 and 128 rows) and
// ragged; the scalar head dims 8 and 48; GQA 4:2, 8:2 and 4:1; B 1 and 2.
const Case kCases[] = {
    {2, 200, 4, 2, 64, 1},  {2, 200, 4, 2, 64, 2},   {1, 300, 8, 2, 64, 4},
    {1, 1024, 4, 1, 128, 2}, {2, 130, 4, 4, 128, 4}, {1, 520, 4, 2, 128, 1},
    {2, 77, 4, 2, 8, 2},     {2, 64, 8, 4, 8, 4},    {1, 150, 4, 1, 48, 2}};

TEST_F(CudaAttentionSpan, RingMatchesCpu) {
  for (const Case &c : kCases) {
    RingProblem p = make_problem(c, (uint64_t)c.T * 13 + c.hd * 7 + c.cp);
    expect_close(device_ring(p), reference(p), c.cp, name_of(c));
  }
}

#ifdef MP_HAVE_CUDA
// The tensor-core span path against the scalar one on the same device and inputs.
TEST_F(CudaAttentionSpan, TensorCoreRingMatchesScalarRing) {
  for (const Case &c : {Case{2, 200, 4, 2, 64, 2}, Case{1, 300, 4, 1, 128, 4}}) {
    RingProblem p = make_problem(c, 5 + c.hd);
    mp_cuda_attention_force_scalar(1);
    RingResult sc = device_ring(p);
    mp_cuda_attention_force_scalar(0);
    expect_close(device_ring(p), sc, c.cp, "tensor core vs scalar " + name_of(c));
  }
}
#endif

// One chunk at position 0 runs the same arithmetic as the monolithic kernels (the span
// variants differ from them only in masks and addressing that are the identity here, and
// in the forward's merge, which with an empty state writes o / l exactly as the monolithic
// epilogue does), so out is the same bits, and lse equal to fp32 rounding. The backward
// too on the tensor cores, whose monolithic backward takes D from the same dot kernel as
// span_dot; the scalar monolithic backward sums D in its own lane order, so there the
// gradients may differ by a bf16 ulp in a few elements (bound 1e-3 relative L2).
TEST_F(CudaAttentionSpan, OneChunkIsTheMonolithicKernel) {
  for (const Case &c : {Case{2, 200, 4, 2, 64, 1}, Case{1, 130, 4, 1, 128, 1}, Case{2, 77, 4, 2, 8, 1}}) {
    RingProblem p = make_problem(c, 40 + c.hd);
    const int B = c.B, T = c.T, nh = c.nh, nkv = c.nkv, hd = c.hd;
    const size_t nq = p.q.size(), nk = p.k.size(), nl = (size_t)B * nh * T;
    void *q = dev_x(p.q), *k = dev_x(p.k), *v = dev_x(p.v), *dout = dev_x(p.dout);
    void *out0 = poisoned(nq * 2), *out1 = poisoned(nq * 2);
    float *lse0 = (float *)poisoned(nl * 4), *lse1 = (float *)poisoned(nl * 4);
    float *acc = (float *)poisoned(nq * 4), *D = (float *)poisoned(nl * 4);
    ASSERT_EQ(be->attention_forward(&kc, out0, lse0, q, k, v, B, T, nh, nkv, hd, hd), MP_OK) << mp_errmsg(&err);
    const mp_attn_span sp = {B, nh, nkv, hd, T, 0, T, 0, T, 0, T, 0};
    ASSERT_EQ(be->attention_span_init(&kc, lse1, nl), MP_OK) << mp_errmsg(&err);
    ASSERT_EQ(be->attention_span_forward(&kc, acc, lse1, q, k, v, &sp), MP_OK) << mp_errmsg(&err);
    ASSERT_EQ(be->attention_span_finalize(&kc, out1, acc, lse1, B, T, nh, hd), MP_OK) << mp_errmsg(&err);
    EXPECT_TRUE(get_bytes(out0, nq * 2) == get_bytes(out1, nq * 2)) << "out " << name_of(c);
    const Vec l0 = get_f32(lse0, nl), l1 = get_f32(lse1, nl);
    EXPECT_LE(rel_l2(l1, l0), 1e-6) << "lse " << name_of(c);
    Vec z(nq, 0.0f), zk(nk, 0.0f);
    void *dq0 = dev_x(z), *dk0 = dev_x(zk), *dv0 = dev_x(zk), *dq1 = dev_x(z), *dk1 = dev_x(zk),
         *dv1 = dev_x(zk);
    ASSERT_EQ(be->attention_backward(&kc, dq0, dk0, dv0, dout, q, k, v, out0, lse0, B, T, nh, nkv, hd, hd),
              MP_OK) << mp_errmsg(&err);
    ASSERT_EQ(be->attention_span_dot(&kc, D, dout, out0, B, T, nh, hd), MP_OK) << mp_errmsg(&err);
    ASSERT_EQ(be->attention_span_backward(&kc, dq1, dk1, dv1, dout, q, k, v, lse0, D, &sp), MP_OK)
        << mp_errmsg(&err);
    if (hd == 64 || hd == 128) {
      EXPECT_TRUE(get_bytes(dq0, nq * 2) == get_bytes(dq1, nq * 2)) << "dq " << name_of(c);
      EXPECT_TRUE(get_bytes(dk0, nk * 2) == get_bytes(dk1, nk * 2)) << "dk " << name_of(c);
      EXPECT_TRUE(get_bytes(dv0, nk * 2) == get_bytes(dv1, nk * 2)) << "dv " << name_of(c);
    } else {
      EXPECT_LE(rel_l2(get_x(dq1, nq), get_x(dq0, nq)), 1e-3) << "dq " << name_of(c);
      EXPECT_LE(rel_l2(get_x(dk1, nk), get_x(dk0, nk)), 1e-3) << "dk " << name_of(c);
      EXPECT_LE(rel_l2(get_x(dv1, nk), get_x(dv0, nk)), 1e-3) << "dv " << name_of(c);
    }
  }
}

// A pair wholly in the future changes nothing (state and gradients keep their bits); rows
// that see no key stay empty (lse -inf) and finalize to 0 over a poisoned output; a pair
// that reaches part of the rows leaves the others' state as it was.
TEST_F(CudaAttentionSpan, FutureKeysAndEmptyRows) {
  for (int hd : {64, 8}) {
    const int B = 1, nh = 2, nkv = 1, S = 80;
    Rng r(8 + hd);
    Vec q = rand_bf16(r, (size_t)B * S * nh * hd), k = rand_bf16(r, (size_t)B * S * nkv * hd),
        v = rand_bf16(r, (size_t)B * S * nkv * hd), dout = rand_bf16(r, (size_t)B * S * nh * hd);
    const size_t nq = q.size(), nk = k.size(), nl = (size_t)B * nh * S;
    void *dq_ = dev_x(q), *dk_ = dev_x(k), *dv_ = dev_x(v), *ddo = dev_x(dout);
    float *acc = (float *)poisoned(nq * 4), *lse = (float *)poisoned(nl * 4);
    void *out = poisoned(nq * 2);
    ASSERT_EQ(be->attention_span_init(&kc, lse, nl), MP_OK) << mp_errmsg(&err);
    // Queries at 100..179, keys at 180..259: all in the future.
    const mp_attn_span future = {B, nh, nkv, hd, S, 0, S, 100, S, 0, S, 180};
    const auto acc0 = get_bytes(acc, nq * 4), lse0 = get_bytes(lse, nl * 4);
    ASSERT_EQ(be->attention_span_forward(&kc, acc, lse, dq_, dk_, dv_, &future), MP_OK) << mp_errmsg(&err);
    EXPECT_TRUE(get_bytes(acc, nq * 4) == acc0 && get_bytes(lse, nl * 4) == lse0) << "hd " << hd;
    // Keys at 130..209: queries 0..29 see none.
    const mp_attn_span part = {B, nh, nkv, hd, S, 0, S, 100, S, 0, S, 130};
    ASSERT_EQ(be->attention_span_forward(&kc, acc, lse, dq_, dk_, dv_, &part), MP_OK) << mp_errmsg(&err);
    const Vec l = get_f32(lse, nl);
    for (int h = 0; h < nh; h++)
      for (int t = 0; t < S; t++) {
        if (t < 30) {
          EXPECT_EQ(l[(size_t)h * S + t], -INFINITY) << "hd " << hd << " h" << h << " t" << t;
        } else {
          EXPECT_TRUE(std::isfinite(l[(size_t)h * S + t])) << "hd " << hd << " h" << h << " t" << t;
        }
      }
    ASSERT_EQ(be->attention_span_finalize(&kc, out, acc, lse, B, S, nh, hd), MP_OK) << mp_errmsg(&err);
    const Vec o = get_x(out, nq);
    for (size_t i = 0; i < nq; i++) {
      ASSERT_TRUE(std::isfinite(o[i])) << "hd " << hd << " element " << i;
      if (i < (size_t)30 * nh * hd) {
        EXPECT_EQ(o[i], 0.0f) << "hd " << hd << " empty row element " << i;
      }
    }
    // Backward of the future pair: nothing moves.
    float *D = (float *)poisoned(nl * 4);
    ASSERT_EQ(be->attention_span_dot(&kc, D, ddo, out, B, S, nh, hd), MP_OK) << mp_errmsg(&err);
    Vec zq(nq, 0.25f), zk(nk, 0.5f);
    void *gq = dev_x(zq), *gk = dev_x(zk), *gv = dev_x(zk);
    const auto gq0 = get_bytes(gq, nq * 2), gk0 = get_bytes(gk, nk * 2);
    ASSERT_EQ(be->attention_span_backward(&kc, gq, gk, gv, ddo, dq_, dk_, dv_, lse, D, &future), MP_OK)
        << mp_errmsg(&err);
    EXPECT_TRUE(get_bytes(gq, nq * 2) == gq0 && get_bytes(gk, nk * 2) == gk0 &&
                get_bytes(gv, nk * 2) == gk0) << "hd " << hd;
    // The partial pair: the empty rows' dq and the unseen keys' dk, dv (keys past 49: the
    // last query, position 179, sees keys up to 179 - 130) keep their values.
    ASSERT_EQ(be->attention_span_backward(&kc, gq, gk, gv, ddo, dq_, dk_, dv_, lse, D, &part), MP_OK)
        << mp_errmsg(&err);
    const Vec hq = get_x(gq, nq), hk = get_x(gk, nk), hv = get_x(gv, nk);
    for (size_t i = 0; i < (size_t)30 * nh * hd; i++) EXPECT_EQ(hq[i], 0.25f) << "hd " << hd << " " << i;
    for (size_t i = (size_t)50 * hd; i < nk; i++) {
      EXPECT_EQ(hk[i], 0.5f) << "hd " << hd << " " << i;
      EXPECT_EQ(hv[i], 0.5f) << "hd " << hd << " " << i;
    }
    for (size_t i = 0; i < nq; i++) ASSERT_TRUE(std::isfinite(hq[i])) << "hd " << hd << " " << i;
  }
}

// The same argument check and message as the CPU backend.
TEST_F(CudaAttentionSpan, BadSpansAreRefusedAsOnTheCpu) {
  float *f = (float *)poisoned(4096);
  mp_attn_span bad = {1, 2, 1, 64, 8, 1, 8, 0, 8, 0, 8, 0}; // rows 1..8 of 8
  EXPECT_EQ(be->attention_span_forward(&kc, f, f, f, f, f, &bad), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&err)).find("attention_span_forward: invalid argument"),
            std::string::npos) << mp_errmsg(&err);
  bad.q_row = 0;
  bad.hd = 7; // odd: the CUDA kernels need an even head dim
  EXPECT_EQ(be->attention_span_forward(&kc, f, f, f, f, f, &bad), MP_ERR_UNSUPPORTED);
}

}  // namespace
