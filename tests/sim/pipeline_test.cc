// The pipeline timeline (sim/pipeline.c, mp_sim_pipeline) against hand derivations: the
// closed forms of 1F1B and GPipe ((m + p - 1)(f + b), a bubble of (p - 1)/m of the busy
// time) and of the interleaved schedule ((p - 1)/(v m)) with equal stages and free
// transfers; then a small pipeline with uneven stages and transfer costs worked out step
// by step; the EP overlap's combined steps (their steady state, the transfer each waits,
// and a small interleaved pipeline with light first and heavy last chunks step by step);
// the zero-bubble schedules' p = 4, m = 8 with F = B = W against the Zero Bubble paper,
// and ZBV's turn on one rank step by step. A stage run stopped at a step bound keeps the
// whole run's chunk times (so the bound it gives).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "exec/schedule.h"
#include "sim/cluster.h"
#include "sim/sim.h"
extern "C" {
#include "sim/sim_internal.h"  // mp_sim_pipeline_ws: a workspace kept across timelines
#include "sim/stack.h"
#include "sim/workspace.h"
}
#include "tests/sim/plan_case.h"

namespace {

// Every stage's finish, pp equal stages: each chunk's forward f, backward b (of which w
// its weight gradient, a W step of its own under the zero-bubble schedules), sends `send`.
std::vector<double> Finish(mp_pp_schedule kind, int pp, int v, int64_t m, double f, double b, double w,
                           double send = 0.0, mp_pp_flavor flavor = MP_PP_FLAVOR_MEGATRON) {
  mp_pp_stage_times t;
  memset(&t, 0, sizeof t);
  for (int c = 0; c < v; c++) t.f[c] = f, t.b[c] = b, t.w[c] = w;
  t.send_f = t.send_b = send;
  std::vector<const mp_pp_stage_times *> st(pp, &t);
  std::vector<double> finish(pp);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  EXPECT_EQ(mp_sim_pipeline(&ctx, kind, flavor, pp, v, m, st.data(), finish.data()), MP_OK)
      << mp_errmsg(&ctx);
  return finish;
}

// Makespan of a pipeline of pp equal stages: each chunk's forward f / v, backward b / v.
double Makespan(mp_pp_schedule kind, int pp, int v, int64_t m, double f, double b,
                double send = 0.0, mp_pp_flavor flavor = MP_PP_FLAVOR_MEGATRON) {
  const std::vector<double> finish = Finish(kind, pp, v, m, f / v, b / v, 0.0, send, flavor);
  return *std::max_element(finish.begin(), finish.end());
}

TEST(PipelineTimeline, OneFOneBAndGPipeBubbleIsPMinusOneOverM) {
  // f = 1, b = 2 per micro-batch: busy m (f + b); the pipeline fills and drains through
  // p - 1 stages, (p - 1)(f + b) more, a bubble of (p - 1)/m of the busy time.
  const double f = 1.0, b = 2.0;
  for (int pp : {2, 4, 8})
    for (int64_t m : {1, 4, 8, 32}) {
      for (mp_pp_schedule k : {MP_PP_1F1B, MP_PP_GPIPE}) {
        const double t = Makespan(k, pp, 1, m, f, b);
        EXPECT_DOUBLE_EQ(t, (double)(m + pp - 1) * (f + b)) << "pp=" << pp << " m=" << m;
        EXPECT_NEAR((t - m * (f + b)) / (m * (f + b)), (pp - 1) / (double)m, 1e-12);
      }
    }
}

TEST(PipelineTimeline, InterleavedBubbleIsPMinusOneOverVM) {
  // v chunks per stage, each f/v and b/v: the fill and drain shrink to (p - 1)(f + b)/v,
  // a bubble of (p - 1)/(v m) (Narayanan et al. 2021, section 2.2), m a multiple of p.
  const double f = 1.0, b = 2.0;
  for (int pp : {2, 4})
    for (int v : {2, 4})
      for (int64_t m : {(int64_t)pp, 2 * (int64_t)pp, 8 * (int64_t)pp}) {
        const double t = Makespan(MP_PP_INTERLEAVED, pp, v, m, f, b);
        EXPECT_NEAR(t, m * (f + b) + (pp - 1) * (f + b) / v, 1e-9)
            << "pp=" << pp << " v=" << v << " m=" << m;
        // torch.distributed.pipelining's order (no every-forward-first warm-up at m == pp)
        EXPECT_NEAR(Makespan(MP_PP_INTERLEAVED, pp, v, m, f, b, 0.0, MP_PP_FLAVOR_TORCH), t, 1e-9)
            << "pp=" << pp << " v=" << v << " m=" << m;
        EXPECT_NEAR((t - m * (f + b)) / (m * (f + b)), (pp - 1) / (double)(v * m), 1e-9);
      }
}

TEST(PipelineTimeline, TransfersOnOneFOneBsCriticalPath) {
  // pp=2, m=3, f 1, b 2 on both stages, every transfer d = 0.1. 1F1B leaves stage 0 one
  // forward ahead only, so each of its backwards waits for a round trip through stage 1:
  //   s0 F0 [0, 1]      s1 F0 [1.1, 2.1]   s1 B0 [2.1, 4.1]   s0 F1 [1, 2]
  //   s0 B0 [4.2, 6.2]  s1 F1 [4.1, 5.1]   s1 B1 [5.1, 7.1]   s0 F2 [6.2, 7.2]
  //   s0 B1 [7.2, 9.2]  s1 F2 [7.3, 8.3]   s1 B2 [8.3, 10.3]  s0 B2 [10.4, 12.4]
  // 0.4 more than the (m + p - 1)(f + b) = 12 of free transfers.
  mp_pp_stage_times t;
  memset(&t, 0, sizeof t);
  t.f[0] = 1, t.b[0] = 2, t.send_f = t.send_b = 0.1;
  const mp_pp_stage_times *st[2] = {&t, &t};
  double finish[2];
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_sim_pipeline(&ctx, MP_PP_1F1B, MP_PP_FLAVOR_MEGATRON, 2, 1, 3, st, finish), MP_OK) << mp_errmsg(&ctx);
  EXPECT_NEAR(finish[0], 12.4, 1e-12);
  EXPECT_NEAR(finish[1], 10.3, 1e-12);
}

TEST(PipelineTimeline, UnevenStagesWorkedStepByStep) {
  // pp=2, m=2, 1F1B. Stage 0: f 1, b 2, sends its activations in 0.5; stage 1: f 2, b 3,
  // sends its input gradient in 0.25. Orders: stage 0 F0 F1 B0 B1, stage 1 F0 B0 F1 B1.
  //   s0 F0 [0, 1]       s1 F0 [1.5, 3.5]   s1 B0 [3.5, 6.5]
  //   s0 F1 [1, 2]       s0 B0 [6.75, 8.75] (B0 of stage 1 + 0.25)
  //   s1 F1 [6.5, 8.5]   (its input was there at 2.5; the stage is busy until 6.5)
  //   s1 B1 [8.5, 11.5]  s0 B1 [11.75, 13.75]
  mp_pp_stage_times a, c;
  memset(&a, 0, sizeof a);
  memset(&c, 0, sizeof c);
  a.f[0] = 1, a.b[0] = 2, a.send_f = 0.5, a.send_b = 0.0;
  c.f[0] = 2, c.b[0] = 3, c.send_f = 0.0, c.send_b = 0.25;
  const mp_pp_stage_times *st[2] = {&a, &c};
  double finish[2];
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_sim_pipeline(&ctx, MP_PP_1F1B, MP_PP_FLAVOR_MEGATRON, 2, 1, 2, st, finish), MP_OK) << mp_errmsg(&ctx);
  EXPECT_DOUBLE_EQ(finish[0], 13.75);
  EXPECT_DOUBLE_EQ(finish[1], 11.5);
}

TEST(PipelineTimeline, LongPipelinesSettleIntoTheirCycle) {
  // Long pipelines run a few groups of pp micro-batches step by step and add the steady
  // state's period for the rest (sim/pipeline.c). Equal stages: still (m + p - 1)(f + b) for
  // m = 4096. Uneven stages (the third twice as slow as the others, transfers 0.05): once
  // the pipeline is full the slowest stage is never idle, so every pp more micro-batches add
  // pp of its f + b.
  EXPECT_NEAR(Makespan(MP_PP_1F1B, 4, 1, 4096, 1.0, 2.0), (4096.0 + 3) * 3.0, 1e-6);
  EXPECT_NEAR(Makespan(MP_PP_INTERLEAVED, 4, 2, 4096, 1.0, 2.0), 4096 * 3.0 + 3 * 3.0 / 2, 1e-6);
  mp_pp_stage_times fast, slow;
  memset(&fast, 0, sizeof fast);
  memset(&slow, 0, sizeof slow);
  fast.f[0] = 1, fast.b[0] = 2, fast.send_f = fast.send_b = 0.05;
  slow.f[0] = 2, slow.b[0] = 4, slow.send_f = slow.send_b = 0.05;
  const mp_pp_stage_times *st[4] = {&fast, &fast, &slow, &fast};
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  double a[4], b[4];
  ASSERT_EQ(mp_sim_pipeline(&ctx, MP_PP_1F1B, MP_PP_FLAVOR_MEGATRON, 4, 1, 400, st, a), MP_OK);
  ASSERT_EQ(mp_sim_pipeline(&ctx, MP_PP_1F1B, MP_PP_FLAVOR_MEGATRON, 4, 1, 404, st, b), MP_OK);
  for (int s = 0; s < 4; s++) EXPECT_NEAR(b[s] - a[s], 4 * 6.0, 1e-9) << "stage " << s;
}

// DualPipe's timeline with equal model stages f = b, each F&B pair saving s (F&B = f + b - s)
// and free transfers. The two middle ranks pace the step: every micro-batch's forward and
// backward of one of their two chunks, m (f + b), less s for each pair their order runs
// (deepseek-ai/DualPipe's step 4 runs m / 2 - pp + h + 1 rounds of two pairs, h = pp / 2 - 1
// there, the first F0 and B1 not overlapped; its step 5 runs none: 2 (m / 2 - pp / 2) - 1 =
// m - pp - 1 pairs), plus the bubble the reference states, (pp / 2 - 1)(F&B + B - 3W) with
// W = 0 (no zero-bubble split): (pp / 2 - 1)(f + b - s + b). E.g. pp 8, m 20, f = b = 1,
// s 0.5: 40 - 11 x 0.5 + 3 x 2.5 = 42.
TEST(PipelineTimeline, DualPipeBubbleIsTheReferences) {
  for (int pp : {2, 4, 8, 16})
    for (int64_t m : {2 * (int64_t)pp, 2 * (int64_t)pp + 4, (int64_t)120})
      for (double save : {0.0, 0.25, 0.5}) {
        if (m < 2 * pp) continue;
        const double f = 1.0, b = 1.0;
        mp_pp_stage_times t;
        memset(&t, 0, sizeof t);
        t.f[0] = t.f[1] = f;
        t.b[0] = t.b[1] = b;
        t.fb_save[0] = t.fb_save[1] = save;
        std::vector<const mp_pp_stage_times *> st(pp, &t);
        std::vector<double> finish(pp);
        mp_ctx ctx;
        mp_ctx_init(&ctx);
        ASSERT_EQ(mp_sim_pipeline(&ctx, MP_PP_DUALPIPE, MP_PP_FLAVOR_MEGATRON, pp, 1, m, st.data(), finish.data()),
                  MP_OK)
            << mp_errmsg(&ctx);
        double most = 0;
        for (double x : finish) most = std::max(most, x);
        const double want = m * (f + b) - (m - pp - 1) * save + (pp / 2 - 1) * (f + b - save + b);
        EXPECT_NEAR(most, want, 1e-9) << "pp=" << pp << " m=" << m << " save=" << save;
      }
  // 1F1B on the same stages (one chunk, nothing overlapped) is slower by its bubble:
  // (m + pp - 1)(f + b) = 46 for pp 4, m 20 against DualPipe's 40 + 1 x 3 = 43
  EXPECT_DOUBLE_EQ(Makespan(MP_PP_1F1B, 4, 1, 20, 1.0, 1.0), 46.0);
}

// DualPipe's orders (exec/schedule_pp.c): every rank runs each direction's m / 2 micro-
// batches forward and backward once, holds at most pp + 1 of them at once on its first
// rank (the reference's table: activations PP + 1), and the reference's refusals.
TEST(PipelineTimeline, DualPipeOrdersAndTheirRules) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  const int pp = 8;
  const int64_t m = 20;
  std::vector<mp_pp_step> ord(2 * m);
  for (int s = 0; s < pp; s++) {
    int64_t n = 0;
    ASSERT_EQ(mp_pp_order(&ctx, MP_PP_DUALPIPE, MP_PP_FLAVOR_MEGATRON, pp, 1, m, s, ord.data(), &n), MP_OK)
        << mp_errmsg(&ctx);
    ASSERT_EQ(n, 2 * m);
    int seen[2][2][10] = {};
    for (const mp_pp_step &q : ord) {
      ASSERT_LT(q.micro, m / 2);
      seen[q.bwd][q.chunk][q.micro]++;
    }
    for (int b = 0; b < 2; b++)
      for (int d = 0; d < 2; d++)
        for (int i = 0; i < m / 2; i++) EXPECT_EQ(seen[b][d][i], 1) << s << " " << b << " " << d << " " << i;
    if (s == 0) {
      EXPECT_EQ(mp_pp_inflight(ord.data(), n), pp + 1);
    }
  }
  int64_t n = 0;
  EXPECT_EQ(mp_pp_order(&ctx, MP_PP_DUALPIPE, MP_PP_FLAVOR_MEGATRON, 6, 1, 10, 0, ord.data(), &n), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("at least 2 x pp"), std::string::npos) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_pp_order(&ctx, MP_PP_DUALPIPE, MP_PP_FLAVOR_MEGATRON, 4, 1, 9, 0, ord.data(), &n), MP_ERR_INVALID);
  EXPECT_EQ(mp_pp_order(&ctx, MP_PP_DUALPIPE, MP_PP_FLAVOR_MEGATRON, 3, 1, 12, 0, ord.data(), &n), MP_ERR_INVALID);
}

TEST(A2aOverlap, FourPhasesOfALayerPair) {
  // One MoE layer each way (ms). Forward: attention 4, dispatch 3, experts 5, combine 3,
  // then 1 after it. Backward: 2 before combine's backward 3, experts 10, dispatch's
  // backward 3, attention 8. Serial: 16 + 26 = 42. Combined: bc[0] 2 + max(4, 3)
  // + max(10, 3) + max(5, 3) + max(8, 3) + the forward's last piece 1 = 30: all four
  // all-to-alls hidden, 12 saved.
  const double fc[] = {4, 5, 1}, fa[] = {3, 3}, bc[] = {2, 10, 8}, ba[] = {3, 3};
  EXPECT_DOUBLE_EQ(mp_sim_a2a_overlap_save_s(fc, fa, 2, bc, ba, 2, 1.0), 12.0);
  // slow all-to-alls (9 each): 2 + 9 + 10 + 9 + 9 + 1 = 40 of 42 + 24 = 66: 26 saved, the
  // part of each all-to-all the other side's compute covers (4 + 9 + 5 + 8 = 26)
  const double fa9[] = {9, 9}, ba9[] = {9, 9};
  EXPECT_DOUBLE_EQ(mp_sim_a2a_overlap_save_s(fc, fa9, 2, bc, ba9, 2, 1.0), 26.0);
  // compute beside the communication kernels' SMs taking 1.25 x as long: 2 + max(5, 3)
  // + max(12.5, 3) + max(6.25, 3) + max(10, 3) + 1 = 36.75, 5.25 saved
  EXPECT_DOUBLE_EQ(mp_sim_a2a_overlap_save_s(fc, fa, 2, bc, ba, 2, 1.25), 5.25);
  // 2 x as long: 2 + 8 + 20 + 10 + 16 + 1 = 57, 15 more than in series
  EXPECT_DOUBLE_EQ(mp_sim_a2a_overlap_save_s(fc, fa, 2, bc, ba, 2, 2.0), -15.0);
  // no all-to-all in one direction (a dense chunk): nothing to pair
  const double one[] = {7};
  EXPECT_DOUBLE_EQ(mp_sim_a2a_overlap_save_s(one, fa, 0, bc, ba, 2, 1.0), 0.0);
}

// HybridEP beside the EP overlap on the GB300 (sim/sim.c a2a_overlap): its dispatch and combine
// kernels hold the megatron-core profile's hybridep_sms, 32, of Blackwell Ultra's 160 SMs
// (data/gpus/gb300.json), so the paired compute takes 160 / 128 = 1.25x as long. One MoE layer
// each way in the proportions of Qwen3-235B-A22B on 64 GB300s at EP 64 (qwen235_gb300_mx_tps,
// ms a layer, rounded), every all-to-all 0.4:
//   MXFP8: forward attention 0.9, experts 0.7; backward experts 1.3, attention 1.6.
//     Serial 4.5 + 1.6 = 6.1; combined max(1.125, .4) + max(1.625, .4) + max(.875, .4)
//     + max(2.0, .4) = 5.625: 0.475 saved. At full speed (no SMs held) 4.5: 1.6 saved.
//   bf16: 1.1, 1.0; 2.0, 2.0. Serial 6.1 + 1.6 = 7.7; combined 1.375 + 2.5 + 1.25 + 2.5
//     = 7.625: 0.075 saved, the SMs' toll (0.25 x 6.1) nearly all the 1.6 hidden.
// So the overlap's saving and float8's shorter compute do not add as at full speed: the
// saving is the hidden all-to-alls less a quarter of the compute beside them.
TEST(A2aOverlap, HybridEpSmsTollOnTheGb300) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_gpu g;
  mp_stack_profile prof;
  memset(&g, 0, sizeof g);
  ASSERT_EQ(mp_gpu_load(&ctx, "gb300", &g), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_stack_load(&ctx, "megatron-core", &prof), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(g.sms, 160);
  ASSERT_EQ(prof.hybridep_sms, 32);
  const double slow = (double)g.sms / (double)(g.sms - prof.hybridep_sms);
  EXPECT_DOUBLE_EQ(slow, 1.25);
  const double fa[] = {0.4, 0.4}, ba[] = {0.4, 0.4};
  const double fc8[] = {0.9, 0.7, 0.0}, bc8[] = {0.0, 1.3, 1.6};
  const double fc16[] = {1.1, 1.0, 0.0}, bc16[] = {0.0, 2.0, 2.0};
  EXPECT_NEAR(mp_sim_a2a_overlap_save_s(fc8, fa, 2, bc8, ba, 2, 1.0), 1.6, 1e-12);
  EXPECT_NEAR(mp_sim_a2a_overlap_save_s(fc8, fa, 2, bc8, ba, 2, slow), 0.475, 1e-12);
  EXPECT_NEAR(mp_sim_a2a_overlap_save_s(fc16, fa, 2, bc16, ba, 2, 1.0), 1.6, 1e-12);
  EXPECT_NEAR(mp_sim_a2a_overlap_save_s(fc16, fa, 2, bc16, ba, 2, slow), 0.075, 1e-12);
}

// What each group of pp = 4 more micro-batches adds to every stage's finish (20 against 16)
// on equal stages of 2 chunks, each f 0.5, b 1, saving `save`, transfers `send`.
std::vector<double> GroupAdds(double save, double send, mp_pp_flavor flavor) {
  mp_pp_stage_times t;
  memset(&t, 0, sizeof t);
  for (int c = 0; c < 2; c++) t.f[c] = 0.5, t.b[c] = 1.0, t.fb_save[c] = save;
  t.send_f = t.send_b = send;
  const mp_pp_stage_times *st[4] = {&t, &t, &t, &t};
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  double a[4], b[4];
  EXPECT_EQ(mp_sim_pipeline(&ctx, MP_PP_INTERLEAVED, flavor, 4, 2, 16, st, a), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_sim_pipeline(&ctx, MP_PP_INTERLEAVED, flavor, 4, 2, 20, st, b), MP_OK) << mp_errmsg(&ctx);
  std::vector<double> adds(4);
  for (int s = 0; s < 4; s++) adds[s] = b[s] - a[s];
  return adds;
}

TEST(PipelineTimeline, CombinedStepsPaceTheSteadyState) {
  // The EP overlap's combined steps (fb_save > 0, Megatron-LM's order with one more
  // warm-up forward): in the steady state every forward runs with a backward, so on equal
  // stages each group of pp more micro-batches adds pp x v combined chunk steps of
  // (f + b) / v - s: pp (f + b - v s). f 1, b 2, v 2, s 0.25: 4 x (3 - 0.5) = 10 for pp 4;
  // without the saving the same order takes its (f + b) per micro-batch: 4 x 3 = 12.
  for (double x : GroupAdds(0.25, 0.0, MP_PP_FLAVOR_MEGATRON_A2A)) EXPECT_NEAR(x, 10.0, 1e-9);
  for (double x : GroupAdds(0.0, 0.0, MP_PP_FLAVOR_MEGATRON_A2A)) EXPECT_NEAR(x, 12.0, 1e-9);
}

TEST(PipelineTimeline, CombinedStepsWaitOnBothTransfers) {
  // Megatron-LM's combined step (TransformerModelChunkSchedulePlan.run, models/common/
  // model_chunk_schedule_plan.py, core_v0.14.0 and 9c5258f109) waits for the forward's and
  // the backward's receives before its layers and sends the forward's output only after
  // them. Its order puts stage s's backward k in steady step k on every stage and its
  // forward of virtual step j two steps after stage s - 1's (two warm-up forwards more a
  // stage): step k of stage s waits on step k of stage s + 1 and step k - 2 of stage s - 1,
  // a cycle of two steps and two transfers. So every steady step waits one transfer d:
  // each group of pp micro-batches adds pp x v (combined step + d), 8 x (1.25 + 0.1) =
  // 10.8 (10 with free transfers, above). The plain order hides the same transfers: stage
  // s + 1's forward and backward lie between stage s's forward and its backward that waits
  // on them, 2 (f + b) / v against (f + b) / v + 2 d: 12 as with free transfers.
  for (double x : GroupAdds(0.25, 0.1, MP_PP_FLAVOR_MEGATRON_A2A)) EXPECT_NEAR(x, 10.8, 1e-9);
  for (double x : GroupAdds(0.0, 0.1, MP_PP_FLAVOR_MEGATRON)) EXPECT_NEAR(x, 12.0, 1e-9);
}

TEST(PipelineTimeline, CombinedStepsWithUnevenChunksWorkedStepByStep) {
  // pp 2, v 2, m 4 under the EP overlap, virtual stages 0..3 (stage 0's chunks 0 and 2,
  // stage 1's 1 and 3), transfers d = 0.1. An embedding chunk first and a head chunk last
  // (the E and L slots of a layout "Et|tt|tt|tL"), each chunk's f / b / saving:
  //   stage 0 c0 0.5 / 1 / 0.25, c1 1 / 2 / 0.5;  stage 1 c0 1 / 2 / 0.5, c1 1.5 / 3 / 0.25.
  // Orders (warm-up (pp - s - 1) 2 + (v - 1) pp + 1: 5 and 3; F(c, i) chunk c, micro-batch
  // i; pairs bracketed, each f + b less the smaller saving, starting when both inputs are
  // there):
  //   s0 F(0,0) F(0,1) F(1,0) F(1,1) F(0,2) [F(0,3) B(1,0)] [F(1,2) B(1,1)] [F(1,3) B(0,0)]
  //      B(0,1) B(1,2) B(1,3) B(0,2) B(0,3)
  //   s1 F(0,0) F(0,1) F(1,0) [F(1,1) B(1,0)] [F(0,2) B(1,1)] [F(0,3) B(0,0)] [F(1,2) B(0,1)]
  //      [F(1,3) B(1,2)] B(1,3) B(0,2) B(0,3)
  // Stage 0: F(0,0) [0, 0.5], F(0,1) [0.5, 1], F(1,0) [1.7, 2.7] (s1 F(0,0) 1.6 + d),
  //   F(1,1) [2.7, 3.7], F(0,2) [3.7, 4.2], [F(0,3) B(1,0)] [8.65, 10.9] (s1's B(1,0) 8.55 +
  //   d; 0.5 + 2 - 0.25), [F(1,2) B(1,1)] [12.4, 14.9], [F(1,3) B(0,0)] [14.9, 16.65]
  //   (1 + 1 - 0.25), B(0,1) [18.35, 19.35], B(1,2) [22.6, 24.6], B(1,3) [25.6, 27.6],
  //   B(0,2) [27.6, 28.6], B(0,3) [29.8, 30.8].
  // Stage 1: F(0,0) [0.6, 1.6], F(0,1) [1.6, 2.6], F(1,0) [2.8, 4.3], [F(1,1) B(1,0)]
  //   [4.3, 8.55] (1.5 + 3 - 0.25), [F(0,2) B(1,1)] [8.55, 12.3] (1 + 3 - 0.25),
  //   [F(0,3) B(0,0)] [12.3, 14.8], [F(1,2) B(0,1)] [15, 18.25] (s0's step ended 14.9),
  //   [F(1,3) B(1,2)] [18.25, 22.5], B(1,3) [22.5, 25.5], B(0,2) [25.5, 27.5], B(0,3)
  //   [27.7, 29.7].
  // Stage 0 is busy 3.5 + 6.5 + 7 = 17 of its 30.8 (13.8 idle: its light chunk 0 and the
  // pairs' waits on stage 1's heavy chunk 1); its three pairs save 0.25 + 0.5 + 0.25 = 1,
  // stage 1's five 0.25 + 0.25 + 0.5 + 0.25 + 0.25 = 1.5, not m x (its chunks' savings) =
  // 3: the warm-up forwards and cool-down backwards run alone.
  mp_pp_stage_times a, c;
  memset(&a, 0, sizeof a);
  memset(&c, 0, sizeof c);
  a.f[0] = 0.5, a.b[0] = 1, a.fb_save[0] = 0.25, a.f[1] = 1, a.b[1] = 2, a.fb_save[1] = 0.5;
  c.f[0] = 1, c.b[0] = 2, c.fb_save[0] = 0.5, c.f[1] = 1.5, c.b[1] = 3, c.fb_save[1] = 0.25;
  a.send_f = a.send_b = c.send_f = c.send_b = 0.1;
  const mp_pp_stage_times *st[2] = {&a, &c};
  double finish[2];
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_sim_pipeline(&ctx, MP_PP_INTERLEAVED, MP_PP_FLAVOR_MEGATRON_A2A, 2, 2, 4, st, finish), MP_OK)
      << mp_errmsg(&ctx);
  EXPECT_NEAR(finish[0], 30.8, 1e-9);
  EXPECT_NEAR(finish[1], 29.7, 1e-9);
  mp_sim_workspace *ws = NULL;
  ASSERT_EQ(mp_sim_workspace_create(&ctx, &ws), MP_OK);
  double save[2];
  for (int s = 0; s < 2; s++)
    ASSERT_EQ(mp_sim_pp_combined_save(&ctx, ws, MP_PP_INTERLEAVED, MP_PP_FLAVOR_MEGATRON_A2A, 2, 2, 4, s,
                                      st[s], &save[s]), MP_OK) << mp_errmsg(&ctx);
  EXPECT_NEAR(save[0], 1.0, 1e-12);
  EXPECT_NEAR(save[1], 1.5, 1e-12);
  mp_sim_workspace_destroy(ws);
}

TEST(PipelineTimeline, CombinedStepsNeedASteadyState) {
  // pp 2, v 2, m 2 under the EP overlap: with m == pp Megatron-LM runs every forward in the
  // warm-up and every backward in the cool-down, each alone (no combined step): its steady
  // loop, where the combined 1F1B pairs, has nothing to run. Equal chunks f 1, b 2, saving
  // 0.25, free transfers; F(c, i) chunk c, micro-batch i, virtual stages s0 c0, s1 c0, s0 c1,
  // s1 c1:
  //   s0 F(0,0) [0, 1], F(0,1) [1, 2], F(1,0) [2, 3] (s1's F(0,0) [1, 2]), F(1,1) [3, 4];
  //   s1 F(0,0) [1, 2], F(0,1) [2, 3], F(1,0) [3, 4], F(1,1) [4, 5], B(1,0) [5, 7],
  //      B(1,1) [7, 9], B(0,0) [9, 11] (s0's B(1,0) [7, 9]), B(0,1) [11, 13];
  //   s0 B(1,0) [7, 9], B(1,1) [9, 11], B(0,0) [11, 13], B(0,1) [13, 15].
  // Pairing s0's last forward with its first backward would have each stage's forward wait
  // on the backward of the stage after it, which waits on that forward.
  mp_pp_stage_times t;
  memset(&t, 0, sizeof t);
  for (int c = 0; c < 2; c++) t.f[c] = 1, t.b[c] = 2, t.fb_save[c] = 0.25;
  const mp_pp_stage_times *st[2] = {&t, &t};
  double finish[2];
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_EQ(mp_sim_pipeline(&ctx, MP_PP_INTERLEAVED, MP_PP_FLAVOR_MEGATRON_A2A, 2, 2, 2, st, finish), MP_OK)
      << mp_errmsg(&ctx);
  EXPECT_NEAR(finish[0], 15.0, 1e-9);
  EXPECT_NEAR(finish[1], 13.0, 1e-9);
}

TEST(PipelineTimeline, RefusesWhatTheScheduleRefuses) {
  mp_pp_stage_times t;
  memset(&t, 0, sizeof t);
  const mp_pp_stage_times *st[4] = {&t, &t, &t, &t};
  double finish[4];
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  // torch.distributed.pipelining's interleaved schedule needs m a multiple of pp, Megatron's
  // at least pp (its last group may be short: m = 6 on pp = 4 runs)
  EXPECT_EQ(mp_sim_pipeline(&ctx, MP_PP_INTERLEAVED, MP_PP_FLAVOR_TORCH, 4, 2, 6, st, finish), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("groups of pp=4"), std::string::npos);
  EXPECT_EQ(mp_sim_pipeline(&ctx, MP_PP_INTERLEAVED, MP_PP_FLAVOR_MEGATRON, 4, 2, 3, st, finish), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("Megatron-LM needs at least pp"), std::string::npos);
  EXPECT_EQ(mp_sim_pipeline(&ctx, MP_PP_INTERLEAVED, MP_PP_FLAVOR_MEGATRON, 4, 2, 6, st, finish), MP_OK);
  // a short last group whose chunks the stages would wait on each other for: refused as
  // input, naming the remedy (pp = 16, 8 chunks, 20 micro-batches)
  mp_pp_stage_times u;
  memset(&u, 0, sizeof u);
  for (int c = 0; c < 8; c++) u.f[c] = 1.0, u.b[c] = 2.0;
  const mp_pp_stage_times *su[16];
  double fin[16];
  for (int k = 0; k < 16; k++) su[k] = &u;
  EXPECT_EQ(mp_sim_pipeline(&ctx, MP_PP_INTERLEAVED, MP_PP_FLAVOR_MEGATRON, 16, 8, 20, su, fin), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("choose a multiple of 16 micro-batches"), std::string::npos)
      << mp_errmsg(&ctx);
}

// The zero-bubble schedules (torch's ZBV and interleaved ZB; Qi et al., arXiv 2401.10241)
// with F = B = W = 1 a chunk: b = 2 of which w = 1 is its W.
TEST(ZeroBubbleTimeline, ZbvWithEqualThirdsLeavesOnlyTheFill) {
  // F = B = W = 1 a chunk, 2 chunks x 8 micro-batches: every rank is busy 8 x 2 x 3 = 48.
  // Rank s cannot start before micro-batch 0's forward has passed s ranks (time s); from then
  // on the V keeps every rank busy (the paper's ZB-V, sec. 6: no bubble with T_F = T_B = T_W),
  // so rank s ends at 48 + s and the step at 48 + pp - 1 = 51, against 1F1B's interleaved
  // (m + (pp - 1) / v)(f + b) = (8 + 1.5) x 6 = 57 for the same chunks.
  EXPECT_EQ(Finish(MP_PP_ZBV, 4, 2, 8, 1, 2, 1, 0.0, MP_PP_FLAVOR_TORCH), (std::vector<double>{48, 49, 50, 51}));
}

TEST(ZeroBubbleTimeline, InterleavedZbIsZbH1) {
  // One chunk a stage (v = 1) is the paper's ZB-H1 (sec. 3.1): its bubble is (p - 1)(T_F +
  // T_B - T_W) = 3 x 1 against 1F1B's (p - 1)(T_F + T_B + T_W) = 9, so every stage ends at
  // m (F + B + W) + 3 = 27 where 1F1B's step is (m + p - 1) x 3 = 33.
  EXPECT_EQ(Finish(MP_PP_INTERLEAVED_ZB, 4, 1, 8, 1, 2, 1, 0.0, MP_PP_FLAVOR_TORCH), (std::vector<double>{27, 27, 27, 27}));
  // Two chunks: 2 x 8 x 3 = 48 busy a stage and the same 3 of fill: 51 on every stage.
  EXPECT_EQ(Finish(MP_PP_INTERLEAVED_ZB, 4, 2, 8, 1, 2, 1, 0.0, MP_PP_FLAVOR_TORCH), (std::vector<double>{51, 51, 51, 51}));
}

TEST(ZeroBubbleTimeline, ZbvTurnIsOnTheRank) {
  // pp = 2, m = 1, F = B = W = 1, sends 0.5. Rank 0: F(stage 0) F(3) B(3) W(3) B(0) W(0);
  // rank 1: F(1) F(2) B(2) W(2) B(1) W(1). F0 0-1; F1 after the send 1.5-2.5; F2 on the same
  // rank, no send: 2.5-3.5; F3 4-5; B3 (the loss's stage) 5-6, W3 6-7; B2 6.5-7.5, W2
  // 7.5-8.5; B1 (no send) waits for rank 1: 8.5-9.5, W1 9.5-10.5; B0 10-11, W0 11-12. A send
  // at the turn would add 0.5 each way.
  EXPECT_EQ(Finish(MP_PP_ZBV, 2, 2, 1, 1, 2, 1, 0.5, MP_PP_FLAVOR_TORCH), (std::vector<double>{12, 10.5}));
}

}  // namespace

// A worker's workspace keeps, per pipeline key, the order its first timeline's sweeps ran
// the steps in, and runs later timelines of that key from it (the order depends on which
// steps have run, never on their times). The kept order must give every stage's finish
// exactly as the sweeps do: uneven stages, uneven chunks and transfers, a second set of
// times through the same workspace, against a fresh workspace's sweeps; for 1F1B, GPipe
// and the interleaved schedule with a short last group.
TEST(PipelineTimeline, KeptOrderGivesTheSweepsFinishToTheBit) {
  struct Case {
    mp_pp_schedule kind;
    int pp, v;
    int64_t m;
  } cases[] = {{MP_PP_1F1B, 4, 1, 12}, {MP_PP_GPIPE, 3, 1, 7}, {MP_PP_INTERLEAVED, 4, 2, 16},
               {MP_PP_INTERLEAVED, 4, 2, 10}};
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_sim_workspace *ws = nullptr;
  ASSERT_EQ(mp_sim_workspace_create(&ctx, &ws), MP_OK);
  for (const Case &k : cases) {
    for (int round = 0; round < 3; round++) {
      std::vector<mp_pp_stage_times> t(k.pp);
      std::vector<const mp_pp_stage_times *> st(k.pp);
      for (int s = 0; s < k.pp; s++) {
        memset(&t[s], 0, sizeof t[s]);
        for (int c = 0; c < k.v; c++) {
          t[s].f[c] = 0.1 * (1 + (s * 7 + c * 3 + round * 5) % 11) / 3.0;
          t[s].b[c] = 0.2 * (1 + (s * 5 + c * 2 + round * 3) % 13) / 3.0;
        }
        t[s].send_f = 0.01 * (1 + (s + round) % 3) / 7.0;
        t[s].send_b = 0.02 * (1 + (s * 2 + round) % 5) / 7.0;
        st[s] = &t[s];
      }
      std::vector<double> kept(k.pp), swept(k.pp);
      ASSERT_EQ(mp_sim_pipeline_ws(&ctx, ws, k.kind, MP_PP_FLAVOR_MEGATRON, k.pp, k.v, k.m, st.data(),
                                   kept.data()),
                MP_OK)
          << mp_errmsg(&ctx);
      ASSERT_EQ(mp_sim_pipeline(&ctx, k.kind, MP_PP_FLAVOR_MEGATRON, k.pp, k.v, k.m, st.data(), swept.data()),
                MP_OK)
          << mp_errmsg(&ctx);
      for (int s = 0; s < k.pp; s++)
        EXPECT_EQ(kept[s], swept[s]) << "schedule " << k.kind << " pp " << k.pp << " m " << k.m << " round "
                                     << round << " stage " << s;
    }
    // the kept order is there (the rounds after the first ran from it): every step once
    int64_t n_rec = -1;
    for (const mp_sim_order_slot &o : ws->order_slots)
      if (o.valid && o.kind == k.kind && o.pp == k.pp && o.v == k.v && o.n_micro == k.m) n_rec = o.n_rec;
    EXPECT_EQ(n_rec, 2 * k.m * k.v * k.pp) << "schedule " << k.kind << " m " << k.m;
  }
  mp_sim_workspace_destroy(ws);
}

// A stage run told to stop past a step bound (mp_sim_stage_run_until, what the search's
// bound uses) stops after its recorded micro-batch with the chunk times, the all-to-all
// savings and the micro-batch count of the whole run (the engine records the chunk times in
// that micro-batch alone, so what follows cannot change them), hence the same
// mp_sim_stage_step_lb_s; told to stop past that bound itself (not past it) it runs the
// whole step and gives the whole run's figures. Llama 3.1 8B, pp = 4 on h100-8 (the
// stage's 8 layers; 16 micro-batches of one sequence, so the run has middle micro-batches
// after the recorded one) and the interleaved schedule with 2 chunks.
TEST(StageRunUntil, StopsWithTheWholeRunsChunkTimes) {
  for (int v : {1, 2}) {
    PlanCase k("llama3.1-8b", "h100-8", "pp=4,dp_replicate=2");
    k.o.seq = 2048;
    k.o.micro_batch = 1;
    k.o.global_batch = 32;
    k.o.pp_virtual = v;
    k.o.pp_schedule = v > 1 ? MP_PP_INTERLEAVED : MP_PP_1F1B;
    mp_plan *p = nullptr;
    ASSERT_EQ(mp_build_plan(&k.ctx, &k.m, &k.mesh, &k.o, &p), MP_OK) << mp_errmsg(&k.ctx);
    mp_arena *a = mp_arena_create();
    mp_schedule *s = nullptr;
    ASSERT_EQ(mp_schedule_build(&k.ctx, p, 0, MP_SCHEDULE_COMPACT, a, &s), MP_OK) << mp_errmsg(&k.ctx);
    mp_sim_config local;
    const mp_sim_config *cfg = nullptr;
    ASSERT_EQ(mp_sim_ws_begin(&k.ctx, &k.cfg, &local, &cfg), MP_OK) << mp_errmsg(&k.ctx);
    mp_sim_stage whole, stopped, past;
    ASSERT_EQ(mp_sim_stage_run(&k.ctx, s, cfg, nullptr, &whole, nullptr), MP_OK) << mp_errmsg(&k.ctx);
    ASSERT_EQ(whole.n_micro, 16);
    const double lb = mp_sim_stage_step_lb_s(&whole, v);
    ASSERT_GT(lb, 0.0);
    ASSERT_EQ(mp_sim_stage_run_until(&k.ctx, s, cfg, nullptr, lb * 0.5, &stopped), MP_OK) << mp_errmsg(&k.ctx);
    EXPECT_EQ(stopped.stopped, 1) << "v=" << v;
    EXPECT_EQ(stopped.n_micro, whole.n_micro);
    for (int c = 0; c < MP_PP_MAX_VIRTUAL; c++) {
      EXPECT_EQ(stopped.t.f[c], whole.t.f[c]) << "v=" << v << " chunk " << c;
      EXPECT_EQ(stopped.t.b[c], whole.t.b[c]) << "v=" << v << " chunk " << c;
      EXPECT_EQ(stopped.t.fb_save[c], whole.t.fb_save[c]) << "v=" << v << " chunk " << c;
    }
    EXPECT_EQ(mp_sim_stage_step_lb_s(&stopped, v), lb);
    EXPECT_EQ(stopped.r.step_time_s, 0.0) << "a stopped run states no other figure";
    ASSERT_EQ(mp_sim_stage_run_until(&k.ctx, s, cfg, nullptr, lb, &past), MP_OK) << mp_errmsg(&k.ctx);
    EXPECT_EQ(past.stopped, 0) << "v=" << v;
    EXPECT_EQ(past.r.step_time_s, whole.r.step_time_s) << "v=" << v;
    EXPECT_EQ(past.tail_s, whole.tail_s) << "v=" << v;
    EXPECT_EQ(past.r.peak_mem_bytes, whole.r.peak_mem_bytes) << "v=" << v;
    mp_sim_ws_end(cfg, &k.cfg);
    mp_arena_destroy(a);
    mp_plan_destroy(p);
  }
}
