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

#include "common/json.h"

static const double kGiB = 1024.0 * 1024.0 * 1024.0;

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

mp_status mp_plot_candidates(mp_ctx *ctx, const char *dir, const mp_search *s,
                             const int64_t *order, int64_t n_order, double capacity_gib,
                             const char *title) {
  MP_CHECK(mp_plot_check_gnuplot(ctx));
  mp_status st;
  FILE *f = open_in(ctx, dir, "candidates.dat", &st);
  if (!f) return st;
  /* Three data blocks (gnuplot `index`): 0 feasible, 1 over memory, 2 the chosen plan. */
  fprintf(f, "# every evaluated candidate: peak memory per GPU (GiB), predicted step time (s), "
             "candidate index\n# block 0: feasible\n");
  int64_t n_feas = 0, n_oom = 0;
  double tmin = 1e300, tmax = 0, mmin = 1e300, mmax = 0;
  for (int pass = 0; pass < 2; pass++) {
    if (pass == 1) fprintf(f, "\n\n# block 1: over memory capacity\n");
    for (int64_t i = 0; i < s->n; i++) {
      const mp_candidate *c = &s->cands[i];
      if (!c->evaluated || c->reject == MP_REJECT_EVAL_ERROR) continue;
      int feasible = c->reject == MP_REJECT_NONE;
      if (feasible != (pass == 0)) continue;
      double m = (double)c->res.peak_mem_bytes / kGiB, t = c->res.step_time_s;
      if (!(t > 0) || !(m > 0)) continue; /* log axes */
      fprintf(f, "%.6g %.6g %lld\n", m, t, (long long)i);
      if (feasible) n_feas++;
      else n_oom++;
      if (t < tmin) tmin = t;
      if (t > tmax) tmax = t;
      if (m < mmin) mmin = m;
      if (m > mmax) mmax = m;
    }
    if ((pass == 0 ? n_feas : n_oom) == 0) fprintf(f, "NaN NaN -1\n"); /* keep the block */
  }
  char chosen[160] = "";
  fprintf(f, "\n\n# block 2: chosen plan\n");
  if (n_order > 0) {
    const mp_candidate *c = &s->cands[order[0]];
    short_plan(c, chosen, sizeof chosen);
    fprintf(f, "%.6g %.6g %lld\n", (double)c->res.peak_mem_bytes / kGiB, c->res.step_time_s,
            (long long)order[0]);
  } else {
    fprintf(f, "NaN NaN -1\n");
  }
  MP_CHECK(close_checked(ctx, f, dir, "candidates.dat"));
  if (n_feas + n_oom == 0) {
    tmin = mmin = 0.1;
    tmax = mmax = 10;
  }
  if (capacity_gib > mmax) mmax = capacity_gib;
  if (capacity_gib > 0 && capacity_gib < mmin) mmin = capacity_gib;

  f = open_in(ctx, dir, "candidates.gp", &st);
  if (!f) return st;
  char qt[600], qc[400];
  gp_quote(title, qt, sizeof qt);
  char chosen_label[256];
  snprintf(chosen_label, sizeof chosen_label, "chosen: %s", chosen);
  gp_quote(chosen_label, qc, sizeof qc);
  fprintf(f,
          "# Predicted step time vs peak memory per GPU of every evaluated candidate.\n"
          "# Redraw: gnuplot candidates.gp (reads candidates.dat)\n"
          "set terminal pngcairo noenhanced size 1200,800 font 'DejaVu Sans,11'\n"
          "set output 'candidates.png'\n"
          "set title %s\n"
          "set xlabel 'peak memory per GPU (GiB, log scale)'\n"
          "set ylabel 'predicted step time (s, log scale)'\n"
          "set logscale xy\n"
          "set grid xtics ytics mxtics mytics lc rgb '#dddddd'\n"
          "set key top right box opaque\n"
          "set xrange [%.6g:%.6g]\n"
          "set yrange [%.6g:%.6g]\n",
          qt, mmin / 1.3, mmax * 1.3, tmin / 1.3, tmax * 1.3);
  if (capacity_gib > 0)
    fprintf(f,
            "set arrow 1 from %.6g, graph 0 to %.6g, graph 1 nohead lw 2 dt 2 lc rgb '#444444'\n"
            "set label 1 'capacity %.1f GiB' at %.6g, graph 0.97 right offset -0.5,0 textcolor rgb '#444444'\n",
            capacity_gib, capacity_gib, capacity_gib, capacity_gib);
  fprintf(f,
          "plot 'candidates.dat' index 0 using 1:2 with points pt 7 ps 0.6 lc rgb '#1f77b4' "
          "title 'fits (%lld)', \\\n"
          "     'candidates.dat' index 1 using 1:2 with points pt 2 ps 0.6 lc rgb '#d62728' "
          "title 'over memory (%lld)', \\\n"
          "     'candidates.dat' index 2 using 1:2 with points pt 3 ps 4 lw 3 lc rgb '#2ca02c' "
          "title %s\n",
          (long long)n_feas, (long long)n_oom, qc);
  MP_CHECK(close_checked(ctx, f, dir, "candidates.gp"));
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
  for (int64_t r = 0; r < n; r++) {
    const mp_candidate *c = &s->cands[order[r]];
    char sp[160];
    short_plan(c, sp, sizeof sp);
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
          "set terminal pngcairo noenhanced size 1200,800 font 'DejaVu Sans,11'\n"
          "set output 'memory.png'\n"
          "set title %s\n"
          "set ylabel 'memory per GPU at the peak (GiB)'\n"
          "set xlabel 'plan (rank, mesh, AC, micro-batch)'\n"
          "set style data histograms\n"
          "set style histogram rowstacked\n"
          "set style fill solid 0.85 border rgb '#333333'\n"
          "set boxwidth 0.7\n"
          "set xtics rotate by 25 right\n"
          "set bmargin 10\n"
          "set lmargin 24\n"
          "set rmargin 28\n"
          "set key outside right top\n"
          "set grid ytics lc rgb '#dddddd'\n"
          "set yrange [0:%.6g]\n",
          qt, ymax * 1.12 + 1e-9);
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

static const char *const k_phases[] = {"prologue", "forward", "recompute", "backward", "optimizer"};
#define N_PHASES 5
static const char *const k_phase_colors[N_PHASES] = {"#7f7f7f", "#1f77b4", "#ff7f0e", "#2ca02c",
                                                     "#9467bd"};

static int phase_index(const cJSON *ev) {
  const cJSON *args = cJSON_GetObjectItemCaseSensitive(ev, "args");
  const cJSON *ph = args ? cJSON_GetObjectItemCaseSensitive(args, "phase") : NULL;
  if (cJSON_IsString(ph))
    for (int i = 0; i < N_PHASES; i++)
      if (strcmp(ph->valuestring, k_phases[i]) == 0) return i;
  return 0;
}

/* The rows of a timeline: the trace's tids in increasing order, each named by its
 * thread_name metadata ("stream <tid>" without one). */
enum { TIMELINE_MAX_ROWS = 32 };
typedef struct timeline_rows {
  int tids[TIMELINE_MAX_ROWS];
  char names[TIMELINE_MAX_ROWS][64];
  int n;
} timeline_rows;

static void timeline_rows_of(const cJSON *evs, timeline_rows *rw) {
  rw->n = 0;
  const cJSON *ev;
  cJSON_ArrayForEach(ev, evs) {
    const cJSON *tid = cJSON_GetObjectItemCaseSensitive(ev, "tid");
    if (!cJSON_IsNumber(tid)) continue;
    int t = (int)tid->valuedouble, found = 0;
    for (int r = 0; r < rw->n; r++) found |= rw->tids[r] == t;
    if (!found && rw->n < TIMELINE_MAX_ROWS) {
      rw->tids[rw->n] = t;
      snprintf(rw->names[rw->n], sizeof rw->names[rw->n], "stream %d", t);
      rw->n++;
    }
  }
  for (int a = 1; a < rw->n; a++) /* insertion sort, names follow */
    for (int b = a; b > 0 && rw->tids[b - 1] > rw->tids[b]; b--) {
      int t = rw->tids[b];
      rw->tids[b] = rw->tids[b - 1];
      rw->tids[b - 1] = t;
      char tmp[64];
      memcpy(tmp, rw->names[b], 64);
      memcpy(rw->names[b], rw->names[b - 1], 64);
      memcpy(rw->names[b - 1], tmp, 64);
    }
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
      if (rw->tids[r] == (int)tid->valuedouble) snprintf(rw->names[r], sizeof rw->names[r], "%s", an->valuestring);
  }
}

/* timeline.dat: one line per complete ("X") event of a row, in ms, with its phase;
 * *t_end the last end. */
static mp_status timeline_data(mp_ctx *ctx, const char *dir, const char *trace_path, const cJSON *evs,
                               const timeline_rows *rw, double *t_end) {
  mp_status st;
  FILE *f = open_in(ctx, dir, "timeline.dat", &st);
  if (!f) return st;
  fprintf(f, "# simulated step of the chosen plan (from %s)\n"
             "# start_ms end_ms row phase(0 prologue,1 forward,2 recompute,3 backward,4 optimizer)\n",
          trace_path);
  *t_end = 0;
  int64_t n_ev = 0;
  const cJSON *ev;
  cJSON_ArrayForEach(ev, evs) {
    const cJSON *ph = cJSON_GetObjectItemCaseSensitive(ev, "ph");
    if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X")) continue;
    const cJSON *tid = cJSON_GetObjectItemCaseSensitive(ev, "tid");
    const cJSON *ts = cJSON_GetObjectItemCaseSensitive(ev, "ts");
    const cJSON *dur = cJSON_GetObjectItemCaseSensitive(ev, "dur");
    if (!cJSON_IsNumber(tid) || !cJSON_IsNumber(ts) || !cJSON_IsNumber(dur)) continue;
    int row = -1;
    for (int r = 0; r < rw->n; r++)
      if (rw->tids[r] == (int)tid->valuedouble) row = r;
    if (row < 0) continue;
    double a = ts->valuedouble / 1000.0, b = (ts->valuedouble + dur->valuedouble) / 1000.0;
    if (b > *t_end) *t_end = b;
    fprintf(f, "%.6f %.6f %d %d\n", a, b, row, phase_index(ev));
    n_ev++;
  }
  if (n_ev == 0) fprintf(f, "NaN NaN 0 0\n");
  return close_checked(ctx, f, dir, "timeline.dat");
}

/* timeline.gp: one row per stream, ops coloured by phase, one plot element per phase so
 * the key names the colours. */
static mp_status timeline_script(mp_ctx *ctx, const char *dir, const char *title, const timeline_rows *rw,
                                 double t_end) {
  mp_status st;
  FILE *f = open_in(ctx, dir, "timeline.gp", &st);
  if (!f) return st;
  char qt[600];
  gp_quote(title, qt, sizeof qt);
  fprintf(f,
          "# Simulated timeline of the chosen plan: one row per stream, ops coloured by phase.\n"
          "# Redraw: gnuplot timeline.gp (reads timeline.dat)\n"
          "set terminal pngcairo noenhanced size 1600,%d font 'DejaVu Sans,11'\n"
          "set output 'timeline.png'\n"
          "set title %s\n"
          "set xlabel 'time within the step (ms)'\n"
          "set xrange [0:%.6g]\n"
          "set yrange [-0.6:%d.6] reverse\n"
          "set grid xtics lc rgb '#dddddd'\n"
          "set key outside top center horizontal\n"
          "set style fill solid 1.0 noborder\n"
          "set ytics (",
          220 + 70 * (rw->n > 0 ? rw->n : 1), qt, t_end > 0 ? t_end * 1.01 : 1.0, rw->n > 0 ? rw->n - 1 : 0);
  for (int r = 0; r < rw->n; r++) fprintf(f, "%s'%s' %d", r ? ", " : "", rw->names[r], r);
  fprintf(f, ")\nplot ");
  for (int p = 0; p < N_PHASES; p++)
    fprintf(f,
            "%s'timeline.dat' using (($1+$2)/2):($4==%d ? $3 : NaN):(($2-$1)/2):(0.35) "
            "with boxxyerror lc rgb '%s' title '%s'",
            p ? ", \\\n     " : "", p, k_phase_colors[p], k_phases[p]);
  fprintf(f, "\n");
  return close_checked(ctx, f, dir, "timeline.gp");
}

mp_status mp_plot_timeline(mp_ctx *ctx, const char *dir, const char *trace_path,
                           const char *title) {
  MP_CHECK(mp_plot_check_gnuplot(ctx));
  cJSON *root = NULL;
  MP_CHECK(mp_json_parse_file(ctx, trace_path, &root));
  const cJSON *evs = cJSON_IsArray(root) ? root : cJSON_GetObjectItemCaseSensitive(root, "traceEvents");
  if (!cJSON_IsArray(evs)) {
    cJSON_Delete(root);
    return mp_error(ctx, MP_ERR_INVALID, "%s: not a Chrome trace (no traceEvents array)", trace_path);
  }
  timeline_rows rw;
  timeline_rows_of(evs, &rw);
  double t_end = 0;
  mp_status st = timeline_data(ctx, dir, trace_path, evs, &rw, &t_end);
  cJSON_Delete(root);
  MP_CHECK(st);
  MP_CHECK(timeline_script(ctx, dir, title, &rw, t_end));
  return mp_plot_run_gnuplot(ctx, dir, "timeline.gp");
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
