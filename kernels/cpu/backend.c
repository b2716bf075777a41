/* The CPU backend table: memory hooks on host memory and the fp32 kernels of this folder
 * (one op per file), assembled with designated initializers so a missing entry is NULL,
 * never a wrong function. X tensors are fp32 here, so the X<->fp32 conversions are
 * copies; the bf16 helpers below are what a bf16 backend's conversions must match. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"
#include "kernels/cpu/internal.h"

size_t mp_kdtype_bytes(mp_kdtype t) { return t == MP_KDTYPE_BF16 ? 2 : 4; }

uint16_t mp_bf16_from_f32(float x) {
  uint32_t u;
  memcpy(&u, &x, 4);
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)((u >> 16) | 0x0040); /* quiet NaN */
  u += 0x7FFFu + ((u >> 16) & 1u); /* round half to even on the dropped 16 bits */
  return (uint16_t)(u >> 16);
}

float mp_bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float x;
  memcpy(&x, &u, 4);
  return x;
}

static mp_status cpu_init(mp_kctx *kc, int device) {
  if (device != 0)
    return mp_error(kc->err, MP_ERR_INVALID, "cpu backend: device %d does not exist; the "
                    "CPU backend has only device 0", device);
  kc->impl = NULL;
  kc->device = 0;
  return MP_OK;
}

static void cpu_shutdown(mp_kctx *kc) { kc->impl = NULL; }

static mp_status cpu_alloc(mp_kctx *kc, void **ptr, size_t bytes) {
  *ptr = NULL;
  if (bytes == 0) return MP_OK;
  size_t rounded = (bytes + 63) & ~(size_t)63; /* aligned_alloc wants a multiple */
  *ptr = aligned_alloc(64, rounded);
  if (!*ptr)
    return mp_error(kc->err, MP_ERR_NOMEM, "cpu backend: out of memory allocating %zu "
                    "bytes; reduce the micro-batch or shard further", bytes);
  return MP_OK;
}

static void cpu_free(mp_kctx *kc, void *ptr) {
  (void)kc;
  free(ptr);
}

static mp_status cpu_memcpy(mp_kctx *kc, void *dst, const void *src, size_t bytes) {
  (void)kc;
  if (bytes) memmove(dst, src, bytes);
  return MP_OK;
}

static mp_status cpu_memset_zero(mp_kctx *kc, void *ptr, size_t bytes) {
  (void)kc;
  if (bytes) memset(ptr, 0, bytes);
  return MP_OK;
}

static mp_status cpu_synchronize(mp_kctx *kc) {
  (void)kc;
  return MP_OK;
}

static mp_status cpu_to_x(mp_kctx *kc, void *dst, const float *src, size_t n) {
  return cpu_memcpy(kc, dst, src, n * sizeof(float));
}

static mp_status cpu_from_x(mp_kctx *kc, float *dst, const void *src, size_t n) {
  return cpu_memcpy(kc, dst, src, n * sizeof(float));
}

static const mp_backend cpu_backend = {
    .name = "cpu",
    .x_dtype = MP_KDTYPE_F32,
    .init = cpu_init,
    .shutdown = cpu_shutdown,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .memcpy_h2d = cpu_memcpy,
    .memcpy_d2h = cpu_memcpy,
    .memcpy_d2d = cpu_memcpy,
    .memset_zero = cpu_memset_zero,
    .synchronize = cpu_synchronize,
    .to_device_f32 = cpu_to_x,
    .from_device_f32 = cpu_from_x,
    .x_from_f32 = cpu_to_x,
    .x_to_f32 = cpu_from_x,
    .embedding_forward = mp_cpu_embedding_forward,
    .embedding_backward = mp_cpu_embedding_backward,
    .layernorm_forward = mp_cpu_layernorm_forward,
    .layernorm_backward = mp_cpu_layernorm_backward,
    .rmsnorm_forward = mp_cpu_rmsnorm_forward,
    .rmsnorm_backward = mp_cpu_rmsnorm_backward,
    .rope_forward = mp_cpu_rope_forward,
    .rope_backward = mp_cpu_rope_backward,
    .attention_forward = mp_cpu_attention_forward,
    .attention_backward = mp_cpu_attention_backward,
    .gelu_forward = mp_cpu_gelu_forward,
    .gelu_backward = mp_cpu_gelu_backward,
    .swiglu_forward = mp_cpu_swiglu_forward,
    .swiglu_backward = mp_cpu_swiglu_backward,
    .matmul_forward = mp_cpu_matmul_forward,
    .matmul_backward = mp_cpu_matmul_backward,
    .router_forward = mp_cpu_router_forward,
    .router_backward = mp_cpu_router_backward,
    .router_aux_loss_forward = mp_cpu_router_aux_loss_forward,
    .router_aux_loss_backward = mp_cpu_router_aux_loss_backward,
    .moe_plan = mp_cpu_moe_plan,
    .permute_forward = mp_cpu_permute_forward,
    .permute_backward = mp_cpu_permute_backward,
    .unpermute_forward = mp_cpu_unpermute_forward,
    .unpermute_backward = mp_cpu_unpermute_backward,
    .cross_entropy_forward = mp_cpu_cross_entropy_forward,
    .ce_local_max = mp_cpu_ce_local_max,
    .ce_local_sumexp = mp_cpu_ce_local_sumexp,
    .ce_local_target = mp_cpu_ce_local_target,
    .ce_vp_combine = mp_cpu_ce_vp_combine,
    .ce_backward = mp_cpu_ce_backward,
    .adamw_update = mp_cpu_adamw_update,
    .sum_squares = mp_cpu_sum_squares,
    .scale_f32 = mp_cpu_scale_f32,
    .residual_forward = mp_cpu_residual_forward,
    .accumulate = mp_cpu_accumulate,
    .accumulate_f32 = mp_cpu_accumulate_f32,
    .f8_amax = mp_cpu_f8_amax,
    .rmsnorm_forward_amax = mp_cpu_rmsnorm_forward_amax,
    .swiglu_forward_amax = mp_cpu_swiglu_forward_amax,
    .swiglu_backward_amax = mp_cpu_swiglu_backward_amax,
    .f8_scale_from_amax = mp_cpu_f8_scale_from_amax,
    .f8_quantize = mp_cpu_f8_quantize,
    .f8_dequantize = mp_cpu_f8_dequantize,
    .f8_fake_quantize = mp_cpu_f8_fake_quantize,
    .matmul_f8 = mp_cpu_matmul_f8,
    .f8_transpose = mp_cpu_f8_transpose,
    .f8_quantize_t = mp_cpu_f8_quantize_t,
};

const mp_backend *mp_backend_cpu(void) { return &cpu_backend; }
