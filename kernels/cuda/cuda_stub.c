/* kernels/cuda/cuda.h for builds without a CUDA toolkit: no backend, no devices.
 *
 * kernels/cuda/BUILD compiles this file only when @local_cuda reports no toolkit; the
 * guard keeps it empty should it ever be compiled beside backend.cu, which defines the
 * same functions for CUDA builds. */
#include "kernels/cuda/cuda.h"

#ifndef MP_HAVE_CUDA
int mp_cuda_built(void) { return 0; }

const mp_backend *mp_cuda_backend(void) { return 0; }

int mp_cuda_device_count(void) { return 0; }

void *mp_cuda_stream(mp_kctx *kc) {
  (void)kc;
  return 0;
}

mp_status mp_cuda_timer_create(mp_kctx *kc, mp_cuda_timer **out) {
  *out = 0;
  return mp_error(kc->err, MP_ERR_UNSUPPORTED, "cuda timer: this meshplan was built without CUDA");
}

mp_status mp_cuda_timer_start(mp_kctx *kc, mp_cuda_timer *t) {
  (void)t;
  return mp_error(kc->err, MP_ERR_UNSUPPORTED, "cuda timer: built without CUDA");
}

mp_status mp_cuda_timer_stop(mp_kctx *kc, mp_cuda_timer *t, double *seconds) {
  (void)t;
  *seconds = 0;
  return mp_error(kc->err, MP_ERR_UNSUPPORTED, "cuda timer: built without CUDA");
}

void mp_cuda_timer_destroy(mp_cuda_timer *t) { (void)t; }
#else
typedef int mp_cuda_stub_unused; /* ISO C forbids an empty translation unit */
#endif
