// The zero-bubble schedules through the simulator (sim/sim.c, sim/pipeline.c): ZBV's V puts
// the embedding and the head on rank 0, the W steps fill what 1F1B leaves idle, and the
// search's memory-first stop agrees with the whole simulation.
#include <gtest/gtest.h>

#include "tests/sim/plan_case.h"

namespace {

// Llama-3.1-8B on pp=4 x dp_shard=2, full AC, 8 micro-batches of one 8192-token sequence.
struct Case : PlanCase {
  Case() : PlanCase("llama3.1-8b", "h100-8", "pp=4,dp_shard=2") { FullAcOneSequence(8192, 16); }
  mp_sim_result Run(mp_pp_schedule k, int v) {
    o.pp_schedule = k;
    o.pp_virtual = v;
    int64_t peaks[4] = {0, 0, 0, 0};
    cfg.stage_peak_bytes = peaks;
    mp_sim_result r = Sim();
    cfg.stage_peak_bytes = nullptr;
    for (int s = 0; s < 4; s++) stage_peak[s] = peaks[s];
    return r;
  }
  int64_t stage_peak[4] = {0, 0, 0, 0};
};

// ZBV (torchtitan's style "v"): rank 0 holds model chunks 0 and 7, layers 0-3 and 28-31 with
// the embedding, the final norm and the output: 8 x 218,112,000 + 2 x 128,256 x 4096 + 4096 =
// 2,795,573,248 parameters, fp32 over dp_shard=2: 5,591,146,496 bytes at its peak (the
// fullest rank under full AC, whose activations are small). Interleaved x2 puts the output
// on stage 3 instead: its stage 0 holds the embedding alone beside 8 layers.
TEST(ZeroBubble, ZbvHoldsTheEmbeddingAndTheHeadOnRankZero) {
  Case s;
  const mp_sim_result zbv = s.Run(MP_PP_ZBV, 2);
  EXPECT_EQ(zbv.mem_at_peak[MP_MEM_PARAMS], 2795573248LL * 4 / 2);
  const int64_t zbv0 = s.stage_peak[0];
  s.Run(MP_PP_INTERLEAVED, 2);
  EXPECT_GT(zbv0, s.stage_peak[0]);
}

// The same chunks under interleaved 1F1B x2 and its zero-bubble form: the W steps fill the
// fill and drain, so the bubble shrinks while the busy time (the chunks' F + B + W) stays.
TEST(ZeroBubble, WStepsShrinkTheBubble) {
  Case s;
  const mp_sim_result one = s.Run(MP_PP_INTERLEAVED, 2);
  const mp_sim_result zb = s.Run(MP_PP_INTERLEAVED_ZB, 2);
  EXPECT_LT(zb.bubble_s, one.bubble_s);
  EXPECT_NEAR(zb.compute_s, one.compute_s, 1e-9 * one.compute_s);
  EXPECT_LT(zb.step_time_s, one.step_time_s);
}

// The search's memory-first stop (mp_simulate_prepped with memory_first) reaches the verdict
// and figures of the whole simulation: a stage's own order gives what it holds.
TEST(ZeroBubble, MemoryFirstAgreesWithTheWholeSimulation) {
  for (mp_pp_schedule k : {MP_PP_ZBV, MP_PP_INTERLEAVED_ZB}) {
    Case s;
    s.o.pp_schedule = k;
    s.o.pp_virtual = 2;
    s.ExpectMemoryFirstAgrees(mp_pp_schedule_name(k));
  }
}

}  // namespace
