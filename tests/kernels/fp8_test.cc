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

}  // namespace
