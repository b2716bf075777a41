// The CPU span-attention ops (kernels/cpu/attention.c: attention_span_*), the building
// blocks of ring attention, against the monolithic attention kernel of the same backend
// and against naive formulas evaluated in double.
//
// Ring against monolithic: the sequence is split into 2cp chunks (cp = 1, 2, 4; even and
// uneven chunk sizes, so most pairs have Tq != Tk), ranks hold chunks r and 2cp-1-r, and
// every (query chunk, kv chunk) pair runs in ring order (tests/kernels/ring_attention.h).
// The result must equal attention_forward / attention_backward on the whole sequence
// within 1e-6 of the tensor's largest magnitude (at least 1): fp32 throughout, with the
// merge in double, the only differences are the order of the sums (dq over kv chunks in
// ring order, the softmax over chunks merged through their lse) and the fp32 rounding of
// the lse kept between merges, a few ulps (~1e-7 relative) each, 4.2e-7 at most measured
// on these sequences of <= 48 positions; a wrong mask, position or merge weight gives
// errors of order 1e-2 and more. Longer sums and peaked scores get bounds derived where
// they are tested.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "tests/kernels/cpu_fixture.h"
#include "tests/kernels/ring_attention.h"
#include "tests/test_rng.h"

namespace {

using Vec = std::vector<float>;

using mp_test::RingAttention;
using mp_test::RingProblem;
using mp_test::RingResult;
using mp_test::Rng;

class AttentionSpan : public mp_test::CpuKernels {
 protected:
  // The monolithic forward and backward on p's whole sequence.
  RingResult monolithic(const RingProblem &p) {
    RingResult r;
    EXPECT_EQ(mp_test::monolithic_attention(be, &kc, p, false, &r), MP_OK) << mp_errmsg(&err);
    return r;
  }

  RingResult ring(const RingProblem &p) {
    RingResult r;
    RingAttention ra(be, &kc);
    EXPECT_EQ(ra.run(p, &r), MP_OK) << mp_errmsg(&err);
    return r;
  }
};

RingProblem make_problem(int B, int T, int nh, int nkv, int hd, std::vector<int> bounds,
                         uint64_t seed, float spread = 2.0f) {
  RingProblem p{B, T, nh, nkv, hd, std::move(bounds), {}, {}, {}, {}};
  Rng r(seed);
  const size_t nq = (size_t)B * T * nh * hd, nk = (size_t)B * T * nkv * hd;
  p.q = r.vec(nq, -spread, spread);
  p.k = r.vec(nk, -spread, spread);
  p.v = r.vec(nk);
  p.dout = r.vec(nq);
  return p;
}

// max |got - want| / max(1, max |want|); infinity on a NaN or inf in got.
double scaled_err(const Vec &got, const Vec &want) {
  if (got.size() != want.size()) return INFINITY;
  double e = 0, m = 1;
  for (size_t i = 0; i < got.size(); i++) {
    if (!std::isfinite(got[i])) return INFINITY;
    e = std::max(e, std::fabs((double)got[i] - want[i]));
    m = std::max(m, std::fabs((double)want[i]));
  }
  return e / m;
}

std::string describe(const RingProblem &p) {
  std::string s = "B=" + std::to_string(p.B) + " T=" + std::to_string(p.T) +
                  " nh=" + std::to_string(p.nh) + " nkv=" + std::to_string(p.nkv) +
                  " hd=" + std::to_string(p.hd) + " bounds=";
  for (int b : p.bounds) s += std::to_string(b) + ",";
  return s;
}

void expect_ring_matches(const RingResult &got, const RingResult &want, const RingProblem &p,
                         double tol = 1e-6) {
  const char *names[] = {"out", "lse", "dq", "dk", "dv"};
  const Vec *g[] = {&got.out, &got.lse, &got.dq, &got.dk, &got.dv};
  const Vec *w[] = {&want.out, &want.lse, &want.dq, &want.dk, &want.dv};
  for (int i = 0; i < 5; i++)
    EXPECT_LE(scaled_err(*g[i], *w[i]), tol) << names[i] << " " << describe(p);
}

TEST_F(AttentionSpan, RingMatchesMonolithicForCp124) {
  // T = 48: chunks of 24, 12, 6; T = 37: uneven chunks (19/18, 10/9, 5/4); hd = 5 and
  // GQA 4:2 and 6:2; B = 2 so the batch stride of the local sequences is exercised.
  for (int cp : {1, 2, 4})
    for (int T : {48, 37}) {
      RingProblem p = make_problem(2, T, 4, 2, 5, mp_test::even_bounds(T, cp), 100 + cp * 7 + T);
      expect_ring_matches(ring(p), monolithic(p), p);
    }
  RingProblem p = make_problem(1, 40, 6, 2, 16, mp_test::even_bounds(40, 2), 9);
  expect_ring_matches(ring(p), monolithic(p), p);
  // Pairs large enough for a thread team (kernels/cpu/attention.c: 2^18 multiply-adds), on
  // a sequence long enough that the order of the fp32 sums matters more: dk and dv sum
  // n = (nh / nkv) T = 600 terms, in ring order here and in position order there, and two
  // orders of an fp32 sum differ by ~sqrt(n) 2^-24 of its magnitude (a random walk of
  // roundings); bound 4 sqrt(n) 2^-24 = 5.8e-6 (measured 9.3e-7).
  RingProblem big = make_problem(2, 300, 4, 2, 16, mp_test::even_bounds(300, 2), 10);
  expect_ring_matches(ring(big), monolithic(big), big, 4.0 * std::sqrt(600.0) / 16777216.0);
}

// Chunks of very different sizes (1-token chunks, a long one), so Tq and Tk differ by up
// to 20x within one pair and the diagonal pairs are rectangles.
TEST_F(AttentionSpan, RingMatchesMonolithicWithRaggedChunks) {
  RingProblem p = make_problem(2, 33, 4, 1, 8, {0, 1, 21, 22, 26, 27, 29, 30, 33}, 77);
  expect_ring_matches(ring(p), monolithic(p), p);
  RingProblem p2 = make_problem(1, 25, 2, 2, 3, {0, 20, 21, 23, 25}, 78);
  expect_ring_matches(ring(p2), monolithic(p2), p2);
}

// Peaked scores (spread 6, hd 8: scores ~ N(0, 12^2)): the running maximum jumps between
// chunks, so the merge weights e^(lse - lse') span many orders of magnitude. Both sides
// round every score and lse to fp32, an absolute error of up to 2^-24 |x| in an exponent,
// which is the same relative error in a probability: with |lse| up to ~50 that is ~3e-6
// per rounding instead of ~3e-7 at |lse| ~ 5, so the bound scales with the largest |lse|
// (1e-6 per 4 units of it, the spread-2 tests' ratio).
TEST_F(AttentionSpan, RingMatchesMonolithicWithPeakedScores) {
  RingProblem p = make_problem(2, 40, 4, 2, 8, mp_test::even_bounds(40, 4), 55, 6.0f);
  RingResult want = monolithic(p);
  double max_lse = 0;
  for (float l : want.lse) max_lse = std::max(max_lse, (double)std::fabs(l));
  EXPECT_GT(max_lse, 20.0) << "the scores are not peaked";
  expect_ring_matches(ring(p), want, p, 1e-6 * std::max(1.0, max_lse / 4));
}

// One chunk at position 0 is the monolithic op, bit for bit (the same code path).
TEST_F(AttentionSpan, OneChunkIsTheMonolithicOpBitForBit) {
  RingProblem p = make_problem(2, 29, 4, 2, 6, {0, 29, 29}, 31);
  RingResult want = monolithic(p);
  const int B = p.B, T = p.T, nh = p.nh, hd = p.hd;
  const size_t nq = p.q.size(), nk = p.k.size(), nl = (size_t)B * nh * T;
  mp_attn_span sp = {B, nh, p.nkv, hd, T, 0, T, 0, T, 0, T, 0};
  Vec acc(nq, 7.0f), lse(nl), out(nq), D(nl), dq(nq, 0.0f), dk(nk, 0.0f), dv(nk, 0.0f);
  ASSERT_EQ(be->attention_span_init(&kc, lse.data(), nl), MP_OK);
  ASSERT_EQ(be->attention_span_forward(&kc, acc.data(), lse.data(), p.q.data(), p.k.data(),
                                       p.v.data(), &sp), MP_OK);
  ASSERT_EQ(be->attention_span_finalize(&kc, out.data(), acc.data(), lse.data(), B, T, nh, hd),
            MP_OK);
  ASSERT_EQ(be->attention_span_dot(&kc, D.data(), p.dout.data(), out.data(), B, T, nh, hd), MP_OK);
  ASSERT_EQ(be->attention_span_backward(&kc, dq.data(), dk.data(), dv.data(), p.dout.data(),
                                        p.q.data(), p.k.data(), p.v.data(), lse.data(), D.data(),
                                        &sp), MP_OK);
  EXPECT_EQ(out, want.out);
  EXPECT_EQ(lse, want.lse);
  EXPECT_EQ(dq, want.dq);
  EXPECT_EQ(dk, want.dk);
  EXPECT_EQ(dv, want.dv);
}

// The naive forward of one query row over keys [0, n) of (k, v) rows kb, vb (stride ks), in
// double: the softmax mean of the values and the log-sum-exp.
void naive_row(const float *qt, const float *kb, const float *vb, size_t ks, int n, int hd,
               std::vector<double> *o, double *lse) {
  std::vector<double> s(n);
  double m = -INFINITY;
  for (int j = 0; j < n; j++) {
    double d = 0;
    for (int x = 0; x < hd; x++) d += (double)qt[x] * kb[j * ks + x];
    s[j] = d / std::sqrt((double)hd);
    m = std::max(m, s[j]);
  }
  double sum = 0;
  for (int j = 0; j < n; j++) sum += std::exp(s[j] - m);
  o->assign(hd, 0.0);
  for (int j = 0; j < n; j++)
    for (int x = 0; x < hd; x++) (*o)[x] += std::exp(s[j] - m) / sum * vb[j * ks + x];
  *lse = m + std::log(sum);
}

// A q chunk inside a longer local sequence (rows 3..9 of 12, positions 20..26) against two
// kv chunks of other lengths inside their own tensor (rows 3..12 of 13 at positions
// 14..23, then rows 0..2 at positions 11..13): the merged state equals the naive
// attention of each query over the union of the keys it sees, rows outside the q chunk
// keep their values, and the two orders of the pairs agree to rounding.
TEST_F(AttentionSpan, SpanWithOffsetsMatchesNaiveAndLeavesOtherRows) {
  const int B = 2, nh = 4, nkv = 2, hd = 5, Sq = 12, Sk = 13;
  Rng r(4);
  Vec q = r.vec((size_t)B * Sq * nh * hd, -2, 2), k = r.vec((size_t)B * Sk * nkv * hd, -2, 2),
      v = r.vec((size_t)B * Sk * nkv * hd);
  const mp_attn_span a = {B, nh, nkv, hd, Sq, 3, 7, 20, Sk, 3, 10, 14};
  const mp_attn_span c = {B, nh, nkv, hd, Sq, 3, 7, 20, Sk, 0, 3, 11};
  const size_t nq = q.size(), nl = (size_t)B * nh * Sq;
  Vec acc(nq, 5.0f), lse(nl, 42.0f), acc2, lse2;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < nh; h++)
      ASSERT_EQ(be->attention_span_init(&kc, &lse[((size_t)b * nh + h) * Sq + 3], 7), MP_OK);
  acc2 = acc;
  lse2 = lse;
  ASSERT_EQ(be->attention_span_forward(&kc, acc.data(), lse.data(), q.data(), k.data(), v.data(), &a), MP_OK);
  ASSERT_EQ(be->attention_span_forward(&kc, acc.data(), lse.data(), q.data(), k.data(), v.data(), &c), MP_OK);
  ASSERT_EQ(be->attention_span_forward(&kc, acc2.data(), lse2.data(), q.data(), k.data(), v.data(), &c), MP_OK);
  ASSERT_EQ(be->attention_span_forward(&kc, acc2.data(), lse2.data(), q.data(), k.data(), v.data(), &a), MP_OK);
  // The keys of both chunks are rows 0..12 of k at positions 11..23, a contiguous union:
  // query i (position 20 + i) sees rows 0 .. min(12, 9 + i).
  const size_t ks = (size_t)nkv * hd;
  for (int b = 0; b < B; b++)
    for (int h = 0; h < nh; h++)
      for (int t = 0; t < Sq; t++) {
        const size_t ao = (((size_t)b * Sq + t) * nh + h) * hd, lo = ((size_t)b * nh + h) * Sq + t;
        if (t < 3 || t >= 10) {
          EXPECT_EQ(lse[lo], 42.0f) << "row outside the chunk written";
          for (int x = 0; x < hd; x++) EXPECT_EQ(acc[ao + x], 5.0f);
          continue;
        }
        const int n = std::min(13, 10 + (t - 3));
        std::vector<double> o;
        double l;
        const size_t kb = (size_t)b * Sk * ks + (size_t)(h / 2) * hd;
        naive_row(&q[ao], &k[kb], &v[kb], ks, n, hd, &o, &l);
        EXPECT_NEAR(lse[lo], l, 1e-6 * std::max(1.0, std::fabs(l))) << "b" << b << " h" << h << " t" << t;
        EXPECT_NEAR(lse2[lo], lse[lo], 1e-6 * std::max(1.0, std::fabs(l)));
        for (int x = 0; x < hd; x++) {
          EXPECT_NEAR(acc[ao + x], o[x], 1e-6) << "b" << b << " h" << h << " t" << t;
          EXPECT_NEAR(acc2[ao + x], acc[ao + x], 1e-6);
        }
      }
}

// A pair whose keys all lie after its last query does nothing at all, and a row that sees
// no key of a pair keeps its state bit for bit; a row that sees no key of any pair stays
// empty, finalizes to 0 and contributes nothing to the backward.
TEST_F(AttentionSpan, FutureKeysAndEmptyRows) {
  const int B = 1, nh = 2, nkv = 1, hd = 4, S = 8;
  Rng r(8);
  Vec q = r.vec((size_t)B * S * nh * hd), k = r.vec((size_t)B * S * nkv * hd),
      v = r.vec((size_t)B * S * nkv * hd), dout = r.vec((size_t)B * S * nh * hd);
  const size_t nq = q.size(), nk = k.size(), nl = (size_t)B * nh * S;
  Vec acc(nq, 3.0f), lse(nl), out(nq, 9.0f), D(nl), dq(nq, 0.5f), dk(nk, 0.25f), dv(nk, 0.125f);
  ASSERT_EQ(be->attention_span_init(&kc, lse.data(), nl), MP_OK);
  // q at positions 10..17 against keys at 18..25: wholly in the future.
  const mp_attn_span future = {B, nh, nkv, hd, S, 0, S, 10, S, 0, S, 18};
  const Vec acc0 = acc, lse0 = lse;
  ASSERT_EQ(be->attention_span_forward(&kc, acc.data(), lse.data(), q.data(), k.data(), v.data(), &future), MP_OK);
  EXPECT_EQ(acc, acc0);
  EXPECT_EQ(lse, lse0);
  // q at 10..17 against keys at 13..20: queries 0..2 see none, query 3 sees one key.
  const mp_attn_span part = {B, nh, nkv, hd, S, 0, S, 10, S, 0, S, 13};
  ASSERT_EQ(be->attention_span_forward(&kc, acc.data(), lse.data(), q.data(), k.data(), v.data(), &part), MP_OK);
  for (int h = 0; h < nh; h++)
    for (int t = 0; t < S; t++) {
      const float l = lse[(size_t)h * S + t];
      if (t < 3) {
        EXPECT_EQ(l, -INFINITY) << "h" << h << " t" << t;
      } else {
        EXPECT_TRUE(std::isfinite(l)) << "h" << h << " t" << t;
      }
    }
  // Query 3 sees key 0 only: its output is v_0 and its lse the one score.
  for (int x = 0; x < hd; x++) EXPECT_FLOAT_EQ(acc[(3 * nh + 0) * hd + x], v[x]);
  const Vec acc1 = acc, lse1 = lse;
  ASSERT_EQ(be->attention_span_forward(&kc, acc.data(), lse.data(), q.data(), k.data(), v.data(), &future), MP_OK);
  EXPECT_EQ(acc, acc1);
  EXPECT_EQ(lse, lse1);
  ASSERT_EQ(be->attention_span_finalize(&kc, out.data(), acc.data(), lse.data(), B, S, nh, hd), MP_OK);
  for (int t = 0; t < S; t++)
    for (int h = 0; h < nh; h++)
      for (int x = 0; x < hd; x++) {
        const float o = out[((size_t)t * nh + h) * hd + x];
        if (t < 3) {
          EXPECT_EQ(o, 0.0f);
        } else {
          EXPECT_EQ(o, acc[((size_t)t * nh + h) * hd + x]);
        }
      }
  ASSERT_EQ(be->attention_span_dot(&kc, D.data(), dout.data(), out.data(), B, S, nh, hd), MP_OK);
  const Vec dq0 = dq, dk0 = dk, dv0 = dv;
  ASSERT_EQ(be->attention_span_backward(&kc, dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                        k.data(), v.data(), lse.data(), D.data(), &future), MP_OK);
  EXPECT_EQ(dq, dq0);
  EXPECT_EQ(dk, dk0);
  EXPECT_EQ(dv, dv0);
  ASSERT_EQ(be->attention_span_backward(&kc, dq.data(), dk.data(), dv.data(), dout.data(), q.data(),
                                        k.data(), v.data(), lse.data(), D.data(), &part), MP_OK);
  for (size_t i = 0; i < nq; i++) {
    EXPECT_TRUE(std::isfinite(dq[i])) << i;
    if (i < (size_t)3 * nh * hd) {
      EXPECT_EQ(dq[i], 0.5f) << "empty row " << i;
    }
  }
  // Keys 5..7 are seen by no query (the last query, position 17, sees keys up to 4).
  for (size_t i = 0; i < nk; i++) {
    EXPECT_TRUE(std::isfinite(dk[i]) && std::isfinite(dv[i])) << i;
    if (i >= (size_t)5 * hd) {
      EXPECT_EQ(dk[i], 0.25f) << i;
      EXPECT_EQ(dv[i], 0.125f) << i;
    }
  }
}

// The same bits with 1 and 3 threads (each output row owned by one thread), with pairs
// large enough for a thread team (chunks of 100 and 50 rows) and small ones.
TEST_F(AttentionSpan, BitIdenticalAcrossThreadCounts) {
  for (int cp : {2, 4}) {
    RingProblem p = make_problem(2, 400, 4, 2, 5, mp_test::even_bounds(400, cp), 3);
    const int saved = omp_get_max_threads();
    omp_set_num_threads(1);
    RingResult one = ring(p);
    omp_set_num_threads(3);
    RingResult three = ring(p);
    omp_set_num_threads(saved);
    EXPECT_EQ(one.out, three.out) << "cp " << cp;
    EXPECT_EQ(one.lse, three.lse) << "cp " << cp;
    EXPECT_EQ(one.dq, three.dq) << "cp " << cp;
    EXPECT_EQ(one.dk, three.dk) << "cp " << cp;
    EXPECT_EQ(one.dv, three.dv) << "cp " << cp;
  }
}

TEST_F(AttentionSpan, BadSpansAreRefusedWithTheCheckThatFailed) {
  Vec buf(4096, 0.0f);
  float *f = buf.data();
  const mp_attn_span ok = {1, 2, 1, 4, 8, 0, 8, 0, 8, 0, 8, 0};
  mp_attn_span bad = ok;
  bad.q_row = 1; // rows 1..8 of 8
  EXPECT_EQ(be->attention_span_forward(&kc, f, f, f, f, f, &bad), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&err)).find("attention_span_forward: invalid argument"),
            std::string::npos) << mp_errmsg(&err);
  bad = ok;
  bad.nkv = 3; // does not divide nh
  EXPECT_EQ(be->attention_span_backward(&kc, f, f, f, f, f, f, f, f, f, &bad), MP_ERR_INVALID);
  bad = ok;
  bad.kv_pos = -1;
  EXPECT_EQ(be->attention_span_forward(&kc, f, f, f, f, f, &bad), MP_ERR_INVALID);
  EXPECT_EQ(be->attention_span_forward(&kc, f, f, f, f, f, nullptr), MP_ERR_INVALID);
  EXPECT_EQ(be->attention_span_backward(&kc, f, f, f, f, f, f, f, f, nullptr, &ok), MP_ERR_INVALID);
  EXPECT_EQ(be->attention_span_finalize(&kc, f, f, f, 1, 8, 0, 4), MP_ERR_INVALID);
  EXPECT_EQ(be->attention_span_forward(&kc, f, f, f, f, f, &ok), MP_OK);
}

}  // namespace
