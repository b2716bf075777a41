// Tests of the CPU float8 quantize-with-transpose (kernels/cpu/fp8.c, f8_quantize_t).
//
// The contract is "f8_quantize, then f8_transpose, in one pass", so the reference is those
// two ops of the same backend (each tested on its own: matmul_f8_test.cc for the
// transpose, kernels_test.cc and the CUDA comparisons for the casts), compared bit for bit:
// codes are integers, there is no tolerance to choose. A few codes are also checked
// against the OCP FP8 tables by hand, so a shared mistake in both paths would show.
// Inputs span many binades, include NaN, infinities and values beyond the format's max
// (saturation), and the shapes are ragged against the 64 x 64 tiles (1, 7, 33, 130 do not
// divide 64; 16 and 64 do). Every output starts from two different poison bytes in two
// runs, so an element the op forgets cannot match the reference in both.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "tests/kernels/cpu_fixture.h"

namespace {

class Fp8 : public mp_test::CpuKernels {};

// R * C values: sign * mantissa in [0.5, 1) * 2^[-20, 4], with NaN, +-inf and +-1e6 at
// scattered positions (about 1 in 23 elements).
std::vector<float> values(int R, int C, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> mant(-1.0f, 1.0f);
  std::uniform_int_distribution<int> ex(-20, 4);
  std::vector<float> x((size_t)R * C);
  for (size_t i = 0; i < x.size(); i++) {
    x[i] = std::ldexp(mant(g), ex(g));
    switch (g() % 23) {
      case 0: x[i] = NAN; break;
      case 1: x[i] = i % 2 ? INFINITY : -INFINITY; break;
      case 2: x[i] = i % 2 ? 1e6f : -1e6f; break;
      default: break;
    }
  }
  return x;
}

TEST_F(Fp8, QuantizeTHandComputedCodes) {
  // x (2, 3) = [1, -2, 896; NaN, 0.5, -inf], scale 1, E4M3 (OCP table): 1 = 0x38,
  // -2 = 0xC0, 896 saturates to 448 = 0x7E, NaN = 0x7F, 0.5 = 0x30, -inf saturates to
  // -448 = 0xFE.
  const float x[6] = {1.0f, -2.0f, 896.0f, NAN, 0.5f, -INFINITY};
  const float one = 1.0f;
  uint8_t q[6], qt[6];
  ASSERT_EQ(be->f8_quantize_t(&kc, q, qt, x, &one, 2, 3, MP_F8_E4M3), MP_OK)
      << mp_errmsg(&err);
  const uint8_t want_q[6] = {0x38, 0xC0, 0x7E, 0x7F, 0x30, 0xFE};
  const uint8_t want_qt[6] = {0x38, 0x7F, 0xC0, 0x30, 0x7E, 0xFE};  // (3, 2)
  EXPECT_EQ(std::memcmp(q, want_q, 6), 0);
  EXPECT_EQ(std::memcmp(qt, want_qt, 6), 0);
  // E5M2 with scale 2: 2 = 0x40, -4 = 0xC4, 1792 = 1.75 * 2^10 = 0 11001 11 = 0x67,
  // NaN = 0x7E, 1 = 0x3C, -inf saturates to -57344 = 0xFB.
  const float two = 2.0f;
  ASSERT_EQ(be->f8_quantize_t(&kc, q, qt, x, &two, 2, 3, MP_F8_E5M2), MP_OK);
  const uint8_t want5[6] = {0x40, 0xC4, 0x67, 0x7E, 0x3C, 0xFB};
  const uint8_t want5t[6] = {0x40, 0x7E, 0xC4, 0x3C, 0x67, 0xFB};
  EXPECT_EQ(std::memcmp(q, want5, 6), 0);
  EXPECT_EQ(std::memcmp(qt, want5t, 6), 0);
}

// f8_quantize_t with (codes, codes_t), (codes, NULL) and (NULL, codes_t) against
// f8_quantize + f8_transpose, each output from poison bytes 0x00 and 0xFF.
void check_shape(mp_kctx *kc, const mp_backend *be, int R, int C, mp_f8_format fmt,
                 float scale, uint64_t seed) {
  const std::vector<float> x = values(R, C, seed);
  const size_t n = x.size();
  std::vector<uint8_t> ref(n), ref_t(n);
  ASSERT_EQ(be->f8_quantize(kc, ref.data(), x.data(), &scale, n, fmt), MP_OK);
  ASSERT_EQ(be->f8_transpose(kc, ref_t.data(), ref.data(), R, C), MP_OK);
  for (int outputs = 0; outputs < 3; outputs++) {  // both, codes only, codes_t only
    for (uint8_t poison : {uint8_t(0x00), uint8_t(0xFF)}) {
      std::vector<uint8_t> q(n, poison), qt(n, poison);
      uint8_t *pq = outputs == 2 ? nullptr : q.data();
      uint8_t *pqt = outputs == 1 ? nullptr : qt.data();
      ASSERT_EQ(be->f8_quantize_t(kc, pq, pqt, x.data(), &scale, R, C, fmt), MP_OK)
          << mp_errmsg(kc->err);
      if (pq) {
        EXPECT_EQ(q, ref) << "codes, R=" << R << " C=" << C << " fmt " << fmt;
      }
      if (pqt) {
        EXPECT_EQ(qt, ref_t) << "codes_t, R=" << R << " C=" << C << " fmt " << fmt;
      }
    }
  }
}

TEST_F(Fp8, QuantizeTEqualsQuantizeThenTransposeOnRaggedShapes) {
  const int dims[] = {1, 7, 16, 33, 64, 130};
  uint64_t seed = 1;
  for (mp_f8_format fmt : {MP_F8_E4M3, MP_F8_E5M2})
    for (int R : dims)
      for (int C : dims) {
        // Scale fmt_max / 4: values up to 16 in magnitude reach 4x the max (saturation).
        check_shape(&kc, be, R, C, fmt, mp_f8_max(fmt) / 4.0f, seed++);
        if (HasFatalFailure()) return;
      }
}

TEST_F(Fp8, QuantizeTThreadedSizes) {
  // Above the OpenMP threshold (R * C > 65536), ragged in both dimensions.
  check_shape(&kc, be, 300, 257, MP_F8_E4M3, 28.0f, 99);
  check_shape(&kc, be, 257, 300, MP_F8_E5M2, 3584.0f, 100);
}

TEST_F(Fp8, QuantizeTArguments) {
  const float x[4] = {1, 2, 3, 4}, one = 1.0f;
  uint8_t q[4];
  EXPECT_EQ(be->f8_quantize_t(&kc, nullptr, nullptr, x, &one, 2, 2, MP_F8_E4M3),
            MP_ERR_INVALID);
  EXPECT_NE(std::strstr(mp_errmsg(&err), "f8_quantize_t"), nullptr);
  EXPECT_EQ(be->f8_quantize_t(&kc, q, q, x, &one, 2, 2, MP_F8_E4M3), MP_ERR_INVALID);
  EXPECT_EQ(be->f8_quantize_t(&kc, q, nullptr, x, &one, -1, 2, MP_F8_E4M3), MP_ERR_INVALID);
  // Empty tensors are fine and touch nothing.
  EXPECT_EQ(be->f8_quantize_t(&kc, q, nullptr, nullptr, nullptr, 0, 5, MP_F8_E4M3), MP_OK);
  EXPECT_EQ(be->f8_quantize_t(&kc, nullptr, q, nullptr, nullptr, 5, 0, MP_F8_E5M2), MP_OK);
}

// The fused amax ops (rmsnorm_forward_amax, swiglu_forward_amax, swiglu_backward_amax) are
// their plain op plus f8_amax of each output as stored: outputs bit for bit, amax equal.
// Plain and fused run on separate copies of the same inputs; the += outputs start from the
// same non-zero values, so an amax of the increment alone (not the updated output) differs.
class FusedAmax : public mp_test::CpuKernels {};

std::vector<float> normal(size_t n, uint64_t seed, float sd) {
  std::mt19937_64 g(seed);
  std::normal_distribution<float> d(0.0f, sd);
  std::vector<float> x(n);
  for (float &v : x) v = d(g);
  return x;
}

TEST_F(FusedAmax, RmsNormForward) {
  for (int N : {1, 5, 64}) {
    const int C = 48;
    std::vector<float> x = normal((size_t)N * C, 7 + N, 2.0f), w = normal(C, 3, 1.0f);
    std::vector<float> o1((size_t)N * C, NAN), o2((size_t)N * C, NAN), r1(N), r2(N);
    float a1 = -1.0f, a2 = -2.0f;
    ASSERT_EQ(be->rmsnorm_forward(&kc, o1.data(), r1.data(), x.data(), w.data(), N, C, 1e-5f), MP_OK);
    ASSERT_EQ(be->f8_amax(&kc, &a1, o1.data(), o1.size()), MP_OK);
    ASSERT_EQ(be->rmsnorm_forward_amax(&kc, o2.data(), r2.data(), x.data(), w.data(), N, C, 1e-5f, &a2), MP_OK)
        << mp_errmsg(&err);
    EXPECT_EQ(0, std::memcmp(o1.data(), o2.data(), o1.size() * sizeof(float)));
    EXPECT_EQ(0, std::memcmp(r1.data(), r2.data(), r1.size() * sizeof(float)));
    EXPECT_EQ(a1, a2);
    EXPECT_GT(a2, 0.0f);
  }
  float o, r, one = 1.0f, x = NAN;
  float am = 0.0f;
  ASSERT_EQ(be->rmsnorm_forward_amax(&kc, &o, &r, &x, &one, 1, 1, 1e-5f, &am), MP_OK);
  EXPECT_TRUE(std::isnan(am));
  EXPECT_EQ(be->rmsnorm_forward_amax(&kc, &o, &r, &one, &one, 1, 1, 1e-5f, nullptr), MP_ERR_INVALID);
}

TEST_F(FusedAmax, SwigluForwardAndBackward) {
  const size_t n = 70001;  // above the OpenMP threshold, odd
  std::vector<float> g = normal(n, 11, 3.0f), u = normal(n, 12, 1.0f), d = normal(n, 13, 0.1f);
  std::vector<float> h1(n, NAN), h2(n, NAN);
  float a1 = -1.0f, a2 = -2.0f;
  ASSERT_EQ(be->swiglu_forward(&kc, h1.data(), g.data(), u.data(), n), MP_OK);
  ASSERT_EQ(be->f8_amax(&kc, &a1, h1.data(), n), MP_OK);
  ASSERT_EQ(be->swiglu_forward_amax(&kc, h2.data(), g.data(), u.data(), n, &a2), MP_OK) << mp_errmsg(&err);
  EXPECT_EQ(0, std::memcmp(h1.data(), h2.data(), n * sizeof(float)));
  EXPECT_EQ(a1, a2);

  // backward accumulates: both start from the same large values, so the amax of the
  // updated outputs (what the contract says) differs from that of the increments
  std::vector<float> dg1 = normal(n, 14, 5.0f), du1 = normal(n, 15, 5.0f), dg2 = dg1, du2 = du1;
  float ag1 = -1, au1 = -1, ag2 = -2, au2 = -2, inc = -3;
  std::vector<float> zero(n, 0.0f), dgi = zero, dui = zero;
  ASSERT_EQ(be->swiglu_backward(&kc, dgi.data(), dui.data(), d.data(), g.data(), u.data(), n), MP_OK);
  ASSERT_EQ(be->f8_amax(&kc, &inc, dgi.data(), n), MP_OK);
  ASSERT_EQ(be->swiglu_backward(&kc, dg1.data(), du1.data(), d.data(), g.data(), u.data(), n), MP_OK);
  ASSERT_EQ(be->f8_amax(&kc, &ag1, dg1.data(), n), MP_OK);
  ASSERT_EQ(be->f8_amax(&kc, &au1, du1.data(), n), MP_OK);
  ASSERT_EQ(be->swiglu_backward_amax(&kc, dg2.data(), du2.data(), d.data(), g.data(), u.data(), n, &ag2, &au2),
            MP_OK) << mp_errmsg(&err);
  EXPECT_EQ(0, std::memcmp(dg1.data(), dg2.data(), n * sizeof(float)));
  EXPECT_EQ(0, std::memcmp(du1.data(), du2.data(), n * sizeof(float)));
  EXPECT_EQ(ag1, ag2);
  EXPECT_EQ(au1, au2);
  EXPECT_NE(ag2, inc);
  EXPECT_EQ(be->swiglu_backward_amax(&kc, dg2.data(), du2.data(), d.data(), g.data(), u.data(), n, &ag2, nullptr),
            MP_ERR_INVALID);
}

}  // namespace
