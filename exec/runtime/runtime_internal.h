/* The training runtime's internals, shared by its files (not an interface for other
 * modules; runtime.h is). The files:
 *   runtime.c        creation (dims, the activation layout, materialization, the step
 *                    program), destruction, host-value collectives
 *   runtime_fsdp.c   FSDP units: gathers, releases, gradient buffers and reduce-scatters
 *   runtime_f8.c     Linear layers, with float8 emulated or as GEMMs on codes
 *   runtime_block.c  a block's forward and backward, the routed experts and EP's exchange
 *   runtime_mla.c    multi-head latent attention's projections, forward and backward
 *   runtime_moe.c    an MoE block's routing: the experts' capacity and token dropping,
 *                    the per-expert loads a step measures
 *   runtime_etp.c    expert tensor parallelism: the expert-TP group's gather of the
 *                    received rows and reduce-scatter of the expert outputs
 *   runtime_sp.c     sequence parallelism: the sequence shard's collectives, the norms'
 *                    gradients
 *   runtime_cp.c     context parallelism: the load-balanced chunks, ring attention, the
 *                    gradients summed over cp
 *   runtime_step.c   the step program's actions, the optimizer step
 *   runtime_pp.c     the order of chunk steps (a pipeline stage's, or one micro-batch
 *                    after another), the per-micro-batch state, stage-to-stage transfers,
 *                    the tied embedding's gradient exchange
 *   runtime_dump.c   inspection and weight dumps
 *
 * Dtypes (kernels/ops.h): "X" tensors (activations, their gradients, compute copies of
 * parameters) are stored in the backend's x_dtype, xs bytes each (CPU: fp32, CUDA: bf16);
 * master parameters, their gradients, AdamW state and every statistic (rstd, lse, router
 * probabilities, losses, float8 scales) are fp32; ids and permutations int32. Every tensor
 * outside the parameters is a row of the activation layout (exec/act_layout.h): its
 * allocation, its elements and its element type, with byte offsets in its carved
 * allocation, so one layout serves both backends.
 *
 * Tensor naming follows the model and the layout's rows: x[l] is the residual stream
 * entering block l (x[L] enters the final norm); a block saves its BLOCK tensors (xn1,
 * rstd1, q and k after RoPE, v, xmid, xn2, rstd2, then the dense MLP's or the MoE's) and,
 * in a second allocation so selective AC can drop it, its attention CORE (att, lse).
 * Backward of a block takes dres = dL/dx[l+1] and leaves dL/dx[l] in the same buffer: the
 * MLP branch reads dres, then the FFN norm's backward adds its input gradient into dres
 * (residual), and likewise for attention. Every backward kernel accumulates (ops.h) into
 * buffers fresh from the tracked allocator, which zero-fills (alloc.h): the workspaces,
 * dlogits, dres and the unit gradient buffers need no memset of their own. Buffers that
 * are written whole before any read (saved activations, the residual stream, logits,
 * gathered parameters, float8 codes) come from mp_talloc_alloc_uninit: no fill. */
#ifndef MP_EXEC_RUNTIME_RUNTIME_INTERNAL_H
#define MP_EXEC_RUNTIME_RUNTIME_INTERNAL_H

#include <stdlib.h>
#include <string.h>

#include "exec/act_layout.h"
#include "exec/runtime/init.h"
#include "exec/runtime/runtime.h"
#include "exec/schedule.h"

typedef struct rt_param {
  int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM], numel; /* at-rest tile (global offsets), real elements */
  int64_t numel_pad;  /* storage elements: chunk rows x row length when FSDP-sharded (FSDP2 pads
                         every rank's shard to the same size), numel otherwise */
  int64_t tp_numel;   /* elements of the compute tensor (tp/ep-local, unsharded by FSDP) */
  int sharded;        /* FSDP-sharded over a group of more than one rank */
  mp_group group;     /* its FSDP group (MP_GROUP_FSDP or MP_GROUP_EFSDP) */
  mp_group rep;       /* where its gradient shard is summed over the replicas after the
                         micro-batches: dp_replicate, or a routed expert's
                         mp_mesh_expert_replica_group */
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
  /* under a pipeline several micro-batches may hold a unit at once (runtime_pp.c): the
   * step program's gathers not yet released, and gradient buffers begun and not ended;
   * the last release frees, the last end reduce-scatters (the parameters do not change
   * inside a step, and the gradients of both micro-batches are summed either way) */
  int holds, grad_holds;
} rt_unit;

/* What the actions of one micro-batch hand each other, from its first chunk step to its
 * last: under a pipeline several micro-batches are in flight at once, each with its own
 * (runtime_pp.c swaps a micro-batch's layer tables into the runtime before its chunk step). */
typedef struct rt_micro {
  const int32_t *seqs;
  int32_t *tok;       /* token ids then targets (TEMP) */
  char *hf, *lg;      /* head: xf + rstdf (ACTIVATIONS); logits and loss scratch (LOGITS) */
  void *dres;         /* residual-stream gradient (TEMP) */
  int x_top;          /* highest x[i] that may be held */
  double dscale;
  double *ce, *aux;
  char **x, **act, **core, **epa; /* its layer tables ([L + 1], [L], [L], [L]) */
  int64_t *ep_R;
  /* its routing, from a MoE block's forward to its backward: rows per expert ([L * E]) and
   * EP's received rows per (expert-TP rank, source, local expert) ([L * etp * ep * El]) */
  int32_t *counts_h;
  int64_t *ep_rc;
} rt_micro;

/* A send to the next or previous stage, held until this rank's next receive (both go as
 * one sendrecv) or the next send of its direction (runtime_pp.c). */
typedef struct rt_p2p_pending {
  const void *buf;
  size_t count;
  int peer;        /* world rank; -1: none pending */
  void *free_after; /* the buffer freed once sent (a gradient handed back), or NULL */
  int act;         /* mp_step_act, for messages */
} rt_p2p_pending;

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
  /* attention's head widths: values (hd, or MLA's v_head_dim) and RoPE's (hd, or MLA's
   * qk_rope_head_dim); multi-head latent attention (mla): the q latent (0: q_proj), the kv
   * latent, a head's part without RoPE (qk_nope_head_dim) and with it (dr == rd) */
  int dv, rd, mla, ql, kvl, dn, dr;
  /* local dims: tp splits heads, d_ff, shared d_ff and vocab; ep splits experts; etp
   * (expert tensor parallelism, the mesh's etp > 1; else 1) splits each local expert's
   * width: Fe is an expert's d_ff on the rank, d_ff_expert / etp (runtime_etp.c) */
  int tp, tp_idx, ep, ep_idx, etp, etp_idx, El, nhl, nkvl, Fl, Fsl, Vl, v0;
  /* sequence parallelism (tp > 1 and the plan's sp): the residual stream holds Ns = N / tp
   * rows, the rank's sequence shard (runtime_sp.c); else Ns = N */
  int sp, Ns;
  /* the expert grid with tp (exec/mesh.h, any etp, check.c: with SP): the EP group spans
   * the tp ranks and each routes only its sequence shard, Nr = Ns rows (runtime_block.c);
   * else grid = 0 and every rank routes its Nr = N rows */
  int grid, Nr;
  /* context parallelism: cp ranks, this rank's index, the local tokens of a sequence
   * (Tl = T / cp: two chunks, runtime_cp.c), the ring's next and previous world ranks */
  int cp, cp_idx, Tl, cp_next, cp_prev;
  float eps;
  int64_t local_batch, n_micro;
  int dp_size;
  rt_param *prm;
  rt_unit *units;
  int n_units;
  int *pidx;    /* [(L + 1) * MP_MOD_COUNT]: weight param index per (layer, module); row L: outside blocks */
  float *rope_cos, *rope_sin, *scalar;
  int32_t *tok_in, *tok_tgt;
  mp_act_dims dims;   /* the local dims of the activation layout (R: the balanced Nr x K) */
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
  int64_t *ep_R;    /* [L] rows on the expert side (under etp: gathered over the ETP group) */
  int64_t ep_R_max; /* most rows received in one layer since creation (routing-dependent memory) */
  int64_t *ep_rc;   /* [L * etp * ep * El] rows expert-TP rank t received from source s for
                       local expert e (etp = 1: this rank's only) */
  int32_t *counts_h; /* [L * E] host copies of expert row counts (placed rows: after drops) */
  /* [L * E] the step's assignments per (MoE layer, expert), before the capacity's drops,
   * and the dropped ones (runtime_moe.c); NULL for a model without MoE */
  int64_t *load_routed, *load_dropped;
  int64_t step;       /* optimizer steps taken (AdamW's t) */
  float *logits_out;  /* mp_runtime_capture_logits: the next forward's logits go here (host) */
  int64_t logits_at;  /* floats written so far */
  mp_step_action *prog; /* one micro-batch: this rank's schedule's step program */
  int32_t n_prog;
  /* the chunk steps (runtime_pp.c): pp stages, this rank's, chunks per stage, the order
   * of its steps over a step's micro-batches, the micro-batches' states */
  int pp, pp_stage, vst;
  int peer_prev, peer_next; /* world ranks of the previous and next stage (same other coords) */
  int tied_peer;            /* the other end of a tied embedding (first and last stage), or -1 */
  mp_pp_step *order;
  int64_t n_order;
  rt_micro *mic;
  int n_mic;
  rt_p2p_pending *pend; /* the held sends, oldest first (at most one per direction) */
  int n_pend, cap_pend;
};

enum { STAGE_FLOATS = MP_ACT_STAGE_FLOATS }; /* host-value collectives */

#define BE(call)                                                                                       \
  do {                                                                                                 \
    mp_status be_s_ = rt->be->call;                                                                    \
    if (be_s_ != MP_OK)                                                                                \
      return mp_error(ctx, be_s_, "%s:%d: kernel %s failed: %s", __FILE__, __LINE__, #call,            \
                      mp_errmsg(rt->kc->err));                                                         \
  } while (0)

#define F32(p) ((float *)(void *)(p))

/* p advanced by n X elements. */
static inline void *xoff(const mp_runtime *rt, const void *p, size_t n) { return (char *)p + n * rt->xs; }

static inline int *pslot(const mp_runtime *rt, int layer, mp_module m) {
  return &rt->pidx[(layer < 0 ? rt->L : layer) * MP_MOD_COUNT + m];
}

static inline void *W(const mp_runtime *rt, int layer, mp_module m) {
  int i = *pslot(rt, layer, m);
  return i < 0 ? NULL : rt->prm[i].cw;
}

static inline float *G(const mp_runtime *rt, int layer, mp_module m) {
  int i = *pslot(rt, layer, m);
  return i < 0 ? NULL : rt->prm[i].cg;
}

static inline int F8(const mp_runtime *rt, int layer, mp_module m) {
  int i = *pslot(rt, layer, m);
  return i >= 0 && rt->plan->params[i].float8;
}

static inline int is_moe_layer(const mp_runtime *rt, int l) { return mp_model_layer_is_moe(&rt->plan->model, l); }
/* The activation layout of block l's kind. */
static inline const mp_act_layout *lay_of(const mp_runtime *rt, int l) {
  return is_moe_layer(rt, l) ? &rt->lay_moe : &rt->lay_dense;
}

/* The bytes of an allocation outside the blocks (the same for both kinds). */
static inline size_t act_bytes(const mp_runtime *rt, mp_act_alloc a) { return rt->lay_dense.bytes[a]; }

/* TP all-reduce (sum) of a partial result in place, an X tensor (tp_sum) or fp32
 * statistics (tp_sum_f32); nothing when tp == 1. */
static inline mp_status tp_sum(mp_ctx *ctx, mp_runtime *rt, void *x, size_t n) {
  if (rt->tp == 1) return MP_OK;
  return mp_comm_all_reduce(ctx, rt->comm, MP_GROUP_TP, x, x, n, rt->xdt, MP_COMM_OP_SUM);
}

static inline mp_status tp_sum_f32(mp_ctx *ctx, mp_runtime *rt, float *x, size_t n) {
  if (rt->tp == 1) return MP_OK;
  return mp_comm_all_reduce(ctx, rt->comm, MP_GROUP_TP, x, x, n, MP_COMM_DTYPE_FP32, MP_COMM_OP_SUM);
}

/* runtime.c */
mp_status mp_rt_host_coll(mp_ctx *ctx, mp_runtime *rt, mp_group g, void *buf, void *rbuf, size_t count,
                          mp_comm_dtype t, int op, void *dev);

/* runtime_fsdp.c */
mp_status mp_rt_gather_layer(mp_ctx *ctx, mp_runtime *rt, int layer);
mp_status mp_rt_gather_wait(mp_ctx *ctx, mp_runtime *rt, int layer);
mp_status mp_rt_rs_finish_all(mp_ctx *ctx, mp_runtime *rt);
mp_status mp_rt_unit_grad_begin(mp_ctx *ctx, mp_runtime *rt, int u);
mp_status mp_rt_unit_grad_end(mp_ctx *ctx, mp_runtime *rt, int u);
mp_status mp_rt_unit_release(mp_ctx *ctx, mp_runtime *rt, int u);

/* runtime_sp.c: under SP (each a no-op or the plain form without it where stated) */
/* This rank's chunk of a gathered [N, C] X tensor. */
void *mp_rt_sp_slot(const mp_runtime *rt, const void *full);
/* full [N, C] = the tp group's shards in order; shard NULL: in place from full's own slot.
 * Nothing without SP. */
mp_status mp_rt_sp_gather(mp_ctx *ctx, mp_runtime *rt, const void *shard, void *full);
/* shard [Ns, C] = this rank's chunk of the sum over tp of full [N, C]. */
mp_status mp_rt_sp_scatter(mp_ctx *ctx, mp_runtime *rt, const void *full, void *shard);
/* The SP_FULL allocation ([N, C] X; zero-filled when a kernel accumulates into it), and its
 * free after a region's work of status st (returns st's error first). */
mp_status mp_rt_sp_full_alloc(mp_ctx *ctx, mp_runtime *rt, int zero, void **out);
mp_status mp_rt_sp_full_free(mp_ctx *ctx, mp_runtime *rt, mp_status st, void *full);
/* The norm weights' gradients summed over tp (once per step, after the micro-batches). */
mp_status mp_rt_sp_norm_grads(mp_ctx *ctx, mp_runtime *rt);

/* runtime_etp.c (all no-ops with etp = 1) */
/* Rows of expert-TP rank t's block of layer l's expert side, its first row, the largest
 * block's rows (0 with etp = 1). */
int64_t mp_rt_etp_block_rows(const mp_runtime *rt, int l, int t);
int64_t mp_rt_etp_block_start(const mp_runtime *rt, int l, int t);
int64_t mp_rt_etp_block_max(const mp_runtime *rt, int l);
/* The group's counts per (source, local expert), gathered after the EP count exchange. */
mp_status mp_rt_etp_counts(mp_ctx *ctx, mp_runtime *rt, int l);
/* buf: rows of width w, blocks by expert-TP rank. gather: the rank's own block to every
 * rank's; scatter: the rank's own block summed over the group (tmp: the largest block). */
mp_status mp_rt_etp_gather(mp_ctx *ctx, mp_runtime *rt, int l, void *buf, int64_t w);
mp_status mp_rt_etp_scatter(mp_ctx *ctx, mp_runtime *rt, int l, void *buf, void *tmp, int64_t w);

/* runtime_cp.c */
/* The global position of chunk 0 or 1 of cp rank owner's local sequence. */
int mp_rt_cp_pos(const mp_runtime *rt, int owner, int chunk);
/* Ring attention of block l into its CORE (att, lse), and its backward into ws's dq, dk,
 * dv from datt. */
mp_status mp_rt_cp_attn_forward(mp_ctx *ctx, mp_runtime *rt, int l);
mp_status mp_rt_cp_attn_backward(mp_ctx *ctx, mp_runtime *rt, int l, char *ws);
/* The gradients not reduce-scattered over dp_shard x cp, summed over cp (once per step). */
mp_status mp_rt_cp_grads(mp_ctx *ctx, mp_runtime *rt);

/* runtime_f8.c */
float *mp_rt_f8_fused_amax(const mp_runtime *rt, int l, int src, mp_module reader);
float *mp_rt_f8_fwd_slot(const mp_runtime *rt, int l, int src);
void mp_rt_f8_known_set(mp_runtime *rt, const void *x, size_t n, float *amax, int reduced);
void mp_rt_f8_produced(mp_runtime *rt, int l, int src, const void *x, size_t n);
void mp_rt_f8_scope_begin(mp_runtime *rt);
mp_status mp_rt_f8_scope_end(mp_ctx *ctx, mp_runtime *rt);
mp_status mp_rt_lin_bwd(mp_ctx *ctx, mp_runtime *rt, int l, mp_module mod, void *dinp, const void *dout,
                        const void *inp, int N, int K, int M);
mp_status mp_rt_lin_fwd(mp_ctx *ctx, mp_runtime *rt, int l, mp_module mod, void *out, const void *inp, int N, int K,
                        int M);

/* runtime_step.c */
mp_status mp_rt_chunk_step(mp_ctx *ctx, mp_runtime *rt, rt_micro *ms, int chunk, int bwd);

/* runtime_pp.c */
mp_status mp_rt_pp_init(mp_ctx *ctx, mp_runtime *rt);
void mp_rt_pp_free(mp_runtime *rt);
int mp_rt_param_on_stage(const mp_runtime *rt, int i);
mp_status mp_rt_walk(mp_ctx *ctx, mp_runtime *rt, const int32_t *tokens, double *ce, double *aux);
mp_status mp_rt_p2p(mp_ctx *ctx, mp_runtime *rt, rt_micro *ms, const mp_step_action *a);
mp_status mp_rt_tied_grads(mp_ctx *ctx, mp_runtime *rt);

/* runtime_block.c */
mp_status mp_rt_alloc_block(mp_ctx *ctx, mp_runtime *rt, int l);
mp_status mp_rt_attn_core_forward(mp_ctx *ctx, mp_runtime *rt, int l);
mp_status mp_rt_block_backward(mp_ctx *ctx, mp_runtime *rt, int l, void *dres, char *ws, float dloss_aux);
/* runtime_moe.c: block l's routing grouped by expert after the capacity's drops (perm,
 * inv, counts and counts_h), adding to the step's loads when measure (not on a recompute);
 * the rows placed; the step's loads summed over the ranks. */
mp_status mp_rt_moe_route(mp_ctx *ctx, mp_runtime *rt, int l, int measure);
int64_t mp_rt_moe_placed_rows(const mp_runtime *rt, int l);
mp_status mp_rt_moe_loads_reduce(mp_ctx *ctx, mp_runtime *rt);
mp_status mp_rt_block_forward(mp_ctx *ctx, mp_runtime *rt, int l, const void *x_in, void *x_out, float *moe_aux);
mp_status mp_rt_free_block(mp_ctx *ctx, mp_runtime *rt, int l);
/* runtime_mla.c: block l's q, k, v (its BLOCK tensors) from its saved xn1; backward, from
 * the workspace's dq, dk, dv into dxn (or, under SP, dxs) and the projections' gradients */
mp_status mp_rt_mla_forward(mp_ctx *ctx, mp_runtime *rt, int l);
mp_status mp_rt_mla_backward(mp_ctx *ctx, mp_runtime *rt, int l, char *ws);

#endif
