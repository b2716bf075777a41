/* GEMM efficiency by shape (see gemm_table.h): the nearest measured shape's correction.
 *
 * Cost: three log2 and one pass over the points per GEMM op, only for a profile that
 * carries a table (a calibrated meshplan-cuda); the stated profiles never get here. */
#include "sim/gemm_table.h"

#include <math.h>
#include <stddef.h>

double mp_gemm_table_factor(const mp_gemm_table *t, int variant, double m, double n, double k) {
  if (t == NULL || t->n <= 0 || !(m > 0 && n > 0 && k > 0)) return 1.0;
  const double lm = log2(m), ln = log2(n), lk = log2(k);
  double best_max = INFINITY, best_sum = INFINITY, best_ratio = 0.0;
  for (int i = 0; i < t->n; i++) {
    const mp_gemm_table_point *p = &t->pt[i];
    if (p->variant != variant) continue;
    double dm = fabs(p->lm - lm), dn = fabs(p->ln - ln), dk = fabs(p->lk - lk);
    double dmax = dm > dn ? dm : dn;
    if (dk > dmax) dmax = dk;
    if (dmax >= MP_GEMM_TABLE_REACH) continue; /* too far in some dimension: not a neighbour */
    /* the point whose correction weighs most (smallest largest distance), then the
     * closest overall; ties: the first measured, a stable choice */
    double sum = dm + dn + dk;
    if (dmax < best_max || (dmax == best_max && sum < best_sum)) {
      best_max = dmax;
      best_sum = sum;
      best_ratio = p->log2_ratio;
    }
  }
  if (best_max == INFINITY) return 1.0;
  return exp2(best_ratio * (1.0 - best_max / MP_GEMM_TABLE_REACH));
}
