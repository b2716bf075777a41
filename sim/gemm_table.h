/* GEMM efficiency by shape: a correction on the stack profile's efficiency curve from
 * measured GEMMs (`meshplan calibrate --device cuda`), for the shapes the curve misses.
 *
 * The curve (sim.h: eff = gemm_eff_max x / (x + gemm_eff_half_mnk), x = m n k) depends
 * on the product of the sizes only; a real GEMM library also depends on the shape
 * (which dimension is short, wave quantisation, the weight-gradient GEMM reducing over
 * tokens). Each point holds, for one measured shape and pass, log2 of (measured
 * efficiency / curve efficiency). An op takes the point of its variant (FWD, DGRAD,
 * WGRAD) with the smallest d, the largest |log2| distance over the three dimensions,
 * among those with d < MP_GEMM_TABLE_REACH (every dimension within a factor of 4), and
 * multiplies the curve's efficiency by ratio^(1 - d / REACH): a measured shape is
 * reproduced exactly, a shape twice as large in one dimension (a tp=2 shard of a
 * measured Linear) takes half the correction in log, and at four times the curve alone
 * speaks. The fade keeps predictions continuous as shapes change, which the planner's
 * ranking needs.
 *
 * Shapes use the schedule's GEMM convention (exec/schedule.h: [m, k] x [k, n]). A stack
 * profile holds two tables: gemm_table for bf16 GEMMs against the bf16 curve, and
 * fp8_gemm_table for float8 GEMMs (E4M3 forward, E5M2 dgrad and wgrad, as the runtime
 * runs them) against the float8 curve (fp8_gemm_eff_max, the same knee, the fp8 peak);
 * both are measured by pass and shape. Only GEMMs of batch 1 are corrected (grouped
 * expert GEMMs were not measured by shape). A table is plain data owned by whoever fills
 * it (calib/fit.c); a stack profile points at it, so it must outlive every use of
 * that profile. */
#ifndef MP_SIM_GEMM_TABLE_H
#define MP_SIM_GEMM_TABLE_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define MP_GEMM_TABLE_MAX 128
#define MP_GEMM_TABLE_REACH 2.0 /* log2 distance at which a point stops counting */

typedef struct mp_gemm_table_point {
  int variant;            /* mp_variant: MP_VAR_FWD, MP_VAR_DGRAD, MP_VAR_WGRAD */
  double lm, ln, lk;      /* log2 of m, n, k */
  double log2_ratio;      /* log2(measured efficiency / curve efficiency) */
} mp_gemm_table_point;

typedef struct mp_gemm_table {
  int n;
  mp_gemm_table_point pt[MP_GEMM_TABLE_MAX];
} mp_gemm_table;

/* The factor on the curve's efficiency for a GEMM of (variant, m, n, k); 1 when no point
 * of that variant lies within a factor of 4 in every dimension (or t is NULL). */
double mp_gemm_table_factor(const mp_gemm_table *t, int variant, double m, double n, double k);

#ifdef __cplusplus
}
#endif
#endif
