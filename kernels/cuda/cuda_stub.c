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
#else
typedef int mp_cuda_stub_unused; /* ISO C forbids an empty translation unit */
#endif
