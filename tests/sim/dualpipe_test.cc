// DualPipe through the simulator (sim/sim.c): a rank holds two model stages, s and pp - 1 - s,
// with their parameters, gradients and optimizer state (deepseek-ai/DualPipe's table:
// parameters 2x a device), and the plan refuses what the reference refuses.
#include <gtest/gtest.h>

#include <string>

#include "tests/sim/plan_case.h"

namespace {

// Llama-3.1-8B on pp=4 x dp_shard=2, full AC, 8 micro-batches of one 8192-token sequence.
struct Case : PlanCase {
  Case() : PlanCase("llama3.1-8b", "h100-8", "pp=4,dp_shard=2") { FullAcOneSequence(8192, 16); }
  mp_status Sim(mp_pp_schedule k, mp_sim_result *r) {
    o.pp_schedule = k;
    return mp_simulate_plan(&ctx, &m, &mesh, &o, &cfg, r);
  }
};

// Llama-3.1-8B's 32 layers on pp=4, 8 a stage, FSDP over dp_shard=2 (fp32 parameters, 4
// bytes over 2 ranks). A layer holds 2 x 4096^2 + 2 x 1024 x 4096 + 3 x 14,336 x 4096 + 2 x
// 4096 = 218,112,000 parameters. Under 1F1B the fullest stage holds one stage's; under
// DualPipe ranks 0 and 3 hold stages 0 and 3: 16 layers, the embedding and the output (2 x
// 128,256 x 4096) and the final norm (4096), 4,540,469,248 parameters, 9,080,938,496 bytes;
// ranks 1 and 2 hold 16 layers alone, and carry no head.
TEST(DualPipe, ARankHoldsBothItsStagesParameters) {
  Case s;
  mp_sim_result one, dual;
  ASSERT_EQ(s.Sim(MP_PP_1F1B, &one), MP_OK) << mp_errmsg(&s.ctx);
  ASSERT_EQ(s.Sim(MP_PP_DUALPIPE, &dual), MP_OK) << mp_errmsg(&s.ctx);
  const int64_t layer = 2LL * 4096 * 4096 + 2LL * 1024 * 4096 + 3LL * 14336 * 4096 + 2 * 4096;
  ASSERT_EQ(layer, 218112000);
  const int64_t params = 16 * layer + 2LL * 128256 * 4096 + 4096;
  EXPECT_EQ(dual.mem_at_peak[MP_MEM_PARAMS], params * 4 / 2);
  EXPECT_LT(one.mem_at_peak[MP_MEM_PARAMS], params * 4 / 2);
  EXPECT_GT(dual.peak_mem_bytes, one.peak_mem_bytes);
}

// The reference asserts an even pp (its two directions meet in the middle) and an even
// number of micro-batches, at least 2 pp (deepseek-ai/DualPipe, DualPipe.step).
TEST(DualPipe, RefusesWhatTheReferenceRefuses) {
  Case s;
  mp_sim_result r;
  s.o.global_batch = 12;  // 6 micro-batches on pp=4: fewer than 8
  EXPECT_EQ(s.Sim(MP_PP_DUALPIPE, &r), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&s.ctx)).find("at least 2 x pp"), std::string::npos) << mp_errmsg(&s.ctx);
  s.o.global_batch = 16;
  ASSERT_EQ(mp_mesh_parse(&s.ctx, "pp=2,dp_shard=4", 8, &s.mesh), MP_OK);
  EXPECT_EQ(s.Sim(MP_PP_DUALPIPE, &r), MP_OK) << mp_errmsg(&s.ctx);
  mp_cluster c6;
  ASSERT_EQ(mp_cluster_make(&s.ctx, "h100-sxm", 6, 6, &c6), MP_OK);
  s.cfg.cluster = &c6;
  ASSERT_EQ(mp_mesh_parse(&s.ctx, "pp=3,dp_shard=2", 6, &s.mesh), MP_OK);
  EXPECT_EQ(s.Sim(MP_PP_DUALPIPE, &r), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&s.ctx)).find("even number of stages"), std::string::npos) << mp_errmsg(&s.ctx);
}

}  // namespace

// The search's memory-first stop (mp_simulate_prepped with memory_first) gives DualPipe the
// verdict and figures of the whole simulation: a rank holds two stages, so a stage's memory
// alone decides nothing (mp_sim_stage_memory_over) and every stage is simulated.
TEST(DualPipe, MemoryFirstDecidesNothingFromOneStage) {
  for (double headroom : {0.0, 0.5}) {
    Case s;
    s.o.pp_schedule = MP_PP_DUALPIPE;
    s.cfg.mem_headroom = headroom;
    s.ExpectMemoryFirstAgrees(headroom > 0.0 ? "headroom 0.5" : "headroom 0");
  }
}
