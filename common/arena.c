/* Arena allocator (see arena.h).
 *
 * Two singly linked lists of chunks: `head`, the chunks in use, newest (the one being
 * filled) first; `spare`, empty chunks kept by mp_arena_reset for reuse. A request that
 * does not fit the head chunk takes the first spare chunk big enough, or a new one. Reuse
 * matters for the planner: its workers reset a scratch arena after every candidate, and
 * freeing and re-allocating the large chunks each time (plans, schedules of a few hundred
 * KiB) cost page faults and madvise calls on every candidate. */
#include "common/arena.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"

#define MP_ARENA_CHUNK_MIN (64 * 1024)
/* Spare chunks kept by reset, in bytes of capacity; more than this is freed, so one huge
 * allocation does not pin its memory for the arena's life. */
#define MP_ARENA_SPARE_MAX ((size_t)64 << 20)

typedef struct chunk {
  struct chunk *next;
  size_t cap, used;
  _Alignas(16) unsigned char data[];
} chunk;

struct mp_arena {
  chunk *head;  /* in use, newest first */
  chunk *spare; /* empty, kept for reuse */
  size_t total_used;
};

mp_arena *mp_arena_create(void) { return calloc(1, sizeof(mp_arena)); }

/* The bytes handed out from the in-use chunks, each within its capacity: what total_used
 * must equal. Walks the chunks, so only the assertions call it. */
static size_t used_in_chunks(const mp_arena *a) {
  size_t sum = 0;
  for (const chunk *c = a->head; c; c = c->next) {
    MP_ASSERT(c->used <= c->cap, "a chunk hands out at most its capacity");
    sum += c->used;
  }
  return sum;
}

static void free_list(chunk *c) {
  while (c) {
    chunk *n = c->next;
    free(c);
    c = n;
  }
}

void mp_arena_destroy(mp_arena *a) {
  if (a == NULL) return;
  free_list(a->head);
  free_list(a->spare);
  free(a);
}

/* A chunk with room for `need` bytes at the head of the in-use list, or NULL. */
static chunk *chunk_for(mp_arena *a, size_t need) {
  chunk *c = a->head;
  if (c != NULL && c->cap - c->used >= need) return c;
  for (chunk **pp = &a->spare; *pp; pp = &(*pp)->next) {
    if ((*pp)->cap >= need) {
      c = *pp;
      *pp = c->next;
      c->used = 0;
      c->next = a->head;
      a->head = c;
      return c;
    }
  }
  size_t cap = need > MP_ARENA_CHUNK_MIN ? need : MP_ARENA_CHUNK_MIN;
  c = malloc(sizeof(chunk) + cap);
  if (c == NULL) return NULL;
  c->cap = cap;
  c->used = 0;
  c->next = a->head;
  a->head = c;
  return c;
}

void *mp_arena_alloc_raw(mp_arena *a, size_t bytes) {
  /* A request so large that rounding it up or adding the chunk header would wrap around
   * is out of memory, not a tiny allocation. */
  if (bytes > SIZE_MAX - sizeof(chunk) - 16) return NULL;
  size_t need = (bytes + 15) & ~(size_t)15;
  if (need == 0) need = 16;
  chunk *c = chunk_for(a, need);
  if (c == NULL) return NULL;
  MP_ASSERT(c->cap - c->used >= need, "chunk_for returns a chunk with room for %zu bytes", need);
  void *p = c->data + c->used;
  c->used += need;
  a->total_used += need;
  MP_ASSERT(((uintptr_t)p & 15) == 0, "every chunk's used bytes are a multiple of 16 from 16-aligned data");
  return p;
}

void *mp_arena_alloc(mp_arena *a, size_t bytes) {
  void *p = mp_arena_alloc_raw(a, bytes);
  /* the rounding cannot wrap (alloc_raw refused such sizes), so every byte asked for is
   * zeroed, and no byte past the block alloc_raw handed out */
  const size_t zeroed = (bytes + 15) & ~(size_t)15;
  MP_ASSERT(p == NULL || zeroed >= bytes, "the rounding of %zu bytes does not wrap", bytes);
  if (p) memset(p, 0, zeroed);
  return p;
}

char *mp_arena_strdup(mp_arena *a, const char *s) {
  size_t n = strlen(s) + 1;
  char *p = mp_arena_alloc_raw(a, n);
  if (p) memcpy(p, s, n);
  return p;
}

char *mp_arena_printf(mp_arena *a, const char *fmt, ...) {
  va_list ap, ap2;
  va_start(ap, fmt);
  va_copy(ap2, ap);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  char *p = n >= 0 ? mp_arena_alloc(a, (size_t)n + 1) : NULL;
  if (p) vsnprintf(p, (size_t)n + 1, fmt, ap2);
  va_end(ap2);
  return p;
}

/* Every in-use chunk becomes spare; spares beyond MP_ARENA_SPARE_MAX bytes are freed
 * (the newest spares first, which keeps the arena's first, ordinary chunk). */
void mp_arena_reset(mp_arena *a) {
  MP_ASSERT(used_in_chunks(a) == a->total_used, "total_used is the sum of the in-use chunks' used bytes");
  chunk *c = a->head;
  while (c) {
    chunk *n = c->next;
    c->used = 0;
    c->next = a->spare;
    a->spare = c;
    c = n;
  }
  a->head = NULL;
  a->total_used = 0;
  size_t kept = 0;
  for (chunk **pp = &a->spare; *pp;) {
    if (kept + (*pp)->cap > MP_ARENA_SPARE_MAX) {
      chunk *d = *pp;
      *pp = d->next;
      free(d);
      continue;
    }
    kept += (*pp)->cap;
    pp = &(*pp)->next;
  }
}

size_t mp_arena_used_bytes(const mp_arena *a) {
  MP_ASSERT(used_in_chunks(a) == a->total_used, "total_used is the sum of the in-use chunks' used bytes");
  return a->total_used;
}
