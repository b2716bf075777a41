// CUDA GEMMs (bf16 and float8 cuBLASLt), the float8 transpose and flash attention against
// the CPU reference backend, through the CUDA backend (kernels/cuda/cuda.h; a last test,
// which needs no device, checks that its table sets every entry). Skips without CUDA or
// without a device.
//
// Inputs are drawn at random and rounded to bf16 on the host; the CPU reference runs in
// fp32 on exactly those values, so differences come from the device's arithmetic and the
// final rounding only. Every device output is poisoned with 0xFF bytes (NaN in bf16 and
// fp32) before the op runs, and rel_l2 returns infinity if any NaN is left, so an
// unwritten element fails. Bounds (relative L2 over the whole tensor):
//   bf16 outputs: 1e-2 (bf16 has 8 mantissa bits: one rounding is <= 2^-9 ~ 2e-3
//     relative per element; a wrong index or a missing term gives errors of order 1);
//   fp32 outputs from bf16 inputs (weight and bias gradients, lse): 1e-4 (products are
//     exact, fp32 sums of a few hundred terms differ by ~1e-6 from the CPU's order);
//   fp32 outputs of float8 GEMMs: kF8F32Bound = 2e-3. Hopper's float8 tensor-core MMA
//     aligns its addends to the largest exponent and keeps about 14 bits while it
//     accumulates (DeepSeek-V3 technical report, sec. 3.3.2); cuBLASLt's default (no
//     fast accumulation) promotes the partial sums to fp32 every few MMAs, which bounds
//     the error at roughly sqrt(terms per chunk) * 2^-15 ~ 1e-4..5e-4 relative for the
//     wide-range random codes used here. A wrong scale, a missing K block or an overwrite
//     instead of an add is off by 1e-1 or more;
//   float8 GEMMs with MP_F8_GEMM_FAST_ACCUM: kF8FastBound = 1e-2, for bf16 and fp32
//     outputs alike. Without the periodic promotion the MMA keeps accumulating in its
//     ~14-bit format over all of K; DeepSeek-V3 (sec. 3.3.2) measured a maximum relative
//     error near 2 % at K = 4096, and the error grows with K, so at K <= 512 here it is a
//     few 1e-3 at most. The errors this bound exists to catch (a wrong scale, a missing K
//     block, an overwrite instead of an add) are 1e-1 or more;
//   accumulating outputs start from a non-zero value comparable to the result, so an op
//   that overwrote instead of adding would be off by ~30 % (the float8 bf16 += starts from
//   independent random values of the result's rms: an overwrite is off by ~70 %).
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda.h"
#include "tests/kernels_cuda/cuda_fixture.h"
#include "tests/test_rng.h"
#ifdef MP_HAVE_CUDA
#include <cuda_runtime_api.h>

#include "kernels/cuda/gemm.h"
#endif

namespace {

using Vec = std::vector<float>;

using mp_test::Rng;
using mp_test::bf;
using mp_test::rand_bf16;

using mp_test::rel_l2;

class GemmAttention : public mp_test::CudaVsCpu {};

struct Shape3 {
  int N, K, M;
};
const Shape3 kGemmShapes[] = {{1, 1, 1}, {1, 33, 257}, {33, 257, 1}, {257, 1, 33},
                              {130, 257, 33}, {64, 128, 96}, {17, 64, 130}};

TEST_F(GemmAttention, MatmulForwardMatchesCpu) {
  for (const Shape3 &s : kGemmShapes)
    for (int with_bias = 0; with_bias < 2; with_bias++) {
      Rng r(s.N * 1000 + s.K * 10 + s.M + with_bias);
      Vec inp = rand_bf16(r, (size_t)s.N * s.K), w = rand_bf16(r, (size_t)s.M * s.K),
          bias = rand_bf16(r, (size_t)s.M);
      Vec ref((size_t)s.N * s.M);
      ASSERT_EQ(cpu->matmul_forward(&cpu_kc, ref.data(), inp.data(), w.data(),
                                    with_bias ? bias.data() : nullptr, s.N, s.K, s.M), MP_OK);
      void *d_out = poisoned(ref.size() * 2);
      ASSERT_EQ(be->matmul_forward(&kc, d_out, dev_x(inp), dev_x(w),
                                   with_bias ? dev_x(bias) : nullptr, s.N, s.K, s.M), MP_OK)
          << mp_errmsg(&err);
      EXPECT_LE(rel_l2(get_x(d_out, ref.size()), ref), 1e-2)
          << "N=" << s.N << " K=" << s.K << " M=" << s.M << " bias=" << with_bias;
    }
}

TEST_F(GemmAttention, MatmulBackwardAccumulatesLikeCpu) {
  for (const Shape3 &s : kGemmShapes) {
    Rng r(s.N * 7 + s.K * 3 + s.M);
    const size_t nk = (size_t)s.N * s.K, mk = (size_t)s.M * s.K, nm = (size_t)s.N * s.M;
    Vec inp = rand_bf16(r, nk), w = rand_bf16(r, mk), dout = rand_bf16(r, nm);
    // Fresh gradients on the CPU, then start the device from half of them (bf16 or fp32
    // as stored), so the expected result is start + fresh = ~1.5x fresh.
    Vec g_inp(nk, 0.0f), g_w(mk, 0.0f), g_b((size_t)s.M, 0.0f);
    ASSERT_EQ(cpu->matmul_backward(&cpu_kc, g_inp.data(), g_w.data(), g_b.data(), dout.data(),
                                   inp.data(), w.data(), s.N, s.K, s.M), MP_OK);
    Vec s_inp(nk), s_w(mk), s_b((size_t)s.M);
    for (size_t i = 0; i < nk; i++) s_inp[i] = bf(0.5f * g_inp[i]);
    for (size_t i = 0; i < mk; i++) s_w[i] = 0.5f * g_w[i];
    for (int i = 0; i < s.M; i++) s_b[i] = 0.5f * g_b[i];
    Vec e_inp(nk), e_w(mk), e_b((size_t)s.M);
    for (size_t i = 0; i < nk; i++) e_inp[i] = s_inp[i] + g_inp[i];
    for (size_t i = 0; i < mk; i++) e_w[i] = s_w[i] + g_w[i];
    for (int i = 0; i < s.M; i++) e_b[i] = s_b[i] + g_b[i];

    void *d_dinp = dev_x(s_inp);
    float *d_dw = dev_f32(s_w), *d_db = dev_f32(s_b);
    ASSERT_EQ(be->matmul_backward(&kc, d_dinp, d_dw, d_db, dev_x(dout), dev_x(inp), dev_x(w), s.N,
                                  s.K, s.M), MP_OK) << mp_errmsg(&err);
    std::string at = "N=" + std::to_string(s.N) + " K=" + std::to_string(s.K) +
                     " M=" + std::to_string(s.M);
    EXPECT_LE(rel_l2(get_x(d_dinp, nk), e_inp), 1e-2) << "dinp " << at;
    EXPECT_LE(rel_l2(get_f32(d_dw, mk), e_w), 1e-4) << "dweight " << at;
    EXPECT_LE(rel_l2(get_f32(d_db, (size_t)s.M), e_b), 1e-4) << "dbias " << at;

    // NULL gradients are skipped; the others are still computed.
    float *d_db2 = dev_f32(Vec((size_t)s.M, 0.0f));
    ASSERT_EQ(be->matmul_backward(&kc, nullptr, nullptr, d_db2, dev_x(dout), dev_x(inp),
                                  dev_x(w), s.N, s.K, s.M), MP_OK) << mp_errmsg(&err);
    EXPECT_LE(rel_l2(get_f32(d_db2, (size_t)s.M), g_b), 1e-4) << "dbias only " << at;
  }
}

TEST_F(GemmAttention, MatmulLargeBiasGradientUsesChunkedSum) {
  // N > 128 rows takes the two-pass (partial sums + fixed-order finish) path.
  const int N = 1000, K = 16, M = 70;
  Rng r(42);
  Vec inp = rand_bf16(r, (size_t)N * K), w = rand_bf16(r, (size_t)M * K),
      dout = rand_bf16(r, (size_t)N * M);
  Vec g_b((size_t)M, 0.0f);
  ASSERT_EQ(cpu->matmul_backward(&cpu_kc, nullptr, nullptr, g_b.data(), dout.data(), inp.data(),
                                 w.data(), N, K, M), MP_OK);
  Vec start((size_t)M, 1.0f), expect((size_t)M);
  for (int i = 0; i < M; i++) expect[i] = 1.0f + g_b[i];
  float *d_db = dev_f32(start);
  ASSERT_EQ(be->matmul_backward(&kc, nullptr, nullptr, d_db, dev_x(dout), dev_x(inp), dev_x(w),
                                N, K, M), MP_OK) << mp_errmsg(&err);
  EXPECT_LE(rel_l2(get_f32(d_db, (size_t)M), expect), 1e-5);
}

struct AttnShape {
  int B, T, nh, nkv, hd;
};
const AttnShape kAttnShapes[] = {{1, 1, 4, 2, 64},   {2, 17, 4, 2, 64},  {1, 130, 4, 2, 128},
                                 {1, 130, 4, 2, 64}, {2, 65, 2, 1, 34},  {1, 64, 4, 4, 128},
                                 {1, 200, 4, 2, 96}};

std::string attn_name(const AttnShape &s) {
  return "B=" + std::to_string(s.B) + " T=" + std::to_string(s.T) + " nh=" +
         std::to_string(s.nh) + " nkv=" + std::to_string(s.nkv) + " hd=" + std::to_string(s.hd);
}

TEST_F(GemmAttention, AttentionForwardMatchesCpu) {
  for (const AttnShape &s : kAttnShapes) {
    Rng r(s.T * 31 + s.hd + s.nh);
    const size_t nq = (size_t)s.B * s.T * s.nh * s.hd, nkv = (size_t)s.B * s.T * s.nkv * s.hd;
    const size_t nl = (size_t)s.B * s.nh * s.T;
    // Spread 2: scores of order +-hd/3/sqrt(hd)*4, so softmax is peaked, not uniform.
    Vec q = rand_bf16(r, nq, -2, 2), k = rand_bf16(r, nkv, -2, 2), v = rand_bf16(r, nkv);
    Vec out(nq), lse(nl);
    ASSERT_EQ(cpu->attention_forward(&cpu_kc, out.data(), lse.data(), q.data(), k.data(),
                                     v.data(), s.B, s.T, s.nh, s.nkv, s.hd, s.hd), MP_OK);
    void *d_out = poisoned(nq * 2);
    float *d_lse = (float *)poisoned(nl * 4);
    ASSERT_EQ(be->attention_forward(&kc, d_out, d_lse, dev_x(q), dev_x(k), dev_x(v), s.B, s.T,
                                    s.nh, s.nkv, s.hd, s.hd), MP_OK) << mp_errmsg(&err);
    EXPECT_LE(rel_l2(get_x(d_out, nq), out), 1e-2) << "out " << attn_name(s);
    EXPECT_LE(rel_l2(get_f32(d_lse, nl), lse), 1e-4) << "lse " << attn_name(s);
  }
}

TEST_F(GemmAttention, AttentionBackwardAccumulatesLikeCpu) {
  for (const AttnShape &s : kAttnShapes) {
    Rng r(s.T * 17 + s.hd * 3 + s.nh);
    const size_t nq = (size_t)s.B * s.T * s.nh * s.hd, nkv = (size_t)s.B * s.T * s.nkv * s.hd;
    const size_t nl = (size_t)s.B * s.nh * s.T;
    Vec q = rand_bf16(r, nq, -2, 2), k = rand_bf16(r, nkv, -2, 2), v = rand_bf16(r, nkv),
        dout = rand_bf16(r, nq);
    Vec out(nq), lse(nl);
    ASSERT_EQ(cpu->attention_forward(&cpu_kc, out.data(), lse.data(), q.data(), k.data(),
                                     v.data(), s.B, s.T, s.nh, s.nkv, s.hd, s.hd), MP_OK);
    for (auto &x : out) x = bf(x);  // the device stores the forward output in bf16
    Vec gq(nq, 0.0f), gk(nkv, 0.0f), gv(nkv, 0.0f);
    ASSERT_EQ(cpu->attention_backward(&cpu_kc, gq.data(), gk.data(), gv.data(), dout.data(),
                                      q.data(), k.data(), v.data(), out.data(), lse.data(), s.B,
                                      s.T, s.nh, s.nkv, s.hd, s.hd), MP_OK);
    // Start from half the fresh gradient (bf16), expect start + fresh.
    Vec sq(nq), sk(nkv), sv(nkv), eq(nq), ek(nkv), ev(nkv);
    for (size_t i = 0; i < nq; i++) eq[i] = (sq[i] = bf(0.5f * gq[i])) + gq[i];
    for (size_t i = 0; i < nkv; i++) ek[i] = (sk[i] = bf(0.5f * gk[i])) + gk[i];
    for (size_t i = 0; i < nkv; i++) ev[i] = (sv[i] = bf(0.5f * gv[i])) + gv[i];
    void *d_dq = dev_x(sq), *d_dk = dev_x(sk), *d_dv = dev_x(sv);
    ASSERT_EQ(be->attention_backward(&kc, d_dq, d_dk, d_dv, dev_x(dout), dev_x(q), dev_x(k),
                                     dev_x(v), dev_x(out), dev_f32(lse), s.B, s.T, s.nh, s.nkv,
                                     s.hd, s.hd), MP_OK) << mp_errmsg(&err);
    EXPECT_LE(rel_l2(get_x(d_dq, nq), eq), 1e-2) << "dq " << attn_name(s);
    EXPECT_LE(rel_l2(get_x(d_dk, nkv), ek), 1e-2) << "dk " << attn_name(s);
    EXPECT_LE(rel_l2(get_x(d_dv, nkv), ev), 1e-2) << "dv " << attn_name(s);
  }
}

TEST_F(GemmAttention, AttentionRefusesUnsupportedHeadDim) {
  EXPECT_EQ(be->attention_forward(&kc, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 2, 1,
                                  130, 130), MP_ERR_UNSUPPORTED);
  EXPECT_NE(std::strstr(mp_errmsg(&err), "head dim"), nullptr);
  EXPECT_EQ(be->attention_forward(&kc, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 2, 1,
                                  33, 33), MP_ERR_UNSUPPORTED);
  // multi-head latent attention's value head unlike the query/key head: refused by name
  EXPECT_EQ(be->attention_forward(&kc, nullptr, nullptr, nullptr, nullptr, nullptr, 1, 4, 2, 1,
                                  64, 32), MP_ERR_UNSUPPORTED);
  EXPECT_NE(std::strstr(mp_errmsg(&err), "multi-head latent attention"), nullptr) << mp_errmsg(&err);
  EXPECT_EQ(be->attention_backward(&kc, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr, nullptr,
                                   nullptr, 1, 4, 2, 1, 64, 32), MP_ERR_UNSUPPORTED);
}

const double kF8F32Bound = 2e-3; // see the file comment

uint8_t finite_code(Rng &r, mp_f8_format fmt) {
  for (;;) {
    uint8_t c = (uint8_t)r.next();
    if (std::isfinite(mp_f8_decode(c, fmt))) return c;
  }
}

TEST_F(GemmAttention, Float8MatmulMatchesCpuOrIsRefused) {
  struct Case {
    int R, K, S;
    mp_f8_format fa, fb;
  };
  // Every supported format pair (E5M2 x E4M3 is the gradient pairing of ops.h), shapes
  // from the smallest the op accepts to ones that take cuBLASLt's tiled kernels
  // (256 x 512 x 384 spans several 128-wide tiles in every dimension).
  const Case cases[] = {{16, 16, 16, MP_F8_E4M3, MP_F8_E4M3},
                        {32, 64, 48, MP_F8_E5M2, MP_F8_E4M3},
                        {64, 256, 128, MP_F8_E4M3, MP_F8_E5M2},
                        {48, 512, 32, MP_F8_E5M2, MP_F8_E4M3},
                        {256, 512, 384, MP_F8_E4M3, MP_F8_E4M3},
                        {256, 512, 384, MP_F8_E5M2, MP_F8_E4M3},
                        {384, 256, 512, MP_F8_E4M3, MP_F8_E5M2},
                        {1024, 128, 256, MP_F8_E4M3, MP_F8_E4M3}};
  for (const Case &c : cases) {
    Rng r(c.R + c.K + c.S);
    std::vector<uint8_t> a((size_t)c.R * c.K), b((size_t)c.S * c.K);
    for (auto &x : a) x = finite_code(r, c.fa);
    for (auto &x : b) x = finite_code(r, c.fb);
    // Scales as f8_scale_from_amax gives them: max / amax, here for amax 3 and 0.5.
    const float sa = mp_f8_max(c.fa) / 3.0f, sb = mp_f8_max(c.fb) / 0.5f;
    Vec ref((size_t)c.R * c.S), start((size_t)c.R * c.S), ref_acc;
    ASSERT_EQ(cpu->matmul_f8(&cpu_kc, ref.data(), nullptr, a.data(), &sa, c.fa, b.data(), &sb,
                             c.fb, c.R, c.K, c.S, 0), MP_OK);
    for (size_t i = 0; i < start.size(); i++) start[i] = 0.5f * ref[i];
    ref_acc = start;
    for (size_t i = 0; i < ref.size(); i++) ref_acc[i] += ref[i];
    const uint8_t *d_a = (const uint8_t *)dev_bytes(a), *d_b = (const uint8_t *)dev_bytes(b);
    float *d_sa = dev_f32(Vec{sa}), *d_sb = dev_f32(Vec{sb});
    void *d_out = poisoned(ref.size() * 2);
    float *d_acc = dev_f32(start);
    mp_status st = be->matmul_f8(&kc, d_out, nullptr, d_a, d_sa, c.fa, d_b, d_sb, c.fb, c.R, c.K,
                                 c.S, 0);
    std::string at = "R=" + std::to_string(c.R) + " K=" + std::to_string(c.K) +
                     " S=" + std::to_string(c.S);
    if (cc < 89) {
      EXPECT_EQ(st, MP_ERR_UNSUPPORTED) << at;
      EXPECT_NE(std::strstr(mp_errmsg(&err), "8.9"), nullptr) << mp_errmsg(&err);
      continue;
    }
    ASSERT_EQ(st, MP_OK) << mp_errmsg(&err) << " " << at;
    EXPECT_LE(rel_l2(get_x(d_out, ref.size()), ref), 1e-2) << "bf16 out " << at;
    ASSERT_EQ(be->matmul_f8(&kc, nullptr, d_acc, d_a, d_sa, c.fa, d_b, d_sb, c.fb, c.R, c.K,
                            c.S, 0), MP_OK) << mp_errmsg(&err);
    EXPECT_LE(rel_l2(get_f32(d_acc, ref.size()), ref_acc), kF8F32Bound) << "fp32 += " << at;
    // Second calls take the cached algorithm: the written output is rewritten (the
    // poison is back first, so a call that wrote nothing fails) and the accumulated one
    // gains another ref (start + 2 ref).
    void *d_out2 = poisoned(ref.size() * 2);
    ASSERT_EQ(be->matmul_f8(&kc, d_out2, nullptr, d_a, d_sa, c.fa, d_b, d_sb, c.fb, c.R, c.K,
                            c.S, 0), MP_OK) << mp_errmsg(&err);
    EXPECT_LE(rel_l2(get_x(d_out2, ref.size()), ref), 1e-2) << "bf16 out, cached " << at;
    ASSERT_EQ(be->matmul_f8(&kc, nullptr, d_acc, d_a, d_sa, c.fa, d_b, d_sb, c.fb, c.R, c.K,
                            c.S, 0), MP_OK) << mp_errmsg(&err);
    for (size_t i = 0; i < ref.size(); i++) ref_acc[i] += ref[i];
    EXPECT_LE(rel_l2(get_f32(d_acc, ref.size()), ref_acc), kF8F32Bound) << "fp32 += twice " << at;
  }
  // Dims that are not multiples of 16 are refused whatever the device.
  float *d_one = dev_f32(Vec{1.0f});
  void *d_codes = poisoned(64 * 64);
  void *d_out = poisoned(64 * 64 * 2);
  EXPECT_EQ(be->matmul_f8(&kc, d_out, nullptr, (const uint8_t *)d_codes, d_one, MP_F8_E4M3,
                          (const uint8_t *)d_codes, d_one, MP_F8_E4M3, 17, 32, 16, 0),
            MP_ERR_UNSUPPORTED);
}

const double kF8FastBound = 1e-2;  // see the file comment

double rms_of(const Vec &v) {
  double s = 0;
  for (float x : v) s += (double)x * x;
  return v.empty() ? 0.0 : std::sqrt(s / v.size());
}

// matmul_f8 flags (ops.h): MP_F8_GEMM_ADD makes the bf16 output an accumulation
// (out_x += A B^T, the dgrad contract), MP_F8_GEMM_FAST_ACCUM lets cuBLASLt skip the
// periodic fp32 promotion (the runtime's forward). Both against the CPU reference run with
// the same flags (it accumulates in fp32 either way). ADD starts from bf16 values drawn
// independently of the result, so an overwrite, a double add or a dropped C are all far
// off; each call is made twice, the second from the algorithm cache.
TEST_F(GemmAttention, Float8MatmulAddAndFastAccumulation) {
  struct Case {
    int R, K, S;
    mp_f8_format fa, fb;
  };
  const Case cases[] = {{16, 16, 16, MP_F8_E4M3, MP_F8_E4M3},
                        {64, 256, 128, MP_F8_E5M2, MP_F8_E4M3},
                        {256, 512, 384, MP_F8_E5M2, MP_F8_E4M3},
                        {384, 256, 512, MP_F8_E4M3, MP_F8_E5M2},
                        {1024, 128, 256, MP_F8_E4M3, MP_F8_E4M3}};
  for (const Case &c : cases) {
    Rng r(3 * c.R + 5 * c.K + 7 * c.S);
    const size_t n = (size_t)c.R * c.S;
    std::vector<uint8_t> a((size_t)c.R * c.K), b((size_t)c.S * c.K);
    for (auto &x : a) x = finite_code(r, c.fa);
    for (auto &x : b) x = finite_code(r, c.fb);
    const float sa = mp_f8_max(c.fa) / 3.0f, sb = mp_f8_max(c.fb) / 0.5f;
    Vec ref(n);
    ASSERT_EQ(cpu->matmul_f8(&cpu_kc, ref.data(), nullptr, a.data(), &sa, c.fa, b.data(), &sb,
                             c.fb, c.R, c.K, c.S, 0), MP_OK);
    // Uniform on +-sqrt(3) rms(ref): the same rms as the result, independent of it.
    const float amp = 1.7320508f * (float)rms_of(ref);
    const Vec start = rand_bf16(r, n, -amp, amp);
    Vec want_add = start, want_add2(n), sum(n);
    ASSERT_EQ(cpu->matmul_f8(&cpu_kc, want_add.data(), nullptr, a.data(), &sa, c.fa, b.data(),
                             &sb, c.fb, c.R, c.K, c.S, MP_F8_GEMM_ADD), MP_OK);
    for (size_t i = 0; i < n; i++) {
      sum[i] = start[i] + ref[i];
      want_add2[i] = want_add[i] + ref[i];
    }
    // The reference itself adds (start + ref up to fp32 summation order).
    ASSERT_LE(rel_l2(want_add, sum), 1e-5) << "CPU reference matmul_f8 with ADD";
    const uint8_t *d_a = (const uint8_t *)dev_bytes(a), *d_b = (const uint8_t *)dev_bytes(b);
    float *d_sa = dev_f32(Vec{sa}), *d_sb = dev_f32(Vec{sb});
    const std::string at = "R=" + std::to_string(c.R) + " K=" + std::to_string(c.K) +
                           " S=" + std::to_string(c.S);
    auto f8 = [&](void *out_x, float *out_f32, unsigned flags) {
      return be->matmul_f8(&kc, out_x, out_f32, d_a, d_sa, c.fa, d_b, d_sb, c.fb, c.R, c.K,
                           c.S, flags);
    };

    // bf16 += (C = D = out, beta 1), twice: start + ref, then start + 2 ref.
    void *d_out = dev_x(start);
    mp_status st = f8(d_out, nullptr, MP_F8_GEMM_ADD);
    if (cc < 89) {
      EXPECT_EQ(st, MP_ERR_UNSUPPORTED) << at;
      continue;
    }
    ASSERT_EQ(st, MP_OK) << mp_errmsg(&err) << " " << at;
    EXPECT_LE(rel_l2(get_x(d_out, n), want_add), 1e-2) << "bf16 += " << at;
    ASSERT_EQ(f8(d_out, nullptr, MP_F8_GEMM_ADD), MP_OK) << mp_errmsg(&err);
    EXPECT_LE(rel_l2(get_x(d_out, n), want_add2), 1e-2) << "bf16 += twice (cached) " << at;
    // Written again without ADD on the same buffer: the old contents are ignored.
    ASSERT_EQ(f8(d_out, nullptr, 0), MP_OK) << mp_errmsg(&err);
    EXPECT_LE(rel_l2(get_x(d_out, n), ref), 1e-2) << "bf16 = after += " << at;

    // Fast accumulation: written bf16 (the runtime's forward) from poison, twice.
    for (int call = 0; call < 2; call++) {
      void *d_fast = poisoned(n * 2);
      ASSERT_EQ(f8(d_fast, nullptr, MP_F8_GEMM_FAST_ACCUM), MP_OK) << mp_errmsg(&err);
      EXPECT_LE(rel_l2(get_x(d_fast, n), ref), kF8FastBound) << "fast bf16 = " << at << " call "
                                                             << call;
    }
    // Fast accumulation with ADD into bf16, and into an fp32 +=.
    void *d_fast_add = dev_x(start);
    ASSERT_EQ(f8(d_fast_add, nullptr, MP_F8_GEMM_FAST_ACCUM | MP_F8_GEMM_ADD), MP_OK)
        << mp_errmsg(&err);
    EXPECT_LE(rel_l2(get_x(d_fast_add, n), want_add), kF8FastBound) << "fast bf16 += " << at;
    float *d_fast_acc = dev_f32(start);
    ASSERT_EQ(f8(nullptr, d_fast_acc, MP_F8_GEMM_FAST_ACCUM), MP_OK) << mp_errmsg(&err);
    EXPECT_LE(rel_l2(get_f32(d_fast_acc, n), want_add), kF8FastBound) << "fast fp32 += " << at;
    // The same fp32 problem without fast accumulation after it (its own cache entry) keeps
    // the full-promotion bound; ADD on an fp32 output changes nothing (always +=).
    float *d_acc = dev_f32(start);
    ASSERT_EQ(f8(nullptr, d_acc, 0), MP_OK) << mp_errmsg(&err);
    EXPECT_LE(rel_l2(get_f32(d_acc, n), want_add), kF8F32Bound) << "fp32 += after fast " << at;
    ASSERT_EQ(f8(nullptr, d_acc, MP_F8_GEMM_ADD), MP_OK) << mp_errmsg(&err);
    EXPECT_LE(rel_l2(get_f32(d_acc, n), want_add2), kF8F32Bound) << "fp32 += with ADD " << at;
  }
}

// K == 0 is an empty sum: a written bf16 output becomes 0, an accumulated one (ADD) keeps
// its values exactly.
TEST_F(GemmAttention, Float8MatmulEmptySumWithAndWithoutAdd) {
  const int R = 16, S = 32;
  Rng r(5);
  const Vec start = rand_bf16(r, (size_t)R * S, 0.5f, 2.0f);  // no zeros
  float *d_one = dev_f32(Vec{1.0f});
  const uint8_t *d_codes = (const uint8_t *)poisoned(64);
  void *d_add = dev_x(start), *d_set = dev_x(start);
  mp_status st = be->matmul_f8(&kc, d_add, nullptr, d_codes, d_one, MP_F8_E4M3, d_codes, d_one,
                               MP_F8_E4M3, R, 0, S, MP_F8_GEMM_ADD);
  if (cc < 89) {
    EXPECT_EQ(st, MP_ERR_UNSUPPORTED);
    return;
  }
  ASSERT_EQ(st, MP_OK) << mp_errmsg(&err);
  ASSERT_EQ(be->matmul_f8(&kc, d_set, nullptr, d_codes, d_one, MP_F8_E4M3, d_codes, d_one,
                          MP_F8_E4M3, R, 0, S, 0), MP_OK) << mp_errmsg(&err);
  EXPECT_EQ(get_x(d_add, start.size()), start) << "ADD with K = 0 must leave out unchanged";
  EXPECT_EQ(get_x(d_set, start.size()), Vec(start.size(), 0.0f)) << "K = 0 writes zeros";
}

// Flag bits ops.h does not define are refused with MP_ERR_INVALID on every device (before
// the compute-capability check), and nothing is queued: the output keeps its poison.
TEST_F(GemmAttention, Float8MatmulRefusesUnknownFlags) {
  float *d_one = dev_f32(Vec{1.0f});
  const uint8_t *d_codes = (const uint8_t *)poisoned(16 * 16);
  void *d_out = poisoned(16 * 16 * 2);
  for (unsigned flags : {4u, 8u, 0x80000000u, MP_F8_GEMM_ADD | MP_F8_GEMM_FAST_ACCUM | 16u}) {
    EXPECT_EQ(be->matmul_f8(&kc, d_out, nullptr, d_codes, d_one, MP_F8_E4M3, d_codes, d_one,
                            MP_F8_E4M3, 16, 16, 16, flags),
              MP_ERR_INVALID)
        << "flags " << flags;
    EXPECT_NE(std::strstr(mp_errmsg(&err), "unknown flags"), nullptr) << mp_errmsg(&err);
  }
  EXPECT_EQ(get_bytes(d_out, 16 * 16 * 2), std::vector<unsigned char>(16 * 16 * 2, 0xFF));
}

// The runtime's float8 Linear backward, as ops.h describes it: dgrad dx (N, K) = dy W is
// A = dy (N, M) in E5M2 and B = W^T (K, M) in E4M3, made K-contiguous with f8_transpose
// from W (M, K); wgrad dW (M, K) += dy^T x is A = dy^T (M, N), B = x^T (K, N), both
// transposed on the device, accumulated into fp32. The CPU reference multiplies the same
// codes (transposed on the host), so both sides see identical operands.
TEST_F(GemmAttention, Float8LinearBackwardThroughTranspose) {
  const int N = 128, K = 256, M = 384;
  Rng r(77);
  std::vector<uint8_t> dy((size_t)N * M), w((size_t)M * K), x((size_t)N * K);
  for (auto &v : dy) v = finite_code(r, MP_F8_E5M2);
  for (auto &v : w) v = finite_code(r, MP_F8_E4M3);
  for (auto &v : x) v = finite_code(r, MP_F8_E4M3);
  auto transpose = [](const std::vector<uint8_t> &in, int R, int C) {
    std::vector<uint8_t> out(in.size());
    for (int i = 0; i < R; i++)
      for (int j = 0; j < C; j++) out[(size_t)j * R + i] = in[(size_t)i * C + j];
    return out;
  };
  const std::vector<uint8_t> wt = transpose(w, M, K), dyt = transpose(dy, N, M),
                             xt = transpose(x, N, K);
  const float s_dy = mp_f8_max(MP_F8_E5M2) / 2.0f, s_w = mp_f8_max(MP_F8_E4M3) / 0.25f,
              s_x = mp_f8_max(MP_F8_E4M3) / 4.0f;
  Vec ref_dx((size_t)N * K), fresh_dw((size_t)M * K, 0.0f);
  ASSERT_EQ(cpu->matmul_f8(&cpu_kc, ref_dx.data(), nullptr, dy.data(), &s_dy, MP_F8_E5M2,
                           wt.data(), &s_w, MP_F8_E4M3, N, M, K, 0), MP_OK);
  ASSERT_EQ(cpu->matmul_f8(&cpu_kc, nullptr, fresh_dw.data(), dyt.data(), &s_dy, MP_F8_E5M2,
                           xt.data(), &s_x, MP_F8_E4M3, M, N, K, 0), MP_OK);
  Vec start_dw((size_t)M * K), ref_dw((size_t)M * K);
  for (size_t i = 0; i < start_dw.size(); i++) {
    start_dw[i] = 0.5f * fresh_dw[i];
    ref_dw[i] = start_dw[i] + fresh_dw[i];
  }
  const uint8_t *d_dy = (const uint8_t *)dev_bytes(dy), *d_w = (const uint8_t *)dev_bytes(w),
                *d_x = (const uint8_t *)dev_bytes(x);
  uint8_t *d_wt = (uint8_t *)poisoned(wt.size()), *d_dyt = (uint8_t *)poisoned(dyt.size()),
          *d_xt = (uint8_t *)poisoned(xt.size());
  ASSERT_EQ(be->f8_transpose(&kc, d_wt, d_w, M, K), MP_OK) << mp_errmsg(&err);
  ASSERT_EQ(be->f8_transpose(&kc, d_dyt, d_dy, N, M), MP_OK) << mp_errmsg(&err);
  ASSERT_EQ(be->f8_transpose(&kc, d_xt, d_x, N, K), MP_OK) << mp_errmsg(&err);
  float *d_sdy = dev_f32(Vec{s_dy}), *d_sw = dev_f32(Vec{s_w}), *d_sx = dev_f32(Vec{s_x});
  void *d_dx = poisoned(ref_dx.size() * 2);
  float *d_dw = dev_f32(start_dw);
  mp_status st = be->matmul_f8(&kc, d_dx, nullptr, d_dy, d_sdy, MP_F8_E5M2, d_wt, d_sw,
                               MP_F8_E4M3, N, M, K, 0);
  if (cc < 89) {
    EXPECT_EQ(st, MP_ERR_UNSUPPORTED);
    return;
  }
  ASSERT_EQ(st, MP_OK) << mp_errmsg(&err);
  ASSERT_EQ(be->matmul_f8(&kc, nullptr, d_dw, d_dyt, d_sdy, MP_F8_E5M2, d_xt, d_sx, MP_F8_E4M3,
                          M, N, K, 0), MP_OK) << mp_errmsg(&err);
  EXPECT_LE(rel_l2(get_x(d_dx, ref_dx.size()), ref_dx), 1e-2) << "dgrad";
  EXPECT_LE(rel_l2(get_f32(d_dw, ref_dw.size()), ref_dw), kF8F32Bound) << "wgrad +=";
}

TEST_F(GemmAttention, Float8TransposeIsExact) {
  const int shapes[][2] = {{1, 1}, {33, 70}, {257, 130}, {64, 4096}};
  for (auto &sh : shapes) {
    int R = sh[0], C = sh[1];
    std::vector<uint8_t> in((size_t)R * C), out((size_t)R * C);
    for (size_t i = 0; i < in.size(); i++) in[i] = (uint8_t)(i * 131 + 7);
    void *d_in = dev_bytes(in);
    void *d_out = poisoned(in.size());
    ASSERT_EQ(be->f8_transpose(&kc, (uint8_t *)d_out, (const uint8_t *)d_in, R, C), MP_OK)
        << mp_errmsg(&err);
    ASSERT_EQ(be->synchronize(&kc), MP_OK);
    ASSERT_EQ(be->memcpy_d2h(&kc, out.data(), d_out, out.size()), MP_OK);
    for (int rr = 0; rr < R; rr++)
      for (int cc2 = 0; cc2 < C; cc2++)
        ASSERT_EQ(out[(size_t)cc2 * R + rr], in[(size_t)rr * C + cc2]) << R << "x" << C;
  }
}

#ifdef MP_HAVE_CUDA
// Needs no device: the CUDA backend table sets every ops.h entry, and its float8 entries
// are matmul.cu's.
TEST(GemmAttentionWiring, BackendTableUsesTheseKernels) {
  const mp_backend *full = mp_cuda_backend();
  ASSERT_NE(full, nullptr);
  const size_t first = offsetof(mp_backend, init);
  for (size_t off = first; off + sizeof(void *) <= sizeof(mp_backend); off += sizeof(void *)) {
    void *entry;
    memcpy(&entry, (const char *)full + off, sizeof entry);
    EXPECT_NE(entry, nullptr) << "CUDA backend entry at byte offset " << off << " is unset";
  }
  EXPECT_EQ(full->matmul_f8, &mp_cuda_matmul_f8);
  EXPECT_EQ(full->f8_transpose, &mp_cuda_f8_transpose);
}
#endif

}  // namespace
