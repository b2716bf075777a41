/* The CUDA backend of the op interface (kernels/ops.h), as seen from C.
 *
 * Every function here is callable in every build: without a CUDA toolkit at build time
 * (MP_HAVE_CUDA undefined) kernels/cuda/cuda_stub.c provides them and they report that
 * CUDA is absent (NULL backend, 0 devices) instead of failing to link, so callers and
 * tests need no #ifdef. X tensors on this backend are bf16 (be->x_dtype ==
 * MP_KDTYPE_BF16) with fp32 accumulation inside every kernel. */
#ifndef MP_KERNELS_CUDA_CUDA_H
#define MP_KERNELS_CUDA_CUDA_H

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* 1 when this binary was built with CUDA kernels, 0 otherwise. */
int mp_cuda_built(void);

/* The CUDA backend table (static storage), or NULL when not built with CUDA. A non-NULL
 * table does not mean a device exists: check mp_cuda_device_count() or let init fail. */
const mp_backend *mp_cuda_backend(void);

/* Number of usable CUDA devices; 0 without CUDA, without a driver or without a device.
 * Never fails and leaves no CUDA error pending. */
int mp_cuda_device_count(void);

/* The cudaStream_t (as void *) of a context the backend initialised, so C code can record
 * CUDA events on it (the kernel benchmark); NULL for an uninitialised context or without
 * CUDA. */
void *mp_cuda_stream(mp_kctx *kc);

/* Device time of the work queued on an initialised context's stream between start and
 * stop (CUDA events); stop waits for that work. Without CUDA, create fails. */
typedef struct mp_cuda_timer mp_cuda_timer;
mp_status mp_cuda_timer_create(mp_kctx *kc, mp_cuda_timer **out);
mp_status mp_cuda_timer_start(mp_kctx *kc, mp_cuda_timer *t);
mp_status mp_cuda_timer_stop(mp_kctx *kc, mp_cuda_timer *t, double *seconds);
void mp_cuda_timer_destroy(mp_cuda_timer *t); /* NULL is a no-op */

#ifdef __cplusplus
}
#endif
#endif
