/* What the plot files share (plot.c, plot_trace.c): the output files, gnuplot's quoting,
 * the colours. Not part of the planner's interface. */
#ifndef MP_PLANNER_PLOT_INTERNAL_H
#define MP_PLANNER_PLOT_INTERNAL_H

#include <stdio.h>

#include "common/status.h"

/* DIR/name opened for writing; NULL with *st the error when it cannot be. */
FILE *mp_plot_open(mp_ctx *ctx, const char *dir, const char *name, mp_status *st);
/* Closes f, an error naming DIR/name when anything written to it failed. */
mp_status mp_plot_close(mp_ctx *ctx, FILE *f, const char *dir, const char *name);
/* s in single quotes for gnuplot (a quote inside doubled), truncated to cap. */
void mp_plot_quote(const char *s, char *out, size_t cap);
/* One colour per row or category, distinct for up to MP_PLOT_N_COLORS. */
#define MP_PLOT_N_COLORS 12
extern const char *const mp_plot_colors[MP_PLOT_N_COLORS];

#endif
