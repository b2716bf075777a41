/* Arena allocator (see arena.h). Chunks form a singly linked list, newest first. */
#include "common/arena.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MP_ARENA_CHUNK_MIN (64 * 1024)

typedef struct chunk {
  struct chunk *next;
  size_t cap, used;
  _Alignas(16) unsigned char data[];
} chunk;

struct mp_arena {
  chunk *head;
  size_t total_used;
};

mp_arena *mp_arena_create(void) { return calloc(1, sizeof(mp_arena)); }

void mp_arena_destroy(mp_arena *a) {
  if (a == NULL) return;
  chunk *c = a->head;
  while (c) {
    chunk *n = c->next;
    free(c);
    c = n;
  }
  free(a);
}

void *mp_arena_alloc(mp_arena *a, size_t bytes) {
  /* A request so large that rounding it up or adding the chunk header would wrap around
   * is out of memory, not a tiny allocation. */
  if (bytes > SIZE_MAX - sizeof(chunk) - 16) return NULL;
  size_t need = (bytes + 15) & ~(size_t)15;
  if (need == 0) need = 16;
  chunk *c = a->head;
  if (c == NULL || c->cap - c->used < need) {
    size_t cap = need > MP_ARENA_CHUNK_MIN ? need : MP_ARENA_CHUNK_MIN;
    chunk *n = malloc(sizeof(chunk) + cap);
    if (n == NULL) return NULL;
    n->cap = cap;
    n->used = 0;
    n->next = a->head;
    a->head = n;
    c = n;
  }
  void *p = c->data + c->used;
  c->used += need;
  a->total_used += need;
  memset(p, 0, need);
  return p;
}

char *mp_arena_strdup(mp_arena *a, const char *s) {
  size_t n = strlen(s) + 1;
  char *p = mp_arena_alloc(a, n);
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

/* Keeps the first (oldest, last in the list) chunk, as arena.h promises: it is the
 * ordinary 64 KiB one, whereas the newest may be a one-off huge allocation. */
void mp_arena_reset(mp_arena *a) {
  if (a->head == NULL) return;
  chunk *c = a->head;
  while (c->next) {
    chunk *n = c->next;
    free(c);
    c = n;
  }
  a->head = c;
  c->used = 0;
  a->total_used = 0;
}

size_t mp_arena_used_bytes(const mp_arena *a) { return a->total_used; }
