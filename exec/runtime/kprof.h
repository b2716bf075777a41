/* Kernel profiling for `meshplan train --profile`: a backend table that forwards every op
 * to an inner backend (kernels/ops.h) and adds each call's time to the op's class, the
 * classes the simulator costs compute ops by (exec/schedule.h's mp_kernel: GEMM,
 * attention, norm, ...; device copies, conversions between fp32 and the X dtype,
 * zero-fills and the fp32 gradient accumulation after a reduce-scatter are "copy"), plus
 * MP_KPROF_OTHER for what the schedule does not cost: transfers between host and device.
 * The memory hooks (init, shutdown, alloc, free) and synchronize are the inner backend's
 * own, untimed.
 *
 * With sync, the device is synchronized before and after every timed op, so the time is
 * that op's alone, launch included, on a GPU whose queue would otherwise hide it; the
 * CPU's ops are synchronous anyway. A profiled step is slower than an unprofiled one (no
 * kernel overlaps the host), and the results are bit-identical (the same ops run on the
 * same data in the same order).
 *
 * One profiled table at a time per process: the wrappers find the inner backend and the
 * accumulator in one global, set by mp_kprof_backend and cleared by mp_kprof_stop. */
#ifndef MP_EXEC_RUNTIME_KPROF_H
#define MP_EXEC_RUNTIME_KPROF_H

#include <stdint.h>

#include "common/status.h"
#include "exec/schedule.h"
#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

enum { MP_KPROF_OTHER = MP_KERNEL_COUNT, MP_KPROF_COUNT };

typedef struct mp_kprof {
  double seconds[MP_KPROF_COUNT]; /* by class: mp_kernel, then MP_KPROF_OTHER */
  int64_t calls[MP_KPROF_COUNT];
} mp_kprof;

/* Fills *out with the profiling table over inner (same name and x_dtype, so the runtime
 * treats it as inner), accumulating into *prof (not cleared here). MP_ERR_INVALID when
 * another profiled table is in use. */
mp_status mp_kprof_backend(mp_ctx *ctx, const mp_backend *inner, mp_kprof *prof, int sync,
                           mp_backend *out);
/* Ends the profiled table's use (its ops must not be called afterwards). */
void mp_kprof_stop(void);
/* "gemm", "attention", ..., "other": a short name of class k. */
const char *mp_kprof_class_name(int k);

#ifdef __cplusplus
}
#endif

#endif
