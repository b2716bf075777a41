/* Clocks (see timeutil.h). */
#include "common/timeutil.h"

#include <time.h>

double mp_now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void mp_now_iso(char *buf, size_t cap) {
  time_t t = time(NULL);
  struct tm tm;
  gmtime_r(&t, &tm);
  if (strftime(buf, cap, "%Y-%m-%dT%H:%M:%SZ", &tm) == 0 && cap > 0) buf[0] = '\0';
}
