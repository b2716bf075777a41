/* MP_CUDA_CHECK: a CUDA runtime error becomes MP_ERR_CUDA with file:line, the failing call,
 * the device and cudaGetErrorString (the house's foreign-error macros, NCCLCHECK style: the
 * trail says where it broke).
 *
 * Two contexts, two spellings, one message ("file:line: call failed on cuda device N:
 * CUDA's string"):
 *   MP_CUDA_CHECK(kc, call)              in a kernel backend: the message goes to kc->err
 *                                        and names kc->device (kernels/cuda).
 *   MP_CUDA_CHECK_CTX(ctx, device, call) outside one: an mp_ctx and the device the caller
 *                                        works on (exec/comm's NCCL backend).
 * Both return the status from the enclosing function. mp_cuda_error formats the same
 * message where the error is already in hand (a call that must clean up first).
 *
 * C and C++ (gcc and nvcc); needs the CUDA runtime headers, so only code built with CUDA
 * includes it. */
#ifndef MP_KERNELS_CUDA_CUDA_CHECK_H
#define MP_KERNELS_CUDA_CUDA_CHECK_H

#include <cuda_runtime.h>

#include "common/status.h"

/* Records "file:line: call failed on cuda device <device>: <cudaGetErrorString>" on ctx
 * and returns MP_ERR_CUDA. */
static inline mp_status mp_cuda_error(mp_ctx *ctx, cudaError_t e, int device, const char *file,
                                      int line, const char *call) {
  return mp_error(ctx, MP_ERR_CUDA, "%s:%d: %s failed on cuda device %d: %s", file, line, call,
                  device, cudaGetErrorString(e));
}

/* One body for both spellings; text is the call as written at the use site (stringized
 * there, before any macro inside the call expands). */
#define MP_CUDA_CHECK_AT_(ctx, device, call, text)                               \
  do {                                                                           \
    cudaError_t mp_ce_ = (call);                                                 \
    if (mp_ce_ != cudaSuccess)                                                   \
      return mp_cuda_error((ctx), mp_ce_, (device), __FILE__, __LINE__, (text)); \
  } while (0)

#define MP_CUDA_CHECK_CTX(ctx, device, call) MP_CUDA_CHECK_AT_(ctx, device, call, #call)
#define MP_CUDA_CHECK(kc, call) MP_CUDA_CHECK_AT_((kc)->err, (kc)->device, call, #call)

#endif
