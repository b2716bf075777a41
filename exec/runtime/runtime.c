/* The training runtime (see runtime.h for the step's semantics and memory categories).
 *
 * Dtypes (kernels/ops.h): "X" tensors (activations, their gradients, compute copies of
 * parameters) are stored in the backend's x_dtype, xs bytes each (CPU: fp32, CUDA: bf16);
 * master parameters, their gradients, AdamW state and every statistic (rstd, lse, router
 * probabilities, losses, float8 scales) are fp32; ids and permutations int32. Carved
 * allocations are laid out in BYTES (rt_layout), so one layout serves both backends; on
 * the CPU (xs = 4) it is byte for byte the fp32 layout of before.
 *
 * Tensor naming follows the model: x[l] is the residual stream entering block l (x[L]
 * enters the final norm); a block saves, in one carved ACTIVATIONS allocation,
 *   xn1 (N,C) rstd1 (N) q (N,nh*hd, after RoPE) k v (N,nkv*hd) xmid (N,C) xn2 (N,C)
 *   rstd2 (N), then dense: g u h (N,F); MoE: router logits and probs (N,E), top-k idx and
 *   weights (N,k), f (E), aux (1), perm/inv (N*k), counts (E), permuted input xp (N*k,C),
 *   expert gate/up/hidden (N*k,Fe), expert out ey (N*k,C), shared gate/up/hidden (N,Fs),
 * and, in a second allocation (so selective AC can drop it), the attention core:
 *   att (N,nh*hd), lse (B,nh,T).
 * Backward of a block takes dres = dL/dx[l+1] and leaves dL/dx[l] in the same buffer: the
 * MLP branch reads dres, then the FFN norm's backward adds its input gradient into dres
 * (residual), and likewise for attention. Every backward kernel accumulates (ops.h) into
 * buffers fresh from the tracked allocator, which zero-fills (alloc.h): the workspaces,
 * dlogits, dres and the unit gradient buffers need no memset of their own. Buffers that
 * are written whole before any read (saved activations, the residual stream, logits,
 * gathered parameters, float8 codes) come from mp_talloc_alloc_uninit: no fill. */
#include "exec/runtime/runtime.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "exec/act_layout.h"
#include "exec/runtime/init.h"
#include "exec/schedule.h"

typedef struct rt_param {
  int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM], numel; /* at-rest tile (global offsets), real elements */
  int64_t numel_pad;  /* storage elements: chunk rows x row length when FSDP-sharded (FSDP2 pads
                         every rank's shard to the same size), numel otherwise */
  int64_t tp_numel;   /* elements of the compute tensor (tp/ep-local, unsharded by FSDP) */
  int sharded;        /* FSDP-sharded over a group of more than one rank */
  mp_group group;     /* its FSDP group (MP_GROUP_FSDP or MP_GROUP_EFSDP) */
  int64_t unit_off;   /* offset of its gathered slot in the unit buffer (elements) */
  float *w, *g, *m, *v; /* master shard, gradient shard, AdamW state (numel_pad each) */
  void *cw;           /* compute weight (X): the unit's gathered slot while the unit is live;
                         not sharded: w itself when X is fp32, else a resident X copy of w
                         refreshed after every optimizer step */
  float *cg;          /* gradient: the unit's unsharded buffer while live, else g */
  int decay;
  int owner;          /* this rank counts the parameter once in the global norm and dumps */
  uint8_t *f8w;       /* float8 GEMMs (not emulated), not FSDP-sharded: codes of cw (M, K) and
                         of its transpose, amax and scale; valid until the next optimizer step */
  int f8w_valid;
} rt_param;

/* A float8 operand: codes of a tensor (R, C) and/or of its transpose, with its tensorwise
 * amax and scale, in one FP8 allocation (mem; NULL when not owned). */
typedef struct f8_operand {
  const void *src;
  int R, C, fmt;
  uint8_t *q, *qt;
  float *amax; /* [0] amax, [1] scale (device) */
  void *mem;
} f8_operand;
enum { F8_SCOPE_MAX = 8, F8_KNOWN_MAX = 8 };

/* A tensor whose amax is already on the device (float8 on codes): written by the kernel
 * that produced it (rmsnorm_forward_amax, swiglu_*_amax), or kept from the forward that
 * quantized the same saved activation (its backward reads the same bytes: saved, or
 * recomputed bit for bit). reduced: already all-reduced (MAX) over tp. Valid inside one
 * block's f8 scope: the scope's end forgets them. */
typedef struct f8_known {
  const void *x;
  size_t n;
  float *amax;
  int reduced;
} f8_known;

typedef struct rt_unit {
  int sharded;        /* group of more than one rank: gathered before use, reduce-scattered after */
  mp_group group;
  int64_t gather_numel; /* padded slots of every parameter: group x numel_pad each */
  int64_t max_pad;    /* largest numel_pad (reduce-scatter staging) */
  char *buf;          /* gathered parameters (X) while live */
  float *gbuf;        /* unsharded gradients during the unit's backward */
  /* overlap (rt->overlap): the gather's request, and the unit's reduce-scatter in flight
   * (its input gbuf and output rs stay allocated until finish) */
  mp_comm_req gather_req, rs_req;
  float *rs;          /* reduce-scattered chunks, one numel_pad slot per sharded parameter */
  int rs_pending;
} rt_unit;

struct mp_runtime {
  const mp_plan *plan;
  mp_comm *comm;
  const mp_backend *be;
  mp_kctx *kc;
  mp_runtime_options opts;
  mp_talloc *ta;
  int rank;
  /* global dims */
  int B, T, N, C, nh, nkv, hd, F, V, L, E, K, Fe, Fs;
  /* local dims: tp splits heads, d_ff, shared d_ff and vocab; ep splits experts */
  int tp, tp_idx, ep, ep_idx, El, nhl, nkvl, Fl, Fsl, Vl, v0;
  float eps;
  int64_t local_batch, n_micro;
  int dp_size;
  rt_param *prm;
  rt_unit *units;
  int n_units;
  int *pidx;    /* [(L + 1) * MP_MOD_COUNT]: weight param index per (layer, module); row L: outside blocks */
  float *rope_cos, *rope_sin, *scalar;
  int32_t *tok_in, *tok_tgt;
  mp_act_dims dims;   /* the local dims of the activation layout (R: the balanced N x K) */
  mp_act_layout lay_dense, lay_moe; /* exec/act_layout.h laid out for a dense and an MoE block */
  size_t xs;          /* bytes of an X element */
  mp_comm_dtype xdt;  /* comm dtype of X tensors */
  int host_mem;       /* the backend's memory is host memory (CPU): host buffers may go to comm */
  int overlap;        /* the comm queues collectives (NCCL): prefetch the next unit's gather,
                         let reduce-scatters run under the next unit's backward */
  /* float8 activations quantized once per block and shared by the Linears that read them
   * (q, k, v read xn1; gate and up read xn2): open between f8_scope_begin and _end */
  f8_operand f8s[F8_SCOPE_MAX];
  int f8_n, f8_scope;
  int f8_codes;        /* float8 Linears as GEMMs on codes (else the fp32 emulation) */
  f8_known f8k[F8_KNOWN_MAX];
  int f8k_n;
  float *f8_fwd;       /* [L * 4] device: the reduced amax of each block's float8 activations
                          (xn1, attention output, xn2, SwiGLU output) from its forward */
  float *stage;       /* device staging for collectives on host values (not host_mem), STAGE_FLOATS */
  char **x;         /* [L + 1] (N, C) X */
  char **act;       /* [L] */
  char **core;      /* [L] */
  char **epa;       /* [L] EP: expert-side saved tensors (rows received from every EP rank) */
  int64_t *ep_R;    /* [L] rows received */
  int64_t ep_R_max; /* most rows received in one layer since creation (routing-dependent memory) */
  int64_t *ep_rc;   /* [L * ep * El] rows received from source s for local expert e */
  int32_t *counts_h; /* [L * E] host copies of expert row counts */
  int step;
  mp_step_action *prog; /* one micro-batch: this rank's schedule's step program */
  int32_t n_prog;
};

enum { STAGE_FLOATS = MP_ACT_STAGE_FLOATS }; /* host-value collectives */

/* p advanced by n X elements. */
static void *xoff(const mp_runtime *rt, const void *p, size_t n) { return (char *)p + n * rt->xs; }
#define F32(p) ((float *)(void *)(p))

void mp_runtime_options_init(mp_runtime_options *o) {
  memset(o, 0, sizeof *o);
  o->seed = 1234;
  o->lr = 1e-3f;
  o->beta1 = 0.9f;
  o->beta2 = 0.95f;
  o->eps = 1e-8f;
  o->weight_decay = 0.1f;
  o->max_grad_norm = 1.0f;
}

static int *pslot(const mp_runtime *rt, int layer, mp_module m) {
  return &rt->pidx[(layer < 0 ? rt->L : layer) * MP_MOD_COUNT + m];
}
static void *W(const mp_runtime *rt, int layer, mp_module m) {
  int i = *pslot(rt, layer, m);
  return i < 0 ? NULL : rt->prm[i].cw;
}
static float *G(const mp_runtime *rt, int layer, mp_module m) {
  int i = *pslot(rt, layer, m);
  return i < 0 ? NULL : rt->prm[i].cg;
}
static int F8(const mp_runtime *rt, int layer, mp_module m) {
  int i = *pslot(rt, layer, m);
  return i >= 0 && rt->plan->params[i].float8;
}

#define BE(call)                                                                                       \
  do {                                                                                                 \
    mp_status be_s_ = rt->be->call;                                                                    \
    if (be_s_ != MP_OK)                                                                                \
      return mp_error(ctx, be_s_, "%s:%d: kernel %s failed: %s", __FILE__, __LINE__, #call,            \
                      mp_errmsg(rt->kc->err));                                                         \
  } while (0)

static int is_moe_layer(const mp_runtime *rt, int l) { return mp_model_layer_is_moe(&rt->plan->model, l); }
static const mp_act_layout *lay_of(const mp_runtime *rt, int l) { return is_moe_layer(rt, l) ? &rt->lay_moe : &rt->lay_dense; }

/* TP all-reduce (sum) of a partial result in place, an X tensor (tp_sum) or fp32
 * statistics (tp_sum_f32); nothing when tp == 1. */
static mp_status tp_sum(mp_ctx *ctx, mp_runtime *rt, void *x, size_t n) {
  if (rt->tp == 1) return MP_OK;
  return mp_comm_all_reduce(ctx, rt->comm, MP_GROUP_TP, x, x, n, rt->xdt, MP_COMM_OP_SUM);
}
static mp_status tp_sum_f32(mp_ctx *ctx, mp_runtime *rt, float *x, size_t n) {
  if (rt->tp == 1) return MP_OK;
  return mp_comm_all_reduce(ctx, rt->comm, MP_GROUP_TP, x, x, n, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM);
}

/* A collective on host values (loss sums, norms, EP counts, dumps): straight to comm when
 * the backend's memory is host memory, else through device staging (a GPU comm takes
 * device buffers only). dev: a device buffer of at least count elements, or NULL for
 * rt->stage. op < 0: an all-to-all of `count` elements to every group rank instead
 * (send = buf, recv = rbuf, count per rank). */
static mp_status host_coll(mp_ctx *ctx, mp_runtime *rt, mp_group g, void *buf, void *rbuf, size_t count,
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

static mp_status check_supported(mp_ctx *ctx, const mp_plan *p, mp_comm *comm) {
  const mp_model *m = &p->model;
  const mp_mesh *mesh = &p->mesh;
  char mb[128];
  mp_mesh_format(mesh, mb, sizeof mb);
  if (mp_mesh_world(mesh) != mp_comm_world_size(comm))
    return mp_error(ctx, MP_ERR_INVALID, "mesh %s has %d ranks but the job has %d; launch with mpirun -np %d",
                    mb, mp_mesh_world(mesh), mp_comm_world_size(comm), mp_mesh_world(mesh));
  if (mesh->size[MP_DIM_PP] > 1 || mesh->size[MP_DIM_CP] > 1)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "mesh %s: the runtime does not execute pipeline (pp) or context "
                    "(cp) parallelism yet; the planner models them, train with dp_replicate, dp_shard, tp and ep",
                    mb);
  if (mesh->size[MP_DIM_DP_SHARD] > 1 && !(p->applied & MP_PASS_FSDP))
    return mp_error(ctx, MP_ERR_INTERNAL, "mesh %s has dp_shard > 1 but the plan has no FSDP pass", mb);
  if (m->family != MP_FAMILY_LLAMA)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: the runtime implements the llama family only "
                    "(RMSNorm, RoPE, SwiGLU); gpt models are not implemented yet", m->name);
  if (m->qkv_bias || m->qk_norm || m->bias)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: q/k/v biases and q/k norms (Qwen2/Qwen3) are not "
                    "implemented in the runtime yet", m->name);
  if (mesh->size[MP_DIM_TP] > 1 && !p->opts.tp.shard_logits)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "tp=%d with logits gathered over tp (shard_logits=0) is not "
                    "executed; the runtime computes the loss vocab-parallel (the default)", mesh->size[MP_DIM_TP]);
  if (mesh->size[MP_DIM_TP] > 1 && m->tied_embeddings)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s ties its embeddings; with tp > 1 the runtime does not "
                    "execute tied vocab-parallel embedding and head yet", m->name);
  if (m->head_dim % 2)
    return mp_error(ctx, MP_ERR_INVALID, "model %s: RoPE needs an even head_dim (got %lld)", m->name,
                    (long long)m->head_dim);
  return MP_OK;
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
  rt->N = rt->B * rt->T;
  rt->C = (int)m->d_model;
  rt->nh = (int)m->n_heads;
  rt->nkv = (int)m->n_kv_heads;
  rt->hd = (int)m->head_dim;
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
  rt->El = rt->E / rt->ep;
  rt->nhl = rt->nh / rt->tp;
  rt->nkvl = rt->nkv / rt->tp;
  rt->Fl = rt->F / rt->tp;
  rt->Fsl = rt->Fs / rt->tp;
  rt->Vl = (int)(plan->vocab_padded / rt->tp);
  rt->v0 = rt->tp_idx * rt->Vl;
  rt->local_batch = local_batch;
  rt->n_micro = n_micro;
  rt->dp_size = mp_comm_group_size(comm, MP_GROUP_DP);
  rt->xs = mp_kdtype_bytes(be->x_dtype);
  rt->xdt = be->x_dtype == MP_KDTYPE_BF16 ? MP_COMM_DTYPE_BF16 : MP_COMM_DTYPE_FP32;
  rt->host_mem = strcmp(be->name, "cpu") == 0;
  rt->overlap = strcmp(mp_comm_backend_name(comm), "nccl") == 0;
  rt->f8_codes = be->x_dtype != MP_KDTYPE_F32 || rt->opts.f8_codes;
  rt->dims = (mp_act_dims){.B = rt->B, .S = rt->T, .N = rt->N, .C = rt->C, .HD = rt->hd, .NH = rt->nhl,
                           .NKV = rt->nkvl, .F = rt->Fl, .E = rt->E, .K = rt->K, .Fe = rt->Fe, .Fs = rt->Fsl,
                           .Vl = rt->Vl, .R = (int64_t)rt->N * rt->K, .L = rt->L, .NP = plan->n_params,
                           .xs = (int)rt->xs, .tp = rt->tp, .ep = rt->ep, .host_mem = rt->host_mem};
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
  rt->ep_rc = calloc((size_t)rt->L * rt->ep * (rt->El ? rt->El : 1), sizeof *rt->ep_rc);
  rt->counts_h = calloc((size_t)rt->L * (rt->E ? rt->E : 1), sizeof *rt->counts_h);
  if (!rt->prm || !rt->units || !rt->pidx || !rt->x || !rt->act || !rt->core || !rt->epa || !rt->ep_R ||
      !rt->ep_rc || !rt->counts_h)
    return mp_error(ctx, MP_ERR_NOMEM, "runtime: out of memory for bookkeeping");
  for (int i = 0; i < (rt->L + 1) * MP_MOD_COUNT; i++) rt->pidx[i] = -1;
  /* which units are sharded */
  for (int u = 0; u < plan->n_units; u++) {
    rt_unit *U = &rt->units[u];
    U->group = plan->units[u].group;
    U->sharded = mp_comm_group_size(rt->comm, U->group) > 1;
  }
  return MP_OK;
}

/* Parameter i's place: its tile, its padded shard, its slot in its unit's gathered buffer,
 * whether this rank owns it (the one copy that counts in the global norm and in dumps:
 * replicas over tp (norms, router, routed experts), over dp_replicate, and over an FSDP
 * group that does not shard it). Returns whether the rank stores any of it. */
static int param_place(mp_runtime *rt, int i, int dprep_idx) {
  const mp_param *p = &rt->plan->params[i];
  mp_comm *comm = rt->comm;
  rt_param *r = &rt->prm[i];
  if (p->role == MP_ROLE_WEIGHT) *pslot(rt, p->layer, p->module) = i;
  const int has = mp_param_tile(rt->plan, p, rt->rank, r->off, r->len);
  r->numel = 0;
  if (has) {
    r->numel = 1;
    for (int d = 0; d < p->ndim; d++) r->numel *= r->len[d];
  }
  r->tp_numel = mp_param_tp_numel(p);
  r->group = p->fsdp_group;
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
  r->decay = p->ndim >= 2;
  const int tp_sharded = p->place[MP_AXIS_TP].kind == MP_PLACEMENT_SHARD;
  const int fsdp_g = p->fsdp_unit >= 0 ? mp_comm_group_size(comm, r->group) : 1;
  const int fsdp_i = p->fsdp_unit >= 0 ? mp_comm_group_index(comm, r->group) : 0;
  r->owner = (tp_sharded || rt->tp_idx == 0) && dprep_idx == 0 && (r->sharded || fsdp_g == 1 || fsdp_i == 0);
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
  if (has) mp_init_fill_block(rt->opts.seed, p, r->off, r->len, host);
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

/* Every module the forward needs must be present. */
static mp_status check_modules(mp_ctx *ctx, const mp_runtime *rt) {
  static const mp_module need[] = {MP_MOD_ATTN_NORM, MP_MOD_Q, MP_MOD_K, MP_MOD_V, MP_MOD_O, MP_MOD_FFN_NORM};
  for (int l = 0; l < rt->L; l++)
    for (size_t j = 0; j < sizeof need / sizeof need[0]; j++)
      if (*pslot(rt, l, need[j]) < 0)
        return mp_error(ctx, MP_ERR_INTERNAL, "runtime: plan has no %s in layer %d", mp_module_name(need[j]), l);
  if (*pslot(rt, -1, MP_MOD_TOK_EMBEDDINGS) < 0 || *pslot(rt, -1, MP_MOD_FINAL_NORM) < 0)
    return mp_error(ctx, MP_ERR_INTERNAL, "runtime: plan lacks the embedding or final norm");
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
  mp_rope_tables(c, s, rt->T, rt->hd, (float)rt->plan->model.rope_theta, 0);
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
  const int dprep_idx = mp_comm_group_index(rt->comm, MP_GROUP_DP_REPLICATE);
  for (int i = 0; i < rt->plan->n_params; i++) {
    const int has = param_place(rt, i, dprep_idx);
    if (has || rt->prm[i].sharded) MP_CHECK(param_materialize(ctx, rt, i, has));
  }
  return check_modules(ctx, rt);
}

mp_status mp_runtime_create(mp_ctx *ctx, const mp_plan *plan, mp_comm *comm, const mp_backend *be, mp_kctx *kc,
                            const mp_runtime_options *opts, mp_runtime **out) {
  *out = NULL;
  MP_CHECK(check_supported(ctx, plan, comm));
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
  if (st != MP_OK) {
    mp_runtime_destroy(rt);
    return st;
  }
  *out = rt;
  return MP_OK;
}

void mp_runtime_destroy(mp_runtime *rt) {
  if (!rt) return;
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
  free(rt->prog);
  free(rt);
}

const mp_talloc *mp_runtime_allocator(const mp_runtime *rt) { return rt->ta; }
int64_t mp_runtime_local_batch(const mp_runtime *rt) { return rt->local_batch; }
int64_t mp_runtime_n_micro(const mp_runtime *rt) { return rt->n_micro; }
int64_t mp_runtime_ep_rows_max(const mp_runtime *rt) { return rt->ep_R_max; }

/* ---- FSDP units ------------------------------------------------------------------------
 * Gather: every rank contributes its padded shard (numel_pad) and receives group x
 * numel_pad; since shards are contiguous row chunks of the compute tensor in group order,
 * the first tp_numel elements of the slot ARE the compute tensor. Gradients: the unit's
 * backward accumulates into an unsharded, zeroed buffer with the same slots; the
 * reduce-scatter (sum) hands each rank its chunk, which is added to the gradient shard. */

static mp_status unit_gather(mp_ctx *ctx, mp_runtime *rt, int u) {
  rt_unit *U = &rt->units[u];
  if (!U->sharded || U->buf) return MP_OK;
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_GATHERED, (size_t)U->gather_numel * rt->xs, (void **)&U->buf));
  const mp_fsdp_unit *pu = &rt->plan->units[u];
  for (int k = 0; k < pu->n_params; k++) {
    rt_param *r = &rt->prm[pu->params[k]];
    if (!r->sharded) continue;
    /* FSDP2 mixed precision: the fp32 shard is cast to X into its own chunk of the slot,
     * then gathered in place (X: bf16 on the GPU, so half the bytes travel) */
    void *slot = xoff(rt, U->buf, (size_t)r->unit_off);
    void *mine = xoff(rt, slot, (size_t)mp_comm_group_index(rt->comm, U->group) * (size_t)r->numel_pad);
    BE(x_from_f32(rt->kc, mine, r->w, (size_t)r->numel_pad));
    MP_CHECK(mp_comm_all_gather(ctx, rt->comm, U->group, mine, slot, (size_t)r->numel_pad, rt->xdt));
    r->cw = slot;
  }
  return MP_OK;
}

static mp_status unit_release(mp_ctx *ctx, mp_runtime *rt, int u) {
  rt_unit *U = &rt->units[u];
  if (!U->buf) return MP_OK;
  const mp_fsdp_unit *pu = &rt->plan->units[u];
  for (int k = 0; k < pu->n_params; k++)
    if (rt->prm[pu->params[k]].sharded) rt->prm[pu->params[k]].cw = NULL;
  MP_CHECK(mp_talloc_free(ctx, rt->ta, U->buf));
  U->buf = NULL;
  return MP_OK;
}

static mp_status unit_grad_begin(mp_ctx *ctx, mp_runtime *rt, int u) {
  rt_unit *U = &rt->units[u];
  if (!U->sharded) return MP_OK;
  const size_t bytes = (size_t)U->gather_numel * sizeof(float);
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, bytes, (void **)&U->gbuf)); /* zero-filled */
  const mp_fsdp_unit *pu = &rt->plan->units[u];
  for (int k = 0; k < pu->n_params; k++) {
    rt_param *r = &rt->prm[pu->params[k]];
    if (r->sharded) r->cg = U->gbuf + r->unit_off;
  }
  return MP_OK;
}

/* Overlap: the unit's reduce-scatters go out as one async batch into U->rs; unit_rs_finish
 * (at the next unit's grad_end, or the end of the micro-batch) waits for them, adds each
 * chunk into its gradient shard and frees the buffers. */
static mp_status unit_rs_issue(mp_ctx *ctx, mp_runtime *rt, int u) {
  rt_unit *U = &rt->units[u];
  const mp_fsdp_unit *pu = &rt->plan->units[u];
  size_t total = 0;
  for (int k = 0; k < pu->n_params; k++)
    if (rt->prm[pu->params[k]].sharded) total += (size_t)mp_act_rs_slot_floats(rt->prm[pu->params[k]].numel_pad);
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_TEMP, total * sizeof(float), (void **)&U->rs));
  MP_CHECK(mp_comm_async_begin(ctx, rt->comm));
  mp_status st = MP_OK;
  size_t o = 0;
  for (int k = 0; k < pu->n_params && st == MP_OK; k++) {
    rt_param *r = &rt->prm[pu->params[k]];
    if (!r->sharded) continue;
    st = mp_comm_reduce_scatter(ctx, rt->comm, U->group, r->cg, U->rs + o, (size_t)r->numel_pad, MP_COMM_DTYPE_FP32,
                                MP_COMM_OP_SUM);
    o += (size_t)mp_act_rs_slot_floats(r->numel_pad);
    r->cg = NULL;
  }
  mp_status s2 = mp_comm_async_end(ctx, rt->comm, &U->rs_req);
  MP_CHECK(st);
  MP_CHECK(s2);
  U->rs_pending = 1;
  return MP_OK;
}

static mp_status unit_rs_finish(mp_ctx *ctx, mp_runtime *rt, int u) {
  rt_unit *U = &rt->units[u];
  if (!U->rs_pending) return MP_OK;
  U->rs_pending = 0;
  MP_CHECK(mp_comm_wait(ctx, rt->comm, &U->rs_req));
  const mp_fsdp_unit *pu = &rt->plan->units[u];
  size_t o = 0;
  for (int k = 0; k < pu->n_params; k++) {
    rt_param *r = &rt->prm[pu->params[k]];
    if (!r->sharded) continue;
    BE(accumulate_f32(rt->kc, r->g, U->rs + o, (size_t)r->numel_pad));
    o += (size_t)mp_act_rs_slot_floats(r->numel_pad);
  }
  MP_CHECK(mp_talloc_free(ctx, rt->ta, U->rs));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, U->gbuf));
  U->rs = NULL;
  U->gbuf = NULL;
  return MP_OK;
}

/* Every reduce-scatter still in flight (overlap), in unit order. */
static mp_status rs_finish_all(mp_ctx *ctx, mp_runtime *rt) {
  for (int u = 0; u < rt->n_units; u++) MP_CHECK(unit_rs_finish(ctx, rt, u));
  return MP_OK;
}

static mp_status unit_grad_end(mp_ctx *ctx, mp_runtime *rt, int u) {
  rt_unit *U = &rt->units[u];
  if (!U->sharded) return MP_OK;
  if (rt->overlap) { /* the previous unit's reduce-scatter has had this unit's backward to run */
    MP_CHECK(rs_finish_all(ctx, rt));
    return unit_rs_issue(ctx, rt, u);
  }
  float *tmp;
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, (size_t)U->max_pad * sizeof(float), (void **)&tmp));
  const mp_fsdp_unit *pu = &rt->plan->units[u];
  mp_status st = MP_OK;
  for (int k = 0; k < pu->n_params && st == MP_OK; k++) {
    rt_param *r = &rt->prm[pu->params[k]];
    if (!r->sharded) continue;
    st = mp_comm_reduce_scatter(ctx, rt->comm, U->group, r->cg, tmp, (size_t)r->numel_pad, MP_COMM_DTYPE_FP32,
                                MP_COMM_OP_SUM);
    if (st == MP_OK && rt->be->accumulate_f32(rt->kc, r->g, tmp, (size_t)r->numel_pad) != MP_OK)
      st = mp_error(ctx, MP_ERR_INTERNAL, "accumulating the gradient shard of %s: %s", rt->plan->params[pu->params[k]].fqn,
                    mp_errmsg(rt->kc->err));
    r->cg = NULL;
  }
  mp_status s2 = mp_talloc_free(ctx, rt->ta, tmp);
  MP_CHECK(st);
  MP_CHECK(s2);
  MP_CHECK(mp_talloc_free(ctx, rt->ta, U->gbuf));
  U->gbuf = NULL;
  return MP_OK;
}

/* Apply f to every unit of `layer` (-1: the root units outside blocks), in unit order. */
typedef mp_status (*unit_fn)(mp_ctx *, mp_runtime *, int);
static mp_status for_units(mp_ctx *ctx, mp_runtime *rt, int layer, unit_fn f) {
  for (int u = 0; u < rt->n_units; u++)
    if (rt->plan->units[u].layer == layer) MP_CHECK(f(ctx, rt, u));
  return MP_OK;
}

/* Overlap: the gathers of `layer`'s units as one async batch, issued before the compute
 * they should hide behind; gather_wait makes compute queued afterwards see them. Without
 * overlap gather_prefetch does nothing and gather_wait gathers (blocking), as before. */
static mp_status gather_prefetch(mp_ctx *ctx, mp_runtime *rt, int layer) {
  if (!rt->overlap || layer < 0 || layer >= rt->L) return MP_OK;
  for (int u = 0; u < rt->n_units; u++) {
    rt_unit *U = &rt->units[u];
    if (rt->plan->units[u].layer != layer || !U->sharded || U->buf) continue;
    MP_CHECK(mp_comm_async_begin(ctx, rt->comm));
    mp_status st = unit_gather(ctx, rt, u);
    mp_status s2 = mp_comm_async_end(ctx, rt->comm, &U->gather_req);
    MP_CHECK(st);
    MP_CHECK(s2);
  }
  return MP_OK;
}
static mp_status gather_wait(mp_ctx *ctx, mp_runtime *rt, int layer) {
  MP_CHECK(for_units(ctx, rt, layer, unit_gather)); /* no-op for a prefetched unit */
  for (int u = 0; u < rt->n_units; u++) {
    rt_unit *U = &rt->units[u];
    if (rt->plan->units[u].layer == layer && U->sharded) {
      MP_CHECK(mp_comm_wait(ctx, rt->comm, &U->gather_req));
      memset(&U->gather_req, 0, sizeof U->gather_req);
    }
  }
  return MP_OK;
}

/* ---- Linear with optional float8 emulation --------------------------------------------
 * torchao's Float8Linear with tensorwise dynamic scales: forward y = q4(x) q4(W)^T,
 * backward dx = q5(dy) q4(W), dW = q5(dy)^T q4(x) (q4: E4M3, q5: E5M2 fake quantization).
 * The amax is over the whole logical tensor: under tp the local pieces are reduced with
 * an all-reduce MAX, so every plan quantizes exactly as the single-rank run does. */

/* The known amax of x (n elements), or NULL (codes path only; see f8_known). */
static f8_known *f8_known_of(mp_runtime *rt, const void *x, size_t n) {
  for (int i = 0; i < rt->f8k_n; i++)
    if (rt->f8k[i].x == x && rt->f8k[i].n == n) return &rt->f8k[i];
  return NULL;
}
/* Records that *amax holds x's amax (reduced over tp or not). Forgotten at the scope's end;
 * a full table just means the consumer reads x for its amax again. */
static void f8_known_set(mp_runtime *rt, const void *x, size_t n, float *amax, int reduced) {
  f8_known *k = f8_known_of(rt, x, n);
  if (!k && rt->f8k_n < F8_KNOWN_MAX) k = &rt->f8k[rt->f8k_n++];
  if (k) *k = (f8_known){x, n, amax, reduced};
}

/* The scale of x (n elements, X) into scale: its amax all-reduced (MAX) over tp, the
 * tensor's dynamic tensorwise scale as the single-rank run would compute it. The amax is
 * read from a known one (f8_known) when there is one, else computed into amax. */
static mp_status f8_scale(mp_ctx *ctx, mp_runtime *rt, float *amax, float *scale, const void *x, size_t n,
                          mp_f8_format fmt) {
  f8_known *k = f8_known_of(rt, x, n);
  if (k) {
    amax = k->amax;
  } else {
    BE(f8_amax(rt->kc, amax, x, n));
  }
  if (rt->tp > 1 && !(k && k->reduced))
    MP_CHECK(mp_comm_all_reduce(ctx, rt->comm, MP_GROUP_TP, amax, amax, 1, MP_COMM_DTYPE_FP32, MP_COMM_OP_MAX));
  if (k) k->reduced = 1;
  BE(f8_scale_from_amax(rt->kc, scale, amax, fmt));
  return MP_OK;
}

/* CPU: fake quantization (dequantize(quantize(x))) into out, the exact emulation. */
static mp_status f8_fake(mp_ctx *ctx, mp_runtime *rt, void *out, const void *x, size_t n, mp_f8_format fmt) {
  float *amax = rt->scalar, *scale = rt->scalar + 1;
  MP_CHECK(f8_scale(ctx, rt, amax, scale, x, n, fmt));
  BE(f8_fake_quantize(rt->kc, out, x, scale, n, fmt));
  return MP_OK;
}

/* The backend emulates float8 (fake quantization + its matmul) when its X tensors are
 * fp32 (the CPU reference), and runs float8 GEMMs on codes otherwise (cuBLASLt); the
 * option f8_codes runs the codes path on fp32 X too (the CPU check of the CUDA path). */
static int f8_emulated(const mp_runtime *rt) { return !rt->f8_codes; }

/* ---- float8 GEMMs on codes (a backend whose X is not fp32) ----------------------------
 * torchao's tensorwise dynamic recipe as real float8 GEMMs: forward y = q4(x) q4(W)^T;
 * backward dx = q5(dy) q4(W) (B = W^T codes), dW = q5(dy)^T q4(x) (A = dy^T, B = x^T
 * codes: cuBLASLt's float8 GEMM wants both operands K-contiguous). A tensor is read once
 * for its amax and once for its codes (f8_quantize_t writes both orientations in that
 * pass); an activation read by several Linears of a block is quantized once inside the
 * block's scope; a weight that is not FSDP-sharded keeps its codes until the next
 * optimizer step changes it. */

/* Quantizes x (R, C) into o: codes (want_q) and/or transposed codes (want_qt). amax_to:
 * where a computed amax goes (NULL: the operand's own slot). */
static mp_status f8_quant(mp_ctx *ctx, mp_runtime *rt, f8_operand *o, const void *x, int R, int C, mp_f8_format fmt,
                          int want_q, int want_qt, void *mem, float *amax_to) {
  const size_t n = (size_t)R * C;
  const int owned = mem == NULL;
  if (owned) MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_FP8, (size_t)mp_act_f8_operand_bytes((int64_t)n), &mem));
  uint8_t *base = mem;
  memset(o, 0, sizeof *o);
  o->mem = owned ? mem : NULL;
  o->src = x;
  o->R = R;
  o->C = C;
  o->fmt = (int)fmt;
  o->q = want_q ? base : NULL;
  o->qt = want_qt ? base + mp_act_f8_qt_offset((int64_t)n) : NULL;
  o->amax = F32(base + mp_act_f8_amax_offset((int64_t)n));
  MP_CHECK(f8_scale(ctx, rt, amax_to ? amax_to : o->amax, o->amax + 1, x, n, fmt));
  BE(f8_quantize_t(rt->kc, o->q, o->qt, x, o->amax + 1, R, C, fmt)); /* one pass, both orientations */
  return MP_OK;
}

static void f8_scope_begin(mp_runtime *rt) {
  rt->f8_scope = 1;
  rt->f8_n = 0;
  rt->f8k_n = 0;
}
static mp_status f8_scope_end(mp_ctx *ctx, mp_runtime *rt) {
  mp_status st = MP_OK;
  for (int i = 0; i < rt->f8_n; i++) {
    mp_status s2 = mp_talloc_free(ctx, rt->ta, rt->f8s[i].mem);
    if (st == MP_OK) st = s2;
  }
  rt->f8_n = 0;
  rt->f8_scope = 0;
  rt->f8k_n = 0;
  return st;
}

/* The operand of activation x (R, C) in fmt with the orientations asked for: from the open
 * scope when x was quantized there already (E4M3 activations only: output gradients are
 * read once), else quantized now; *tmp says whether the caller frees it (f8_release). */
static mp_status f8_act(mp_ctx *ctx, mp_runtime *rt, const void *x, int R, int C, mp_f8_format fmt, int want_q,
                        int want_qt, f8_operand *tmpbuf, float *amax_to, f8_operand **out) {
  const int share = rt->f8_scope && fmt == MP_F8_E4M3;
  if (share)
    for (int i = 0; i < rt->f8_n; i++) {
      f8_operand *o = &rt->f8s[i];
      if (o->src == x && o->R == R && o->C == C && o->fmt == (int)fmt && (!want_q || o->q) && (!want_qt || o->qt)) {
        *out = o;
        return MP_OK;
      }
    }
  f8_operand *o = share && rt->f8_n < F8_SCOPE_MAX ? &rt->f8s[rt->f8_n] : tmpbuf;
  MP_CHECK(f8_quant(ctx, rt, o, x, R, C, fmt, want_q, want_qt, NULL, amax_to));
  if (o != tmpbuf) rt->f8_n++;
  *out = o;
  return MP_OK;
}
static mp_status f8_release(mp_ctx *ctx, mp_runtime *rt, f8_operand *o, const f8_operand *tmpbuf) {
  if (o != tmpbuf || !o->mem) return MP_OK;
  mp_status st = mp_talloc_free(ctx, rt->ta, o->mem);
  o->mem = NULL;
  return st;
}

/* The codes of parameter (layer, m)'s compute weight (M, K), both orientations: cached in
 * the parameter when it is not FSDP-sharded (its cw is then stable until the optimizer
 * step), else quantized into tmpbuf (the gathered weight changes at every gather). */
static mp_status f8_weight(mp_ctx *ctx, mp_runtime *rt, int layer, mp_module m, int M, int K, f8_operand *tmpbuf,
                           f8_operand **out) {
  rt_param *r = &rt->prm[*pslot(rt, layer, m)];
  if (r->sharded) {
    MP_CHECK(f8_quant(ctx, rt, tmpbuf, r->cw, M, K, MP_F8_E4M3, 1, 1, NULL, NULL));
    *out = tmpbuf;
    return MP_OK;
  }
  const size_t n = (size_t)M * K;
  if (!r->f8w)
    MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_FP8, (size_t)mp_act_f8_operand_bytes((int64_t)n), (void **)&r->f8w));
  memset(tmpbuf, 0, sizeof *tmpbuf);
  if (!r->f8w_valid) {
    MP_CHECK(f8_quant(ctx, rt, tmpbuf, r->cw, M, K, MP_F8_E4M3, 1, 1, r->f8w, NULL));
    r->f8w_valid = 1;
  }
  tmpbuf->src = r->cw;
  tmpbuf->R = M;
  tmpbuf->C = K;
  tmpbuf->q = r->f8w;
  tmpbuf->qt = r->f8w + mp_act_f8_qt_offset((int64_t)n);
  tmpbuf->amax = F32(r->f8w + mp_act_f8_amax_offset((int64_t)n));
  tmpbuf->mem = NULL; /* the parameter's: not the caller's to free */
  *out = tmpbuf;
  return MP_OK;
}

/* The reduced amax of activation src (mp_module_f8_source) of block l from its forward,
 * kept for the block's backward. */
static float *f8_fwd_slot(const mp_runtime *rt, int l, int src) { return rt->f8_fwd + 4 * (size_t)l + src; }

/* Where the producer of activation src of block l (RMSNorm, SwiGLU) writes its output's
 * amax in the same kernel, or NULL: the codes path with a backend that fuses it, and a
 * float8 Linear reading that activation. The caller then calls f8_produced. */
static float *f8_fused_amax(const mp_runtime *rt, int l, int src, mp_module reader) {
  if (!rt->f8_codes || !F8(rt, l, reader)) return NULL;
  const mp_backend *be = rt->be;
  if (src == 3 ? !be->swiglu_forward_amax : !be->rmsnorm_forward_amax) return NULL;
  return f8_fwd_slot(rt, l, src);
}
static void f8_produced(mp_runtime *rt, int l, int src, const void *x, size_t n) {
  f8_known_set(rt, x, n, f8_fwd_slot(rt, l, src), 0);
}

static mp_status lin_fwd(mp_ctx *ctx, mp_runtime *rt, int l, mp_module mod, void *out, const void *inp, int N, int K,
                         int M) {
  const void *w = W(rt, l, mod);
  if (!F8(rt, l, mod)) {
    BE(matmul_forward(rt->kc, out, inp, w, NULL, N, K, M));
    return MP_OK;
  }
  const size_t nx = (size_t)N * K, nw = (size_t)M * K;
  mp_status st;
  if (f8_emulated(rt)) {
    float *buf;
    MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_FP8, (size_t)mp_act_f8_emul_fwd_floats((int64_t)nx, (int64_t)nw) * sizeof(float),
                             (void **)&buf));
    float *qw = buf + mp_act_align16((int64_t)nx);
    st = f8_fake(ctx, rt, buf, inp, nx, MP_F8_E4M3);
    if (st == MP_OK) st = f8_fake(ctx, rt, qw, w, nw, MP_F8_E4M3);
    if (st == MP_OK && rt->be->matmul_forward(rt->kc, out, buf, qw, NULL, N, K, M) != MP_OK)
      st = mp_error(ctx, MP_ERR_INTERNAL, "float8 linear forward: %s", mp_errmsg(rt->kc->err));
    mp_status s2 = mp_talloc_free(ctx, rt->ta, buf);
    MP_CHECK(st);
    return s2;
  }
  f8_operand xb, wb, *xo = NULL, *wo = NULL;
  memset(&xb, 0, sizeof xb);
  const int src = l >= 0 ? mp_module_f8_source(mod) : -1;
  st = f8_act(ctx, rt, inp, N, K, MP_F8_E4M3, 1, 0, &xb, src >= 0 ? f8_fwd_slot(rt, l, src) : NULL, &xo);
  if (st == MP_OK) st = f8_weight(ctx, rt, l, mod, M, K, &wb, &wo);
  if (st == MP_OK && rt->be->matmul_f8(rt->kc, out, NULL, xo->q, xo->amax + 1, MP_F8_E4M3, wo->q, wo->amax + 1,
                                       MP_F8_E4M3, N, K, M, MP_F8_GEMM_FAST_ACCUM) != MP_OK)
    st = mp_error(ctx, MP_ERR_INTERNAL, "float8 linear forward: %s", mp_errmsg(rt->kc->err));
  mp_status s2 = wo ? f8_release(ctx, rt, wo, &wb) : MP_OK;
  mp_status s3 = xo ? f8_release(ctx, rt, xo, &xb) : MP_OK;
  MP_CHECK(st);
  MP_CHECK(s2);
  return s3;
}

/* dinp (N, K) += dout (N, M) W (M, K); the weight's gradient (M, K) += dout^T inp; dinp
 * may be NULL. */
static mp_status lin_bwd(mp_ctx *ctx, mp_runtime *rt, int l, mp_module mod, void *dinp, const void *dout,
                         const void *inp, int N, int K, int M) {
  const void *w = W(rt, l, mod);
  float *dw = G(rt, l, mod);
  if (!F8(rt, l, mod)) {
    BE(matmul_backward(rt->kc, dinp, dw, NULL, dout, inp, w, N, K, M));
    return MP_OK;
  }
  const size_t nd = (size_t)N * M, nx = (size_t)N * K, nw = (size_t)M * K;
  mp_status st;
  if (f8_emulated(rt)) {
    float *buf;
    MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_FP8,
                             (size_t)mp_act_f8_emul_bwd_floats((int64_t)nd, (int64_t)nx, (int64_t)nw) * sizeof(float),
                             (void **)&buf));
    float *qd = buf, *qx = buf + mp_act_align16((int64_t)nd), *qw = qx + mp_act_align16((int64_t)nx);
    st = f8_fake(ctx, rt, qd, dout, nd, MP_F8_E5M2);
    if (st == MP_OK) st = f8_fake(ctx, rt, qx, inp, nx, MP_F8_E4M3);
    if (st == MP_OK) st = f8_fake(ctx, rt, qw, w, nw, MP_F8_E4M3);
    if (st == MP_OK && rt->be->matmul_backward(rt->kc, dinp, dw, NULL, qd, qx, qw, N, K, M) != MP_OK)
      st = mp_error(ctx, MP_ERR_INTERNAL, "float8 linear backward: %s", mp_errmsg(rt->kc->err));
    mp_status s2 = mp_talloc_free(ctx, rt->ta, buf);
    MP_CHECK(st);
    return s2;
  }
  f8_operand db, wb, xb, *dyo = NULL, *wo = NULL, *xo = NULL;
  memset(&db, 0, sizeof db);
  memset(&xb, 0, sizeof xb);
  st = f8_act(ctx, rt, dout, N, M, MP_F8_E5M2, dinp != NULL, dw != NULL, &db, NULL, &dyo);
  if (st == MP_OK && dinp) { /* the GEMM adds into dinp (the contract here is +=) */
    st = f8_weight(ctx, rt, l, mod, M, K, &wb, &wo);
    if (st == MP_OK && rt->be->matmul_f8(rt->kc, dinp, NULL, dyo->q, dyo->amax + 1, MP_F8_E5M2, wo->qt, wo->amax + 1,
                                         MP_F8_E4M3, N, M, K, MP_F8_GEMM_ADD) != MP_OK)
      st = mp_error(ctx, MP_ERR_INTERNAL, "float8 linear backward (input gradient): %s", mp_errmsg(rt->kc->err));
  }
  if (st == MP_OK && dw) { /* x's amax: known from its forward (block_backward) */
    st = f8_act(ctx, rt, inp, N, K, MP_F8_E4M3, 0, 1, &xb, NULL, &xo);
    if (st == MP_OK && rt->be->matmul_f8(rt->kc, NULL, dw, dyo->qt, dyo->amax + 1, MP_F8_E5M2, xo->qt, xo->amax + 1,
                                         MP_F8_E4M3, M, N, K, 0) != MP_OK)
      st = mp_error(ctx, MP_ERR_INTERNAL, "float8 linear backward (weight gradient): %s", mp_errmsg(rt->kc->err));
  }
  mp_status s[3] = {wo ? f8_release(ctx, rt, wo, &wb) : MP_OK, xo ? f8_release(ctx, rt, xo, &xb) : MP_OK,
                    dyo ? f8_release(ctx, rt, dyo, &db) : MP_OK};
  MP_CHECK(st);
  for (int i = 0; i < 3; i++) MP_CHECK(s[i]);
  return MP_OK;
}

/* ---- expert parallelism ----------------------------------------------------------------
 * Permuted rows are grouped by expert, experts in order, so the rows bound for EP rank j
 * (experts [j El, (j+1) El)) are contiguous. Counts go first (El per destination), then
 * the rows; the received rows are laid out [source rank][local expert]. The combine is the
 * same exchange reversed. */

typedef struct ep_xfer {
  int64_t sc[64], sd[64], rc[64], rd[64]; /* elements, per EP rank */
} ep_xfer;

static void ep_counts(const mp_runtime *rt, int l, int64_t width, ep_xfer *x) {
  const int32_t *cnt = rt->counts_h + (size_t)l * rt->E;
  const int64_t *rc = rt->ep_rc + (size_t)l * rt->ep * rt->El;
  int64_t so = 0, ro = 0;
  for (int j = 0; j < rt->ep; j++) {
    int64_t s = 0, r = 0;
    for (int e = 0; e < rt->El; e++) {
      s += cnt[j * rt->El + e];
      r += rc[j * rt->El + e];
    }
    x->sc[j] = s * width;
    x->sd[j] = so;
    so += s * width;
    x->rc[j] = r * width;
    x->rd[j] = ro;
    ro += r * width;
  }
}

/* dispatch (dir 0): send-side (N*k rows, permuted) -> expert side (R rows); combine (1): back. */
static mp_status ep_exchange(mp_ctx *ctx, mp_runtime *rt, int l, int dir, const void *send, void *recv, int64_t width) {
  ep_xfer x;
  ep_counts(rt, l, width, &x);
  if (dir == 0)
    return mp_comm_all_to_all_v(ctx, rt->comm, MP_GROUP_EP, send, x.sc, x.sd, recv, x.rc, x.rd, rt->xdt);
  return mp_comm_all_to_all_v(ctx, rt->comm, MP_GROUP_EP, send, x.rc, x.rd, recv, x.sc, x.sd, rt->xdt);
}

/* Exchange the per-expert counts and size the expert side. */
static mp_status ep_plan(mp_ctx *ctx, mp_runtime *rt, int l) {
  const int ep = rt->ep, El = rt->El;
  const int32_t *cnt = rt->counts_h + (size_t)l * rt->E;
  int64_t send[64 * 8];
  int64_t *recv = rt->ep_rc + (size_t)l * ep * El;
  if (rt->E > 64 * 8 || ep > 64)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "the runtime's EP exchange handles up to 512 experts and ep <= 64");
  for (int e = 0; e < rt->E; e++) send[e] = cnt[e];
  MP_CHECK(host_coll(ctx, rt, MP_GROUP_EP, send, recv, (size_t)El, MP_COMM_DTYPE_INT64, -1, NULL));
  int64_t R = 0;
  for (int i = 0; i < ep * El; i++) R += recv[i];
  rt->ep_R[l] = R;
  if (R > rt->ep_R_max) rt->ep_R_max = R;
  return MP_OK;
}

/* The expert side's layout (EPA, EP_OUT, EP_WS) for R rows received. */
static void ep_layout(const mp_runtime *rt, int64_t R, mp_act_layout *y) {
  mp_act_dims d = rt->dims;
  d.R = R;
  mp_act_layout_fill(y, &d, 1);
}

/* ---- forward ------------------------------------------------------------------------- */

static mp_status attn_core_forward(mp_ctx *ctx, mp_runtime *rt, int l) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l], *c = rt->core[l];
  BE(attention_forward(rt->kc, c + y->att, F32(c + y->lse), a + y->q, a + y->k, a + y->v, rt->B, rt->T, rt->nhl,
                       rt->nkvl, rt->hd));
  return MP_OK;
}

/* Rows of block (s, e) on the expert side, blocks laid out [source][local expert]: rows
 * EP rank s sent for local expert e, or expert e's rows without EP (one source). */
static int expert_block_rows(const mp_runtime *rt, int l, int s, int e) {
  return rt->ep > 1 ? (int)rt->ep_rc[((size_t)l * rt->ep + s) * rt->El + e] : rt->counts_h[(size_t)l * rt->E + e];
}

/* The routed experts' forward on the expert side: per (source, local expert) block under
 * EP, per expert otherwise. in: rows (R, C); writes gate/up/hidden (R, Fe) and out (R, C). */
static mp_status experts_forward(mp_ctx *ctx, mp_runtime *rt, int l, const void *in, void *eg, void *eu, void *eh,
                                 void *out, int64_t R) {
  const size_t C = (size_t)rt->C, Fe = (size_t)rt->Fe;
  const int El = rt->El;
  const void *Wg = W(rt, l, MP_MOD_EXPERTS_GATE), *Wu = W(rt, l, MP_MOD_EXPERTS_UP), *Wd = W(rt, l, MP_MOD_EXPERTS_DOWN);
  size_t r0 = 0;
  for (int s = 0; s < rt->ep; s++)
    for (int e = 0; e < El; e++) {
      const int n = expert_block_rows(rt, l, s, e);
      if (!n) continue;
      BE(matmul_forward(rt->kc, xoff(rt, eg, r0 * Fe), xoff(rt, in, r0 * C), xoff(rt, Wg, (size_t)e * Fe * C), NULL,
                        n, (int)C, (int)Fe));
      BE(matmul_forward(rt->kc, xoff(rt, eu, r0 * Fe), xoff(rt, in, r0 * C), xoff(rt, Wu, (size_t)e * Fe * C), NULL,
                        n, (int)C, (int)Fe));
      r0 += (size_t)n;
    }
  BE(swiglu_forward(rt->kc, eh, eg, eu, (size_t)R * Fe));
  r0 = 0;
  for (int s = 0; s < rt->ep; s++)
    for (int e = 0; e < El; e++) {
      const int n = expert_block_rows(rt, l, s, e);
      if (!n) continue;
      BE(matmul_forward(rt->kc, xoff(rt, out, r0 * C), xoff(rt, eh, r0 * Fe), xoff(rt, Wd, (size_t)e * C * Fe), NULL,
                        n, (int)Fe, (int)C));
      r0 += (size_t)n;
    }
  return MP_OK;
}

/* A block's RMSNorm into xn1 (src 0) or xn2 (src 2), with its amax in the same kernel when
 * a float8 Linear on codes reads it (f8_fused_amax). */
static mp_status norm_fwd(mp_ctx *ctx, mp_runtime *rt, int l, int src, void *out, float *rstd, const void *x,
                          const void *w) {
  const int N = rt->N, C = rt->C;
  float *am = f8_fused_amax(rt, l, src, src == 0 ? MP_MOD_Q : MP_MOD_GATE);
  if (!am) {
    BE(rmsnorm_forward(rt->kc, out, rstd, x, w, N, C, rt->eps));
    return MP_OK;
  }
  BE(rmsnorm_forward_amax(rt->kc, out, rstd, x, w, N, C, rt->eps, am));
  f8_produced(rt, l, src, out, (size_t)N * C);
  return MP_OK;
}

/* Block l from x_in into the saved tensors; writes x_out unless it is NULL (recompute). */
static mp_status block_forward_body(mp_ctx *ctx, mp_runtime *rt, int l, const void *x_in, void *x_out,
                                    float *moe_aux) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l], *c = rt->core[l];
  const int N = rt->N, C = rt->C, QD = rt->nhl * rt->hd, KD = rt->nkvl * rt->hd;
  MP_CHECK(norm_fwd(ctx, rt, l, 0, a + y->xn1, F32(a + y->rstd1), x_in, W(rt, l, MP_MOD_ATTN_NORM)));
  MP_CHECK(lin_fwd(ctx, rt, l, MP_MOD_Q, a + y->q, a + y->xn1, N, C, QD));
  MP_CHECK(lin_fwd(ctx, rt, l, MP_MOD_K, a + y->k, a + y->xn1, N, C, KD));
  MP_CHECK(lin_fwd(ctx, rt, l, MP_MOD_V, a + y->v, a + y->xn1, N, C, KD));
  BE(rope_forward(rt->kc, a + y->q, a + y->q, rt->rope_cos, rt->rope_sin, rt->B, rt->T, rt->nhl, rt->hd));
  BE(rope_forward(rt->kc, a + y->k, a + y->k, rt->rope_cos, rt->rope_sin, rt->B, rt->T, rt->nkvl, rt->hd));
  MP_CHECK(attn_core_forward(ctx, rt, l));
  /* o is rowwise under tp: partial sums, reduced before the residual */
  MP_CHECK(lin_fwd(ctx, rt, l, MP_MOD_O, a + y->xmid, c + y->att, N, QD, C));
  MP_CHECK(tp_sum(ctx, rt, a + y->xmid, (size_t)N * C));
  BE(accumulate(rt->kc, a + y->xmid, x_in, (size_t)N * C));
  MP_CHECK(norm_fwd(ctx, rt, l, 2, a + y->xn2, F32(a + y->rstd2), a + y->xmid, W(rt, l, MP_MOD_FFN_NORM)));
  if (!is_moe_layer(rt, l)) {
    const int F = rt->Fl;
    MP_CHECK(lin_fwd(ctx, rt, l, MP_MOD_GATE, a + y->g, a + y->xn2, N, C, F));
    MP_CHECK(lin_fwd(ctx, rt, l, MP_MOD_UP, a + y->u, a + y->xn2, N, C, F));
    float *am = f8_fused_amax(rt, l, 3, MP_MOD_DOWN);
    if (am) {
      BE(swiglu_forward_amax(rt->kc, a + y->h, a + y->g, a + y->u, (size_t)N * F, am));
      f8_produced(rt, l, 3, a + y->h, (size_t)N * F);
    } else {
      BE(swiglu_forward(rt->kc, a + y->h, a + y->g, a + y->u, (size_t)N * F));
    }
    if (x_out) {
      MP_CHECK(lin_fwd(ctx, rt, l, MP_MOD_DOWN, x_out, a + y->h, N, F, C));
      MP_CHECK(tp_sum(ctx, rt, x_out, (size_t)N * C));
      BE(accumulate(rt->kc, x_out, a + y->xmid, (size_t)N * C));
    }
    return MP_OK;
  }
  const int E = rt->E, K = rt->K, Fs = rt->Fsl;
  const mp_model *m = &rt->plan->model;
  BE(matmul_forward(rt->kc, a + y->rl, a + y->xn2, W(rt, l, MP_MOD_ROUTER), NULL, N, C, E));
  BE(router_forward(rt->kc, F32(a + y->probs), (int32_t *)(a + y->tki), F32(a + y->tkw), a + y->rl, N, E, K,
                    m->norm_topk_prob));
  BE(router_aux_loss_forward(rt->kc, F32(a + y->aux), F32(a + y->f), F32(a + y->probs), (const int32_t *)(a + y->tki),
                             N, E, K));
  if (moe_aux) BE(memcpy_d2h(rt->kc, moe_aux, a + y->aux, sizeof(float)));
  BE(moe_plan(rt->kc, (int32_t *)(a + y->perm), (int32_t *)(a + y->inv), (int32_t *)(a + y->counts),
              (const int32_t *)(a + y->tki), N, E, K));
  int32_t *cnt = rt->counts_h + (size_t)l * E;
  BE(memcpy_d2h(rt->kc, cnt, a + y->counts, (size_t)E * sizeof(int32_t)));
  BE(permute_forward(rt->kc, a + y->xp, a + y->xn2, (const int32_t *)(a + y->perm), N, K, C));
  if (rt->ep == 1) {
    MP_CHECK(experts_forward(ctx, rt, l, a + y->xp, a + y->eg, a + y->eu, a + y->eh, a + y->ey, (int64_t)N * K));
  } else {
    MP_CHECK(ep_plan(ctx, rt, l));
    const int64_t R = rt->ep_R[l];
    mp_act_layout ey;
    ep_layout(rt, R, &ey);
    if (!rt->epa[l])
      MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, ey.bytes[MP_ACT_ALLOC_EPA], (void **)&rt->epa[l]));
    char *xr = rt->epa[l] + ey.ep_xr, *eg = rt->epa[l] + ey.ep_eg, *eu = rt->epa[l] + ey.ep_eu,
         *eh = rt->epa[l] + ey.ep_eh;
    MP_CHECK(ep_exchange(ctx, rt, l, 0, a + y->xp, xr, C));
    void *eyl;
    MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_COMM, ey.bytes[MP_ACT_ALLOC_EP_OUT], &eyl));
    mp_status st = experts_forward(ctx, rt, l, xr, eg, eu, eh, eyl, R);
    if (st == MP_OK) st = ep_exchange(ctx, rt, l, 1, eyl, a + y->ey, C);
    mp_status s2 = mp_talloc_free(ctx, rt->ta, eyl);
    MP_CHECK(st);
    MP_CHECK(s2);
  }
  if (Fs) {
    BE(matmul_forward(rt->kc, a + y->sg, a + y->xn2, W(rt, l, MP_MOD_SHARED_GATE), NULL, N, C, Fs));
    BE(matmul_forward(rt->kc, a + y->su, a + y->xn2, W(rt, l, MP_MOD_SHARED_UP), NULL, N, C, Fs));
    BE(swiglu_forward(rt->kc, a + y->sh, a + y->sg, a + y->su, (size_t)N * Fs));
  }
  if (!x_out) return MP_OK;
  BE(unpermute_forward(rt->kc, x_out, a + y->ey, F32(a + y->tkw), (const int32_t *)(a + y->inv), N, K, C));
  if (Fs) { /* shared expert: rowwise down under tp, reduced before joining the routed output */
    void *tmp;
    MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_TEMP, y->bytes[MP_ACT_ALLOC_SHARED_OUT], &tmp));
    mp_status s = rt->be->matmul_forward(rt->kc, tmp, a + y->sh, W(rt, l, MP_MOD_SHARED_DOWN), NULL, N, Fs, C);
    if (s != MP_OK) s = mp_error(ctx, s, "shared expert forward: %s", mp_errmsg(rt->kc->err));
    if (s == MP_OK) s = tp_sum(ctx, rt, tmp, (size_t)N * C);
    if (s == MP_OK && rt->be->accumulate(rt->kc, x_out, tmp, (size_t)N * C) != MP_OK)
      s = mp_error(ctx, MP_ERR_INTERNAL, "shared expert forward: %s", mp_errmsg(rt->kc->err));
    mp_status s2 = mp_talloc_free(ctx, rt->ta, tmp);
    MP_CHECK(s);
    MP_CHECK(s2);
  }
  BE(accumulate(rt->kc, x_out, a + y->xmid, (size_t)N * C));
  return MP_OK;
}

/* A block's float8 activations are shared by its Linears (f8_scope_begin) and freed with it. */
static mp_status block_forward(mp_ctx *ctx, mp_runtime *rt, int l, const void *x_in, void *x_out, float *moe_aux) {
  f8_scope_begin(rt);
  mp_status st = block_forward_body(ctx, rt, l, x_in, x_out, moe_aux);
  mp_status s2 = f8_scope_end(ctx, rt);
  MP_CHECK(st);
  return s2;
}

static mp_status alloc_block(mp_ctx *ctx, mp_runtime *rt, int l) {
  const mp_act_layout *y = lay_of(rt, l);
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, y->bytes[MP_ACT_ALLOC_BLOCK], (void **)&rt->act[l]));
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, y->bytes[MP_ACT_ALLOC_CORE], (void **)&rt->core[l]));
  return MP_OK;
}
static mp_status free_block(mp_ctx *ctx, mp_runtime *rt, int l) {
  MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->core[l]));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->act[l]));
  if (rt->epa[l]) MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->epa[l]));
  rt->core[l] = NULL;
  rt->act[l] = NULL;
  rt->epa[l] = NULL;
  return MP_OK;
}

/* ---- backward ------------------------------------------------------------------------ */

/* Routed experts' backward on the expert side: dout (R, C) -> din (R, C) (+=), weight
 * gradients of the local experts. */
static mp_status experts_backward(mp_ctx *ctx, mp_runtime *rt, int l, void *din, void *deg, void *deu, void *deh,
                                  const void *dout, const void *in, const void *eg, const void *eu,
                                  const void *eh, int64_t R) {
  const size_t C = (size_t)rt->C, Fe = (size_t)rt->Fe;
  const int El = rt->El;
  const void *Wg = W(rt, l, MP_MOD_EXPERTS_GATE), *Wu = W(rt, l, MP_MOD_EXPERTS_UP), *Wd = W(rt, l, MP_MOD_EXPERTS_DOWN);
  float *dWg = G(rt, l, MP_MOD_EXPERTS_GATE), *dWu = G(rt, l, MP_MOD_EXPERTS_UP), *dWd = G(rt, l, MP_MOD_EXPERTS_DOWN);
  size_t r0 = 0;
  for (int s = 0; s < rt->ep; s++)
    for (int e = 0; e < El; e++) {
      const int n = expert_block_rows(rt, l, s, e);
      if (!n) continue;
      BE(matmul_backward(rt->kc, xoff(rt, deh, r0 * Fe), dWd + (size_t)e * C * Fe, NULL, xoff(rt, dout, r0 * C),
                         xoff(rt, eh, r0 * Fe), xoff(rt, Wd, (size_t)e * C * Fe), n, (int)Fe, (int)C));
      r0 += (size_t)n;
    }
  BE(swiglu_backward(rt->kc, deg, deu, deh, eg, eu, (size_t)R * Fe));
  r0 = 0;
  for (int s = 0; s < rt->ep; s++)
    for (int e = 0; e < El; e++) {
      const int n = expert_block_rows(rt, l, s, e);
      if (!n) continue;
      BE(matmul_backward(rt->kc, xoff(rt, din, r0 * C), dWg + (size_t)e * Fe * C, NULL, xoff(rt, deg, r0 * Fe),
                         xoff(rt, in, r0 * C), xoff(rt, Wg, (size_t)e * Fe * C), n, (int)C, (int)Fe));
      BE(matmul_backward(rt->kc, xoff(rt, din, r0 * C), dWu + (size_t)e * Fe * C, NULL, xoff(rt, deu, r0 * Fe),
                         xoff(rt, in, r0 * C), xoff(rt, Wu, (size_t)e * Fe * C), n, (int)C, (int)Fe));
      r0 += (size_t)n;
    }
  return MP_OK;
}

static mp_status block_backward_body(mp_ctx *ctx, mp_runtime *rt, int l, void *dres, char *ws, float dloss_aux) {
  const mp_act_layout *y = lay_of(rt, l);
  char *a = rt->act[l], *c = rt->core[l];
  const void *x_in = rt->x[l];
  const int N = rt->N, C = rt->C, QD = rt->nhl * rt->hd, KD = rt->nkvl * rt->hd;
  if (!is_moe_layer(rt, l)) {
    const int F = rt->Fl;
    MP_CHECK(lin_bwd(ctx, rt, l, MP_MOD_DOWN, ws + y->dh, dres, a + y->h, N, F, C));
    if (rt->f8_codes && F8(rt, l, MP_MOD_GATE) && F8(rt, l, MP_MOD_UP) && rt->be->swiglu_backward_amax) {
      /* gate's and up's output gradients, each with its amax (rt->scalar[2], [3]) */
      BE(swiglu_backward_amax(rt->kc, ws + y->dg, ws + y->du, ws + y->dh, a + y->g, a + y->u, (size_t)N * F,
                              rt->scalar + 2, rt->scalar + 3));
      f8_known_set(rt, ws + y->dg, (size_t)N * F, rt->scalar + 2, 0);
      f8_known_set(rt, ws + y->du, (size_t)N * F, rt->scalar + 3, 0);
    } else {
      BE(swiglu_backward(rt->kc, ws + y->dg, ws + y->du, ws + y->dh, a + y->g, a + y->u, (size_t)N * F));
    }
    MP_CHECK(lin_bwd(ctx, rt, l, MP_MOD_GATE, ws + y->dxn, ws + y->dg, a + y->xn2, N, C, F));
    MP_CHECK(lin_bwd(ctx, rt, l, MP_MOD_UP, ws + y->dxn, ws + y->du, a + y->xn2, N, C, F));
    MP_CHECK(tp_sum(ctx, rt, ws + y->dxn, (size_t)N * C)); /* colwise gate/up: partial input gradients */
  } else {
    const int E = rt->E, K = rt->K, Fs = rt->Fsl;
    const mp_model *m = &rt->plan->model;
    if (Fs) {
      BE(matmul_backward(rt->kc, ws + y->dsh, G(rt, l, MP_MOD_SHARED_DOWN), NULL, dres, a + y->sh,
                         W(rt, l, MP_MOD_SHARED_DOWN), N, Fs, C));
      BE(swiglu_backward(rt->kc, ws + y->dsg, ws + y->dsu, ws + y->dsh, a + y->sg, a + y->su, (size_t)N * Fs));
      BE(matmul_backward(rt->kc, ws + y->dxn, G(rt, l, MP_MOD_SHARED_GATE), NULL, ws + y->dsg, a + y->xn2,
                         W(rt, l, MP_MOD_SHARED_GATE), N, C, Fs));
      BE(matmul_backward(rt->kc, ws + y->dxn, G(rt, l, MP_MOD_SHARED_UP), NULL, ws + y->dsu, a + y->xn2,
                         W(rt, l, MP_MOD_SHARED_UP), N, C, Fs));
      /* only the shared expert is tp-sharded: reduce its partial sums before the routed
       * experts and router (replicated over tp) add their whole contributions */
      MP_CHECK(tp_sum(ctx, rt, ws + y->dxn, (size_t)N * C));
    }
    BE(unpermute_backward(rt->kc, ws + y->dey, F32(ws + y->dtkw), dres, a + y->ey, F32(a + y->tkw),
                          (const int32_t *)(a + y->inv), N, K, C));
    if (rt->ep == 1) {
      MP_CHECK(experts_backward(ctx, rt, l, ws + y->dxp, ws + y->deg, ws + y->deu, ws + y->deh, ws + y->dey, a + y->xp,
                                a + y->eg, a + y->eu, a + y->eh, (int64_t)N * K));
    } else {
      const int64_t R = rt->ep_R[l];
      mp_act_layout ey;
      ep_layout(rt, R, &ey);
      const char *xr = rt->epa[l] + ey.ep_xr, *eg = rt->epa[l] + ey.ep_eg, *eu = rt->epa[l] + ey.ep_eu,
                 *eh = rt->epa[l] + ey.ep_eh;
      char *w2; /* the expert side's workspace */
      MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, ey.bytes[MP_ACT_ALLOC_EP_WS], (void **)&w2));
      char *deyl = w2 + ey.ep_dey, *dxr = w2 + ey.ep_dxr, *deh = w2 + ey.ep_deh, *deg = w2 + ey.ep_deg,
           *deu = w2 + ey.ep_deu;
      mp_status st = ep_exchange(ctx, rt, l, 0, ws + y->dey, deyl, C); /* w2 came zero-filled */
      if (st == MP_OK) st = experts_backward(ctx, rt, l, dxr, deg, deu, deh, deyl, xr, eg, eu, eh, R);
      if (st == MP_OK) st = ep_exchange(ctx, rt, l, 1, dxr, ws + y->dxp, C);
      mp_status s2 = mp_talloc_free(ctx, rt->ta, w2);
      MP_CHECK(st);
      MP_CHECK(s2);
    }
    BE(permute_backward(rt->kc, ws + y->dxn, ws + y->dxp, (const int32_t *)(a + y->inv), N, K, C));
    BE(router_aux_loss_backward(rt->kc, F32(ws + y->dprobs), F32(a + y->f), dloss_aux, N, E));
    BE(router_backward(rt->kc, ws + y->drl, F32(ws + y->dtkw), F32(ws + y->dprobs), F32(a + y->probs),
                       (const int32_t *)(a + y->tki), N, E, K, m->norm_topk_prob));
    BE(matmul_backward(rt->kc, ws + y->dxn, G(rt, l, MP_MOD_ROUTER), NULL, ws + y->drl, a + y->xn2,
                       W(rt, l, MP_MOD_ROUTER), N, C, E));
  }
  BE(rmsnorm_backward(rt->kc, dres, G(rt, l, MP_MOD_FFN_NORM), ws + y->dxn, a + y->xmid, W(rt, l, MP_MOD_FFN_NORM),
                      F32(a + y->rstd2), N, C));
  /* attention: dres now holds dL/dxmid */
  BE(memset_zero(rt->kc, ws + y->dxn, (size_t)N * C * rt->xs));
  MP_CHECK(lin_bwd(ctx, rt, l, MP_MOD_O, ws + y->datt, dres, c + y->att, N, QD, C));
  BE(attention_backward(rt->kc, ws + y->dq, ws + y->dk, ws + y->dv, ws + y->datt, a + y->q, a + y->k, a + y->v,
                        c + y->att, F32(c + y->lse), rt->B, rt->T, rt->nhl, rt->nkvl, rt->hd));
  BE(rope_backward(rt->kc, ws + y->dqp, ws + y->dq, rt->rope_cos, rt->rope_sin, rt->B, rt->T, rt->nhl, rt->hd));
  BE(rope_backward(rt->kc, ws + y->dkp, ws + y->dk, rt->rope_cos, rt->rope_sin, rt->B, rt->T, rt->nkvl, rt->hd));
  MP_CHECK(lin_bwd(ctx, rt, l, MP_MOD_Q, ws + y->dxn, ws + y->dqp, a + y->xn1, N, C, QD));
  MP_CHECK(lin_bwd(ctx, rt, l, MP_MOD_K, ws + y->dxn, ws + y->dkp, a + y->xn1, N, C, KD));
  MP_CHECK(lin_bwd(ctx, rt, l, MP_MOD_V, ws + y->dxn, ws + y->dv, a + y->xn1, N, C, KD));
  MP_CHECK(tp_sum(ctx, rt, ws + y->dxn, (size_t)N * C)); /* colwise q/k/v: partial input gradients */
  BE(rmsnorm_backward(rt->kc, dres, G(rt, l, MP_MOD_ATTN_NORM), ws + y->dxn, x_in, W(rt, l, MP_MOD_ATTN_NORM),
                      F32(a + y->rstd1), N, C));
  return MP_OK;
}

static mp_status block_backward(mp_ctx *ctx, mp_runtime *rt, int l, void *dres, char *ws, float dloss_aux) {
  f8_scope_begin(rt);
  if (rt->f8_codes) { /* the weight gradients' inputs: their amax from this micro-batch's forward */
    const mp_act_layout *y = lay_of(rt, l);
    char *a = rt->act[l], *c = rt->core[l];
    const size_t N = (size_t)rt->N;
    const void *x[4] = {a + y->xn1, c + y->att, a + y->xn2, a + y->h};
    const size_t n[4] = {N * rt->C, N * rt->nhl * rt->hd, N * rt->C, N * rt->Fl};
    /* every float8 Linear's forward wrote its activation's slot in this micro-batch */
    unsigned kept = 0;
    for (int m = 0; m < MP_MOD_COUNT; m++)
      if (mp_module_f8_source((mp_module)m) >= 0 && F8(rt, l, (mp_module)m)) kept |= 1u << mp_module_f8_source((mp_module)m);
    for (int src = 0; src < 4; src++)
      if (kept & (1u << src)) f8_known_set(rt, x[src], n[src], f8_fwd_slot(rt, l, src), 1);
  }
  mp_status st = block_backward_body(ctx, rt, l, dres, ws, dloss_aux);
  mp_status s2 = f8_scope_end(ctx, rt);
  MP_CHECK(st);
  return s2;
}

/* One micro-batch: forward, loss, backward. Adds this micro-batch's CE mean and aux sum. */
/* ---- the step program, walked -------------------------------------------------------
 * One micro-batch is the schedule's step program (exec/schedule.h, mp_schedule_step_program,
 * built at creation from this rank's schedule under the memory model of this backend):
 * the schedule decides the order, where gathers are issued and released, what AC drops
 * and recomputes, where gradients are reduced; each action below is this runtime's
 * kernels and collectives for it. */

/* What the actions of one micro-batch hand each other. */
typedef struct micro_state {
  const int32_t *seqs;
  int32_t *tok;       /* token ids then targets (TEMP) */
  char *hf, *lg;      /* head: xf + rstdf (ACTIVATIONS); logits and loss scratch (LOGITS) */
  void *dres;         /* residual-stream gradient (TEMP) */
  int x_top;          /* highest x[i] held */
  double aux_sum, dscale;
  double *ce, *aux;
} micro_state;

static mp_status act_tokens(mp_ctx *ctx, mp_runtime *rt, micro_state *ms) {
  const int N = rt->N, V = rt->V, T = rt->T;
  /* Token ids: inputs are the first T of each T + 1 window, targets the last T. */
  int32_t *hin = malloc((size_t)N * 2 * sizeof(int32_t));
  MP_CHECK_ALLOC(ctx, hin);
  for (int b = 0; b < rt->B; b++)
    for (int t = 0; t < T; t++) {
      hin[b * T + t] = ms->seqs[(size_t)b * (T + 1) + t];
      hin[N + b * T + t] = ms->seqs[(size_t)b * (T + 1) + t + 1];
    }
  for (int i = 0; i < N; i++)
    if (hin[i] < 0 || hin[i] >= V || hin[N + i] < 0 || hin[N + i] >= V) {
      int bad = hin[i] < 0 || hin[i] >= V ? hin[i] : hin[N + i];
      free(hin);
      return mp_error(ctx, MP_ERR_INVALID, "token id %d is outside the model's vocabulary of %d; the data does not "
                      "match --model", bad, V);
    }
  const size_t tb = rt->lay_dense.bytes[MP_ACT_ALLOC_TOKENS]; /* ids, then targets */
  mp_status st = mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, tb, (void **)&ms->tok);
  if (st == MP_OK) st = rt->be->memcpy_h2d(rt->kc, ms->tok, hin, tb);
  free(hin);
  MP_CHECK(st);
  rt->tok_in = ms->tok;
  rt->tok_tgt = ms->tok + N;
  return MP_OK;
}

/* A layer's units (-1: the root units) gathered: issued as one async batch with overlap
 * (the block waits for it, gather_wait), blocking without. */
static mp_status act_gather(mp_ctx *ctx, mp_runtime *rt, int layer) {
  if (layer >= 0 && rt->overlap) return gather_prefetch(ctx, rt, layer);
  return for_units(ctx, rt, layer, unit_gather);
}

static mp_status act_embed_fwd(mp_ctx *ctx, mp_runtime *rt, micro_state *ms) {
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, rt->lay_dense.bytes[MP_ACT_ALLOC_X], (void **)&rt->x[0]));
  BE(embedding_forward(rt->kc, rt->x[0], rt->tok_in, W(rt, -1, MP_MOD_TOK_EMBEDDINGS), rt->N, rt->C, rt->v0,
                       rt->v0 + rt->Vl));
  MP_CHECK(tp_sum(ctx, rt, rt->x[0], (size_t)rt->N * rt->C)); /* vocab-parallel lookup */
  ms->x_top = 0;
  return MP_OK;
}

static mp_status act_block_fwd(mp_ctx *ctx, mp_runtime *rt, micro_state *ms, int l) {
  MP_CHECK(gather_wait(ctx, rt, l));
  MP_CHECK(alloc_block(ctx, rt, l));
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, rt->lay_dense.bytes[MP_ACT_ALLOC_X], (void **)&rt->x[l + 1]));
  float auxv = 0;
  MP_CHECK(block_forward(ctx, rt, l, rt->x[l], rt->x[l + 1], &auxv));
  if (is_moe_layer(rt, l)) ms->aux_sum += auxv;
  ms->x_top = l + 1;
  return MP_OK;
}

/* head: final norm (its saved tensors in one HEAD block), logits (the rank's vocabulary
 * slice under tp) and loss (vocab-parallel under tp) in one LOGITS block */
static const void *head_weight(const mp_runtime *rt) {
  return W(rt, -1, rt->plan->model.tied_embeddings ? MP_MOD_TOK_EMBEDDINGS : MP_MOD_OUTPUT);
}

static mp_status act_head_fwd(mp_ctx *ctx, mp_runtime *rt, micro_state *ms) {
  const int N = rt->N, C = rt->C, V = rt->V, L = rt->L, Vl = rt->Vl;
  const mp_act_layout *y = &rt->lay_dense;
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, y->bytes[MP_ACT_ALLOC_HEAD], (void **)&ms->hf));
  void *xf = ms->hf + y->xf;
  float *rstdf = F32(ms->hf + y->rstdf);
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_LOGITS, y->bytes[MP_ACT_ALLOC_LOGITS], (void **)&ms->lg));
  char *lg = ms->lg;
  void *logits = lg + y->logits;
  float *losses = F32(lg + y->losses), *lse = F32(lg + y->ce_lse), *mean = F32(lg + y->ce_mean);
  const void *Wout = head_weight(rt);
  if (!Wout) return mp_error(ctx, MP_ERR_INTERNAL, "runtime: plan has no output head");
  BE(rmsnorm_forward(rt->kc, xf, rstdf, rt->x[L], W(rt, -1, MP_MOD_FINAL_NORM), N, C, rt->eps));
  BE(matmul_forward(rt->kc, logits, xf, Wout, NULL, N, C, Vl));
  if (rt->tp == 1) {
    BE(cross_entropy_forward(rt->kc, losses, mean, lse, logits, rt->tok_tgt, N, V));
  } else {
    float *gmax = F32(lg + y->vp_max), *gsum = F32(lg + y->vp_sumexp), *gtgt = F32(lg + y->vp_target);
    BE(ce_local_max(rt->kc, gmax, logits, N, Vl));
    MP_CHECK(mp_comm_all_reduce(ctx, rt->comm, MP_GROUP_TP, gmax, gmax, (size_t)N, MP_COMM_DTYPE_FP32, MP_COMM_OP_MAX));
    BE(ce_local_sumexp(rt->kc, gsum, logits, gmax, N, Vl));
    BE(ce_local_target(rt->kc, gtgt, logits, rt->tok_tgt, N, Vl, rt->v0));
    MP_CHECK(tp_sum_f32(ctx, rt, gsum, (size_t)N));
    MP_CHECK(tp_sum_f32(ctx, rt, gtgt, (size_t)N));
    BE(ce_vp_combine(rt->kc, losses, mean, lse, gmax, gsum, gtgt, rt->tok_tgt, N));
  }
  float ce_mean;
  BE(memcpy_d2h(rt->kc, &ce_mean, mean, sizeof ce_mean));
  *ms->ce += ce_mean * ms->dscale;
  *ms->aux += rt->plan->model.aux_loss_coef * ms->aux_sum * ms->dscale;
  return MP_OK;
}

static mp_status act_head_bwd(mp_ctx *ctx, mp_runtime *rt, micro_state *ms) {
  const int N = rt->N, C = rt->C, L = rt->L, Vl = rt->Vl;
  const mp_act_layout *y = &rt->lay_dense;
  const mp_model *m = &rt->plan->model;
  void *xf = ms->hf + y->xf, *logits = ms->lg + y->logits;
  float *rstdf = F32(ms->hf + y->rstdf), *lse = F32(ms->lg + y->ce_lse);
  const void *Wout = head_weight(rt);
  float *dWout = G(rt, -1, m->tied_embeddings ? MP_MOD_TOK_EMBEDDINGS : MP_MOD_OUTPUT);
  void *dlg, *dxf;
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_LOGITS, y->bytes[MP_ACT_ALLOC_DLOGITS], &dlg));
  BE(ce_backward(rt->kc, dlg, logits, lse, rt->tok_tgt, (float)(ms->dscale / N), N, Vl, rt->v0));
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, y->bytes[MP_ACT_ALLOC_DRES], &ms->dres));
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, y->bytes[MP_ACT_ALLOC_DXF], &dxf));
  BE(matmul_backward(rt->kc, dxf, dWout, NULL, dlg, xf, Wout, N, C, Vl));
  MP_CHECK(tp_sum(ctx, rt, dxf, (size_t)N * C)); /* colwise head: partial over the vocabulary */
  MP_CHECK(mp_talloc_free(ctx, rt->ta, dlg));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, ms->lg));
  ms->lg = NULL;
  BE(rmsnorm_backward(rt->kc, ms->dres, G(rt, -1, MP_MOD_FINAL_NORM), dxf, rt->x[L], W(rt, -1, MP_MOD_FINAL_NORM),
                      rstdf, N, C));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, dxf));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, ms->hf));
  ms->hf = NULL;
  return MP_OK;
}

static mp_status act_recompute(mp_ctx *ctx, mp_runtime *rt, int l, int full) {
  MP_CHECK(gather_wait(ctx, rt, l));
  if (full) { /* the whole block from its saved input */
    MP_CHECK(alloc_block(ctx, rt, l));
    return block_forward(ctx, rt, l, rt->x[l], NULL, NULL);
  }
  /* the attention core from the saved q, k, v */
  MP_CHECK(mp_talloc_alloc_uninit(ctx, rt->ta, MP_MEM_ACTIVATIONS, lay_of(rt, l)->bytes[MP_ACT_ALLOC_CORE], (void **)&rt->core[l]));
  return attn_core_forward(ctx, rt, l);
}

static mp_status act_block_bwd(mp_ctx *ctx, mp_runtime *rt, micro_state *ms, int l) {
  MP_CHECK(gather_wait(ctx, rt, l)); /* no-op when already gathered */
  char *ws;
  MP_CHECK(mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, lay_of(rt, l)->bytes[MP_ACT_ALLOC_WS], (void **)&ws));
  MP_CHECK(block_backward(ctx, rt, l, ms->dres, ws, (float)(rt->plan->model.aux_loss_coef * ms->dscale)));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, ws));
  return free_block(ctx, rt, l);
}

static mp_status act_free_x(mp_ctx *ctx, mp_runtime *rt, micro_state *ms) {
  if (ms->x_top < 0) return mp_error(ctx, MP_ERR_INTERNAL, "step program: frees a residual-stream tensor too many");
  MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->x[ms->x_top]));
  rt->x[ms->x_top--] = NULL;
  return MP_OK;
}

static mp_status act_embed_bwd(mp_ctx *ctx, mp_runtime *rt, micro_state *ms) {
  BE(embedding_backward(rt->kc, G(rt, -1, MP_MOD_TOK_EMBEDDINGS), ms->dres, rt->tok_in, rt->N, rt->C, rt->v0,
                        rt->v0 + rt->Vl));
  MP_CHECK(mp_talloc_free(ctx, rt->ta, ms->dres));
  ms->dres = NULL;
  return MP_OK;
}

static mp_status act_run(mp_ctx *ctx, mp_runtime *rt, micro_state *ms, const mp_step_action *a) {
  switch ((mp_step_act)a->kind) {
    case MP_ACT_TOKENS: return act_tokens(ctx, rt, ms);
    case MP_ACT_GATHER: return act_gather(ctx, rt, a->a);
    case MP_ACT_EMBED_FWD: return act_embed_fwd(ctx, rt, ms);
    case MP_ACT_BLOCK_FWD: return act_block_fwd(ctx, rt, ms, a->a);
    case MP_ACT_FREE_CORE: {
      MP_CHECK(mp_talloc_free(ctx, rt->ta, rt->core[a->a]));
      rt->core[a->a] = NULL;
      return MP_OK;
    }
    case MP_ACT_FREE_BLOCK: return free_block(ctx, rt, a->a);
    case MP_ACT_RELEASE: return unit_release(ctx, rt, a->a);
    case MP_ACT_HEAD_FWD: return act_head_fwd(ctx, rt, ms);
    case MP_ACT_GRAD_BEGIN: return unit_grad_begin(ctx, rt, a->a);
    case MP_ACT_HEAD_BWD: return act_head_bwd(ctx, rt, ms);
    case MP_ACT_RECOMPUTE: return act_recompute(ctx, rt, a->a, a->b);
    case MP_ACT_BLOCK_BWD: return act_block_bwd(ctx, rt, ms, a->a);
    case MP_ACT_GRAD_END: return unit_grad_end(ctx, rt, a->a);
    case MP_ACT_FREE_X: return act_free_x(ctx, rt, ms);
    case MP_ACT_EMBED_BWD: return act_embed_bwd(ctx, rt, ms);
    case MP_ACT_FREE_TOKENS: {
      MP_CHECK(mp_talloc_free(ctx, rt->ta, ms->tok));
      ms->tok = NULL;
      rt->tok_in = rt->tok_tgt = NULL;
      return MP_OK;
    }
    case MP_ACT_RS_FINISH: return rs_finish_all(ctx, rt);
    default: return mp_error(ctx, MP_ERR_INTERNAL, "step program: unknown action %d", a->kind);
  }
}

static mp_status micro_step(mp_ctx *ctx, mp_runtime *rt, const int32_t *seqs, double *ce, double *aux) {
  micro_state ms = {seqs, NULL, NULL, NULL, NULL, -1, 0.0, 1.0 / ((double)rt->n_micro * rt->dp_size), ce, aux};
  for (int32_t i = 0; i < rt->n_prog; i++) {
    MP_CHECK(act_run(ctx, rt, &ms, &rt->prog[i]));
  }
  if (ms.tok || ms.hf || ms.lg || ms.dres || ms.x_top >= 0)
    return mp_error(ctx, MP_ERR_INTERNAL, "step program: the micro-batch ended holding its %s",
                    ms.tok ? "tokens" : ms.hf || ms.lg ? "head tensors" : ms.dres ? "residual gradient"
                                                                                : "residual stream");
  return MP_OK;
}

mp_status mp_runtime_forward_backward(mp_ctx *ctx, mp_runtime *rt, const int32_t *tokens, mp_step_result *res) {
  memset(res, 0, sizeof *res);
  for (int i = 0; i < rt->plan->n_params; i++)
    if (rt->prm[i].g) BE(memset_zero(rt->kc, rt->prm[i].g, (size_t)rt->prm[i].numel_pad * sizeof(float)));
  double ce = 0, aux = 0;
  for (int64_t mb = 0; mb < rt->n_micro; mb++)
    MP_CHECK(micro_step(ctx, rt, tokens + (size_t)mb * rt->B * (rt->T + 1), &ce, &aux));
  /* ce, aux and the gradients are already scaled by 1 / (n_micro * dp): the FSDP
   * reduce-scatters summed the gradient shards over dp_shard; summing over the replicas
   * gives the global means (identity at world size 1). */
  if (mp_comm_group_size(rt->comm, MP_GROUP_DP_REPLICATE) > 1) {
    for (int i = 0; i < rt->plan->n_params; i++) {
      rt_param *r = &rt->prm[i];
      if (r->g)
        MP_CHECK(mp_comm_all_reduce(ctx, rt->comm, MP_GROUP_DP_REPLICATE, r->g, r->g, (size_t)r->numel_pad,
                                    MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM));
    }
  }
  if (rt->dp_size > 1) {
    /* fp32 sums of a few values: far inside the 1e-5 parity tolerance */
    float v[2] = {(float)ce, (float)aux};
    MP_CHECK(host_coll(ctx, rt, MP_GROUP_DP, v, NULL, 2, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM, NULL));
    ce = v[0];
    aux = v[1];
  }
  res->ce_loss = ce;
  res->aux_loss = aux;
  res->loss = ce + aux;
  res->tokens = rt->local_batch * rt->T;
  return MP_OK;
}

mp_status mp_runtime_optimizer_step(mp_ctx *ctx, mp_runtime *rt, mp_step_result *res) {
  /* Global norm: each parameter counted once (its owner's shard; shards are disjoint),
   * per-parameter sums (each into its own device slot, read back in one copy) added in a
   * fixed order, then one all-reduce over the world. */
  const int np = rt->plan->n_params;
  float *sq = rt->scalar + 8, *hsq = malloc((size_t)(np ? np : 1) * sizeof(float));
  MP_CHECK_ALLOC(ctx, hsq);
  mp_status st = rt->be->memset_zero(rt->kc, sq, (size_t)np * sizeof(float));
  for (int i = 0; i < np && st == MP_OK; i++) {
    const rt_param *r = &rt->prm[i];
    if (r->g && r->owner) st = rt->be->sum_squares(rt->kc, sq + i, r->g, (size_t)r->numel_pad);
  }
  if (st == MP_OK) st = rt->be->memcpy_d2h(rt->kc, hsq, sq, (size_t)np * sizeof(float));
  double sumsq = 0;
  for (int i = 0; i < np; i++)
    if (rt->prm[i].g && rt->prm[i].owner) sumsq += hsq[i];
  free(hsq);
  if (st != MP_OK) return mp_error(ctx, st, "gradient norm: %s", mp_errmsg(rt->kc->err));
  if (mp_comm_world_size(rt->comm) > 1) {
    float v = (float)sumsq;
    MP_CHECK(host_coll(ctx, rt, MP_GROUP_WORLD, &v, NULL, 1, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM, NULL));
    sumsq = v;
  }
  const double norm = sqrt(sumsq);
  const float scale = rt->opts.max_grad_norm > 0 ? mp_clip_scale((float)norm, rt->opts.max_grad_norm) : 1.0f;
  rt->step++;
  for (int i = 0; i < rt->plan->n_params; i++) {
    rt_param *r = &rt->prm[i];
    if (!r->g) continue;
    BE(adamw_update(rt->kc, r->w, r->g, r->m, r->v, (size_t)r->numel_pad, rt->opts.lr, rt->opts.beta1,
                    rt->opts.beta2, rt->opts.eps, r->decay ? rt->opts.weight_decay : 0.0f, rt->step, scale));
    /* a resident compute copy follows its master (sharded ones are cast at each gather),
     * and so do its cached float8 codes */
    if (r->cw && r->cw != (void *)r->w && !r->sharded) BE(x_from_f32(rt->kc, r->cw, r->w, (size_t)r->numel_pad));
    r->f8w_valid = 0;
  }
  res->grad_norm = norm;
  return MP_OK;
}

mp_status mp_runtime_step(mp_ctx *ctx, mp_runtime *rt, const int32_t *tokens, mp_step_result *res) {
  mp_talloc_reset_peak(rt->ta);
  MP_CHECK(mp_runtime_forward_backward(ctx, rt, tokens, res));
  MP_CHECK(mp_runtime_optimizer_step(ctx, rt, res));
  MP_CHECK(mp_runtime_synchronize(ctx, rt));
  res->peak_bytes = mp_talloc_peak_total(rt->ta);
  return MP_OK;
}

mp_status mp_runtime_synchronize(mp_ctx *ctx, mp_runtime *rt) {
  MP_CHECK(mp_comm_synchronize(ctx, rt->comm));
  BE(synchronize(rt->kc));
  return MP_OK;
}

mp_status mp_runtime_host_all_reduce(mp_ctx *ctx, mp_runtime *rt, mp_group g, void *buf, size_t count, mp_comm_dtype t,
                                     mp_comm_op op) {
  if (count * mp_comm_dtype_bytes(t) > STAGE_FLOATS * sizeof(float) / 2)
    return mp_error(ctx, MP_ERR_INVALID, "runtime: host all-reduce of %zu elements is larger than its staging", count);
  return host_coll(ctx, rt, g, buf, NULL, count, t, (int)op, NULL);
}

/* ---- inspection and dumps ------------------------------------------------------------ */

int64_t mp_runtime_param_tile(const mp_runtime *rt, int i, int64_t off[MP_MAX_NDIM], int64_t len[MP_MAX_NDIM]) {
  memcpy(off, rt->prm[i].off, sizeof rt->prm[i].off);
  memcpy(len, rt->prm[i].len, sizeof rt->prm[i].len);
  return rt->prm[i].numel;
}

mp_status mp_runtime_read_param(mp_ctx *ctx, const mp_runtime *rt, int i, float *dst) {
  if (rt->prm[i].numel) BE(memcpy_d2h(rt->kc, dst, rt->prm[i].w, (size_t)rt->prm[i].numel * sizeof(float)));
  return MP_OK;
}

mp_status mp_runtime_read_grad(mp_ctx *ctx, const mp_runtime *rt, int i, float *dst) {
  if (rt->prm[i].numel) BE(memcpy_d2h(rt->kc, dst, rt->prm[i].g, (size_t)rt->prm[i].numel * sizeof(float)));
  return MP_OK;
}

/* Full tensors from the shards: each owner writes its tile into a zeroed full-size buffer
 * and a world all-reduce (sum) assembles them; replicas contribute zeros, so the result
 * is exact. Collective: every rank calls it; w is filled on every rank. */
mp_status mp_runtime_dump(mp_ctx *ctx, const mp_runtime *rt, int grads, mp_wfile *w) {
  for (int i = 0; i < rt->plan->n_params; i++) {
    const mp_param *p = &rt->plan->params[i];
    const rt_param *r = &rt->prm[i];
    const int64_t n = mp_param_numel(p);
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
      if (!rt->host_mem) st = mp_talloc_alloc(ctx, rt->ta, MP_MEM_TEMP, 2 * (size_t)mp_act_align64(n * (int64_t)sizeof(float)), &dev);
      if (st == MP_OK)
        st = host_coll(ctx, (mp_runtime *)rt, MP_GROUP_WORLD, full, NULL, (size_t)n, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM,
                       dev);
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
