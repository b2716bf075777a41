/* Plan IR: where a parameter's pieces live (its TP tile, its FSDP tile at rest on a rank),
 * per-rank totals and the batch split into micro-batches; the invariants they rely on are
 * plan.c's. */
#include "exec/plan.h"

#include <stdio.h>
#include <string.h>

/* ---- tiles --------------------------------------------------------------------------- */

int64_t mp_param_numel(const mp_param *prm) {
  int64_t n = 1;
  for (int i = 0; i < prm->ndim; i++) n *= prm->shape[i];
  return n;
}

int64_t mp_param_tp_numel(const mp_param *prm) {
  int64_t n = 1;
  for (int i = 0; i < prm->ndim; i++) n *= prm->tp_shape[i];
  return n;
}

int64_t mp_fsdp_chunk_rows(int64_t rows, int gsize) { return (rows + gsize - 1) / gsize; }

int64_t mp_param_padded_shard_numel(const mp_param *prm, int gsize) {
  int64_t row_numel = 1; /* elements per row of dim 0, without dividing */
  for (int d = 1; d < prm->ndim; d++) row_numel *= prm->tp_shape[d];
  return mp_fsdp_chunk_rows(prm->tp_shape[0], gsize) * row_numel;
}

/* A rank's place in the mesh as the tile math needs it, computed once per rank (the
 * totals ask it for every parameter). */
typedef struct rank_pos {
  int stage, tp, ep;
  int etp;              /* index in MP_GROUP_ETP: where a routed expert's tp split is read */
  int fsdp_i, fsdp_g;   /* index in and size of MP_GROUP_FSDP */
  int efsdp_i, efsdp_g; /* index in and size of MP_GROUP_EFSDP */
} rank_pos;

static void rank_pos_of(const mp_plan *p, int rank, rank_pos *r) {
  int c[MP_MESH_NDIMS];
  mp_mesh_coords(&p->mesh, rank, c);
  r->stage = c[MP_DIM_PP];
  r->tp = c[MP_DIM_TP];
  r->ep = mp_mesh_ep_index(&p->mesh, rank);
  r->etp = mp_mesh_group_index(&p->mesh, MP_GROUP_ETP, rank);
  r->fsdp_i = mp_mesh_group_index(&p->mesh, MP_GROUP_FSDP, rank);
  r->fsdp_g = mp_mesh_group_size(&p->mesh, MP_GROUP_FSDP);
  r->efsdp_i = mp_mesh_group_index(&p->mesh, MP_GROUP_EFSDP, rank);
  r->efsdp_g = mp_mesh_group_size(&p->mesh, MP_GROUP_EFSDP);
}

static void tp_tile_at(const mp_param *prm, const rank_pos *r, int64_t off[MP_MAX_NDIM],
                       int64_t len[MP_MAX_NDIM]) {
  for (int i = 0; i < MP_MAX_NDIM; i++) {
    off[i] = 0;
    len[i] = prm->tp_shape[i];
  }
  const mp_placement *tp = &prm->place[MP_AXIS_TP];
  if (tp->kind == MP_PLACEMENT_SHARD)
    off[tp->dim] = (int64_t)(prm->is_expert ? r->etp : r->tp) * prm->tp_shape[tp->dim];
  const mp_placement *ep = &prm->place[MP_AXIS_EP];
  if (ep->kind == MP_PLACEMENT_SHARD) off[ep->dim] = (int64_t)r->ep * prm->tp_shape[ep->dim];
}

static int tile_at(const mp_param *prm, const rank_pos *r, int64_t off[MP_MAX_NDIM],
                   int64_t len[MP_MAX_NDIM]) {
  tp_tile_at(prm, r, off, len);
  if (prm->pp_stage != r->stage) {
    for (int i = 0; i < MP_MAX_NDIM; i++) len[i] = 0;
    return 0;
  }
  if (prm->place[MP_AXIS_FSDP].kind == MP_PLACEMENT_SHARD) {
    const int efsdp = prm->fsdp_group == MP_GROUP_EFSDP;
    int g = efsdp ? r->efsdp_g : r->fsdp_g;
    int i = efsdp ? r->efsdp_i : r->fsdp_i;
    int64_t rows = prm->tp_shape[0], chunk = mp_fsdp_chunk_rows(rows, g);
    int64_t start = (int64_t)i * chunk, end = start + chunk;
    if (end > rows) end = rows;
    if (start >= end) {
      for (int k = 0; k < MP_MAX_NDIM; k++) len[k] = 0;
      return 0;
    }
    off[0] += start;
    len[0] = end - start;
  }
  return 1;
}

void mp_param_tp_tile(const mp_plan *p, const mp_param *prm, int rank, int64_t off[MP_MAX_NDIM],
                      int64_t len[MP_MAX_NDIM]) {
  rank_pos r;
  rank_pos_of(p, rank, &r);
  tp_tile_at(prm, &r, off, len);
}

int mp_param_tile(const mp_plan *p, const mp_param *prm, int rank, int64_t off[MP_MAX_NDIM],
                  int64_t len[MP_MAX_NDIM]) {
  rank_pos r;
  rank_pos_of(p, rank, &r);
  return tile_at(prm, &r, off, len);
}

static int64_t local_numel_at(const mp_param *prm, const rank_pos *r) {
  int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM];
  if (!tile_at(prm, r, off, len)) return 0;
  int64_t n = 1;
  for (int i = 0; i < prm->ndim; i++) n *= len[i];
  return n;
}

int64_t mp_param_local_numel(const mp_plan *p, const mp_param *prm, int rank) {
  rank_pos r;
  rank_pos_of(p, rank, &r);
  return local_numel_at(prm, &r);
}

int mp_plan_find_param(const mp_plan *p, const char *fqn) {
  for (int i = 0; i < p->n_params; i++)
    if (strcmp(p->params[i].fqn, fqn) == 0) return i;
  return -1;
}

/* ---- totals and batch ---------------------------------------------------------------- */

void mp_plan_rank_totals(const mp_plan *p, int rank, mp_plan_totals *out) {
  memset(out, 0, sizeof *out);
  rank_pos r;
  rank_pos_of(p, rank, &r);
  for (int i = 0; i < p->n_params; i++) out->params_numel += local_numel_at(&p->params[i], &r);
  const int64_t mb = mp_dtype_bytes(p->opts.master_dtype);
  out->param_bytes = out->params_numel * mb;
  out->grad_bytes = out->params_numel * mb;
  out->optimizer_bytes = mp_plan_adamw_moment_bytes(&p->opts, out->params_numel);
  if (!(p->applied & MP_PASS_FSDP)) return;
  const int stage = r.stage;
  const int64_t pb = mp_dtype_bytes(p->opts.fsdp.param_dtype);
  for (int u = 0; u < p->n_units; u++) {
    int64_t n = 0;
    for (int k = 0; k < p->units[u].n_params; k++) {
      const mp_param *prm = &p->params[p->units[u].params[k]];
      if (prm->pp_stage == stage) n += mp_param_tp_numel(prm);
    }
    if (n * pb > out->max_unit_gathered_bytes) out->max_unit_gathered_bytes = n * pb;
  }
}

mp_status mp_plan_batch(mp_ctx *ctx, const mp_plan *p, int64_t *local_batch, int64_t *n_micro) {
  const int64_t dp = (int64_t)p->mesh.size[MP_DIM_DP_REPLICATE] * p->mesh.size[MP_DIM_DP_SHARD];
  const int64_t gb = p->opts.global_batch, mb = p->opts.micro_batch;
  if (mb < 1 || gb < 1)
    return mp_error(ctx, MP_ERR_INVALID,
                    "micro_batch=%lld and global_batch=%lld must both be at least 1",
                    (long long)mb, (long long)gb);
  if (gb % dp != 0)
    return mp_error(ctx, MP_ERR_INVALID,
                    "global_batch=%lld does not divide over the %lld data-parallel ranks "
                    "(dp_replicate x dp_shard); choose a multiple of %lld",
                    (long long)gb, (long long)dp, (long long)dp);
  const int64_t local = gb / dp;
  if (local % mb != 0)
    return mp_error(ctx, MP_ERR_INVALID,
                    "the %lld sequences per data-parallel rank (global_batch=%lld / %lld ranks) "
                    "do not divide into micro-batches of %lld; choose micro_batch dividing %lld",
                    (long long)local, (long long)gb, (long long)dp, (long long)mb,
                    (long long)local);
  const int pp = p->mesh.size[MP_DIM_PP];
  /* a multiple of pp where the stack's schedule needs it: mp_pp_order, which knows it; the
   * zero-bubble schedules take fewer (torch's rounds of max(1, m / pp), ZBV's padding) */
  if (mp_plan_virtual_stages(p) > 1 && p->opts.pp_schedule == MP_PP_INTERLEAVED && local / mb < pp)
    return mp_error(ctx, MP_ERR_INVALID,
                    "the interleaved schedule runs micro-batches in groups of pp=%d, but %lld "
                    "sequences per rank in micro-batches of %lld make %lld; choose a batch giving "
                    "at least %d micro-batches (a multiple of %d under torch.distributed.pipelining)",
                    pp, (long long)local, (long long)mb, (long long)(local / mb), pp, pp);
  *local_batch = local;
  *n_micro = local / mb;
  return MP_OK;
}
