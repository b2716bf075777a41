// The kernel profile (exec/runtime/kprof.h, `meshplan train --profile`) and the
// simulator's busy time by class (mp_sim_trace_busy) on the same step: tiny-dense (2
// layers), one rank, seq 32, 2 micro-batches of 2, AC none, clipping off.
//
// Hand-derived kernel calls of the runtime per micro-batch (exec/runtime/): per layer 7 forward
// GEMMs (q, k, v, o, gate, up, down) and 7 matmul_backward calls (each computes dgrad and
// wgrad), plus the head's forward and backward: 2 x 14 + 2 = 30; attention forward and
// backward per layer: 4; RMSNorm forward and backward, 2 per layer and the final one: 10;
// SwiGLU forward and backward per layer: 4; embedding forward and backward: 2; loss
// (cross_entropy_forward, ce_backward): 2. Per step: one sum_squares and one adamw_update
// per parameter tensor (9 per layer, embeddings, final norm, head: 21).
//
// The schedule (meshplan-cpu model) counts each GEMM product as one op: per micro-batch
// 2 x (7 + 7 + 7) + 3 = 45, and the other classes as the runtime calls them (RoPE on q
// and on k, 4 per layer; the residual adds of the forward, 2 per layer).
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "exec/comm/comm.h"
#include "exec/runtime/kprof.h"
#include "exec/runtime/runtime.h"
#include "exec/schedule.h"
#include "kernels/cpu/cpu.h"
#include "sim/sim.h"
#include "sim/stack.h"

namespace {

struct StepRun {
  mp_ctx ctx;
  mp_model m;
  mp_plan *p = nullptr;
  mp_comm *comm = nullptr;
  mp_kctx kc{};
  mp_runtime *rt = nullptr;
  mp_step_result res{};
  mp_status st = MP_OK;

  // One training step of the plan on be (the CPU backend or a table over it).
  StepRun(const mp_backend *be, const mp_plan_options &o, mp_comm_prof *cprof, int f8_codes = 0) {
    mp_ctx_init(&ctx);
    if ((st = mp_model_load(&ctx, "tiny-dense", &m)) != MP_OK) return;
    mp_mesh mesh;
    mp_mesh_init(&mesh);
    if ((st = mp_build_plan(&ctx, &m, &mesh, &o, &p)) != MP_OK) return;
    if ((st = mp_comm_create_single(&ctx, &mesh, &comm)) != MP_OK) return;
    mp_comm_profile(comm, cprof);
    kc.err = &ctx;
    if ((st = mp_backend_cpu()->init(&kc, 0)) != MP_OK) return;
    mp_runtime_options ro;
    mp_runtime_options_init(&ro);
    ro.max_grad_norm = 0;  // no clipping: the optimizer's calls are the AdamW updates alone
    ro.f8_codes = f8_codes;
    if ((st = mp_runtime_create(&ctx, p, comm, be, &kc, &ro, &rt)) != MP_OK) return;
    std::vector<int32_t> batch(4 * 33);
    for (size_t i = 0; i < batch.size(); i++) batch[i] = (int32_t)((i * 97 + 11) % m.vocab);
    st = mp_runtime_step(&ctx, rt, batch.data(), &res);
  }
  ~StepRun() {
    mp_runtime_destroy(rt);
    mp_backend_cpu()->shutdown(&kc);
    mp_comm_destroy(comm);
    mp_plan_destroy(p);
  }
};

mp_plan_options Options() {
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.seq = 32;
  o.micro_batch = 2;
  o.global_batch = 4;
  return o;
}

// The simulator's busy time by class for one step of tiny-dense under o (meshplan-cpu
// stack, one CPU rank): *b, and the simulation's result *r.
void SimBusy(mp_plan_options o, mp_sim_busy *b, mp_sim_result *r) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, "tiny-dense", &m), MP_OK) << mp_errmsg(&ctx);
  mp_stack_profile stack;
  ASSERT_EQ(mp_stack_load(&ctx, "meshplan-cpu", &stack), MP_OK) << mp_errmsg(&ctx);
  const int f8_codes = o.f8_codes;
  mp_gpu gpu;
  EXPECT_EQ(mp_gpu_load(&ctx, "cpu", &gpu), MP_OK) << mp_errmsg(&ctx);
  mp_stack_plan_options(&stack, &gpu, &o);
  o.f8_codes = f8_codes;
  mp_mesh mesh;
  mp_mesh_init(&mesh);
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_build_plan(&ctx, &m, &mesh, &o, &p), MP_OK) << mp_errmsg(&ctx);
  mp_cluster c;
  ASSERT_EQ(mp_cluster_make(&ctx, "cpu", 1, 1, &c), MP_OK) << mp_errmsg(&ctx);
  mp_arena *a = mp_arena_create();
  mp_schedule *s = nullptr;
  ASSERT_EQ(mp_schedule_build(&ctx, p, 0, MP_SCHEDULE_COMPACT, a, &s), MP_OK) << mp_errmsg(&ctx);
  mp_sim_config cfg = {};
  cfg.cluster = &c;
  cfg.stack = &stack;
  cfg.record_trace = 1;
  mp_sim_trace *t = nullptr;
  ASSERT_EQ(mp_simulate(&ctx, s, &cfg, r, &t), MP_OK) << mp_errmsg(&ctx);
  mp_sim_trace_busy(t, b);
  mp_sim_trace_destroy(t);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
}

}  // namespace

TEST(Kprof, CountsEveryKernelByClassAndChangesNoResult) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_kprof kp;
  std::memset(&kp, 0, sizeof kp);
  mp_backend prof;
  ASSERT_EQ(mp_kprof_backend(&ctx, mp_backend_cpu(), &kp, 0, &prof), MP_OK) << mp_errmsg(&ctx);
  EXPECT_STREQ(prof.name, "cpu");
  EXPECT_EQ(prof.x_dtype, mp_backend_cpu()->x_dtype);
  // one profiled table at a time
  mp_backend second;
  EXPECT_EQ(mp_kprof_backend(&ctx, mp_backend_cpu(), &kp, 0, &second), MP_ERR_INVALID);

  mp_kprof before = kp;
  StepRun plain{mp_backend_cpu(), Options(), nullptr};
  ASSERT_EQ(plain.st, MP_OK) << mp_errmsg(&plain.ctx);
  EXPECT_EQ(std::memcmp(&before, &kp, sizeof kp), 0) << "the plain run went through the profile";
  mp_comm_prof cp;
  std::memset(&cp, 0, sizeof cp);
  StepRun profiled{&prof, Options(), &cp};
  ASSERT_EQ(profiled.st, MP_OK) << mp_errmsg(&profiled.ctx);
  // the same ops on the same data: the same bits
  EXPECT_EQ(std::memcmp(&plain.res.loss, &profiled.res.loss, sizeof plain.res.loss), 0);
  EXPECT_EQ(std::memcmp(&plain.res.grad_norm, &profiled.res.grad_norm, sizeof plain.res.grad_norm), 0);

  // Runtime creation goes through the table too, but only with copies and conversions
  // (class other): the kernel classes count the step alone.
  const int micro = 2;
  EXPECT_EQ(kp.calls[MP_KERNEL_GEMM], micro * 30);
  EXPECT_EQ(kp.calls[MP_KERNEL_ATTENTION], micro * 4);
  EXPECT_EQ(kp.calls[MP_KERNEL_NORM], micro * 10);
  EXPECT_EQ(kp.calls[MP_KERNEL_ACTIVATION], micro * 4);
  EXPECT_EQ(kp.calls[MP_KERNEL_EMBEDDING], micro * 2);
  EXPECT_EQ(kp.calls[MP_KERNEL_LOSS], micro * 2);
  EXPECT_EQ(kp.calls[MP_KERNEL_OPTIMIZER], 21);
  EXPECT_EQ(kp.calls[MP_KERNEL_GRAD_NORM], 21);
  EXPECT_EQ(kp.calls[MP_KERNEL_ROUTER], 0);  // a dense model
  EXPECT_EQ(kp.calls[MP_KERNEL_FP8_CAST], 0);
  for (int k = 0; k < MP_KPROF_COUNT; k++) {
    EXPECT_GE(kp.seconds[k], 0.0) << mp_kprof_class_name(k);
    if (kp.calls[k] > 0) {
      EXPECT_GT(kp.seconds[k], 0.0) << mp_kprof_class_name(k);
    }
  }
  // one rank: the only collectives are the world's scalar reductions (loss, norm)
  for (int g = 0; g < MP_GROUP_COUNT; g++)
    if (g != MP_GROUP_WORLD) {
      EXPECT_EQ(cp.calls[g], 0) << mp_group_name((mp_group)g);
    }
  mp_kprof_stop();
  EXPECT_EQ(mp_kprof_backend(&ctx, mp_backend_cpu(), &kp, 1, &second), MP_OK) << mp_errmsg(&ctx);
  mp_kprof_stop();
  EXPECT_STREQ(mp_kprof_class_name(MP_KPROF_OTHER), "other");
  EXPECT_STREQ(mp_kprof_class_name(MP_KERNEL_GEMM), mp_kernel_name(MP_KERNEL_GEMM));
}

TEST(Kprof, SimulatorBusyTimeCountsTheSameStep) {
  mp_sim_busy b;
  mp_sim_result r;
  SimBusy(Options(), &b, &r);
  if (HasFatalFailure()) return;
  const int micro = 2;
  EXPECT_EQ(b.kernel_n[MP_KERNEL_GEMM], micro * 45);
  EXPECT_EQ(b.kernel_n[MP_KERNEL_ATTENTION], micro * 4);
  EXPECT_EQ(b.kernel_n[MP_KERNEL_NORM], micro * 10);
  EXPECT_EQ(b.kernel_n[MP_KERNEL_ACTIVATION], micro * 4);
  EXPECT_EQ(b.kernel_n[MP_KERNEL_EMBEDDING], micro * 2);
  EXPECT_EQ(b.kernel_n[MP_KERNEL_LOSS], micro * 2);
  EXPECT_EQ(b.kernel_n[MP_KERNEL_ROPE], micro * 8);      // q and k, forward and backward, per layer
  EXPECT_EQ(b.kernel_n[MP_KERNEL_RESIDUAL], micro * 4);  // two adds per layer, forward only
  // the optimizer tensor by tensor, as the runtime runs it: a sum of squares and an AdamW
  // update per parameter tensor, and its gradient's zero fill (no compute copies on the
  // CPU: X is fp32)
  EXPECT_EQ(b.kernel_n[MP_KERNEL_GRAD_NORM], 21);
  EXPECT_EQ(b.kernel_n[MP_KERNEL_OPTIMIZER], 21);
  EXPECT_EQ(b.kernel_n[MP_KERNEL_COPY], 21);
  // one rank: every op runs on the compute stream, back to back, and nothing communicates
  double sum = 0;
  for (int k = 0; k < MP_KERNEL_COUNT; k++) sum += b.kernel_s[k];
  EXPECT_NEAR(sum, r.compute_s + r.optimizer_s, 1e-12 * sum);
  EXPECT_NEAR(sum, r.step_time_s, 1e-12 * sum);
  for (int g = 0; g < MP_GROUP_COUNT; g++) EXPECT_EQ(b.comm_n[g], 0) << mp_group_name((mp_group)g);
  mp_sim_trace_busy(nullptr, &b);  // no trace: all zero
  EXPECT_EQ(b.kernel_n[MP_KERNEL_GEMM], 0);
}

// Float8 on codes (the CUDA path's kernels, run on the CPU with f8_codes): the runtime's
// float8 casts and GEMMs, counted by the profile, against the schedule's ops of the same
// plan (f8_codes) and against a hand count. Per block and micro-batch (runtime_f8.c, lin_fwd
// and lin_bwd): each cast is f8_amax (unless the amax is known), f8_scale_from_amax and
// f8_quantize_t.
//   forward: xn1 and xn2 have their amax from RMSNorm's kernel and the SwiGLU output from
//     SwiGLU's: 2 calls each; the attention output 3: 9;
//   backward: the output gradients of down, o, q, k, v: 3 each; of gate and up (amax from
//     SwiGLU's backward kernel): 2 each; the inputs' transposed codes (xn1, the attention
//     output, xn2, the SwiGLU output; amax kept from the forward): 2 each: 27;
//   per step: the 7 resident weights of each block quantized once (3 calls each): 42.
// GEMMs: 7 forward and 14 backward matmul_f8 per block, the head's 2 matmul calls.
TEST(Kprof, Float8OnCodesCastsAsTheScheduleCountsThem) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_kprof kp;
  std::memset(&kp, 0, sizeof kp);
  mp_backend prof;
  ASSERT_EQ(mp_kprof_backend(&ctx, mp_backend_cpu(), &kp, 0, &prof), MP_OK) << mp_errmsg(&ctx);
  mp_plan_options o = Options();
  o.fp8 = 1;
  o.f8_codes = 1;
  {
    StepRun run{&prof, o, nullptr, 1};
    ASSERT_EQ(run.st, MP_OK) << mp_errmsg(&run.ctx);
  }
  mp_kprof_stop();
  const int micro = 2, L = 2;
  EXPECT_EQ(kp.calls[MP_KERNEL_FP8_CAST], micro * L * (9 + 27) + L * 21);
  EXPECT_EQ(kp.calls[MP_KERNEL_GEMM], micro * (L * 21 + 2));

  mp_sim_busy b;
  mp_sim_result r;
  SimBusy(o, &b, &r);
  if (HasFatalFailure()) return;
  EXPECT_EQ(b.kernel_n[MP_KERNEL_FP8_CAST], kp.calls[MP_KERNEL_FP8_CAST]);
  // the schedule counts each product of a matmul_backward as one op: the same as matmul_f8
  EXPECT_EQ(b.kernel_n[MP_KERNEL_GEMM], micro * (L * 21 + 3));
}
