/* meshplan validate: predictions against published measurements.
 *
 * Reads rows in the format of shared/validation/published_dev.csv (validate_csv.h reads
 * and range-checks them). Each row names a model (data/models), a GPU (data/gpus) with gpus, gpus_per_node and
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
#include "planner/cli/validate_csv.h"
#include "sim/sim.h"
#include "sim/stack.h"

static mp_opt k_opts[] = {
    MP_OPT_END,
};

static mp_cmd_spec k_spec = {"validate",
                             "Compare predictions with published measurements (CSV rows).",
                             "FILE.csv", k_opts, 1};

typedef struct row {
  char name[96];
  char metric[32];
  double measured, predicted;
} row;

/* Simulates one row; r gets the figure of the row's metric beside the published one. */
static mp_status run_row(mp_ctx *ctx, const char *where, const mp_vrow *v, row *r) {
  snprintf(r->name, sizeof r->name, "%s", v->name);
  snprintf(r->metric, sizeof r->metric, "%s", v->metric);
  r->measured = v->value;

  mp_model m;
  mp_cluster c;
  mp_stack_profile prof;
  MP_CHECK(mp_model_load(ctx, v->model, &m));
  MP_CHECK(mp_cluster_make(ctx, v->gpu, v->gpus, v->gpus_per_node, &c));
  if (v->inter_node_gbps > 0) c.inter_node_Gbitps_per_gpu = v->inter_node_gbps;
  MP_CHECK(mp_stack_load(ctx, v->stack, &prof));

  mp_mesh mesh;
  mp_mesh_init(&mesh);
  mesh.size[MP_DIM_PP] = (int)v->pp;
  mesh.size[MP_DIM_DP_REPLICATE] = (int)v->dp_replicate;
  mesh.size[MP_DIM_DP_SHARD] = (int)v->dp_shard;
  mesh.size[MP_DIM_CP] = (int)v->cp;
  mesh.size[MP_DIM_TP] = (int)v->tp;
  mesh.ep = (int)v->ep;
  MP_CHECK(mp_mesh_validate(ctx, &mesh));
  if (mp_mesh_world(&mesh) != v->gpus)
    return mp_error(ctx, MP_ERR_INVALID, "%s: the mesh has %d ranks but gpus = %lld", where,
                    mp_mesh_world(&mesh), (long long)v->gpus);

  mp_plan_options o;
  mp_plan_options_init(&o);
  MP_CHECK(mp_ac_mode_parse(ctx, v->ac, &o.ac));
  o.fp8 = v->fp8;
  const char *pps = v->pp_schedule;
  if (pps[0] == '\0' || strcmp(pps, "1f1b") == 0) o.pp_schedule = MP_PP_1F1B;
  else if (strcmp(pps, "interleaved") == 0) o.pp_schedule = MP_PP_INTERLEAVED, o.pp_virtual = 2;
  else if (strcmp(pps, "gpipe") == 0) o.pp_schedule = MP_PP_GPIPE;
  else return mp_error(ctx, MP_ERR_INVALID, "%s: pp_schedule '%s': expected 1f1b, interleaved or gpipe", where, pps);
  o.seq = v->seq;
  o.micro_batch = v->micro_batch;
  o.global_batch = v->global_batch;

  mp_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.cluster = &c;
  cfg.stack = &prof;
  mp_sim_result res;
  MP_CHECK(mp_simulate_plan(ctx, &m, &mesh, &o, &cfg, &res));
  if (strcmp(v->metric, "tokens_per_s_per_gpu") == 0)
    r->predicted = res.tokens_per_s_per_gpu;
  else if (strcmp(v->metric, "step_time_s") == 0)
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

/* Reads the CSV text (split in place: validate_csv.h) and simulates every row into
 * rows[0..*n); the first bad row is an error naming it (path, line and case). */
static mp_status read_rows(mp_ctx *ctx, const char *path, char *text, row *rows, int *n_out) {
  mp_vrow *v = NULL;
  int n = 0;
  MP_CHECK(mp_vcsv_read(ctx, text, path, &v, &n));
  mp_status st = MP_OK;
  for (int i = 0; i < n && st == MP_OK; i++) {
    char where[512];
    snprintf(where, sizeof where, "%s line %d (row '%s')", path, v[i].line, v[i].name);
    st = run_row(ctx, where, &v[i], &rows[i]);
    if (st != MP_OK) {
      if (strncmp(mp_errmsg(ctx), where, strlen(where)) != 0) mp_error_prefix(ctx, "%s", where);
      if (st != MP_ERR_NOMEM && st != MP_ERR_INTERNAL) st = MP_ERR_INVALID;
    }
  }
  free(v);
  if (st == MP_OK) *n_out = n;
  return st;
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
  if (call->n_pos != 1)
    return mp_cmd_fail(ctx, mp_error(ctx, MP_ERR_USAGE, "give one CSV file (see meshplan validate --help)"));
  const char *path = call->pos[0];
  char *text = NULL;
  size_t len = 0;
  mp_status st = mp_read_file_max(ctx, path, MP_FILE_MAX_CONFIG_BYTES, &text, &len);
  if (st != MP_OK) return mp_cmd_fail(ctx, st);
  row *rows = (row *)calloc(MP_VCSV_MAX_ROWS, sizeof *rows);
  if (rows == NULL) {
    free(text);
    return mp_cmd_fail(ctx, mp_error(ctx, MP_ERR_NOMEM, "out of memory"));
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
