// The zero-bubble pipeline schedules (exec/schedule_pp.c order_zbv and order_interleaved_zb,
// sim/pipeline.c): torch.distributed.pipelining's ScheduleZBVZeroBubble and
// ScheduleInterleavedZeroBubble (schedules.py, PyTorch v2.6 to v2.8) against their rules
// applied by hand, and the timeline and in-flight chunks of p = 4, m = 8 with
// F = B = W = 1 unit a chunk against the Zero Bubble paper (Qi et al., ICLR 2024, arXiv
// 2401.10241) and step-by-step derivations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "exec/schedule.h"
#include "sim/sim.h"

namespace {

std::vector<mp_pp_step> Order(mp_pp_schedule k, int pp, int v, int64_t m, int stage) {
  std::vector<mp_pp_step> o((size_t)(3 * m * v));
  int64_t n = 0;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(mp_pp_order(&ctx, k, MP_PP_FLAVOR_TORCH, pp, v, m, stage, o.data(), &n), MP_OK) << mp_errmsg(&ctx);
  o.resize((size_t)n);
  return o;
}

// "F0.3" for the forward of chunk 0, micro-batch 3; B and W likewise.
std::string Str(const std::vector<mp_pp_step> &o) {
  std::string s;
  for (const mp_pp_step &q : o) {
    if (!s.empty()) s += ' ';
    s += "FBW"[q.bwd];
    s += std::to_string(q.chunk) + "." + std::to_string(q.micro);
  }
  return s;
}

// Every stage's finish, equal stages: each chunk's forward f, backward b of which w is W.
std::vector<double> Finish(mp_pp_schedule k, int pp, int v, int64_t m, double f, double b, double w,
                           double send = 0.0) {
  mp_pp_stage_times t;
  memset(&t, 0, sizeof t);
  for (int c = 0; c < v; c++) t.f[c] = f, t.b[c] = b, t.w[c] = w;
  t.send_f = t.send_b = send;
  std::vector<const mp_pp_stage_times *> st(pp, &t);
  std::vector<double> finish(pp);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(mp_sim_pipeline(&ctx, k, MP_PP_FLAVOR_TORCH, pp, v, m, st.data(), finish.data()), MP_OK)
      << mp_errmsg(&ctx);
  return finish;
}

TEST(ZeroBubbleOrder, ZbvAsTorchWritesIt) {
  // pp = 4, m = 8 (n = max(2 pp - 1, m) = 8). Rank 0: 2 x 4 - 1 = 7 forwards of chunk 0, no
  // F1 F0 pairs, 4 triples F1 B1 W1; the steady loop while F1 lags F0 or F0 has forwards
  // left: F0.7 B0.0 W0.0 F1.4 B1.4 W1.4, then (no F0 left) B0 W0 F1 B1 W1 three times; no B0
  // B1 pairs, 4 pairs B0 W0; nothing left over.
  EXPECT_EQ(Str(Order(MP_PP_ZBV, 4, 2, 8, 0)),
            "F0.0 F0.1 F0.2 F0.3 F0.4 F0.5 F0.6 F1.0 B1.0 W1.0 F1.1 B1.1 W1.1 F1.2 B1.2 W1.2 F1.3 B1.3 "
            "W1.3 F0.7 B0.0 W0.0 F1.4 B1.4 W1.4 B0.1 W0.1 F1.5 B1.5 W1.5 B0.2 W0.2 F1.6 B1.6 W1.6 B0.3 "
            "W0.3 F1.7 B1.7 W1.7 B0.4 W0.4 B0.5 W0.5 B0.6 W0.6 B0.7 W0.7");
  // Rank 3 (the V's turn): 1 forward of chunk 0, 3 pairs F1 F0, 1 triple F1 B1 W1; the steady
  // loop F0 B0 W0 F1 B1 W1 until F0.7 (four times), then B0 W0 F1 B1 W1 ... until F1.7; 3 pairs
  // B0 B1, 1 pair B0 W0; the W1 left (W1.5 .. W1.7), then the W0 left (W0.5 .. W0.7).
  EXPECT_EQ(Str(Order(MP_PP_ZBV, 4, 2, 8, 3)),
            "F0.0 F1.0 F0.1 F1.1 F0.2 F1.2 F0.3 F1.3 B1.0 W1.0 F0.4 B0.0 W0.0 F1.4 B1.1 W1.1 F0.5 B0.1 "
            "W0.1 F1.5 B1.2 W1.2 F0.6 B0.2 W0.2 F1.6 B1.3 W1.3 F0.7 B0.3 W0.3 F1.7 B1.4 W1.4 B0.4 B1.5 "
            "B0.5 B1.6 B0.6 B1.7 B0.7 W0.4 W1.5 W1.6 W1.7 W0.5 W0.6 W0.7");
}

TEST(ZeroBubbleOrder, InterleavedZbDefersEachWByTheStage) {
  // pp = 4, v = 2, m = 8: rounds max(1, 8 / 4) = 2 of r = 4; stage 1 warms up with (v - 1) r +
  // pp - 1 - 1 = 6 forwards (chunk (k / 4) mod 2: four of chunk 0, two of chunk 1), then F and
  // B alternately, B number k of chunk 1 - (k / 4) mod 2, a W after each B from its second on
  // (num_1f1b_microbatches = rank = 1) for the oldest B without one; the 6 cool-down B's each
  // with a W, and the last W.
  EXPECT_EQ(Str(Order(MP_PP_INTERLEAVED_ZB, 4, 2, 8, 1)),
            "F0.0 F0.1 F0.2 F0.3 F1.0 F1.1 F1.2 B1.0 F1.3 B1.1 W1.0 F0.4 B1.2 W1.1 F0.5 B1.3 W1.2 F0.6 "
            "B0.0 W1.3 F0.7 B0.1 W0.0 F1.4 B0.2 W0.1 F1.5 B0.3 W0.2 F1.6 B1.4 W0.3 F1.7 B1.5 W1.4 B1.6 "
            "W1.5 B1.7 W1.6 B0.4 W1.7 B0.5 W0.4 B0.6 W0.5 B0.7 W0.6 W0.7");
}

TEST(ZeroBubbleTimeline, ZbvWithEqualThirdsLeavesOnlyTheFill) {
  // F = B = W = 1 a chunk, 2 chunks x 8 micro-batches: every rank is busy 8 x 2 x 3 = 48.
  // Rank s cannot start before micro-batch 0's forward has passed s ranks (time s); from then
  // on the V keeps every rank busy (the paper's ZB-V, sec. 6: no bubble with T_F = T_B = T_W),
  // so rank s ends at 48 + s and the step at 48 + pp - 1 = 51, against 1F1B's interleaved
  // (m + (pp - 1) / v)(f + b) = (8 + 1.5) x 6 = 57 for the same chunks.
  EXPECT_EQ(Finish(MP_PP_ZBV, 4, 2, 8, 1, 2, 1), (std::vector<double>{48, 49, 50, 51}));
}

TEST(ZeroBubbleTimeline, InterleavedZbIsZbH1) {
  // One chunk a stage (v = 1) is the paper's ZB-H1 (sec. 3.1): its bubble is (p - 1)(T_F +
  // T_B - T_W) = 3 x 1 against 1F1B's (p - 1)(T_F + T_B + T_W) = 9, so every stage ends at
  // m (F + B + W) + 3 = 27 where 1F1B's step is (m + p - 1) x 3 = 33.
  EXPECT_EQ(Finish(MP_PP_INTERLEAVED_ZB, 4, 1, 8, 1, 2, 1), (std::vector<double>{27, 27, 27, 27}));
  // Two chunks: 2 x 8 x 3 = 48 busy a stage and the same 3 of fill: 51 on every stage.
  EXPECT_EQ(Finish(MP_PP_INTERLEAVED_ZB, 4, 2, 8, 1, 2, 1), (std::vector<double>{51, 51, 51, 51}));
}

TEST(ZeroBubbleTimeline, ZbvTurnIsOnTheRank) {
  // pp = 2, m = 1, F = B = W = 1, sends 0.5. Rank 0: F(stage 0) F(3) B(3) W(3) B(0) W(0);
  // rank 1: F(1) F(2) B(2) W(2) B(1) W(1). F0 0-1; F1 after the send 1.5-2.5; F2 on the same
  // rank, no send: 2.5-3.5; F3 4-5; B3 (the loss's stage) 5-6, W3 6-7; B2 6.5-7.5, W2
  // 7.5-8.5; B1 (no send) waits for rank 1: 8.5-9.5, W1 9.5-10.5; B0 10-11, W0 11-12. A send
  // at the turn would add 0.5 each way.
  EXPECT_EQ(Finish(MP_PP_ZBV, 2, 2, 1, 1, 2, 1, 0.5), (std::vector<double>{12, 10.5}));
}

TEST(ZeroBubbleMemory, ChunksAreHeldUntilTheirW) {
  // Torch keeps a split backward's autograd state until its W (stage_backward_input runs
  // with retain_graph; _backward.py), so a chunk is held from its F to its W. ZBV: every rank
  // runs 2 pp forwards before its first W (rank s: 2 (pp - s) - 1 + 2 s + 1), then one W for
  // each F: 8 chunks of half a micro-batch's layers, pp = 4 micro-batches' worth, as 1F1B's
  // first stage (the paper's ZB-V, sec. 6).
  for (int s = 0; s < 4; s++) {
    const std::vector<mp_pp_step> o = Order(MP_PP_ZBV, 4, 2, 8, s);
    EXPECT_EQ(mp_pp_inflight(o.data(), (int64_t)o.size()), 8) << "rank " << s;
  }
  // ZB-H1 (v = 1): stage 3 warms up with none and defers each W by 3 backwards: F0 B0 F1 B1 F2
  // B2 F3 B3 W0 F4 ...: 4 held at F4, pp as 1F1B's first stage; released at B it would be 1.
  for (int s = 0; s < 4; s++) {
    const std::vector<mp_pp_step> o = Order(MP_PP_INTERLEAVED_ZB, 4, 1, 8, s);
    EXPECT_EQ(mp_pp_inflight(o.data(), (int64_t)o.size()), 4) << "stage " << s;
  }
}

TEST(ZeroBubbleOrder, RefusesWhatTorchRefuses) {
  std::vector<mp_pp_step> o(64);
  int64_t n = 0;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  // ZBV: exactly 2 stages a rank
  EXPECT_EQ(mp_pp_order(&ctx, MP_PP_ZBV, MP_PP_FLAVOR_TORCH, 4, 3, 8, 0, o.data(), &n), MP_ERR_INVALID);
  // interleaved ZB: 9 micro-batches on pp 4 make 2 rounds, which do not divide 9
  EXPECT_EQ(mp_pp_order(&ctx, MP_PP_INTERLEAVED_ZB, MP_PP_FLAVOR_TORCH, 4, 2, 9, 0, o.data(), &n), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("multiple of 2"), std::string::npos) << mp_errmsg(&ctx);
  // 10 make 2 rounds of 5: accepted
  EXPECT_EQ(mp_pp_order(&ctx, MP_PP_INTERLEAVED_ZB, MP_PP_FLAVOR_TORCH, 4, 2, 10, 0, o.data(), &n), MP_OK);
  EXPECT_EQ(n, 60);
}

}  // namespace
