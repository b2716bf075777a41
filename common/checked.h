/* Checked integer arithmetic: products and sums of sizes that a user supplies (batch x seq
 * x d_model, element counts, byte counts) go through these, so an input that would wrap
 * around becomes a refusal instead of a negative size, a tiny malloc and a write past it.
 *
 * Each returns 0 when the exact result fits and stores it in *out; it returns 1 when it
 * does not fit (then *out holds the wrapped value and must not be used), the convention of
 * GCC's and Clang's __builtin_*_overflow, which they compile to one instruction and a
 * flag test:
 *
 *   int64_t elems;
 *   if (mp_mul_i64(batch, seq, &elems) || mp_mul_i64(elems, d_model, &elems))
 *     return mp_error(ctx, MP_ERR_INVALID, "...");
 */
#ifndef MP_COMMON_CHECKED_H
#define MP_COMMON_CHECKED_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline int mp_mul_i64(int64_t a, int64_t b, int64_t *out) {
  return __builtin_mul_overflow(a, b, out);
}

static inline int mp_add_i64(int64_t a, int64_t b, int64_t *out) {
  return __builtin_add_overflow(a, b, out);
}

static inline int mp_mul_size(size_t a, size_t b, size_t *out) {
  return __builtin_mul_overflow(a, b, out);
}

static inline int mp_add_size(size_t a, size_t b, size_t *out) {
  return __builtin_add_overflow(a, b, out);
}

/* The product of n factors (1 for n == 0); 1 when it does not fit. */
static inline int mp_prod_i64(const int64_t *v, int n, int64_t *out) {
  int64_t p = 1;
  for (int i = 0; i < n; i++)
    if (__builtin_mul_overflow(p, v[i], &p)) return 1;
  *out = p;
  return 0;
}

/* a * b when the product fits and is at most max, else 1. */
static inline int mp_mul_i64_max(int64_t a, int64_t b, int64_t max, int64_t *out) {
  int64_t p;
  if (__builtin_mul_overflow(a, b, &p) || p > max) return 1;
  *out = p;
  return 0;
}

#ifdef __cplusplus
}
#endif
#endif
