/* The meshplan runtime's activation layout: every tensor the runtime (exec/runtime/)
 * allocates besides the parameters and their state, as one table read by both the runtime
 * (which carves its allocations by it) and the schedule's runtime memory models (which
 * emit an ALLOC/FREE of exactly those bytes, exec/schedule_rt.c).
 *
 * A row of MP_ACT_TENSORS names one tensor:
 *   name    the runtime's name for it (a field of mp_act_layout: its byte offset)
 *   alloc   the allocation it lives in (mp_act_alloc, below)
 *   count   its elements, an expression of the local dims (mp_act_dims: N tokens of the
 *           micro-batch on the rank, NS the rows of its residual stream, C = d_model, heads
 *           and d_ff tp-local, experts' d_ff over etp, NR the rows the rank routes, R =
 *           the rows on the expert side under EP, ...)
 *   elt     X (the backend's activation dtype: fp32 on the CPU, bf16 on CUDA), F32
 *           (statistics: rstd, lse, router probabilities, losses, scalars) or I32 (ids)
 *   when    the condition under which it exists (below); a tensor that does not exist
 *           takes no bytes
 * Rows of one allocation are listed in the order the runtime carves them.
 *
 * Carving rule: in a carved allocation each tensor starts on a 64-byte boundary: its
 * offset is the sum of ALIGN64(bytes) of the tensors before it, and the allocation's bytes
 * are that sum over all of them. An allocation that is not carved holds its one tensor,
 * exactly its bytes (the tracked allocator counts the bytes asked for).
 *
 * Sequence parallelism (tp > 1 with sp; Korthikanti et al. 2022, section 4.2.2; torchtitan's
 * SequenceParallel): the residual stream and what the norms save (x, xmid, the rstds, dres,
 * dxf) hold the rank's NS = N / tp rows, the contiguous chunk tp_idx of the micro-batch's
 * N = B x S token rows. A norm's output is written into its rank's chunk of xn1, xn2 or xf
 * and all-gathered there in place, so those keep all N rows: the colwise Linears' input,
 * saved for their weight gradients as torchtitan's autograd saves its all-gather's output.
 * SP_FULL is the [N, C] side of each boundary collective; dxs the norms' input gradient
 * reduce-scattered to the shard.
 *
 * Invariants: every tensor belongs to one allocation; offsets within a carved allocation
 * are increasing and 64-byte aligned; totals depend only on the dims and the block kind,
 * so the runtime's measured allocations equal the schedule's events byte for byte
 * (tests/runtime:schedule_memory_test and its MPI variant check it per category). */
#ifndef MP_EXEC_ACT_LAYOUT_H
#define MP_EXEC_ACT_LAYOUT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The runtime's allocations outside the parameters. Lifetimes as the step program runs
 * them (exec/schedule.h, mp_step_act). */
typedef enum mp_act_alloc {
  /* carved */
  MP_ACT_ALLOC_BLOCK = 0,  /* a block's tensors saved for its backward, from its forward to its
                              backward (full AC: freed after the forward, refilled by the
                              recompute) */
  MP_ACT_ALLOC_CORE,       /* the attention core (selective AC drops and recomputes it) */
  MP_ACT_ALLOC_WS,         /* a block's backward workspace (activation gradients) */
  MP_ACT_ALLOC_EPA,        /* EP: the expert side saved for the backward (the rows received) */
  MP_ACT_ALLOC_EP_WS,      /* EP: the expert side's backward workspace */
  MP_ACT_ALLOC_HEAD,       /* the final norm's saved tensors, head forward to head backward */
  MP_ACT_ALLOC_LOGITS,     /* logits and the loss's per-token values, likewise */
  /* one tensor each */
  MP_ACT_ALLOC_DLOGITS,    /* the logits' gradient, inside the head's backward */
  MP_ACT_ALLOC_X,          /* one residual-stream tensor x[l] (x[0] the embedding's output,
                              x[l + 1] block l's), from its forward to the backward of the
                              block above */
  MP_ACT_ALLOC_DRES,       /* the residual stream's gradient, head to embedding backward */
  MP_ACT_ALLOC_DXF,        /* the final norm's input gradient, inside the head's backward */
  MP_ACT_ALLOC_SHARED_OUT, /* the shared expert's partial output before its tp all-reduce (SP:
                              reduce-scatter) */
  MP_ACT_ALLOC_SP_FULL,    /* SP: a tensor-parallel region's [N, C] side around its boundary
                              collective: a rowwise Linear's (or the vocab-parallel lookup's,
                              the head's input gradient's) partial sums before their
                              reduce-scatter, the residual gradient all-gathered before a
                              rowwise Linear's (the embedding's) backward, the routed experts'
                              output before its rows on the shard are taken */
  MP_ACT_ALLOC_EP_OUT,     /* EP: the expert outputs waiting for the combine all-to-all */
  MP_ACT_ALLOC_TOKENS,     /* the micro-batch's token ids, then its targets */
  MP_ACT_ALLOC_CP_FWD,     /* CP: ring attention's forward state (TEMP, carved: the fp32
                              accumulator, the K, V held and the K, V arriving) */
  MP_ACT_ALLOC_CP_BWD,     /* CP: ring attention's backward state (TEMP, carved: FlashAttention-2's
                              D, the K, V held and arriving, their travelling dK, dV likewise) */
  MP_ACT_ALLOC_ROPE_COS,   /* resident: the RoPE tables */
  MP_ACT_ALLOC_ROPE_SIN,
  MP_ACT_ALLOC_SCALARS,    /* resident: device scalars (float8 amax and scale, sums of
                              squares, the forward's float8 amax per block) */
  MP_ACT_ALLOC_STAGE,      /* resident: staging of host-value collectives in device memory */
  MP_ACT_ALLOC_COUNT
} mp_act_alloc;

/* Element types (elt column). */
typedef enum mp_act_elt { MP_ACT_ELT_X = 0, MP_ACT_ELT_F32, MP_ACT_ELT_I32 } mp_act_elt;

/* Conditions (when column), on the dims and the block kind (dense or MoE). */
typedef enum mp_act_when {
  MP_ACT_WHEN_ALWAYS = 0,
  MP_ACT_WHEN_DENSE,     /* a dense block's */
  MP_ACT_WHEN_MOE,       /* an MoE block's */
  MP_ACT_WHEN_MOE_LOCAL, /* an MoE block's when its experts run on the rank (ep == 1); under
                            EP they live on the expert side (EPA, EP_WS) */
  MP_ACT_WHEN_SHARED,    /* an MoE block's with a shared expert (Fs > 0) */
  MP_ACT_WHEN_MOE_EP,    /* an MoE block's under EP (ep > 1): the expert side */
  MP_ACT_WHEN_TP,        /* tp > 1: the vocab-parallel loss's reductions */
  MP_ACT_WHEN_SP,        /* sequence parallelism (tp > 1, sp): the sequence shard's tensors */
  MP_ACT_WHEN_CP,        /* context parallelism (cp > 1): ring attention's buffers */
  MP_ACT_WHEN_DEVMEM,    /* the backend's memory is not host memory */
  MP_ACT_WHEN_GQA,       /* grouped-query attention (q, k, v projections) */
  MP_ACT_WHEN_MLA,       /* multi-head latent attention (QL, KL, DR, DN below) */
  MP_ACT_WHEN_MLA_Q      /* multi-head latent attention with a query latent (QL > 0) */
} mp_act_when;

/* Staging floats for host-value collectives: EP counts (<= 512 int64), a few scalars. */
#define MP_ACT_STAGE_FLOATS 4096

/* clang-format off */
#define MP_ACT_TENSORS(T)                                                                 \
  /* name       alloc        count                         elt   when */                  \
  /* a block's saved tensors: attention, then the dense MLP's or the MoE's */             \
  T(xn1,        BLOCK,       N * C,                        X,    ALWAYS)                  \
  T(rstd1,      BLOCK,       NS,                           F32,  ALWAYS)                  \
  T(q,          BLOCK,       N * QD,                       X,    ALWAYS) /* after RoPE */ \
  T(k,          BLOCK,       N * KD,                       X,    ALWAYS)                  \
  T(v,          BLOCK,       N * VD,                       X,    ALWAYS)                  \
  /* MLA (exec/model.h): the latents and their norms' statistics, on all N rows */       \
  T(qa,         BLOCK,       N * QL,                       X,    MLA_Q) /* q_a_proj's */  \
  T(rstdqa,     BLOCK,       N,                            F32,  MLA_Q)                   \
  T(qan,        BLOCK,       N * QL,                       X,    MLA_Q) /* normed */      \
  /* kv_a_proj_with_mqa's output: the latent [N, KL], then the rope key [N, DR] (RoPE'd) */ \
  T(kva,        BLOCK,       N * (KL + DR),                X,    MLA)                     \
  T(rstdkv,     BLOCK,       N,                            F32,  MLA)                     \
  T(kvn,        BLOCK,       N * KL,                       X,    MLA) /* normed latent */ \
  T(kvb,        BLOCK,       N * NH * (DN + DV),           X,    MLA) /* kv_b_proj's */   \
  T(qpe,        BLOCK,       N * NH * DR,                  X,    MLA) /* q's rope parts */\
  T(xmid,       BLOCK,       NS * C,                       X,    ALWAYS)                  \
  T(xn2,        BLOCK,       N * C,                        X,    ALWAYS)                  \
  T(rstd2,      BLOCK,       NS,                           F32,  ALWAYS)                  \
  T(g,          BLOCK,       N * F,                        X,    DENSE)                   \
  T(u,          BLOCK,       N * F,                        X,    DENSE)                   \
  T(h,          BLOCK,       N * F,                        X,    DENSE)                   \
  T(rl,         BLOCK,       NR * E,                       X,    MOE) /* router logits */ \
  T(probs,      BLOCK,       NR * E,                       F32,  MOE)                     \
  T(tki,        BLOCK,       NR * K,                       I32,  MOE) /* top-k ids */     \
  T(tkw,        BLOCK,       NR * K,                       F32,  MOE) /* and weights */   \
  T(f,          BLOCK,       E,                            F32,  MOE) /* aux loss's f */  \
  T(aux,        BLOCK,       1,                            F32,  MOE)                     \
  T(perm,       BLOCK,       NR * K,                       I32,  MOE)                     \
  T(inv,        BLOCK,       NR * K,                       I32,  MOE)                     \
  T(counts,     BLOCK,       E,                            I32,  MOE)                     \
  T(xp,         BLOCK,       NR * K* C,                    X,    MOE) /* permuted */      \
  T(eg,         BLOCK,       NR * K* Fe,                   X,    MOE_LOCAL)               \
  T(eu,         BLOCK,       NR * K* Fe,                   X,    MOE_LOCAL)               \
  T(eh,         BLOCK,       NR * K* Fe,                   X,    MOE_LOCAL)               \
  T(ey,         BLOCK,       NR * K* C,                    X,    MOE) /* expert outputs */\
  T(sg,         BLOCK,       N * Fs,                       X,    SHARED)                  \
  T(su,         BLOCK,       N * Fs,                       X,    SHARED)                  \
  T(sh,         BLOCK,       N * Fs,                       X,    SHARED)                  \
  /* the attention core */                                                                \
  T(att,        CORE,        N * AD,                       X,    ALWAYS)                  \
  T(lse,        CORE,        B * NH * S,                   F32,  ALWAYS)                  \
  /* a block's backward workspace */                                                      \
  T(dxn,        WS,          N * C,                        X,    ALWAYS)                  \
  T(datt,       WS,          N * AD,                       X,    ALWAYS)                  \
  T(dq,         WS,          N * QD,                       X,    ALWAYS)                  \
  T(dk,         WS,          N * KD,                       X,    ALWAYS)                  \
  T(dv,         WS,          N * VD,                       X,    ALWAYS)                  \
  T(dqp,        WS,          N * QD,                       X,    ALWAYS) /* before RoPE */\
  T(dkp,        WS,          N * KD,                       X,    GQA)                     \
  /* MLA: dq's rope parts and their RoPE backward, the rope key's gradient summed over   \
   * heads, kv_b_proj's output gradient, the latent's [N, KL] and the rope key's before  \
   * RoPE [N, DR] (one tp all-reduce), kv_a_layernorm's input gradient, the q latent's */ \
  T(dqr,        WS,          N * NH * DR,                  X,    MLA)                     \
  T(dqrp,       WS,          N * NH * DR,                  X,    MLA)                     \
  T(dkr,        WS,          N * DR,                       X,    MLA)                     \
  T(dkvb,       WS,          N * NH * (DN + DV),           X,    MLA)                     \
  T(dlat,       WS,          N * (KL + DR),                X,    MLA)                     \
  T(dkv,        WS,          N * KL,                       X,    MLA)                     \
  T(dqan,       WS,          N * QL,                       X,    MLA_Q)                   \
  T(dqa,        WS,          N * QL,                       X,    MLA_Q)                   \
  T(dh,         WS,          N * F,                        X,    DENSE)                   \
  T(dg,         WS,          N * F,                        X,    DENSE)                   \
  T(du,         WS,          N * F,                        X,    DENSE)                   \
  T(drl,        WS,          NR * E,                       X,    MOE)                     \
  T(dprobs,     WS,          NR * E,                       F32,  MOE)                     \
  T(dtkw,       WS,          NR * K,                       F32,  MOE)                     \
  T(dey,        WS,          NR * K* C,                    X,    MOE)                     \
  T(deh,        WS,          NR * K* Fe,                   X,    MOE_LOCAL)               \
  T(deg,        WS,          NR * K* Fe,                   X,    MOE_LOCAL)               \
  T(deu,        WS,          NR * K* Fe,                   X,    MOE_LOCAL)               \
  T(dxp,        WS,          NR * K* C,                    X,    MOE)                     \
  T(dsh,        WS,          N * Fs,                       X,    SHARED)                  \
  T(dsg,        WS,          N * Fs,                       X,    SHARED)                  \
  T(dsu,        WS,          N * Fs,                       X,    SHARED)                  \
  T(dxs,        WS,          NS * C,                       X,    SP) /* dxn scattered */  \
  /* EP: the expert side, R rows received (routing decides R at run time) */              \
  T(ep_xr,      EPA,         R * C,                        X,    MOE_EP)                  \
  T(ep_eg,      EPA,         R * Fe,                       X,    MOE_EP)                  \
  T(ep_eu,      EPA,         R * Fe,                       X,    MOE_EP)                  \
  T(ep_eh,      EPA,         R * Fe,                       X,    MOE_EP)                  \
  T(ep_dey,     EP_WS,       R * C,                        X,    MOE_EP)                  \
  T(ep_dxr,     EP_WS,       R * C,                        X,    MOE_EP)                  \
  T(ep_deh,     EP_WS,       R * Fe,                       X,    MOE_EP)                  \
  T(ep_deg,     EP_WS,       R * Fe,                       X,    MOE_EP)                  \
  T(ep_deu,     EP_WS,       R * Fe,                       X,    MOE_EP)                  \
  T(ep_pad,     EP_WS,       16,                           F32,  MOE_EP) /* never empty */\
  T(ep_out,     EP_OUT,      ((R > 0 ? R : 1) + RB) * C,   X,    MOE_EP)                  \
  /* head and loss */                                                                     \
  T(xf,         HEAD,        N * C,                        X,    ALWAYS)                  \
  T(rstdf,      HEAD,        NS,                           F32,  ALWAYS)                  \
  T(logits,     LOGITS,      N * Vl,                       X,    ALWAYS)                  \
  T(losses,     LOGITS,      N,                            F32,  ALWAYS)                  \
  T(ce_lse,     LOGITS,      N,                            F32,  ALWAYS)                  \
  T(ce_mean,    LOGITS,      1,                            F32,  ALWAYS)                  \
  T(vp_max,     LOGITS,      N,                            F32,  TP)                      \
  T(vp_sumexp,  LOGITS,      N,                            F32,  TP)                      \
  T(vp_target,  LOGITS,      N,                            F32,  TP)                      \
  T(dlogits,    DLOGITS,     N * Vl,                       X,    ALWAYS)                  \
  /* the micro-batch's lone tensors */                                                    \
  T(x,          X,           NS * C,                       X,    ALWAYS)                  \
  T(dres,       DRES,        NS * C,                       X,    ALWAYS)                  \
  T(dxf,        DXF,         NS * C,                       X,    ALWAYS)                  \
  T(shared_out, SHARED_OUT,  N * C,                        X,    ALWAYS)                  \
  T(sp_full,    SP_FULL,     N * C,                        X,    SP)                      \
  T(tokens,     TOKENS,      2 * N,                        I32,  ALWAYS)                  \
  /* CP: ring attention (K and V of a chunk pair travel together: 2 N KD) */              \
  T(cp_acc,     CP_FWD,      N * QD,                       F32,  CP)                      \
  T(cp_kv0,     CP_FWD,      2 * N * KD,                   X,    CP)                      \
  T(cp_kv1,     CP_FWD,      2 * N * KD,                   X,    CP)                      \
  T(cp_d,       CP_BWD,      B * NH * S,                   F32,  CP)                      \
  T(cp_bkv0,    CP_BWD,      2 * N * KD,                   X,    CP)                      \
  T(cp_bkv1,    CP_BWD,      2 * N * KD,                   X,    CP)                      \
  T(cp_dkv0,    CP_BWD,      2 * N * KD,                   X,    CP)                      \
  T(cp_dkv1,    CP_BWD,      2 * N * KD,                   X,    CP)                      \
  /* resident */                                                                          \
  T(rope_cos,   ROPE_COS,    S * (RD / 2),                 F32,  ALWAYS)                  \
  T(rope_sin,   ROPE_SIN,    S * (RD / 2),                 F32,  ALWAYS)                  \
  T(scalars,    SCALARS,     8 + NP + 4 * L,               F32,  ALWAYS)                  \
  T(stage,      STAGE,       MP_ACT_STAGE_FLOATS,          F32,  DEVMEM)
/* clang-format on */

/* The dims the counts read: the rank's local sizes for one micro-batch. */
typedef struct mp_act_dims {
  int64_t B;       /* sequences per micro-batch */
  int64_t S;       /* tokens per sequence on the rank (seq / cp) */
  int64_t N;       /* tokens of the micro-batch on the rank */
  int64_t NS;      /* rows of the residual stream on the rank: N / tp under sequence
                      parallelism (its sequence shard), else N */
  int64_t NR;      /* rows the rank routes to the experts: N, or under the expert grid with
                      tp its sequence shard N / tp (exec/mesh.h; torchtitan's
                      ReordererSequenceParallel with expert_tensor_parallel_degree 1) */
  int64_t C;       /* d_model */
  int64_t HD;      /* head_dim (query and key) */
  int64_t DV;      /* value head: MLA's v_head_dim (0: HD) */
  int64_t RD;      /* RoPE's width per head: MLA's qk_rope_head_dim (0: HD) */
  int64_t NH, NKV; /* query and key/value heads, tp-local */
  int mla;         /* multi-head latent attention: */
  int64_t QL, KL;  /*   its q and kv latents (q_lora_rank, 0 without; kv_lora_rank) */
  int64_t DN, DR;  /*   a head's parts without and with RoPE (qk_nope, qk_rope) */
  int64_t F;       /* dense d_ff, tp-local */
  int64_t E, K;    /* routed experts, top_k */
  int64_t Fe;      /* an expert's d_ff on the rank: d_ff_expert / etp (expert tensor
                      parallelism splits it; dense tp does not) */
  int64_t Fs;      /* the shared experts' d_ff, tp-local; 0 without one */
  int64_t Vl;      /* vocabulary rows of the rank's head */
  int64_t R;       /* EP: rows on the rank's expert side (under etp > 1 gathered over the
                      expert-TP group) */
  int64_t RB;      /* etp > 1: rows of the largest block one expert-TP rank received, the
                      reduce-scatter's receive space after ep_out's R rows; else 0 */
  int64_t L, NP;   /* blocks, parameter tensors (the scalars) */
  int xs;          /* bytes of an X element */
  int tp, ep;      /* tensor- and expert-parallel degrees */
  int sp;          /* sequence parallelism: tp > 1 with the residual stream sharded */
  int cp;          /* context-parallel degree */
  int host_mem;    /* the backend's memory is host memory (no staging) */
} mp_act_dims;

/* Where each tensor lives: its byte offset in its allocation (0 for a tensor that does not
 * exist or is alone in its allocation), and the bytes of every allocation. */
typedef struct mp_act_layout {
#define MP_ACT_FIELD_(name, alloc, count, elt, when) size_t name;
  MP_ACT_TENSORS(MP_ACT_FIELD_)
#undef MP_ACT_FIELD_
  size_t bytes[MP_ACT_ALLOC_COUNT];
} mp_act_layout;

/* Lays the table out for dims d and a dense (moe = 0) or MoE (moe = 1) block: a block's
 * allocations (BLOCK, WS) differ by kind and only an MoE block has an expert side (EPA,
 * EP_WS, EP_OUT); every other allocation is the same for both. */
void mp_act_layout_fill(mp_act_layout *l, const mp_act_dims *d, int moe);

/* Bytes of the resident allocations (RoPE tables, scalars, staging) together. */
int64_t mp_act_resident_bytes(const mp_act_layout *l);

/* ALIGN64: a carved tensor's bytes rounded up to the next 64-byte boundary; ALIGN16: an
 * fp32 tensor's elements rounded up the same way. */
static inline int64_t mp_act_align64(int64_t bytes) { return (bytes + 63) & ~(int64_t)63; }
static inline int64_t mp_act_align16(int64_t n) { return (n + 15) & ~(int64_t)15; }

/* A float8 operand of an n-element tensor as the runtime quantizes it (one FP8
 * allocation): its one-byte codes, its transposed codes, then its amax and scale (fp32),
 * each part 64-byte aligned. Byte offsets of the parts and the allocation's bytes. */
static inline int64_t mp_act_f8_qt_offset(int64_t n) { return mp_act_align64(n); }
static inline int64_t mp_act_f8_amax_offset(int64_t n) { return 2 * mp_act_align64(n); }
static inline int64_t mp_act_f8_operand_bytes(int64_t n) { return 2 * mp_act_align64(n) + 64; }

/* An FSDP-sharded parameter's slot in the runtime's gathered buffer of its unit: the
 * group's gsize padded shards of X elements (xs bytes each), 64-byte aligned. In bytes. */
static inline int64_t mp_act_gather_slot_bytes(int gsize, int64_t numel_pad, int xs) {
  return mp_act_align64((int64_t)gsize * numel_pad * xs);
}

/* The fp32 emulation of a float8 Linear (CPU): one FP8 scratch allocation of the
 * fake-quantized operands, each but the last 16-float aligned: forward the input (nx
 * elements) and the weight (nw); backward the output gradient (nd), the input and the
 * weight. In floats. */
static inline int64_t mp_act_f8_emul_fwd_floats(int64_t nx, int64_t nw) {
  return mp_act_align16(nx) + nw;
}
static inline int64_t mp_act_f8_emul_bwd_floats(int64_t nd, int64_t nx, int64_t nw) {
  return mp_act_align16(nd) + mp_act_align16(nx) + nw;
}

/* A unit's reduce-scatter output in the runtime with overlapped comm (NCCL): one slot per
 * sharded parameter of its padded shard, 16-float aligned. In fp32 elements. */
static inline int64_t mp_act_rs_slot_floats(int64_t numel_pad) { return mp_act_align16(numel_pad); }

#ifdef __cplusplus
}
#endif
#endif
