// The accounting backend (see acct_backend.h): the CPU backend's table with bf16 X tensors
// and every compute op a no-op. C++ for one reason: a template no-op takes the signature of
// whichever table slot it is assigned to, so the list below is names only.
#include "tests/runtime/acct_backend.h"

#include <cstddef>

#include "kernels/cpu/cpu.h"

namespace {

template <typename... A>
mp_status Noop(mp_kctx *, A...) {
  return MP_OK;
}

// The memory hooks kept from the CPU backend, and every other op (the no-ops). Together
// they are the whole table: kOps is checked against ops.h's size in Init.
#define ACCT_KEPT(X) X(init) X(shutdown) X(alloc) X(free) X(memcpy_h2d) X(memcpy_d2h) X(memcpy_d2d) X(memset_zero)
#define ACCT_NOOPS(X)                                                                                        \
  X(synchronize) X(to_device_f32) X(from_device_f32) X(x_from_f32) X(x_to_f32) X(embedding_forward)          \
  X(embedding_backward) X(layernorm_forward) X(layernorm_backward) X(rmsnorm_forward) X(rmsnorm_backward)    \
  X(rope_forward) X(rope_backward) X(attention_forward) X(attention_backward) X(attention_span_init)        \
  X(attention_span_forward) X(attention_span_finalize) X(attention_span_dot) X(attention_span_backward)      \
  X(gelu_forward)                                                                                            \
  X(gelu_backward) X(swiglu_forward) X(swiglu_backward) X(matmul_forward) X(matmul_backward)                 \
  X(router_forward) X(router_backward) X(router_aux_loss_forward) X(router_aux_loss_backward) X(moe_plan)    \
  X(permute_forward) X(permute_backward) X(unpermute_forward) X(unpermute_backward)                          \
  X(cross_entropy_forward) X(ce_local_max) X(ce_local_sumexp) X(ce_local_target) X(ce_vp_combine)           \
  X(ce_backward) X(adamw_update) X(sum_squares) X(scale_f32) X(residual_forward) X(accumulate)               \
  X(accumulate_f32) X(copy2d) X(f8_amax) X(f8_scale_from_amax) X(f8_quantize) X(f8_dequantize) X(f8_fake_quantize)    \
  X(matmul_f8) X(f8_transpose) X(rmsnorm_forward_amax) X(swiglu_forward_amax) X(swiglu_backward_amax)       \
  X(f8_quantize_t)
#define ACCT_COUNT(op) +1

constexpr size_t kOps = 0 ACCT_KEPT(ACCT_COUNT) ACCT_NOOPS(ACCT_COUNT);
// The table's function pointers follow name and x_dtype, one pointer each.
constexpr size_t kTableOps = (sizeof(mp_backend) - offsetof(mp_backend, init)) / sizeof(void (*)(void));

mp_status Init(mp_kctx *kc, int device) {
  if (kOps != kTableOps)
    return mp_error(kc->err, MP_ERR_INTERNAL,
                    "acct backend: kernels/ops.h has %zu ops but tests/runtime/acct_backend.cc names %zu; "
                    "add the new ones to ACCT_NOOPS (or ACCT_KEPT for a memory hook)",
                    kTableOps, kOps);
  return mp_backend_cpu()->init(kc, device);
}

// moe_plan writes the expert row counts the runtime copies to the host and loops over:
// zero rows for every expert, so those loops (of no-op GEMMs) are short and defined.
mp_status MoePlan(mp_kctx *, int32_t *, int32_t *, int32_t *counts, const int32_t *, int, int E, int) {
  for (int e = 0; e < E; e++) counts[e] = 0;
  return MP_OK;
}

mp_status ZeroSkipped(mp_kctx *, void *, size_t) { return MP_OK; }
mp_status CopySkipped(mp_kctx *, void *, const void *, size_t) { return MP_OK; }

mp_backend Make(bool touch) {
  mp_backend b = *mp_backend_cpu();
  b.name = "acct";
  b.x_dtype = MP_KDTYPE_BF16;
  b.init = Init;
#define ACCT_SET(op) b.op = Noop;
  ACCT_NOOPS(ACCT_SET)
#undef ACCT_SET
  b.moe_plan = MoePlan;
  if (!touch) {
    b.memset_zero = ZeroSkipped;
    b.memcpy_h2d = b.memcpy_d2h = b.memcpy_d2d = CopySkipped;
  }
  return b;
}

}  // namespace

extern "C" const mp_backend *mp_backend_acct(void) {
  static const mp_backend b = Make(true);
  return &b;
}

extern "C" const mp_backend *mp_backend_acct_untouched(void) {
  static const mp_backend b = Make(false);
  return &b;
}
