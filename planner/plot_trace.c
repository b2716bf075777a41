/* gnuplot plots read from a simulated step's Chrome trace (see plot.h): the timeline of the
 * chosen plan and its memory over the step. */
#define _GNU_SOURCE
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/file.h"
#include "common/json.h"
#include "planner/plot.h"
#include "planner/plot_internal.h"

/* The largest trace the timeline plots read: the simulator's own output, up to
 * MP_SIM_TRACE_MAX_EVENTS (2^20) events of ~250 bytes and its memory counter; larger than
 * the limit on the configs a user hands in (MP_FILE_MAX_CONFIG_BYTES). */
#define PLOT_TRACE_MAX_BYTES ((int64_t)512 << 20)

/* A Chrome trace: the parsed file (free with cJSON_Delete) and its events array. */
static mp_status read_trace(mp_ctx *ctx, const char *path, cJSON **out, const cJSON **evs) {
  char *text = NULL;
  MP_CHECK(mp_read_file_max(ctx, path, PLOT_TRACE_MAX_BYTES, &text, NULL));
  mp_status st = mp_json_parse(ctx, text, path, out);
  free(text);
  MP_CHECK(st);
  *evs = cJSON_IsArray(*out) ? *out : cJSON_GetObjectItemCaseSensitive(*out, "traceEvents");
  if (cJSON_IsArray(*evs)) return MP_OK;
  cJSON_Delete(*out);
  *out = NULL;
  return mp_error(ctx, MP_ERR_INVALID, "%s: not a Chrome trace (no traceEvents array)", path);
}

/* ---- timeline ------------------------------------------------------------------------- */


/* The rows of a timeline: per stream (the trace's tid, named by its thread_name metadata,
 * "stream <tid>" without one) its kernels and its collectives each on a row of their own
 * (TP and EP collectives run on the compute stream, between its kernels), in increasing
 * tid, kernels first. A row's key is 2 tid + (1 for collectives). */
enum { TIMELINE_MAX_ROWS = 32 };
typedef struct timeline_rows {
  int keys[TIMELINE_MAX_ROWS];
  char names[TIMELINE_MAX_ROWS][80];
  int n;
} timeline_rows;

static int event_key(const cJSON *ev) {
  const cJSON *tid = cJSON_GetObjectItemCaseSensitive(ev, "tid");
  const cJSON *cat = cJSON_GetObjectItemCaseSensitive(ev, "cat");
  if (!cJSON_IsNumber(tid)) return -1;
  return 2 * (int)tid->valuedouble + (cJSON_IsString(cat) && strcmp(cat->valuestring, "comm") == 0);
}

static void timeline_rows_of(const cJSON *evs, timeline_rows *rw) {
  rw->n = 0;
  const cJSON *ev;
  cJSON_ArrayForEach(ev, evs) {
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(ev, "ph");
    if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X")) continue;
    const int k = event_key(ev);
    int found = 0;
    for (int r = 0; r < rw->n; r++) found |= rw->keys[r] == k;
    if (k >= 0 && !found && rw->n < TIMELINE_MAX_ROWS) rw->keys[rw->n++] = k;
  }
  for (int a = 1; a < rw->n; a++) /* insertion sort */
    for (int b = a; b > 0 && rw->keys[b - 1] > rw->keys[b]; b--) {
      int t = rw->keys[b];
      rw->keys[b] = rw->keys[b - 1];
      rw->keys[b - 1] = t;
    }
  char stream[TIMELINE_MAX_ROWS][64];
  for (int r = 0; r < rw->n; r++) snprintf(stream[r], sizeof stream[r], "stream %d", rw->keys[r] / 2);
  cJSON_ArrayForEach(ev, evs) {
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(ev, "ph");
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(ev, "name");
    if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "M") || !cJSON_IsString(nm) ||
        strcmp(nm->valuestring, "thread_name"))
      continue;
    const cJSON *tid = cJSON_GetObjectItemCaseSensitive(ev, "tid");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(ev, "args");
    const cJSON *an = args ? cJSON_GetObjectItemCaseSensitive(args, "name") : NULL;
    if (!cJSON_IsNumber(tid) || !cJSON_IsString(an)) continue;
    for (int r = 0; r < rw->n; r++)
      if (rw->keys[r] / 2 == (int)tid->valuedouble) snprintf(stream[r], sizeof stream[r], "%s", an->valuestring);
  }
  for (int r = 0; r < rw->n; r++) {
    int has_kernels = 0;
    for (int q = 0; q < rw->n; q++) has_kernels |= rw->keys[q] == (rw->keys[r] & ~1);
    /* a stream's collectives next to its kernels are named as such; a stream of
     * collectives alone (FSDP gathers, reductions) by its own name */
    snprintf(rw->names[r], sizeof rw->names[r], "%s%s", stream[r],
             (rw->keys[r] & 1) && has_kernels ? ": collectives" : (rw->keys[r] & 1) ? "" : ": kernels");
  }
}

/* A span of the step, ms. */
typedef struct span {
  double a, b;
} span;

/* A complete ("X") event's span in ms, its row key (event_key) and its micro-batch (args
 * "micro"; -1 without one, as the optimizer's events); 0 for any other event. */
static int event_span(const cJSON *ev, span *s, int *key, int *micro) {
  const cJSON *ph = cJSON_GetObjectItemCaseSensitive(ev, "ph");
  const cJSON *ts = cJSON_GetObjectItemCaseSensitive(ev, "ts");
  const cJSON *dur = cJSON_GetObjectItemCaseSensitive(ev, "dur");
  if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X") || !cJSON_IsNumber(ts) || !cJSON_IsNumber(dur)) return 0;
  s->a = ts->valuedouble / 1000.0;
  s->b = (ts->valuedouble + dur->valuedouble) / 1000.0;
  *key = event_key(ev);
  const cJSON *args = cJSON_GetObjectItemCaseSensitive(ev, "args");
  const cJSON *m = args ? cJSON_GetObjectItemCaseSensitive(args, "micro") : NULL;
  *micro = cJSON_IsNumber(m) ? (int)m->valuedouble : -1;
  return 1;
}

static int by_start(const void *x, const void *y) {
  const span *p = x, *q = y;
  return p->a < q->a ? -1 : p->a > q->a;
}

/* v[0..n) sorted and its overlapping spans merged; the merged count. */
static int merge_spans(span *v, int n) {
  qsort(v, (size_t)n, sizeof *v, by_start);
  int m = 0;
  for (int i = 0; i < n; i++) {
    if (m > 0 && v[i].a <= v[m - 1].b) {
      if (v[i].b > v[m - 1].b) v[m - 1].b = v[i].b;
    } else {
      v[m++] = v[i];
    }
  }
  return m;
}

/* out = x minus y (both merged); out holds nx + ny spans. Returns its count. */
static int subtract_spans(const span *x, int nx, const span *y, int ny, span *out) {
  int n = 0, j = 0;
  for (int i = 0; i < nx; i++) {
    double a = x[i].a;
    while (j < ny && y[j].b <= a) j++;
    for (int k = j; k < ny && y[k].a < x[i].b; k++) {
      if (y[k].a > a) out[n++] = (span){a, y[k].a};
      if (y[k].b > a) a = y[k].b;
    }
    if (a < x[i].b) out[n++] = (span){a, x[i].b};
  }
  return n;
}

/* What timeline.png shows: the windows at full scale (the first micro-batch from the step's
 * start, the last one to the step's end with the optimizer; the whole step in one window
 * when there is one micro-batch or they would overlap, as a pipeline's do), and the exposed
 * communication: the spans where a collective runs and the compute stream (the trace's
 * "compute" thread) runs no kernel, which is the time it waits on communication. */
typedef struct timeline_view {
  span win[2];
  int n_win, last_micro;
  double t_end, exposed_ms;
  span *exposed; /* malloc'd */
  int n_exposed;
} timeline_view;

/* The compute stream's thread id: the one named "compute", else 0. */
static int compute_tid(const cJSON *evs) {
  const cJSON *ev;
  cJSON_ArrayForEach(ev, evs) {
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(ev, "name");
    const cJSON *tid = cJSON_GetObjectItemCaseSensitive(ev, "tid");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(ev, "args");
    const cJSON *an = args ? cJSON_GetObjectItemCaseSensitive(args, "name") : NULL;
    if (cJSON_IsString(nm) && !strcmp(nm->valuestring, "thread_name") && cJSON_IsNumber(tid) && cJSON_IsString(an) &&
        !strcmp(an->valuestring, "compute"))
      return (int)tid->valuedouble;
  }
  return 0;
}

/* The windows of v from the micro-batches' spans (first[m], last ends), and v->t_end. */
static void timeline_windows(const cJSON *evs, timeline_view *v) {
  span m0 = {0, 0}, ml = {1e300, 0};
  v->last_micro = 0;
  v->t_end = 0;
  const cJSON *ev;
  span s;
  int key, micro;
  cJSON_ArrayForEach(ev, evs) if (event_span(ev, &s, &key, &micro) && micro > v->last_micro) v->last_micro = micro;
  cJSON_ArrayForEach(ev, evs) {
    if (!event_span(ev, &s, &key, &micro)) continue;
    if (s.b > v->t_end) v->t_end = s.b;
    if (micro == 0 && s.b > m0.b) m0.b = s.b;
    if (micro == v->last_micro && s.a < ml.a) ml.a = s.a;
  }
  ml.b = v->t_end;
  v->n_win = 1;
  v->win[0] = (span){0, v->t_end > 0 ? v->t_end : 1};
  if (v->last_micro > 0 && m0.b > 0 && ml.a > m0.b) {
    v->win[0] = m0;
    v->win[1] = ml;
    v->n_win = 2;
  }
}

/* v's exposed communication (above), from the trace's kernels and collectives. */
static mp_status timeline_exposed(mp_ctx *ctx, const cJSON *evs, timeline_view *v) {
  const int ctid = compute_tid(evs);
  int n = 0;
  const cJSON *ev;
  span s;
  int key, micro;
  cJSON_ArrayForEach(ev, evs) n += event_span(ev, &s, &key, &micro);
  span *k = malloc(sizeof *k * (size_t)(n + 1)), *c = malloc(sizeof *c * (size_t)(n + 1));
  v->exposed = malloc(sizeof *v->exposed * (size_t)(2 * n + 1));
  if (!k || !c || !v->exposed) {
    free(k);
    free(c);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory reading the trace's %d events", n);
  }
  int nk = 0, nc = 0;
  cJSON_ArrayForEach(ev, evs) {
    if (!event_span(ev, &s, &key, &micro)) continue;
    if (key & 1) c[nc++] = s;                /* a collective, on any stream */
    else if (key / 2 == ctid) k[nk++] = s;   /* a kernel of the compute stream */
  }
  nk = merge_spans(k, nk);
  nc = merge_spans(c, nc);
  v->n_exposed = subtract_spans(c, nc, k, nk, v->exposed);
  v->exposed_ms = 0;
  for (int i = 0; i < v->n_exposed; i++) v->exposed_ms += v->exposed[i].b - v->exposed[i].a;
  free(k);
  free(c);
  return MP_OK;
}

static int in_windows(const timeline_view *v, span s) {
  for (int w = 0; w < v->n_win; w++)
    if (s.b > v->win[w].a && s.a < v->win[w].b) return 1;
  return 0;
}

/* timeline.dat: "start_ms end_ms row" for each event in a window (the exposed spans on the
 * row after the streams'). */
static mp_status timeline_data(mp_ctx *ctx, const char *dir, const char *trace_path, const cJSON *evs,
                               const timeline_rows *rw, const timeline_view *v) {
  mp_status st;
  FILE *f = mp_plot_open(ctx, dir, "timeline.dat", &st);
  if (!f) return st;
  fprintf(f, "# simulated step of the chosen plan (from %s), the events in the windows drawn\n"
             "# start_ms end_ms row (row %d: exposed communication)\n", trace_path, rw->n);
  int64_t n_ev = 0;
  const cJSON *ev;
  span s;
  int key, micro;
  cJSON_ArrayForEach(ev, evs) {
    if (!event_span(ev, &s, &key, &micro) || !in_windows(v, s)) continue;
    for (int r = 0; r < rw->n; r++)
      if (rw->keys[r] == key) {
        fprintf(f, "%.6f %.6f %d\n", s.a, s.b, r);
        n_ev++;
      }
  }
  for (int i = 0; i < v->n_exposed; i++)
    if (in_windows(v, v->exposed[i])) fprintf(f, "%.6f %.6f %d\n", v->exposed[i].a, v->exposed[i].b, rw->n);
  if (n_ev == 0) fprintf(f, "NaN NaN 0\n");
  return mp_plot_close(ctx, f, dir, "timeline.dat");
}

/* One panel of timeline.gp: window w, its title, the rows with their key titles. */
static void timeline_panel(FILE *f, const timeline_rows *rw, const timeline_view *v, int w) {
  const span s = v->win[w];
  if (v->n_win == 1)
    fprintf(f, "set title 'the whole step: %d micro-batch%s and the optimizer'\n", v->last_micro + 1,
            v->last_micro ? "es" : "");
  else if (w == 0)
    fprintf(f, "set title 'micro-batch 1 of %d, from the start of the step'\n", v->last_micro + 1);
  else
    fprintf(f, "set title 'micro-batch %d of %d and the optimizer, to the end of the step'\n", v->last_micro + 1,
            v->last_micro + 1);
  fprintf(f, "set xrange [%.6f:%.6f]\n", s.a, s.b + 0.01 * (s.b - s.a) + 1e-9);
  /* the key beside the first panel; every panel keeps the same margins, so their axes align */
  if (w == 0) fprintf(f, "set key outside right top vertical Left reverse\n");
  else fprintf(f, "unset key\n");
  fprintf(f, "plot ");
  for (int r = 0; r <= rw->n; r++)
    fprintf(f, "%s'timeline.dat' using (($1+$2)/2):($3==%d ? $3 : NaN):(($2-$1)/2):(0.35) with boxxyerror "
               "lc rgb '%s' title '%s'",
            r ? ", \\\n     " : "", r, r < rw->n ? mp_plot_colors[r % MP_PLOT_N_COLORS] : "#000000",
            r < rw->n ? rw->names[r] : "exposed comm: compute waits");
  fprintf(f, "\n");
}

/* timeline.gp: a panel per window, one row per stream's kernels and per stream's
 * collectives and one for the exposed communication, each in its own colour, with a key. */
static mp_status timeline_script(mp_ctx *ctx, const char *dir, const char *title, const timeline_rows *rw,
                                 const timeline_view *v) {
  mp_status st;
  FILE *f = mp_plot_open(ctx, dir, "timeline.gp", &st);
  if (!f) return st;
  char sub[600], qt[1400];
  snprintf(sub, sizeof sub, "%s\\nstep %.1f ms; exposed communication %.1f ms%s", title, v->t_end, v->exposed_ms,
           v->n_win == 2 ? (v->last_micro > 2 ? "; the micro-batches between run as the first" : "") : "");
  mp_plot_quote(sub, qt, sizeof qt);
  /* gnuplot reads \n in a double-quoted string only: the title goes in double quotes */
  for (char *p = qt; *p; p++)
    if (*p == '\'') *p = '"';
  const int panel_h = 120 + 42 * (rw->n + 1);
  fprintf(f,
          "# Simulated timeline of the chosen plan: the first and the last micro-batch at full scale,\n"
          "# a row per stream's kernels and collectives and one for the exposed communication.\n"
          "# Redraw: gnuplot timeline.gp (reads timeline.dat)\n"
          "set terminal pngcairo noenhanced size 1800,%d font 'DejaVu Sans,12'\n"
          "set output 'timeline.png'\n"
          "set multiplot layout %d,1 title %s\n"
          "set xlabel 'time within the step (ms)'\n"
          "set yrange [-0.6:%d.6] reverse\n"
          "set grid xtics lc rgb '#dddddd'\n"
          "set lmargin 34\n"
          "set rmargin 38\n"
          "set style fill solid 1.0 noborder\n"
          "set ytics (",
          v->n_win * panel_h + 140, v->n_win, qt, rw->n);
  for (int r = 0; r < rw->n; r++) fprintf(f, "'%s' %d, ", rw->names[r], r);
  fprintf(f, "'exposed communication' %d)\n", rw->n);
  for (int w = 0; w < v->n_win; w++) timeline_panel(f, rw, v, w);
  fprintf(f, "unset multiplot\n");
  return mp_plot_close(ctx, f, dir, "timeline.gp");
}

mp_status mp_plot_timeline(mp_ctx *ctx, const char *dir, const char *trace_path,
                           const char *title) {
  MP_CHECK(mp_plot_check_gnuplot(ctx));
  cJSON *root = NULL;
  const cJSON *evs = NULL;
  MP_CHECK(read_trace(ctx, trace_path, &root, &evs));
  timeline_rows rw;
  timeline_rows_of(evs, &rw);
  timeline_view v;
  memset(&v, 0, sizeof v);
  timeline_windows(evs, &v);
  mp_status st = timeline_exposed(ctx, evs, &v);
  if (st == MP_OK) st = timeline_data(ctx, dir, trace_path, evs, &rw, &v);
  cJSON_Delete(root);
  if (st == MP_OK) st = timeline_script(ctx, dir, title, &rw, &v);
  free(v.exposed);
  MP_CHECK(st);
  return mp_plot_run_gnuplot(ctx, dir, "timeline.gp");
}

/* ---- memory over time ----------------------------------------------------------------- */

/* memory_time.dat from the trace's memory counter ("ph": "C", sim/trace.c): per sample the
 * time (ms) and the running sum of the categories in the order of the trace's args, each
 * sample written twice (before and after its step) so the areas rise and fall as steps. */
static mp_status memory_time_data(mp_ctx *ctx, const char *dir, const cJSON *evs, char names[][32], int *n_cat,
                                  double *t_end, double *ymax) {
  mp_status st;
  FILE *f = mp_plot_open(ctx, dir, "memory_time.dat", &st);
  if (!f) return st;
  *n_cat = 0;
  *t_end = 0;
  *ymax = 0;
  double prev[16] = {0}, t_prev = 0;
  int have_prev = 0;
  const cJSON *ev;
  cJSON_ArrayForEach(ev, evs) {
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(ev, "ph");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(ev, "ts");
    const cJSON *args = cJSON_GetObjectItemCaseSensitive(ev, "args");
    if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "C") || !cJSON_IsNumber(ts) || !cJSON_IsObject(args))
      continue;
    double cum[16];
    int k = 0;
    double sum = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, args) {
      if (k >= 16 || !cJSON_IsNumber(a)) break;
      if (*n_cat <= k) {
        snprintf(names[k], 32, "%s", a->string ? a->string : "?");
        *n_cat = k + 1;
      }
      sum += a->valuedouble;
      cum[k++] = sum;
    }
    const double t = ts->valuedouble / 1000.0;
    if (have_prev) {
      fprintf(f, "%.6f", t);
      for (int c = 0; c < *n_cat; c++) fprintf(f, " %.6g", prev[c]);
      fprintf(f, "\n");
    }
    fprintf(f, "%.6f", t);
    for (int c = 0; c < *n_cat; c++) fprintf(f, " %.6g", c < k ? cum[c] : sum);
    fprintf(f, "\n");
    for (int c = 0; c < *n_cat; c++) prev[c] = c < k ? cum[c] : sum;
    have_prev = 1;
    t_prev = t;
    if (t > *t_end) *t_end = t;
    if (sum > *ymax) *ymax = sum;
  }
  (void)t_prev;
  if (!have_prev) fprintf(f, "0 0\n");
  return mp_plot_close(ctx, f, dir, "memory_time.dat");
}

mp_status mp_plot_memory_time(mp_ctx *ctx, const char *dir, const char *trace_path, double capacity_gib,
                              double overhead_gib, const char *title) {
  MP_CHECK(mp_plot_check_gnuplot(ctx));
  cJSON *root = NULL;
  const cJSON *evs = NULL;
  MP_CHECK(read_trace(ctx, trace_path, &root, &evs));
  char names[16][32];
  int n_cat = 0;
  double t_end = 0, ymax = 0;
  mp_status st = memory_time_data(ctx, dir, evs, names, &n_cat, &t_end, &ymax);
  cJSON_Delete(root);
  MP_CHECK(st);
  FILE *f = mp_plot_open(ctx, dir, "memory_time.gp", &st);
  if (!f) return st;
  char qt[600];
  mp_plot_quote(title, qt, sizeof qt);
  /* the plotted allocations leave the runtime overhead out: their limit is the usable memory
   * less it, and that is where the line is drawn and the number its label gives */
  const double peak = ymax, room = capacity_gib - overhead_gib;
  if (room > ymax) ymax = room;
  fprintf(f,
          "# Memory of the chosen plan over its simulated step, categories stacked (from the\n"
          "# trace's memory counter), against the GPU's usable memory.\n"
          "# Redraw: gnuplot memory_time.gp (reads memory_time.dat)\n"
          "set terminal pngcairo noenhanced size 1600,800 font 'DejaVu Sans,12'\n"
          "set output 'memory_time.png'\n"
          "set title %s\n"
          "set xlabel 'time within the step (ms)'\n"
          "set ylabel 'allocated per GPU (GiB; runtime overhead %.2f GiB not shown)'\n"
          "set xrange [0:%.6g]\n"
          "set yrange [0:%.6g]\n"
          "set grid xtics ytics lc rgb '#dddddd'\n"
          "set key outside right top\n"
          "set rmargin 30\n"
          "set style fill solid 0.85 noborder\n",
          qt, overhead_gib, t_end > 0 ? t_end * 1.01 : 1.0, ymax * 1.1 + 1e-9);
  if (capacity_gib > 0)
    fprintf(f,
            "set arrow 1 from graph 0, first %.6g to graph 1, first %.6g nohead lw 2 dt 2 lc rgb '#444444'\n"
            "set label 1 'allocations may reach %.1f GiB: the usable %.1f GiB less the runtime overhead %.2f GiB' "
            "at graph 0.01, first %.6g offset 0,0.7 textcolor rgb '#444444'\n",
            room, room, room, capacity_gib, overhead_gib, room);
  fprintf(f, "set label 2 'peak %.1f GiB' at graph 0.99, first %.6g right offset 0,0.7 textcolor rgb '#444444'\n",
          peak, peak);
  fprintf(f, "plot ");
  for (int c = 0; c < (n_cat > 0 ? n_cat : 1); c++) {
    if (c == 0)
      fprintf(f, "'memory_time.dat' using 1:(0):2 with filledcurves lc rgb '%s' title '%s'", mp_plot_colors[0],
              n_cat ? names[0] : "none");
    else
      fprintf(f, ", \\\n     'memory_time.dat' using 1:%d:%d with filledcurves lc rgb '%s' title '%s'", c + 1,
              c + 2, mp_plot_colors[c % MP_PLOT_N_COLORS], names[c]);
  }
  fprintf(f, "\n");
  MP_CHECK(mp_plot_close(ctx, f, dir, "memory_time.gp"));
  return mp_plot_run_gnuplot(ctx, dir, "memory_time.gp");
}

