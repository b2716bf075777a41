/* Tracked allocator (see alloc.h). Blocks are kept in an open table (pointer, bytes,
 * category); the executor holds at most a few hundred live blocks, so a linear search
 * from the most recent block (frees are mostly LIFO) costs nothing next to the kernels. */
#include "exec/runtime/alloc.h"

#include <stdlib.h>
#include <string.h>

typedef struct block {
  void *ptr;
  size_t bytes;
  int cat;
} block;

struct mp_talloc {
  const mp_backend *be;
  mp_kctx *kc;
  block *blocks;
  int n, cap;
  int64_t cur[MP_MEM_COUNT], peak[MP_MEM_COUNT];
  int64_t cur_total, peak_total;
};

/* Own copy of the category names: the runtime must not need exec/schedule.c to link. */
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
  for (int i = 0; i < a->n; i++) a->be->free(a->kc, a->blocks[i].ptr);
  free(a->blocks);
  free(a);
}

mp_status mp_talloc_alloc(mp_ctx *ctx, mp_talloc *a, mp_mem_cat cat, size_t bytes, void **ptr) {
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
  mp_status st = a->be->alloc(a->kc, &p, bytes);
  if (st != MP_OK || p == NULL)
    return mp_error(ctx, MP_ERR_NOMEM, "tracked allocator: cannot allocate %zu bytes of %s (%lld live); "
                    "use a smaller batch, more ranks or activation checkpointing",
                    bytes, mp_talloc_cat_name(cat), (long long)a->cur_total);
  st = a->be->memset_zero(a->kc, p, bytes);
  if (st != MP_OK) {
    a->be->free(a->kc, p);
    return mp_error(ctx, st, "tracked allocator: zero-fill failed: %s", mp_errmsg(a->kc->err));
  }
  a->blocks[a->n++] = (block){p, bytes, (int)cat};
  a->cur[cat] += (int64_t)bytes;
  a->cur_total += (int64_t)bytes;
  if (a->cur[cat] > a->peak[cat]) a->peak[cat] = a->cur[cat];
  if (a->cur_total > a->peak_total) a->peak_total = a->cur_total;
  *ptr = p;
  return MP_OK;
}

mp_status mp_talloc_free(mp_ctx *ctx, mp_talloc *a, void *ptr) {
  if (!ptr) return MP_OK;
  for (int i = a->n - 1; i >= 0; i--) {
    if (a->blocks[i].ptr != ptr) continue;
    a->cur[a->blocks[i].cat] -= (int64_t)a->blocks[i].bytes;
    a->cur_total -= (int64_t)a->blocks[i].bytes;
    a->be->free(a->kc, ptr);
    a->blocks[i] = a->blocks[--a->n];
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

void mp_talloc_reset_peak(mp_talloc *a) {
  for (int c = 0; c < MP_MEM_COUNT; c++) a->peak[c] = a->cur[c];
  a->peak_total = a->cur_total;
}
