/* A progress bar on stderr that draws only when stderr is a terminal and the work has
 * lasted longer than a second, so logs and pipes stay clean. */
#ifndef MP_COMMON_PROGRESS_H
#define MP_COMMON_PROGRESS_H

#include <stdint.h>

#include "common/timeutil.h" /* mp_now_s, the clock the bar reads */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_progress {
  const char *label;
  int64_t total, done;
  double t_start_s, t_last_draw_s;
  int enabled, drawn;
} mp_progress;

void mp_progress_begin(mp_progress *p, const char *label, int64_t total);
void mp_progress_update(mp_progress *p, int64_t done);
void mp_progress_end(mp_progress *p);

#ifdef __cplusplus
}
#endif
#endif
