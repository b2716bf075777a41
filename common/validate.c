/* Range checks (see validate.h). */
#include "common/validate.h"

#include <math.h>
#include <stdio.h>

void mp_range_i64_str(int64_t lo, int64_t hi, char *buf, size_t cap) {
  snprintf(buf, cap, "%lld..%lld", (long long)lo, (long long)hi);
}

void mp_range_f64_str(double lo, double hi, mp_range_ends ends, char *buf, size_t cap) {
  snprintf(buf, cap, "%c%g, %g%c", ends == MP_RANGE_OPEN_LO ? '(' : '[', lo, hi,
           ends == MP_RANGE_OPEN_HI ? ')' : ']');
}

static const char *sep(const char *origin) { return origin && origin[0] ? ": " : ""; }

mp_status mp_check_i64(mp_ctx *ctx, const char *origin, const char *field, int64_t v, int64_t lo,
                       int64_t hi) {
  if (v >= lo && v <= hi) return MP_OK;
  char r[64];
  mp_range_i64_str(lo, hi, r, sizeof r);
  return mp_error(ctx, MP_ERR_INVALID, "%s%s%s = %lld is out of range; accepted %s",
                  origin ? origin : "", sep(origin), field, (long long)v, r);
}

mp_status mp_check_f64(mp_ctx *ctx, const char *origin, const char *field, double v, double lo,
                       double hi, mp_range_ends ends) {
  int ok = isfinite(v) && (ends == MP_RANGE_OPEN_LO ? v > lo : v >= lo) &&
           (ends == MP_RANGE_OPEN_HI ? v < hi : v <= hi);
  if (ok) return MP_OK;
  char r[96];
  mp_range_f64_str(lo, hi, ends, r, sizeof r);
  return mp_error(ctx, MP_ERR_INVALID, "%s%s%s = %g is %s; accepted %s", origin ? origin : "",
                  sep(origin), field, v, isfinite(v) ? "out of range" : "not a finite number", r);
}
