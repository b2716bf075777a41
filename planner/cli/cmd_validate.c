/* meshplan validate: predictions against published measurements.
 *
 * Reads rows in the format of shared/validation/published_dev.csv: '#' lines are
 * comments, the first other line is the header, columns are found by name. Each row
 * names a model (data/models), a GPU (data/gpus) with gpus, gpus_per_node and
 * inter_node_gbps_per_gpu (Gbit/s), the mesh (dp_replicate, dp_shard, tp, pp, pp_schedule,
 * cp, ep), seq, local_batch (sequences per data-parallel rank per step), global_batch, ac,
 * fp8, the software stack (data/stacks) and one measured metric:
 *   tokens_per_s_per_gpu   compared with the simulation's tokens/s per GPU
 *   step_time_s            compared with its step time
 *   peak_mem_gib           compared with the allocator's peak: allocated x the stack's
 *                          fragmentation factor, in GiB. Published figures are PyTorch's
 *                          max reserved memory (torch.cuda.memory_stats), which leaves out
 *                          the CUDA context and NCCL's own buffers; the GPU profile's
 *                          runtime overhead is therefore not part of this comparison.
 * The micro-batch is local_batch (one micro-batch per step) unless a micro_batch column
 * says otherwise; pp rows run local_batch / micro_batch micro-batches.
 *
 * Prints per row predicted vs published with the percentage error, then per metric the
 * mean absolute percentage error and Kendall's tau-b between predicted and measured.
 * A row naming an unknown model, GPU or stack is an error naming the row (exit 2). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "exec/cluster.h"
#include "exec/mesh.h"
#include "exec/model.h"
#include "exec/plan.h"
#include "planner/cli/commands.h"
#include "sim/sim.h"
#include "sim/stack.h"

static mp_opt k_opts[] = {
    MP_OPT_END,
};

static mp_cmd_spec k_spec = {"validate",
                             "Compare predictions with published measurements (CSV rows).",
                             "FILE.csv", k_opts, 1};

#define MAX_COLS 64
#define MAX_ROWS 4096

typedef struct row {
  char name[96];
  char metric[32];
  double measured, predicted;
} row;

/* Splits line in place at commas (double-quoted fields may hold commas). */
static int split_csv(char *line, char **f, int cap) {
  int n = 0;
  char *p = line;
  while (n < cap) {
    if (*p == '"') {
      f[n++] = ++p;
      while (*p && *p != '"') p++;
      if (*p == '"') *p++ = '\0';
      while (*p && *p != ',') p++;
    } else {
      f[n++] = p;
      while (*p && *p != ',') p++;
    }
    if (*p != ',') break;
    *p++ = '\0';
  }
  return n;
}

static void strip(char *s) {
  size_t n = strlen(s);
  while (n && (s[n - 1] == '\n' || s[n - 1] == '\r' || s[n - 1] == ' ')) s[--n] = '\0';
}

typedef struct cols {
  char *hdr[MAX_COLS];
  int n;
} cols;

static const char *field(const cols *h, char **f, int nf, const char *name) {
  for (int i = 0; i < h->n && i < nf; i++)
    if (strcmp(h->hdr[i], name) == 0) return f[i];
  return NULL;
}

static mp_status need(mp_ctx *ctx, const char *where, const cols *h, char **f, int nf,
                      const char *name, const char **out) {
  *out = field(h, f, nf, name);
  if (*out == NULL)
    return mp_error(ctx, MP_ERR_INVALID, "%s: no column '%s'; the header must name it", where, name);
  return MP_OK;
}

static mp_status need_int(mp_ctx *ctx, const char *where, const cols *h, char **f, int nf,
                          const char *name, long long *out) {
  const char *v;
  MP_CHECK(need(ctx, where, h, f, nf, name, &v));
  char *end;
  *out = strtoll(v, &end, 10);
  if (end == v || *end != '\0')
    return mp_error(ctx, MP_ERR_INVALID, "%s: column '%s' = '%s': expected an integer", where, name, v);
  return MP_OK;
}

/* Simulates one row; *predicted gets the figure of the row's metric. */
static mp_status run_row(mp_ctx *ctx, const char *where, const cols *h, char **f, int nf,
                         row *r) {
  const char *model, *gpu, *stack, *metric, *value, *ac, *pps, *inter;
  long long gpus, per, dpr, dps, tp, pp, cp, ep, seq, lb, gb, fp8;
  MP_CHECK(need(ctx, where, h, f, nf, "model", &model));
  MP_CHECK(need(ctx, where, h, f, nf, "gpu", &gpu));
  MP_CHECK(need(ctx, where, h, f, nf, "stack", &stack));
  MP_CHECK(need(ctx, where, h, f, nf, "metric", &metric));
  MP_CHECK(need(ctx, where, h, f, nf, "value", &value));
  MP_CHECK(need(ctx, where, h, f, nf, "ac", &ac));
  MP_CHECK(need(ctx, where, h, f, nf, "pp_schedule", &pps));
  MP_CHECK(need(ctx, where, h, f, nf, "inter_node_gbps_per_gpu", &inter));
  MP_CHECK(need_int(ctx, where, h, f, nf, "gpus", &gpus));
  MP_CHECK(need_int(ctx, where, h, f, nf, "gpus_per_node", &per));
  MP_CHECK(need_int(ctx, where, h, f, nf, "dp_replicate", &dpr));
  MP_CHECK(need_int(ctx, where, h, f, nf, "dp_shard", &dps));
  MP_CHECK(need_int(ctx, where, h, f, nf, "tp", &tp));
  MP_CHECK(need_int(ctx, where, h, f, nf, "pp", &pp));
  MP_CHECK(need_int(ctx, where, h, f, nf, "cp", &cp));
  MP_CHECK(need_int(ctx, where, h, f, nf, "ep", &ep));
  MP_CHECK(need_int(ctx, where, h, f, nf, "seq", &seq));
  MP_CHECK(need_int(ctx, where, h, f, nf, "local_batch", &lb));
  MP_CHECK(need_int(ctx, where, h, f, nf, "global_batch", &gb));
  MP_CHECK(need_int(ctx, where, h, f, nf, "fp8", &fp8));
  snprintf(r->metric, sizeof r->metric, "%s", metric);
  char *end;
  r->measured = strtod(value, &end);
  if (end == value || *end != '\0' || r->measured <= 0)
    return mp_error(ctx, MP_ERR_INVALID, "%s: value '%s': expected a positive number", where, value);
  if (strcmp(metric, "tokens_per_s_per_gpu") != 0 && strcmp(metric, "peak_mem_gib") != 0 &&
      strcmp(metric, "step_time_s") != 0)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: metric '%s': expected tokens_per_s_per_gpu, peak_mem_gib or step_time_s",
                    where, metric);

  mp_model m;
  mp_cluster c;
  mp_stack_profile prof;
  MP_CHECK(mp_model_load(ctx, model, &m));
  MP_CHECK(mp_cluster_make(ctx, gpu, (int)gpus, (int)per, &c));
  double g = strtod(inter, &end);
  if (end != inter && *end == '\0' && g > 0) c.inter_node_Gbitps_per_gpu = g;
  MP_CHECK(mp_stack_load(ctx, stack, &prof));

  mp_mesh mesh;
  mp_mesh_init(&mesh);
  mesh.size[MP_DIM_PP] = (int)pp;
  mesh.size[MP_DIM_DP_REPLICATE] = (int)dpr;
  mesh.size[MP_DIM_DP_SHARD] = (int)dps;
  mesh.size[MP_DIM_CP] = (int)cp;
  mesh.size[MP_DIM_TP] = (int)tp;
  mesh.ep = (int)ep;
  MP_CHECK(mp_mesh_validate(ctx, &mesh));
  if (mp_mesh_world(&mesh) != gpus)
    return mp_error(ctx, MP_ERR_INVALID, "%s: the mesh has %d ranks but gpus = %lld", where,
                    mp_mesh_world(&mesh), gpus);

  mp_plan_options o;
  mp_plan_options_init(&o);
  MP_CHECK(mp_ac_parse(ctx, ac, &o.ac, &o.ac_every));
  o.fp8 = fp8 != 0;
  if (pps[0] == '\0' || strcmp(pps, "1f1b") == 0) o.pp_schedule = MP_PP_1F1B;
  else if (strcmp(pps, "interleaved") == 0) o.pp_schedule = MP_PP_INTERLEAVED, o.pp_virtual = 2;
  else if (strcmp(pps, "gpipe") == 0) o.pp_schedule = MP_PP_GPIPE;
  else return mp_error(ctx, MP_ERR_INVALID, "%s: pp_schedule '%s': expected 1f1b, interleaved or gpipe", where, pps);
  o.seq = seq;
  o.micro_batch = lb;
  const char *mbs = field(h, f, nf, "micro_batch");
  if (mbs && mbs[0]) o.micro_batch = strtoll(mbs, NULL, 10);
  o.global_batch = gb;

  mp_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.cluster = &c;
  cfg.stack = &prof;
  mp_sim_result res;
  MP_CHECK(mp_simulate_plan(ctx, &m, &mesh, &o, &cfg, &res));
  if (strcmp(metric, "tokens_per_s_per_gpu") == 0)
    r->predicted = res.tokens_per_s_per_gpu;
  else if (strcmp(metric, "step_time_s") == 0)
    r->predicted = res.step_time_s;
  else
    r->predicted = ((double)res.peak_mem_bytes - c.gpu.runtime_overhead_gib * 1073741824.0) /
                   1073741824.0;
  return MP_OK;
}

/* Kendall's tau-b of two samples (ties in either counted as neither concordant nor
 * discordant, normalised by the untied pairs of each). */
static double kendall_tau(const double *x, const double *y, int n) {
  double conc = 0, disc = 0, tx = 0, ty = 0;
  for (int i = 0; i < n; i++)
    for (int j = i + 1; j < n; j++) {
      double a = x[i] - x[j], b = y[i] - y[j];
      if (a == 0 && b == 0) continue;
      if (a == 0) tx++;
      else if (b == 0) ty++;
      else if ((a > 0) == (b > 0)) conc++;
      else disc++;
    }
  double d = sqrt((conc + disc + tx) * (conc + disc + ty));
  return d > 0 ? (conc - disc) / d : NAN;
}

/* Reads the CSV text (split in place) into rows[0..*n) with each row simulated; the first
 * bad row is an error naming it (path, line and case). */
static mp_status read_rows(mp_ctx *ctx, const char *path, char *text, row *rows, int *n_out) {
  cols h;
  h.n = 0;
  int n = 0, line_no = 0;
  char *save = NULL;
  for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
    line_no++;
    strip(line);
    if (line[0] == '#' || line[0] == '\0') continue;
    if (h.n == 0) {
      h.n = split_csv(line, h.hdr, MAX_COLS);
      continue;
    }
    if (n == MAX_ROWS) return mp_error(ctx, MP_ERR_INVALID, "%s: more than %d rows", path, MAX_ROWS);
    char *f[MAX_COLS];
    int nf = split_csv(line, f, MAX_COLS);
    const char *name = field(&h, f, nf, "case");
    snprintf(rows[n].name, sizeof rows[n].name, "%s", name && name[0] ? name : "?");
    char where[256];
    snprintf(where, sizeof where, "%s line %d (row '%s')", path, line_no, rows[n].name);
    mp_status st = run_row(ctx, where, &h, f, nf, &rows[n]);
    if (st != MP_OK) {
      if (strncmp(mp_errmsg(ctx), where, strlen(where)) != 0) mp_error_prefix(ctx, "%s", where);
      return st != MP_ERR_NOMEM && st != MP_ERR_INTERNAL ? MP_ERR_INVALID : st;
    }
    n++;
  }
  if (n == 0) return mp_error(ctx, MP_ERR_INVALID, "%s: no data rows", path);
  *n_out = n;
  return MP_OK;
}

/* Every row's predicted vs published figure, then per metric the MAPE and Kendall's tau. */
static mp_status print_results(mp_ctx *ctx, const row *rows, int n) {
  printf("%-30s %-22s %12s %12s %8s\n", "case", "metric", "predicted", "published", "error");
  for (int i = 0; i < n; i++)
    printf("%-30s %-22s %12.4g %12.4g %+7.1f%%\n", rows[i].name, rows[i].metric,
           rows[i].predicted, rows[i].measured,
           100.0 * (rows[i].predicted - rows[i].measured) / rows[i].measured);
  printf("\n%-22s %5s %8s %12s\n", "metric", "rows", "MAPE", "Kendall tau");
  const char *metrics[] = {"tokens_per_s_per_gpu", "peak_mem_gib", "step_time_s"};
  double *x = (double *)calloc((size_t)n, sizeof *x), *y = (double *)calloc((size_t)n, sizeof *y);
  if (x == NULL || y == NULL) {
    free(x);
    free(y);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  }
  for (int k = 0; k < 3; k++) {
    int cnt = 0;
    double ape = 0;
    for (int i = 0; i < n; i++)
      if (strcmp(rows[i].metric, metrics[k]) == 0) {
        x[cnt] = rows[i].predicted;
        y[cnt] = rows[i].measured;
        ape += fabs(rows[i].predicted - rows[i].measured) / rows[i].measured;
        cnt++;
      }
    if (cnt == 0) continue;
    double tau = kendall_tau(x, y, cnt);
    if (isnan(tau))
      printf("%-22s %5d %7.1f%% %12s\n", metrics[k], cnt, 100.0 * ape / cnt, "n/a");
    else
      printf("%-22s %5d %7.1f%% %12.3f\n", metrics[k], cnt, 100.0 * ape / cnt, tau);
  }
  free(x);
  free(y);
  return MP_OK;
}

static int run_validate(mp_ctx *ctx, const mp_cmd_call *call) {
  if (call->n_pos != 1) {
    fprintf(stderr, "meshplan validate: give one CSV file (see meshplan validate --help)\n");
    return 2;
  }
  const char *path = call->pos[0];
  char *text = NULL;
  size_t len = 0;
  mp_status st = mp_read_file(ctx, path, &text, &len);
  if (st != MP_OK) return mp_cmd_fail(ctx, st);
  row *rows = (row *)calloc(MAX_ROWS, sizeof *rows);
  if (rows == NULL) {
    free(text);
    fprintf(stderr, "meshplan validate: out of memory\n");
    return 1;
  }
  int n = 0;
  st = read_rows(ctx, path, text, rows, &n);
  if (st == MP_OK) st = print_results(ctx, rows, n);
  free(rows);
  free(text);
  return st != MP_OK ? mp_cmd_fail(ctx, st) : 0;
}

const mp_command mp_command_validate = {&k_spec, "compare predictions with published measurements (CSV)",
                                        run_validate};
