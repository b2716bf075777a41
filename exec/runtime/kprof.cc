// The profiling backend (kprof.h). C++ for one reason: a template wrapper takes the
// signature of whichever table slot it is assigned to, so each op below is one line
// naming its slot and its class.
#include "exec/runtime/kprof.h"

#include <cstddef>

#include "common/progress.h"

namespace {

struct State {
  const mp_backend *inner = nullptr;
  mp_kprof *prof = nullptr;
  bool sync = false;
};
State g_state;

// Calls the inner backend's op at Slot, timed into class Cls.
template <auto Slot, int Cls>
struct Timed {
  template <typename... A>
  static mp_status Call(mp_kctx *kc, A... a) {
    const State &s = g_state;
    if (s.sync) {
      mp_status st = s.inner->synchronize(kc);
      if (st != MP_OK) return st;
    }
    const double t0 = mp_now_s();
    mp_status st = (s.inner->*Slot)(kc, a...);
    if (st == MP_OK && s.sync) st = s.inner->synchronize(kc);
    s.prof->seconds[Cls] += mp_now_s() - t0;
    s.prof->calls[Cls]++;
    return st;
  }
};

#define KP(op, cls) b.op = &Timed<&mp_backend::op, cls>::Call, n++;
// An optional op (kernels/ops.h: NULL where the backend has none) stays NULL.
#define KPO(op, cls)                                    \
  if (b.op) b.op = &Timed<&mp_backend::op, cls>::Call; \
  n++;

// Returns how many slots it wrapped.
size_t Wrap(mp_backend &b) {
  constexpr int O = MP_KPROF_OTHER;
  size_t n = 0;
  constexpr int C = MP_KERNEL_COPY;
  KP(memcpy_h2d, O) KP(memcpy_d2h, O) KP(to_device_f32, O) KP(from_device_f32, O)
  KP(memcpy_d2d, C) KP(memset_zero, C) KP(x_from_f32, C) KP(x_to_f32, C) KP(accumulate_f32, C) KP(copy2d, C)
  KP(embedding_forward, MP_KERNEL_EMBEDDING) KP(embedding_backward, MP_KERNEL_EMBEDDING)
  KP(layernorm_forward, MP_KERNEL_NORM) KP(layernorm_backward, MP_KERNEL_NORM)
  KP(rmsnorm_forward, MP_KERNEL_NORM) KP(rmsnorm_backward, MP_KERNEL_NORM)
  KP(rope_forward, MP_KERNEL_ROPE) KP(rope_backward, MP_KERNEL_ROPE)
  KP(attention_forward, MP_KERNEL_ATTENTION) KP(attention_backward, MP_KERNEL_ATTENTION)
  KP(attention_span_init, MP_KERNEL_ATTENTION) KP(attention_span_forward, MP_KERNEL_ATTENTION)
  KP(attention_span_finalize, MP_KERNEL_ATTENTION) KP(attention_span_dot, MP_KERNEL_ATTENTION)
  KP(attention_span_backward, MP_KERNEL_ATTENTION)
  KP(gelu_forward, MP_KERNEL_ACTIVATION) KP(gelu_backward, MP_KERNEL_ACTIVATION)
  KP(swiglu_forward, MP_KERNEL_ACTIVATION) KP(swiglu_backward, MP_KERNEL_ACTIVATION)
  KP(matmul_forward, MP_KERNEL_GEMM) KP(matmul_backward, MP_KERNEL_GEMM) KP(matmul_f8, MP_KERNEL_GEMM)
  KP(router_forward, MP_KERNEL_ROUTER) KP(router_backward, MP_KERNEL_ROUTER)
  KP(router_aux_loss_forward, MP_KERNEL_ROUTER) KP(router_aux_loss_backward, MP_KERNEL_ROUTER)
  KP(moe_plan, MP_KERNEL_ROUTER)
  KP(permute_forward, MP_KERNEL_PERMUTE) KP(permute_backward, MP_KERNEL_PERMUTE)
  KP(unpermute_forward, MP_KERNEL_UNPERMUTE) KP(unpermute_backward, MP_KERNEL_UNPERMUTE)
  KP(cross_entropy_forward, MP_KERNEL_LOSS) KP(ce_local_max, MP_KERNEL_LOSS)
  KP(ce_local_sumexp, MP_KERNEL_LOSS) KP(ce_local_target, MP_KERNEL_LOSS)
  KP(ce_vp_combine, MP_KERNEL_LOSS) KP(ce_backward, MP_KERNEL_LOSS)
  KP(adamw_update, MP_KERNEL_OPTIMIZER) KP(scale_f32, MP_KERNEL_OPTIMIZER)
  KP(sum_squares, MP_KERNEL_GRAD_NORM)
  KP(residual_forward, MP_KERNEL_RESIDUAL) KP(accumulate, MP_KERNEL_RESIDUAL)
  KP(f8_amax, MP_KERNEL_FP8_CAST) KP(f8_scale_from_amax, MP_KERNEL_FP8_CAST)
  KP(f8_quantize, MP_KERNEL_FP8_CAST) KP(f8_dequantize, MP_KERNEL_FP8_CAST)
  KP(f8_fake_quantize, MP_KERNEL_FP8_CAST) KP(f8_transpose, MP_KERNEL_FP8_CAST)
  KP(f8_quantize_t, MP_KERNEL_FP8_CAST)
  // the fused amax rides in its producer's class: the schedule costs it as that kernel
  KPO(rmsnorm_forward_amax, MP_KERNEL_NORM) KPO(swiglu_forward_amax, MP_KERNEL_ACTIVATION)
  KPO(swiglu_backward_amax, MP_KERNEL_ACTIVATION)
  return n;
}
#undef KP
#undef KPO

// The slots Wrap leaves to the inner backend; with Wrap's they are the whole table
// (checked in mp_kprof_backend, so an op added to ops.h cannot go untimed unnoticed).
constexpr size_t kUntimed = 5;  // init, shutdown, alloc, free, synchronize
constexpr size_t kTableOps = (sizeof(mp_backend) - offsetof(mp_backend, init)) / sizeof(void (*)(void));

}  // namespace

extern "C" mp_status mp_kprof_backend(mp_ctx *ctx, const mp_backend *inner, mp_kprof *prof, int sync,
                                      mp_backend *out) {
  if (inner == nullptr || prof == nullptr || out == nullptr)
    return mp_error(ctx, MP_ERR_INVALID, "kernel profile: needs an inner backend, an accumulator and an output");
  if (g_state.inner != nullptr)
    return mp_error(ctx, MP_ERR_INVALID, "kernel profile: a profiled backend is already in use (one per process)");
  mp_backend b = *inner;
  const size_t timed = Wrap(b);
  if (timed + kUntimed != kTableOps)
    return mp_error(ctx, MP_ERR_INTERNAL,
                    "kernel profile: kernels/ops.h has %zu ops but exec/runtime/kprof.cc accounts for %zu; add the "
                    "new ones to Wrap with their class",
                    kTableOps, timed + kUntimed);
  g_state.inner = inner;
  g_state.prof = prof;
  g_state.sync = sync != 0;
  *out = b;
  return MP_OK;
}

extern "C" void mp_kprof_stop(void) { g_state = State(); }

extern "C" const char *mp_kprof_class_name(int k) {
  if (k == MP_KPROF_OTHER) return "other";
  if (k < 0 || k > MP_KPROF_OTHER) return "?";
  return mp_kernel_name((mp_kernel)k);
}
