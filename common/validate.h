/* Range checks with one message form, so that every refusal of a number a user gave names
 * the field, the value and the accepted range in the same words:
 *
 *   llama.json: d_model = 3000000000 is out of range; accepted 1..1048576
 *   cluster.json: intra_node_GBps_per_gpu = 0 is out of range; accepted (0, 100000]
 *   rows.csv line 4: value = nan is not a finite number; accepted (0, inf)
 *
 * The bounds themselves, with the reason for each, are in common/limits.h. Every failure
 * is MP_ERR_INVALID (exit 2). */
#ifndef MP_COMMON_VALIDATE_H
#define MP_COMMON_VALIDATE_H

#include <stdint.h>

#include "common/limits.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* lo <= v <= hi. origin (NULL or "": none) prefixes the message; field names the value. */
mp_status mp_check_i64(mp_ctx *ctx, const char *origin, const char *field, int64_t v, int64_t lo,
                       int64_t hi);

/* How a floating-point range's ends are meant. */
typedef enum mp_range_ends {
  MP_RANGE_CLOSED = 0, /* [lo, hi] */
  MP_RANGE_OPEN_LO,    /* (lo, hi]: e.g. a bandwidth, which must be positive */
  MP_RANGE_OPEN_HI,    /* [lo, hi) */
} mp_range_ends;

/* v is finite and within the range. */
mp_status mp_check_f64(mp_ctx *ctx, const char *origin, const char *field, double v, double lo,
                       double hi, mp_range_ends ends);

/* Formats the range as the messages above do ("1..1048576", "(0, 100000]"). */
void mp_range_i64_str(int64_t lo, int64_t hi, char *buf, size_t cap);
void mp_range_f64_str(double lo, double hi, mp_range_ends ends, char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
