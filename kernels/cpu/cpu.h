/* The CPU backend: fp32 reference kernels behind the op interface (kernels/ops.h).
 *
 * X tensors are fp32 here, so every void * in the interface is a float * on this backend.
 * Ops run synchronously on the calling thread plus an OpenMP team; each output element
 * is owned by one thread and reduced in a fixed order, so results do not depend on the
 * thread count. This backend is the reference the CUDA kernels are tested against. */
#ifndef MP_KERNELS_CPU_CPU_H
#define MP_KERNELS_CPU_CPU_H

#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The CPU backend table (static storage; never NULL). */
const mp_backend *mp_backend_cpu(void);

#ifdef __cplusplus
}
#endif
#endif
