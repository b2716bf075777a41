/* validate's CSV rows (see validate_csv.h). */
#include "app/validate_csv.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "common/validate.h"

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

/* One row being read: the header's names, the row's fields, where it is. */
typedef struct reader {
  mp_ctx *ctx;
  char *const *hdr;
  int n_hdr;
  char **f;
  int nf;
  const char *where; /* "path line N (row 'case')" */
} reader;

static const char *field(const reader *r, const char *name) {
  for (int i = 0; i < r->n_hdr && i < r->nf; i++)
    if (strcmp(r->hdr[i], name) == 0) return r->f[i];
  return NULL;
}

static mp_status need(const reader *r, const char *name, const char **out) {
  *out = field(r, name);
  if (*out == NULL)
    return mp_error(r->ctx, MP_ERR_INVALID, "%s: no column '%s'; the header must name it", r->where, name);
  return MP_OK;
}

static mp_status need_str(const reader *r, const char *name, int may_be_empty, char *out, size_t cap) {
  const char *v;
  MP_CHECK(need(r, name, &v));
  if (!may_be_empty && v[0] == '\0')
    return mp_error(r->ctx, MP_ERR_INVALID, "%s: column '%s' is empty", r->where, name);
  if (strlen(v) >= cap)
    return mp_error(r->ctx, MP_ERR_INVALID, "%s: column '%s' is longer than %zu characters", r->where, name,
                    cap - 1);
  memcpy(out, v, strlen(v) + 1);
  return MP_OK;
}

/* An optional text column into out: "" when absent or empty. */
static mp_status opt_str(const reader *r, const char *name, char *out, size_t cap) {
  out[0] = '\0';
  const char *v = field(r, name);
  return v && v[0] ? need_str(r, name, 1, out, cap) : MP_OK;
}

/* An integer in lo..hi. */
static mp_status int_in(const reader *r, const char *name, const char *v, int64_t lo, int64_t hi,
                        int64_t *out) {
  char *end = NULL;
  errno = 0;
  long long x = strtoll(v, &end, 10);
  if (end == v || *end != '\0' || errno != 0 || x < lo || x > hi)
    return mp_error(r->ctx, MP_ERR_INVALID, "%s: column '%s' = '%s': expected an integer in %lld..%lld", r->where,
                    name, v, (long long)lo, (long long)hi);
  *out = x;
  return MP_OK;
}

static mp_status need_int(const reader *r, const char *name, int64_t lo, int64_t hi, int64_t *out) {
  const char *v;
  MP_CHECK(need(r, name, &v));
  return int_in(r, name, v, lo, hi, out);
}

/* An optional integer in lo..hi: `absent` where the column is absent or empty. */
static mp_status opt_int(const reader *r, const char *name, int64_t lo, int64_t hi, int64_t absent, int64_t *out) {
  *out = absent;
  const char *v = field(r, name);
  return v && v[0] ? int_in(r, name, v, lo, hi, out) : MP_OK;
}

/* An optional 0/1 column: -1 where it is absent or empty. */
static mp_status opt_flag(const reader *r, const char *name, int *out) {
  *out = -1;
  const char *v = field(r, name);
  if (!v || !v[0]) return MP_OK;
  int64_t x = 0;
  MP_CHECK(int_in(r, name, v, 0, 1, &x));
  *out = (int)x;
  return MP_OK;
}

/* A finite number in (lo, hi]: strtod reads "nan" and "inf", and 1e999 as inf. */
static mp_status positive_in(const reader *r, const char *name, const char *v, double lo, double hi,
                             double *out) {
  char *end = NULL;
  errno = 0;
  double x = strtod(v, &end);
  if (end == v || *end != '\0' || errno != 0 || !isfinite(x) || !(x > lo && x <= hi)) {
    char range[96];
    mp_range_f64_str(lo, hi, MP_RANGE_OPEN_LO, range, sizeof range);
    return mp_error(r->ctx, MP_ERR_INVALID, "%s: column '%s' = '%s': expected a finite number in %s", r->where,
                    name, v, range);
  }
  *out = x;
  return MP_OK;
}

/* An optional number in (0, MP_LIM_MOE_LOAD], at least `least`: 0 where absent or empty. */
static mp_status opt_real(const reader *r, const char *name, double least, double *out) {
  *out = 0.0;
  const char *v = field(r, name);
  if (!v || !v[0]) return MP_OK;
  MP_CHECK(positive_in(r, name, v, 0.0, MP_LIM_MOE_LOAD, out));
  if (*out < least)
    return mp_error(r->ctx, MP_ERR_INVALID, "%s: column '%s' = '%s': expected at least %g", r->where, name, v, least);
  return MP_OK;
}

/* local_batch is one data-parallel rank's share of global_batch, and the data-parallel ranks
 * are dp_replicate x dp_shard (tp, pp and cp ranks work on the same sequences; ep is carved
 * out of the data-parallel ranks): a row whose three numbers disagree states two batches,
 * and the simulator would take one of them without a word. Division, not a product that
 * could leave int64 (2^24 x 2^20 x 2^20). */
static mp_status check_batch(const reader *r, const mp_vrow *row) {
  const int64_t dp = row->dp_replicate * row->dp_shard; /* each at most 2^20 */
  if (row->global_batch % dp == 0 && row->global_batch / dp == row->local_batch) return MP_OK;
  return mp_error(r->ctx, MP_ERR_INVALID,
                  "%s: local_batch %lld x %lld data-parallel ranks (dp_replicate %lld x dp_shard %lld) "
                  "is not global_batch %lld; the rule is global_batch = local_batch x dp_replicate x "
                  "dp_shard (local_batch: sequences per data-parallel rank); fix the row",
                  r->where, (long long)row->local_batch, (long long)dp, (long long)row->dp_replicate,
                  (long long)row->dp_shard, (long long)row->global_batch);
}

/* The optional columns of how Megatron-LM runs the step: its fused cross-entropy and the
 * kernels it runs, its DDP's
 * bucket scaling, NaN check and bucket size, Megatron-Core's CUDA graphs, its EP communication
 * overlap, its NCCL communicators' CTA caps, Transformer Engine's userbuffers config. */
static mp_status read_megatron_run(const reader *r, mp_vrow *row) {
  MP_CHECK(opt_flag(r, "ce_fusion", &row->ce_fusion));
  MP_CHECK(opt_str(r, "ce_fusion_impl", row->ce_fusion_impl, sizeof row->ce_fusion_impl));
  if (row->ce_fusion_impl[0] && row->ce_fusion != 1)
    return mp_error(r->ctx, MP_ERR_INVALID, "%s: ce_fusion_impl %s picks the kernels of the fused "
                    "cross-entropy: state ce_fusion 1, or empty the column", r->where, row->ce_fusion_impl);
  MP_CHECK(opt_flag(r, "ddp_average_in_collective", &row->ddp_average_in_collective));
  MP_CHECK(opt_flag(r, "ddp_check_grads", &row->ddp_check_grads));
  MP_CHECK(opt_flag(r, "ddp_align_param_gather", &row->ddp_align_param_gather));
  MP_CHECK(opt_flag(r, "grad_accum_fusion", &row->grad_accum_fusion));
  MP_CHECK(opt_flag(r, "overlap_moe_comm", &row->overlap_moe_comm));
  MP_CHECK(opt_int(r, "ddp_bucket_size", 1, MP_LIM_PARAMS, 0, &row->ddp_bucket_size));
  MP_CHECK(opt_str(r, "nccl_ctas", row->nccl_ctas, sizeof row->nccl_ctas));
  MP_CHECK(opt_str(r, "ub_cfg", row->ub_cfg, sizeof row->ub_cfg));
  return opt_str(r, "cuda_graphs", row->cuda_graphs, sizeof row->cuda_graphs);
}

/* nvlink_domain: empty or absent 0 (the node); else whole nodes of gpus_per_node GPUs. */
static mp_status read_nvlink_domain(const reader *r, mp_vrow *row) {
  row->nvlink_domain = 0;
  const char *d = field(r, "nvlink_domain");
  if (!d || !d[0]) return MP_OK;
  MP_CHECK(int_in(r, "nvlink_domain", d, 1, MP_LIM_GPUS, &row->nvlink_domain));
  if (row->nvlink_domain % row->gpus_per_node)
    return mp_error(r->ctx, MP_ERR_INVALID, "%s: nvlink_domain %lld is not a whole number of nodes of "
                    "gpus_per_node %lld", r->where, (long long)row->nvlink_domain, (long long)row->gpus_per_node);
  return MP_OK;
}

/* The layer-count columns: the MTP modules (-1 where empty: the model's) and the layers CPU
 * offloading copies (0 where empty), bounded here to an int; the model and the plan bound them
 * by its layers. */
static mp_status read_layer_counts(const reader *r, mp_vrow *row) {
  MP_CHECK(opt_int(r, "mtp_layers", 0, INT32_MAX, -1, &row->mtp_layers));
  return opt_int(r, "cpu_offload_layers", 0, INT32_MAX, 0, &row->cpu_offload_layers);
}

/* The FSDP columns: Megatron FSDP's strategy and double buffer, FSDP1's flat parameters and
 * the gradients' reduce dtype. */
static mp_status read_fsdp(const reader *r, mp_vrow *row) {
  MP_CHECK(opt_str(r, "mfsdp_strategy", row->mfsdp_strategy, sizeof row->mfsdp_strategy));
  MP_CHECK(opt_flag(r, "fsdp_double_buffer", &row->fsdp_double_buffer));
  MP_CHECK(opt_flag(r, "fsdp_flat_params", &row->fsdp_flat_params));
  return opt_str(r, "fsdp_reduce_dtype", row->fsdp_reduce_dtype, sizeof row->fsdp_reduce_dtype);
}

/* The experts' load: moe_imbalance, moe_capacity_factor and moe_pad_to_capacity, the padding
 * only with a capacity (Megatron-Core's --moe-pad-expert-input-to-capacity), and
 * moe_rank_capacity_factor (HybridEP's budget; the plan checks it: exec/rules.c). */
static mp_status moe_routing_cols(const reader *r, mp_vrow *row) {
  MP_CHECK(opt_real(r, "moe_imbalance", 1.0, &row->moe_imbalance));
  MP_CHECK(opt_real(r, "moe_capacity_factor", 0.0, &row->moe_capacity_factor));
  MP_CHECK(opt_real(r, "moe_rank_capacity_factor", 0.0, &row->moe_rank_capacity_factor));
  MP_CHECK(opt_flag(r, "moe_pad_to_capacity", &row->moe_pad_to_capacity));
  if (row->moe_pad_to_capacity == 1 && !(row->moe_capacity_factor > 0.0))
    return mp_error(r->ctx, MP_ERR_INVALID, "%s: moe_pad_to_capacity 1 pads each expert's input to its capacity: "
                    "state moe_capacity_factor too", r->where);
  return MP_OK;
}

static mp_status read_row(const reader *r, mp_vrow *row) {
  const char *v;
  MP_CHECK(need_str(r, "model", 0, row->model, sizeof row->model));
  MP_CHECK(need_str(r, "gpu", 0, row->gpu, sizeof row->gpu));
  MP_CHECK(need_str(r, "stack", 0, row->stack, sizeof row->stack));
  MP_CHECK(need_str(r, "metric", 0, row->metric, sizeof row->metric));
  if (strcmp(row->metric, "tokens_per_s_per_gpu") != 0 && strcmp(row->metric, "peak_mem_gib") != 0 &&
      strcmp(row->metric, "step_time_s") != 0)
    return mp_error(r->ctx, MP_ERR_INVALID,
                    "%s: metric '%s': expected tokens_per_s_per_gpu, peak_mem_gib or step_time_s", r->where,
                    row->metric);
  MP_CHECK(need(r, "value", &v));
  /* published figures: tokens/s per GPU below 1e7, memory below 1e5 GiB, step times below
   * a day; 1e15 bounds them all */
  MP_CHECK(positive_in(r, "value", v, 0, 1e15, &row->value));
  MP_CHECK(need_str(r, "ac", 0, row->ac, sizeof row->ac));
  MP_CHECK(need_str(r, "pp_schedule", 1, row->pp_schedule, sizeof row->pp_schedule));
  MP_CHECK(need(r, "inter_node_gbps_per_gpu", &v));
  row->inter_node_gbps = 0;
  if (v[0]) MP_CHECK(positive_in(r, "inter_node_gbps_per_gpu", v, 0, MP_LIM_LINK_GBPS, &row->inter_node_gbps));
  MP_CHECK(need_int(r, "gpus", 1, MP_LIM_GPUS, &row->gpus));
  MP_CHECK(need_int(r, "gpus_per_node", 1, MP_LIM_GPUS_PER_NODE, &row->gpus_per_node));
  MP_CHECK(read_nvlink_domain(r, row));
  MP_CHECK(need_int(r, "dp_replicate", 1, MP_LIM_GPUS, &row->dp_replicate));
  MP_CHECK(need_int(r, "dp_shard", 1, MP_LIM_GPUS, &row->dp_shard));
  MP_CHECK(need_int(r, "tp", 1, MP_LIM_GPUS, &row->tp));
  MP_CHECK(need_int(r, "pp", 1, MP_LIM_GPUS, &row->pp));
  MP_CHECK(need_int(r, "cp", 1, MP_LIM_GPUS, &row->cp));
  MP_CHECK(need_int(r, "ep", 1, MP_LIM_GPUS, &row->ep));
  MP_CHECK(opt_int(r, "etp", 1, MP_LIM_GPUS, 0, &row->etp));
  MP_CHECK(opt_int(r, "dist_opt_instances", 1, MP_LIM_GPUS, 0, &row->dist_opt_instances));
  MP_CHECK(need_int(r, "seq", 1, MP_LIM_SEQ, &row->seq));
  MP_CHECK(need_int(r, "local_batch", 1, MP_LIM_GLOBAL_BATCH, &row->local_batch));
  MP_CHECK(need_int(r, "global_batch", 1, MP_LIM_GLOBAL_BATCH, &row->global_batch));
  MP_CHECK(check_batch(r, row));
  int64_t fp8 = 0;
  MP_CHECK(need_int(r, "fp8", 0, 1, &fp8));
  row->fp8 = (int)fp8;
  row->fp8_recipe[0] = '\0';
  const char *rec = field(r, "fp8_recipe");
  if (rec && rec[0]) {
    if (!row->fp8)
      return mp_error(r->ctx, MP_ERR_INVALID, "%s: fp8_recipe '%s' names a float8 recipe but fp8 is 0; "
                      "empty the column or set fp8 to 1", r->where, rec);
    MP_CHECK(need_str(r, "fp8_recipe", 1, row->fp8_recipe, sizeof row->fp8_recipe));
  }
  MP_CHECK(opt_str(r, "moe_dispatcher", row->moe_dispatcher, sizeof row->moe_dispatcher));
  MP_CHECK(opt_str(r, "cp_comm_type", row->cp_comm_type, sizeof row->cp_comm_type));
  MP_CHECK(opt_str(r, "cp_rotate", row->cp_rotate, sizeof row->cp_rotate));
  MP_CHECK(moe_routing_cols(r, row));
  row->micro_batch = 0;
  const char *mbs = field(r, "micro_batch");
  if (mbs && mbs[0]) {
    MP_CHECK(int_in(r, "micro_batch", mbs, 1, row->local_batch, &row->micro_batch));
    if (row->local_batch % row->micro_batch)
      return mp_error(r->ctx, MP_ERR_INVALID, "%s: micro_batch %lld must divide local_batch %lld", r->where,
                      (long long)row->micro_batch, (long long)row->local_batch);
  }
  MP_CHECK(opt_int(r, "pp_virtual", 1, MP_LIM_PP_VIRTUAL, 0, &row->pp_virtual));
  MP_CHECK(opt_str(r, "pp_layout", row->pp_layout, sizeof row->pp_layout));
  MP_CHECK(opt_flag(r, "sp", &row->sp));
  MP_CHECK(opt_flag(r, "moe_fp8_dispatch", &row->moe_fp8_dispatch));
  MP_CHECK(opt_flag(r, "fp8_act_cache", &row->fp8_act_cache));
  MP_CHECK(opt_int(r, "loss_chunks", 1, MP_LIM_SEQ, 0, &row->loss_chunks));
  MP_CHECK(read_layer_counts(r, row));
  MP_CHECK(opt_str(r, "optimizer_moments", row->optimizer_moments, sizeof row->optimizer_moments));
  MP_CHECK(read_fsdp(r, row));
  MP_CHECK(opt_flag(r, "fp8_param_gather", &row->fp8_param_gather));
  MP_CHECK(opt_flag(r, "fp8_all_gather", &row->fp8_all_gather));
  MP_CHECK(opt_flag(r, "nvfp4_rht", &row->nvfp4_rht));
  MP_CHECK(opt_flag(r, "fp8_dpa", &row->fp8_dpa));
  MP_CHECK(opt_flag(r, "fp8_amax_tp", &row->fp8_amax_tp));
  MP_CHECK(opt_str(r, "fp8_scope", row->fp8_scope, sizeof row->fp8_scope));
  MP_CHECK(read_megatron_run(r, row));
  MP_CHECK(opt_str(r, "recompute_modules", row->recompute_modules, sizeof row->recompute_modules));
  MP_CHECK(opt_str(r, "recompute_method", row->recompute_method, sizeof row->recompute_method));
  MP_CHECK(opt_int(r, "recompute_num_layers", 1, INT32_MAX, 0, &row->recompute_num_layers));
  MP_CHECK(opt_str(r, "nccl_version", row->nccl_version, sizeof row->nccl_version));
  return opt_flag(r, "async_tp", &row->async_tp);
}

mp_status mp_vcsv_read(mp_ctx *ctx, char *text, const char *origin, mp_vrow **rows_out, int *n_out) {
  *rows_out = NULL;
  *n_out = 0;
  char *hdr[MP_VCSV_MAX_COLS];
  int n_hdr = 0, n = 0, cap = 0, line_no = 0;
  mp_vrow *rows = NULL;
  mp_status st = MP_OK;
  /* lines by hand, not strtok: an empty line still counts for the line numbers */
  for (char *line = text, *next; line && st == MP_OK; line = next) {
    next = strchr(line, '\n');
    if (next) *next++ = '\0';
    line_no++;
    strip(line);
    if (line[0] == '#' || line[0] == '\0') continue;
    if (n_hdr == 0) {
      n_hdr = split_csv(line, hdr, MP_VCSV_MAX_COLS);
      continue;
    }
    if (n == MP_VCSV_MAX_ROWS) {
      st = mp_error(ctx, MP_ERR_INVALID, "%s: more than %d rows", origin, MP_VCSV_MAX_ROWS);
      break;
    }
    if (n == cap) {
      int ncap = cap ? 2 * cap : 16;
      mp_vrow *nr = realloc(rows, (size_t)ncap * sizeof *rows);
      if (nr == NULL) {
        free(rows);
        return mp_error(ctx, MP_ERR_NOMEM, "%s: out of memory", origin);
      }
      rows = nr;
      cap = ncap;
    }
    char *f[MP_VCSV_MAX_COLS];
    reader r = {ctx, hdr, n_hdr, f, split_csv(line, f, MP_VCSV_MAX_COLS), NULL};
    mp_vrow *row = &rows[n];
    memset(row, 0, sizeof *row);
    row->line = line_no;
    const char *name = field(&r, "case");
    snprintf(row->name, sizeof row->name, "%s", name && name[0] ? name : "?");
    char where[512];
    snprintf(where, sizeof where, "%s line %d (row '%s')", origin, line_no, row->name);
    r.where = where;
    st = read_row(&r, row);
    n++;
  }
  if (st == MP_OK && n == 0) st = mp_error(ctx, MP_ERR_INVALID, "%s: no data rows", origin);
  if (st != MP_OK) {
    free(rows);
    return st;
  }
  *rows_out = rows;
  *n_out = n;
  return MP_OK;
}
