/* PyTorch's CUDA caching allocator with expandable segments, as a model (caching_alloc.h
 * gives the rules and their source), and its replay over a schedule's memory events: the
 * bytes the allocator reserves beyond the allocated peak. Blocks of a segment are kept
 * in address order; a segment holds tens of blocks in the schedules meshplan builds (the
 * live tensors of a step), so a linear best-fit search is enough. */
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "sim/caching_alloc.h"
#include "sim/engine.h"

void mp_calloc_init(mp_calloc *a) { memset(a, 0, sizeof *a); }

void mp_calloc_release(mp_calloc *a) {
  if (a == NULL) return;
  for (int i = 0; i < MP_CALLOC_POOLS; i++) free(a->seg[i].blocks);
  memset(a, 0, sizeof *a);
}

int64_t mp_calloc_round(int64_t bytes) {
  if (bytes < MP_CALLOC_MIN_BLOCK) return MP_CALLOC_MIN_BLOCK;
  return (bytes + MP_CALLOC_MIN_BLOCK - 1) / MP_CALLOC_MIN_BLOCK * MP_CALLOC_MIN_BLOCK;
}

/* Inserts a block at position i (room made by the caller). */
static int seg_insert(mp_calloc_segment *g, int i, mp_calloc_block b) {
  if (g->n == g->cap) {
    const int cap = g->cap ? 2 * g->cap : 16;
    mp_calloc_block *nb = (mp_calloc_block *)realloc(g->blocks, (size_t)cap * sizeof *nb);
    if (nb == NULL) return 0;
    g->blocks = nb;
    g->cap = cap;
  }
  memmove(&g->blocks[i + 1], &g->blocks[i], (size_t)(g->n - i) * sizeof *g->blocks);
  g->blocks[i] = b;
  g->n++;
  return 1;
}

static void seg_remove(mp_calloc_segment *g, int i) {
  memmove(&g->blocks[i], &g->blocks[i + 1], (size_t)(g->n - i - 1) * sizeof *g->blocks);
  g->n--;
}

/* The smallest free block holding `bytes`, the lowest address among equals (the pool's
 * set ordered by (stream, size, address) and its lower_bound); -1: none. */
static int best_fit(const mp_calloc_segment *g, int64_t bytes) {
  int best = -1;
  for (int i = 0; i < g->n; i++)
    if (g->blocks[i].free && g->blocks[i].bytes >= bytes &&
        (best < 0 || g->blocks[i].bytes < g->blocks[best].bytes))
      best = i;
  return best;
}

/* Maps pages at the segment's end until a free block there holds `bytes`; its index. */
static int grow(mp_calloc *a, mp_calloc_segment *g, int64_t page, int64_t bytes) {
  const int tail_free = g->n > 0 && g->blocks[g->n - 1].free;
  const int64_t have = tail_free ? g->blocks[g->n - 1].bytes : 0;
  const int64_t add = (bytes - have + page - 1) / page * page;
  g->mapped += add;
  a->reserved += add;
  if (a->reserved > a->peak_reserved) a->peak_reserved = a->reserved;
  if (tail_free) {
    g->blocks[g->n - 1].bytes += add;
    return g->n - 1;
  }
  const mp_calloc_block b = {g->mapped - add, add, 1};
  return seg_insert(g, g->n, b) ? g->n - 1 : -1;
}

mp_status mp_calloc_alloc(mp_ctx *ctx, mp_calloc *a, int stream, int64_t bytes, mp_calloc_ptr *out) {
  const int64_t size = mp_calloc_round(bytes);
  const int small = size <= MP_CALLOC_SMALL_SIZE;
  const int s = (stream >= 0 && stream < MP_STREAM_COUNT ? stream : 0) * 2 + small;
  mp_calloc_segment *g = &a->seg[s];
  int i = best_fit(g, size);
  if (i < 0) i = grow(a, g, small ? MP_CALLOC_SMALL_PAGE : MP_CALLOC_LARGE_PAGE, size);
  if (i < 0) return mp_error(ctx, MP_ERR_NOMEM, "out of memory modelling the caching allocator");
  mp_calloc_block *b = &g->blocks[i];
  if (b->bytes - size >= MP_CALLOC_MIN_BLOCK) { /* should_split under expandable segments */
    const mp_calloc_block rest = {b->addr + size, b->bytes - size, 1};
    b->bytes = size;
    if (!seg_insert(g, i + 1, rest))
      return mp_error(ctx, MP_ERR_NOMEM, "out of memory modelling the caching allocator");
    b = &g->blocks[i];
  }
  b->free = 0;
  out->seg = s;
  out->addr = b->addr;
  return MP_OK;
}

void mp_calloc_free(mp_calloc *a, mp_calloc_ptr p) {
  mp_calloc_segment *g = &a->seg[p.seg];
  int i = 0;
  while (i < g->n && g->blocks[i].addr != p.addr) i++;
  MP_ASSERT(i < g->n && !g->blocks[i].free, "a free of an address the segment does not hold live");
  if (i >= g->n) return;
  g->blocks[i].free = 1;
  if (i + 1 < g->n && g->blocks[i + 1].free) {
    g->blocks[i].bytes += g->blocks[i + 1].bytes;
    seg_remove(g, i + 1);
  }
  if (i > 0 && g->blocks[i - 1].free) {
    g->blocks[i - 1].bytes += g->blocks[i].bytes;
    seg_remove(g, i);
  }
}

/* A live tensor of the replay: the key its FREE names and where it lives. */
typedef struct live_buf {
  int32_t buf, layer, unit;
  int64_t bytes;
  mp_calloc_ptr p;
} live_buf;

typedef struct replay {
  mp_calloc a;
  live_buf *live;
  int n_live, cap_live;
  int64_t allocated, peak_allocated;
} replay;

static mp_status replay_alloc(mp_ctx *ctx, replay *r, const mp_schedule_iter *it, int stream,
                              int64_t bytes) {
  if (r->n_live == r->cap_live) {
    const int cap = r->cap_live ? 2 * r->cap_live : 256;
    live_buf *nl = (live_buf *)realloc(r->live, (size_t)cap * sizeof *nl);
    if (nl == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory replaying the allocator");
    r->live = nl;
    r->cap_live = cap;
  }
  live_buf *l = &r->live[r->n_live];
  MP_CHECK(mp_calloc_alloc(ctx, &r->a, stream, bytes, &l->p));
  l->buf = it->op->buf;
  l->layer = it->layer;
  l->unit = it->unit;
  l->bytes = bytes;
  r->n_live++;
  r->allocated += bytes;
  if (r->allocated > r->peak_allocated) r->peak_allocated = r->allocated;
  return MP_OK;
}

/* The FREE's tensor, the most recent live one of its key (a schedule without one, an
 * ALLOC skipped for a zero delta, frees nothing). */
static void replay_free(replay *r, const mp_schedule_iter *it) {
  for (int i = r->n_live - 1; i >= 0; i--) {
    const live_buf *l = &r->live[i];
    if (l->buf != it->op->buf || l->layer != it->layer || l->unit != it->unit) continue;
    mp_calloc_free(&r->a, l->p);
    r->allocated -= l->bytes;
    r->live[i] = r->live[--r->n_live];
    return;
  }
}

mp_status mp_calloc_replay_gap(mp_ctx *ctx, const mp_schedule *s, const cop *cops, int64_t *gap) {
  replay r;
  memset(&r, 0, sizeof r);
  mp_calloc_init(&r.a);
  mp_status st = MP_OK;
  mp_schedule_iter it;
  mp_schedule_iter_begin(s, &it);
  while (st == MP_OK && mp_schedule_iter_next(&it)) {
    const cop *c = &cops[it.op - s->ops];
    if (it.op->type == MP_OP_ALLOC && c->kind == COP_ALLOC)
      st = replay_alloc(ctx, &r, &it, c->stream, c->mem_delta);
    else if (it.op->type == MP_OP_FREE && c->mem_cat >= 0)
      replay_free(&r, &it);
  }
  *gap = r.a.peak_reserved > r.peak_allocated ? r.a.peak_reserved - r.peak_allocated : 0;
  free(r.live);
  mp_calloc_release(&r.a);
  return st;
}
