/* Clocks: a monotonic one for measuring durations, and the UTC wall time as the ISO 8601
 * text that the planner database and calibrations store. */
#ifndef MP_COMMON_TIMEUTIL_H
#define MP_COMMON_TIMEUTIL_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Monotonic wall clock in seconds (CLOCK_MONOTONIC): only differences mean anything. */
double mp_now_s(void);
/* The current UTC time as "2026-11-02T10:00:00Z" into buf (cap bytes, 21 needed; a
 * shorter buf gets an empty string). */
void mp_now_iso(char *buf, size_t cap);

#ifdef __cplusplus
}
#endif
#endif
