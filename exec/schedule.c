/* Step schedule builder: from a plan (exec/plan.h), the ordered ops of one training step on
 * one rank (exec/schedule.h). Walks the rank's pipeline stage: prologue, forward (embedding,
 * blocks, head and loss), backward in reverse, optimizer.
 *
 * Invariants:
 *   - Both modes run the same generator; COMPACT only changes how many consecutive blocks
 *     one segment stands for. Blocks collapse when they have the same kind (dense / MoE),
 *     the same neighbour kinds (what they prefetch), the same FSDP unit layout and the same
 *     unit sizes, so every repetition of a segment is the same ops with layer advanced by
 *     layer_step and unit by unit_step. Block ops are written for the segment's first layer.
 *   - Memory: every ALLOC has a FREE with the same (buf, layer, unit) later in the same
 *     micro-batch, except the prologue's resident allocations; mp_schedule_check replays.
 *   - No string formatting and no malloc per op: ops and segments live in the arena, in
 *     arrays that double when full.
 *
 * Conventions (units: elements, bytes, FLOPs; T = tokens of one micro-batch on this rank =
 * micro_batch x seq / cp; e = 2 bytes, bf16 activations):
 *   GEMM C[m,n] = A[m,k] B[k,n]: FLOPs 2mnk x batch; bytes = batch (mk + kn) x input bytes
 *     + mn x 2 (bf16 output). A Linear [out, in] on T tokens: forward m=T, n=out, k=in;
 *     DGRAD dx = dy W: m=T, n=in, k=out; WGRAD dW = dy^T x: m=out, n=in, k=T. Biases are
 *     folded into the GEMM epilogue (their out x T adds are not counted).
 *   Attention (flash, causal): forward 4 x T x seq x heads_local x hd / 2, the causal half
 *     of QK^T and PV (a query attends to seq/2 keys on average); backward twice the forward
 *     (dQ, dK, dV, dP: the algorithmic count; flash's recomputation of QK^T in backward is
 *     left to the simulator's attention efficiency). mp_model_flops_per_token counts
 *     12 L heads hd seq per token, i.e. non-causal forward + backward, so a schedule's
 *     FLOPs are the model FLOPs less 6 L heads hd seq per token (tested), plus the small
 *     element-wise FLOPs below, less 6 x (norm parameters) which the model counts.
 *   Element-wise kernels carry a nominal FLOP count per element (FLOPS_* below); they are
 *     memory-bound, so their bytes (read + written) are what the simulator uses.
 *   Float8 Linear (torchao tensorwise, as torchtitan uses it): forward casts the weight and
 *     the input to E4M3 (amax pass + scaled cast: 2+2+1 bytes per element) and runs the GEMM
 *     in E4M3; backward casts dy to E5M2 and re-casts the weight and the input (torchao saves
 *     the high-precision tensors), DGRAD and WGRAD in E5M2 (op dtype E5M2: one operand is
 *     E5M2, the other E4M3). With float8 all-gather the gathered weight already is float8
 *     and its casts are dropped (the cast of the shard happens before the all-gather).
 *   MoE: balanced routing assumed: each local expert receives T x top_k x ep / E tokens
 *     (m of the grouped GEMMs, rounded up; FLOPs use the exact value), batch = E / ep.
 *   Collective payloads (schedule.h): TP all-reduce of [T, H] bf16: 2TH bytes. All-to-all:
 *     the rank's whole send buffer, T x top_k x H x 2 bytes, of which (ep-1)/ep crosses
 *     the network (the simulator's (n-1)/n factor, as nccl-tests count all-to-all). FSDP
 *     all-gather: the unit's tp-local elements (this stage's) x param dtype;
 *     reduce-scatter: the same elements x reduce dtype; dp_replicate all-reduce: the
 *     unit's shard x reduce dtype. Send/recv: [T, H] bf16.
 *   No sequence parallelism: TP's activations are replicated [T, H] (all-reduce, not
 *     reduce-scatter + all-gather). Vocab-parallel embedding: masked lookup + all-reduce
 *     forward, no communication backward. Loss: with vocab-sharded logits three TP
 *     all-reduces of T fp32 values (max, sum of exp, target logit); with replicated
 *     logits an all-gather of [T, V] bf16 before the loss.
 *
 * FSDP (FSDP2 defaults as torchtitan runs them):
 *   - The root unit (embedding, final norm, head) is gathered at the start of forward and
 *     kept until the end of backward (FSDP2 does not reshard the root after forward).
 *   - Prefetch granularity is one block: at the start of block l's forward the all-gathers
 *     of all of block l+1's units are issued on MP_STREAM_GATHER (one unit for a dense
 *     block, attention + MoE + experts for an EP block), each waiting for block l-1's
 *     compute to finish (that is when FSDP2 issues it); the first op that uses a unit waits
 *     for its gather. With reshard_after_forward the gathered parameters are freed at the
 *     end of the block's forward and gathered again in backward, prefetched one block
 *     ahead the same way; otherwise they are freed after the block's backward.
 *   - Gradient accumulation (n_micro > 1): FSDP2 reshards after backward and
 *     reduce-scatters in every micro-batch by default (torchtitan does not turn gradient
 *     sync off), so gathers and reduce-scatters are EVERY_MICRO; only the prologue and the
 *     optimizer are ONCE.
 *   - Backward of a unit: its unsharded gradients (param dtype) are TEMP from the block's
 *     backward start; at the reduce-scatter they are copied to a reduce-dtype buffer (TEMP,
 *     FSDP2's reduce-scatter input), reduce-scattered on MP_STREAM_REDUCE into the resident
 *     GRADS, then all-reduced over dp_replicate (HSDP) and freed. A unit whose FSDP group
 *     has one rank keeps the local cast (GATHERED memory) but has no collective.
 *   - Without FSDP applied (dp_shard == 1): parameters are used in place; gradients are
 *     all-reduced per block over dp_replicate when it is > 1 (DDP-style).
 *
 * Saved activations per block (bytes, T tokens on the rank, tp-local sizes q = heads_l x
 * hd, kv = kv_heads_l x hd, f = d_ff / tp, st = 4 bytes of norm statistics per token for
 * RMSNorm (rstd), 8 for LayerNorm (mean, rstd)), from what each op saves for backward:
 *   x      block input, saved by attention_norm:                      2TH
 *   attn   normed input (q/k/v GEMMs) 2TH + st T; q/k (post-RoPE), v 2T(q + 2kv); attention
 *          output (flash and o_proj) 2Tq; logsumexp 4 T heads_l;
 *          qk_norm: pre-norm q, k 2T(q + kv) + rstd 4T(heads_l + kv_heads_l)
 *   mlp    (dense) residual h 2TH + st T, normed h 2TH; llama gate, up, SwiGLU out 3 x 2Tf;
 *          gpt up out (GELU input), GELU out 2 x 2Tf
 *   moe    h 2TH + st T, normed h 2TH; router probabilities (fp32) 4TE; top-k weights and
 *          indices 12 T top_k; dispatched tokens 2 T top_k H; expert gate, up, SwiGLU out
 *          3 x 2 T top_k f_e; expert outputs back in token order 2 T top_k H; shared expert
 *          3 x 2 T f_s (f_s tp-local)
 *   none = x + attn + mlp; selective = x + mlp (attention and its inputs recomputed:
 *   attention_norm, q/k/v, q/k norms, RoPE, attention core); full = x (whole block
 *   recomputed before its backward, collectives included).
 * For GPT with tp=1 (f = 4H): x + attn + mlp = 2+2+6+2+2+2+8+8 = 32 sbh bytes + 4 a s b
 * (logsumexp) + 16 sb (LayerNorm statistics). Korthikanti et al. 2022 count 34 sbh + 5 a s^2 b
 * with dropout masks (2 sbh here absent) and the materialised attention matrix, which flash
 * attention replaces by the per-head logsumexp. The blocks' unsaved intermediates are
 * allocated (ACTIVATIONS) during the block's forward and freed at its end; backward holds a
 * TEMP workspace for activation gradients, 2 x 2TH (residual stream and current input) plus
 * the MLP's largest set (llama 3 x 2Tf, gpt 2 x 2Tf, MoE 3 x 2 T top_k f_e + 2 T top_k H).
 *
 * Head and loss memory (LOGITS): bf16 logits [T, V_l] from the head GEMM, an fp32 copy for
 * the cross-entropy (log-softmax saved for backward); the bf16 logits are freed after the
 * loss's forward. Backward: fp32 gradient of the logits, then its bf16 cast for the head's
 * GEMMs; the saved fp32 is freed. V_l = V/tp with sharded logits, V after the all-gather.
 *
 * Memory models (p->opts.mem_model, named by the stack profile): what the ALLOC/FREE events
 * describe is the memory of the runtime that executes the plan. Everything above is
 * MP_MEM_MODEL_TORCHTITAN (PyTorch FSDP2 under torchtitan; the GPU stacks, validated
 * against published figures). MP_MEM_MODEL_MESHPLAN_CPU is exec/runtime/runtime.c on the
 * CPU, event for event, so the replayed peak is the tracked allocator's peak (checked per
 * plan by tests/runtime/parity_matrix.py and schedule_memory_test). Its differences:
 *   - every tensor fp32; resident: the padded FSDP shards (FSDP2's equal chunks) x 4 (master,
 *     gradient, AdamW m and v), plus RoPE cos/sin tables and 8 + n_params scalars (TEMP);
 *   - per micro-batch: token ids (TEMP); x[0] (the stage input) and each block's output
 *     x[l + 1] (ACTIVATIONS), x[l + 1] freed as block l's backward starts;
 *   - a block: one carved allocation of its saved tensors (xn1 rstd1 q k v xmid xn2 rstd2,
 *     then gate/up/hidden, or the router's, permutation and expert tensors, and the shared
 *     expert's), one of the attention core (att, lse), each tensor 16-float aligned;
 *     selective frees the core after forward and recomputes only it (from the saved q, k,
 *     v), full frees both and refills them without the block's output projections;
 *   - backward: one workspace per block (runtime.c's ws layout), dres and dxf from the head;
 *     logits, losses, log-sum-exp (and the vocab-parallel reductions) in one LOGITS block
 *     kept to the head's backward, with the fp32 gradient of the logits;
 *   - FSDP: no prefetch (blocking MPI collectives): a block's units are gathered as it
 *     starts; a one-rank group is used in place (no gathered or unsharded buffer); gathered
 *     and unsharded-gradient buffers hold gsize x padded shard per parameter, 16-float
 *     aligned; the reduce-scatter stages one padded shard, all of a block's units are
 *     reduced after its whole backward, then resharded;
 *   - float8: fake-quantized fp32 copies of input and weight (and output gradient in
 *     backward) around each float8 GEMM (FP8);
 *   - EP: the expert side (received rows, gate/up/hidden) is saved apart, the expert outputs
 *     wait in a COMM buffer for the combine, backward has an expert-side workspace. Their
 *     size is the rows a rank receives, which routing decides at run time; the model uses
 *     the balanced count N x top_k (the mean over the EP group, exactly: every row sent
 *     is received), so the busiest rank measures more (tests/runtime/parity_matrix.py
 *     bounds the excess by the rows the run really received).
 * MP_MEM_MODEL_MESHPLAN_CUDA is the same runtime on the CUDA backend (bf16 X tensors), also
 * event for event: the model above with the backend's properties (gen.rt, .xs, .host_mem,
 * .overlap), not a copy of it (checked byte for byte, per category, against an accounting
 * backend with bf16 X tensors by tests/runtime/schedule_memory_test). Its differences:
 *   - X tensors (activations, their gradients, logits, compute copies) are bf16, 2 bytes;
 *     statistics (rstd, lse, router probabilities, losses) stay fp32 and ids int32; every
 *     carved tensor still starts on a 64-byte boundary (runtime.c's PUT and ALIGN64), so
 *     the CPU model is the case X = 4;
 *   - resident besides the fp32 state: a bf16 compute copy (PARAMS) of every parameter
 *     that is not FSDP-sharded; the staging buffer of host-value collectives (4096 floats,
 *     TEMP: the backend's memory is not host memory); the float8 codes of every float8
 *     weight that is not FSDP-sharded (FP8; made at its first use in the first step and
 *     kept, so the schedule holds them from the prologue: a later step's memory);
 *   - FSDP units gathered in bf16, one ALIGN64(gsize x padded shard x 2 bytes) slot per
 *     parameter; the unsharded gradients have as many fp32 elements as the slots have bf16;
 *   - float8 as real codes: an operand is one FP8 allocation of its codes in both
 *     orientations, amax and scale (2 ALIGN64(n) + 64 bytes). A block's E4M3 activations
 *     (xn1 for q/k/v, the attention output for o, xn2 for gate/up, the SwiGLU output for
 *     down) are quantized once in its forward (and once in its backward) and freed when it
 *     ends (backward's want transposed codes only, made through a temporary of row-major
 *     codes, one byte an element); an FSDP-sharded weight is quantized around each GEMM;
 *     backward adds the output gradient's operand (E5M2) and an X temporary of the input
 *     gradient around each GEMM;
 *   - NCCL when ranks > 1 (the model assumes a GPU per rank; ranks sharing a GPU stage
 *     through MPI, which has neither of these two and is the CPU model's order): forward
 *     gathers the next block's units as a block starts (torchtitan's one block of
 *     prefetch), backward prefetches the block below when resharded (the top block
 *     gathers its own once the head is done); a unit's reduce-scatter goes out into a
 *     buffer of one 16-float-aligned slot per sharded parameter and is finished at the
 *     next sharded unit's turn or the end of the micro-batch, so that buffer and the
 *     unit's unsharded gradients live through the next unit's backward. */
#include <math.h>
#include <stdarg.h>
#include <string.h>

#include "exec/act_layout.h"
#include "exec/schedule.h"

/* Nominal FLOPs per element of the element-wise kernels (see above). */
#define FLOPS_NORM_FWD 4.0 /* RMSNorm: square, sum, scale, weight; LayerNorm adds the mean */
#define FLOPS_NORM_BWD 8.0
#define FLOPS_ROPE 3.0     /* x cos + rotate(x) sin */
#define FLOPS_SWIGLU_FWD 5.0
#define FLOPS_SWIGLU_BWD 8.0
#define FLOPS_GELU_FWD 8.0 /* tanh approximation */
#define FLOPS_GELU_BWD 12.0
#define FLOPS_ROUTER 5.0   /* softmax + top-k per logit */
#define FLOPS_LOSS 5.0     /* max, subtract, exp, sum, log per logit */
#define FLOPS_CAST 3.0     /* abs, max, scale (+ saturate) */
#define FLOPS_ADAMW 16.0   /* m, v updates, bias correction, sqrt, divide, weight decay */
#define BYTES_ADAMW 28.0   /* read param, grad, m, v; write param, m, v: 7 fp32 tensors */

/* Buffer identities (mp_op.buf); an ALLOC pairs with the next FREE of the same buf,
 * layer and unit. */
enum {
  BUF_PARAMS = 1,
  BUF_OPTIMIZER,
  BUF_GRADS,
  BUF_GATHERED,   /* + unit: per unit */
  BUF_ACT_X,
  BUF_ACT_ATTN,
  BUF_ACT_MLP,
  BUF_RC_ATTN,    /* recomputed in backward */
  BUF_RC_MLP,
  BUF_BWD_WS,     /* activation-gradient workspace */
  BUF_GRAD_UNSHARDED,
  BUF_GRAD_RS_IN,
  BUF_FP8,
  BUF_ACT_HEAD,
  BUF_LOGITS,
  BUF_LOGITS_F32,
  BUF_DLOGITS_F32,
  BUF_DLOGITS,
  /* the runtime memory models' own buffers (runtime.c's names) */
  BUF_RT_RESIDENT, /* RoPE tables and the reduction scalars (TEMP, resident) */
  BUF_RT_TOKENS,   /* token ids and targets of the micro-batch (TEMP) */
  BUF_RT_X,        /* residual stream: x[0] at layer -1, x[l + 1] at layer l */
  BUF_RT_BLOCK,    /* a block's saved tensors, one carved allocation */
  BUF_RT_CORE,     /* attention core: att, lse */
  BUF_RT_EPA,      /* EP: expert-side rows and gate/up/hidden */
  BUF_RT_EP_OUT,   /* EP: expert outputs before the combine (COMM) */
  BUF_RT_EP_WS,    /* EP: expert-side backward workspace (TEMP) */
  BUF_RT_SHARED,   /* shared expert's partial output before its all-reduce (TEMP) */
  BUF_RT_HEAD,     /* xf, rstdf */
  BUF_RT_DRES,     /* residual-stream gradient (TEMP) */
  BUF_RT_DXF,      /* final norm's input gradient (TEMP) */
  /* meshplan-cuda's own */
  BUF_RT_F8W,      /* float8 codes of the weights that are not FSDP-sharded (FP8, resident) */
  BUF_RT_RS,       /* NCCL: a unit's reduce-scatter output, in flight (TEMP) */
  BUF_F8_DY,       /* float8 on codes: the output gradient's operand (E5M2) */
  BUF_F8_W,        /* an FSDP-sharded weight's operand (E4M3) */
  BUF_F8_ACT,      /* + source (f8_source): a block's activation operand (E4M3) */
};

enum { PART_ATTN = 0, PART_MOE = 1, PART_EXPERTS = 2, N_PARTS = 3 };
enum { KIND_DENSE = 0, KIND_MOE = 1, KIND_NONE = 2 };

/* One FSDP unit as this rank's stage sees it. */
typedef struct unit_info {
  int64_t numel_tp;    /* this stage's tp-local elements: what the all-gather produces */
  int64_t numel_shard; /* what the rank keeps at rest */
  double gather_bytes; /* numel_tp in the gather dtype (float8 all-gather: 1 byte) */
  int gsize;           /* FSDP group size */
  uint8_t group;
  uint8_t gather_dtype;
  /* runtime models: the runtime's gathered buffer in bytes, per parameter a gsize x
   * padded-shard slot of X elements, 64-byte aligned, for X of 4 bytes (meshplan-cpu) and
   * of 2 (meshplan-cuda; the unsharded gradients have the slots' element count in fp32);
   * the sum of the padded shards, each 16-float aligned (NCCL's reduce-scatter output);
   * the largest padded shard (the blocking reduce-scatter's staging). 0 for a one-rank
   * group. */
  int64_t rt_gather_x4, rt_gather_x2, rt_rs_numel, rt_max_pad;
} unit_info;

/* Per-kind local shapes and flags, read from the plan's parameters. */
typedef struct shapes {
  int64_t T, seq, H, hd, q, kv, nh, nkv, f;          /* f: dense d_ff, tp-local */
  int64_t E, E_l, topk, fe, fs;                      /* MoE; fs: shared, tp-local */
  double m_exp;                                      /* tokens per local expert */
  int64_t V_l, V_loss;                               /* head rows on the rank; loss width */
  int gpt, qk_norm, has_shared, tied;
  int tp, ep;
  int ar_o, ar_down, ar_qkv, ar_gateup, ar_sdown, ar_sgateup, ar_head_in, ar_emb;
  int loss_parallel, logits_gather;
  int fp8[MP_MOD_COUNT];
  int fp8_ag;
} shapes;

typedef struct gen {
  mp_ctx *ctx;
  mp_arena *arena;
  const mp_plan *p;
  mp_schedule *s;
  shapes sh;
  mp_op *ops;
  int32_t n_ops, cap_ops;
  mp_segment *segs;
  int32_t n_segs, cap_segs;
  mp_status st;            /* sticky: the first failure (its message on ctx); from then on
                              every emission is a no-op writing into `dummy` */
  mp_op dummy;
  /* current emission state */
  uint8_t phase, when;
  int32_t layer;           /* layer of the block being written (first repetition) */
  int32_t seg_first;       /* first op of the open segment */
  int32_t last_c;          /* last op on the compute stream */
  int32_t last_reduce;     /* last op on the reduce stream */
  /* deps for the next compute op */
  int32_t pend[MP_OP_MAX_DEPS];
  uint8_t pend_flags[MP_OP_MAX_DEPS];
  int n_pend;
  /* units */
  int has_fsdp;
  unit_info *ui;           /* per plan unit (or per pseudo unit without FSDP) */
  int n_ui;
  int32_t *first_unit;     /* per layer: its first unit; units of a block are consecutive */
  int8_t *n_units;         /* per layer */
  int32_t root_unit;       /* -1 when this stage holds no root parameter */
  int reshard;
  mp_dtype pdt, rdt;
  /* memory model (p->opts.mem_model; see the file comment) */
  int rt;                  /* a meshplan runtime's: MESHPLAN_CPU or MESHPLAN_CUDA */
  int xs;                  /* rt: bytes of an X element (the backend's x_dtype: 4 CPU, 2 CUDA) */
  int host_mem;            /* rt: the backend's memory is host memory (no staging buffer) */
  int overlap;             /* rt: NCCL's prefetched gathers and deferred reduce-scatters */
  int prefetch;            /* FSDP gathers one block ahead (torchtitan, NCCL), or at use */
  int f8c;                 /* rt: float8 Linears on codes (meshplan-cuda; meshplan-cpu with the
                              plan's f8_codes), else the CPU's fp32 emulation */
  int f8w_sharded;         /* rt, float8 on codes: block weights FSDP-sharded (per-GEMM codes) */
  unsigned f8_scope;       /* rt, float8 on codes: the open block's quantized activations */
  int64_t f8_scope_bytes[4];
  struct {                 /* overlap: the reduce-scatter in flight (one unit at most) */
    int on;
    int32_t layer, unit;
    int64_t rs, gbuf;
  } rs_fl;
  mp_act_layout lay[2];    /* rt: the activation layout (exec/act_layout.h) of a dense and of
                              an MoE block; under EP with balanced routing, N x top_k rows on
                              the expert side */
} gen;

/* ---- emission primitives ---------------------------------------------------------- */

/* Initial capacity of the op array: the last schedule's op count on this thread (the
 * planner builds schedules of one size over and over), so the array rarely grows. Only an
 * allocation size: it never changes a schedule. */
static _Thread_local int32_t g_ops_hint;

/* Records the builder's first failure; later ones keep the first message. */
static void gen_fail(gen *g, mp_status code, const char *fmt, ...) {
  if (g->st != MP_OK) return;
  va_list ap;
  va_start(ap, fmt);
  g->st = mp_verror(g->ctx, code, fmt, ap);
  va_end(ap);
}

static mp_op *no_op(gen *g, int32_t *idx) {
  memset(&g->dummy, 0, sizeof g->dummy);
  if (idx) *idx = -1;
  return &g->dummy;
}

static mp_op *new_op(gen *g, mp_op_type type, mp_stream stream, int32_t *idx) {
  if (g->st != MP_OK) return no_op(g, idx);
  if (g->n_ops == g->cap_ops) {
    int32_t cap = g->cap_ops ? 2 * g->cap_ops : (g_ops_hint > 192 ? g_ops_hint + 64 : 256);
    /* not zeroed: ops are copied in or cleared one by one below */
    mp_op *n = mp_arena_alloc_raw(g->arena, sizeof(mp_op) * (size_t)cap);
    if (n == NULL) {
      gen_fail(g, MP_ERR_NOMEM, "out of memory building the step schedule");
      return no_op(g, idx);
    }
    if (g->n_ops) memcpy(n, g->ops, sizeof(mp_op) * (size_t)g->n_ops);
    g->ops = n;
    g->cap_ops = cap;
  }
  int32_t i = g->n_ops++;
  mp_op *op = &g->ops[i];
  /* a copy of an all-zero op, not memset: gcc turns a small memset into `rep stos`, slow
   * to start for 104 bytes, and this runs for every op of every schedule */
  static const mp_op k_zero;
  *op = k_zero;
  op->type = (uint8_t)type;
  op->phase = g->phase;
  op->stream = (uint8_t)stream;
  op->when = g->when;
  op->module = -1;
  op->layer = g->layer;
  op->unit = -1;
  op->batch = 1;
  op->dtype = MP_DTYPE_BF16;
  if (stream == MP_STREAM_COMPUTE) g->last_c = i;
  if (stream == MP_STREAM_REDUCE) g->last_reduce = i;
  if (idx) *idx = i;
  return op;
}

static void add_dep(gen *g, int32_t op, int32_t dep, uint8_t flags) {
  if (op < 0 || dep < 0 || g->st != MP_OK) return;
  mp_op *o = &g->ops[op];
  for (int i = 0; i < o->n_dep; i++)
    if (o->dep[i] == dep && o->dep_flags[i] == flags) return;
  if (o->n_dep >= MP_OP_MAX_DEPS) { /* a builder bug */
    gen_fail(g, MP_ERR_INTERNAL, "schedule builder gave an op more than %d dependencies",
             MP_OP_MAX_DEPS);
    return;
  }
  o->dep[o->n_dep] = dep;
  o->dep_flags[o->n_dep] = flags;
  o->n_dep++;
}

static void pend_dep(gen *g, int32_t dep, uint8_t flags) {
  if (dep < 0 || g->n_pend >= MP_OP_MAX_DEPS) return;
  g->pend[g->n_pend] = dep;
  g->pend_flags[g->n_pend] = flags;
  g->n_pend++;
}

static int32_t compute(gen *g, mp_kernel k, mp_variant v, int module, int64_t m, int64_t n,
                       int64_t kk, int64_t batch, double flops, double bytes, mp_dtype dt) {
  int32_t i;
  mp_op *op = new_op(g, MP_OP_COMPUTE, MP_STREAM_COMPUTE, &i);
  op->kernel = (uint8_t)k;
  op->variant = (uint8_t)v;
  op->module = (int16_t)module;
  op->m = m;
  op->n = n;
  op->k = kk;
  op->batch = batch;
  op->flops = flops;
  op->bytes = bytes;
  op->dtype = (uint8_t)dt;
  for (int d = 0; d < g->n_pend; d++) add_dep(g, i, g->pend[d], g->pend_flags[d]);
  g->n_pend = 0;
  return i;
}

static int32_t elementwise(gen *g, mp_kernel k, mp_variant v, int module, int64_t elems,
                           double flops_per, double bytes) {
  return compute(g, k, v, module, elems, 0, 0, 1, flops_per * (double)elems, bytes,
                 MP_DTYPE_BF16);
}

static int32_t comm(gen *g, mp_coll c, mp_group grp, mp_stream stream, double bytes,
                    mp_dtype dt, int module) {
  int32_t i;
  mp_op *op = new_op(g, MP_OP_COMM, stream, &i);
  op->coll = (uint8_t)c;
  op->group = (uint8_t)grp;
  op->bytes = bytes;
  op->dtype = (uint8_t)dt;
  op->module = (int16_t)module;
  return i;
}

/* A gradient collective of FSDP unit u on the reduce stream (the unit's reduce-scatter,
 * or the all-reduce over dp_replicate), tagged with its layer and unit, after `after`. */
static int32_t grad_comm(gen *g, mp_coll c, mp_group grp, int64_t bytes, int32_t layer,
                         int32_t u, int32_t after) {
  int32_t i = comm(g, c, grp, MP_STREAM_REDUCE, (double)bytes, g->rdt, -1);
  if (i >= 0) {
    g->ops[i].layer = layer;
    g->ops[i].unit = u;
  }
  add_dep(g, i, after, 0);
  return i;
}

static int32_t mem(gen *g, mp_op_type type, mp_mem_cat cat, int buf, int64_t bytes,
                   int32_t layer, int32_t unit, mp_stream stream) {
  int32_t i;
  mp_op *op = new_op(g, type, stream, &i);
  op->mem_cat = (uint8_t)cat;
  op->buf = buf;
  op->mem_bytes = bytes;
  op->layer = layer;
  op->unit = unit;
  return i;
}

static void pair(gen *g, mp_mem_cat cat, int buf, int64_t bytes, int alloc) {
  if (bytes <= 0) return;
  mem(g, alloc ? MP_OP_ALLOC : MP_OP_FREE, cat, buf, bytes, g->layer, -1, MP_STREAM_COMPUTE);
}

static void seg_open(gen *g, mp_phase phase, int32_t layer, int32_t layer_step) {
  (void)layer_step;
  g->phase = (uint8_t)phase;
  g->when = phase == MP_PHASE_PROLOGUE || phase == MP_PHASE_OPTIMIZER ? MP_WHEN_ONCE
                                                                      : MP_WHEN_EVERY_MICRO;
  g->layer = layer;
  g->seg_first = g->n_ops;
}

static void seg_close(gen *g, mp_phase phase, int32_t repeat, int32_t layer_step,
                      int32_t unit_step) {
  if (g->st != MP_OK) return;
  if (g->n_ops == g->seg_first) return; /* nothing emitted (e.g. a middle stage's head) */
  if (g->n_segs == g->cap_segs) {
    int32_t cap = g->cap_segs ? 2 * g->cap_segs : 32;
    mp_segment *n = mp_arena_alloc(g->arena, sizeof(mp_segment) * (size_t)cap);
    if (n == NULL) {
      gen_fail(g, MP_ERR_NOMEM, "out of memory building the step schedule");
      return;
    }
    if (g->n_segs) memcpy(n, g->segs, sizeof(mp_segment) * (size_t)g->n_segs);
    g->segs = n;
    g->cap_segs = cap;
  }
  mp_segment *sg = &g->segs[g->n_segs++];
  sg->first_op = g->seg_first;
  sg->n_ops = g->n_ops - g->seg_first;
  sg->repeat = repeat;
  sg->layer_step = layer_step;
  sg->unit_step = unit_step;
  sg->phase = (uint8_t)phase;
}

/* ---- GEMMs -------------------------------------------------------------------------- */

static double gemm_bytes(double m, double n, double k, double batch, int in_b) {
  return batch * ((m * k + k * n) * in_b + m * n * 2.0);
}

static int32_t gemm(gen *g, mp_variant v, int module, double m, int64_t n, int64_t k,
                    int64_t batch, mp_dtype dt) {
  const int in_b = mp_dtype_bytes(dt);
  return compute(g, MP_KERNEL_GEMM, v, module, (int64_t)ceil(m), n, k, batch,
                 2.0 * m * (double)n * (double)k * (double)batch,
                 gemm_bytes(m, (double)n, (double)k, (double)batch, in_b), dt);
}

static void cast(gen *g, int module, int64_t elems, mp_variant v) {
  compute(g, MP_KERNEL_FP8_CAST, v, module, elems, 0, 0, 1, FLOPS_CAST * (double)elems,
          5.0 * (double)elems, MP_DTYPE_BF16);
}

/* Runtime models: the memory event of an allocation of the activation layout
 * (exec/act_layout.h) for a block of `kind` (outside blocks both kinds agree), with the
 * category the runtime allocates it in. */
static void rt_mem(gen *g, mp_act_alloc a, int kind, int alloc) {
  static const struct {
    uint8_t cat, buf;
  } k_ev[MP_ACT_ALLOC_COUNT] = {
      [MP_ACT_ALLOC_BLOCK] = {MP_MEM_ACTIVATIONS, BUF_RT_BLOCK},
      [MP_ACT_ALLOC_CORE] = {MP_MEM_ACTIVATIONS, BUF_RT_CORE},
      [MP_ACT_ALLOC_WS] = {MP_MEM_TEMP, BUF_BWD_WS},
      [MP_ACT_ALLOC_EPA] = {MP_MEM_ACTIVATIONS, BUF_RT_EPA},
      [MP_ACT_ALLOC_EP_WS] = {MP_MEM_TEMP, BUF_RT_EP_WS},
      [MP_ACT_ALLOC_HEAD] = {MP_MEM_ACTIVATIONS, BUF_RT_HEAD},
      [MP_ACT_ALLOC_LOGITS] = {MP_MEM_LOGITS, BUF_LOGITS},
      [MP_ACT_ALLOC_DLOGITS] = {MP_MEM_LOGITS, BUF_DLOGITS},
      [MP_ACT_ALLOC_X] = {MP_MEM_ACTIVATIONS, BUF_RT_X},
      [MP_ACT_ALLOC_DRES] = {MP_MEM_TEMP, BUF_RT_DRES},
      [MP_ACT_ALLOC_DXF] = {MP_MEM_TEMP, BUF_RT_DXF},
      [MP_ACT_ALLOC_SHARED_OUT] = {MP_MEM_TEMP, BUF_RT_SHARED},
      [MP_ACT_ALLOC_EP_OUT] = {MP_MEM_COMM, BUF_RT_EP_OUT},
      [MP_ACT_ALLOC_TOKENS] = {MP_MEM_TEMP, BUF_RT_TOKENS},
  };
  pair(g, (mp_mem_cat)k_ev[a].cat, k_ev[a].buf, (int64_t)g->lay[kind].bytes[a], alloc);
}

/* ---- float8 on codes (meshplan-cuda; runtime.c, lin_fwd / lin_bwd not emulated) -------- */


/* The activation a block's float8 Linear reads (mp_module_f8_source; the runtimes run no
 * other module's Linear in float8, so the rest share slot 3). Linears reading the same one
 * share its operand. */
static int f8_source(int module) {
  const int src = mp_module_f8_source((mp_module)module);
  return src >= 0 ? src : 3;
}

/* The E4M3 operand of that activation: quantized by the first Linear of the block's
 * forward (or backward) that reads it, kept to the block's end (runtime.c's f8 scope).
 * Backward wants only its transposed codes, which f8_quantize_t writes directly (no
 * temporary). */
static void rt_f8_act(gen *g, int module, int64_t elems, int transposed_only) {
  const int src = f8_source(module);
  if (g->f8_scope & (1u << src)) return;
  g->f8_scope |= 1u << src;
  g->f8_scope_bytes[src] = mp_act_f8_operand_bytes(elems);
  pair(g, MP_MEM_FP8, BUF_F8_ACT + src, g->f8_scope_bytes[src], 1);
  (void)transposed_only; /* f8_quantize_t writes the transposed codes directly */
}

/* runtime.c's float8 cast on codes (f8_quant), kernel by kernel: f8_amax over the X
 * tensor unless its amax is known (computed by the kernel that produced the tensor, or
 * kept from the forward), f8_scale_from_amax, and f8_quantize_t reading the tensor once
 * and writing `orient` orientations of one-byte codes. */
static void rt_f8_cast(gen *g, int module, int64_t elems, int amax, int orient, mp_variant v) {
  if (amax)
    compute(g, MP_KERNEL_FP8_CAST, v, module, elems, 0, 0, 1, 2.0 * (double)elems,
            (double)g->xs * (double)elems, MP_DTYPE_BF16);
  compute(g, MP_KERNEL_FP8_CAST, v, module, 1, 0, 0, 1, 1.0, 8.0, MP_DTYPE_FP32);
  compute(g, MP_KERNEL_FP8_CAST, v, module, elems, 0, 0, 1, FLOPS_CAST * (double)elems,
          (double)(g->xs + orient) * (double)elems, MP_DTYPE_BF16);
}

/* The end of a block's forward or backward: its activation operands go. */
static void rt_f8_scope_close(gen *g) {
  for (int src = 0; src < 4; src++)
    if (g->f8_scope & (1u << src)) pair(g, MP_MEM_FP8, BUF_F8_ACT + src, g->f8_scope_bytes[src], 0);
  g->f8_scope = 0;
}

/* y[T, out] = x[T, in] W^T (batch > 1: grouped expert GEMMs, m tokens per expert). */
static void linear_fwd(gen *g, int module, double m, int64_t out, int64_t in, int64_t batch) {
  const int f8 = g->sh.fp8[module];
  if (!f8) {
    gemm(g, MP_VAR_FWD, module, m, out, in, batch, MP_DTYPE_BF16);
    return;
  }
  const int64_t mi = (int64_t)ceil(m) * batch;
  const int64_t w = out * in * batch, x = mi * in;
  if (g->f8c) {
    /* codes: the input's (shared in the block; its amax from RMSNorm's or SwiGLU's kernel,
     * the attention output's read for it), then the weight's when FSDP-sharded (else the
     * resident codes, quantized once per step: rt_optimizer) */
    const int64_t wb = g->f8w_sharded ? mp_act_f8_operand_bytes(w) : 0;
    const int src = f8_source(module);
    if (!(g->f8_scope & (1u << src))) rt_f8_cast(g, module, x, src == 1, 1, MP_VAR_FWD);
    rt_f8_act(g, module, x, 0);
    pair(g, MP_MEM_FP8, BUF_F8_W, wb, 1);
    if (wb) rt_f8_cast(g, module, w, 1, 2, MP_VAR_FWD);
    gemm(g, MP_VAR_FWD, module, m, out, in, batch, MP_DTYPE_FP8_E4M3);
    pair(g, MP_MEM_FP8, BUF_F8_W, wb, 0);
    return;
  }
  if (!g->sh.fp8_ag) cast(g, module, w, MP_VAR_FWD);
  cast(g, module, x, MP_VAR_FWD);
  /* meshplan-cpu emulates float8 in fp32: one buffer of the quantized input (aligned) and
   * weight; the runtimes never all-gather float8 */
  const int64_t fb = g->rt ? mp_act_f8_emul_fwd_floats(x, w) * 4 : (g->sh.fp8_ag ? 0 : w) + x;
  pair(g, MP_MEM_FP8, BUF_FP8, fb, 1);
  gemm(g, MP_VAR_FWD, module, m, out, in, batch, MP_DTYPE_FP8_E4M3);
  pair(g, MP_MEM_FP8, BUF_FP8, fb, 0);
}

static void linear_bwd(gen *g, int module, double m, int64_t out, int64_t in, int64_t batch) {
  const int f8 = g->sh.fp8[module];
  if (!f8) {
    gemm(g, MP_VAR_DGRAD, module, m, in, out, batch, MP_DTYPE_BF16);
    gemm(g, MP_VAR_WGRAD, module, out, in, (int64_t)ceil(m), batch, MP_DTYPE_BF16);
    return;
  }
  const int64_t mi = (int64_t)ceil(m) * batch;
  const int64_t w = out * in * batch, x = mi * in, dy = mi * out;
  if (g->f8c) {
    /* codes: dy's (E5M2, both orientations; gate's and up's amax from SwiGLU's backward
     * kernel), the weight's when sharded, DGRAD adding into the input gradient, then the
     * input's transposed codes (shared in the block; the amax its forward kept) */
    const int64_t db = mp_act_f8_operand_bytes(dy), wb = g->f8w_sharded ? mp_act_f8_operand_bytes(w) : 0;
    const int dy_known = (module == MP_MOD_GATE || module == MP_MOD_UP) && !g->sh.gpt &&
                         g->sh.fp8[MP_MOD_GATE] && g->sh.fp8[MP_MOD_UP];
    const int src = f8_source(module);
    pair(g, MP_MEM_FP8, BUF_F8_DY, db, 1);
    rt_f8_cast(g, module, dy, !dy_known, 2, MP_VAR_BWD);
    pair(g, MP_MEM_FP8, BUF_F8_W, wb, 1);
    if (wb) rt_f8_cast(g, module, w, 1, 2, MP_VAR_BWD);
    gemm(g, MP_VAR_DGRAD, module, m, in, out, batch, MP_DTYPE_FP8_E5M2);
    if (!(g->f8_scope & (1u << src))) rt_f8_cast(g, module, x, 0, 1, MP_VAR_BWD);
    rt_f8_act(g, module, x, 1);
    gemm(g, MP_VAR_WGRAD, module, out, in, (int64_t)ceil(m), batch, MP_DTYPE_FP8_E5M2);
    pair(g, MP_MEM_FP8, BUF_F8_W, wb, 0);
    pair(g, MP_MEM_FP8, BUF_F8_DY, db, 0);
    return;
  }
  cast(g, module, dy, MP_VAR_BWD);
  if (!g->sh.fp8_ag) cast(g, module, w, MP_VAR_BWD);
  cast(g, module, x, MP_VAR_BWD);
  const int64_t fb = g->rt ? mp_act_f8_emul_bwd_floats(dy, x, w) * 4 : dy + (g->sh.fp8_ag ? 0 : w) + x;
  pair(g, MP_MEM_FP8, BUF_FP8, fb, 1);
  gemm(g, MP_VAR_DGRAD, module, m, in, out, batch, MP_DTYPE_FP8_E5M2);
  /* WGRAD's FLOPs with the exact token count: dW[out, in] = dy^T x, k = m x batch tokens
   * spread over the batch of experts. */
  gemm(g, MP_VAR_WGRAD, module, out, in, (int64_t)ceil(m), batch, MP_DTYPE_FP8_E5M2);
  pair(g, MP_MEM_FP8, BUF_FP8, fb, 0);
}

/* WGRAD with k = m tokens: 2 x out x in x m x batch, the same as the forward. The gemm()
 * above takes m as the first size; for WGRAD m=out, k=tokens, so the FLOPs are exact
 * only when m is integral: fix them up for fractional expert token counts. */
static void fix_wgrad_flops(gen *g, int32_t first, double m_tokens) {
  for (int32_t i = first; i < g->n_ops; i++) {
    mp_op *op = &g->ops[i];
    if (op->type == MP_OP_COMPUTE && op->kernel == MP_KERNEL_GEMM && op->variant == MP_VAR_WGRAD)
      op->flops = 2.0 * (double)op->m * (double)op->n * m_tokens * (double)op->batch;
  }
}

/* Activations travel in bf16; the runtimes send their X tensors (fp32 on the CPU). */
static double act_comm_bytes(const gen *g) { return g->rt ? (double)g->xs : 2.0; }
static mp_dtype act_comm_dtype(const gen *g) {
  return g->rt && g->xs == 4 ? MP_DTYPE_FP32 : MP_DTYPE_BF16;
}

static void tp_allreduce(gen *g, int on, int module) {
  if (!on) return;
  const shapes *sh = &g->sh;
  comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_TP, MP_STREAM_COMPUTE,
       act_comm_bytes(g) * (double)(sh->T * sh->H), act_comm_dtype(g), module);
}

static void ep_alltoall(gen *g, int module) {
  const shapes *sh = &g->sh;
  if (sh->ep <= 1) return;
  comm(g, MP_COLL_ALL_TO_ALL, MP_GROUP_EP, MP_STREAM_COMPUTE,
       act_comm_bytes(g) * (double)(sh->T * sh->topk * sh->H), act_comm_dtype(g), module);
}

/* ---- activation sizes (see the file comment) ---------------------------------------- */

static int64_t act_x(const shapes *sh) { return 2 * sh->T * sh->H; }

static int64_t act_attn(const shapes *sh) {
  const int64_t T = sh->T, st = sh->gpt ? 8 : 4;
  int64_t b = 2 * T * sh->H + st * T + 2 * T * (sh->q + 2 * sh->kv) + 2 * T * sh->q + 4 * T * sh->nh;
  if (sh->qk_norm) b += 2 * T * (sh->q + sh->kv) + 4 * T * (sh->nh + sh->nkv);
  return b;
}

static int64_t act_mlp(const shapes *sh, int kind) {
  const int64_t T = sh->T, st = sh->gpt ? 8 : 4;
  int64_t b = 2 * T * sh->H + st * T + 2 * T * sh->H;
  if (kind == KIND_DENSE) return b + (sh->gpt ? 2 : 3) * 2 * T * sh->f;
  b += 4 * T * sh->E + 12 * T * sh->topk + 2 * T * sh->topk * sh->H +
       3 * 2 * T * sh->topk * sh->fe + 2 * T * sh->topk * sh->H;
  if (sh->has_shared) b += 3 * 2 * T * sh->fs;
  return b;
}

static int64_t bwd_workspace(const shapes *sh, int kind) {
  const int64_t T = sh->T;
  int64_t b = 2 * 2 * T * sh->H;
  if (kind == KIND_DENSE) return b + (sh->gpt ? 2 : 3) * 2 * T * sh->f;
  return b + 3 * 2 * T * sh->topk * sh->fe + 2 * T * sh->topk * sh->H;
}

/* ---- one block -------------------------------------------------------------------- */

typedef struct part_deps {
  int32_t dep[N_PARTS][2];
  uint8_t flags[N_PARTS][2];
} part_deps;

static void attach(gen *g, const part_deps *pd, int part) {
  if (pd == NULL) return;
  for (int i = 0; i < 2; i++) pend_dep(g, pd->dep[part][i], pd->flags[part][i]);
}

static void norm_fwd(gen *g, int module, int64_t rows, int64_t width) {
  const int64_t e = rows * width;
  elementwise(g, MP_KERNEL_NORM, MP_VAR_FWD, module, e, FLOPS_NORM_FWD, 4.0 * (double)e);
}

static void norm_bwd(gen *g, int module, int64_t rows, int64_t width) {
  const int64_t e = rows * width;
  elementwise(g, MP_KERNEL_NORM, MP_VAR_BWD, module, e, FLOPS_NORM_BWD, 6.0 * (double)e);
}

static void residual(gen *g, mp_variant v, int64_t elems) {
  elementwise(g, MP_KERNEL_RESIDUAL, v, -1, elems, 1.0, 6.0 * (double)elems);
}

/* RoPE on q and k: one op, or (the runtimes: runtime.c calls it for q, then k) two. */
static void rope(gen *g, mp_variant v) {
  const shapes *sh = &g->sh;
  if (sh->gpt) return;
  const int64_t eq = sh->T * sh->q, ek = sh->T * sh->kv;
  if (g->rt) {
    elementwise(g, MP_KERNEL_ROPE, v, -1, eq, FLOPS_ROPE, 4.0 * (double)eq);
    elementwise(g, MP_KERNEL_ROPE, v, -1, ek, FLOPS_ROPE, 4.0 * (double)ek);
  } else {
    elementwise(g, MP_KERNEL_ROPE, v, -1, eq + ek, FLOPS_ROPE, 4.0 * (double)(eq + ek));
  }
}

/* The residual stream's gradient: an add of its own in autograd; the runtimes' backward
 * kernels accumulate into it (ops.h: gradients accumulate), so nothing. */
static void residual_bwd(gen *g, int64_t elems) {
  if (!g->rt) residual(g, MP_VAR_BWD, elems);
}

static double attn_fwd_flops(const shapes *sh) {
  /* causal half of 4 x T x seq x heads x hd */
  return 2.0 * (double)sh->T * (double)sh->seq * (double)sh->nh * (double)sh->hd;
}

static void attention_core_fwd(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->T;
  compute(g, MP_KERNEL_ATTENTION, MP_VAR_FWD, -1, T, sh->seq, sh->hd, sh->nh, attn_fwd_flops(sh),
          2.0 * (double)(T * (2 * sh->q + 2 * sh->kv)) + 4.0 * (double)(T * sh->nh),
          MP_DTYPE_BF16);
}

static void attention_fwd(gen *g, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->T, H = sh->H;
  attach(g, pd, PART_ATTN);
  norm_fwd(g, MP_MOD_ATTN_NORM, T, H);
  linear_fwd(g, MP_MOD_Q, (double)T, sh->q, H, 1);
  linear_fwd(g, MP_MOD_K, (double)T, sh->kv, H, 1);
  linear_fwd(g, MP_MOD_V, (double)T, sh->kv, H, 1);
  if (sh->qk_norm) {
    norm_fwd(g, MP_MOD_Q_NORM, T * sh->nh, sh->hd);
    norm_fwd(g, MP_MOD_K_NORM, T * sh->nkv, sh->hd);
  }
  rope(g, MP_VAR_FWD);
  attention_core_fwd(g);
}

static void attention_out_fwd(gen *g) {
  const shapes *sh = &g->sh;
  linear_fwd(g, MP_MOD_O, (double)sh->T, sh->H, sh->q, 1);
  tp_allreduce(g, sh->ar_o, MP_MOD_O);
  residual(g, MP_VAR_FWD, sh->T * sh->H);
}

static void swiglu(gen *g, mp_variant v, int module, int64_t elems) {
  if (v == MP_VAR_FWD)
    elementwise(g, MP_KERNEL_ACTIVATION, v, module, elems, FLOPS_SWIGLU_FWD, 6.0 * (double)elems);
  else
    elementwise(g, MP_KERNEL_ACTIVATION, v, module, elems, FLOPS_SWIGLU_BWD, 10.0 * (double)elems);
}

/* The routed experts' GEMMs: one grouped op per Linear (batch = the local experts, m_exp
 * rows each), or, in the runtimes (runtime.c, experts_forward / experts_backward), one
 * GEMM per (source EP rank, local expert) block of m_exp / ep rows under balanced routing,
 * each a launch of its own and as efficient as its size: the forward's gate and up block
 * by block, then down; the backward's down, then gate and up block by block. Float8
 * experts keep the grouped op (the runtimes run their experts without float8). */
static int expert_blocks(const gen *g) {
  const shapes *sh = &g->sh;
  return g->rt && !sh->fp8[MP_MOD_EXPERTS_GATE] && !sh->fp8[MP_MOD_EXPERTS_UP] &&
                 !sh->fp8[MP_MOD_EXPERTS_DOWN]
             ? sh->ep * sh->E_l
             : 0;
}

static void experts_gate_up_fwd(gen *g, int64_t H) {
  const shapes *sh = &g->sh;
  const int nb = expert_blocks(g);
  if (nb == 0) {
    linear_fwd(g, MP_MOD_EXPERTS_GATE, sh->m_exp, sh->fe, H, sh->E_l);
    linear_fwd(g, MP_MOD_EXPERTS_UP, sh->m_exp, sh->fe, H, sh->E_l);
  }
  for (int b = 0; b < nb; b++) {
    linear_fwd(g, MP_MOD_EXPERTS_GATE, sh->m_exp / sh->ep, sh->fe, H, 1);
    linear_fwd(g, MP_MOD_EXPERTS_UP, sh->m_exp / sh->ep, sh->fe, H, 1);
  }
}

static void experts_down_fwd(gen *g, int64_t H) {
  const shapes *sh = &g->sh;
  const int nb = expert_blocks(g);
  if (nb == 0) linear_fwd(g, MP_MOD_EXPERTS_DOWN, sh->m_exp, H, sh->fe, sh->E_l);
  for (int b = 0; b < nb; b++) linear_fwd(g, MP_MOD_EXPERTS_DOWN, sh->m_exp / sh->ep, H, sh->fe, 1);
}

/* The routed experts' backward, their SwiGLU's between down and gate/up; WGRAD FLOPs with
 * the exact (fractional) rows per GEMM. */
static void experts_bwd(gen *g, int64_t H, int64_t Tk) {
  const shapes *sh = &g->sh;
  const int nb = expert_blocks(g);
  const int32_t first = g->n_ops;
  if (nb == 0) {
    linear_bwd(g, MP_MOD_EXPERTS_DOWN, sh->m_exp, H, sh->fe, sh->E_l);
    swiglu(g, MP_VAR_BWD, MP_MOD_EXPERTS_GATE, Tk * sh->fe);
    linear_bwd(g, MP_MOD_EXPERTS_GATE, sh->m_exp, sh->fe, H, sh->E_l);
    linear_bwd(g, MP_MOD_EXPERTS_UP, sh->m_exp, sh->fe, H, sh->E_l);
  } else {
    const double m = sh->m_exp / sh->ep;
    for (int b = 0; b < nb; b++) linear_bwd(g, MP_MOD_EXPERTS_DOWN, m, H, sh->fe, 1);
    swiglu(g, MP_VAR_BWD, MP_MOD_EXPERTS_GATE, Tk * sh->fe);
    for (int b = 0; b < nb; b++) {
      linear_bwd(g, MP_MOD_EXPERTS_GATE, m, sh->fe, H, 1);
      linear_bwd(g, MP_MOD_EXPERTS_UP, m, sh->fe, H, 1);
    }
  }
  if (g->st == MP_OK) fix_wgrad_flops(g, first, nb == 0 ? sh->m_exp : sh->m_exp / sh->ep);
}

static void mlp_fwd(gen *g, int kind, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->T, H = sh->H;
  /* the runtimes' full-AC recompute refills the block's saved tensors and stops there: no
   * down projection, unpermute or shared-expert output (runtime.c, block_forward without
   * x_out) */
  const int out = !(g->rt && g->phase == MP_PHASE_RECOMPUTE);
  attach(g, pd, PART_MOE);
  norm_fwd(g, MP_MOD_FFN_NORM, T, H);
  if (kind == KIND_DENSE) {
    if (sh->gpt) {
      linear_fwd(g, MP_MOD_UP, (double)T, sh->f, H, 1);
      elementwise(g, MP_KERNEL_ACTIVATION, MP_VAR_FWD, MP_MOD_UP, T * sh->f, FLOPS_GELU_FWD,
                  4.0 * (double)(T * sh->f));
    } else {
      linear_fwd(g, MP_MOD_GATE, (double)T, sh->f, H, 1);
      linear_fwd(g, MP_MOD_UP, (double)T, sh->f, H, 1);
      swiglu(g, MP_VAR_FWD, MP_MOD_GATE, T * sh->f);
    }
    if (!out) return;
    linear_fwd(g, MP_MOD_DOWN, (double)T, H, sh->f, 1);
    tp_allreduce(g, sh->ar_down, MP_MOD_DOWN);
  } else {
    const int64_t Tk = T * sh->topk;
    linear_fwd(g, MP_MOD_ROUTER, (double)T, sh->E, H, 1);
    elementwise(g, MP_KERNEL_ROUTER, MP_VAR_FWD, MP_MOD_ROUTER, T * sh->E, FLOPS_ROUTER,
                6.0 * (double)(T * sh->E) + 12.0 * (double)Tk);
    elementwise(g, MP_KERNEL_PERMUTE, MP_VAR_FWD, -1, Tk * H, 0.0,
                2.0 * (double)(T * H) + 2.0 * (double)(Tk * H));
    /* the runtimes under EP: the expert side (sized by the rows received) is saved for
     * backward; the expert outputs wait in a COMM buffer for the combine */
    const int ep_mem = g->rt && sh->ep > 1;
    if (ep_mem) rt_mem(g, MP_ACT_ALLOC_EPA, kind, 1);
    ep_alltoall(g, MP_MOD_EXPERTS_GATE);
    if (ep_mem) rt_mem(g, MP_ACT_ALLOC_EP_OUT, kind, 1);
    attach(g, pd, PART_EXPERTS);
    experts_gate_up_fwd(g, H);
    swiglu(g, MP_VAR_FWD, MP_MOD_EXPERTS_GATE, Tk * sh->fe);
    experts_down_fwd(g, H);
    ep_alltoall(g, MP_MOD_EXPERTS_DOWN);
    if (ep_mem) rt_mem(g, MP_ACT_ALLOC_EP_OUT, kind, 0);
    if (out)
      elementwise(g, MP_KERNEL_UNPERMUTE, MP_VAR_FWD, -1, Tk * H, 2.0,
                  2.0 * (double)(Tk * H) + 2.0 * (double)(T * H));
    if (sh->has_shared) {
      linear_fwd(g, MP_MOD_SHARED_GATE, (double)T, sh->fs, H, 1);
      linear_fwd(g, MP_MOD_SHARED_UP, (double)T, sh->fs, H, 1);
      swiglu(g, MP_VAR_FWD, MP_MOD_SHARED_GATE, T * sh->fs);
      if (!out) return;
      if (g->rt) rt_mem(g, MP_ACT_ALLOC_SHARED_OUT, kind, 1);
      linear_fwd(g, MP_MOD_SHARED_DOWN, (double)T, H, sh->fs, 1);
      tp_allreduce(g, sh->ar_sdown, MP_MOD_SHARED_DOWN);
      residual(g, MP_VAR_FWD, T * H); /* routed + shared */
      if (g->rt) rt_mem(g, MP_ACT_ALLOC_SHARED_OUT, kind, 0);
    }
    if (!out) return;
  }
  residual(g, MP_VAR_FWD, T * H);
}

static void mlp_bwd(gen *g, int kind, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->T, H = sh->H;
  attach(g, pd, PART_MOE);
  if (kind == KIND_DENSE) {
    linear_bwd(g, MP_MOD_DOWN, (double)T, H, sh->f, 1);
    if (sh->gpt) {
      elementwise(g, MP_KERNEL_ACTIVATION, MP_VAR_BWD, MP_MOD_UP, T * sh->f, FLOPS_GELU_BWD,
                  6.0 * (double)(T * sh->f));
      linear_bwd(g, MP_MOD_UP, (double)T, sh->f, H, 1);
    } else {
      swiglu(g, MP_VAR_BWD, MP_MOD_GATE, T * sh->f);
      linear_bwd(g, MP_MOD_GATE, (double)T, sh->f, H, 1);
      linear_bwd(g, MP_MOD_UP, (double)T, sh->f, H, 1);
    }
    tp_allreduce(g, sh->ar_gateup, MP_MOD_UP);
  } else {
    const int64_t Tk = T * sh->topk;
    if (sh->has_shared) {
      linear_bwd(g, MP_MOD_SHARED_DOWN, (double)T, H, sh->fs, 1);
      swiglu(g, MP_VAR_BWD, MP_MOD_SHARED_GATE, T * sh->fs);
      linear_bwd(g, MP_MOD_SHARED_GATE, (double)T, sh->fs, H, 1);
      linear_bwd(g, MP_MOD_SHARED_UP, (double)T, sh->fs, H, 1);
      tp_allreduce(g, sh->ar_sgateup, MP_MOD_SHARED_UP);
    }
    elementwise(g, MP_KERNEL_UNPERMUTE, MP_VAR_BWD, -1, Tk * H, 2.0,
                2.0 * (double)(T * H) + 4.0 * (double)(Tk * H));
    const int ep_mem = g->rt && sh->ep > 1; /* the expert side's gradients, as in forward */
    if (ep_mem) rt_mem(g, MP_ACT_ALLOC_EP_WS, kind, 1);
    ep_alltoall(g, MP_MOD_EXPERTS_DOWN);
    attach(g, pd, PART_EXPERTS);
    experts_bwd(g, H, Tk);
    ep_alltoall(g, MP_MOD_EXPERTS_GATE);
    if (ep_mem) rt_mem(g, MP_ACT_ALLOC_EP_WS, kind, 0);
    elementwise(g, MP_KERNEL_PERMUTE, MP_VAR_BWD, -1, Tk * H, 1.0,
                2.0 * (double)(Tk * H) + 2.0 * (double)(T * H));
    elementwise(g, MP_KERNEL_ROUTER, MP_VAR_BWD, MP_MOD_ROUTER, T * sh->E, FLOPS_ROUTER,
                10.0 * (double)(T * sh->E));
    linear_bwd(g, MP_MOD_ROUTER, (double)T, sh->E, H, 1);
  }
  norm_bwd(g, MP_MOD_FFN_NORM, T, H);
  residual_bwd(g, T * H);
}

static void attention_bwd(gen *g, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->T, H = sh->H;
  attach(g, pd, PART_ATTN);
  linear_bwd(g, MP_MOD_O, (double)T, H, sh->q, 1);
  compute(g, MP_KERNEL_ATTENTION, MP_VAR_BWD, -1, T, sh->seq, sh->hd, sh->nh,
          2.0 * attn_fwd_flops(sh),
          2.0 * (double)(T * (4 * sh->q + 4 * sh->kv)) + 4.0 * (double)(T * sh->nh),
          MP_DTYPE_BF16);
  rope(g, MP_VAR_BWD);
  if (sh->qk_norm) {
    norm_bwd(g, MP_MOD_K_NORM, T * sh->nkv, sh->hd);
    norm_bwd(g, MP_MOD_Q_NORM, T * sh->nh, sh->hd);
  }
  if (g->rt) { /* runtime.c's order (its float8 operand of xn1 comes with q) */
    linear_bwd(g, MP_MOD_Q, (double)T, sh->q, H, 1);
    linear_bwd(g, MP_MOD_K, (double)T, sh->kv, H, 1);
    linear_bwd(g, MP_MOD_V, (double)T, sh->kv, H, 1);
  } else {
    linear_bwd(g, MP_MOD_V, (double)T, sh->kv, H, 1);
    linear_bwd(g, MP_MOD_K, (double)T, sh->kv, H, 1);
    linear_bwd(g, MP_MOD_Q, (double)T, sh->q, H, 1);
  }
  tp_allreduce(g, sh->ar_qkv, MP_MOD_Q);
  norm_bwd(g, MP_MOD_ATTN_NORM, T, H);
  residual_bwd(g, T * H);
}

/* ---- FSDP pieces ----------------------------------------------------------------- */

/* Runtime models: a unit's gathered buffer (X) and its unsharded gradients (fp32, as many
 * elements as the gathered buffer's slots hold), in bytes. */
static int64_t rt_gathered(const gen *g, const unit_info *ui) {
  return g->xs == 2 ? ui->rt_gather_x2 : ui->rt_gather_x4;
}
static int64_t rt_unsharded_grads(const gen *g, const unit_info *ui) {
  return rt_gathered(g, ui) / g->xs * 4;
}

/* Issues the all-gathers of block `layer`'s units (or the root unit when layer < 0 and
 * unit >= 0) on the gather stream. gidx receives per part the gather's op index. */
static void gather_units(gen *g, int32_t layer, int32_t unit0, int n, int32_t gidx[N_PARTS],
                         int32_t dep_prev, int32_t *patch, int *n_patch) {
  for (int k = 0; k < N_PARTS; k++) gidx[k] = -1;
  if (!g->has_fsdp) return;
  for (int k = 0; k < n; k++) {
    const int32_t u = unit0 + k;
    const unit_info *ui = &g->ui[u];
    if (ui->numel_tp == 0) continue;
    /* the runtimes use a one-rank group's parameters in place: nothing to gather */
    if (g->rt && ui->gsize <= 1) continue;
    const int64_t gb = g->rt ? rt_gathered(g, ui) : (int64_t)ui->gather_bytes;
    int32_t i = mem(g, MP_OP_ALLOC, MP_MEM_GATHERED, BUF_GATHERED, gb, layer, u, MP_STREAM_GATHER);
    /* one-rank group: the cast to the param dtype is local; the dependency anchor stays the
     * ALLOC, so users still wait for "the gathered parameters" */
    if (ui->gsize > 1)
      i = comm(g, MP_COLL_ALL_GATHER, (mp_group)ui->group, MP_STREAM_GATHER, ui->gather_bytes,
               (mp_dtype)ui->gather_dtype, -1);
    if (i >= 0) {
      g->ops[i].layer = layer;
      g->ops[i].unit = u;
      add_dep(g, i, dep_prev, 0);
      if (patch) patch[(*n_patch)++] = i;
    }
    gidx[k] = i;
  }
}

static void free_units(gen *g, int32_t layer, int32_t unit0, int n, int part_lo, int part_hi) {
  if (!g->has_fsdp) return;
  for (int k = part_lo; k < n && k <= part_hi; k++) {
    const int32_t u = unit0 + k;
    if (g->ui[u].numel_tp == 0) continue;
    if (g->rt && g->ui[u].gsize <= 1) continue;
    mem(g, MP_OP_FREE, MP_MEM_GATHERED, BUF_GATHERED,
        g->rt ? rt_gathered(g, &g->ui[u]) : (int64_t)g->ui[u].gather_bytes, layer, u,
        MP_STREAM_COMPUTE);
  }
}

static void grads_alloc(gen *g, int32_t layer, int32_t unit0, int n) {
  if (!g->has_fsdp) return;
  for (int k = 0; k < n; k++) {
    const int32_t u = unit0 + k;
    /* the runtimes: gradients accumulate into the unit's slots (the gathered layout, in
     * fp32); a one-rank group accumulates into its resident gradients */
    const int64_t b = g->rt ? (g->ui[u].gsize > 1 ? rt_unsharded_grads(g, &g->ui[u]) : 0)
                            : g->ui[u].numel_tp * mp_dtype_bytes(g->pdt);
    if (b > 0) mem(g, MP_OP_ALLOC, MP_MEM_TEMP, BUF_GRAD_UNSHARDED, b, layer, u, MP_STREAM_COMPUTE);
  }
}

/* NCCL: the reduce-scatter in flight is finished (runtime.c, unit_rs_finish): its output
 * and the unit's unsharded gradients go. */
static void rt_rs_finish(gen *g) {
  if (!g->rs_fl.on) return;
  mem(g, MP_OP_FREE, MP_MEM_TEMP, BUF_RT_RS, g->rs_fl.rs, g->rs_fl.layer, g->rs_fl.unit,
      MP_STREAM_COMPUTE);
  mem(g, MP_OP_FREE, MP_MEM_TEMP, BUF_GRAD_UNSHARDED, g->rs_fl.gbuf, g->rs_fl.layer, g->rs_fl.unit,
      MP_STREAM_COMPUTE);
  g->rs_fl.on = 0;
}

/* Runtime models: unit u's gradients after its backward (runtime.c, unit_grad_end).
 * Blocking comm (MPI; the CPU): per parameter an in-place reduce-scatter from the unsharded
 * buffer into one staging shard (the largest padded shard), added into the gradient shard;
 * the staging, then the buffer, freed. NCCL (overlap): the reduce-scatter in flight is
 * finished first, then this unit's goes out into an output buffer of one 16-float-aligned
 * slot per sharded parameter and stays in flight (rt_rs_finish). A one-rank group
 * accumulated into its resident gradients: nothing. */
static void rt_reduce_unit(gen *g, int32_t layer, int32_t u, int rep, int32_t after) {
  const unit_info *ui = &g->ui[u];
  const int sharded = ui->gsize > 1;
  const int64_t rb = ui->numel_tp * mp_dtype_bytes(g->rdt), stage = ui->rt_max_pad * 4,
                out = ui->rt_rs_numel * 4;
  if (sharded && g->overlap) {
    rt_rs_finish(g);
    mem(g, MP_OP_ALLOC, MP_MEM_TEMP, BUF_RT_RS, out, layer, u, MP_STREAM_COMPUTE);
  } else if (sharded) {
    mem(g, MP_OP_ALLOC, MP_MEM_TEMP, BUF_GRAD_RS_IN, stage, layer, u, MP_STREAM_COMPUTE);
  }
  int32_t last = -1;
  if (sharded)
    last = grad_comm(g, MP_COLL_REDUCE_SCATTER, (mp_group)ui->group, rb, layer, u, after);
  if (rep > 1)
    last = grad_comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_DP_REPLICATE,
                     ui->numel_shard * mp_dtype_bytes(g->rdt), layer, u, last >= 0 ? last : after);
  if (!sharded) return;
  if (g->overlap) {
    g->rs_fl.on = 1;
    g->rs_fl.layer = layer;
    g->rs_fl.unit = u;
    g->rs_fl.rs = out;
    g->rs_fl.gbuf = rt_unsharded_grads(g, ui);
    return;
  }
  int32_t f = mem(g, MP_OP_FREE, MP_MEM_TEMP, BUF_GRAD_RS_IN, stage, layer, u, MP_STREAM_REDUCE);
  add_dep(g, f, last >= 0 ? last : after, 0);
  mem(g, MP_OP_FREE, MP_MEM_TEMP, BUF_GRAD_UNSHARDED, rt_unsharded_grads(g, ui), layer, u,
      MP_STREAM_REDUCE);
}

/* After the backward of units [lo, hi] of a block: copy to the reduce buffer,
 * reduce-scatter, all-reduce over dp_replicate, free. */
static void reduce_units(gen *g, int32_t layer, int32_t unit0, int n, int lo, int hi) {
  const int rep = g->p->mesh.size[MP_DIM_DP_REPLICATE];
  const int32_t after = g->last_c;
  for (int k = lo; k < n && k <= hi; k++) {
    const int32_t u = unit0 + k;
    const unit_info *ui = &g->ui[u];
    if (ui->numel_tp == 0) continue;
    if (!g->has_fsdp) {
      /* DDP-style: all-reduce the block's gradients over dp_replicate */
      if (rep > 1)
        grad_comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_DP_REPLICATE,
                  ui->numel_tp * mp_dtype_bytes(g->rdt), layer, u, after);
      continue;
    }
    if (g->rt) {
      rt_reduce_unit(g, layer, u, rep, after);
      continue;
    }
    const int64_t gb = ui->numel_tp * mp_dtype_bytes(g->pdt);
    const int64_t rb = ui->numel_tp * mp_dtype_bytes(g->rdt);
    mem(g, MP_OP_ALLOC, MP_MEM_TEMP, BUF_GRAD_RS_IN, rb, layer, u, MP_STREAM_COMPUTE);
    mem(g, MP_OP_FREE, MP_MEM_TEMP, BUF_GRAD_UNSHARDED, gb, layer, u, MP_STREAM_COMPUTE);
    int32_t last = -1;
    if (ui->gsize > 1)
      last = grad_comm(g, MP_COLL_REDUCE_SCATTER, (mp_group)ui->group, rb, layer, u, after);
    if (rep > 1)
      last = grad_comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_DP_REPLICATE,
                       ui->numel_shard * mp_dtype_bytes(g->rdt), layer, u, last >= 0 ? last : after);
    int32_t f = mem(g, MP_OP_FREE, MP_MEM_TEMP, BUF_GRAD_RS_IN, rb, layer, u, MP_STREAM_REDUCE);
    add_dep(g, f, last >= 0 ? last : after, 0);
  }
}

/* ---- blocks: forward and backward segments ---------------------------------------- */

typedef struct stage_info {
  int32_t l0, l1; /* layers [l0, l1) */
  int first, last;
} stage_info;

static int kind_of(const gen *g, int32_t l, const stage_info *st) {
  if (l < st->l0 || l >= st->l1) return KIND_NONE;
  return mp_model_layer_is_moe(&g->p->model, l) ? KIND_MOE : KIND_DENSE;
}

/* Can layer b be a later repetition of the run that layer a starts (b = a + r)? */
static int same_block(const gen *g, int32_t a, int32_t b, const stage_info *st) {
  if (kind_of(g, a, st) != kind_of(g, b, st)) return 0;
  if (kind_of(g, a - 1, st) != kind_of(g, b - 1, st)) return 0;
  if (kind_of(g, a + 1, st) != kind_of(g, b + 1, st)) return 0;
  const int n = g->n_units[a];
  if (g->n_units[b] != n) return 0;
  const int32_t r = b - a, step = n;
  /* unit indices advance regularly, sizes match, for the block and its neighbours */
  for (int d = -1; d <= 1; d++) {
    const int32_t la = a + d, lb = b + d;
    if (kind_of(g, la, st) == KIND_NONE) continue;
    if (g->n_units[la] != g->n_units[lb]) return 0;
    if (g->first_unit[lb] - g->first_unit[la] != r * step) return 0;
    for (int k = 0; k < g->n_units[la]; k++) {
      const unit_info *x = &g->ui[g->first_unit[la] + k], *y = &g->ui[g->first_unit[lb] + k];
      if (x->numel_tp != y->numel_tp || x->numel_shard != y->numel_shard ||
          x->gather_bytes != y->gather_bytes || x->group != y->group ||
          x->rt_gather_x4 != y->rt_gather_x4 || x->rt_gather_x2 != y->rt_gather_x2 ||
          x->rt_rs_numel != y->rt_rs_numel || x->rt_max_pad != y->rt_max_pad)
        return 0;
    }
  }
  return 1;
}

/* Gather ops of the block the next block segment consumes (in earlier segments). */
typedef struct carry {
  int32_t gather[N_PARTS];
} carry;

/* A block's forward under the torchtitan model: what autograd saves (see the sizes above)
 * allocated as its ops run; AC frees what it will recompute. */
static void block_fwd_tt(gen *g, int kind, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const mp_ac_mode ac = g->p->opts.ac;
  pair(g, MP_MEM_ACTIVATIONS, BUF_ACT_X, act_x(sh), 1);
  pair(g, MP_MEM_ACTIVATIONS, BUF_ACT_ATTN, act_attn(sh), 1);
  attention_fwd(g, pd);
  attention_out_fwd(g);
  if (ac != MP_AC_NONE) pair(g, MP_MEM_ACTIVATIONS, BUF_ACT_ATTN, act_attn(sh), 0);
  pair(g, MP_MEM_ACTIVATIONS, BUF_ACT_MLP, act_mlp(sh, kind), 1);
  mlp_fwd(g, kind, pd);
  if (ac == MP_AC_FULL) pair(g, MP_MEM_ACTIVATIONS, BUF_ACT_MLP, act_mlp(sh, kind), 0);
}

/* A block's forward as the meshplan runtimes run it: the block's saved tensors, its
 * attention core and its output x[l + 1] allocated at its start; the float8 activation
 * codes go with its forward; full AC then keeps only x[l], selective drops the core. */
static void rt_block_fwd(gen *g, int kind, const part_deps *pd) {
  const mp_ac_mode ac = g->p->opts.ac;
  rt_mem(g, MP_ACT_ALLOC_BLOCK, kind, 1);
  rt_mem(g, MP_ACT_ALLOC_CORE, kind, 1);
  rt_mem(g, MP_ACT_ALLOC_X, kind, 1);
  attention_fwd(g, pd);
  attention_out_fwd(g);
  mlp_fwd(g, kind, pd);
  rt_f8_scope_close(g);
  if (ac != MP_AC_NONE) rt_mem(g, MP_ACT_ALLOC_CORE, kind, 0);
  if (ac == MP_AC_FULL) {
    rt_mem(g, MP_ACT_ALLOC_BLOCK, kind, 0);
    if (kind == KIND_MOE && g->sh.ep > 1) rt_mem(g, MP_ACT_ALLOC_EPA, kind, 0);
  }
}

static void block_fwd_segment(gen *g, const stage_info *st, int32_t l, int32_t repeat,
                              carry *c) {
  const int kind = kind_of(g, l, st);
  const int nu = g->n_units[l];
  const int32_t u0 = g->first_unit[l];
  seg_open(g, MP_PHASE_FORWARD, l, 1);
  const int32_t prev_last = g->last_c;
  /* prefetch the next block's units, or (no prefetch) gather this block's own */
  int32_t patch[N_PARTS], n_patch = 0;
  int32_t next_g[N_PARTS] = {-1, -1, -1}, own_g[N_PARTS] = {-1, -1, -1};
  if (g->prefetch && kind_of(g, l + 1, st) != KIND_NONE)
    gather_units(g, l + 1, g->first_unit[l + 1], g->n_units[l + 1], next_g, prev_last, patch,
                 &n_patch);
  if (!g->prefetch) gather_units(g, l, u0, nu, own_g, prev_last, patch, &n_patch);
  part_deps pd;
  for (int k = 0; k < N_PARTS; k++) {
    /* part k's unit: a single-unit block has everything in its unit 0 */
    const int src = nu == 1 ? (k == 0 ? 0 : -1) : k;
    pd.dep[k][0] = src >= 0 ? (g->prefetch ? c->gather[src] : own_g[src]) : -1;
    pd.flags[k][0] = 0;
    pd.dep[k][1] = g->prefetch && src >= 0 && repeat > 1 ? next_g[src] : -1;
    pd.flags[k][1] = MP_DEP_PREV_REP;
  }
  if (g->rt) rt_block_fwd(g, kind, &pd);
  else block_fwd_tt(g, kind, &pd);
  if (g->reshard) free_units(g, l, u0, nu, 0, N_PARTS - 1);
  /* the segment's last compute-stream op: what the next segment's gathers wait for */
  const int32_t block_last = g->last_c;
  /* a gather issued in this segment waits for the previous repetition's compute */
  for (int i = 0; i < n_patch; i++) add_dep(g, patch[i], block_last, MP_DEP_PREV_REP);
  seg_close(g, MP_PHASE_FORWARD, repeat, 1, nu);
  for (int k = 0; k < N_PARTS; k++) c->gather[k] = next_g[k];
}

/* A block's backward as the meshplan runtimes run it: recompute (full: the block's saved
 * tensors; selective: only the attention core, from the saved q, k, v), the workspace, MLP
 * then attention backward, then the block's buffers go and its units are reduced and
 * released. */
static void rt_block_bwd(gen *g, int32_t l, int kind, const part_deps *pd) {
  const mp_ac_mode ac = g->p->opts.ac;
  if (ac == MP_AC_FULL) {
    g->phase = MP_PHASE_RECOMPUTE;
    rt_mem(g, MP_ACT_ALLOC_BLOCK, kind, 1);
    rt_mem(g, MP_ACT_ALLOC_CORE, kind, 1);
    attention_fwd(g, pd);
    attention_out_fwd(g);
    mlp_fwd(g, kind, pd);
    rt_f8_scope_close(g);
    g->phase = MP_PHASE_BACKWARD;
  } else {
    attach(g, pd, PART_ATTN); /* the first op waits for the gathered attention part */
    if (ac == MP_AC_SELECTIVE) {
      g->phase = MP_PHASE_RECOMPUTE;
      rt_mem(g, MP_ACT_ALLOC_CORE, kind, 1);
      attention_core_fwd(g);
      g->phase = MP_PHASE_BACKWARD;
    }
  }
  rt_mem(g, MP_ACT_ALLOC_WS, kind, 1);
  mlp_bwd(g, kind, ac == MP_AC_FULL ? NULL : pd);
  attention_bwd(g, NULL);
  rt_f8_scope_close(g);
  rt_mem(g, MP_ACT_ALLOC_WS, kind, 0);
  rt_mem(g, MP_ACT_ALLOC_CORE, kind, 0);
  rt_mem(g, MP_ACT_ALLOC_BLOCK, kind, 0);
  if (kind == KIND_MOE && g->sh.ep > 1) rt_mem(g, MP_ACT_ALLOC_EPA, kind, 0);
  /* all of the block's units are reduced after its whole backward, then resharded */
  reduce_units(g, l, g->first_unit[l], g->n_units[l], 0, N_PARTS - 1);
  free_units(g, l, g->first_unit[l], g->n_units[l], 0, N_PARTS - 1);
}

/* A block's backward under the torchtitan model: the workspace, the recompute (full: the
 * whole block before the MLP's backward; selective: attention before its own), the MoE
 * and experts units resharded and reduced once the MLP's backward is done, the attention
 * unit (or the block's one unit) after attention's. */
static void block_bwd_tt(gen *g, int32_t l, int kind, const part_deps *pd) {
  const shapes *sh = &g->sh;
  const mp_ac_mode ac = g->p->opts.ac;
  const int nu = g->n_units[l];
  const int32_t u0 = g->first_unit[l];
  pair(g, MP_MEM_TEMP, BUF_BWD_WS, bwd_workspace(sh, kind), 1);
  if (ac == MP_AC_FULL) {
    g->phase = MP_PHASE_RECOMPUTE;
    pair(g, MP_MEM_ACTIVATIONS, BUF_RC_ATTN, act_attn(sh), 1);
    pair(g, MP_MEM_ACTIVATIONS, BUF_RC_MLP, act_mlp(sh, kind), 1);
    attention_fwd(g, pd);
    attention_out_fwd(g);
    mlp_fwd(g, kind, pd);
    g->phase = MP_PHASE_BACKWARD;
  }
  mlp_bwd(g, kind, ac == MP_AC_FULL ? NULL : pd);
  pair(g, MP_MEM_ACTIVATIONS, ac == MP_AC_FULL ? BUF_RC_MLP : BUF_ACT_MLP, act_mlp(sh, kind), 0);
  if (nu > 1) {
    free_units(g, l, u0, nu, PART_MOE, PART_EXPERTS);
    reduce_units(g, l, u0, nu, PART_MOE, PART_EXPERTS);
  }
  if (ac == MP_AC_SELECTIVE) {
    g->phase = MP_PHASE_RECOMPUTE;
    pair(g, MP_MEM_ACTIVATIONS, BUF_RC_ATTN, act_attn(sh), 1);
    attention_fwd(g, pd);
    g->phase = MP_PHASE_BACKWARD;
  }
  attention_bwd(g, ac == MP_AC_NONE ? pd : NULL);
  pair(g, MP_MEM_ACTIVATIONS, ac == MP_AC_NONE ? BUF_ACT_ATTN : BUF_RC_ATTN, act_attn(sh), 0);
  pair(g, MP_MEM_ACTIVATIONS, BUF_ACT_X, act_x(sh), 0);
  pair(g, MP_MEM_TEMP, BUF_BWD_WS, bwd_workspace(sh, kind), 0);
  free_units(g, l, u0, nu, 0, nu > 1 ? PART_ATTN : N_PARTS - 1);
  reduce_units(g, l, u0, nu, 0, nu > 1 ? PART_ATTN : N_PARTS - 1);
}

static void block_bwd_segment(gen *g, const stage_info *st, int32_t l, int32_t repeat,
                              carry *c) {
  const int kind = kind_of(g, l, st);
  const int nu = g->n_units[l];
  const int32_t u0 = g->first_unit[l];
  seg_open(g, MP_PHASE_BACKWARD, l, -1);
  const int32_t prev_last = g->last_c;
  /* the runtimes: x[l + 1] goes as the block above (or the head) finishes its backward */
  if (g->rt) rt_mem(g, MP_ACT_ALLOC_X, kind, 0);
  int32_t patch[N_PARTS], n_patch = 0;
  int32_t next_g[N_PARTS] = {-1, -1, -1}, own_g[N_PARTS] = {-1, -1, -1};
  /* resharded, a block gathers its own units without prefetch; with it, the block above
   * prefetched them, but the runtime's top block gathers its own once the head is done */
  const int own = g->reshard && (!g->prefetch || (g->rt && l == st->l1 - 1));
  if (own) gather_units(g, l, u0, nu, own_g, prev_last, patch, &n_patch);
  if (g->prefetch && g->reshard && kind_of(g, l - 1, st) != KIND_NONE)
    gather_units(g, l - 1, g->first_unit[l - 1], g->n_units[l - 1], next_g, prev_last, patch,
                 &n_patch);
  /* resharded: each part's first use waits for its gather, issued by the block above
   * (the previous segment, or the previous repetition of this one), or by this block */
  part_deps pd;
  for (int k = 0; k < N_PARTS; k++) {
    const int src = nu == 1 ? (k == 0 ? 0 : -1) : k;
    pd.dep[k][0] = g->reshard && src >= 0 ? (own ? own_g[src] : c->gather[src]) : -1;
    pd.flags[k][0] = 0;
    pd.dep[k][1] = g->prefetch && g->reshard && src >= 0 && repeat > 1 ? next_g[src] : -1;
    pd.flags[k][1] = MP_DEP_PREV_REP;
  }
  grads_alloc(g, l, u0, nu);
  if (g->rt) rt_block_bwd(g, l, kind, &pd);
  else block_bwd_tt(g, l, kind, &pd);
  const int32_t block_last = g->last_c;
  for (int i = 0; i < n_patch; i++) add_dep(g, patch[i], block_last, MP_DEP_PREV_REP);
  seg_close(g, MP_PHASE_BACKWARD, repeat, -1, -nu);
  for (int k = 0; k < N_PARTS; k++) c->gather[k] = next_g[k];
  /* NCCL: the reduce-scatter in flight after the segment is the last repetition's */
  if (g->rs_fl.on && g->rs_fl.layer == l) {
    g->rs_fl.layer -= repeat - 1;
    g->rs_fl.unit -= (repeat - 1) * nu;
  }
}

/* ---- embedding, head, loss, optimizer -------------------------------------------- */

static void embedding_fwd(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t e = sh->T * sh->H;
  elementwise(g, MP_KERNEL_EMBEDDING, MP_VAR_FWD, MP_MOD_TOK_EMBEDDINGS, e, 0.0,
              4.0 * (double)e + 8.0 * (double)sh->T);
  tp_allreduce(g, sh->ar_emb, MP_MOD_TOK_EMBEDDINGS);
  if (sh->gpt) {
    elementwise(g, MP_KERNEL_EMBEDDING, MP_VAR_FWD, MP_MOD_POS_EMBEDDINGS, e, 0.0, 4.0 * (double)e);
    residual(g, MP_VAR_FWD, e);
  }
}

static void embedding_bwd(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t e = sh->T * sh->H;
  if (sh->gpt)
    elementwise(g, MP_KERNEL_EMBEDDING, MP_VAR_BWD, MP_MOD_POS_EMBEDDINGS, e, 1.0, 6.0 * (double)e);
  elementwise(g, MP_KERNEL_EMBEDDING, MP_VAR_BWD, MP_MOD_TOK_EMBEDDINGS, e, 1.0,
              6.0 * (double)e + 8.0 * (double)sh->T);
}

static int head_module(const shapes *sh) { return sh->tied ? MP_MOD_TOK_EMBEDDINGS : MP_MOD_OUTPUT; }

static int64_t head_act_bytes(const shapes *sh) {
  return 2 * (2 * sh->T * sh->H) + (sh->gpt ? 8 : 4) * sh->T;
}

static void head_fwd(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->T, H = sh->H;
  /* the runtimes: xf and rstdf in one block; one LOGITS block of the X logits, the
   * per-token losses and log-sum-exp (and the vocab-parallel reductions), kept for the
   * backward */
  if (g->rt) rt_mem(g, MP_ACT_ALLOC_HEAD, KIND_DENSE, 1);
  else pair(g, MP_MEM_ACTIVATIONS, BUF_ACT_HEAD, head_act_bytes(sh), 1);
  norm_fwd(g, MP_MOD_FINAL_NORM, T, H);
  if (g->rt) rt_mem(g, MP_ACT_ALLOC_LOGITS, KIND_DENSE, 1);
  else pair(g, MP_MEM_LOGITS, BUF_LOGITS, 2 * T * sh->V_loss, 1);
  linear_fwd(g, head_module(sh), (double)T, sh->V_l, H, 1);
  if (sh->logits_gather)
    comm(g, MP_COLL_ALL_GATHER, MP_GROUP_TP, MP_STREAM_COMPUTE, 2.0 * (double)(T * sh->V_loss),
         MP_DTYPE_BF16, head_module(sh));
  if (!g->rt) pair(g, MP_MEM_LOGITS, BUF_LOGITS_F32, 4 * T * sh->V_loss, 1);
  elementwise(g, MP_KERNEL_LOSS, MP_VAR_FWD, head_module(sh), T * sh->V_loss, FLOPS_LOSS,
              10.0 * (double)(T * sh->V_loss));
  if (sh->loss_parallel)
    for (int i = 0; i < 3; i++)
      comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_TP, MP_STREAM_COMPUTE, 4.0 * (double)T, MP_DTYPE_FP32,
           head_module(sh));
  if (!g->rt) pair(g, MP_MEM_LOGITS, BUF_LOGITS, 2 * T * sh->V_loss, 0);
}

/* The runtimes' head backward (runtime.c): dlogits (X), the residual-stream gradient dres
 * (kept through the blocks' backward) and dxf; the logits go after the head's GEMMs. */
static void head_bwd_rt(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->T, H = sh->H;
  rt_mem(g, MP_ACT_ALLOC_DLOGITS, KIND_DENSE, 1);
  elementwise(g, MP_KERNEL_LOSS, MP_VAR_BWD, head_module(sh), T * sh->V_loss, 2.0,
              8.0 * (double)(T * sh->V_loss));
  rt_mem(g, MP_ACT_ALLOC_DRES, KIND_DENSE, 1);
  rt_mem(g, MP_ACT_ALLOC_DXF, KIND_DENSE, 1);
  linear_bwd(g, head_module(sh), (double)T, sh->V_l, H, 1);
  tp_allreduce(g, sh->ar_head_in, head_module(sh));
  rt_mem(g, MP_ACT_ALLOC_DLOGITS, KIND_DENSE, 0);
  rt_mem(g, MP_ACT_ALLOC_LOGITS, KIND_DENSE, 0);
  norm_bwd(g, MP_MOD_FINAL_NORM, T, H);
  rt_mem(g, MP_ACT_ALLOC_DXF, KIND_DENSE, 0);
  rt_mem(g, MP_ACT_ALLOC_HEAD, KIND_DENSE, 0);
}

static void head_bwd(gen *g) {
  const shapes *sh = &g->sh;
  const int64_t T = sh->T, H = sh->H;
  pair(g, MP_MEM_LOGITS, BUF_DLOGITS_F32, 4 * T * sh->V_loss, 1);
  elementwise(g, MP_KERNEL_LOSS, MP_VAR_BWD, head_module(sh), T * sh->V_loss, 2.0,
              8.0 * (double)(T * sh->V_loss));
  pair(g, MP_MEM_LOGITS, BUF_LOGITS_F32, 4 * T * sh->V_loss, 0);
  /* the head's GEMMs use this rank's V_l columns of the gradient (a slice when gathered) */
  pair(g, MP_MEM_LOGITS, BUF_DLOGITS, 2 * T * sh->V_l, 1);
  pair(g, MP_MEM_LOGITS, BUF_DLOGITS_F32, 4 * T * sh->V_loss, 0);
  linear_bwd(g, head_module(sh), (double)T, sh->V_l, H, 1);
  pair(g, MP_MEM_LOGITS, BUF_DLOGITS, 2 * T * sh->V_l, 0);
  tp_allreduce(g, sh->ar_head_in, head_module(sh));
  norm_bwd(g, MP_MOD_FINAL_NORM, T, H);
  pair(g, MP_MEM_ACTIVATIONS, BUF_ACT_HEAD, head_act_bytes(sh), 0);
}

/* ---- setup ------------------------------------------------------------------------ */

/* The micro-batch's part of the shapes: tokens per micro-batch on the rank and per local
 * expert. */
static void shapes_for_batch(shapes *sh, const mp_plan *p, int64_t micro_batch) {
  const int cp = p->mesh.size[MP_DIM_CP];
  sh->seq = p->opts.seq;
  sh->T = micro_batch * p->opts.seq / cp;
  sh->m_exp = sh->E > 0 ? (double)sh->T * (double)sh->topk * (double)sh->ep / (double)sh->E : 0.0;
}

/* Runtime models: the activation layout (exec/act_layout.h) for one micro-batch of this
 * rank, from its local shapes. X elements are g->xs bytes (fp32 on the CPU, bf16 on CUDA).
 * Under EP the expert side is sized by the rows a rank receives, which routing decides at
 * run time: the balanced count N x top_k is used (each rank sends N x top_k rows; with
 * uniform routing it receives as many). */
static void rt_layout_fill(gen *g, int64_t micro_batch) {
  const shapes *sh = &g->sh;
  const mp_act_dims d = {.B = micro_batch, .S = sh->seq, .N = sh->T, .C = sh->H, .HD = sh->hd,
                         .NH = sh->nh, .NKV = sh->nkv, .F = sh->f, .E = sh->E, .K = sh->topk,
                         .Fe = sh->fe, .Fs = sh->has_shared ? sh->fs : 0, .Vl = sh->V_l,
                         .R = sh->T * sh->topk, .L = g->p->model.n_layers,
                         .NP = g->p->n_params, .xs = g->xs, .tp = sh->tp, .ep = sh->ep,
                         .host_mem = g->host_mem};
  mp_act_layout_fill(&g->lay[KIND_DENSE], &d, 0);
  mp_act_layout_fill(&g->lay[KIND_MOE], &d, 1);
}

/* Everything else: from the model and the plan's parameters (mp_schedule_prep keeps it). */
static void read_shapes(gen *g) {
  const mp_plan *p = g->p;
  const mp_model *m = &p->model;
  shapes *sh = &g->sh;
  memset(sh, 0, sizeof *sh);
  sh->tp = p->mesh.size[MP_DIM_TP];
  sh->ep = p->mesh.ep > 1 && (p->applied & MP_PASS_EP) ? p->mesh.ep : 1;
  sh->H = m->d_model;
  sh->hd = m->head_dim;
  sh->gpt = m->family == MP_FAMILY_GPT;
  sh->qk_norm = m->qk_norm;
  sh->tied = m->tied_embeddings;
  sh->E = m->n_experts;
  sh->topk = m->top_k;
  sh->has_shared = m->n_shared_experts > 0;
  sh->fp8_ag = p->opts.fp8_opts.all_gather && (p->applied & MP_PASS_FLOAT8) && sh->tp == 1;
  /* defaults before TP */
  sh->q = m->n_heads * m->head_dim;
  sh->kv = m->n_kv_heads * m->head_dim;
  sh->f = m->d_ff;
  sh->fe = m->d_ff_expert;
  sh->fs = m->d_ff_shared;
  sh->E_l = m->n_experts;
  sh->V_l = p->vocab_padded;
  int seen[MP_MOD_COUNT] = {0};
  for (int i = 0; i < p->n_params; i++) {
    const mp_param *prm = &p->params[i];
    if (prm->role != MP_ROLE_WEIGHT || seen[prm->module]) continue;
    seen[prm->module] = 1;
    sh->fp8[prm->module] = prm->float8;
    const int col = prm->tp_style == MP_TP_COLWISE, row = prm->tp_style == MP_TP_ROWWISE;
    switch (prm->module) {
      case MP_MOD_TOK_EMBEDDINGS:
        sh->ar_emb = prm->tp_style == MP_TP_VOCAB;
        if (sh->tied) sh->V_l = prm->tp_shape[0];
        break;
      case MP_MOD_Q: sh->q = prm->tp_shape[0]; sh->ar_qkv = col; break;
      case MP_MOD_K: sh->kv = prm->tp_shape[0]; break;
      case MP_MOD_O: sh->ar_o = row; break;
      case MP_MOD_UP: sh->f = prm->tp_shape[0]; sh->ar_gateup = col; break;
      case MP_MOD_DOWN: sh->ar_down = row; break;
      case MP_MOD_EXPERTS_GATE: sh->E_l = prm->tp_shape[0]; break;
      case MP_MOD_SHARED_UP: sh->fs = prm->tp_shape[0]; sh->ar_sgateup = col; break;
      case MP_MOD_SHARED_DOWN: sh->ar_sdown = row; break;
      case MP_MOD_OUTPUT: sh->V_l = prm->tp_shape[0]; break;
      default: break;
    }
  }
  if (sh->tied && seen[MP_MOD_TOK_EMBEDDINGS]) sh->fp8[MP_MOD_TOK_EMBEDDINGS] = 0;
  sh->nh = sh->q / sh->hd;
  sh->nkv = sh->kv / sh->hd;
  /* the head is colwise whenever its rows are split; its input gradient is partial */
  const int head_split = sh->V_l != p->vocab_padded;
  sh->ar_head_in = head_split;
  sh->loss_parallel = head_split && p->opts.tp.shard_logits;
  sh->logits_gather = head_split && !p->opts.tp.shard_logits;
  sh->V_loss = sh->logits_gather ? p->vocab_padded : sh->V_l;
}

/* What the runtime models hold at rest besides the torchtitan model's sums. */
typedef struct rt_rest {
  int64_t numel_pad; /* FSDP shards padded to the group's chunk: fp32 master, grad, m, v */
  int64_t numel_rep; /* parameters not FSDP-sharded: meshplan-cuda's bf16 compute copies */
  int64_t f8w_bytes; /* meshplan-cuda: codes of the float8 weights not FSDP-sharded */
  /* per parameter tensor of the stage (the runtime's optimizer works tensor by tensor):
   * its padded shard's elements, and whether it is not sharded (a resident compute copy) */
  int32_t n_t;
  int64_t *t_pad;
  uint8_t *t_rep;
  uint8_t *t_f8;     /* not sharded and float8: resident codes, re-quantized once per step */
} rt_rest;

/* The builder's unit tables (per plan unit, or per pseudo unit without FSDP) and the
 * runtime models' per-tensor arrays, in the arena, zeroed. */
static mp_status units_alloc(gen *g, rt_rest *rest) {
  const mp_plan *p = g->p;
  const int L = (int)p->model.n_layers;
  const size_t np = (size_t)(p->n_params > 0 ? p->n_params : 1);
  g->has_fsdp = (p->applied & MP_PASS_FSDP) && p->n_units > 0;
  g->first_unit = mp_arena_alloc(g->arena, sizeof(int32_t) * (size_t)(L + 1));
  g->n_units = mp_arena_alloc(g->arena, (size_t)(L + 1));
  g->n_ui = g->has_fsdp ? p->n_units : L + 1;
  g->ui = mp_arena_alloc(g->arena, sizeof(unit_info) * (size_t)g->n_ui);
  memset(rest, 0, sizeof *rest);
  rest->t_pad = mp_arena_alloc(g->arena, sizeof(int64_t) * np);
  rest->t_rep = mp_arena_alloc(g->arena, np);
  rest->t_f8 = mp_arena_alloc(g->arena, np);
  if (g->first_unit == NULL || g->n_units == NULL || g->ui == NULL || rest->t_pad == NULL ||
      rest->t_rep == NULL || rest->t_f8 == NULL)
    return mp_error(g->ctx, MP_ERR_NOMEM, "out of memory building the step schedule");
  for (int l = 0; l < L; l++) g->first_unit[l] = -1;
  g->root_unit = -1;
  return MP_OK;
}

/* What the runtime models hold of one parameter of the stage (sharded over a group of
 * gs, its tile `local` elements of n tp-local ones). A sharded parameter keeps the padded
 * chunk on every rank of its group (FSDP2's equal shards), whatever its own tile; the
 * gathered buffer holds gs such chunks per parameter, each slot 64-byte aligned. One not
 * sharded has a resident compute copy when X is not fp32 (CUDA), and, float8, the codes
 * of that copy from its first GEMM on. */
static void rt_add_param(rt_rest *rest, unit_info *ui, const mp_param *prm, int gs,
                         int64_t local, int64_t n) {
  const int64_t pad = gs > 1 ? mp_param_padded_shard_numel(prm, gs) : local;
  rest->numel_pad += pad;
  rest->t_pad[rest->n_t] = pad;
  rest->t_f8[rest->n_t] = gs <= 1 && prm->float8;
  rest->t_rep[rest->n_t++] = gs <= 1;
  if (gs > 1) {
    ui->rt_gather_x4 += mp_act_gather_slot_bytes(gs, pad, 4);
    ui->rt_gather_x2 += mp_act_gather_slot_bytes(gs, pad, 2);
    ui->rt_rs_numel += mp_act_rs_slot_floats(pad);
    if (pad > ui->rt_max_pad) ui->rt_max_pad = pad;
  } else {
    rest->numel_rep += pad;
    if (prm->float8) rest->f8w_bytes += mp_act_f8_operand_bytes(n);
  }
}

/* Parameter prm of the stage into its unit: its tp-local elements, its padded shard, the
 * gather's bytes, and the rank's elements at rest (its tile: gi is the rank's index in
 * the group of gs). */
static void add_param(gen *g, const mp_param *prm, unit_info *ui, int gs, int gi,
                      int64_t *params_numel, rt_rest *rest) {
  const int64_t n = mp_param_tp_numel(prm), rows = prm->tp_shape[0];
  int64_t local = n;
  if (g->has_fsdp && prm->place[MP_AXIS_FSDP].kind == MP_PLACEMENT_SHARD && rows > 0) {
    const int64_t chunk = mp_fsdp_chunk_rows(rows, gs), start = (int64_t)gi * chunk;
    const int64_t end = start + chunk < rows ? start + chunk : rows;
    local = end > start ? (end - start) * (n / rows) : 0;
  }
  *params_numel += local;
  ui->numel_tp += n;
  ui->numel_shard += mp_param_padded_shard_numel(prm, gs);
  rt_add_param(rest, ui, prm, gs, local, n);
  const int f8 = g->sh.fp8_ag && prm->float8;
  ui->gather_bytes += (double)n * (f8 ? 1 : mp_dtype_bytes(g->pdt));
  ui->gsize = gs;
  ui->group = (uint8_t)(g->has_fsdp ? prm->fsdp_group : MP_GROUP_DP_REPLICATE);
  ui->gather_dtype = (uint8_t)g->pdt;
}

/* Each layer's first unit and unit count, and the root unit; a block's units must be
 * consecutive, at most N_PARTS (exec/pass_fsdp.c's layout). */
static mp_status units_by_layer(gen *g) {
  for (int u = 0; u < g->n_ui; u++) {
    const int layer = g->has_fsdp ? g->p->units[u].layer : u - 1;
    if (layer < 0) {
      if (g->ui[u].numel_tp > 0) g->root_unit = u;
      continue;
    }
    if (g->first_unit[layer] < 0) g->first_unit[layer] = u;
    g->n_units[layer]++;
    if (g->n_units[layer] > N_PARTS || g->first_unit[layer] + g->n_units[layer] - 1 != u)
      return mp_error(g->ctx, MP_ERR_INTERNAL,
                      "FSDP units of layer %d are not consecutive or more than %d; the "
                      "schedule expects the layout of exec/pass_fsdp.c",
                      layer, N_PARTS);
  }
  return MP_OK;
}

/* Units as this rank's stage sees them, and the rank's elements at rest (the same sums as
 * mp_plan_rank_totals, which is too slow for the planner's loop: it asks the mesh per
 * parameter; here the group sizes and indices are asked once per group kind). */
static mp_status read_units(gen *g, int stage, int rank, int64_t *params_numel,
                            rt_rest *rest) {
  const mp_plan *p = g->p;
  MP_CHECK(units_alloc(g, rest));
  int gsize[MP_GROUP_COUNT], gidx[MP_GROUP_COUNT];
  for (int k = 0; k < MP_GROUP_COUNT; k++) gsize[k] = gidx[k] = -1;
  *params_numel = 0;
  for (int i = 0; i < p->n_params; i++) {
    const mp_param *prm = &p->params[i];
    if (prm->pp_stage != stage) continue;
    /* without FSDP: pseudo unit 0 = root, 1 + l = block l (gradient all-reduce buckets) */
    const int u = g->has_fsdp ? prm->fsdp_unit : (prm->layer < 0 ? 0 : 1 + prm->layer);
    if (u < 0 || u >= g->n_ui)
      return mp_error(g->ctx, MP_ERR_INTERNAL, "parameter %s has FSDP unit %d of %d", prm->fqn,
                      u, g->n_ui);
    const int grp = prm->fsdp_group;
    if (g->has_fsdp && gsize[grp] < 0) {
      gsize[grp] = mp_mesh_group_size(&p->mesh, (mp_group)grp);
      gidx[grp] = mp_mesh_group_index(&p->mesh, (mp_group)grp, rank);
    }
    add_param(g, prm, &g->ui[u], g->has_fsdp ? gsize[grp] : 1, g->has_fsdp ? gidx[grp] : 0,
              params_numel, rest);
  }
  return units_by_layer(g);
}

/* The runtimes' optimizer step (runtime.c, mp_runtime_optimizer_step), tensor by tensor
 * as it runs: per parameter tensor a sum of squares of its gradient shard (4 bytes an
 * element read), the norm's all-reduce over the world, then per tensor AdamW (7 fp32
 * tensors) and, for a resident compute copy (not sharded, X not fp32: CUDA), its refresh
 * from the master (fp32 read, X written). Then the gradients' zero fill, which the runtime
 * makes at the start of the next step (mp_runtime_forward_backward): costed here, where
 * nothing overlaps it either. One op per tensor, so each pays the kernel overhead the
 * runtime's launches do. (The runtime sums squares only of the tensors this rank owns
 * once over tp and dp_replicate; every local tensor is counted here, a few norm weights
 * more under tp.) */
static void rt_optimizer(gen *g, const rt_rest *r, int world_reduce) {
  for (int32_t t = 0; t < r->n_t; t++) {
    const int64_t n = r->t_pad[t];
    int32_t i = compute(g, MP_KERNEL_GRAD_NORM, MP_VAR_FWD, -1, n, 0, 0, 1, 2.0 * (double)n,
                        4.0 * (double)n, MP_DTYPE_FP32);
    if (t == 0) add_dep(g, i, g->last_reduce, 0);
  }
  if (world_reduce)
    comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_WORLD, MP_STREAM_COMPUTE, 4.0, MP_DTYPE_FP32, -1);
  for (int32_t t = 0; t < r->n_t; t++) {
    const int64_t n = r->t_pad[t];
    compute(g, MP_KERNEL_OPTIMIZER, MP_VAR_FWD, -1, n, 0, 0, 1, FLOPS_ADAMW * (double)n,
            BYTES_ADAMW * (double)n, MP_DTYPE_FP32);
    if (r->t_rep[t] && g->xs != 4)
      compute(g, MP_KERNEL_COPY, MP_VAR_FWD, -1, n, 0, 0, 1, 0.0, (4.0 + g->xs) * (double)n,
              MP_DTYPE_FP32);
    /* the resident codes of an updated float8 weight: the runtime quantizes them again at
     * their first GEMM of the next step (f8_weight), costed here, once per step */
    if (g->f8c && r->t_f8[t]) rt_f8_cast(g, -1, n, 1, 2, MP_VAR_FWD);
  }
  for (int32_t t = 0; t < r->n_t; t++)
    compute(g, MP_KERNEL_COPY, MP_VAR_FWD, -1, r->t_pad[t], 0, 0, 1, 0.0, 4.0 * (double)r->t_pad[t],
            MP_DTYPE_FP32);
}

/* Runs of identical blocks in [l0, l1): run_len[l] for run starts, 0 inside runs. */
static void find_runs(gen *g, const stage_info *st, mp_schedule_mode mode, int32_t *run_len) {
  for (int32_t l = st->l0; l < st->l1;) {
    int32_t r = 1;
    if (mode == MP_SCHEDULE_COMPACT)
      while (l + r < st->l1 && same_block(g, l, l + r, st)) r++;
    run_len[l] = r;
    for (int32_t k = 1; k < r; k++) run_len[l + k] = 0;
    l += r;
  }
}

/* What the builder reads from the plan's parameters for one rank (see schedule.h). */
struct mp_schedule_prep {
  /* identity: the plan family it serves */
  const mp_param *params;
  const mp_fsdp_unit *units;
  int n_params, n_plan_units;
  unsigned applied;
  mp_mesh mesh;
  int64_t seq;
  int fp8_all_gather;
  mp_dtype pdt, rdt;
  /* what it holds */
  int rank, stage;
  mp_schedule_mode mode;
  stage_info st;
  shapes sh; /* all but the micro-batch's part */
  int has_fsdp;
  unit_info *ui;
  int n_ui;
  int32_t *first_unit;
  int8_t *n_units;
  int32_t root_unit;
  int64_t params_numel;
  rt_rest rest;             /* the runtime models' resident sums */
  int32_t *run_len;
  double flops_per_token;
};

static mp_status check_plan_rank(mp_ctx *ctx, const mp_plan *p, int rank) {
  const mp_mesh *mesh = &p->mesh;
  if (rank < 0 || rank >= mp_mesh_world(mesh))
    return mp_error(ctx, MP_ERR_INVALID, "rank %d is outside the mesh's %d ranks", rank,
                    mp_mesh_world(mesh));
  if (!(p->applied & MP_PASS_FSDP) && mesh->size[MP_DIM_DP_SHARD] > 1)
    return mp_error(ctx, MP_ERR_ORDER,
                    "the plan has dp_shard=%d but FSDP was not applied, so no rank would hold "
                    "its parameter shard; apply FSDP (mp_apply_fsdp) before building the "
                    "schedule",
                    mesh->size[MP_DIM_DP_SHARD]);
  if ((unsigned)p->opts.mem_model > MP_MEM_MODEL_MESHPLAN_CUDA)
    return mp_error(ctx, MP_ERR_INVALID, "unknown memory model %d; choose torchtitan, "
                    "meshplan-cpu or meshplan-cuda", (int)p->opts.mem_model);
  if ((p->applied & MP_PASS_TP) == 0 && mesh->size[MP_DIM_TP] > 1)
    return mp_error(ctx, MP_ERR_ORDER,
                    "the mesh has tp=%d but TP was not applied; apply the passes in order "
                    "(mp_build_plan) before building the schedule",
                    mesh->size[MP_DIM_TP]);
  return MP_OK;
}

static void gen_dtypes(const mp_plan *p, mp_dtype *pdt, mp_dtype *rdt) {
  *pdt = p->opts.fsdp.param_dtype;
  *rdt = p->opts.fsdp.reduce_dtype;
  if (mp_dtype_bytes(*pdt) <= 0) *pdt = MP_DTYPE_BF16;
  if (mp_dtype_bytes(*rdt) <= 0) *rdt = MP_DTYPE_FP32;
}

static mp_status prep_fill(mp_ctx *ctx, const mp_plan *p, int rank, mp_schedule_mode mode,
                           mp_arena *arena, mp_schedule_prep **out) {
  *out = NULL;
  mp_schedule_prep *pr = mp_arena_alloc(arena, sizeof *pr);
  MP_CHECK_ALLOC(ctx, pr);
  gen g;
  memset(&g, 0, sizeof g);
  g.ctx = ctx;
  g.arena = arena;
  g.p = p;
  gen_dtypes(p, &g.pdt, &g.rdt);
  const mp_mesh *mesh = &p->mesh;
  int coords[MP_MESH_NDIMS];
  mp_mesh_coords(mesh, rank, coords);
  const int stage = coords[MP_DIM_PP], pp = mesh->size[MP_DIM_PP];
  const int L = (int)p->model.n_layers;
  int lps = p->layers_per_stage > 0 ? p->layers_per_stage : (L + pp - 1) / pp;
  stage_info st = {stage * lps, (stage + 1) * lps < L ? (stage + 1) * lps : L, stage == 0,
                   stage == pp - 1};
  read_shapes(&g);
  int64_t params_numel = 0;
  rt_rest rest;
  MP_CHECK(read_units(&g, stage, rank, &params_numel, &rest));
  int32_t *run_len = mp_arena_alloc(arena, sizeof(int32_t) * (size_t)(L + 1));
  MP_CHECK_ALLOC(ctx, run_len);
  find_runs(&g, &st, mode, run_len);
  pr->params = p->params;
  pr->units = p->units;
  pr->n_params = p->n_params;
  pr->n_plan_units = p->n_units;
  pr->applied = p->applied;
  pr->mesh = *mesh;
  pr->seq = p->opts.seq;
  pr->fp8_all_gather = p->opts.fp8_opts.all_gather;
  pr->pdt = g.pdt;
  pr->rdt = g.rdt;
  pr->rank = rank;
  pr->stage = stage;
  pr->mode = mode;
  pr->st = st;
  pr->sh = g.sh;
  pr->has_fsdp = g.has_fsdp;
  pr->ui = g.ui;
  pr->n_ui = g.n_ui;
  pr->first_unit = g.first_unit;
  pr->n_units = g.n_units;
  pr->root_unit = g.root_unit;
  pr->params_numel = params_numel;
  pr->rest = rest;
  pr->run_len = run_len;
  pr->flops_per_token = mp_model_flops_per_token(&p->model, p->opts.seq);
  *out = pr;
  return MP_OK;
}

mp_status mp_schedule_prep_create(mp_ctx *ctx, const mp_plan *p, int rank,
                                  mp_schedule_mode mode, mp_arena *arena,
                                  mp_schedule_prep **out) {
  *out = NULL;
  MP_CHECK(check_plan_rank(ctx, p, rank));
  return prep_fill(ctx, p, rank, mode, arena, out);
}

/* The prep serves p: same parameters and units (the same tables), mesh and the options
 * that shape what it read. */
static int prep_serves(const mp_schedule_prep *pr, const mp_plan *p) {
  mp_dtype pdt, rdt;
  gen_dtypes(p, &pdt, &rdt);
  return pr->params == p->params && pr->units == p->units && pr->n_params == p->n_params &&
         pr->n_plan_units == p->n_units && pr->applied == p->applied &&
         memcmp(&pr->mesh, &p->mesh, sizeof pr->mesh) == 0 && pr->seq == p->opts.seq &&
         pr->fp8_all_gather == p->opts.fp8_opts.all_gather && pr->pdt == pdt && pr->rdt == rdt;
}

static mp_status build_prepped(mp_ctx *ctx, const mp_plan *p, const mp_schedule_prep *pr,
                               mp_arena *arena, mp_schedule **out);

mp_status mp_schedule_build_prepped(mp_ctx *ctx, const mp_plan *p, const mp_schedule_prep *pr,
                                    mp_arena *arena, mp_schedule **out) {
  *out = NULL;
  if (pr == NULL || !prep_serves(pr, p))
    return mp_error(ctx, MP_ERR_INVALID,
                    "schedule prep was made for another plan (other parameters, mesh or "
                    "options); make one with mp_schedule_prep_create for this plan");
  return build_prepped(ctx, p, pr, arena, out);
}

mp_status mp_schedule_build(mp_ctx *ctx, const mp_plan *p, int rank, mp_schedule_mode mode,
                            mp_arena *arena, mp_schedule **out) {
  *out = NULL;
  MP_CHECK(check_plan_rank(ctx, p, rank));
  int64_t local_batch = 0, n_micro = 0;
  MP_CHECK(mp_plan_batch(ctx, p, &local_batch, &n_micro));
  mp_schedule_prep *pr = NULL;
  MP_CHECK(prep_fill(ctx, p, rank, mode, arena, &pr));
  return build_prepped(ctx, p, pr, arena, out);
}

/* The builder's state for plan p from its prep: the prep's tables (read only from here
 * on), the micro-batch's shapes, and the memory model's properties. */
static void gen_init(gen *g, mp_ctx *ctx, const mp_plan *p, const mp_schedule_prep *pr,
                     mp_arena *arena, mp_schedule *s) {
  memset(g, 0, sizeof *g);
  g->ctx = ctx;
  g->arena = arena;
  g->p = p;
  g->s = s;
  g->last_c = g->last_reduce = -1;
  g->reshard = p->opts.fsdp.reshard_after_forward;
  g->pdt = pr->pdt;
  g->rdt = pr->rdt;
  g->sh = pr->sh;
  shapes_for_batch(&g->sh, p, p->opts.micro_batch);
  g->has_fsdp = pr->has_fsdp;
  g->ui = pr->ui;
  g->n_ui = pr->n_ui;
  g->first_unit = pr->first_unit;
  g->n_units = pr->n_units;
  g->root_unit = pr->root_unit;
  /* the runtime models differ in the backend's X dtype and memory, and in the comm: the
   * CPU's blocking MPI collectives, or (CUDA, a GPU per rank) NCCL's overlap */
  const int cuda = p->opts.mem_model == MP_MEM_MODEL_MESHPLAN_CUDA;
  g->rt = p->opts.mem_model == MP_MEM_MODEL_MESHPLAN_CPU || cuda;
  g->xs = cuda ? 2 : 4;
  g->f8c = cuda || (g->rt && p->opts.f8_codes);
  g->host_mem = !cuda;
  g->overlap = cuda;
  g->prefetch = !g->rt || g->overlap;
  g->f8w_sharded = g->has_fsdp && mp_mesh_group_size(&p->mesh, MP_GROUP_FSDP) > 1;
  if (g->rt) rt_layout_fill(g, p->opts.micro_batch);
}

/* The schedule's header: who, how many micro-batches, and the model FLOPs for MFU. */
static void schedule_header(mp_schedule *s, const mp_plan *p, const mp_schedule_prep *pr,
                            int64_t local_batch, int64_t n_micro) {
  const mp_mesh *mesh = &p->mesh;
  s->plan = p;
  s->rank = pr->rank;
  s->pp_stage = pr->stage;
  s->mode = pr->mode;
  s->n_micro = n_micro;
  s->micro_batch = p->opts.micro_batch;
  s->seq = p->opts.seq;
  s->tokens_per_step_per_rank = local_batch * p->opts.seq;
  const int cp = mesh->size[MP_DIM_CP], tp = mesh->size[MP_DIM_TP], pp = mesh->size[MP_DIM_PP];
  s->model_flops_per_step =
      pr->flops_per_token * (double)s->tokens_per_step_per_rank / ((double)tp * pp * cp);
}

/* A resident allocation of the prologue. */
static void resident(gen *g, mp_mem_cat cat, int buf, int64_t bytes) {
  g->s->resident_bytes[cat] = bytes;
  mem(g, MP_OP_ALLOC, cat, buf, bytes, -1, -1, MP_STREAM_COMPUTE);
}

/* Prologue: the resident state. The torchtitan model: the rank's shards in the master
 * dtype, as many gradients and two AdamW states. The runtime models: fp32 master,
 * gradient and AdamW m, v of the padded shards; X compute copies of the parameters not
 * sharded when X is not fp32; the resident tensors of the activation layout; the float8
 * codes of unsharded weights. */
static void emit_prologue(gen *g, const mp_schedule_prep *pr) {
  const int64_t mb = mp_dtype_bytes(g->p->opts.master_dtype), n = pr->params_numel;
  int64_t param_bytes = n * mb, grad_bytes = n * mb, optimizer_bytes = 2 * n * mb;
  if (g->rt) {
    param_bytes = grad_bytes = 4 * pr->rest.numel_pad;
    optimizer_bytes = 8 * pr->rest.numel_pad;
    if (g->xs != 4) param_bytes += g->xs * pr->rest.numel_rep;
  }
  seg_open(g, MP_PHASE_PROLOGUE, -1, 0);
  resident(g, MP_MEM_PARAMS, BUF_PARAMS, param_bytes);
  resident(g, MP_MEM_OPTIMIZER, BUF_OPTIMIZER, optimizer_bytes);
  resident(g, MP_MEM_GRADS, BUF_GRADS, grad_bytes);
  if (g->rt) resident(g, MP_MEM_TEMP, BUF_RT_RESIDENT, mp_act_resident_bytes(&g->lay[KIND_DENSE]));
  if (g->f8c && pr->rest.f8w_bytes > 0) resident(g, MP_MEM_FP8, BUF_RT_F8W, pr->rest.f8w_bytes);
  seg_close(g, MP_PHASE_PROLOGUE, 1, 0, 0);
}

/* Activations crossing a pipeline stage boundary: [T, H] bf16. */
static int32_t stage_p2p(gen *g, mp_coll c) {
  return comm(g, c, MP_GROUP_PP, MP_STREAM_P2P, 2.0 * (double)(g->sh.T * g->sh.H), MP_DTYPE_BF16,
              -1);
}

/* Forward head: the stage's input, the root unit's gather and the first block's, the
 * embedding. Returns the root gather (-1 on a stage without root parameters). */
static int32_t emit_forward_head(gen *g, const stage_info *st, carry *c) {
  int32_t root_g[N_PARTS] = {-1, -1, -1};
  seg_open(g, MP_PHASE_FORWARD, -1, 0);
  int32_t recv = -1;
  if (g->rt) rt_mem(g, MP_ACT_ALLOC_TOKENS, KIND_DENSE, 1);
  if (!st->first) recv = stage_p2p(g, MP_COLL_RECV);
  if (g->root_unit >= 0) gather_units(g, -1, g->root_unit, 1, root_g, -1, NULL, NULL);
  if (g->prefetch && st->l1 > st->l0)
    gather_units(g, st->l0, g->first_unit[st->l0], g->n_units[st->l0], c->gather, -1, NULL, NULL);
  if (g->rt) rt_mem(g, MP_ACT_ALLOC_X, KIND_DENSE, 1); /* x[0], the stage's input */
  if (st->first) {
    pend_dep(g, root_g[0], 0);
    embedding_fwd(g);
  }
  seg_close(g, MP_PHASE_FORWARD, 1, 0, 0);
  if (recv >= 0) pend_dep(g, recv, 0); /* the stage's first block waits for its input */
  return root_g[0];
}

/* Forward tail: head and loss, or the send to the next stage. */
static void emit_forward_tail(gen *g, const stage_info *st, int32_t root_gather) {
  seg_open(g, MP_PHASE_FORWARD, -1, 0);
  if (st->last) {
    pend_dep(g, root_gather, 0);
    head_fwd(g);
  } else {
    const int32_t send = stage_p2p(g, MP_COLL_SEND);
    add_dep(g, send, g->last_c, 0);
  }
  seg_close(g, MP_PHASE_FORWARD, 1, 0, 0);
}

/* Backward head: loss and head backward, or the gradient from the next stage; the last
 * block's units prefetched when they were resharded (the runtime's top block gathers its
 * own). */
static void emit_backward_head(gen *g, const stage_info *st, carry *c) {
  seg_open(g, MP_PHASE_BACKWARD, -1, 0);
  if (g->root_unit >= 0) grads_alloc(g, -1, g->root_unit, 1);
  const int32_t recv = st->last ? -1 : stage_p2p(g, MP_COLL_RECV);
  for (int k = 0; k < N_PARTS; k++) c->gather[k] = -1;
  if (g->prefetch && g->reshard && st->l1 > st->l0 && !g->rt)
    gather_units(g, st->l1 - 1, g->first_unit[st->l1 - 1], g->n_units[st->l1 - 1], c->gather,
                 g->last_c, NULL, NULL);
  if (st->last && g->rt) head_bwd_rt(g);
  else if (st->last) head_bwd(g);
  else if (g->rt) rt_mem(g, MP_ACT_ALLOC_DRES, KIND_DENSE, 1); /* the received gradient */
  seg_close(g, MP_PHASE_BACKWARD, 1, 0, 0);
  if (recv >= 0) pend_dep(g, recv, 0);
}

/* Backward tail: the embedding's backward, or the gradient sent to the previous stage; the
 * root unit's reduction. */
static void emit_backward_tail(gen *g, const stage_info *st) {
  seg_open(g, MP_PHASE_BACKWARD, -1, 0);
  if (st->first) {
    embedding_bwd(g);
  } else {
    const int32_t send = stage_p2p(g, MP_COLL_SEND);
    add_dep(g, send, g->last_c, 0);
  }
  if (g->rt) {
    /* the runtime's end of the micro-batch: dres, x[0], the root's reduce-scatter (and
     * every one still in flight), its gathered parameters, the token ids */
    rt_mem(g, MP_ACT_ALLOC_DRES, KIND_DENSE, 0);
    rt_mem(g, MP_ACT_ALLOC_X, KIND_DENSE, 0);
    if (g->root_unit >= 0) reduce_units(g, -1, g->root_unit, 1, 0, 0);
    rt_rs_finish(g);
    if (g->root_unit >= 0) free_units(g, -1, g->root_unit, 1, 0, 0);
    rt_mem(g, MP_ACT_ALLOC_TOKENS, KIND_DENSE, 0);
  } else if (g->root_unit >= 0) {
    free_units(g, -1, g->root_unit, 1, 0, 0);
    reduce_units(g, -1, g->root_unit, 1, 0, 0);
  }
  seg_close(g, MP_PHASE_BACKWARD, 1, 0, 0);
}

/* Optimizer: global gradient norm (clipping), AdamW on the shard. */
static void emit_optimizer(gen *g, const mp_schedule_prep *pr) {
  const int world_reduce = mp_mesh_world(&g->p->mesh) > 1;
  seg_open(g, MP_PHASE_OPTIMIZER, -1, 0);
  if (g->rt) {
    rt_optimizer(g, &pr->rest, world_reduce);
  } else {
    const double shard = (double)pr->params_numel;
    int32_t gn = compute(g, MP_KERNEL_GRAD_NORM, MP_VAR_FWD, -1, (int64_t)shard, 0, 0, 1,
                         2.0 * shard, 4.0 * shard, MP_DTYPE_FP32);
    add_dep(g, gn, g->last_reduce, 0);
    if (world_reduce)
      comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_WORLD, MP_STREAM_COMPUTE, 4.0, MP_DTYPE_FP32, -1);
    compute(g, MP_KERNEL_OPTIMIZER, MP_VAR_FWD, -1, (int64_t)shard, 0, 0, 1, FLOPS_ADAMW * shard,
            BYTES_ADAMW * shard, MP_DTYPE_FP32);
  }
  seg_close(g, MP_PHASE_OPTIMIZER, 1, 0, 0);
}

/* The blocks, forward in order, then backward from the top: one segment per run of
 * identical blocks (pr->run_len). */
static void emit_blocks(gen *g, const mp_schedule_prep *pr, int backward, carry *c) {
  const stage_info *st = &pr->st;
  const int32_t *run_len = pr->run_len;
  if (!backward) {
    for (int32_t l = st->l0; l < st->l1; l++)
      if (run_len[l] > 0) block_fwd_segment(g, st, l, run_len[l], c);
    return;
  }
  for (int32_t l = st->l1 - 1; l >= st->l0; l--) {
    /* a run [a, a + r) is written backward starting at its top layer */
    int32_t a = l;
    while (run_len[a] == 0) a--;
    const int32_t r = run_len[a];
    block_bwd_segment(g, st, a + r - 1, r, c);
    l = a;
  }
}

/* The ops and segments into s, with each segment's first instance index. */
static void schedule_finish(mp_schedule *s, const gen *g) {
  s->ops = g->ops;
  s->n_ops = g->n_ops;
  g_ops_hint = g->n_ops;
  s->segs = g->segs;
  s->n_segs = g->n_segs;
  int64_t idx = 0;
  for (int32_t i = 0; i < s->n_segs; i++) {
    s->segs[i].first_index = idx;
    idx += (int64_t)s->segs[i].n_ops * s->segs[i].repeat;
  }
  s->n_instances = idx;
}

static mp_status build_prepped(mp_ctx *ctx, const mp_plan *p, const mp_schedule_prep *pr,
                               mp_arena *arena, mp_schedule **out) {
  int64_t local_batch = 0, n_micro = 0;
  MP_CHECK(mp_plan_batch(ctx, p, &local_batch, &n_micro));
  mp_schedule *s = mp_arena_alloc(arena, sizeof *s);
  MP_CHECK_ALLOC(ctx, s);
  gen g;
  gen_init(&g, ctx, p, pr, arena, s);
  schedule_header(s, p, pr, local_batch, n_micro);
  emit_prologue(&g, pr);
  carry c = {{-1, -1, -1}};
  const int32_t root_gather = emit_forward_head(&g, &pr->st, &c);
  emit_blocks(&g, pr, 0, &c);
  emit_forward_tail(&g, &pr->st, root_gather);
  emit_backward_head(&g, &pr->st, &c);
  emit_blocks(&g, pr, 1, &c);
  emit_backward_tail(&g, &pr->st);
  emit_optimizer(&g, pr);
  if (g.st != MP_OK) return g.st; /* its message is on ctx */
  schedule_finish(s, &g);
  *out = s;
  return MP_OK;
}

/* ---- the step program (schedule.h) ------------------------------------------------ */

const char *mp_step_act_name(int kind) {
  static const char *n[MP_ACT_COUNT] = {
      "tokens",     "gather",   "embed_fwd", "block_fwd", "free_core", "free_block",
      "release",    "head_fwd", "grad_begin", "head_bwd", "recompute", "block_bwd",
      "grad_end",   "free_x",   "embed_bwd", "free_tokens", "rs_finish"};
  return kind >= 0 && kind < MP_ACT_COUNT ? n[kind] : "?";
}

mp_status mp_schedule_step_program(mp_ctx *ctx, const mp_schedule *s, mp_arena *arena,
                                   mp_step_action **out, int32_t *n_out) {
  *out = NULL;
  *n_out = 0;
  const mp_plan *p = s->plan;
  if (p->opts.mem_model != MP_MEM_MODEL_MESHPLAN_CPU && p->opts.mem_model != MP_MEM_MODEL_MESHPLAN_CUDA)
    return mp_error(ctx, MP_ERR_INVALID, "step program: the schedule has no runtime memory model (build the "
                    "plan with the meshplan-cpu or meshplan-cuda stack's options)");
  if (p->mesh.size[MP_DIM_PP] > 1)
    return mp_error(ctx, MP_ERR_INVALID, "step program: pipeline stages are not executed");
  /* at most one action per op instance */
  mp_step_action *a = mp_arena_alloc(arena, sizeof *a * (size_t)(s->n_instances > 0 ? s->n_instances : 1));
  if (a == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the step program");
  int32_t n = 0;
  mp_schedule_iter it;
  mp_schedule_iter_begin(s, &it);
  while (mp_schedule_iter_next(&it)) {
    const mp_op *op = it.op;
    if (op->phase == MP_PHASE_PROLOGUE || op->phase == MP_PHASE_OPTIMIZER) continue;
    if (op->when != MP_WHEN_EVERY_MICRO)
      return mp_error(ctx, MP_ERR_INVALID, "step program: op %lld runs only in some micro-batches; the "
                      "runtime runs every micro-batch alike", (long long)it.index);
    const int fwd = op->phase == MP_PHASE_FORWARD, bwd = op->phase == MP_PHASE_BACKWARD;
    const int alloc = op->type == MP_OP_ALLOC, freed = op->type == MP_OP_FREE;
    mp_step_action x = {MP_ACT_COUNT, it.layer, 0};
    if (op->type == MP_OP_COMM && op->coll == MP_COLL_ALL_GATHER && it.unit >= 0) {
      x.kind = MP_ACT_GATHER; /* one per layer: the layer's units go out together */
      if (n > 0 && a[n - 1].kind == MP_ACT_GATHER && a[n - 1].a == it.layer) continue;
    } else if (op->type == MP_OP_COMM && op->coll == MP_COLL_REDUCE_SCATTER && it.unit >= 0) {
      x.kind = MP_ACT_GRAD_END;
      x.a = it.unit;
    } else if (op->type == MP_OP_COMPUTE && op->kernel == MP_KERNEL_EMBEDDING &&
               op->module == MP_MOD_TOK_EMBEDDINGS) {
      x.kind = fwd ? MP_ACT_EMBED_FWD : MP_ACT_EMBED_BWD;
    } else if (alloc || freed) {
      switch (op->buf) {
        case BUF_RT_TOKENS: x.kind = alloc ? MP_ACT_TOKENS : MP_ACT_FREE_TOKENS; break;
        case BUF_RT_BLOCK:
          if (alloc && fwd) x.kind = MP_ACT_BLOCK_FWD;
          else if (alloc && op->phase == MP_PHASE_RECOMPUTE) x.kind = MP_ACT_RECOMPUTE, x.b = 1;
          else if (freed && fwd) x.kind = MP_ACT_FREE_BLOCK;
          break;
        case BUF_RT_CORE:
          if (freed && fwd) {
            x.kind = MP_ACT_FREE_CORE;
          } else if (alloc && op->phase == MP_PHASE_RECOMPUTE &&
                     !(n > 0 && a[n - 1].kind == MP_ACT_RECOMPUTE && a[n - 1].a == it.layer)) {
            x.kind = MP_ACT_RECOMPUTE; /* the core alone: selective */
            x.b = 0;
          }
          break;
        case BUF_RT_X: if (freed && bwd) x.kind = MP_ACT_FREE_X; break;
        case BUF_RT_HEAD: if (alloc) x.kind = MP_ACT_HEAD_FWD; break;
        case BUF_DLOGITS: if (alloc) x.kind = MP_ACT_HEAD_BWD; break;
        case BUF_BWD_WS: if (alloc) x.kind = MP_ACT_BLOCK_BWD; break;
        case BUF_GRAD_UNSHARDED: if (alloc) x.kind = MP_ACT_GRAD_BEGIN, x.a = it.unit; break;
        case BUF_GATHERED: if (freed) x.kind = MP_ACT_RELEASE, x.a = it.unit; break;
        case BUF_RT_RS:
          /* the one in flight completes before the next unit's goes out, and at the end */
          if (freed && !(n > 0 && a[n - 1].kind == MP_ACT_RS_FINISH)) x.kind = MP_ACT_RS_FINISH;
          break;
        default: break;
      }
    }
    if (x.kind != MP_ACT_COUNT) a[n++] = x;
  }
  *out = a;
  *n_out = n;
  return MP_OK;
}
