/* meshplan validate: predictions against published measurements.
 *
 * Reads rows in the format of shared/validation/published_dev.csv (its README documents the
 * columns): '#' lines are comments, the first other line is the header, columns are found by
 * name. Each row names a model (data/models, or a .json path relative to the CSV's folder),
 * a GPU (data/gpus) with gpus, gpus_per_node and inter_node_gbps_per_gpu (Gbit/s), the mesh
 * (dp_replicate, dp_shard, tp, pp, pp_schedule, pp_virtual, cp, ep), seq, local_batch
 * (sequences per data-parallel rank per step), micro_batch, global_batch, ac (a policy
 * name, exec/plan.h), fp8, sp, the software stack (data/stacks) and one measured metric:
 *   tokens_per_s_per_gpu   compared with the simulation's tokens/s per GPU
 *   step_time_s            compared with its step time
 *   peak_mem_gib           compared with the allocator's peak: allocated x the stack's
 *                          fragmentation factor, in GiB. Published figures are PyTorch's
 *                          max reserved memory (torch.cuda.memory_stats), which leaves out
 *                          the CUDA context and NCCL's own buffers; the GPU profile's
 *                          runtime overhead is therefore not part of this comparison.
 * Optional columns: micro_batch (empty or absent: every divisor of local_batch is
 * simulated and the fastest that fits is taken, as a user of the stack would tune it; the
 * table marks it with '*'), pp_virtual (empty: 2 for the interleaved schedule), sp (empty:
 * the plan's default, on with tp > 1 where the stack runs it). The stack's options (memory
 * model, attention and loss kernels) apply to the plan.
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
  int64_t micro_batch; /* the micro-batch simulated */
  int picked;          /* chosen among the divisors of local_batch (no micro_batch given) */
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

/* An optional integer column: absent or empty leaves *out. */
static mp_status opt_int(mp_ctx *ctx, const char *where, const cols *h, char **f, int nf,
                         const char *name, long long *out) {
  const char *v = field(h, f, nf, name);
  if (v == NULL || v[0] == '\0') return MP_OK;
  char *end;
  *out = strtoll(v, &end, 10);
  if (end == v || *end != '\0')
    return mp_error(ctx, MP_ERR_INVALID, "%s: column '%s' = '%s': expected an integer or nothing",
                    where, name, v);
  return MP_OK;
}

/* The row's model: a data/models name, or a .json path taken relative to the CSV's folder
 * (dir) unless absolute. */
static mp_status load_model(mp_ctx *ctx, const char *dir, const char *model, mp_model *m) {
  const size_t n = strlen(model);
  if (model[0] == '/' || n < 5 || strcmp(model + n - 5, ".json") != 0 || dir[0] == '\0')
    return mp_model_load(ctx, model, m);
  char path[1024];
  snprintf(path, sizeof path, "%s/%s", dir, model);
  return mp_model_load(ctx, path, m);
}

/* What a row asks to simulate: model, cluster, stack, mesh and plan options, and whether
 * its micro-batch is to be picked. */
typedef struct row_job {
  mp_model m;
  mp_cluster c;
  mp_stack_profile prof;
  mp_mesh mesh;
  mp_plan_options o;
  long long local_batch, micro_batch; /* micro_batch 0: pick */
} row_job;

static mp_status read_mesh(mp_ctx *ctx, const char *where, const cols *h, char **f, int nf,
                           long long gpus, mp_mesh *mesh) {
  long long dpr, dps, tp, pp, cp, ep;
  MP_CHECK(need_int(ctx, where, h, f, nf, "dp_replicate", &dpr));
  MP_CHECK(need_int(ctx, where, h, f, nf, "dp_shard", &dps));
  MP_CHECK(need_int(ctx, where, h, f, nf, "tp", &tp));
  MP_CHECK(need_int(ctx, where, h, f, nf, "pp", &pp));
  MP_CHECK(need_int(ctx, where, h, f, nf, "cp", &cp));
  MP_CHECK(need_int(ctx, where, h, f, nf, "ep", &ep));
  mp_mesh_init(mesh);
  mesh->size[MP_DIM_PP] = (int)pp;
  mesh->size[MP_DIM_DP_REPLICATE] = (int)dpr;
  mesh->size[MP_DIM_DP_SHARD] = (int)dps;
  mesh->size[MP_DIM_CP] = (int)cp;
  mesh->size[MP_DIM_TP] = (int)tp;
  mesh->ep = (int)ep;
  MP_CHECK(mp_mesh_validate(ctx, mesh));
  if (mp_mesh_world(mesh) != gpus)
    return mp_error(ctx, MP_ERR_INVALID, "%s: the mesh has %d ranks but gpus = %lld", where,
                    mp_mesh_world(mesh), gpus);
  return MP_OK;
}

/* The plan options of a row: AC, float8, SP, the pipeline schedule, seq and batch, over
 * the stack's. */
static mp_status read_options(mp_ctx *ctx, const char *where, const cols *h, char **f, int nf,
                              row_job *j) {
  const char *ac, *pps;
  long long seq, gb, fp8, sp = -1, pv = 2;
  MP_CHECK(need(ctx, where, h, f, nf, "ac", &ac));
  MP_CHECK(need(ctx, where, h, f, nf, "pp_schedule", &pps));
  MP_CHECK(need_int(ctx, where, h, f, nf, "seq", &seq));
  MP_CHECK(need_int(ctx, where, h, f, nf, "local_batch", &j->local_batch));
  MP_CHECK(need_int(ctx, where, h, f, nf, "global_batch", &gb));
  MP_CHECK(need_int(ctx, where, h, f, nf, "fp8", &fp8));
  MP_CHECK(opt_int(ctx, where, h, f, nf, "sp", &sp));
  MP_CHECK(opt_int(ctx, where, h, f, nf, "pp_virtual", &pv));
  j->micro_batch = 0;
  MP_CHECK(opt_int(ctx, where, h, f, nf, "micro_batch", &j->micro_batch));
  mp_plan_options *o = &j->o;
  mp_plan_options_init(o);
  mp_stack_plan_options(&j->prof, o);
  MP_CHECK(mp_ac_parse(ctx, ac, &o->ac, &o->ac_every));
  o->fp8 = fp8 != 0;
  if (sp >= 0) o->sp = sp != 0;
  if (pps[0] == '\0' || strcmp(pps, "1f1b") == 0) o->pp_schedule = MP_PP_1F1B;
  else if (strcmp(pps, "interleaved") == 0) o->pp_schedule = MP_PP_INTERLEAVED, o->pp_virtual = (int)pv;
  else if (strcmp(pps, "gpipe") == 0) o->pp_schedule = MP_PP_GPIPE;
  else return mp_error(ctx, MP_ERR_INVALID, "%s: pp_schedule '%s': expected 1f1b, interleaved or gpipe", where, pps);
  if (j->local_batch < 1 || j->micro_batch < 0 || (j->micro_batch && j->local_batch % j->micro_batch))
    return mp_error(ctx, MP_ERR_INVALID, "%s: micro_batch %lld must divide local_batch %lld", where,
                    j->micro_batch, j->local_batch);
  o->seq = seq;
  o->global_batch = gb;
  return MP_OK;
}

/* The simulation of one micro-batch size. */
static mp_status simulate_mb(mp_ctx *ctx, row_job *j, int64_t mb, mp_sim_result *res) {
  mp_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.cluster = &j->c;
  cfg.stack = &j->prof;
  j->o.micro_batch = mb;
  return mp_simulate_plan(ctx, &j->m, &j->mesh, &j->o, &cfg, res);
}

/* The row's simulation: its micro-batch, or the fastest that fits among the divisors of
 * local_batch (the smallest when none fits); a divisor the plan refuses (the interleaved
 * schedule's micro-batches in groups of pp) is no choice, the error kept for when none is
 * left. */
static mp_status simulate_row(mp_ctx *ctx, row_job *j, row *r, mp_sim_result *res) {
  if (j->micro_batch > 0) {
    r->micro_batch = j->micro_batch;
    return simulate_mb(ctx, j, j->micro_batch, res);
  }
  r->picked = 1;
  int have = 0;
  for (int64_t mb = 1; mb <= j->local_batch; mb++) {
    if (j->local_batch % mb) continue;
    mp_sim_result x;
    const mp_status st = simulate_mb(ctx, j, mb, &x);
    if (st == MP_ERR_INVALID) continue;
    if (st != MP_OK) return st;
    const int better = !have || (x.fits && (!res->fits || x.step_time_s < res->step_time_s));
    if (better) {
      *res = x;
      r->micro_batch = mb;
      have = 1;
    }
  }
  return have ? MP_OK : ctx->last;
}

/* Simulates one row; *predicted gets the figure of the row's metric. dir: the CSV's
 * folder. */
static mp_status run_row(mp_ctx *ctx, const char *where, const char *dir, const cols *h,
                         char **f, int nf, row *r) {
  const char *model, *gpu, *stack, *metric, *value, *inter;
  long long gpus, per;
  MP_CHECK(need(ctx, where, h, f, nf, "model", &model));
  MP_CHECK(need(ctx, where, h, f, nf, "gpu", &gpu));
  MP_CHECK(need(ctx, where, h, f, nf, "stack", &stack));
  MP_CHECK(need(ctx, where, h, f, nf, "metric", &metric));
  MP_CHECK(need(ctx, where, h, f, nf, "value", &value));
  MP_CHECK(need(ctx, where, h, f, nf, "inter_node_gbps_per_gpu", &inter));
  MP_CHECK(need_int(ctx, where, h, f, nf, "gpus", &gpus));
  MP_CHECK(need_int(ctx, where, h, f, nf, "gpus_per_node", &per));
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
  row_job *j = calloc(1, sizeof *j);
  if (j == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  mp_status st = load_model(ctx, dir, model, &j->m);
  if (st == MP_OK) st = mp_cluster_make(ctx, gpu, (int)gpus, (int)per, &j->c);
  double g = strtod(inter, &end);
  if (end != inter && *end == '\0' && g > 0) j->c.inter_node_Gbitps_per_gpu = g;
  if (st == MP_OK) st = mp_stack_load(ctx, stack, &j->prof);
  if (st == MP_OK) st = read_mesh(ctx, where, h, f, nf, gpus, &j->mesh);
  if (st == MP_OK) st = read_options(ctx, where, h, f, nf, j);
  mp_sim_result res;
  memset(&res, 0, sizeof res);
  if (st == MP_OK) st = simulate_row(ctx, j, r, &res);
  if (st == MP_OK) {
    if (strcmp(metric, "tokens_per_s_per_gpu") == 0)
      r->predicted = res.tokens_per_s_per_gpu;
    else if (strcmp(metric, "step_time_s") == 0)
      r->predicted = res.step_time_s;
    else
      r->predicted = ((double)res.peak_mem_bytes - j->c.gpu.runtime_overhead_gib * 1073741824.0) /
                     1073741824.0;
  }
  free(j);
  return st;
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
  char dir[1024];
  snprintf(dir, sizeof dir, "%s", path);
  char *slash = strrchr(dir, '/');
  if (slash) *slash = '\0';
  else dir[0] = '\0';
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
    mp_status st = run_row(ctx, where, dir, &h, f, nf, &rows[n]);
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
  printf("%-30s %-22s %5s %12s %12s %8s\n", "case", "metric", "mb", "predicted", "published",
         "error");
  for (int i = 0; i < n; i++) {
    char mb[24];
    snprintf(mb, sizeof mb, "%lld%s", (long long)rows[i].micro_batch, rows[i].picked ? "*" : "");
    printf("%-30s %-22s %5s %12.4g %12.4g %+7.1f%%\n", rows[i].name, rows[i].metric, mb,
           rows[i].predicted, rows[i].measured,
           100.0 * (rows[i].predicted - rows[i].measured) / rows[i].measured);
  }
  printf("(mb: the micro-batch simulated; * the fastest that fits among the divisors of "
         "local_batch, none being published)\n");
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
