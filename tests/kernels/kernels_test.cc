// Tests of the CPU reference kernels (kernels/cpu): every forward against a naive formula
// evaluated in double on small ragged shapes, every backward against central finite
// differences, float8 casts against hand-computed values, router/permute round trips,
// AdamW against its closed form.
//
// Finite differences: L = sum(out * R) for a fixed random R, so dout = R. Inputs are
// perturbed in fp32 by h = 1e-2 and L is evaluated in double from the fp32 forward. The
// error of the estimate is truncation O(h^2 |f'''|) ~ 1e-4 plus rounding ~ (fp32 eps *
// |L| ~ 1e-6) / (2h) ~ 1e-4, so we accept |analytic - fd| <= 3e-3 * (1 + |fd|). A wrong
// formula (a missing term, a wrong index) gives errors of order 1e-1 and fails.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "tests/kernels/cpu_fixture.h"
#include "tests/test_rng.h"

namespace {

using Vec = std::vector<float>;

using mp_test::Rng;

class Kernels : public mp_test::CpuKernels {};

double dot(const Vec &a, const Vec &b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); i++) s += (double)a[i] * b[i];
  return s;
}

// Compares g (analytic dL/dx) with central differences of f() perturbing x in place.
void check_fd(const char *what, Vec &x, const Vec &g, const std::function<double()> &f,
              float h = 1e-2f, double tol = 3e-3) {
  ASSERT_EQ(x.size(), g.size()) << what;
  for (size_t i = 0; i < x.size(); i++) {
    float x0 = x[i];
    x[i] = x0 + h;
    double fp = f();
    x[i] = x0 - h;
    double fm = f();
    x[i] = x0;
    double fd = (fp - fm) / (2.0 * h);
    ASSERT_NEAR(g[i], fd, tol * (1.0 + std::fabs(fd))) << what << "[" << i << "]";
  }
}

void expect_close(const char *what, const Vec &got, const std::vector<double> &want,
                  double rtol = 1e-5, double atol = 1e-6) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); i++)
    ASSERT_NEAR(got[i], want[i], atol + rtol * std::fabs(want[i])) << what << "[" << i << "]";
}

// ---------------------------------------------------------------- embedding
TEST_F(Kernels, EmbeddingForwardBackwardVocabParallel) {
  const int N = 7, C = 5, V = 11;
  Rng r(1);
  Vec wte = r.vec((size_t)V * C);
  std::vector<int32_t> tok = {3, 10, 0, 3, 7, 5, 3};
  Vec out((size_t)N * C), dout = r.vec((size_t)N * C);
  ASSERT_EQ(be->embedding_forward(&kc, out.data(), tok.data(), wte.data(), N, C, 0, V), MP_OK);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) EXPECT_EQ(out[n * C + c], wte[tok[n] * C + c]);
  // Shard [4, 8): rows outside are zero; the sum over shards {[0,4),[4,8),[8,11)} is the
  // full lookup; backward lands only in the local shard.
  const int cuts[4] = {0, 4, 8, 11};
  Vec sum((size_t)N * C, 0.0f);
  std::vector<double> dwte_want((size_t)V * C, 0.0);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) dwte_want[tok[n] * C + c] += dout[n * C + c];
  for (int s = 0; s < 3; s++) {
    int vs = cuts[s], ve = cuts[s + 1];
    Vec part((size_t)N * C, 99.0f), dshard((size_t)(ve - vs) * C, 0.0f);
    ASSERT_EQ(be->embedding_forward(&kc, part.data(), tok.data(), wte.data() + vs * C, N, C,
                                    vs, ve), MP_OK);
    for (int n = 0; n < N; n++)
      for (int c = 0; c < C; c++) {
        if (tok[n] < vs || tok[n] >= ve) {
          EXPECT_EQ(part[n * C + c], 0.0f);
        }
        sum[n * C + c] += part[n * C + c];
      }
    ASSERT_EQ(be->embedding_backward(&kc, dshard.data(), dout.data(), tok.data(), N, C, vs,
                                     ve), MP_OK);
    std::vector<double> want(dwte_want.begin() + vs * C, dwte_want.begin() + ve * C);
    expect_close("dwte shard", dshard, want);
  }
  for (size_t i = 0; i < sum.size(); i++) EXPECT_EQ(sum[i], out[i]);
}

// ---------------------------------------------------------------- norms
TEST_F(Kernels, LayerNormMatchesFormulaAndFiniteDifferences) {
  const int N = 5, C = 13;
  const float eps = 1e-5f;
  Rng r(2);
  Vec x = r.vec((size_t)N * C, -2, 3), w = r.vec(C, 0.5f, 1.5f), b = r.vec(C);
  Vec R = r.vec((size_t)N * C), out((size_t)N * C), mean(N), rstd(N);
  ASSERT_EQ(be->layernorm_forward(&kc, out.data(), mean.data(), rstd.data(), x.data(),
                                  w.data(), b.data(), N, C, eps), MP_OK);
  std::vector<double> want((size_t)N * C);
  for (int n = 0; n < N; n++) {
    double m = 0, v = 0;
    for (int c = 0; c < C; c++) m += x[n * C + c];
    m /= C;
    for (int c = 0; c < C; c++) v += (x[n * C + c] - m) * (x[n * C + c] - m);
    v /= C;
    for (int c = 0; c < C; c++)
      want[n * C + c] = (x[n * C + c] - m) / std::sqrt(v + eps) * w[c] + b[c];
  }
  expect_close("layernorm out", out, want);
  Vec dx((size_t)N * C, 0), dw(C, 0), db(C, 0);
  ASSERT_EQ(be->layernorm_backward(&kc, dx.data(), dw.data(), db.data(), R.data(), x.data(),
                                   w.data(), mean.data(), rstd.data(), N, C), MP_OK);
  auto f = [&]() {
    Vec o((size_t)N * C), m2(N), s2(N);
    be->layernorm_forward(&kc, o.data(), m2.data(), s2.data(), x.data(), w.data(), b.data(),
                          N, C, eps);
    return dot(o, R);
  };
  check_fd("ln dx", x, dx, f);
  check_fd("ln dw", w, dw, f);
  check_fd("ln db", b, db, f);
}

TEST_F(Kernels, RMSNormMatchesFormulaAndFiniteDifferences) {
  const int N = 6, C = 11;
  const float eps = 1e-6f;
  Rng r(3);
  Vec x = r.vec((size_t)N * C, -2, 2), w = r.vec(C, 0.5f, 1.5f), R = r.vec((size_t)N * C);
  Vec out((size_t)N * C), rstd(N);
  ASSERT_EQ(be->rmsnorm_forward(&kc, out.data(), rstd.data(), x.data(), w.data(), N, C, eps),
            MP_OK);
  std::vector<double> want((size_t)N * C);
  for (int n = 0; n < N; n++) {
    double ss = 0;
    for (int c = 0; c < C; c++) ss += (double)x[n * C + c] * x[n * C + c];
    for (int c = 0; c < C; c++) want[n * C + c] = x[n * C + c] / std::sqrt(ss / C + eps) * w[c];
  }
  expect_close("rmsnorm out", out, want);
  Vec dx((size_t)N * C, 0), dw(C, 0);
  ASSERT_EQ(be->rmsnorm_backward(&kc, dx.data(), dw.data(), R.data(), x.data(), w.data(),
                                 rstd.data(), N, C), MP_OK);
  auto f = [&]() {
    Vec o((size_t)N * C), s2(N);
    be->rmsnorm_forward(&kc, o.data(), s2.data(), x.data(), w.data(), N, C, eps);
    return dot(o, R);
  };
  check_fd("rms dx", x, dx, f);
  check_fd("rms dw", w, dw, f);
}

// ---------------------------------------------------------------- RoPE
TEST_F(Kernels, RopeRotateHalfAndInverse) {
  const int B = 2, T = 5, nh = 3, hd = 6, h2 = hd / 2;
  const float theta = 10000.0f;
  Vec cs((size_t)T * h2), sn((size_t)T * h2);
  mp_rope_tables(cs.data(), sn.data(), T, hd, theta, 0);
  // Table entry (t=3, i=1): angle 3 * 10000^(-2/6).
  EXPECT_NEAR(cs[3 * h2 + 1], std::cos(3.0 * std::pow(10000.0, -2.0 / 6)), 1e-7);
  Rng r(4);
  size_t n = (size_t)B * T * nh * hd;
  Vec x = r.vec(n), R = r.vec(n), out(n);
  ASSERT_EQ(be->rope_forward(&kc, out.data(), x.data(), cs.data(), sn.data(), B, T, nh, hd),
            MP_OK);
  std::vector<double> want(n);
  for (int b = 0; b < B; b++)
    for (int t = 0; t < T; t++)
      for (int h = 0; h < nh; h++)
        for (int i = 0; i < h2; i++) {
          size_t o = (((size_t)b * T + t) * nh + h) * hd;
          double a = t * std::pow((double)theta, -2.0 * i / hd);
          want[o + i] = x[o + i] * std::cos(a) - x[o + i + h2] * std::sin(a);
          want[o + i + h2] = x[o + i + h2] * std::cos(a) + x[o + i] * std::sin(a);
        }
  expect_close("rope out", out, want, 1e-5, 1e-6);
  Vec inplace = x;  // in place gives the same answer
  ASSERT_EQ(be->rope_forward(&kc, inplace.data(), inplace.data(), cs.data(), sn.data(), B, T,
                             nh, hd), MP_OK);
  EXPECT_EQ(inplace, out);
  Vec dx(n, 0);
  ASSERT_EQ(be->rope_backward(&kc, dx.data(), R.data(), cs.data(), sn.data(), B, T, nh, hd),
            MP_OK);
  auto f = [&]() {
    Vec o(n);
    be->rope_forward(&kc, o.data(), x.data(), cs.data(), sn.data(), B, T, nh, hd);
    return dot(o, R);
  };
  check_fd("rope dx", x, dx, f);
}

// ---------------------------------------------------------------- attention
TEST_F(Kernels, AttentionGQAMatchesNaiveAndFiniteDifferences) {
  const int B = 2, T = 5, nh = 4, nkv = 2, hd = 3;
  Rng r(5);
  size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd;
  Vec q = r.vec(nq), k = r.vec(nk), v = r.vec(nk), R = r.vec(nq);
  Vec out(nq), lse((size_t)B * nh * T);
  ASSERT_EQ(be->attention_forward(&kc, out.data(), lse.data(), q.data(), k.data(), v.data(),
                                  B, T, nh, nkv, hd, hd), MP_OK);
  std::vector<double> want(nq), want_lse((size_t)B * nh * T);
  for (int b = 0; b < B; b++)
    for (int h = 0; h < nh; h++)
      for (int t = 0; t < T; t++) {
        int g = h / (nh / nkv);
        std::vector<double> s(T);
        double m = -1e300, sum = 0;
        for (int j = 0; j <= t; j++) {
          double d = 0;
          for (int i = 0; i < hd; i++)
            d += (double)q[((b * T + t) * nh + h) * hd + i] * k[((b * T + j) * nkv + g) * hd + i];
          s[j] = d / std::sqrt((double)hd);
          m = std::max(m, s[j]);
        }
        for (int j = 0; j <= t; j++) sum += std::exp(s[j] - m);
        want_lse[(b * nh + h) * T + t] = m + std::log(sum);
        for (int i = 0; i < hd; i++) {
          double o = 0;
          for (int j = 0; j <= t; j++)
            o += std::exp(s[j] - m) / sum * v[((b * T + j) * nkv + g) * hd + i];
          want[((b * T + t) * nh + h) * hd + i] = o;
        }
      }
  expect_close("attn out", out, want);
  expect_close("attn lse", lse, want_lse);
  Vec dq(nq, 0), dk(nk, 0), dv(nk, 0);
  ASSERT_EQ(be->attention_backward(&kc, dq.data(), dk.data(), dv.data(), R.data(), q.data(),
                                   k.data(), v.data(), out.data(), lse.data(), B, T, nh, nkv,
                                   hd, hd), MP_OK);
  auto f = [&]() {
    Vec o(nq), l((size_t)B * nh * T);
    be->attention_forward(&kc, o.data(), l.data(), q.data(), k.data(), v.data(), B, T, nh, nkv,
                          hd, hd);
    return dot(o, R);
  };
  check_fd("attn dq", q, dq, f);
  check_fd("attn dk", k, dk, f);
  check_fd("attn dv", v, dv, f);
}

// Multi-head latent attention's value head (hv = 2) unlike the query/key head (hd = 5):
// the output equals the first hv features of the same attention over v zero-padded to hd
// (softmax weights depend on q and k only), the lse is the same, and the gradients match
// central differences.
TEST_F(Kernels, AttentionValueHeadUnlikeQueryHead) {
  const int B = 2, T = 4, nh = 2, nkv = 2, hd = 5, hv = 2;
  Rng r(9);
  const size_t rows = (size_t)B * T, nq = rows * nh * hd, nk = rows * nkv * hd, nv = rows * nkv * hv;
  Vec q = r.vec(nq), k = r.vec(nk), v = r.vec(nv), R = r.vec(rows * nh * hv);
  Vec out(rows * nh * hv), lse((size_t)B * nh * T);
  ASSERT_EQ(be->attention_forward(&kc, out.data(), lse.data(), q.data(), k.data(), v.data(), B, T, nh, nkv, hd, hv),
            MP_OK);
  Vec vpad(nk, 0.0f), opad(nq), lpad((size_t)B * nh * T);
  for (size_t i = 0; i < rows * nkv; i++)
    for (int x = 0; x < hv; x++) vpad[i * hd + x] = v[i * hv + x];
  ASSERT_EQ(be->attention_forward(&kc, opad.data(), lpad.data(), q.data(), k.data(), vpad.data(), B, T, nh, nkv,
                                  hd, hd), MP_OK);
  std::vector<double> want(out.size()), want_lse(lpad.begin(), lpad.end());
  for (size_t i = 0; i < rows * nh; i++)
    for (int x = 0; x < hv; x++) want[i * hv + x] = opad[i * hd + x];
  expect_close("mla out", out, want);
  expect_close("mla lse", lse, want_lse);
  Vec dq(nq, 0), dk(nk, 0), dv(nv, 0);
  ASSERT_EQ(be->attention_backward(&kc, dq.data(), dk.data(), dv.data(), R.data(), q.data(), k.data(), v.data(),
                                   out.data(), lse.data(), B, T, nh, nkv, hd, hv), MP_OK);
  auto f = [&]() {
    Vec o(out.size()), l(lse.size());
    be->attention_forward(&kc, o.data(), l.data(), q.data(), k.data(), v.data(), B, T, nh, nkv, hd, hv);
    return dot(o, R);
  };
  check_fd("mla dq", q, dq, f);
  check_fd("mla dk", k, dk, f);
  check_fd("mla dv", v, dv, f);
}

// Strided blocks (copy2d): assigned, then added, untouched elements kept.
TEST_F(Kernels, Copy2dStridedAssignAndAdd) {
  const Vec src = {1, 2, 3, 4, 5, 6, 7, 8, 9}; // 3 rows of 3
  Vec dst(8, -1.0f);                           // 2 rows of 4
  ASSERT_EQ(be->copy2d(&kc, dst.data() + 1, 4, src.data() + 1, 3, 2, 2, 0), MP_OK);
  EXPECT_EQ(dst, (Vec{-1, 2, 3, -1, -1, 5, 6, -1}));
  ASSERT_EQ(be->copy2d(&kc, dst.data() + 1, 4, src.data() + 1, 3, 2, 2, 1), MP_OK);
  EXPECT_EQ(dst, (Vec{-1, 4, 6, -1, -1, 10, 12, -1}));
  EXPECT_EQ(be->copy2d(&kc, dst.data(), 1, src.data(), 3, 2, 2, 0), MP_ERR_INVALID); // ld < cols
}

// ---------------------------------------------------------------- activations
TEST_F(Kernels, GeluAndSwiGLU) {
  const size_t n = 23;
  Rng r(6);
  Vec x = r.vec(n, -4, 4), R = r.vec(n), out(n);
  ASSERT_EQ(be->gelu_forward(&kc, out.data(), x.data(), n), MP_OK);
  std::vector<double> want(n);
  for (size_t i = 0; i < n; i++) {
    double t = x[i];
    want[i] = 0.5 * t * (1 + std::tanh(std::sqrt(2 / M_PI) * (t + 0.044715 * t * t * t)));
  }
  expect_close("gelu", out, want, 1e-5, 1e-6);
  Vec dx(n, 0);
  ASSERT_EQ(be->gelu_backward(&kc, dx.data(), R.data(), x.data(), n), MP_OK);
  check_fd("gelu dx", x, dx, [&]() {
    Vec o(n);
    be->gelu_forward(&kc, o.data(), x.data(), n);
    return dot(o, R);
  });
  Vec g = r.vec(n, -4, 4), u = r.vec(n, -2, 2);
  ASSERT_EQ(be->swiglu_forward(&kc, out.data(), g.data(), u.data(), n), MP_OK);
  for (size_t i = 0; i < n; i++) want[i] = g[i] / (1 + std::exp(-(double)g[i])) * u[i];
  expect_close("swiglu", out, want, 1e-5, 1e-6);
  Vec dg(n, 0), du(n, 0);
  ASSERT_EQ(be->swiglu_backward(&kc, dg.data(), du.data(), R.data(), g.data(), u.data(), n),
            MP_OK);
  auto f = [&]() {
    Vec o(n);
    be->swiglu_forward(&kc, o.data(), g.data(), u.data(), n);
    return dot(o, R);
  };
  check_fd("swiglu dgate", g, dg, f);
  check_fd("swiglu dup", u, du, f);
}

// ---------------------------------------------------------------- matmul
// Shapes cross every blocking edge: N=77 > MC=72 rows, M=133 > NC=128 columns, K=261 >
// KC=256, none a multiple of MR=6 or NR=16.
TEST_F(Kernels, MatmulRaggedMatchesNaive) {
  const int N = 77, K = 261, M = 133;
  Rng r(7);
  Vec x = r.vec((size_t)N * K), W = r.vec((size_t)M * K), bias = r.vec(M),
      dout = r.vec((size_t)N * M);
  Vec out((size_t)N * M);
  ASSERT_EQ(be->matmul_forward(&kc, out.data(), x.data(), W.data(), bias.data(), N, K, M),
            MP_OK);
  std::vector<double> want((size_t)N * M);
  for (int n = 0; n < N; n++)
    for (int m = 0; m < M; m++) {
      double s = bias[m];
      for (int k = 0; k < K; k++) s += (double)x[n * K + k] * W[m * K + k];
      want[n * M + m] = s;
    }
  // fp32 sums of 261 products of O(1) terms: |error| <= ~K * eps * sum|terms| ~ 1e-4 abs.
  expect_close("matmul out", out, want, 1e-5, 1e-4);
  // Accumulation: start from nonzero gradients and check += semantics.
  Vec dx((size_t)N * K, 1.0f), dW((size_t)M * K, 2.0f), db(M, 3.0f);
  ASSERT_EQ(be->matmul_backward(&kc, dx.data(), dW.data(), db.data(), dout.data(), x.data(),
                                W.data(), N, K, M), MP_OK);
  std::vector<double> wdx((size_t)N * K), wdW((size_t)M * K), wdb(M);
  for (int n = 0; n < N; n++)
    for (int k = 0; k < K; k++) {
      double s = 1.0;
      for (int m = 0; m < M; m++) s += (double)dout[n * M + m] * W[m * K + k];
      wdx[n * K + k] = s;
    }
  for (int m = 0; m < M; m++) {
    double sb = 3.0;
    for (int n = 0; n < N; n++) sb += dout[n * M + m];
    wdb[m] = sb;
    for (int k = 0; k < K; k++) {
      double s = 2.0;
      for (int n = 0; n < N; n++) s += (double)dout[n * M + m] * x[n * K + k];
      wdW[m * K + k] = s;
    }
  }
  expect_close("matmul dx", dx, wdx, 1e-5, 1e-4);
  expect_close("matmul dW", dW, wdW, 1e-5, 1e-4);
  expect_close("matmul db", db, wdb, 1e-5, 1e-4);
  // Bitwise identical with one thread and with several (no order depends on the team).
  int saved = omp_get_max_threads();
  omp_set_num_threads(1);
  Vec out1((size_t)N * M);
  be->matmul_forward(&kc, out1.data(), x.data(), W.data(), bias.data(), N, K, M);
  omp_set_num_threads(3);
  Vec out3((size_t)N * M);
  be->matmul_forward(&kc, out3.data(), x.data(), W.data(), bias.data(), N, K, M);
  omp_set_num_threads(saved);
  EXPECT_EQ(0, memcmp(out1.data(), out3.data(), out1.size() * sizeof(float)));
  EXPECT_EQ(0, memcmp(out1.data(), out.data(), out1.size() * sizeof(float)));
}

TEST_F(Kernels, MatmulFiniteDifferencesAndNullGrads) {
  const int N = 3, K = 5, M = 4;
  Rng r(8);
  Vec x = r.vec((size_t)N * K), W = r.vec((size_t)M * K), b = r.vec(M), R = r.vec((size_t)N * M);
  Vec dx((size_t)N * K, 0), dW((size_t)M * K, 0), db(M, 0);
  ASSERT_EQ(be->matmul_backward(&kc, dx.data(), dW.data(), db.data(), R.data(), x.data(),
                                W.data(), N, K, M), MP_OK);
  auto f = [&]() {
    Vec o((size_t)N * M);
    be->matmul_forward(&kc, o.data(), x.data(), W.data(), b.data(), N, K, M);
    return dot(o, R);
  };
  check_fd("mm dx", x, dx, f);
  check_fd("mm dW", W, dW, f);
  check_fd("mm db", b, db, f);
  // NULL gradients are skipped, the others still computed.
  Vec dW2((size_t)M * K, 0);
  ASSERT_EQ(be->matmul_backward(&kc, nullptr, dW2.data(), nullptr, R.data(), x.data(),
                                W.data(), N, K, M), MP_OK);
  EXPECT_EQ(dW2, dW);
}

// ---------------------------------------------------------------- router
TEST_F(Kernels, RouterTopkRenormAndBackward) {
  const int N = 5, E = 7, k = 3;
  Rng r(9);
  // Logits spaced at least 0.1 apart within a row so h = 1e-3 never changes the top-k.
  Vec logits((size_t)N * E);
  for (int n = 0; n < N; n++) {
    std::vector<int> perm(E);
    for (int e = 0; e < E; e++) perm[e] = e;
    for (int e = E - 1; e > 0; e--) std::swap(perm[e], perm[r.next() % (e + 1)]);
    for (int e = 0; e < E; e++) logits[n * E + e] = 0.3f * perm[e] + 0.05f * r.uni(0, 1);
  }
  for (int norm = 0; norm < 2; norm++) {
    Vec probs((size_t)N * E), w((size_t)N * k);
    std::vector<int32_t> idx((size_t)N * k);
    ASSERT_EQ(be->router_forward(&kc, probs.data(), idx.data(), w.data(), logits.data(), N, E,
                                 k, norm), MP_OK);
    for (int n = 0; n < N; n++) {
      double m = -1e300, s = 0;
      for (int e = 0; e < E; e++) m = std::max(m, (double)logits[n * E + e]);
      for (int e = 0; e < E; e++) s += std::exp(logits[n * E + e] - m);
      std::vector<int> order(E);
      for (int e = 0; e < E; e++) order[e] = e;
      std::sort(order.begin(), order.end(),
                [&](int a, int b) { return logits[n * E + a] > logits[n * E + b]; });
      double ssel = 0;
      for (int j = 0; j < k; j++) ssel += std::exp(logits[n * E + order[j]] - m) / s;
      for (int j = 0; j < k; j++) {
        EXPECT_EQ(idx[n * k + j], order[j]);
        double p = std::exp(logits[n * E + order[j]] - m) / s;
        EXPECT_NEAR(w[n * k + j], norm ? p / ssel : p, 1e-6);
      }
    }
    Vec Rw = r.vec((size_t)N * k), Rp = r.vec((size_t)N * E), dl((size_t)N * E, 0);
    ASSERT_EQ(be->router_backward(&kc, dl.data(), Rw.data(), Rp.data(), probs.data(),
                                  idx.data(), N, E, k, norm), MP_OK);
    check_fd(norm ? "router dlogits (norm)" : "router dlogits", logits, dl, [&]() {
      Vec p2((size_t)N * E), w2((size_t)N * k);
      std::vector<int32_t> i2((size_t)N * k);
      be->router_forward(&kc, p2.data(), i2.data(), w2.data(), logits.data(), N, E, k, norm);
      return dot(w2, Rw) + dot(p2, Rp);
    }, 1e-3f);
  }
  // Ties go to the lower expert index.
  Vec tie = {1.0f, 2.0f, 2.0f, 2.0f}, pt(4), wt(2);
  std::vector<int32_t> it(2);
  ASSERT_EQ(be->router_forward(&kc, pt.data(), it.data(), wt.data(), tie.data(), 1, 4, 2, 0),
            MP_OK);
  EXPECT_EQ(it[0], 1);
  EXPECT_EQ(it[1], 2);
}

TEST_F(Kernels, RouterAuxLossHandComputed) {
  // N=4 tokens, E=3 experts, k=1: routes 0,0,1,2 -> f = (2/4, 1/4, 1/4).
  Vec probs = {0.7f, 0.2f, 0.1f, 0.5f, 0.3f, 0.2f, 0.2f, 0.6f, 0.2f, 0.1f, 0.1f, 0.8f};
  std::vector<int32_t> idx = {0, 0, 1, 2};
  float aux = 0;
  Vec f(3);
  ASSERT_EQ(be->router_aux_loss_forward(&kc, &aux, f.data(), probs.data(), idx.data(), 4, 3,
                                        1), MP_OK);
  // P = (1.5/4, 1.2/4, 1.3/4); aux = 3 * (0.5*0.375 + 0.25*0.3 + 0.25*0.325) = 1.03125.
  EXPECT_NEAR(aux, 1.03125, 1e-6);
  EXPECT_FLOAT_EQ(f[0], 0.5f);
  Vec dp(12, 0);
  ASSERT_EQ(be->router_aux_loss_backward(&kc, dp.data(), f.data(), 2.0f, 4, 3), MP_OK);
  check_fd("aux dprobs", probs, dp, [&]() {
    float a;
    Vec f2(3);
    be->router_aux_loss_forward(&kc, &a, f2.data(), probs.data(), idx.data(), 4, 3, 1);
    return 2.0 * a;
  });
}

// ---------------------------------------------------------------- permute
TEST_F(Kernels, PermuteGroupsByExpertAndRoundTrips) {
  const int N = 6, k = 2, C = 5, E = 4;
  std::vector<int32_t> idx = {2, 0, 1, 2, 0, 3, 2, 1, 0, 2, 3, 1};
  std::vector<int32_t> perm(N * k), inv(N * k), counts(E);
  ASSERT_EQ(be->moe_plan(&kc, perm.data(), inv.data(), counts.data(), idx.data(), N, E, k),
            MP_OK);
  EXPECT_EQ(counts, (std::vector<int32_t>{3, 3, 4, 2}));
  // Expert 0 takes pairs 1, 4, 8 in that order; expert 3 pairs 5, 10.
  EXPECT_EQ(perm[0], 1);
  EXPECT_EQ(perm[1], 4);
  EXPECT_EQ(perm[2], 8);
  EXPECT_EQ(perm[10], 5);
  EXPECT_EQ(perm[11], 10);
  for (int rr = 0; rr < N * k; rr++) EXPECT_EQ(inv[perm[rr]], rr);
  for (int rr = 1; rr < N * k; rr++) EXPECT_LE(idx[perm[rr - 1]], idx[perm[rr]]);
  Rng r(10);
  Vec x = r.vec((size_t)N * C), px((size_t)N * k * C), back((size_t)N * C);
  ASSERT_EQ(be->permute_forward(&kc, px.data(), x.data(), perm.data(), N, k, C), MP_OK);
  // Round trip: weights summing to 1 per token give x back.
  Vec w((size_t)N * k);
  for (int n = 0; n < N; n++) {
    w[n * k] = 0.25f;
    w[n * k + 1] = 0.75f;
  }
  ASSERT_EQ(be->unpermute_forward(&kc, back.data(), px.data(), w.data(), inv.data(), N, k, C),
            MP_OK);
  for (size_t i = 0; i < x.size(); i++) EXPECT_NEAR(back[i], x[i], 1e-6);
  // Backward of both against finite differences.
  Vec Rp = r.vec((size_t)N * k * C), dx((size_t)N * C, 0);
  ASSERT_EQ(be->permute_backward(&kc, dx.data(), Rp.data(), inv.data(), N, k, C), MP_OK);
  check_fd("permute dx", x, dx, [&]() {
    Vec o((size_t)N * k * C);
    be->permute_forward(&kc, o.data(), x.data(), perm.data(), N, k, C);
    return dot(o, Rp);
  });
  Vec y = r.vec((size_t)N * k * C), Ru = r.vec((size_t)N * C), dy(y.size(), 0), dw(w.size(), 0);
  ASSERT_EQ(be->unpermute_backward(&kc, dy.data(), dw.data(), Ru.data(), y.data(), w.data(),
                                   inv.data(), N, k, C), MP_OK);
  auto f = [&]() {
    Vec o((size_t)N * C);
    be->unpermute_forward(&kc, o.data(), y.data(), w.data(), inv.data(), N, k, C);
    return dot(o, Ru);
  };
  check_fd("unpermute dy", y, dy, f);
  check_fd("unpermute dw", w, dw, f);
  // A corrupt expert index is refused with a message.
  idx[3] = 9;
  EXPECT_EQ(be->moe_plan(&kc, perm.data(), inv.data(), counts.data(), idx.data(), N, E, k),
            MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&err)).find("outside"), std::string::npos);
}

// Dropped pairs (expert index -1, an expert's capacity): the pairs above with pairs 0, 5 and
// 9 dropped. Expert 0 still takes pairs 1, 4, 8 (rows 0..2); expert 1 pairs 2, 7, 11 (rows
// 3..5); expert 2 pairs 3, 6 (rows 6, 7); expert 3 pair 10 (row 8): 9 rows placed, rows 9..11
// unplaced (perm -1, zero after permute). A dropped pair adds nothing forward and gets no
// gradient: unpermute equals the sum over the kept pairs, and the backward passes only them.
TEST_F(Kernels, PermuteSkipsDroppedPairs) {
  const int N = 6, k = 2, C = 3, E = 4;
  const std::vector<int32_t> idx = {-1, 0, 1, 2, 0, -1, 2, 1, 0, -1, 3, 1};
  std::vector<int32_t> perm(N * k, 7), inv(N * k), counts(E);
  ASSERT_EQ(be->moe_plan(&kc, perm.data(), inv.data(), counts.data(), idx.data(), N, E, k), MP_OK);
  EXPECT_EQ(counts, (std::vector<int32_t>{3, 3, 2, 1}));
  EXPECT_EQ(perm, (std::vector<int32_t>{1, 4, 8, 2, 7, 11, 3, 6, 10, -1, -1, -1}));
  for (int p : {0, 5, 9}) EXPECT_EQ(inv[p], -1) << p;
  for (int rr = 0; rr < 9; rr++) EXPECT_EQ(inv[perm[rr]], rr);
  Rng r(12);
  Vec x = r.vec((size_t)N * C), px((size_t)N * k * C, 5.0f);
  ASSERT_EQ(be->permute_forward(&kc, px.data(), x.data(), perm.data(), N, k, C), MP_OK);
  for (int rr = 0; rr < N * k; rr++)
    for (int c = 0; c < C; c++)
      EXPECT_EQ(px[rr * C + c], perm[rr] < 0 ? 0.0f : x[(perm[rr] / k) * C + c]) << rr;
  Vec y = r.vec((size_t)N * k * C), w = r.vec((size_t)N * k), out((size_t)N * C);
  ASSERT_EQ(be->unpermute_forward(&kc, out.data(), y.data(), w.data(), inv.data(), N, k, C), MP_OK);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      double want = 0;
      for (int j = 0; j < k; j++)
        if (idx[n * k + j] >= 0) want += (double)w[n * k + j] * y[inv[n * k + j] * C + c];
      EXPECT_NEAR(out[n * C + c], want, 1e-6) << n;
    }
  Vec g = r.vec((size_t)N * C), dy(y.size(), 0), dw(w.size(), 0), dx((size_t)N * C, 0);
  ASSERT_EQ(be->unpermute_backward(&kc, dy.data(), dw.data(), g.data(), y.data(), w.data(), inv.data(), N, k, C),
            MP_OK);
  for (int p : {0, 5, 9}) EXPECT_EQ(dw[p], 0.0f) << p;
  for (int rr = 9; rr < N * k; rr++)
    for (int c = 0; c < C; c++) EXPECT_EQ(dy[rr * C + c], 0.0f) << rr;
  ASSERT_EQ(be->permute_backward(&kc, dx.data(), y.data(), inv.data(), N, k, C), MP_OK);
  for (int n = 0; n < N; n++)
    for (int c = 0; c < C; c++) {
      double want = 0;
      for (int j = 0; j < k; j++)
        if (idx[n * k + j] >= 0) want += y[inv[n * k + j] * C + c];
      EXPECT_NEAR(dx[n * C + c], want, 1e-6) << n;
    }
}

// ---------------------------------------------------------------- cross-entropy
TEST_F(Kernels, CrossEntropyMeanIgnoreAndVocabParallel) {
  const int N = 6, V = 17;
  Rng r(11);
  Vec logits = r.vec((size_t)N * V, -3, 3);
  std::vector<int32_t> tgt = {3, 16, -100, 0, 9, 3};
  Vec losses(N), lse(N);
  float mean = 0;
  ASSERT_EQ(be->cross_entropy_forward(&kc, losses.data(), &mean, lse.data(), logits.data(),
                                      tgt.data(), N, V), MP_OK);
  double total = 0;
  for (int n = 0; n < N; n++) {
    double m = -1e300, s = 0;
    for (int v = 0; v < V; v++) m = std::max(m, (double)logits[n * V + v]);
    for (int v = 0; v < V; v++) s += std::exp(logits[n * V + v] - m);
    double want = tgt[n] < 0 ? 0.0 : m + std::log(s) - logits[n * V + tgt[n]];
    EXPECT_NEAR(losses[n], want, 1e-5);
    total += want;
  }
  EXPECT_NEAR(mean, total / 5, 1e-6);  // 5 valid rows
  Vec dl((size_t)N * V, 0);
  ASSERT_EQ(be->ce_backward(&kc, dl.data(), logits.data(), lse.data(), tgt.data(), 1.0f / 5,
                            N, V, 0), MP_OK);
  check_fd("ce dlogits", logits, dl, [&]() {
    Vec l2(N), s2(N);
    float m2;
    be->cross_entropy_forward(&kc, l2.data(), &m2, s2.data(), logits.data(), tgt.data(), N, V);
    return (double)m2;
  }, 1e-2f, 3e-3);
  // Vocab-parallel over shards [0,5), [5,12), [12,17), glued as the runtime will.
  const int cuts[4] = {0, 5, 12, 17};
  std::vector<Vec> sh(3);
  for (int s = 0; s < 3; s++) {
    int Vl = cuts[s + 1] - cuts[s];
    sh[s].resize((size_t)N * Vl);
    for (int n = 0; n < N; n++)
      for (int v = 0; v < Vl; v++) sh[s][n * Vl + v] = logits[n * V + cuts[s] + v];
  }
  Vec gmax(N, -INFINITY), gsum(N, 0), gtgt(N, 0), tmp(N);
  for (int s = 0; s < 3; s++) {
    be->ce_local_max(&kc, tmp.data(), sh[s].data(), N, cuts[s + 1] - cuts[s]);
    for (int n = 0; n < N; n++) gmax[n] = std::max(gmax[n], tmp[n]);
  }
  for (int s = 0; s < 3; s++) {
    be->ce_local_sumexp(&kc, tmp.data(), sh[s].data(), gmax.data(), N, cuts[s + 1] - cuts[s]);
    for (int n = 0; n < N; n++) gsum[n] += tmp[n];
    be->ce_local_target(&kc, tmp.data(), sh[s].data(), tgt.data(), N, cuts[s + 1] - cuts[s],
                        cuts[s]);
    for (int n = 0; n < N; n++) gtgt[n] += tmp[n];
  }
  Vec l3(N), lse3(N);
  float mean3;
  ASSERT_EQ(be->ce_vp_combine(&kc, l3.data(), &mean3, lse3.data(), gmax.data(), gsum.data(),
                              gtgt.data(), tgt.data(), N), MP_OK);
  for (int n = 0; n < N; n++) EXPECT_NEAR(l3[n], losses[n], 1e-6);
  EXPECT_NEAR(mean3, mean, 1e-6);
  for (int s = 0; s < 3; s++) {
    int Vl = cuts[s + 1] - cuts[s];
    Vec d((size_t)N * Vl, 0);
    ASSERT_EQ(be->ce_backward(&kc, d.data(), sh[s].data(), lse3.data(), tgt.data(), 1.0f / 5,
                              N, Vl, cuts[s]), MP_OK);
    for (int n = 0; n < N; n++)
      for (int v = 0; v < Vl; v++) EXPECT_NEAR(d[n * Vl + v], dl[n * V + cuts[s] + v], 1e-7);
  }
}

// ---------------------------------------------------------------- optimizer
TEST_F(Kernels, AdamWClosedFormAndClipping) {
  const size_t n = 9;
  Rng r(12);
  Vec p = r.vec(n), g = r.vec(n), m(n, 0), v(n, 0);
  Vec p0 = p;
  const float lr = 1e-2f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
  ASSERT_EQ(be->adamw_update(&kc, p.data(), g.data(), m.data(), v.data(), n, lr, b1, b2, eps,
                             wd, 1, gs), MP_OK);
  // Step 1 from zero state: mhat = g', vhat = g'^2, so p1 = p0 (1 - lr wd) - lr g'/(|g'|+eps).
  for (size_t i = 0; i < n; i++) {
    double gg = (double)g[i] * gs;
    EXPECT_NEAR(p[i], p0[i] * (1 - (double)lr * wd) - lr * gg / (std::fabs(gg) + eps), 1e-7);
  }
  // Step 2 against the textbook recurrences in double.
  Vec g2 = r.vec(n);
  Vec p1 = p;
  ASSERT_EQ(be->adamw_update(&kc, p.data(), g2.data(), m.data(), v.data(), n, lr, b1, b2, eps,
                             wd, 2, 1.0f), MP_OK);
  for (size_t i = 0; i < n; i++) {
    double ga = (double)g[i] * gs, gb = g2[i];
    double mm = (1 - b1) * ga * b1 + (1 - b1) * gb, vv = (1 - b2) * ga * ga * b2 + (1 - b2) * gb * gb;
    double mh = mm / (1 - (double)b1 * b1), vh = vv / (1 - (double)b2 * b2);
    EXPECT_NEAR(p[i], p1[i] * (1 - (double)lr * wd) - lr * mh / (std::sqrt(vh) + eps), 1e-6);
  }
  // Gradient norm pieces.
  float ss = 1.0f;
  ASSERT_EQ(be->sum_squares(&kc, &ss, g.data(), n), MP_OK);
  double want = 1.0;
  for (float x : g) want += (double)x * x;
  EXPECT_NEAR(ss, want, 1e-6);
  EXPECT_FLOAT_EQ(mp_clip_scale(2.0f, 1.0f), 1.0f / (2.0f + 1e-6f));
  EXPECT_EQ(mp_clip_scale(0.5f, 1.0f), 1.0f);
  Vec s = {1, -2, 4};
  be->scale_f32(&kc, s.data(), 3, 0.5f);
  EXPECT_EQ(s, (Vec{0.5f, -1.0f, 2.0f}));
  Vec a = {1, 2}, b = {10, 20}, o(2);
  be->residual_forward(&kc, o.data(), a.data(), b.data(), 2);
  EXPECT_EQ(o, (Vec{11, 22}));
  be->accumulate(&kc, o.data(), a.data(), 2);
  EXPECT_EQ(o, (Vec{12, 24}));
}

// ---------------------------------------------------------------- float8
TEST_F(Kernels, Float8HandComputedValues) {
  // 0.1 = 1.6 * 2^-4; E4M3 quantum there is 2^-7: 12.8 -> 13 -> 13/128 = 0.1015625.
  EXPECT_EQ(mp_f8_decode(mp_f8_encode(0.1f, MP_F8_E4M3), MP_F8_E4M3), 0.1015625f);
  // E5M2 quantum is 2^-6: 6.4 -> 6 -> 0.09375.
  EXPECT_EQ(mp_f8_decode(mp_f8_encode(0.1f, MP_F8_E5M2), MP_F8_E5M2), 0.09375f);
  // Saturation: 449 and 464 (would round to 480) and inf give 448 = 0x7E.
  EXPECT_EQ(mp_f8_encode(449.0f, MP_F8_E4M3), 0x7E);
  EXPECT_EQ(mp_f8_encode(464.0f, MP_F8_E4M3), 0x7E);
  EXPECT_EQ(mp_f8_encode(INFINITY, MP_F8_E4M3), 0x7E);
  EXPECT_EQ(mp_f8_encode(-1e9f, MP_F8_E4M3), 0xFE);
  EXPECT_EQ(mp_f8_decode(0x7E, MP_F8_E4M3), 448.0f);
  EXPECT_EQ(mp_f8_decode(mp_f8_encode(60000.0f, MP_F8_E5M2), MP_F8_E5M2), 57344.0f);
  EXPECT_EQ(mp_f8_encode(57344.0f, MP_F8_E5M2), 0x7B);
  EXPECT_TRUE(std::isnan(mp_f8_decode(mp_f8_encode(NAN, MP_F8_E4M3), MP_F8_E4M3)));
  EXPECT_TRUE(std::isnan(mp_f8_decode(mp_f8_encode(NAN, MP_F8_E5M2), MP_F8_E5M2)));
  EXPECT_TRUE(std::isinf(mp_f8_decode(0x7C, MP_F8_E5M2)));
  // Subnormals. E4M3 smallest is 2^-9 (code 0x01); 2^-10 is a tie between 0 and 2^-9 and
  // goes to the even code 0; 3*2^-10 ties 2^-9 and 2^-8 and goes to 2^-8 (code 0x02).
  EXPECT_EQ(mp_f8_encode(std::ldexp(1.0f, -9), MP_F8_E4M3), 0x01);
  EXPECT_EQ(mp_f8_encode(std::ldexp(1.0f, -10), MP_F8_E4M3), 0x00);
  EXPECT_EQ(mp_f8_encode(3 * std::ldexp(1.0f, -10), MP_F8_E4M3), 0x02);
  EXPECT_EQ(mp_f8_decode(0x07, MP_F8_E4M3), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(mp_f8_decode(0x08, MP_F8_E4M3), std::ldexp(1.0f, -6));  // smallest normal
  EXPECT_EQ(mp_f8_decode(0x01, MP_F8_E5M2), std::ldexp(1.0f, -16));
  EXPECT_EQ(mp_f8_encode(-std::ldexp(1.0f, -16), MP_F8_E5M2), 0x81);
  // Normal-range ties: 1 + 1/16 lies between 1 (mant 0) and 1.125 (mant 1) in E4M3 -> 1.
  EXPECT_EQ(mp_f8_encode(1.0625f, MP_F8_E4M3), 0x38);
  EXPECT_EQ(mp_f8_encode(1.1875f, MP_F8_E4M3), 0x3A);  // between mant 1 and 2 -> 2
}

TEST_F(Kernels, Float8AllCodesRoundTripAndTiesToEven) {
  for (int f = 0; f < 2; f++) {
    mp_f8_format fmt = f ? MP_F8_E5M2 : MP_F8_E4M3;
    float prev = -1;
    for (int c = 0; c < 128; c++) {
      float v = mp_f8_decode((uint8_t)c, fmt);
      if (std::isnan(v) || std::isinf(v)) continue;
      EXPECT_EQ(mp_f8_encode(v, fmt), c) << "fmt " << f << " code " << c;
      EXPECT_EQ(mp_f8_encode(-v, fmt), c | 0x80);
      EXPECT_GT(v, prev);  // codes are monotonic in value
      if (c > 0) {
        // The midpoint to the previous code is a tie: it goes to the even code.
        float mid = (float)(((double)prev + v) / 2);
        int even = (c % 2 == 0) ? c : c - 1;
        EXPECT_EQ(mp_f8_encode(mid, fmt), even) << "fmt " << f << " tie below code " << c;
      }
      prev = v;
    }
  }
}

TEST_F(Kernels, Float8TensorwiseScaleQuantizeDequantize) {
  Vec x = {0.5f, -3.0f, 0.01f, 2.25f, 0.0f};
  float amax = 0, scale = 0;
  ASSERT_EQ(be->f8_amax(&kc, &amax, x.data(), x.size()), MP_OK);
  EXPECT_EQ(amax, 3.0f);
  ASSERT_EQ(be->f8_scale_from_amax(&kc, &scale, &amax, MP_F8_E4M3), MP_OK);
  EXPECT_FLOAT_EQ(scale, 448.0f / 3.0f);
  std::vector<uint8_t> codes(x.size());
  Vec dq(x.size()), fq(x.size());
  ASSERT_EQ(be->f8_quantize(&kc, codes.data(), x.data(), &scale, x.size(), MP_F8_E4M3), MP_OK);
  ASSERT_EQ(be->f8_dequantize(&kc, dq.data(), codes.data(), &scale, x.size(), MP_F8_E4M3),
            MP_OK);
  ASSERT_EQ(be->f8_fake_quantize(&kc, fq.data(), x.data(), &scale, x.size(), MP_F8_E4M3),
            MP_OK);
  EXPECT_EQ(codes[1], 0xFE);          // -amax lands on -448 exactly
  EXPECT_FLOAT_EQ(dq[1], -3.0f);
  EXPECT_EQ(dq, fq);
  // 0.5 * 149.33 = 74.67; E4M3 quantum at 64..128 is 8 -> 72 -> 72 / scale = 0.48214...
  EXPECT_FLOAT_EQ(dq[0], 72.0f / scale);
  EXPECT_EQ(dq[4], 0.0f);
  // An all-zero tensor gets the EPS-clamped scale, not a division by zero.
  float z = 0;
  ASSERT_EQ(be->f8_scale_from_amax(&kc, &scale, &z, MP_F8_E5M2), MP_OK);
  EXPECT_FLOAT_EQ(scale, 57344.0f / 1e-12f);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(mp_bf16_from_f32(1.0f), 0x3F80);
  EXPECT_EQ(mp_bf16_from_f32(1.0f + std::ldexp(1.0f, -8)), 0x3F80);      // tie -> even
  EXPECT_EQ(mp_bf16_from_f32(1.0f + 3 * std::ldexp(1.0f, -8)), 0x3F82);  // tie -> even
  EXPECT_EQ(mp_bf16_to_f32(0x3F81), 1.0f + std::ldexp(1.0f, -7));
  EXPECT_TRUE(std::isnan(mp_bf16_to_f32(mp_bf16_from_f32(NAN))));
}

TEST_F(Kernels, BackendTableIsCompleteAndMemoryHooksWork) {
  EXPECT_STREQ(be->name, "cpu");
  EXPECT_EQ(be->x_dtype, MP_KDTYPE_F32);
  // Every function pointer after the two data fields is set.
  const char *base = (const char *)be;
  size_t first = offsetof(mp_backend, init);
  for (size_t off = first; off + sizeof(void *) <= sizeof(mp_backend); off += sizeof(void *)) {
    void *fp;
    memcpy(&fp, base + off, sizeof(fp));
    EXPECT_NE(fp, nullptr) << "entry at offset " << off;
  }
  void *p = nullptr;
  ASSERT_EQ(be->alloc(&kc, &p, 100), MP_OK);
  EXPECT_EQ((uintptr_t)p % 64, 0u);
  Vec h = {1, 2, 3}, back(3);
  ASSERT_EQ(be->to_device_f32(&kc, p, h.data(), 3), MP_OK);
  ASSERT_EQ(be->from_device_f32(&kc, back.data(), p, 3), MP_OK);
  EXPECT_EQ(back, h);
  be->free(&kc, p);
  EXPECT_EQ(be->init(&kc, 1), MP_ERR_INVALID);
}

}  // namespace
