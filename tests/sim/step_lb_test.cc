// A pipeline stage's lower bound of the step (sim/sim_internal.h mp_sim_stage_step_lb_s), the
// number the search's step bound compares (planner/search.h bound_top_k): n_micro x the sum
// over the stage's model chunks of its forward and backward per micro-batch, less the EP
// all-to-all overlap's saving where a chunk has one (fb_save > 0: the forward and backward
// of a combined step overlap their all-to-alls, sim/pipeline.c), by hand.
#include <gtest/gtest.h>

#include <cstring>

extern "C" {
#include "sim/sim_internal.h"
}

namespace {

// Two chunks, 4 micro-batches: chunk 0 forward 0.5 s, backward 1 s, saving 0.25 s; chunk 1
// forward 1 s, backward 2 s, saving 0.5 s. 4 x ((0.5 + 1 - 0.25) + (1 + 2 - 0.5)) =
// 4 x (1.25 + 2.5) = 15 s; without the savings it would be 4 x 4.5 = 18 s, past a step that
// overlaps them. One chunk (v = 1) counts chunk 0 alone: 4 x 1.25 = 5 s.
TEST(StageStepLb, ForwardAndBackwardLessTheOverlapSaving) {
  mp_sim_stage x;
  memset(&x, 0, sizeof x);
  x.n_micro = 4;
  x.t.f[0] = 0.5, x.t.b[0] = 1.0, x.t.fb_save[0] = 0.25;
  x.t.f[1] = 1.0, x.t.b[1] = 2.0, x.t.fb_save[1] = 0.5;
  EXPECT_DOUBLE_EQ(mp_sim_stage_step_lb_s(&x, 2), 15.0);
  EXPECT_DOUBLE_EQ(mp_sim_stage_step_lb_s(&x, 1), 5.0);
}

// A chunk without the overlap (fb_save 0, or negative: no saving) counts f + b whole:
// 3 x (0.5 + 1) = 4.5 s.
TEST(StageStepLb, NoSavingWithoutTheOverlap) {
  mp_sim_stage x;
  memset(&x, 0, sizeof x);
  x.n_micro = 3;
  x.t.f[0] = 0.5, x.t.b[0] = 1.0, x.t.fb_save[0] = -0.25;
  EXPECT_DOUBLE_EQ(mp_sim_stage_step_lb_s(&x, 1), 4.5);
}

}  // namespace
