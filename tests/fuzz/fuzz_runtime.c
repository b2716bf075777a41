/* The runtime's functions that the readers call, over the real plan (see fuzz_runtime.h). */
#include "tests/fuzz/fuzz_runtime.h"

#include <string.h>

int64_t mp_runtime_param_tile(const mp_runtime *rt, int i, int64_t off[MP_MAX_NDIM], int64_t len[MP_MAX_NDIM]) {
  const mp_param *p = &rt->plan->params[i];
  if (!mp_param_tile(rt->plan, p, rt->rank, off, len)) return 0;
  int64_t n = 1;
  for (int d = 0; d < p->ndim; d++) n *= len[d];
  return n;
}

mp_status mp_runtime_write_state(mp_ctx *ctx, mp_runtime *rt, int i, mp_state_kind k, const float *src) {
  (void)ctx;
  int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM];
  const int64_t n = mp_runtime_param_tile(rt, i, off, len);
  if (n && rt->on_write) rt->on_write(rt, i, k, off, len, src, rt->arg);
  return MP_OK;
}

const mp_plan *mp_runtime_plan(const mp_runtime *rt) { return rt->plan; }


mp_status mp_runtime_agree(mp_ctx *ctx, mp_runtime *rt, mp_status local, const char *what) {
  (void)ctx, (void)rt, (void)what;
  return local;
}

void mp_runtime_set_steps_done(mp_runtime *rt, int64_t steps) { rt->steps = steps; }

mp_status fuzz_runtime_plan(mp_ctx *ctx, const char *model_json, const char *mesh_spec, int world, mp_plan **out) {
  mp_model m;
  mp_mesh mesh;
  MP_CHECK(mp_model_from_text(ctx, model_json, "fuzz model", &m));
  MP_CHECK(mp_mesh_parse(ctx, mesh_spec, world, &mesh));
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.seq = m.max_seq;
  o.micro_batch = 1;
  o.global_batch = world;
  return mp_build_plan(ctx, &m, &mesh, &o, out);
}
