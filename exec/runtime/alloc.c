/* Tracked allocator (see alloc.h). Blocks are kept in an open table (pointer, bytes,
 * category); the executor holds at most a few hundred live blocks, so a linear search
 * from the most recent block (frees are mostly LIFO) costs nothing next to the kernels.
 *
 * Freed blocks go to a cache and are handed out again to a request of the same size
 * class (the executor asks for the same sizes every micro-batch), so a training step makes
 * no device allocations after the first: cudaMalloc/cudaFree cost tens of microseconds
 * to milliseconds each and cudaFree waits for the whole device. The accounting (current,
 * peak) counts requested bytes only, cache or not; the cache's bytes are reported apart
 * (mp_talloc_reserved_peak). When the backend cannot allocate, the cache is released and
 * the request tried once more. */
#include "exec/runtime/alloc.h"

#include <stdlib.h>
#include <string.h>

#include "common/assert.h"

typedef struct block {
  void *ptr;
  size_t bytes; /* requested */
  size_t size;  /* backing block (>= bytes) */
  int cat;
} block;

struct mp_talloc {
  const mp_backend *be;
  mp_kctx *kc;
  block *blocks;
  int n, cap;
  block *cache; /* freed blocks for reuse (ptr, size) */
  int nc, ccap;
  int64_t cur[MP_MEM_COUNT], peak[MP_MEM_COUNT];
  int64_t cur_total, peak_total;
  int64_t reserved, reserved_peak; /* backing bytes, live and cached */
};

/* A cached block fits a request of `bytes` when it is at least that large and at most
 * 1/8 larger (so a small request never pins a large block). */
static int fits(size_t size, size_t bytes) { return size >= bytes && size - bytes <= bytes / 8; }

/* alloc.h's invariants: every category's current bytes in [0, its peak], their sum the
 * current total, within the peak total; the backing bytes cover the live ones. */
static int accounting_ok(const mp_talloc *a) {
  int64_t sum = 0;
  for (int c = 0; c < MP_MEM_COUNT; c++) {
    if (a->cur[c] < 0 || a->cur[c] > a->peak[c]) return 0;
    sum += a->cur[c];
  }
  return sum == a->cur_total && a->cur_total <= a->peak_total && a->reserved >= a->cur_total &&
         a->reserved_peak >= a->reserved && (a->n > 0 || a->cur_total == 0);
}

static void release_cache(mp_talloc *a) {
  for (int i = 0; i < a->nc; i++) {
    a->be->free(a->kc, a->cache[i].ptr);
    a->reserved -= (int64_t)a->cache[i].size;
  }
  a->nc = 0;
}

/* Own copy of the category names: the runtime must not need the schedule library to link. */
const char *mp_talloc_cat_name(mp_mem_cat c) {
  static const char *k[MP_MEM_COUNT] = {"params", "optimizer", "grads", "gathered", "activations",
                                        "temp", "comm", "fp8", "logits"};
  return ((int)c >= 0 && c < MP_MEM_COUNT) ? k[c] : "?";
}

mp_status mp_talloc_create(mp_ctx *ctx, const mp_backend *be, mp_kctx *kc, mp_talloc **out) {
  mp_talloc *a = calloc(1, sizeof *a);
  MP_CHECK_ALLOC(ctx, a);
  a->be = be;
  a->kc = kc;
  *out = a;
  return MP_OK;
}

void mp_talloc_destroy(mp_talloc *a) {
  if (!a) return;
  MP_ASSERT(accounting_ok(a), "alloc.h's accounting holds at destroy");
  for (int i = 0; i < a->n; i++) a->be->free(a->kc, a->blocks[i].ptr);
  release_cache(a);
  free(a->blocks);
  free(a->cache);
  free(a);
}

static mp_status talloc(mp_ctx *ctx, mp_talloc *a, mp_mem_cat cat, size_t bytes, void **ptr, int zero) {
  *ptr = NULL;
  if ((int)cat < 0 || cat >= MP_MEM_COUNT)
    return mp_error(ctx, MP_ERR_INTERNAL, "tracked allocator: memory category %d out of range", (int)cat);
  if (bytes == 0) return MP_OK;
  if (a->n == a->cap) {
    int cap = a->cap ? 2 * a->cap : 256;
    block *nb = realloc(a->blocks, (size_t)cap * sizeof *nb);
    MP_CHECK_ALLOC(ctx, nb);
    a->blocks = nb;
    a->cap = cap;
  }
  void *p = NULL;
  size_t size = bytes;
  int best = -1;
  for (int i = 0; i < a->nc; i++)
    if (fits(a->cache[i].size, bytes) && (best < 0 || a->cache[i].size < a->cache[best].size)) best = i;
  if (best >= 0) {
    p = a->cache[best].ptr;
    size = a->cache[best].size;
    a->cache[best] = a->cache[--a->nc];
  } else {
    mp_status st = a->be->alloc(a->kc, &p, bytes);
    if ((st != MP_OK || p == NULL) && a->nc > 0) { /* give the cache back and try once more */
      release_cache(a);
      st = a->be->alloc(a->kc, &p, bytes);
    }
    if (st != MP_OK || p == NULL)
      return mp_error(ctx, MP_ERR_NOMEM, "tracked allocator: cannot allocate %zu bytes of %s (%lld live); "
                      "use a smaller batch, more ranks or activation checkpointing",
                      bytes, mp_talloc_cat_name(cat), (long long)a->cur_total);
    a->reserved += (int64_t)size;
    if (a->reserved > a->reserved_peak) a->reserved_peak = a->reserved;
  }
  mp_status st = zero ? a->be->memset_zero(a->kc, p, bytes) : MP_OK;
  if (st != MP_OK) {
    a->be->free(a->kc, p);
    a->reserved -= (int64_t)size;
    return mp_error(ctx, st, "tracked allocator: zero-fill failed: %s", mp_errmsg(a->kc->err));
  }
  MP_ASSERT(size >= bytes, "a block of %zu bytes backs a request of %zu", size, bytes);
  a->blocks[a->n++] = (block){p, bytes, size, (int)cat};
  a->cur[cat] += (int64_t)bytes;
  a->cur_total += (int64_t)bytes;
  if (a->cur[cat] > a->peak[cat]) a->peak[cat] = a->cur[cat];
  if (a->cur_total > a->peak_total) a->peak_total = a->cur_total;
  MP_ASSERT(accounting_ok(a), "alloc.h's accounting holds after an allocation");
  *ptr = p;
  return MP_OK;
}

mp_status mp_talloc_alloc(mp_ctx *ctx, mp_talloc *a, mp_mem_cat cat, size_t bytes, void **ptr) {
  return talloc(ctx, a, cat, bytes, ptr, 1);
}

mp_status mp_talloc_alloc_uninit(mp_ctx *ctx, mp_talloc *a, mp_mem_cat cat, size_t bytes, void **ptr) {
  return talloc(ctx, a, cat, bytes, ptr, 0);
}

mp_status mp_talloc_free(mp_ctx *ctx, mp_talloc *a, void *ptr) {
  if (!ptr) return MP_OK;
  for (int i = a->n - 1; i >= 0; i--) {
    if (a->blocks[i].ptr != ptr) continue;
    a->cur[a->blocks[i].cat] -= (int64_t)a->blocks[i].bytes;
    a->cur_total -= (int64_t)a->blocks[i].bytes;
    MP_ASSERT(a->cur[a->blocks[i].cat] >= 0 && a->cur_total >= 0,
              "a free gives back what its block's allocation counted, to the same category");
    if (a->nc == a->ccap) {
      int cap = a->ccap ? 2 * a->ccap : 64;
      block *nb = realloc(a->cache, (size_t)cap * sizeof *nb);
      if (!nb) { /* no room to cache it: give it back */
        a->be->free(a->kc, ptr);
        a->reserved -= (int64_t)a->blocks[i].size;
        a->blocks[i] = a->blocks[--a->n];
        MP_ASSERT(accounting_ok(a), "alloc.h's accounting holds after a free");
        return MP_OK;
      }
      a->cache = nb;
      a->ccap = cap;
    }
    a->cache[a->nc++] = a->blocks[i];
    a->blocks[i] = a->blocks[--a->n];
    MP_ASSERT(accounting_ok(a), "alloc.h's accounting holds after a free");
    return MP_OK;
  }
  return mp_error(ctx, MP_ERR_INTERNAL, "tracked allocator: free of %p, which is not a live block "
                  "(double free or foreign pointer)", ptr);
}

int64_t mp_talloc_current_bytes(const mp_talloc *a, mp_mem_cat cat) { return a->cur[cat]; }
int64_t mp_talloc_peak_bytes(const mp_talloc *a, mp_mem_cat cat) { return a->peak[cat]; }
int64_t mp_talloc_current_total(const mp_talloc *a) { return a->cur_total; }
int64_t mp_talloc_peak_total(const mp_talloc *a) { return a->peak_total; }
int mp_talloc_live_blocks(const mp_talloc *a) { return a->n; }
int64_t mp_talloc_reserved_peak(const mp_talloc *a) { return a->reserved_peak; }
void mp_talloc_trim(mp_talloc *a) { release_cache(a); }

void mp_talloc_reset_peak(mp_talloc *a) {
  for (int c = 0; c < MP_MEM_COUNT; c++) a->peak[c] = a->cur[c];
  a->peak_total = a->cur_total;
  MP_ASSERT(accounting_ok(a), "alloc.h's accounting holds after a peak reset");
}
