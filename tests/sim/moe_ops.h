// The simulator tests' reading of a MoE plan's schedule: its first forward expert gate GEMM and
// its first all-to-all, the two ops whose rows and bytes the experts' routing sets
// (exec/schedule_prep.c, mp_sched_moe_rows).
#ifndef MP_TESTS_SIM_MOE_OPS_H
#define MP_TESTS_SIM_MOE_OPS_H

#include <gtest/gtest.h>

#include "exec/plan.h"
#include "exec/schedule.h"

namespace {

// The plan of (m, mesh, o) built and its expanded schedule read into *gate and *a2a.
inline void MoeGateAndDispatch(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh, const mp_plan_options *o,
                               mp_op *gate, mp_op *a2a) {
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_build_plan(ctx, m, mesh, o, &p), MP_OK) << mp_errmsg(ctx);
  mp_arena *a = mp_arena_create();
  mp_schedule *s = nullptr;
  ASSERT_EQ(mp_schedule_build(ctx, p, 0, MP_SCHEDULE_EXPANDED, a, &s), MP_OK) << mp_errmsg(ctx);
  int seen_gate = 0, seen_a2a = 0;
  for (int32_t i = 0; i < s->n_ops; i++) {
    const mp_op *op = &s->ops[i];
    if (!seen_gate && op->kernel == MP_KERNEL_GEMM && op->type == MP_OP_COMPUTE &&
        op->module == MP_MOD_EXPERTS_GATE && op->variant == MP_VAR_FWD)
      *gate = *op, seen_gate = 1;
    if (!seen_a2a && op->type == MP_OP_COMM && op->coll == MP_COLL_ALL_TO_ALL) *a2a = *op, seen_a2a = 1;
  }
  EXPECT_TRUE(seen_gate && seen_a2a);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
}

}  // namespace

#endif
