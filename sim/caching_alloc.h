/* A model of PyTorch's CUDA caching allocator under PYTORCH_CUDA_ALLOC_CONF=
 * expandable_segments:True (c10/cuda/CUDACachingAllocator.cpp at pytorch/pytorch
 * 001074d25084, "Note [Expandable Segments]", round_size, should_split, get_free_block):
 *   - a request is rounded up to a multiple of 512 bytes (kMinBlockSize);
 *   - rounded requests of at most 1 MiB (kSmallSize) come from the small pool, larger ones
 *     from the large pool; each stream has its own segment per pool, and a block freed
 *     on one stream serves only that stream's requests;
 *   - a request takes the smallest free block of its segment that holds it (the lowest
 *     address among equals) and splits off the rest when 512 bytes or more remain;
 *   - a freed block merges with free neighbours;
 *   - when no free block holds it, the segment grows at its end in pages (2 MiB small,
 *     20 MiB large), the free block at the end, if any, becoming part of the request.
 * Reserved memory (torch.cuda.memory_stats' reserved_bytes.all) is what the segments
 * have mapped; nothing is unmapped (only an out-of-memory retry or empty_cache would).
 * Not modelled: record_stream's deferred frees, CUDA-graph private pools, max_split_size
 * (unset by default), the per-stream event waits before a block's reuse. */
#ifndef MP_SIM_CACHING_ALLOC_H
#define MP_SIM_CACHING_ALLOC_H

#include <stdint.h>

#include "common/status.h"
#include "exec/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MP_CALLOC_MIN_BLOCK 512
#define MP_CALLOC_SMALL_SIZE (1LL << 20)
#define MP_CALLOC_SMALL_PAGE (2LL << 20)
#define MP_CALLOC_LARGE_PAGE (20LL << 20)
#define MP_CALLOC_POOLS (2 * MP_STREAM_COUNT) /* a small and a large segment per stream */

typedef struct mp_calloc_block {
  int64_t addr, bytes;
  int free;
} mp_calloc_block;

typedef struct mp_calloc_segment {
  mp_calloc_block *blocks; /* by address, covering [0, mapped) */
  int n, cap;
  int64_t mapped;
} mp_calloc_segment;

/* A live allocation: its segment and address. */
typedef struct mp_calloc_ptr {
  int seg;
  int64_t addr;
} mp_calloc_ptr;

typedef struct mp_calloc {
  mp_calloc_segment seg[MP_CALLOC_POOLS];
  int64_t reserved, peak_reserved; /* mapped over every segment */
} mp_calloc;

void mp_calloc_init(mp_calloc *a);
void mp_calloc_release(mp_calloc *a); /* frees the model's own arrays */
/* The size the allocator hands out for a request of `bytes` (>= 1). */
int64_t mp_calloc_round(int64_t bytes);
/* Allocates `bytes` on `stream`; MP_ERR_NOMEM only when the host runs out of memory. */
mp_status mp_calloc_alloc(mp_ctx *ctx, mp_calloc *a, int stream, int64_t bytes, mp_calloc_ptr *out);
/* Returns an allocation's block to its segment. */
void mp_calloc_free(mp_calloc *a, mp_calloc_ptr p);

/* The caching allocator over schedule s's memory events in issue order (one micro-batch
 * with the prologue and the optimizer, mp_schedule_iter): each ALLOC of a positive
 * compiled delta (cops[i].mem_delta, the simulator's scaled bytes, sim/engine.h) on its
 * op's stream, freed by the FREE with the same (buf, layer, unit). *gap: the replay's
 * peak reserved less its peak allocated, >= 0. */
struct cop;
mp_status mp_calloc_replay_gap(mp_ctx *ctx, const mp_schedule *s, const struct cop *cops,
                               int64_t *gap);

#ifdef __cplusplus
}
#endif

#endif
