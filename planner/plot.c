/* gnuplot plots of a planner run (see plot.h).
 *
 * Scripts use `noenhanced` text so mesh names such as dp_shard print as written (enhanced
 * mode would turn "_s" into a subscript), and quote titles in single quotes (a quote
 * inside is doubled, gnuplot's escape). Data files are written before the script runs;
 * a missing gnuplot is detected before anything is written. */
#define _GNU_SOURCE
#include "planner/plot.h"
#include "planner/plot_internal.h"

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

const char *const mp_plot_colors[MP_PLOT_N_COLORS] = {"#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd",
                                                     "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f",
                                                     "#aec7e8", "#98df8a"};

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
  char path[1024], line[512] = "";
  snprintf(path, sizeof path, "%s/%s", dir, log_name);
  if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
    /* the log is kept only when it says something (a warning) */
    struct stat sb;
    if (stat(path, &sb) == 0 && sb.st_size == 0) unlink(path);
    return MP_OK;
  }
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

FILE *mp_plot_open(mp_ctx *ctx, const char *dir, const char *name, mp_status *st) {
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, name);
  FILE *f = fopen(path, "w");
  *st = f ? MP_OK : mp_error(ctx, MP_ERR_IO, "cannot write %s: %s", path, strerror(errno));
  return f;
}

mp_status mp_plot_close(mp_ctx *ctx, FILE *f, const char *dir, const char *name) {
  int bad = ferror(f);
  if (fclose(f) != 0) bad = 1;
  if (bad) return mp_error(ctx, MP_ERR_IO, "error writing %s/%s", dir, name);
  return MP_OK;
}

void mp_plot_quote(const char *s, char *out, size_t cap) {
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
  FILE *f = mp_plot_open(ctx, dir, "candidates.dat", &st);
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
  return mp_plot_close(ctx, f, dir, "candidates.dat");
}

/* candidates.gp: the scatter of candidates.dat over sc's ranges, the capacity line where
 * capacity_gib > 0, the chosen plan labelled. */
static mp_status write_candidates_gp(mp_ctx *ctx, const char *dir, const scatter *sc,
                                     double capacity_gib, const char *title, const char *chosen) {
  mp_status st;
  FILE *f = mp_plot_open(ctx, dir, "candidates.gp", &st);
  if (!f) return st;
  char qt[600], qc[400];
  mp_plot_quote(title, qt, sizeof qt);
  char chosen_label[256];
  snprintf(chosen_label, sizeof chosen_label, "chosen: %s", chosen);
  mp_plot_quote(chosen_label, qc, sizeof qc);
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
  return mp_plot_close(ctx, f, dir, "candidates.gp");
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

/* memory.dat: per plan of the first n of order, its rank, its tic "#rank" and its memory at
 * the peak per category (GiB); *ymax the largest total (at least capacity_gib). */
static mp_status memory_dat(mp_ctx *ctx, const char *dir, const mp_search *s, const int64_t *order, int64_t n,
                            double capacity_gib, double *ymax) {
  static const char *const cats[MP_MEM_COUNT] = {"parameters", "optimizer", "gradients",
                                                 "gathered params", "activations", "temporary",
                                                 "comm buffers", "float8", "logits"};
  mp_status st;
  FILE *f = mp_plot_open(ctx, dir, "memory.dat", &st);
  if (!f) return st;
  fprintf(f, "# memory per GPU at the peak of the top plans, GiB per category (the plans: memory.gp)\n");
  fprintf(f, "rank plan");
  for (int c = 0; c < MP_MEM_COUNT; c++) fprintf(f, " \"%s\"", cats[c]);
  fprintf(f, " \"runtime overhead\"\n");
  *ymax = capacity_gib;
  for (int64_t r = 0; r < n; r++) {
    const mp_candidate *c = &s->cands[order[r]];
    fprintf(f, "%lld \"#%lld\"", (long long)(r + 1), (long long)(r + 1));
    double total = 0;
    for (int m = 0; m < MP_MEM_COUNT; m++) {
      double g = (double)c->res.mem_at_peak[m] / kGiB;
      total += g;
      fprintf(f, " %.6g", g);
    }
    double ov = (double)c->res.overhead_bytes / kGiB;
    total += ov;
    fprintf(f, " %.6g\n", ov);
    if (total > *ymax) *ymax = total;
  }
  if (n == 0) {
    fprintf(f, "0 \"no feasible plan\"");
    for (int m = 0; m <= MP_MEM_COUNT; m++) fprintf(f, " 0");
    fprintf(f, "\n");
  }
  return mp_plot_close(ctx, f, dir, "memory.dat");
}

/* How many plans' names memory.png lists per line under its bars. */
#define MEMORY_NAMES_PER_LINE 2

/* memory.gp: stacked bars tic'd #1, #2, ..., the plans they are listed under them in
 * MEMORY_NAMES_PER_LINE columns (horizontal text: a rotated mesh name took half the image),
 * the capacity as a line. */
static mp_status memory_gp(mp_ctx *ctx, const char *dir, const mp_search *s, const int64_t *order, int64_t n,
                           double capacity_gib, double ymax, const char *title) {
  mp_status st;
  FILE *f = mp_plot_open(ctx, dir, "memory.gp", &st);
  if (!f) return st;
  char qt[600];
  mp_plot_quote(title, qt, sizeof qt);
  const int lines = (int)((n + MEMORY_NAMES_PER_LINE - 1) / MEMORY_NAMES_PER_LINE);
  fprintf(f,
          "# Memory breakdown at the peak of the top plans (stacked bars).\n"
          "# Redraw: gnuplot memory.gp (reads memory.dat)\n"
          "set terminal pngcairo noenhanced size 1400,%d font 'DejaVu Sans,12'\n"
          "set output 'memory.png'\n"
          "set title %s\n"
          "set ylabel 'memory per GPU at the peak (GiB)'\n"
          "set xlabel 'plan, by rank (listed below)'\n"
          "set style data histograms\n"
          "set style histogram rowstacked\n"
          "set style fill solid 0.85 border rgb '#333333'\n"
          "set boxwidth 0.7\n"
          "set xtics nomirror\n"
          "set bmargin %d\n"
          "set lmargin 10\n"
          "set rmargin 26\n"
          "set key outside right top\n"
          "set grid ytics lc rgb '#dddddd'\n"
          "set yrange [0:%.6g]\n",
          620 + 22 * lines, qt, 5 + lines, ymax * 1.12 + 1e-9);
  for (int64_t r = 0; r < n; r++) {
    char sp[160], ql[200], line[180];
    short_plan(&s->cands[order[r]], sp, sizeof sp);
    snprintf(line, sizeof line, "#%lld %s", (long long)(r + 1), sp);
    mp_plot_quote(line, ql, sizeof ql);
    fprintf(f, "set label %lld %s at screen %.3f, character %d\n", (long long)(10 + r), ql,
            0.06 + 0.45 * (double)(r % MEMORY_NAMES_PER_LINE), lines - (int)(r / MEMORY_NAMES_PER_LINE) + 1);
  }
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
  return mp_plot_close(ctx, f, dir, "memory.gp");
}

mp_status mp_plot_memory(mp_ctx *ctx, const char *dir, const mp_search *s, const int64_t *order,
                         int64_t n_order, int k, double capacity_gib, const char *title) {
  MP_CHECK(mp_plot_check_gnuplot(ctx));
  const int64_t n = n_order < k ? n_order : k;
  double ymax = 0;
  MP_CHECK(memory_dat(ctx, dir, s, order, n, capacity_gib, &ymax));
  MP_CHECK(memory_gp(ctx, dir, s, order, n, capacity_gib, ymax, title));
  return mp_plot_run_gnuplot(ctx, dir, "memory.gp");
}

/* ---- a training run ---------------------------------------------------------------------- */

/* NAME.gp opened with its common lines: a quantity against the step, read from training.dat,
 * with a margin around the points (the last step's marker was cut in half by the border)
 * and a dotted line just before each step where the run resumed from a checkpoint. */
static FILE *training_script(mp_ctx *ctx, const char *dir, const char *name, const char *what, const char *ylabel,
                             const char *title, const mp_plot_training_marks *marks, mp_status *st) {
  char file[64], qt[600];
  snprintf(file, sizeof file, "%s.gp", name);
  FILE *f = mp_plot_open(ctx, dir, file, st);
  if (!f) return NULL;
  mp_plot_quote(title, qt, sizeof qt);
  fprintf(f,
          "# %s against the step. Redraw: gnuplot %s.gp (reads training.dat)\n"
          "set terminal pngcairo noenhanced size 1000,640 font 'DejaVu Sans,11'\n"
          "set output '%s.png'\n"
          "set title %s\n"
          "set xlabel 'step'\n"
          "set ylabel '%s'\n"
          "set grid lc rgb '#dddddd'\n"
          "set offsets graph 0.03, graph 0.03, graph 0.06, graph 0.06\n",
          what, name, name, qt, ylabel);
  for (int64_t k = 0; marks && k < marks->n_resumed; k++)
    fprintf(f, "set arrow %lld from %.1f, graph 0 to %.1f, graph 1 nohead dt 3 lw 2 lc rgb '#9467bd'\n",
            (long long)(k + 1), (double)marks->resumed_at[k] - 0.5, (double)marks->resumed_at[k] - 0.5);
  return f;
}

/* The key's entry for the resume marks (", NaN ... title"), "" without any. */
static void resume_key(FILE *f, const mp_plot_training_marks *marks) {
  if (!marks || marks->n_resumed == 0) return;
  fprintf(f, ", \\\n     NaN with lines dt 3 lw 2 lc rgb '#9467bd' title 'resumed from a checkpoint (step %lld",
          (long long)marks->resumed_at[0]);
  for (int64_t k = 1; k < marks->n_resumed && k < 8; k++) fprintf(f, ", %lld", (long long)marks->resumed_at[k]);
  fprintf(f, "%s)'", marks->n_resumed > 8 ? ", ..." : "");
}

/* training.dat: block 0 every step (step, loss, tokens/s), block 1 the steps with a
 * validation loss (step, eval loss); *n_eval how many. */
static mp_status training_dat(mp_ctx *ctx, const char *dir, const mp_plot_step *steps, int64_t n, int64_t *n_eval) {
  mp_status st;
  FILE *f = mp_plot_open(ctx, dir, "training.dat", &st);
  if (!f) return st;
  fprintf(f, "# measured steps: step, training loss, tokens/s\n");
  *n_eval = 0;
  for (int64_t i = 0; i < n; i++) {
    fprintf(f, "%lld %.9g %.6g\n", (long long)steps[i].step, steps[i].loss, steps[i].tokens_per_s);
    *n_eval += steps[i].has_eval;
  }
  fprintf(f, "\n\n# steps with a validation loss: step, eval loss\n");
  for (int64_t i = 0; i < n; i++)
    if (steps[i].has_eval) fprintf(f, "%lld %.9g\n", (long long)steps[i].step, steps[i].eval_loss);
  if (*n_eval == 0) fprintf(f, "NaN NaN\n");
  return mp_plot_close(ctx, f, dir, "training.dat");
}

mp_status mp_plot_training(mp_ctx *ctx, const char *dir, const mp_plot_step *steps, int64_t n,
                           const mp_plot_training_marks *marks, const char *title) {
  MP_CHECK(mp_plot_check_gnuplot(ctx));
  mp_status st;
  int64_t n_eval = 0;
  MP_CHECK(training_dat(ctx, dir, steps, n, &n_eval));
  FILE *f = training_script(ctx, dir, "loss", "Training and validation loss", "loss (nats per token)", title, marks,
                            &st);
  if (!f) return st;
  fprintf(f, "set key outside top center horizontal\n"
             "plot 'training.dat' index 0 using 1:2 with lines lw 2 lc rgb '#1f77b4' title 'training loss'");
  if (n_eval > 0)
    fprintf(f, ", \\\n     'training.dat' index 1 using 1:2 with linespoints pt 7 ps 1 lw 2 lc rgb '#d62728' "
               "title 'validation loss'");
  resume_key(f, marks);
  fprintf(f, "\n");
  MP_CHECK(mp_plot_close(ctx, f, dir, "loss.gp"));
  MP_CHECK(mp_plot_run_gnuplot(ctx, dir, "loss.gp"));
  f = training_script(ctx, dir, "throughput", "Tokens per second", "tokens per second (all ranks)", title, marks, &st);
  if (!f) return st;
  fprintf(f, "set yrange [0:*]\n"
             "set key outside top center horizontal\n"
             "plot 'training.dat' index 0 using 1:3 with linespoints pt 7 ps 0.6 lw 2 lc rgb '#2ca02c' "
             "title 'measured tokens/s'");
  if (marks && marks->predicted_tokens_per_s > 0)
    fprintf(f, ", \\\n     %.9g with lines dt 2 lw 2 lc rgb '#444444' title 'predicted %.0f tokens/s'",
            marks->predicted_tokens_per_s, marks->predicted_tokens_per_s);
  resume_key(f, marks);
  fprintf(f, "\n");
  MP_CHECK(mp_plot_close(ctx, f, dir, "throughput.gp"));
  return mp_plot_run_gnuplot(ctx, dir, "throughput.gp");
}
