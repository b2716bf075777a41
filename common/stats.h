/* Small statistics over measured figures (timings): what benchmarks, calibration and
 * training report, so every "median" in meshplan means the same thing. */
#ifndef MP_COMMON_STATS_H
#define MP_COMMON_STATS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Median of v[0..n): the middle value, or the mean of the two middle values for even n.
 * Sorts v in place. n must be at least 1. */
double mp_median(double *v, size_t n);

#ifdef __cplusplus
}
#endif
#endif
