/* Step timing for the CLI: a CUDA-event timer on a context's stream (kernels/cuda/cuda.h).
 *
 * The timer brackets work queued on the context's stream with two events; stop waits for
 * the second, so the figure is the device time of everything queued in between,
 * excluding host time before the first kernel was queued. */
#include <stdlib.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_internal.h"

struct mp_cuda_timer {
  cudaEvent_t start, stop;
};

mp_status mp_cuda_timer_create(mp_kctx *kc, mp_cuda_timer **out) {
  *out = NULL;
  mp_cuda_timer *t = (mp_cuda_timer *)calloc(1, sizeof *t);
  if (!t) return mp_error(kc->err, MP_ERR_NOMEM, "cuda timer: out of memory");
  if (cudaEventCreate(&t->start) != cudaSuccess || cudaEventCreate(&t->stop) != cudaSuccess) {
    cudaError_t e = cudaGetLastError();
    mp_cuda_timer_destroy(t);
    return mp_error(kc->err, MP_ERR_CUDA, "cudaEventCreate failed: %s", cudaGetErrorString(e));
  }
  *out = t;
  return MP_OK;
}

void mp_cuda_timer_destroy(mp_cuda_timer *t) {
  if (!t) return;
  if (t->start) cudaEventDestroy(t->start);
  if (t->stop) cudaEventDestroy(t->stop);
  free(t);
}

mp_status mp_cuda_timer_start(mp_kctx *kc, mp_cuda_timer *t) {
  MP_CUDA_CHECK(kc, cudaEventRecord(t->start, mp_cuda_impl_of(kc)->stream));
  return MP_OK;
}

mp_status mp_cuda_timer_stop(mp_kctx *kc, mp_cuda_timer *t, double *seconds) {
  float ms = 0;
  MP_CUDA_CHECK(kc, cudaEventRecord(t->stop, mp_cuda_impl_of(kc)->stream));
  MP_CUDA_CHECK(kc, cudaEventSynchronize(t->stop));
  MP_CUDA_CHECK(kc, cudaEventElapsedTime(&ms, t->start, t->stop));
  *seconds = ms * 1e-3;
  return MP_OK;
}
