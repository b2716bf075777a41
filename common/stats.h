/* Small statistics over measured figures: the median of timings (what benchmarks,
 * calibration and training report, so every "median" in meshplan means the same thing), and
 * how predictions compare with measurements (what `meshplan validate` reports). */
#ifndef MP_COMMON_STATS_H
#define MP_COMMON_STATS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Median of v[0..n): the middle value, or the mean of the two middle values for even n.
 * Sorts v in place. n must be at least 1. */
double mp_median(double *v, size_t n);

/* Mean absolute percentage error of predictions p against measurements m over n pairs, as
 * a fraction: (1/n) sum |p_i - m_i| / |m_i|. n must be at least 1 and every m_i non-zero. */
double mp_mape(const double *p, const double *m, size_t n);

/* Kendall's tau-b of the pairs (x_i, y_i) (Kendall 1945; scipy.stats.kendalltau's default):
 * (C - D) / sqrt((C + D + Tx) (C + D + Ty)), C and D the concordant and discordant pairs,
 * Tx the pairs tied in x alone, Ty those tied in y alone (a pair tied in both counts in
 * neither). NAN when either sample is constant (a denominator of 0), or n < 2. O(n^2). */
double mp_kendall_tau_b(const double *x, const double *y, size_t n);

#ifdef __cplusplus
}
#endif
#endif
