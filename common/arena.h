/* Arena allocator for planner and plan objects: many small allocations, freed in one call.
 *
 * Memory comes in chunks (at least 64 KiB, or the request if larger); allocations are
 * 16-byte aligned and zeroed (mp_arena_alloc_raw: not zeroed). Reset keeps the chunks for
 * reuse (up to 64 MiB of them), so a scratch arena reset after every unit of work stops
 * calling malloc once it has grown. Not thread-safe: one arena per thread of work. */
#ifndef MP_COMMON_ARENA_H
#define MP_COMMON_ARENA_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_arena mp_arena;

mp_arena *mp_arena_create(void);
void mp_arena_destroy(mp_arena *a); /* NULL is a no-op */
/* Zeroed, 16-byte aligned; NULL when out of memory. */
void *mp_arena_alloc(mp_arena *a, size_t bytes);
/* As mp_arena_alloc but the memory is NOT zeroed: for tables the caller writes in
 * full right away (copies, arrays filled element by element). */
void *mp_arena_alloc_raw(mp_arena *a, size_t bytes);
char *mp_arena_strdup(mp_arena *a, const char *s);
char *mp_arena_printf(mp_arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Frees everything allocated since creation; the chunks are kept for reuse (the newest
 * beyond 64 MiB of them are returned to the system). */
void mp_arena_reset(mp_arena *a);
size_t mp_arena_used_bytes(const mp_arena *a);

#ifdef __cplusplus
}
#endif
#endif
