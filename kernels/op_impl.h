/* What the backends behind kernels/ops.h share: for the implementations in kernels/cpu and
 * kernels/cuda only (C and CUDA C++ alike); callers of the op table include ops.h.
 *
 * - MP_KERNEL_OPS(X) names the compute entries of mp_backend, from embedding_forward to
 *   f8_quantize_t, in the order the struct declares them. Every backend implements each
 *   one as a function mp_<backend>_<op> (mp_cpu_matmul_forward, mp_cuda_matmul_forward)
 *   and fills its table from this list, so an op added to ops.h and to the list is a
 *   link error in a backend that lacks it, not a NULL entry found at run time.
 * - MP_KERNEL_DECLARE(prefix, op) declares prefix##op with the type of the table's own
 *   entry: each signature is written once, in ops.h, and a definition that drifts from it
 *   does not compile.
 * - MP_KREQUIRE(kc, cond, op) is the argument check every op starts with: a false cond
 *   returns MP_ERR_INVALID with "<op>: invalid argument (<cond>); check shapes and
 *   pointers" on kc->err. The tests match that text; both backends give the same message
 *   for the same bad call.
 * - mp_attn_span_ok, mp_attn_span_visible and mp_attn_span_active are the span
 *   attention's argument check and causal bounds, one definition for both backends. */
#ifndef MP_KERNELS_OP_IMPL_H
#define MP_KERNELS_OP_IMPL_H

#include <limits.h>

#include "common/status.h"
#include "kernels/ops.h"

#define MP_KERNEL_OPS(X)      \
  X(embedding_forward)        \
  X(embedding_backward)       \
  X(layernorm_forward)        \
  X(layernorm_backward)       \
  X(rmsnorm_forward)          \
  X(rmsnorm_backward)         \
  X(rope_forward)             \
  X(rope_backward)            \
  X(attention_forward)        \
  X(attention_backward)       \
  X(attention_span_init)      \
  X(attention_span_forward)   \
  X(attention_span_finalize)  \
  X(attention_span_dot)       \
  X(attention_span_backward)  \
  X(gelu_forward)             \
  X(gelu_backward)            \
  X(swiglu_forward)           \
  X(swiglu_backward)          \
  X(matmul_forward)           \
  X(matmul_backward)          \
  X(router_forward)           \
  X(router_backward)          \
  X(router_aux_loss_forward)  \
  X(router_aux_loss_backward) \
  X(moe_plan)                 \
  X(permute_forward)          \
  X(permute_backward)         \
  X(unpermute_forward)        \
  X(unpermute_backward)       \
  X(cross_entropy_forward)    \
  X(ce_local_max)             \
  X(ce_local_sumexp)          \
  X(ce_local_target)          \
  X(ce_vp_combine)            \
  X(ce_backward)              \
  X(adamw_update)             \
  X(sum_squares)              \
  X(scale_f32)                \
  X(residual_forward)         \
  X(accumulate)               \
  X(accumulate_f32)           \
  X(copy2d)                   \
  X(f8_amax)                  \
  X(f8_scale_from_amax)       \
  X(f8_quantize)              \
  X(f8_dequantize)            \
  X(f8_fake_quantize)         \
  X(matmul_f8)                \
  X(rmsnorm_forward_amax)     \
  X(swiglu_forward_amax)      \
  X(swiglu_backward_amax)     \
  X(f8_transpose)             \
  X(f8_quantize_t)

/* The function type of table entry `op` (GNU typeof: gcc in C, nvcc and g++ in C++). */
#define MP_KERNEL_FN(op) __typeof__(*((const mp_backend *)0)->op)

#define MP_KERNEL_DECLARE(prefix, op) MP_KERNEL_FN(op) prefix##op

#define MP_KREQUIRE(kc, cond, op)                                                      \
  do {                                                                                 \
    if (!(cond))                                                                       \
      return mp_error((kc)->err, MP_ERR_INVALID, "%s: invalid argument (%s); check "  \
                      "shapes and pointers", (op), #cond);                            \
  } while (0)

/* Whether sp describes a valid pair (kernels/ops.h, mp_attn_span); both backends check it
 * with MP_KREQUIRE, so a bad span gets the same message from either. */
static inline int mp_attn_span_ok(const mp_attn_span *sp) {
  return sp && sp->B >= 0 && sp->nh > 0 && sp->nkv > 0 && sp->hd > 0 && sp->nh % sp->nkv == 0 &&
         sp->Tq >= 0 && sp->Tk >= 0 && sp->q_row >= 0 && sp->kv_row >= 0 &&
         sp->q_row <= sp->Sq - sp->Tq && sp->kv_row <= sp->Sk - sp->Tk && sp->q_pos >= 0 &&
         sp->kv_pos >= 0 && sp->q_pos <= INT_MAX - sp->Tq && sp->kv_pos <= INT_MAX - sp->Tk;
}

/* Keys of sp's kv chunk visible from query i of its q chunk: 0 .. min(Tk, q_pos + i -
 * kv_pos + 1) - 1 (none when that is <= 0). 64-bit, so no position difference overflows. */
static inline int mp_attn_span_visible(const mp_attn_span *sp, int i) {
  const long long n = (long long)sp->q_pos + i - sp->kv_pos + 1;
  return n <= 0 ? 0 : n >= sp->Tk ? sp->Tk : (int)n;
}

/* Whether the pair does any work: both chunks non-empty and some key not after the last
 * query (a pair wholly in the future of its queries costs nothing). */
static inline int mp_attn_span_active(const mp_attn_span *sp) {
  return sp->B > 0 && sp->Tq > 0 && sp->Tk > 0 && mp_attn_span_visible(sp, sp->Tq - 1) > 0;
}

#endif
