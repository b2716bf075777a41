/* See stats.h. */
#include "common/stats.h"

#include <math.h>
#include <stdlib.h>

static int cmp_double(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return (x > y) - (x < y);
}

double mp_median(double *v, size_t n) {
  qsort(v, n, sizeof *v, cmp_double);
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mp_mape(const double *p, const double *m, size_t n) {
  double sum = 0;
  for (size_t i = 0; i < n; i++) sum += fabs(p[i] - m[i]) / fabs(m[i]);
  return sum / (double)n;
}

double mp_kendall_tau_b(const double *x, const double *y, size_t n) {
  double conc = 0, disc = 0, tx = 0, ty = 0;
  for (size_t i = 0; i < n; i++)
    for (size_t j = i + 1; j < n; j++) {
      const double a = x[i] - x[j], b = y[i] - y[j];
      if (a == 0 && b == 0) continue;
      if (a == 0) tx++;
      else if (b == 0) ty++;
      else if ((a > 0) == (b > 0)) conc++;
      else disc++;
    }
  const double d = sqrt((conc + disc + tx) * (conc + disc + ty));
  return d > 0 ? (conc - disc) / d : NAN;
}
