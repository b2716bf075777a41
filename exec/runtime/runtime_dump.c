/* The training runtime: inspection of the rank's shards and full-tensor dumps
 * (runtime_internal.h lists the runtime's files). */
#include "exec/runtime/runtime_internal.h"

int64_t mp_runtime_param_tile(const mp_runtime *rt, int i, int64_t off[MP_MAX_NDIM], int64_t len[MP_MAX_NDIM]) {
  memcpy(off, rt->prm[i].off, sizeof rt->prm[i].off);
  memcpy(len, rt->prm[i].len, sizeof rt->prm[i].len);
  return rt->prm[i].numel;
}

mp_status mp_runtime_read_param(mp_ctx *ctx, const mp_runtime *rt, int i, float *dst) {
  if (rt->prm[i].numel) BE(memcpy_d2h(rt->kc, dst, rt->prm[i].w, (size_t)rt->prm[i].numel * sizeof(float)));
  return MP_OK;
}

static float *state_ptr(const rt_param *r, mp_state_kind k) {
  return k == MP_STATE_PARAM ? r->w : k == MP_STATE_EXP_AVG ? r->m : r->v;
}

mp_status mp_runtime_read_state(mp_ctx *ctx, const mp_runtime *rt, int i, mp_state_kind k, float *dst) {
  const rt_param *r = &rt->prm[i];
  if (r->numel) BE(memcpy_d2h(rt->kc, dst, state_ptr(r, k), (size_t)r->numel * sizeof(float)));
  return MP_OK;
}

mp_status mp_runtime_write_state(mp_ctx *ctx, mp_runtime *rt, int i, mp_state_kind k, const float *src) {
  rt_param *r = &rt->prm[i];
  if (!r->numel) return MP_OK;
  BE(memcpy_h2d(rt->kc, state_ptr(r, k), src, (size_t)r->numel * sizeof(float)));
  if (k != MP_STATE_PARAM) return MP_OK;
  /* a resident compute copy follows its master, as after an optimizer step */
  if (r->cw && r->cw != (void *)r->w && !r->sharded) BE(x_from_f32(rt->kc, r->cw, r->w, (size_t)r->numel_pad));
  r->f8w_valid = 0;
  return MP_OK;
}

int mp_runtime_param_owner(const mp_runtime *rt, int i) { return rt->prm[i].owner && rt->prm[i].numel > 0; }

const mp_plan *mp_runtime_plan(const mp_runtime *rt) { return rt->plan; }

mp_comm *mp_runtime_comm(const mp_runtime *rt) { return rt->comm; }

void mp_runtime_set_lr(mp_runtime *rt, float lr) { rt->opts.lr = lr; }

mp_status mp_runtime_agree(mp_ctx *ctx, mp_runtime *rt, mp_status local, const char *what) {
  if (mp_comm_world_size(rt->comm) == 1) return local;
  int64_t v = (int64_t)local;
  mp_ctx c2;
  mp_ctx_init(&c2);
  mp_status st = mp_runtime_host_all_reduce(&c2, rt, MP_GROUP_WORLD, &v, 1, MP_COMM_DTYPE_INT64, MP_COMM_OP_MAX);
  if (st != MP_OK) return local != MP_OK ? local : mp_error(ctx, st, "%s", mp_errmsg(&c2));
  if (local != MP_OK) return local;
  if (v != MP_OK) return mp_error(ctx, (mp_status)v, "%s failed on another rank (its message names the cause)", what);
  return MP_OK;
}

int64_t mp_runtime_steps_done(const mp_runtime *rt) { return rt->step; }

void mp_runtime_set_steps_done(mp_runtime *rt, int64_t steps) { rt->step = steps; }

mp_status mp_runtime_read_grad(mp_ctx *ctx, const mp_runtime *rt, int i, float *dst) {
  if (rt->prm[i].numel) BE(memcpy_d2h(rt->kc, dst, rt->prm[i].g, (size_t)rt->prm[i].numel * sizeof(float)));
  return MP_OK;
}

/* Full tensors from the shards: each owner writes its tile into a zeroed full-size buffer
 * and a world all-reduce (sum) assembles them; replicas contribute zeros, so the result
 * is exact. A tied model's head copy under a pipeline is the embedding (its gradient the
 * sum both stages hold): it is dumped once, under the embedding's name. Collective: every rank calls it; w is filled on every rank. */
mp_status mp_runtime_dump(mp_ctx *ctx, const mp_runtime *rt, int grads, mp_wfile *w) {
  for (int i = 0; i < rt->plan->n_params; i++) {
    const mp_param *p = &rt->plan->params[i];
    const rt_param *r = &rt->prm[i];
    const int64_t n = mp_param_numel(p);
    if (p->tied_copy) continue; /* the last stage's copy of the embedding: the same tensor */
    float *full = calloc((size_t)n, sizeof(float)), *tile = malloc((size_t)(r->numel ? r->numel : 1) * sizeof(float));
    mp_status st = MP_OK;
    if (!full || !tile) st = mp_error(ctx, MP_ERR_NOMEM, "dump: out of memory for %s", p->fqn);
    if (st == MP_OK && r->owner && r->numel) {
      st = grads ? mp_runtime_read_grad(ctx, rt, i, tile) : mp_runtime_read_param(ctx, rt, i, tile);
      const int64_t d1 = p->ndim > 1 ? p->shape[1] : 1, d2 = p->ndim > 2 ? p->shape[2] : 1;
      const int64_t l1 = p->ndim > 1 ? r->len[1] : 1, l2 = p->ndim > 2 ? r->len[2] : 1;
      const int64_t o1 = p->ndim > 1 ? r->off[1] : 0, o2 = p->ndim > 2 ? r->off[2] : 0;
      int64_t t = 0;
      for (int64_t a = 0; a < r->len[0]; a++)
        for (int64_t b = 0; b < l1; b++)
          for (int64_t c = 0; c < l2; c++) full[((r->off[0] + a) * d1 + o1 + b) * d2 + o2 + c] = tile[t++];
    }
    if (st == MP_OK && mp_comm_world_size(rt->comm) > 1) {
      void *dev = NULL; /* a GPU comm needs the tensor in device memory */
      const size_t db = 2 * (size_t)mp_act_align64(n * (int64_t)sizeof(float));
      if (!rt->host_mem) st = mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, db, &dev);
      if (st == MP_OK)
        st = mp_rt_host_coll(ctx, (mp_runtime *)rt, MP_GROUP_WORLD, full, NULL, (size_t)n, MP_COMM_DTYPE_FP32,
                             MP_COMM_OP_SUM, dev);
      if (dev) {
        mp_status s2 = mp_talloc_free(ctx, rt->ta, dev);
        if (st == MP_OK) st = s2;
      }
    }
    if (st == MP_OK) st = mp_wfile_add(ctx, w, p->fqn, p->ndim, p->shape, full);
    free(full);
    free(tile);
    MP_CHECK(st);
  }
  return MP_OK;
}

mp_status mp_runtime_dump_init(mp_ctx *ctx, const mp_plan *plan, uint64_t seed, mp_wfile *w) {
  for (int i = 0; i < plan->n_params; i++) {
    const mp_param *p = &plan->params[i];
    if (p->tied_copy) continue;
    int64_t off[MP_MAX_NDIM] = {0, 0, 0}, len[MP_MAX_NDIM] = {1, 1, 1};
    for (int d = 0; d < p->ndim; d++) len[d] = p->shape[d];
    float *buf = malloc((size_t)mp_param_numel(p) * sizeof(float));
    MP_CHECK_ALLOC(ctx, buf);
    mp_init_fill_block(seed, p, off, len, buf);
    mp_status st = mp_wfile_add(ctx, w, p->fqn, p->ndim, p->shape, buf);
    free(buf);
    MP_CHECK(st);
  }
  return MP_OK;
}
