/* The runtime's one tracked allocator: every byte the executor allocates goes through it.
 *
 * Allocations are tagged with a memory category (mp_mem_cat of exec/schedule.h), so the
 * measured timeline is comparable category by category with the schedule's memory model.
 * Accounting is exact: the bytes counted are the bytes asked for (not rounded), current
 * bytes rise on alloc and fall on free, and the peak is the maximum of the running total
 * over the whole life of the allocator (per category too: each category's own maximum).
 * The backing store is the kernel backend's device allocation (CPU: aligned host memory),
 * so the same accounting holds for the CUDA backend. Freed blocks are cached and reused
 * for requests of (nearly) the same size, so steps after the first allocate nothing from
 * the device; the backing bytes, cache included, are reported apart (reserved).
 *
 * Invariants: current_bytes[c] >= 0; sum over c of current_bytes == current_total;
 * peak_total >= current_total; after every block is freed current_total == 0. Freeing a
 * pointer not from this allocator, or twice, is MP_ERR_INTERNAL (detected; the block table
 * is searched), never silent corruption. */
#ifndef MP_EXEC_RUNTIME_ALLOC_H
#define MP_EXEC_RUNTIME_ALLOC_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "exec/schedule.h"
#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_talloc mp_talloc;

/* backend/kc give the device allocation (kc->err is used for backend messages). */
mp_status mp_talloc_create(mp_ctx *ctx, const mp_backend *be, mp_kctx *kc, mp_talloc **out);
/* Frees every block still live (a leak is reported by mp_talloc_live_blocks before). */
void mp_talloc_destroy(mp_talloc *a);

/* *ptr: zero-filled block of `bytes` (bytes == 0 gives NULL and counts nothing). */
mp_status mp_talloc_alloc(mp_ctx *ctx, mp_talloc *a, mp_mem_cat cat, size_t bytes, void **ptr);
/* The same without the zero fill: contents are undefined, for buffers the caller writes
 * completely before reading (saved activations, gathered parameters, forward outputs);
 * a device memset of them would cost bandwidth every micro-batch. */
mp_status mp_talloc_alloc_uninit(mp_ctx *ctx, mp_talloc *a, mp_mem_cat cat, size_t bytes, void **ptr);
/* NULL is a no-op. */
mp_status mp_talloc_free(mp_ctx *ctx, mp_talloc *a, void *ptr);

int64_t mp_talloc_current_bytes(const mp_talloc *a, mp_mem_cat cat);
int64_t mp_talloc_peak_bytes(const mp_talloc *a, mp_mem_cat cat);
int64_t mp_talloc_current_total(const mp_talloc *a);
int64_t mp_talloc_peak_total(const mp_talloc *a);
int mp_talloc_live_blocks(const mp_talloc *a);
/* Peak of the backing bytes (live blocks and the cache of freed ones): what the device
 * really held, >= the peak of requested bytes (as PyTorch's reserved vs allocated). */
int64_t mp_talloc_reserved_peak(const mp_talloc *a);
/* Returns the cached blocks to the backend. */
void mp_talloc_trim(mp_talloc *a);
/* "params", "optimizer", ... (same words as mp_mem_cat_name). */
const char *mp_talloc_cat_name(mp_mem_cat c);
/* Restarts peak tracking at the current usage (e.g. per training step). */
void mp_talloc_reset_peak(mp_talloc *a);

#ifdef __cplusplus
}
#endif
#endif
