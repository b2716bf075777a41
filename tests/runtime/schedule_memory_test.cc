// The schedule's models of the runtime's memory (described in exec/schedule_rt.c) against the
// runtime's tracked allocator, at world size 1 (no MPI; the multi-rank plans of the parity
// matrix are checked by parity_matrix.py). The allocator is the independent reference: it
// counts the bytes the runtime asks for, whatever the schedule says.
//   MP_MEM_MODEL_MESHPLAN_CPU on the CPU backend: for tiny-dense and tiny-moe, every AC
//   mode, float8 on and off (dense), two micro-batches per step, the simulator's predicted
//   peak (meshplan-cpu stack on the cpu profile: no runtime overhead, no fragmentation
//   factor) equals the measured peak to the byte, and so does every category's own
//   high-water mark; the schedule's resident bytes are what the runtime holds between
//   steps.
//   MP_MEM_MODEL_MESHPLAN_CUDA on the accounting backend (acct_backend.h: the CPU table
//   with bf16 X tensors and no-op kernels, so the runtime allocates what it allocates on
//   CUDA): the same equalities for tiny-dense, tiny-moe and llama-1b-bench, every AC
//   mode, float8 on and off. The prediction compared is the allocation peak, before the
//   stack's fragmentation factor and the GPU's runtime overhead (mp_sim_result's
//   peak_mem_bytes less overhead_bytes): what the tracked allocator counts.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "exec/comm/comm.h"
#include "exec/runtime/runtime.h"
#include "exec/schedule.h"
#include "kernels/cpu/cpu.h"
#include "sim/sim.h"
#include "sim/stack.h"
#include "tests/runtime/acct_backend.h"
#include "tests/runtime/schedule_replay.h"

namespace {

struct Case {
  const char *model;
  mp_ac_mode ac;
  int fp8;
  int f8_codes = 0;  // float8 on codes (the CUDA path's operands) with the CPU's fp32 X
};

std::string Name(const Case &k) {
  return std::string(k.model) + " ac=" + mp_ac_mode_name(k.ac) + (k.fp8 ? " fp8" : "") +
         (k.f8_codes ? " on codes" : "");
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
  mp_gpu gpu;
  EXPECT_EQ(mp_gpu_load(&ctx, "cpu", &gpu), MP_OK) << mp_errmsg(&ctx);
  mp_stack_plan_options(&prof, &gpu, &o);
  o.f8_codes = k.f8_codes;
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
  ro.f8_codes = k.f8_codes;
  mp_runtime *rt = nullptr;
  ASSERT_EQ(mp_runtime_create(&ctx, p, comm, mp_backend_cpu(), &kc, &ro, &rt), MP_OK) << mp_errmsg(&ctx);
  const mp_talloc *ta = mp_runtime_allocator(rt);
  // On codes the float8 weights' codes are allocated at their first GEMM and kept: the
  // resident bytes hold from the first step's end on.
  if (!k.f8_codes) {
    for (int c2 = 0; c2 < MP_MEM_COUNT; c2++)
      EXPECT_EQ(se->resident_bytes[c2], mp_talloc_current_bytes(ta, (mp_mem_cat)c2))
          << "resident " << mp_mem_cat_name((mp_mem_cat)c2);
  }
  std::vector<int32_t> batch(4 * 33);
  for (size_t i = 0; i < batch.size(); i++) batch[i] = (int32_t)((i * 97 + 11) % m.vocab);
  mp_step_result res;
  ASSERT_EQ(mp_runtime_step(&ctx, rt, batch.data(), &res), MP_OK) << mp_errmsg(&ctx);
  if (k.f8_codes) {
    for (int c2 = 0; c2 < MP_MEM_COUNT; c2++)
      EXPECT_EQ(se->resident_bytes[c2], mp_talloc_current_bytes(ta, (mp_mem_cat)c2))
          << "resident after a step " << mp_mem_cat_name((mp_mem_cat)c2);
  }
  EXPECT_EQ(r.peak_mem_bytes, res.peak_bytes);
  for (int c2 = 0; c2 < MP_MEM_COUNT; c2++)
    EXPECT_EQ(r.mem_max[c2], mp_talloc_peak_bytes(ta, (mp_mem_cat)c2))
        << "category " << mp_mem_cat_name((mp_mem_cat)c2);

  mp_runtime_destroy(rt);
  mp_backend_cpu()->shutdown(&kc);
  mp_comm_destroy(comm);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
}

TEST(ScheduleMemory, CpuModelEqualsTrackedAllocator) {
  const mp_ac_mode modes[] = {MP_AC_NONE, MP_AC_SELECTIVE_CORE, MP_AC_FULL};
  for (const char *model : {"tiny-dense", "tiny-moe"})
    for (mp_ac_mode ac : modes)
      for (int fp8 = 0; fp8 <= (std::string(model) == "tiny-dense" ? 1 : 0); fp8++)
        CheckCase({model, ac, fp8});
  for (mp_ac_mode ac : modes) CheckCase({"tiny-dense", ac, 1, 1});
}

// The CUDA runtime's model against the accounting backend. One rank: the comm is "single",
// so the runtime's NCCL overlap (prefetch, deferred reduce-scatters) has no sharded unit
// to act on, as on one GPU; multi-rank plans are reasoned in exec/schedule_rt.c.
struct CudaCase {
  const char *model;
  int64_t seq, micro_batch, global_batch;
  mp_ac_mode ac;
  int fp8;
};

std::string CudaName(const CudaCase &k) {
  return std::string(k.model) + " seq=" + std::to_string(k.seq) + " mb=" + std::to_string(k.micro_batch) +
         " gb=" + std::to_string(k.global_batch) + " ac=" + mp_ac_mode_name(k.ac) + (k.fp8 ? " fp8" : "");
}

// Peak of a schedule's memory events replayed in issue order over one micro-batch (with the
// prologue): the expanded and compact forms must agree with each other and the simulator.
using mp_test::ReplayPeak;

void CheckCudaCase(const CudaCase &k, const mp_backend *be) {
  SCOPED_TRACE(CudaName(k));
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, k.model, &m), MP_OK) << mp_errmsg(&ctx);
  mp_mesh mesh;
  mp_mesh_init(&mesh);
  mp_stack_profile prof;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cuda", &prof), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(prof.mem_model, MP_MEM_MODEL_MESHPLAN_CUDA);
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.seq = k.seq;
  o.micro_batch = k.micro_batch;
  o.global_batch = k.global_batch;
  o.ac = k.ac;
  o.fp8 = k.fp8;
  mp_gpu gpu;
  EXPECT_EQ(mp_gpu_load(&ctx, "h100-sxm", &gpu), MP_OK) << mp_errmsg(&ctx);
  mp_stack_plan_options(&prof, &gpu, &o);
  ASSERT_EQ(o.fsdp.param_dtype, MP_DTYPE_BF16);
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_build_plan(&ctx, &m, &mesh, &o, &p), MP_OK) << mp_errmsg(&ctx);
  if (k.fp8) {
    int n8 = 0;
    for (int i = 0; i < p->n_params; i++) n8 += p->params[i].float8;
    ASSERT_GT(n8, 0) << "float8 was asked for but no Linear is float8";
  }

  mp_arena *a = mp_arena_create();
  mp_schedule *se = nullptr, *sc = nullptr;
  ASSERT_EQ(mp_schedule_build(&ctx, p, 0, MP_SCHEDULE_EXPANDED, a, &se), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_schedule_build(&ctx, p, 0, MP_SCHEDULE_COMPACT, a, &sc), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_schedule_check(&ctx, se), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_schedule_check(&ctx, sc), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(ReplayPeak(se), ReplayPeak(sc));

  mp_cluster c;
  ASSERT_EQ(mp_cluster_make(&ctx, "h100-sxm", 1, 1, &c), MP_OK) << mp_errmsg(&ctx);
  mp_sim_config cfg = {};
  cfg.cluster = &c;
  cfg.stack = &prof;
  mp_sim_result r;
  ASSERT_EQ(mp_simulate_built_plan(&ctx, p, &cfg, nullptr, &r), MP_OK) << mp_errmsg(&ctx);
  const int64_t predicted = r.peak_mem_bytes - r.overhead_bytes; // allocated, before frag and overhead
  EXPECT_EQ(predicted, ReplayPeak(se));

  mp_comm *comm = nullptr;
  ASSERT_EQ(mp_comm_create_single(&ctx, &mesh, &comm), MP_OK) << mp_errmsg(&ctx);
  mp_kctx kc{};
  kc.err = &ctx;
  ASSERT_EQ(be->init(&kc, 0), MP_OK) << mp_errmsg(&ctx);
  mp_runtime_options ro;
  mp_runtime_options_init(&ro);
  mp_runtime *rt = nullptr;
  ASSERT_EQ(mp_runtime_create(&ctx, p, comm, be, &kc, &ro, &rt), MP_OK) << mp_errmsg(&ctx);
  const mp_talloc *ta = mp_runtime_allocator(rt);
  const int64_t n_seq = k.global_batch;
  std::vector<int32_t> batch((size_t)(n_seq * (k.seq + 1)));
  for (size_t i = 0; i < batch.size(); i++) batch[i] = (int32_t)((i * 97 + 11) % m.vocab);
  // Step 1 makes what the runtime keeps from its first use on (float8 codes of weights that
  // are not sharded); between steps the runtime holds the schedule's resident bytes, and
  // every later step peaks where the schedule does.
  mp_step_result res1, res2;
  ASSERT_EQ(mp_runtime_step(&ctx, rt, batch.data(), &res1), MP_OK) << mp_errmsg(&ctx);
  for (int c2 = 0; c2 < MP_MEM_COUNT; c2++)
    EXPECT_EQ(se->resident_bytes[c2], mp_talloc_current_bytes(ta, (mp_mem_cat)c2))
        << "resident " << mp_mem_cat_name((mp_mem_cat)c2);
  EXPECT_LE(res1.peak_bytes, predicted);
  ASSERT_EQ(mp_runtime_step(&ctx, rt, batch.data(), &res2), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(predicted, res2.peak_bytes);
  for (int c2 = 0; c2 < MP_MEM_COUNT; c2++)
    EXPECT_EQ(r.mem_max[c2], mp_talloc_peak_bytes(ta, (mp_mem_cat)c2))
        << "category " << mp_mem_cat_name((mp_mem_cat)c2);
  printf("  %-58s predicted %14lld measured %14lld bytes\n", CudaName(k).c_str(), (long long)predicted,
         (long long)res2.peak_bytes);

  mp_runtime_destroy(rt);
  be->shutdown(&kc);
  mp_comm_destroy(comm);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
}

TEST(ScheduleMemory, CudaModelEqualsTrackedAllocatorOnBf16Backend) {
  const mp_ac_mode modes[] = {MP_AC_NONE, MP_AC_SELECTIVE_CORE, MP_AC_FULL};
  for (const char *model : {"tiny-dense", "tiny-moe"})
    for (mp_ac_mode ac : modes)
      for (int fp8 = 0; fp8 <= 1; fp8++) CheckCudaCase({model, 32, 2, 4, ac, fp8}, mp_backend_acct());
}

// A GPU-sized model at a small batch: 1.1 B parameters, seq 256, one sequence per
// micro-batch, two micro-batches, on mp_backend_acct_untouched (no page of the 20 GB is
// touched; each case costs its host-side initialization, about 7 s on 2 cores). Three of
// the AC x float8 cases here, the other three below.
TEST(ScheduleMemory, CudaModelEqualsTrackedAllocatorLlama1b) {
  const mp_backend *be = mp_backend_acct_untouched();
  CheckCudaCase({"llama-1b-bench", 256, 1, 2, MP_AC_NONE, 0}, be);
  CheckCudaCase({"llama-1b-bench", 256, 1, 2, MP_AC_NONE, 1}, be);
  CheckCudaCase({"llama-1b-bench", 256, 1, 2, MP_AC_FULL, 1}, be);
}

// By hand (--gtest_also_run_disabled_tests --gtest_filter='*Llama1bMore*'): the other
// cases at seq 256, and the GPU benchmark plan (one H100: seq 2048, micro-batch 4,
// about 32 GB of allocations, AC none, bf16 and float8).
TEST(ScheduleMemory, DISABLED_CudaModelLlama1bMore) {
  const mp_backend *be = mp_backend_acct_untouched();
  CheckCudaCase({"llama-1b-bench", 256, 1, 2, MP_AC_SELECTIVE_CORE, 0}, be);
  CheckCudaCase({"llama-1b-bench", 256, 1, 2, MP_AC_SELECTIVE_CORE, 1}, be);
  CheckCudaCase({"llama-1b-bench", 256, 1, 2, MP_AC_FULL, 0}, be);
  for (int fp8 = 0; fp8 <= 1; fp8++) CheckCudaCase({"llama-1b-bench", 2048, 4, 4, MP_AC_NONE, fp8}, be);
}

// The accounting backend is what it claims: bf16 X tensors, not the CPU's name (so the
// runtime treats its memory as device memory), every op present.
TEST(ScheduleMemory, AccountingBackend) {
  const mp_backend *b = mp_backend_acct();
  EXPECT_STREQ(b->name, "acct");
  EXPECT_EQ(b->x_dtype, MP_KDTYPE_BF16);
  EXPECT_EQ(b->alloc, mp_backend_cpu()->alloc);
  EXPECT_NE(b->matmul_forward, mp_backend_cpu()->matmul_forward);
  EXPECT_NE(b->x_from_f32, mp_backend_cpu()->x_from_f32);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_kctx kc{};
  kc.err = &ctx;
  EXPECT_EQ(b->init(&kc, 0), MP_OK) << mp_errmsg(&ctx);
  b->shutdown(&kc);
}

// The torchtitan model stays the default and the torchtitan-calibrated GPU stacks keep it,
// so their figures (meshplan validate) do not move; meshplan-cuda names its runtime's.
TEST(ScheduleMemory, StacksNameTheirMemoryModels) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  for (const char *n : {"torchtitan-eager", "torchtitan-compile", "llm.c", "meshplan-cuda"}) {
    mp_stack_profile prof;
    ASSERT_EQ(mp_stack_load(&ctx, n, &prof), MP_OK) << n << ": " << mp_errmsg(&ctx);
    mp_plan_options o;
    mp_plan_options_init(&o);
    mp_gpu gpu;
    EXPECT_EQ(mp_gpu_load(&ctx, "h100-sxm", &gpu), MP_OK) << mp_errmsg(&ctx);
    mp_stack_plan_options(&prof, &gpu, &o);
    EXPECT_EQ(o.mem_model, std::string(n) == "meshplan-cuda" ? MP_MEM_MODEL_MESHPLAN_CUDA : MP_MEM_MODEL_TORCHTITAN)
        << n;
    EXPECT_EQ(o.fsdp.param_dtype, MP_DTYPE_BF16) << n;
    EXPECT_EQ(o.master_dtype, MP_DTYPE_FP32) << n;
  }
  mp_plan_options o;
  mp_plan_options_init(&o);
  EXPECT_EQ(o.mem_model, MP_MEM_MODEL_TORCHTITAN);
}

}  // namespace
