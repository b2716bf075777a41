// Tests of the CPU float8 GEMM reference and the float8 transpose (kernels/cpu/matmul_f8.c).
//
// References are independent of the kernel: hand-computed products of hand-picked codes
// (including the largest finite codes, 448 in E4M3 and 57344 in E5M2, which is where a
// saturating quantiser puts out-of-range values), and a naive triple loop in double over
// mp_f8_decode for random codes. Every product of two float8 values is exact in fp32 and
// the sums here stay far below 2^24 ulps of error, so the fp32 kernel matches the double
// loop to 1e-5 relative; a wrong index, scale or transpose gives errors of order 1.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "tests/kernels/cpu_fixture.h"
#include "tests/test_rng.h"

namespace {

class MatmulF8 : public mp_test::CpuKernels {};

// Well-known codes (OCP FP8 tables): E4M3 1.0 = 0 0111 000, 448 = 0 1111 110;
// E5M2 1.0 = 0 01111 00, 57344 = 0 11110 11.
constexpr uint8_t kE4One = 0x38, kE4Two = 0x40, kE4Half = 0x30, kE4Max = 0x7E;
constexpr uint8_t kE5One = 0x3C, kE5Max = 0x7B, kE5Three = 0x42;  // 3 = 1.5 * 2^1

TEST_F(MatmulF8, CodesDecodeAsTheTablesSay) {
  // Guards the hand-computed expectations below against a misread table.
  EXPECT_EQ(mp_f8_decode(kE4One, MP_F8_E4M3), 1.0f);
  EXPECT_EQ(mp_f8_decode(kE4Two, MP_F8_E4M3), 2.0f);
  EXPECT_EQ(mp_f8_decode(kE4Half, MP_F8_E4M3), 0.5f);
  EXPECT_EQ(mp_f8_decode(kE4Max, MP_F8_E4M3), 448.0f);
  EXPECT_EQ(mp_f8_decode(kE5One, MP_F8_E5M2), 1.0f);
  EXPECT_EQ(mp_f8_decode(kE5Max, MP_F8_E5M2), 57344.0f);
  EXPECT_EQ(mp_f8_decode(kE5Three, MP_F8_E5M2), 3.0f);
  // A value beyond the range saturates to the max code, the case the max rows cover.
  EXPECT_EQ(mp_f8_encode(1e6f, MP_F8_E4M3), kE4Max);
  EXPECT_EQ(mp_f8_encode(1e9f, MP_F8_E5M2), kE5Max);
}

TEST_F(MatmulF8, HandComputedE4M3TimesE5M2WithScales) {
  // A (R=2, K=3) E4M3, B (S=2, K=3) E5M2; out = (A / sa) (B / sb)^T.
  const uint8_t a[6] = {kE4One, kE4Two, kE4Half,          // [1, 2, 0.5]
                        kE4Max, (uint8_t)(kE4Two | 0x80), 0};  // [448, -2, 0]
  const uint8_t b[6] = {kE5One, kE5Three, kE5One,         // [1, 3, 1]
                        kE5Max, kE5One, (uint8_t)(kE5Three | 0x80)};  // [57344, 1, -3]
  const float sa = 2.0f, sb = 0.25f;  // dequant factor 1 / (sa * sb) = 2
  float out[4];
  for (float &x : out) x = NAN;  // written, so the poison must disappear
  ASSERT_EQ(be->matmul_f8(&kc, out, nullptr, a, &sa, MP_F8_E4M3, b, &sb, MP_F8_E5M2, 2, 3,
                          2, 0), MP_OK) << mp_errmsg(&err);
  // Row 0: [1,2,.5].[1,3,1] = 7.5; [1,2,.5].[57344,1,-3] = 57344 + 2 - 1.5 = 57344.5.
  // Row 1: [448,-2,0].[1,3,1] = 442; [448,-2,0].[57344,1,-3] = 25690112 - 2 = 25690110.
  // Times 2: 15, 114689, 884, 51380220 (a multiple of 4, the fp32 spacing at 2^25, so
  // exact, as is every partial sum on the way).
  EXPECT_EQ(out[0], 15.0f);
  EXPECT_EQ(out[1], 114689.0f);
  EXPECT_EQ(out[2], 884.0f);
  EXPECT_EQ(out[3], 51380220.0f);
}

TEST_F(MatmulF8, AccumulatesIntoF32Output) {
  const uint8_t a[2] = {kE4Max, kE4Max};  // A (1, 2) = [448, 448]
  const uint8_t b[4] = {kE4Max, kE4Two, kE4Half, kE4One};  // B (2, 2)
  const float one = 1.0f;
  float acc[2] = {10.0f, -3.0f};
  ASSERT_EQ(be->matmul_f8(&kc, nullptr, acc, a, &one, MP_F8_E4M3, b, &one, MP_F8_E4M3, 1, 2,
                          2, 0), MP_OK) << mp_errmsg(&err);
  // 10 + 448*448 + 448*2 = 201610; -3 + 448*0.5 + 448 = 669.
  EXPECT_EQ(acc[0], 201610.0f);
  EXPECT_EQ(acc[1], 669.0f);
  // A second call adds again: gradients accumulate.
  ASSERT_EQ(be->matmul_f8(&kc, nullptr, acc, a, &one, MP_F8_E4M3, b, &one, MP_F8_E4M3, 1, 2,
                          2, 0), MP_OK);
  EXPECT_EQ(acc[0], 201610.0f + 201600.0f);
  EXPECT_EQ(acc[1], 669.0f + 672.0f);
}

using mp_test::Rng;

// A random finite code (no NaN / inf).
uint8_t random_code(Rng &r, mp_f8_format fmt) {
  for (;;) {
    uint8_t c = (uint8_t)r.next();
    if (std::isfinite(mp_f8_decode(c, fmt))) return c;
  }
}

void check_random(mp_kctx *kc, const mp_backend *be, mp_f8_format fa, mp_f8_format fb,
                  int R, int K, int S, bool accumulate) {
  Rng rng(R * 131 + K * 7 + S);
  std::vector<uint8_t> a((size_t)R * K), b((size_t)S * K);
  for (auto &c : a) c = random_code(rng, fa);
  for (auto &c : b) c = random_code(rng, fb);
  const float sa = 3.0f, sb = 0.125f;
  std::vector<float> init((size_t)R * S), out((size_t)R * S);
  for (size_t i = 0; i < init.size(); i++) init[i] = accumulate ? (float)(i % 7) - 3.0f : NAN;
  out = init;
  mp_status st = be->matmul_f8(kc, accumulate ? nullptr : out.data(),
                               accumulate ? out.data() : nullptr, a.data(), &sa, fa, b.data(),
                               &sb, fb, R, K, S, 0);
  ASSERT_EQ(st, MP_OK) << mp_errmsg(kc->err);
  double err2 = 0, ref2 = 0;
  for (int r = 0; r < R; r++)
    for (int s = 0; s < S; s++) {
      double ref = accumulate ? init[(size_t)r * S + s] : 0.0;
      for (int k = 0; k < K; k++)
        ref += (double)mp_f8_decode(a[(size_t)r * K + k], fa) / sa *
               ((double)mp_f8_decode(b[(size_t)s * K + k], fb) / sb);
      double got = out[(size_t)r * S + s];
      ASSERT_FALSE(std::isnan(got)) << r << "," << s;
      err2 += (got - ref) * (got - ref);
      ref2 += ref * ref;
    }
  EXPECT_LE(std::sqrt(err2 / (ref2 > 0 ? ref2 : 1)), 1e-5)
      << "R=" << R << " K=" << K << " S=" << S;
}

TEST_F(MatmulF8, RandomCodesMatchNaiveLoop) {
  // Ragged shapes (not multiples of the CPU GEMM's 6 x 16 micro-tile), both formats.
  check_random(&kc, be, MP_F8_E4M3, MP_F8_E4M3, 7, 33, 19, false);
  check_random(&kc, be, MP_F8_E5M2, MP_F8_E4M3, 1, 257, 17, false);
  check_random(&kc, be, MP_F8_E5M2, MP_F8_E4M3, 33, 16, 48, true);
  check_random(&kc, be, MP_F8_E4M3, MP_F8_E5M2, 130, 70, 5, true);
}

TEST_F(MatmulF8, NanCodePropagates) {
  const uint8_t a[2] = {0x7F, kE4One};  // E4M3 NaN
  const uint8_t b[2] = {kE4One, kE4One};
  const float one = 1.0f;
  float out = 0.0f;
  ASSERT_EQ(be->matmul_f8(&kc, &out, nullptr, a, &one, MP_F8_E4M3, b, &one, MP_F8_E4M3, 1, 2,
                          1, 0), MP_OK);
  EXPECT_TRUE(std::isnan(out));
}

TEST_F(MatmulF8, AddFlagAccumulatesIntoXOutput) {
  // The dgrad contract: out_x += A B^T with MP_F8_GEMM_ADD, out_x = A B^T without.
  const uint8_t a[2] = {kE4Max, kE4Max};                   // A (1, 2) = [448, 448]
  const uint8_t b[4] = {kE4Max, kE4Two, kE4Half, kE4One};  // B (2, 2)
  const float one = 1.0f;
  float out[2] = {10.0f, -3.0f};
  ASSERT_EQ(be->matmul_f8(&kc, out, nullptr, a, &one, MP_F8_E4M3, b, &one, MP_F8_E4M3, 1, 2, 2,
                          MP_F8_GEMM_ADD), MP_OK) << mp_errmsg(&err);
  EXPECT_EQ(out[0], 10.0f + 201600.0f);  // 448*448 + 448*2
  EXPECT_EQ(out[1], -3.0f + 672.0f);     // 448*0.5 + 448
  // FAST_ACCUM changes nothing on the reference (fp32 accumulation either way), and the
  // written form overwrites.
  ASSERT_EQ(be->matmul_f8(&kc, out, nullptr, a, &one, MP_F8_E4M3, b, &one, MP_F8_E4M3, 1, 2, 2,
                          MP_F8_GEMM_FAST_ACCUM), MP_OK) << mp_errmsg(&err);
  EXPECT_EQ(out[0], 201600.0f);
  EXPECT_EQ(out[1], 672.0f);
}

TEST_F(MatmulF8, RejectsUnknownFlags) {
  const uint8_t a[1] = {kE4One}, b[1] = {kE4One};
  const float one = 1.0f;
  float o = 0;
  EXPECT_EQ(be->matmul_f8(&kc, &o, nullptr, a, &one, MP_F8_E4M3, b, &one, MP_F8_E4M3, 1, 1, 1, 4u),
            MP_ERR_INVALID);
  EXPECT_NE(std::strstr(mp_errmsg(&err), "matmul_f8"), nullptr);
}

TEST_F(MatmulF8, RejectsZeroOrTwoOutputs) {
  const uint8_t a[1] = {kE4One}, b[1] = {kE4One};
  const float one = 1.0f;
  float o1 = 0, o2 = 0;
  EXPECT_EQ(be->matmul_f8(&kc, &o1, &o2, a, &one, MP_F8_E4M3, b, &one, MP_F8_E4M3, 1, 1, 1, 0),
            MP_ERR_INVALID);
  EXPECT_NE(std::strstr(mp_errmsg(&err), "matmul_f8"), nullptr);
  EXPECT_EQ(be->matmul_f8(&kc, nullptr, nullptr, a, &one, MP_F8_E4M3, b, &one, MP_F8_E4M3, 1,
                          1, 1, 0), MP_ERR_INVALID);
}

TEST_F(MatmulF8, TransposeRaggedShapes) {
  const int shapes[][2] = {{1, 1}, {1, 70}, {67, 130}, {128, 64}};
  for (auto &sh : shapes) {
    int R = sh[0], C = sh[1];
    std::vector<uint8_t> in((size_t)R * C), out((size_t)R * C, 0xAA);
    for (size_t i = 0; i < in.size(); i++) in[i] = (uint8_t)(i * 37 + 11);
    ASSERT_EQ(be->f8_transpose(&kc, out.data(), in.data(), R, C), MP_OK);
    for (int r = 0; r < R; r++)
      for (int c = 0; c < C; c++)
        ASSERT_EQ(out[(size_t)c * R + r], in[(size_t)r * C + c]) << R << "x" << C;
  }
}

TEST_F(MatmulF8, TransposedOperandGivesDgrad) {
  // dgrad dx = dy W is matmul_f8 with B = W^T: check that the pair gives dy W.
  const int N = 3, M = 4, K = 5;  // dy (N, M), W (M, K)
  Rng rng(5);
  std::vector<uint8_t> dy((size_t)N * M), w((size_t)M * K), wt((size_t)K * M);
  for (auto &c : dy) c = random_code(rng, MP_F8_E5M2);
  for (auto &c : w) c = random_code(rng, MP_F8_E4M3);
  ASSERT_EQ(be->f8_transpose(&kc, wt.data(), w.data(), M, K), MP_OK);
  const float one = 1.0f;
  std::vector<float> dx((size_t)N * K);
  ASSERT_EQ(be->matmul_f8(&kc, dx.data(), nullptr, dy.data(), &one, MP_F8_E5M2, wt.data(),
                          &one, MP_F8_E4M3, N, M, K, 0), MP_OK);
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) {
      double ref = 0;
      for (int m = 0; m < M; m++)
        ref += (double)mp_f8_decode(dy[(size_t)n * M + m], MP_F8_E5M2) *
               mp_f8_decode(w[(size_t)m * K + k], MP_F8_E4M3);
      EXPECT_NEAR(dx[(size_t)n * K + k], ref, 1e-5 * (1 + std::fabs(ref)));
    }
}

}  // namespace
