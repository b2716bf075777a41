/* The training runtime: creation (the plan's dims on this rank, the activation layout, the
 * materialized shards, the resident tensors and the step program), destruction, and
 * collectives on host values. runtime.h states the step's semantics; runtime_internal.h
 * lists the runtime's files.
 *
 * Invariants: every byte is allocated through the tracked allocator (alloc.h), in the
 * categories the schedule's runtime memory models name; a rank allocates only its padded
 * shards (FSDP2's equal chunks); creation either returns a complete runtime or frees all. */
#include "exec/runtime/runtime_internal.h"
#include "exec/runtime/check.h"

#include <math.h>

void mp_runtime_options_init(mp_runtime_options *o) {
  memset(o, 0, sizeof *o);
  o->seed = 1234;
  o->lr = 1e-3f;
  o->beta1 = 0.9f;
  o->beta2 = 0.95f;
  o->eps = 1e-8f;
  o->weight_decay = 0.1f;
  o->max_grad_norm = 1.0f;
  o->decay_embeddings = 1;
}

/* A collective on host values (loss sums, norms, EP counts, dumps): straight to comm when
 * the backend's memory is host memory, else through device staging (a GPU comm takes
 * device buffers only). dev: a device buffer of at least count elements, or NULL for
 * rt->stage. op < 0: an all-to-all of `count` elements to every group rank instead
 * (send = buf, recv = rbuf, count per rank). */
mp_status mp_rt_host_coll(mp_ctx *ctx, mp_runtime *rt, mp_group g, void *buf, void *rbuf, size_t count,
                          mp_comm_dtype t, int op, void *dev) {
  const int gs = mp_comm_group_size(rt->comm, g);
  const size_t eb = mp_comm_dtype_bytes(t), total = op < 0 ? count * (size_t)gs : count;
  int64_t cnt[64], dsp[64];
  if (op < 0) {
    if (gs > 64) return mp_error(ctx, MP_ERR_UNSUPPORTED, "runtime: host all-to-all over more than 64 ranks");
    for (int j = 0; j < gs; j++) {
      cnt[j] = (int64_t)count;
      dsp[j] = (int64_t)count * j;
    }
  }
  if (rt->host_mem) {
    if (op < 0) return mp_comm_all_to_all_v(ctx, rt->comm, g, buf, cnt, dsp, rbuf, cnt, dsp, t);
    return mp_comm_all_reduce(ctx, rt->comm, g, buf, buf, count, t, (mp_comm_op)op);
  }
  char *d = dev ? dev : (char *)rt->stage;
  if (!dev && 2 * total * eb > STAGE_FLOATS * sizeof(float))
    return mp_error(ctx, MP_ERR_INTERNAL, "runtime: %zu bytes exceed the staging buffer", 2 * total * eb);
  char *d2 = d + mp_act_align64((int64_t)(total * eb));
  BE(memcpy_h2d(rt->kc, d, buf, total * eb));
  if (op < 0) {
    MP_CHECK(mp_comm_all_to_all_v(ctx, rt->comm, g, d, cnt, dsp, d2, cnt, dsp, t));
    MP_CHECK(mp_comm_synchronize(ctx, rt->comm));
    BE(memcpy_d2h(rt->kc, rbuf, d2, total * eb));
    return MP_OK;
  }
  MP_CHECK(mp_comm_all_reduce(ctx, rt->comm, g, d, d, count, t, (mp_comm_op)op));
  MP_CHECK(mp_comm_synchronize(ctx, rt->comm));
  BE(memcpy_d2h(rt->kc, buf, d, total * eb));
  return MP_OK;
}

/* The launched job matches the plan's mesh, and the runtime executes the plan
 * (exec/runtime/check.h). */
static mp_status check_supported(mp_ctx *ctx, const mp_plan *p, mp_comm *comm) {
  const mp_mesh *mesh = &p->mesh;
  char mb[128];
  mp_mesh_format(mesh, mb, sizeof mb);
  if (mp_mesh_world(mesh) != mp_comm_world_size(comm))
    return mp_error(ctx, MP_ERR_INVALID, "mesh %s has %d ranks but the job has %d; launch with mpirun -np %d",
                    mb, mp_mesh_world(mesh), mp_comm_world_size(comm), mp_mesh_world(mesh));
  return mp_runtime_plan_check(ctx, p);
}

/* This rank's step program: its schedule under the memory model of this backend's layout
 * (fp32 X: the CPU's; bf16 X: CUDA's, whose NCCL overlap the program then follows where
 * the comm has it), read as actions (mp_schedule_step_program). The plan is the caller's
 * with only that option changed; the schedule is dropped once read. */
static mp_status build_program(mp_ctx *ctx, mp_runtime *rt) {
  mp_plan q = *rt->plan; /* shallow: the schedule only reads it, here */
  q.opts.mem_model = rt->xs == 4 ? MP_MEM_MODEL_MESHPLAN_CPU : MP_MEM_MODEL_MESHPLAN_CUDA;
  q.opts.f8_codes = rt->f8_codes;
  mp_arena *a = mp_arena_create();
  MP_CHECK_ALLOC(ctx, a);
  mp_schedule *s = NULL;
  mp_step_action *prog = NULL;
  int32_t n = 0;
  mp_status st = mp_schedule_build(ctx, &q, rt->rank, MP_SCHEDULE_EXPANDED, a, &s);
  if (st == MP_OK) st = mp_schedule_step_program(ctx, s, a, &prog, &n);
  if (st == MP_OK) {
    rt->prog = malloc(sizeof *rt->prog * (size_t)(n > 0 ? n : 1));
    if (rt->prog == NULL) st = mp_error(ctx, MP_ERR_NOMEM, "runtime: out of memory for the step program");
  }
  if (st == MP_OK) {
    memcpy(rt->prog, prog, sizeof *prog * (size_t)n);
    rt->n_prog = n;
  }
  mp_arena_destroy(a);
  if (st != MP_OK) mp_error_prefix(ctx, "runtime: the step program of rank %d", rt->rank);
  return st;
}

/* The dims of the plan on this rank (tp splits heads, d_ff, shared d_ff and vocab; ep
 * splits the experts), the backend's and the comm's properties, and the activation
 * layout for them. */
static void runtime_dims(mp_runtime *rt, const mp_plan *plan, int64_t local_batch, int64_t n_micro) {
  const mp_model *m = &plan->model;
  mp_comm *comm = rt->comm;
  const mp_backend *be = rt->be;
  rt->rank = mp_comm_world_rank(comm);
  rt->B = (int)plan->opts.micro_batch;
  rt->T = (int)plan->opts.seq;
  rt->cp = mp_comm_group_size(comm, MP_GROUP_CP);
  rt->cp_idx = mp_comm_group_index(comm, MP_GROUP_CP);
  rt->Tl = rt->T / rt->cp;
  rt->N = rt->B * rt->Tl;
  {
    const mp_mesh *mesh = mp_comm_mesh(comm);
    int co[MP_MESH_NDIMS];
    mp_mesh_coords(mesh, rt->rank, co);
    co[MP_DIM_CP] = (rt->cp_idx + 1) % rt->cp;
    rt->cp_next = mp_mesh_rank_of(mesh, co);
    co[MP_DIM_CP] = (rt->cp_idx + rt->cp - 1) % rt->cp;
    rt->cp_prev = mp_mesh_rank_of(mesh, co);
  }
  rt->C = (int)m->d_model;
  rt->nh = (int)m->n_heads;
  rt->nkv = (int)m->n_kv_heads;
  rt->hd = (int)m->head_dim;
  rt->mla = mp_model_is_mla(m);
  rt->dv = (int)mp_model_v_head_dim(m);
  rt->rd = rt->mla ? (int)m->qk_rope_head_dim : rt->hd;
  rt->ql = (int)m->q_lora_rank;
  rt->kvl = (int)m->kv_lora_rank;
  rt->dn = (int)m->qk_nope_head_dim;
  rt->dr = (int)m->qk_rope_head_dim;
  rt->F = (int)m->d_ff;
  rt->V = (int)m->vocab;
  rt->L = (int)m->n_layers;
  rt->E = (int)m->n_experts;
  rt->K = (int)m->top_k;
  rt->Fe = (int)m->d_ff_expert;
  rt->Fs = m->n_shared_experts > 0 ? (int)m->d_ff_shared : 0;
  rt->eps = (float)m->norm_eps;
  rt->tp = mp_comm_group_size(comm, MP_GROUP_TP);
  rt->tp_idx = mp_comm_group_index(comm, MP_GROUP_TP);
  rt->ep = (plan->applied & MP_PASS_EP) && plan->mesh.ep > 1 ? plan->mesh.ep : 1;
  rt->ep_idx = rt->ep > 1 ? mp_comm_group_index(comm, MP_GROUP_EP) : 0;
  rt->etp = rt->ep > 1 && plan->mesh.etp > 1 ? plan->mesh.etp : 1;
  rt->etp_idx = rt->etp > 1 ? mp_comm_group_index(comm, MP_GROUP_ETP) : 0;
  rt->Fe /= rt->etp; /* gate/up column-parallel, down row-parallel over ETP (exec/pass_ep.c) */
  rt->El = rt->E / rt->ep;
  rt->nhl = rt->nh / rt->tp;
  rt->nkvl = rt->nkv / rt->tp;
  rt->Fl = rt->F / rt->tp;
  rt->Fsl = rt->Fs / rt->tp;
  rt->Vl = (int)(plan->vocab_padded / rt->tp);
  rt->v0 = rt->tp_idx * rt->Vl;
  rt->sp = rt->tp > 1 && plan->opts.sp == 1;
  rt->Ns = rt->sp ? rt->N / rt->tp : rt->N;
  rt->grid = rt->ep > 1 && rt->tp > 1 && mp_mesh_expert_grid(&plan->mesh);
  rt->Nr = rt->grid ? rt->Ns : rt->N;
  rt->local_batch = local_batch;
  rt->n_micro = n_micro;
  rt->pp = plan->mesh.size[MP_DIM_PP];
  rt->pp_stage = mp_plan_rank_stage(plan, rt->rank);
  rt->dp_size = mp_comm_group_size(comm, MP_GROUP_DP);
  rt->xs = mp_kdtype_bytes(be->x_dtype);
  rt->xdt = be->x_dtype == MP_KDTYPE_BF16 ? MP_COMM_DTYPE_BF16 : MP_COMM_DTYPE_FP32;
  rt->host_mem = strcmp(be->name, "cpu") == 0;
  rt->overlap = strcmp(mp_comm_backend_name(comm), "nccl") == 0;
  rt->f8_codes = be->x_dtype != MP_KDTYPE_F32 || rt->opts.f8_codes;
  rt->dims = (mp_act_dims){.B = rt->B, .S = rt->Tl, .N = rt->N, .NS = rt->Ns, .C = rt->C, .HD = rt->hd, .DV = rt->dv, .RD = rt->rd,
                           .mla = rt->mla, .QL = rt->ql, .KL = rt->kvl, .DN = rt->dn, .DR = rt->dr, .NH = rt->nhl,
                           .NKV = rt->nkvl, .F = rt->Fl, .E = rt->E, .K = rt->K, .Fe = rt->Fe, .Fs = rt->Fsl,
                           .Vl = rt->Vl, .NR = rt->Nr, .R = (int64_t)rt->Nr * rt->K, .L = rt->L, .NP = plan->n_params,
                           .xs = (int)rt->xs, .tp = rt->tp, .ep = rt->ep, .sp = rt->sp, .cp = rt->cp,
                           .host_mem = rt->host_mem};
  mp_act_layout_fill(&rt->lay_dense, &rt->dims, 0);
  mp_act_layout_fill(&rt->lay_moe, &rt->dims, 1);
}

/* The host-side tables: parameters, units, the (layer, module) index, per-layer buffers
 * and EP row counts. */
static mp_status alloc_tables(mp_ctx *ctx, mp_runtime *rt) {
  const mp_plan *plan = rt->plan;
  rt->prm = calloc((size_t)plan->n_params, sizeof *rt->prm);
  rt->units = calloc((size_t)(plan->n_units ? plan->n_units : 1), sizeof *rt->units);
  rt->n_units = plan->n_units;
  rt->pidx = malloc((size_t)(rt->L + 1) * MP_MOD_COUNT * sizeof *rt->pidx);
  rt->x = calloc((size_t)rt->L + 1, sizeof *rt->x);
  rt->act = calloc((size_t)rt->L, sizeof *rt->act);
  rt->core = calloc((size_t)rt->L, sizeof *rt->core);
  rt->epa = calloc((size_t)rt->L, sizeof *rt->epa);
  rt->ep_R = calloc((size_t)rt->L, sizeof *rt->ep_R);
  rt->ep_rc = calloc((size_t)rt->L * rt->etp * rt->ep * (rt->El ? rt->El : 1), sizeof *rt->ep_rc);
  rt->counts_h = calloc((size_t)rt->L * (rt->E ? rt->E : 1), sizeof *rt->counts_h);
  if (rt->E > 0) {
    rt->load_routed = calloc((size_t)rt->L * rt->E, sizeof *rt->load_routed);
    rt->load_dropped = calloc((size_t)rt->L * rt->E, sizeof *rt->load_dropped);
  }
  if (!rt->prm || !rt->units || !rt->pidx || !rt->x || !rt->act || !rt->core || !rt->epa || !rt->ep_R ||
      !rt->ep_rc || !rt->counts_h || (rt->E > 0 && (!rt->load_routed || !rt->load_dropped)))
    return mp_error(ctx, MP_ERR_NOMEM, "runtime: out of memory for bookkeeping");
  for (int i = 0; i < (rt->L + 1) * MP_MOD_COUNT; i++) rt->pidx[i] = -1;
  /* which units are sharded: over a group of more than one rank, on this rank's stage */
  for (int u = 0; u < plan->n_units; u++) {
    rt_unit *U = &rt->units[u];
    const mp_fsdp_unit *pu = &plan->units[u];
    U->group = pu->group;
    int here = 0; /* the root unit spans the first and the last stage */
    for (int k = 0; k < pu->n_params; k++) here |= plan->params[pu->params[k]].pp_stage == rt->pp_stage;
    U->sharded = mp_comm_group_size(rt->comm, U->group) > 1 && here;
  }
  return MP_OK;
}

/* Parameter i's place: its tile, its padded shard, its slot in its unit's gathered buffer,
 * whether this rank owns it (the one copy that counts in the global norm and in dumps:
 * replicas over tp (norms, router, routed experts), over dp_replicate (a routed expert's
 * replicas: r->rep), and over an FSDP group that does not shard it). Returns whether the rank stores any of it. */
static int param_place(mp_runtime *rt, int i) {
  const mp_param *p = &rt->plan->params[i];
  mp_comm *comm = rt->comm;
  rt_param *r = &rt->prm[i];
  if (p->role == MP_ROLE_WEIGHT) *pslot(rt, p->layer, p->module) = i;
  if (!mp_rt_param_on_stage(rt, i)) return 0; /* another pipeline stage's: nothing here */
  const int has = mp_param_tile(rt->plan, p, rt->rank, r->off, r->len);
  r->numel = 0;
  if (has) {
    r->numel = 1;
    for (int d = 0; d < p->ndim; d++) r->numel *= r->len[d];
  }
  r->tp_numel = mp_param_tp_numel(p);
  r->group = p->fsdp_group;
  r->rep = r->group == MP_GROUP_EFSDP ? mp_mesh_expert_replica_group(&rt->plan->mesh) : MP_GROUP_DP_REPLICATE;
  r->sharded = p->fsdp_unit >= 0 && p->place[MP_AXIS_FSDP].kind == MP_PLACEMENT_SHARD &&
               rt->units[p->fsdp_unit].sharded;
  const int gsize = r->sharded ? mp_comm_group_size(comm, r->group) : 1;
  r->numel_pad = r->sharded ? mp_param_padded_shard_numel(p, gsize) : r->numel;
  if (r->sharded) {
    rt_unit *U = &rt->units[p->fsdp_unit];
    r->unit_off = U->gather_numel;
    U->gather_numel += mp_act_gather_slot_bytes(gsize, r->numel_pad, (int)rt->xs) / (int64_t)rt->xs;
    if (r->numel_pad > U->max_pad) U->max_pad = r->numel_pad;
  }
  /* weight decay (runtime.h): >= 2-D weights, the embedding and head among them unless
   * decay_embeddings is off; every parameter with decay_all */
  const int embed = p->module == MP_MOD_TOK_EMBEDDINGS || p->module == MP_MOD_POS_EMBEDDINGS ||
                    p->module == MP_MOD_OUTPUT;
  r->decay = rt->opts.decay_all || (p->ndim >= 2 && (rt->opts.decay_embeddings || !embed));
  const int tp_sharded = p->place[MP_AXIS_TP].kind == MP_PLACEMENT_SHARD;
  const int fsdp_g = p->fsdp_unit >= 0 ? mp_comm_group_size(comm, r->group) : 1;
  const int fsdp_i = p->fsdp_unit >= 0 ? mp_comm_group_index(comm, r->group) : 0;
  /* without an FSDP unit a parameter is replicated over cp too; a tied model's head copy
   * (pp > 1) is counted once, as the first stage's embedding; under the expert grid the
   * tp ranks hold different experts (EP spans them), so an expert is not a tp replica */
  const int tp_apart = tp_sharded || (rt->grid && p->place[MP_AXIS_EP].kind == MP_PLACEMENT_SHARD);
  r->owner = (tp_apart || rt->tp_idx == 0) && mp_comm_group_index(comm, r->rep) == 0 &&
             (r->sharded || fsdp_g == 1 || fsdp_i == 0) && (p->fsdp_unit >= 0 || rt->cp_idx == 0) && !p->tied_copy;
  return has;
}

/* Materializes parameter i: the rank's shard only (padded to the group's chunk; the pad
 * rows stay zero), master + grad + m + v, filled by the plan-independent initializer; one
 * that is not sharded also gets its compute copy (X: w itself when X is fp32). */
static mp_status param_materialize(mp_ctx *ctx, mp_runtime *rt, int i, int has) {
  const mp_param *p = &rt->plan->params[i];
  const mp_backend *be = rt->be;
  rt_param *r = &rt->prm[i];
  const size_t bytes = (size_t)r->numel_pad * sizeof(float);
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_PARAMS, bytes, (void **)&r->w));
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_GRADS, bytes, (void **)&r->g));
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_OPTIMIZER, bytes, (void **)&r->m));
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_OPTIMIZER, bytes, (void **)&r->v));
  float *host = calloc((size_t)(r->numel_pad ? r->numel_pad : 1), sizeof(float));
  if (!host) return mp_error(ctx, MP_ERR_NOMEM, "runtime: out of memory initializing %s", p->fqn);
  /* a tied model's head copy starts as the embedding it copies (same name, same values) */
  if (has) mp_init_fill_block(rt->opts.seed, mp_plan_param_source(rt->plan, i), r->off, r->len, host);
  mp_status st = be->memcpy_h2d(rt->kc, r->w, host, bytes);
  free(host);
  MP_CHECK(st);
  if (r->sharded) return MP_OK;
  r->cg = r->g;
  r->cw = r->w;
  if (be->x_dtype == MP_KDTYPE_F32) return MP_OK;
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_PARAMS, (size_t)r->numel_pad * rt->xs, &r->cw));
  if (be->x_from_f32(rt->kc, r->cw, r->w, (size_t)r->numel_pad) != MP_OK)
    return mp_error(ctx, MP_ERR_INTERNAL, "runtime: compute copy of %s: %s", p->fqn, mp_errmsg(rt->kc->err));
  return MP_OK;
}

/* Every module the forward needs must be present (on its stage: blocks by their chunk,
 * the embedding on the first stage, the final norm on the last). */
static mp_status check_modules(mp_ctx *ctx, const mp_runtime *rt) {
  static const mp_module gqa[] = {MP_MOD_ATTN_NORM, MP_MOD_Q, MP_MOD_K, MP_MOD_V, MP_MOD_O, MP_MOD_FFN_NORM};
  /* multi-head latent attention (runtime_mla.c): q_proj, or q_a_proj, q_a_layernorm, q_b_proj */
  static const mp_module mla[] = {MP_MOD_ATTN_NORM, MP_MOD_KV_A, MP_MOD_KV_A_NORM, MP_MOD_KV_B, MP_MOD_O,
                                  MP_MOD_FFN_NORM,  MP_MOD_Q_A,  MP_MOD_Q_A_NORM,  MP_MOD_Q_B};
  const mp_module *need = rt->mla ? mla : gqa;
  const size_t n_need = rt->mla ? (rt->ql > 0 ? 9 : 6) : 6;
  for (int l = 0; l < rt->L; l++) {
    if (rt->mla && rt->ql == 0 && *pslot(rt, l, MP_MOD_Q) < 0)
      return mp_error(ctx, MP_ERR_INTERNAL, "runtime: plan has no %s in layer %d", mp_module_name(MP_MOD_Q), l);
    for (size_t j = 0; j < n_need; j++)
      if (*pslot(rt, l, need[j]) < 0)
        return mp_error(ctx, MP_ERR_INTERNAL, "runtime: plan has no %s in layer %d", mp_module_name(need[j]), l);
  }
  if (*pslot(rt, -1, MP_MOD_TOK_EMBEDDINGS) < 0 || *pslot(rt, -1, MP_MOD_FINAL_NORM) < 0)
    return mp_error(ctx, MP_ERR_INTERNAL, "runtime: plan lacks the embedding or final norm");
  if ((rt->pp_stage == 0 && !rt->prm[*pslot(rt, -1, MP_MOD_TOK_EMBEDDINGS)].w) ||
      (rt->pp_stage == rt->pp - 1 && !rt->prm[*pslot(rt, -1, MP_MOD_FINAL_NORM)].w))
    return mp_error(ctx, MP_ERR_INTERNAL, "runtime: stage %d of pp=%d lacks its %s", rt->pp_stage, rt->pp,
                    rt->pp_stage == 0 ? "embedding" : "final norm");
  return MP_OK;
}

/* The resident allocations of the activation layout: RoPE tables, the device scalars
 * ([0..1] the emulation's float8 amax and scale, [2..3] the fused amax of SwiGLU's input
 * gradients, [8 + i] parameter i's sum of squares, then rt->f8_fwd, 4 per layer), and the
 * staging of host-value collectives when the backend's memory is not host memory. */
static mp_status alloc_resident(mp_ctx *ctx, mp_runtime *rt) {
  const size_t *ab = rt->lay_dense.bytes, rb = ab[MP_ACT_ALLOC_ROPE_COS];
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, rb, (void **)&rt->rope_cos));
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, ab[MP_ACT_ALLOC_ROPE_SIN], (void **)&rt->rope_sin));
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, ab[MP_ACT_ALLOC_SCALARS], (void **)&rt->scalar));
  rt->f8_fwd = rt->scalar + 8 + rt->plan->n_params;
  if (!rt->host_mem)
    MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, ab[MP_ACT_ALLOC_STAGE], (void **)&rt->stage));
  float *c = malloc(rb), *s = malloc(rb);
  if (!c || !s) {
    free(c);
    free(s);
    return mp_error(ctx, MP_ERR_NOMEM, "runtime: out of memory for RoPE tables");
  }
  /* the local rows' positions: one run, or under CP the rank's two chunks (runtime_cp.c) */
  if (rt->cp == 1) {
    mp_rope_tables(c, s, rt->T, rt->rd, (float)rt->plan->model.rope_theta, 0);
  } else {
    const int cs = rt->Tl / 2, h2 = rt->rd / 2;
    for (int k = 0; k < 2; k++)
      mp_rope_tables(c + (size_t)k * cs * h2, s + (size_t)k * cs * h2, cs, rt->rd,
                     (float)rt->plan->model.rope_theta, mp_rt_cp_pos(rt, rt->cp_idx, k));
  }
  mp_status st = rt->be->memcpy_h2d(rt->kc, rt->rope_cos, c, rb);
  if (st == MP_OK) st = rt->be->memcpy_h2d(rt->kc, rt->rope_sin, s, rb);
  free(c);
  free(s);
  return st;
}

/* The parameters: the tables, then each one placed and (when the rank stores it)
 * materialized, then the check that the forward finds every module. */
static mp_status materialize(mp_ctx *ctx, mp_runtime *rt) {
  MP_CHECK(alloc_tables(ctx, rt));
  MP_CHECK(mp_talloc_create(ctx, rt->be, rt->kc, &rt->ta));
  for (int i = 0; i < rt->plan->n_params; i++) {
    const int has = param_place(rt, i);
    if (has || rt->prm[i].sharded) MP_CHECK(param_materialize(ctx, rt, i, has));
  }
  return check_modules(ctx, rt);
}

mp_status mp_runtime_create(mp_ctx *ctx, const mp_plan *plan, mp_comm *comm, const mp_backend *be, mp_kctx *kc,
                            const mp_runtime_options *opts, mp_runtime **out) {
  *out = NULL;
  MP_CHECK(check_supported(ctx, plan, comm));
  MP_CHECK(mp_runtime_capacity_check(ctx, &plan->model, &plan->opts, opts->moe_capacity_factor));
  int64_t local_batch, n_micro;
  MP_CHECK(mp_plan_batch(ctx, plan, &local_batch, &n_micro));
  const mp_model *m = &plan->model;
  if (plan->opts.seq > m->max_seq)
    return mp_error(ctx, MP_ERR_INVALID, "seq %lld exceeds model %s's max_seq %lld; use --seq <= %lld",
                    (long long)plan->opts.seq, m->name, (long long)m->max_seq, (long long)m->max_seq);
  if ((be->x_dtype != MP_KDTYPE_F32 || opts->f8_codes) && (!be->matmul_f8 || !be->f8_quantize_t))
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "runtime: backend %s has no float8 GEMM on codes (matmul_f8, "
                    "f8_quantize_t); run its float8 Linears emulated (f8_codes = 0)", be->name);
  mp_runtime *rt = calloc(1, sizeof *rt);
  MP_CHECK_ALLOC(ctx, rt);
  rt->plan = plan;
  rt->comm = comm;
  rt->be = be;
  rt->kc = kc;
  rt->opts = *opts;
  runtime_dims(rt, plan, local_batch, n_micro);
  mp_status st = materialize(ctx, rt);
  if (st == MP_OK) st = alloc_resident(ctx, rt);
  if (st == MP_OK) st = build_program(ctx, rt);
  if (st == MP_OK) st = mp_rt_pp_init(ctx, rt);
  if (st != MP_OK) {
    mp_runtime_destroy(rt);
    return st;
  }
  *out = rt;
  return MP_OK;
}

void mp_runtime_destroy(mp_runtime *rt) {
  if (!rt) return;
  mp_rt_pp_free(rt);
  mp_talloc_destroy(rt->ta);
  free(rt->prm);
  free(rt->units);
  free(rt->pidx);
  free(rt->x);
  free(rt->act);
  free(rt->core);
  free(rt->epa);
  free(rt->ep_R);
  free(rt->ep_rc);
  free(rt->counts_h);
  free(rt->load_routed);
  free(rt->load_dropped);
  free(rt->prog);
  free(rt);
}

const mp_talloc *mp_runtime_allocator(const mp_runtime *rt) { return rt->ta; }

int64_t mp_runtime_local_batch(const mp_runtime *rt) { return rt->local_batch; }

int64_t mp_runtime_n_micro(const mp_runtime *rt) { return rt->n_micro; }

int64_t mp_runtime_ep_rows_max(const mp_runtime *rt) { return rt->ep_R_max; }

const int64_t *mp_runtime_expert_routed(const mp_runtime *rt) { return rt->load_routed; }

const int64_t *mp_runtime_expert_dropped(const mp_runtime *rt) { return rt->load_dropped; }

mp_status mp_runtime_synchronize(mp_ctx *ctx, mp_runtime *rt) {
  MP_CHECK(mp_comm_synchronize(ctx, rt->comm));
  BE(synchronize(rt->kc));
  return MP_OK;
}

mp_status mp_runtime_host_all_reduce(mp_ctx *ctx, mp_runtime *rt, mp_group g, void *buf, size_t count, mp_comm_dtype t,
                                     mp_comm_op op) {
  if (count * mp_comm_dtype_bytes(t) > STAGE_FLOATS * sizeof(float) / 2)
    return mp_error(ctx, MP_ERR_INVALID, "runtime: host all-reduce of %zu elements is larger than its staging", count);
  return mp_rt_host_coll(ctx, rt, g, buf, NULL, count, t, (int)op, NULL);
}
