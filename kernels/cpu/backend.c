/* The CPU backend table: memory hooks on host memory and the fp32 kernels of this folder
 * (one op per file), assembled with designated initializers; every compute entry op is
 * mp_cpu_<op>, filled from the list in kernels/op_impl.h. X tensors are fp32 here, so the
 * X<->fp32 conversions are copies; the bf16 helpers below are what a bf16 backend's
 * conversions must match. */
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

#define MP_CPU_ENTRY(op) .op = mp_cpu_##op,
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
    MP_KERNEL_OPS(MP_CPU_ENTRY)
};

#undef MP_CPU_ENTRY

const mp_backend *mp_backend_cpu(void) { return &cpu_backend; }
