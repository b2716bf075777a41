/* Progress bar (see progress.h). Redraws at most ten times a second. */
#include "common/progress.h"

#include <stdio.h>
#include <unistd.h>

void mp_progress_begin(mp_progress *p, const char *label, int64_t total) {
  p->label = label;
  p->total = total > 0 ? total : 1;
  p->done = 0;
  p->t_start_s = mp_now_s();
  p->t_last_draw_s = 0;
  p->enabled = isatty(fileno(stderr));
  p->drawn = 0;
}

void mp_progress_update(mp_progress *p, int64_t done) {
  p->done = done;
  if (!p->enabled) return;
  double now = mp_now_s();
  if (now - p->t_start_s < 1.0 || now - p->t_last_draw_s < 0.1) return;
  p->t_last_draw_s = now;
  const int width = 40;
  int filled = (int)(width * (double)done / (double)p->total);
  if (filled > width) filled = width;
  fprintf(stderr, "\r%s [", p->label);
  for (int i = 0; i < width; i++) fputc(i < filled ? '#' : '.', stderr);
  fprintf(stderr, "] %3.0f%% %.1fs", 100.0 * (double)done / (double)p->total, now - p->t_start_s);
  fflush(stderr);
  p->drawn = 1;
}

void mp_progress_end(mp_progress *p) {
  if (p->drawn) {
    fputs("\r\033[K", stderr);
    fflush(stderr);
  }
}
