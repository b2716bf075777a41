// The schedule's model of the CPU runtime's memory (MP_MEM_MODEL_MESHPLAN_CPU, described in
// exec/schedule.c) against the runtime's tracked allocator, at world size 1 (no MPI; the
// multi-rank plans of the parity matrix are checked by parity_matrix.py). The allocator is
// the independent reference: it counts the bytes runtime.c asks for, whatever the schedule
// says. For tiny-dense and tiny-moe, every AC mode, float8 on and off (dense), two
// micro-batches per step: the simulator's predicted peak (meshplan-cpu stack on the cpu
// profile: no runtime overhead, no fragmentation factor) equals the measured peak to the
// byte, and so does every category's own high-water mark; the schedule's resident bytes
// are what the runtime holds between steps.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "exec/comm/comm.h"
#include "exec/runtime/runtime.h"
#include "exec/schedule.h"
#include "kernels/cpu/cpu.h"
#include "sim/sim.h"
#include "sim/stack.h"

namespace {

struct Case {
  const char *model;
  mp_ac_mode ac;
  int fp8;
};

std::string Name(const Case &k) {
  return std::string(k.model) + " ac=" + mp_ac_mode_name(k.ac) + (k.fp8 ? " fp8" : "");
}

void CheckCase(const Case &k) {
  SCOPED_TRACE(Name(k));
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, k.model, &m), MP_OK) << mp_errmsg(&ctx);
  mp_mesh mesh;
  mp_mesh_init(&mesh);
  mp_stack_profile prof;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cpu", &prof), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(prof.mem_model, MP_MEM_MODEL_MESHPLAN_CPU);
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.seq = 32;
  o.micro_batch = 2;
  o.global_batch = 4;  // two micro-batches: the peak must not grow from one to the next
  o.ac = k.ac;
  o.fp8 = k.fp8;
  mp_stack_plan_options(&prof, &o);
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_build_plan(&ctx, &m, &mesh, &o, &p), MP_OK) << mp_errmsg(&ctx);

  // The schedule is well formed in both modes (every FREE matches its ALLOC, one micro-batch
  // returns to the resident bytes).
  mp_arena *a = mp_arena_create();
  mp_schedule *se = nullptr, *sc = nullptr;
  ASSERT_EQ(mp_schedule_build(&ctx, p, 0, MP_SCHEDULE_EXPANDED, a, &se), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_schedule_build(&ctx, p, 0, MP_SCHEDULE_COMPACT, a, &sc), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_schedule_check(&ctx, se), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_schedule_check(&ctx, sc), MP_OK) << mp_errmsg(&ctx);

  mp_cluster c;
  ASSERT_EQ(mp_cluster_make(&ctx, "cpu", 1, 1, &c), MP_OK) << mp_errmsg(&ctx);
  mp_sim_config cfg = {};
  cfg.cluster = &c;
  cfg.stack = &prof;
  mp_sim_result r;
  ASSERT_EQ(mp_simulate_built_plan(&ctx, p, &cfg, nullptr, &r), MP_OK) << mp_errmsg(&ctx);

  mp_comm *comm = nullptr;
  ASSERT_EQ(mp_comm_create_single(&ctx, &mesh, &comm), MP_OK) << mp_errmsg(&ctx);
  mp_kctx kc{};
  kc.err = &ctx;
  ASSERT_EQ(mp_backend_cpu()->init(&kc, 0), MP_OK);
  mp_runtime_options ro;
  mp_runtime_options_init(&ro);
  mp_runtime *rt = nullptr;
  ASSERT_EQ(mp_runtime_create(&ctx, p, comm, mp_backend_cpu(), &kc, &ro, &rt), MP_OK) << mp_errmsg(&ctx);
  const mp_talloc *ta = mp_runtime_allocator(rt);
  for (int c2 = 0; c2 < MP_MEM_COUNT; c2++)
    EXPECT_EQ(se->resident_bytes[c2], mp_talloc_current_bytes(ta, (mp_mem_cat)c2))
        << "resident " << mp_mem_cat_name((mp_mem_cat)c2);
  std::vector<int32_t> batch(4 * 33);
  for (size_t i = 0; i < batch.size(); i++) batch[i] = (int32_t)((i * 97 + 11) % m.vocab);
  mp_step_result res;
  ASSERT_EQ(mp_runtime_step(&ctx, rt, batch.data(), &res), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(r.peak_mem_bytes, res.peak_bytes);
  for (int c2 = 0; c2 < MP_MEM_COUNT; c2++)
    EXPECT_EQ(r.mem_max[c2], mp_talloc_peak_bytes(ta, (mp_mem_cat)c2))
        << "category " << mp_mem_cat_name((mp_mem_cat)c2);

  mp_runtime_destroy(rt);
  mp_backend_cpu()->shutdown(&kc);
  mp_comm_destroy(comm);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
  mp_sim_thread_release();
}

TEST(ScheduleMemory, CpuModelEqualsTrackedAllocator) {
  const mp_ac_mode modes[] = {MP_AC_NONE, MP_AC_SELECTIVE, MP_AC_FULL};
  for (const char *model : {"tiny-dense", "tiny-moe"})
    for (mp_ac_mode ac : modes)
      for (int fp8 = 0; fp8 <= (std::string(model) == "tiny-dense" ? 1 : 0); fp8++)
        CheckCase({model, ac, fp8});
}

// The default memory model is not the CPU runtime's: a GPU stack profile leaves it alone,
// so the torchtitan figures (meshplan validate) do not move.
TEST(ScheduleMemory, GpuStacksKeepTheTorchtitanModel) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  for (const char *n : {"torchtitan-eager", "torchtitan-compile", "llm.c", "meshplan-cuda"}) {
    mp_stack_profile prof;
    ASSERT_EQ(mp_stack_load(&ctx, n, &prof), MP_OK) << n << ": " << mp_errmsg(&ctx);
    mp_plan_options o;
    mp_plan_options_init(&o);
    mp_stack_plan_options(&prof, &o);
    EXPECT_EQ(o.mem_model, MP_MEM_MODEL_TORCHTITAN) << n;
    EXPECT_EQ(o.fsdp.param_dtype, MP_DTYPE_BF16) << n;
  }
}

}  // namespace
