/* Integer arithmetic the modules share: one definition of each small rule. */
#ifndef MP_COMMON_INTMATH_H
#define MP_COMMON_INTMATH_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Greatest common divisor of a and b by Euclid's algorithm (gcd(a, 0) = a; for a, b >= 0). */
static inline int64_t mp_gcd64(int64_t a, int64_t b) {
  while (b) {
    int64_t t = a % b;
    a = b;
    b = t;
  }
  return a;
}

#ifdef __cplusplus
}
#endif
#endif
