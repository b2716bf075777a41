/* gnuplot plots of a planner run (see plot.h).
 *
 * Scripts use `noenhanced` text so mesh names such as dp_shard print as written (enhanced
 * mode would turn "_s" into a subscript), and quote titles in single quotes (a quote
 * inside is doubled, gnuplot's escape). Data files are written before the script runs;
 * a missing gnuplot is detected before anything is written. */
#define _GNU_SOURCE
#include "planner/plot.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/file.h"
#include "common/json.h"

static const double kGiB = 1024.0 * 1024.0 * 1024.0;

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

static int find_on_path(const char *prog) {
  const char *path = getenv("PATH");
  if (!path) return 0;
  char buf[4096];
  const char *p = path;
  while (*p) {
    const char *colon = strchr(p, ':');
    size_t len = colon ? (size_t)(colon - p) : strlen(p);
    if (len > 0 && len < sizeof buf - 64) {
      snprintf(buf, sizeof buf, "%.*s/%s", (int)len, p, prog);
      if (access(buf, X_OK) == 0) return 1;
    }
    if (!colon) break;
    p = colon + 1;
  }
  return 0;
}

mp_status mp_plot_check_gnuplot(mp_ctx *ctx) {
  if (find_on_path("gnuplot")) return MP_OK;
  return mp_error(ctx, MP_ERR_UNSUPPORTED,
                  "--plot needs gnuplot, which is not on PATH; install it (apt-get install "
                  "gnuplot-nox) or leave out --plot");
}

mp_status mp_plot_make_dir(mp_ctx *ctx, const char *dir) {
  struct stat sb;
  if (stat(dir, &sb) == 0) {
    if (S_ISDIR(sb.st_mode)) return MP_OK;
    return mp_error(ctx, MP_ERR_IO, "--plot %s exists and is not a directory", dir);
  }
  if (mkdir(dir, 0777) != 0)
    return mp_error(ctx, MP_ERR_IO, "cannot create plot directory %s: %s", dir, strerror(errno));
  return MP_OK;
}

mp_status mp_plot_run_gnuplot(mp_ctx *ctx, const char *dir, const char *script) {
  MP_CHECK(mp_plot_check_gnuplot(ctx));
  char log_name[512];
  snprintf(log_name, sizeof log_name, "%s.log", script);
  fflush(NULL);
  pid_t pid = fork();
  if (pid < 0) return mp_error(ctx, MP_ERR_IO, "cannot start gnuplot: %s", strerror(errno));
  if (pid == 0) {
    /* Child: only async-signal-safe calls until exec. */
    if (chdir(dir) != 0) _exit(126);
    int fd = open(log_name, O_WRONLY | O_CREAT | O_TRUNC, 0666);
    if (fd >= 0) {
      dup2(fd, 1);
      dup2(fd, 2);
      close(fd);
    }
    execlp("gnuplot", "gnuplot", script, (char *)NULL);
    _exit(127);
  }
  int status = 0;
  while (waitpid(pid, &status, 0) < 0)
    if (errno != EINTR) return mp_error(ctx, MP_ERR_IO, "waiting for gnuplot: %s", strerror(errno));
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) return MP_OK;
  char path[1024], line[512] = "";
  snprintf(path, sizeof path, "%s/%s", dir, log_name);
  FILE *f = fopen(path, "r");
  if (f) {
    /* gnuplot's useful line is usually the last non-empty one. */
    char buf[512];
    while (fgets(buf, sizeof buf, f))
      if (buf[0] != '\n' && buf[0] != ' ') snprintf(line, sizeof line, "%s", buf);
    fclose(f);
  }
  size_t n = strlen(line);
  while (n && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = 0;
  return mp_error(ctx, MP_ERR_IO, "gnuplot failed on %s/%s (exit %d)%s%s; see %s", dir, script,
                  WIFEXITED(status) ? WEXITSTATUS(status) : -1, line[0] ? ": " : "", line, path);
}

static FILE *open_in(mp_ctx *ctx, const char *dir, const char *name, mp_status *st) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  *st = f ? MP_OK : mp_error(ctx, MP_ERR_IO, "cannot write %s: %s", path, strerror(errno));
  return f;
}

static mp_status close_checked(mp_ctx *ctx, FILE *f, const char *dir, const char *name) {
  int bad = ferror(f);
  if (fclose(f) != 0) bad = 1;
  if (bad) return mp_error(ctx, MP_ERR_IO, "error writing %s/%s", dir, name);
  return MP_OK;
}

/* Title in single quotes for gnuplot (a quote is doubled). */
static void gp_quote(const char *s, char *out, size_t cap) {
  size_t j = 0;
  if (cap < 3) return;
  out[j++] = '\'';
  for (; *s && j + 3 < cap; s++) {
    if (*s == '\'') out[j++] = '\'';
    out[j++] = *s;
  }
  out[j++] = '\'';
  out[j] = 0;
}

/* "dp_shard=2 tp=4 fp8 reshard mb=4": dims of size 1, AC none and options off left out, so labels stay short. */
static void short_plan(const mp_candidate *c, char *buf, size_t cap) {
  static const char *const dims[MP_MESH_NDIMS] = {"pp", "dp_rep", "dp_shard", "cp", "tp"};
  const int order[MP_MESH_NDIMS] = {MP_DIM_DP_REPLICATE, MP_DIM_DP_SHARD, MP_DIM_TP, MP_DIM_PP,
                                    MP_DIM_CP};
  size_t j = 0;
  buf[0] = 0;
  for (int k = 0; k < MP_MESH_NDIMS && j < cap; k++) {
    int d = order[k];
    if (c->mesh.size[d] > 1)
      j += (size_t)snprintf(buf + j, cap - j, "%s%s=%d", j ? " " : "", dims[d], c->mesh.size[d]);
    if (d == MP_DIM_TP && c->mesh.ep > 1 && j < cap)
      j += (size_t)snprintf(buf + j, cap - j, "%sep=%d", j ? " " : "", c->mesh.ep);
  }
  if (j == 0 && j < cap) j += (size_t)snprintf(buf, cap, "single");
  if (c->ac && j < cap) j += (size_t)snprintf(buf + j, cap - j, " ac=%s", mp_search_ac_name(c->ac));
  if (c->fp8 && j < cap) j += (size_t)snprintf(buf + j, cap - j, " fp8");
  if (c->reshard && j < cap) j += (size_t)snprintf(buf + j, cap - j, " reshard");
  if (j < cap) snprintf(buf + j, cap - j, " mb=%lld", (long long)c->micro_batch);
}

/* What candidates.dat holds: the points in each block and their time and memory ranges. */
typedef struct scatter {
  int64_t n_feas, n_oom;         /* points in block 0 (fits) and block 1 (over memory) */
  int64_t n_oom_all;             /* simulated candidates over memory, drawn or not */
  double tmin, tmax, mmin, mmax; /* step time (s) and peak memory per GPU (GiB) */
} scatter;

/* The most over-memory candidates candidates.png draws: an even sample of them (every
 * k-th in enumeration order) shows where they lie; a search of thousands of GPUs simulates
 * thousands, and every one made the plot slow to draw and to read. The plans that fit are
 * all drawn: they are what the plot is for. */
#define PLOT_OVER_MEMORY_MAX 1000

/* Whether the candidate is simulated with a figure to draw, and fits (feasible) or not. */
static int drawable(const mp_candidate *c, int feasible) {
  if (!c->evaluated || c->reject == MP_REJECT_EVAL_ERROR) return 0;
  if ((c->reject == MP_REJECT_NONE) != feasible) return 0;
  return c->res.step_time_s > 0 && c->res.peak_mem_bytes > 0; /* possibly log axes */
}

/* One data block of candidates.dat: the simulated candidates that fit (feasible) or are over
 * memory (!feasible; at most PLOT_OVER_MEMORY_MAX of them, evenly spread), "NaN NaN -1"
 * where there is none (the block must stay); returns how many points it wrote, *n_all how
 * many there were, and widens sc's ranges to the points. */
static int64_t write_block(FILE *f, const mp_search *s, int feasible, scatter *sc, int64_t *n_all) {
  int64_t all = 0, n = 0;
  for (int64_t i = 0; i < s->n; i++) all += drawable(&s->cands[i], feasible);
  const int64_t cap = feasible ? all : PLOT_OVER_MEMORY_MAX;
  for (int64_t i = 0, k = 0; i < s->n; i++) {
    const mp_candidate *c = &s->cands[i];
    if (!drawable(c, feasible)) continue;
    /* the k-th of `all` is drawn where a new one of `cap` equal slices starts */
    const int take = all <= cap || k == 0 || (k * cap) / all != ((k - 1) * cap) / all;
    k++;
    if (!take) continue;
    double m = (double)c->res.peak_mem_bytes / kGiB, t = c->res.step_time_s;
    fprintf(f, "%.6g %.6g %lld\n", m, t, (long long)i);
    n++;
    if (t < sc->tmin) sc->tmin = t;
    if (t > sc->tmax) sc->tmax = t;
    if (m < sc->mmin) sc->mmin = m;
    if (m > sc->mmax) sc->mmax = m;
  }
  if (n == 0) fprintf(f, "NaN NaN -1\n"); /* keep the block */
  *n_all = all;
  return n;
}

/* candidates.dat in three data blocks (gnuplot `index`): 0 feasible, 1 over memory, 2 the
 * chosen plan (order[0], whose short label goes into chosen). */
static mp_status write_candidates_dat(mp_ctx *ctx, const char *dir, const mp_search *s,
                                      const int64_t *order, int64_t n_order, scatter *sc,
                                      char *chosen, size_t cap) {
  mp_status st;
  FILE *f = open_in(ctx, dir, "candidates.dat", &st);
  if (!f) return st;
  fprintf(f, "# the simulated candidates: peak memory per GPU (GiB), predicted step time (s), "
             "candidate index\n# block 0: feasible, every one\n");
  *sc = (scatter){.n_feas = 0, .n_oom = 0, .n_oom_all = 0, .tmin = 1e300, .tmax = 0, .mmin = 1e300, .mmax = 0};
  int64_t n_feas_all = 0; /* all drawn */
  sc->n_feas = write_block(f, s, 1, sc, &n_feas_all);
  fprintf(f, "\n\n# block 1: over memory capacity, an even sample of at most %d\n", PLOT_OVER_MEMORY_MAX);
  sc->n_oom = write_block(f, s, 0, sc, &sc->n_oom_all);
  fprintf(f, "\n\n# block 2: chosen plan\n");
  if (n_order > 0) {
    const mp_candidate *c = &s->cands[order[0]];
    short_plan(c, chosen, cap);
    fprintf(f, "%.6g %.6g %lld\n", (double)c->res.peak_mem_bytes / kGiB, c->res.step_time_s,
            (long long)order[0]);
  } else {
    fprintf(f, "NaN NaN -1\n");
  }
  return close_checked(ctx, f, dir, "candidates.dat");
}

/* candidates.gp: the scatter of candidates.dat over sc's ranges, the capacity line where
 * capacity_gib > 0, the chosen plan labelled. */
static mp_status write_candidates_gp(mp_ctx *ctx, const char *dir, const scatter *sc,
                                     double capacity_gib, const char *title, const char *chosen) {
  mp_status st;
  FILE *f = open_in(ctx, dir, "candidates.gp", &st);
  if (!f) return st;
  char qt[600], qc[400];
  gp_quote(title, qt, sizeof qt);
  char chosen_label[256];
  snprintf(chosen_label, sizeof chosen_label, "chosen: %s", chosen);
  gp_quote(chosen_label, qc, sizeof qc);
  /* Log axes only where the points span more than a decade (a narrower range on a log
   * axis shows one labelled tick); then every 1-2-5 step is labelled. */
  const int logx = sc->mmax / sc->mmin > 10.0, logy = sc->tmax / sc->tmin > 10.0;
  char oom_note[64] = "";
  if (sc->n_oom < sc->n_oom_all) snprintf(oom_note, sizeof oom_note, ", %lld drawn", (long long)sc->n_oom);
  fprintf(f,
          "# Predicted step time vs peak memory per GPU of the simulated candidates.\n"
          "# Redraw: gnuplot candidates.gp (reads candidates.dat)\n"
          "set terminal pngcairo noenhanced size 1400,800 font 'DejaVu Sans,12'\n"
          "set output 'candidates.png'\n"
          "set title %s\n"
          "set xlabel 'peak memory per GPU (GiB%s)'\n"
          "set ylabel 'predicted step time (s%s)'\n"
          "%s%s"
          "set format x '%%g'\nset format y '%%g'\n"
          "set grid xtics ytics mxtics mytics lc rgb '#dddddd', lc rgb '#f0f0f0'\n"
          "set key outside bottom center horizontal box\n"
          "set bmargin 8\n"
          "set xrange [%.6g:%.6g]\n"
          "set yrange [%.6g:%.6g]\n",
          qt, logx ? ", log scale" : "", logy ? ", log scale" : "",
          logx ? "set logscale x\nset xtics (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)\n"
               : "set mxtics 5\n",
          logy ? "set logscale y\nset ytics (0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 2, 5, 10, "
                 "20, 50, 100, 200, 500, 1000, 2000, 5000)\n"
               : "set mytics 5\n",
          logx ? sc->mmin / 1.3 : 0.0, sc->mmax * (logx ? 1.3 : 1.08),
          logy ? sc->tmin / 1.3 : sc->tmin - 0.08 * (sc->tmax - sc->tmin + 1e-9),
          sc->tmax * (logy ? 1.3 : 1.0) + (logy ? 0.0 : 0.08 * (sc->tmax - sc->tmin + 1e-9)));
  if (capacity_gib > 0)
    fprintf(f,
            "set arrow 1 from %.6g, graph 0 to %.6g, graph 1 nohead lw 2 dt 2 lc rgb '#444444'\n"
            "set label 1 'capacity %.1f GiB' at %.6g, graph 0.97 right offset -0.5,0 textcolor rgb '#444444'\n",
            capacity_gib, capacity_gib, capacity_gib, capacity_gib);
  fprintf(f,
          "plot 'candidates.dat' index 0 using 1:2 with points pt 7 ps 0.6 lc rgb '#1f77b4' "
          "title 'fits (%lld)', \\\n"
          "     'candidates.dat' index 1 using 1:2 with points pt 2 ps 0.6 lc rgb '#d62728' "
          "title 'over memory (%lld%s)', \\\n"
          "     'candidates.dat' index 2 using 1:2 with points pt 3 ps 4 lw 3 lc rgb '#2ca02c' "
          "title %s\n",
          (long long)sc->n_feas, (long long)sc->n_oom_all, oom_note, qc);
  return close_checked(ctx, f, dir, "candidates.gp");
}

mp_status mp_plot_candidates(mp_ctx *ctx, const char *dir, const mp_search *s,
                             const int64_t *order, int64_t n_order, double capacity_gib,
                             const char *title) {
  MP_CHECK(mp_plot_check_gnuplot(ctx));
  scatter sc;
  char chosen[160] = "";
  MP_CHECK(write_candidates_dat(ctx, dir, s, order, n_order, &sc, chosen, sizeof chosen));
  if (sc.n_feas + sc.n_oom == 0) {
    sc.tmin = sc.mmin = 0.1;
    sc.tmax = sc.mmax = 10;
  }
  if (capacity_gib > sc.mmax) sc.mmax = capacity_gib;
  if (capacity_gib > 0 && capacity_gib < sc.mmin) sc.mmin = capacity_gib;
  MP_CHECK(write_candidates_gp(ctx, dir, &sc, capacity_gib, title, chosen));
  return mp_plot_run_gnuplot(ctx, dir, "candidates.gp");
}

mp_status mp_plot_memory(mp_ctx *ctx, const char *dir, const mp_search *s, const int64_t *order,
                         int64_t n_order, int k, double capacity_gib, const char *title) {
  MP_CHECK(mp_plot_check_gnuplot(ctx));
  static const char *const cats[MP_MEM_COUNT] = {"parameters", "optimizer", "gradients",
                                                 "gathered params", "activations", "temporary",
                                                 "comm buffers", "float8", "logits"};
  mp_status st;
  FILE *f = open_in(ctx, dir, "memory.dat", &st);
  if (!f) return st;
  int64_t n = n_order < k ? n_order : k;
  fprintf(f, "# memory per GPU at the peak of the top plans, GiB per category\n");
  fprintf(f, "rank plan");
  for (int c = 0; c < MP_MEM_COUNT; c++) fprintf(f, " \"%s\"", cats[c]);
  fprintf(f, " \"runtime overhead\"\n");
  double ymax = capacity_gib;
  size_t label_max = 16;
  for (int64_t r = 0; r < n; r++) {
    const mp_candidate *c = &s->cands[order[r]];
    char sp[160];
    short_plan(c, sp, sizeof sp);
    if (strlen(sp) + 5 > label_max) label_max = strlen(sp) + 5;
    fprintf(f, "%lld \"#%lld %s\"", (long long)(r + 1), (long long)(r + 1), sp);
    double total = 0;
    for (int m = 0; m < MP_MEM_COUNT; m++) {
      double g = (double)c->res.mem_at_peak[m] / kGiB;
      total += g;
      fprintf(f, " %.6g", g);
    }
    double ov = (double)c->res.overhead_bytes / kGiB;
    total += ov;
    fprintf(f, " %.6g\n", ov);
    if (total > ymax) ymax = total;
  }
  if (n == 0) {
    fprintf(f, "0 \"no feasible plan\"");
    for (int m = 0; m <= MP_MEM_COUNT; m++) fprintf(f, " 0");
    fprintf(f, "\n");
  }
  MP_CHECK(close_checked(ctx, f, dir, "memory.dat"));
  f = open_in(ctx, dir, "memory.gp", &st);
  if (!f) return st;
  char qt[600];
  gp_quote(title, qt, sizeof qt);
  fprintf(f,
          "# Memory breakdown at the peak of the top plans (stacked bars).\n"
          "# Redraw: gnuplot memory.gp (reads memory.dat)\n"
          "set terminal pngcairo noenhanced size 1400,900 font 'DejaVu Sans,12'\n"
          "set output 'memory.png'\n"
          "set title %s\n"
          "set ylabel 'memory per GPU at the peak (GiB)'\n"
          "set xlabel 'plan (rank, mesh, AC, micro-batch)'\n"
          "set style data histograms\n"
          "set style histogram rowstacked\n"
          "set style fill solid 0.85 border rgb '#333333'\n"
          "set boxwidth 0.7\n"
          "set xtics rotate by 90 right nomirror\n"
          "set bmargin %d\n"
          "set lmargin 10\n"
          "set rmargin 26\n"
          "set key outside right top\n"
          "set grid ytics lc rgb '#dddddd'\n"
          "set yrange [0:%.6g]\n",
          qt, (int)(0.5 * (double)label_max) + 3, ymax * 1.12 + 1e-9);
  if (capacity_gib > 0)
    fprintf(f,
            "set arrow 1 from graph 0, first %.6g to graph 1, first %.6g nohead lw 2 dt 2 lc rgb '#444444'\n"
            "set label 1 'capacity %.1f GiB' at graph 0.01, first %.6g offset 0,0.7 textcolor rgb '#444444'\n",
            capacity_gib, capacity_gib, capacity_gib, capacity_gib);
  /* One colour per category (gnuplot's default cycle repeats after eight). */
  static const char *const colors[MP_MEM_COUNT + 1] = {"#1f77b4", "#aec7e8", "#ff7f0e", "#ffbb78",
                                                       "#2ca02c", "#98df8a", "#d62728", "#9467bd",
                                                       "#8c564b", "#7f7f7f"};
  fprintf(f, "plot ");
  for (int i = 0; i <= MP_MEM_COUNT; i++)
    fprintf(f, "%s'memory.dat' using %d:xtic(2) title columnheader(%d) lc rgb '%s'",
            i ? ", \\\n     " : "", i + 3, i + 3, colors[i]);
  fprintf(f, "\n");
  MP_CHECK(close_checked(ctx, f, dir, "memory.gp"));
  return mp_plot_run_gnuplot(ctx, dir, "memory.gp");
}

/* ---- timeline ------------------------------------------------------------------------- */

/* One colour per row (a stream's kernels, its collectives), distinct for up to 12 rows. */
static const char *const k_row_colors[] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
                                           "#e377c2", "#17becf", "#bcbd22", "#7f7f7f", "#aec7e8", "#98df8a"};
#define N_ROW_COLORS 12

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

/* timeline.dat: one line per complete ("X") event, in ms, with its row; *t_end the last end. */
static mp_status timeline_data(mp_ctx *ctx, const char *dir, const char *trace_path, const cJSON *evs,
                               const timeline_rows *rw, double *t_end) {
  mp_status st;
  FILE *f = open_in(ctx, dir, "timeline.dat", &st);
  if (!f) return st;
  fprintf(f, "# simulated step of the chosen plan (from %s)\n# start_ms end_ms row\n", trace_path);
  *t_end = 0;
  int64_t n_ev = 0;
  const cJSON *ev;
  cJSON_ArrayForEach(ev, evs) {
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(ev, "ph");
    if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X")) continue;
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(ev, "ts");
    const cJSON *dur = cJSON_GetObjectItemCaseSensitive(ev, "dur");
    if (!cJSON_IsNumber(ts) || !cJSON_IsNumber(dur)) continue;
    const int k = event_key(ev);
    int row = -1;
    for (int r = 0; r < rw->n; r++)
      if (rw->keys[r] == k) row = r;
    if (row < 0) continue;
    double a = ts->valuedouble / 1000.0, b = (ts->valuedouble + dur->valuedouble) / 1000.0;
    if (b > *t_end) *t_end = b;
    fprintf(f, "%.6f %.6f %d\n", a, b, row);
    n_ev++;
  }
  if (n_ev == 0) fprintf(f, "NaN NaN 0\n");
  return close_checked(ctx, f, dir, "timeline.dat");
}

/* timeline.gp: one row per stream's kernels and per stream's collectives, each in its own
 * colour, the row names as y tics (no key needed: the names are beside the rows). */
static mp_status timeline_script(mp_ctx *ctx, const char *dir, const char *title, const timeline_rows *rw,
                                 double t_end) {
  mp_status st;
  FILE *f = open_in(ctx, dir, "timeline.gp", &st);
  if (!f) return st;
  char qt[600];
  gp_quote(title, qt, sizeof qt);
  fprintf(f,
          "# Simulated timeline of the chosen plan: one row per stream's kernels and collectives.\n"
          "# Redraw: gnuplot timeline.gp (reads timeline.dat)\n"
          "set terminal pngcairo noenhanced size 1600,%d font 'DejaVu Sans,12'\n"
          "set output 'timeline.png'\n"
          "set title %s\n"
          "set xlabel 'time within the step (ms)'\n"
          "set xrange [0:%.6g]\n"
          "set yrange [-0.6:%d.6] reverse\n"
          "set grid xtics lc rgb '#dddddd'\n"
          "set lmargin 34\n"
          "unset key\n"
          "set style fill solid 1.0 noborder\n"
          "set ytics (",
          240 + 60 * (rw->n > 0 ? rw->n : 1), qt, t_end > 0 ? t_end * 1.01 : 1.0, rw->n > 0 ? rw->n - 1 : 0);
  for (int r = 0; r < rw->n; r++) fprintf(f, "%s'%s' %d", r ? ", " : "", rw->names[r], r);
  fprintf(f, ")\nplot ");
  for (int r = 0; r < (rw->n > 0 ? rw->n : 1); r++)
    fprintf(f, "%s'timeline.dat' using (($1+$2)/2):($3==%d ? $3 : NaN):(($2-$1)/2):(0.35) with boxxyerror lc rgb '%s'",
            r ? ", \\\n     " : "", r, k_row_colors[r % N_ROW_COLORS]);
  fprintf(f, "\n");
  return close_checked(ctx, f, dir, "timeline.gp");
}

mp_status mp_plot_timeline(mp_ctx *ctx, const char *dir, const char *trace_path,
                           const char *title) {
  MP_CHECK(mp_plot_check_gnuplot(ctx));
  cJSON *root = NULL;
  const cJSON *evs = NULL;
  MP_CHECK(read_trace(ctx, trace_path, &root, &evs));
  timeline_rows rw;
  timeline_rows_of(evs, &rw);
  double t_end = 0;
  mp_status st = timeline_data(ctx, dir, trace_path, evs, &rw, &t_end);
  cJSON_Delete(root);
  MP_CHECK(st);
  MP_CHECK(timeline_script(ctx, dir, title, &rw, t_end));
  return mp_plot_run_gnuplot(ctx, dir, "timeline.gp");
}

/* ---- memory over time ----------------------------------------------------------------- */

/* memory_time.dat from the trace's memory counter ("ph": "C", sim/trace.c): per sample the
 * time (ms) and the running sum of the categories in the order of the trace's args, each
 * sample written twice (before and after its step) so the areas rise and fall as steps. */
static mp_status memory_time_data(mp_ctx *ctx, const char *dir, const cJSON *evs, char names[][32], int *n_cat,
                                  double *t_end, double *ymax) {
  mp_status st;
  FILE *f = open_in(ctx, dir, "memory_time.dat", &st);
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
  return close_checked(ctx, f, dir, "memory_time.dat");
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
  FILE *f = open_in(ctx, dir, "memory_time.gp", &st);
  if (!f) return st;
  char qt[600];
  gp_quote(title, qt, sizeof qt);
  if (capacity_gib > ymax) ymax = capacity_gib;
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
            "set label 1 'usable %.1f GiB (less the runtime overhead: %.1f GiB)' at graph 0.01, first %.6g "
            "offset 0,0.7 textcolor rgb '#444444'\n",
            capacity_gib, capacity_gib, capacity_gib, capacity_gib - overhead_gib, capacity_gib);
  fprintf(f, "plot ");
  for (int c = 0; c < (n_cat > 0 ? n_cat : 1); c++) {
    if (c == 0)
      fprintf(f, "'memory_time.dat' using 1:(0):2 with filledcurves lc rgb '%s' title '%s'", k_row_colors[0],
              n_cat ? names[0] : "none");
    else
      fprintf(f, ", \\\n     'memory_time.dat' using 1:%d:%d with filledcurves lc rgb '%s' title '%s'", c + 1,
              c + 2, k_row_colors[c % N_ROW_COLORS], names[c]);
  }
  fprintf(f, "\n");
  MP_CHECK(close_checked(ctx, f, dir, "memory_time.gp"));
  return mp_plot_run_gnuplot(ctx, dir, "memory_time.gp");
}

/* ---- a training run ---------------------------------------------------------------------- */

/* NAME.gp opened with its common lines: a quantity against the step, read from training.dat. */
static FILE *training_script(mp_ctx *ctx, const char *dir, const char *name, const char *what, const char *ylabel,
                             const char *title, mp_status *st) {
  char file[64], qt[600];
  snprintf(file, sizeof file, "%s.gp", name);
  FILE *f = open_in(ctx, dir, file, st);
  if (!f) return NULL;
  gp_quote(title, qt, sizeof qt);
  fprintf(f,
          "# %s against the step. Redraw: gnuplot %s.gp (reads training.dat)\n"
          "set terminal pngcairo noenhanced size 1000,640 font 'DejaVu Sans,11'\n"
          "set output '%s.png'\n"
          "set title %s\n"
          "set xlabel 'step'\n"
          "set ylabel '%s'\n"
          "set grid lc rgb '#dddddd'\n",
          what, name, name, qt, ylabel);
  return f;
}

mp_status mp_plot_training(mp_ctx *ctx, const char *dir, const mp_plot_step *steps, int64_t n, const char *title) {
  MP_CHECK(mp_plot_check_gnuplot(ctx));
  mp_status st;
  FILE *f = open_in(ctx, dir, "training.dat", &st);
  if (!f) return st;
  /* block 0: every step; block 1: the steps with a validation loss */
  fprintf(f, "# measured steps: step, training loss, tokens/s\n");
  int64_t n_eval = 0;
  for (int64_t i = 0; i < n; i++) {
    fprintf(f, "%lld %.9g %.6g\n", (long long)steps[i].step, steps[i].loss, steps[i].tokens_per_s);
    n_eval += steps[i].has_eval;
  }
  fprintf(f, "\n\n# steps with a validation loss: step, eval loss\n");
  for (int64_t i = 0; i < n; i++)
    if (steps[i].has_eval) fprintf(f, "%lld %.9g\n", (long long)steps[i].step, steps[i].eval_loss);
  if (n_eval == 0) fprintf(f, "NaN NaN\n");
  MP_CHECK(close_checked(ctx, f, dir, "training.dat"));
  f = training_script(ctx, dir, "loss", "Training and validation loss", "loss (nats per token)", title, &st);
  if (!f) return st;
  fprintf(f, "set key top right box opaque\n"
             "plot 'training.dat' index 0 using 1:2 with lines lw 2 lc rgb '#1f77b4' title 'training loss'");
  if (n_eval > 0)
    fprintf(f, ", \\\n     'training.dat' index 1 using 1:2 with linespoints pt 7 ps 1 lw 2 lc rgb '#d62728' "
               "title 'validation loss'");
  fprintf(f, "\n");
  MP_CHECK(close_checked(ctx, f, dir, "loss.gp"));
  MP_CHECK(mp_plot_run_gnuplot(ctx, dir, "loss.gp"));
  f = training_script(ctx, dir, "throughput", "Tokens per second", "tokens per second (all ranks)", title, &st);
  if (!f) return st;
  fprintf(f, "set yrange [0:*]\n"
             "set key bottom right box opaque\n"
             "plot 'training.dat' index 0 using 1:3 with linespoints pt 7 ps 0.6 lw 2 lc rgb '#2ca02c' "
             "title 'measured tokens/s'\n");
  MP_CHECK(close_checked(ctx, f, dir, "throughput.gp"));
  return mp_plot_run_gnuplot(ctx, dir, "throughput.gp");
}
