/* The op interface: one table of function pointers per backend (kernels/cpu, kernels/cuda).
 *
 * The runtime's schedule walker calls ops only through an mp_backend, so switching device
 * never changes the walker. Style: ggml's backend tables filled with designated
 * initializers, llm.c's plain-C signatures on raw pointers with explicit shapes.
 *
 * Conventions every entry follows (a backend that breaks one is wrong, not different):
 *
 * - Status. Every entry returns mp_status and records a one-line message on kc->err on
 *   failure (a CUDA backend reports launch errors here). Ops never exit.
 *
 * - Storage dtypes. Two kinds of tensor pointer appear in signatures:
 *     void *   "X" tensors, stored in the backend's compute dtype `be->x_dtype`:
 *              activations, their gradients, and the compute copies of parameters
 *              (the weights passed to a forward/backward). CPU: fp32. CUDA: bf16,
 *              with fp32 accumulation inside every kernel.
 *     float *  always fp32, on every backend: parameter gradients (accumulated in fp32,
 *              so micro-batch accumulation and the fp32 gradient reduce-scatter lose
 *              nothing), master parameters and AdamW state, normalisation statistics,
 *              softmax statistics, router probabilities and weights, losses, float8
 *              scales and amax.
 *     int32_t * token ids, targets, expert indices, permutations.
 *     uint8_t * float8 codes (E4M3 or E5M2 bit patterns, see mp_f8_format).
 *   Host code moves data in and out with to_device_f32 / from_device_f32, which convert
 *   between host fp32 and X, so callers never depend on x_dtype.
 *
 * - Layout. Row-major, contiguous, the last dimension fastest. Shapes are in the comment
 *   beside each argument: B batch, T sequence, C channels, N = B*T tokens (or rows),
 *   nh query heads, nkv key/value heads (nh % nkv == 0), hd head dim, V vocab (Vl the
 *   local shard), E experts, k experts per token, H hidden (MLP) width.
 *
 * - Gradients ACCUMULATE. Every backward adds (+=) into every gradient it produces, as in
 *   llm.c, so residual branches and micro-batch accumulation need no extra adds; the
 *   caller zeroes buffers (memset_zero) when a fresh gradient is wanted. Forward outputs
 *   are written (=). Optional outputs and inputs documented "or NULL" may be NULL.
 *
 * - Aliasing. Outputs never alias inputs unless the entry says so.
 *
 * - Determinism. On the CPU every op gives bit-identical results for the same inputs
 *   regardless of thread count (each output element is owned by one thread and reduced
 *   in a fixed order), which the parity tests rely on.
 */
#ifndef MP_KERNELS_OPS_H
#define MP_KERNELS_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Storage dtype of X tensors. */
typedef enum mp_kdtype {
  MP_KDTYPE_F32 = 0,
  MP_KDTYPE_BF16
} mp_kdtype;

/* Bytes per element of an X tensor stored as t. */
size_t mp_kdtype_bytes(mp_kdtype t);

/* Float8 formats (OCP FP8): E4M3 "fn" (no infinities, max 448, NaN = S.1111.111) and
 * E5M2 (IEEE-like, max 57344, has inf/NaN). Casts saturate to +-max, as torchao does. */
typedef enum mp_f8_format {
  MP_F8_E4M3 = 0,
  MP_F8_E5M2
} mp_f8_format;

/* matmul_f8 flags */
#define MP_F8_GEMM_ADD 1u        /* out_x += A B^T (else out_x = A B^T); out_f32 always += */
#define MP_F8_GEMM_FAST_ACCUM 2u /* the device's fast float8 accumulation may be used */

#define MP_F8_E4M3_MAX 448.0f
#define MP_F8_E5M2_MAX 57344.0f

/* Per-call execution context. One per thread of work (the CUDA backend: one per stream). */
typedef struct mp_kctx {
  mp_ctx *err; /* where a failing op leaves its message; never NULL */
  void *impl;  /* backend-private state (CUDA: stream, cuBLASLt handle, workspace);
                  NULL on the CPU */
  int device;  /* device ordinal (CPU: 0) */
} mp_kctx;

/* One (query chunk, key/value chunk) pair of span attention (the attention_span_* ops):
 * where each chunk lies in the tensors that hold it and at which global sequence positions.
 * Queries are rows [q_row, q_row + Tq) of every batch of the tensors shaped (B, Sq, nh, hd)
 * (q, dq, dout, the running output acc) and (B, nh, Sq) (lse, D), at positions
 * [q_pos, q_pos + Tq); keys and values are rows [kv_row, kv_row + Tk) of the (B, Sk, nkv,
 * hd) tensors (k, v, dk, dv), at positions [kv_pos, kv_pos + Tk). A rank's local sequence
 * that holds several chunks (context parallelism's load-balanced layout keeps chunks r and
 * 2cp-1-r of 2cp on rank r) is so addressed in place: the same tensors, other rows.
 * Valid: B >= 0, nh, nkv, hd > 0, nkv dividing nh, Tq, Tk >= 0, rows inside their tensors
 * (0 <= q_row, q_row + Tq <= Sq; likewise kv), positions >= 0. */
typedef struct mp_attn_span {
  int B, nh, nkv, hd;
  int Sq, q_row, Tq, q_pos;
  int Sk, kv_row, Tk, kv_pos;
} mp_attn_span;

typedef struct mp_backend mp_backend;

struct mp_backend {
  const char *name;   /* "cpu", "cuda" */
  mp_kdtype x_dtype;  /* storage dtype of X tensors */

  /* ---- lifecycle and memory ------------------------------------------------------ */
  /* Sets kc->impl for `device`; kc->err must be set by the caller. */
  mp_status (*init)(mp_kctx *kc, int device);
  void (*shutdown)(mp_kctx *kc); /* safe on an initialised or zeroed kc */
  /* Device allocation; *ptr is aligned to 64 bytes. bytes == 0 gives *ptr == NULL. */
  mp_status (*alloc)(mp_kctx *kc, void **ptr, size_t bytes);
  void (*free)(mp_kctx *kc, void *ptr); /* free(NULL) is a no-op */
  mp_status (*memcpy_h2d)(mp_kctx *kc, void *dst_dev, const void *src_host, size_t bytes);
  mp_status (*memcpy_d2h)(mp_kctx *kc, void *dst_host, const void *src_dev, size_t bytes);
  mp_status (*memcpy_d2d)(mp_kctx *kc, void *dst_dev, const void *src_dev, size_t bytes);
  mp_status (*memset_zero)(mp_kctx *kc, void *ptr, size_t bytes);
  /* Waits for all work queued on kc (CPU: returns at once; ops are synchronous). */
  mp_status (*synchronize)(mp_kctx *kc);
  /* Host fp32 <-> device X tensor of n elements (rounds to nearest even into bf16). */
  mp_status (*to_device_f32)(mp_kctx *kc, void *dst_x, const float *src_host, size_t n);
  mp_status (*from_device_f32)(mp_kctx *kc, float *dst_host, const void *src_x, size_t n);
  /* Device X <-> device fp32 (e.g. compute copy of an fp32 master parameter). */
  mp_status (*x_from_f32)(mp_kctx *kc, void *dst_x, const float *src, size_t n);
  mp_status (*x_to_f32)(mp_kctx *kc, float *dst, const void *src_x, size_t n);

  /* ---- embedding (token lookup; also positions for learned position embeddings) ---- *
   * The table holds rows [vocab_start, vocab_end) of the global vocabulary (the whole
   * table: 0 and V). A token outside the range gives a zero row, so the vocab-parallel
   * result is the sum (all-reduce) over shards. Backward scatter-adds into the local
   * shard only; tokens outside the range contribute nothing. */
  mp_status (*embedding_forward)(mp_kctx *kc,
                                 void *out,              /* (N, C) */
                                 const int32_t *tokens,  /* (N) global ids */
                                 const void *wte,        /* (vocab_end-vocab_start, C) */
                                 int N, int C, int vocab_start, int vocab_end);
  mp_status (*embedding_backward)(mp_kctx *kc,
                                  float *dwte,            /* (vocab_end-vocab_start, C) += */
                                  const void *dout,       /* (N, C) */
                                  const int32_t *tokens,  /* (N) */
                                  int N, int C, int vocab_start, int vocab_end);

  /* ---- normalisation ---------------------------------------------------------------
   * LayerNorm: out = (x - mean) * rstd * w + b, rstd = 1/sqrt(var + eps), var biased.
   * RMSNorm:   out = x * rstd * w, rstd = 1/sqrt(mean(x^2) + eps). */
  mp_status (*layernorm_forward)(mp_kctx *kc,
                                 void *out,        /* (N, C) */
                                 float *mean,      /* (N) saved for backward */
                                 float *rstd,      /* (N) saved for backward */
                                 const void *x,    /* (N, C) */
                                 const void *w,    /* (C) */
                                 const void *b,    /* (C) or NULL */
                                 int N, int C, float eps);
  mp_status (*layernorm_backward)(mp_kctx *kc,
                                  void *dx,          /* (N, C) += */
                                  float *dw,         /* (C) += */
                                  float *db,         /* (C) += or NULL */
                                  const void *dout,  /* (N, C) */
                                  const void *x,     /* (N, C) */
                                  const void *w,     /* (C) */
                                  const float *mean, /* (N) */
                                  const float *rstd, /* (N) */
                                  int N, int C);
  mp_status (*rmsnorm_forward)(mp_kctx *kc,
                               void *out,      /* (N, C) */
                               float *rstd,    /* (N) saved for backward */
                               const void *x,  /* (N, C) */
                               const void *w,  /* (C) */
                               int N, int C, float eps);
  mp_status (*rmsnorm_backward)(mp_kctx *kc,
                                void *dx,          /* (N, C) += */
                                float *dw,         /* (C) += */
                                const void *dout,  /* (N, C) */
                                const void *x,     /* (N, C) */
                                const void *w,     /* (C) */
                                const float *rstd, /* (N) */
                                int N, int C);

  /* ---- RoPE, HF Llama "rotate_half" convention ------------------------------------
   * Within each head, dimension i < hd/2 pairs with i + hd/2 (not 2i with 2i+1):
   *   out[i]        = x[i] cos[t,i] - x[i+hd/2] sin[t,i]
   *   out[i+hd/2]   = x[i+hd/2] cos[t,i] + x[i] sin[t,i]
   * with cos/sin tables from mp_rope_tables. out may equal x (in place) in forward.
   * Backward applies the inverse rotation (angle -theta) to dout. */
  mp_status (*rope_forward)(mp_kctx *kc,
                            void *out,          /* (B, T, nh, hd) */
                            const void *x,      /* (B, T, nh, hd) */
                            const float *cos_t, /* (T, hd/2) */
                            const float *sin_t, /* (T, hd/2) */
                            int B, int T, int nh, int hd);
  mp_status (*rope_backward)(mp_kctx *kc,
                             void *dx,           /* (B, T, nh, hd) += */
                             const void *dout,   /* (B, T, nh, hd) */
                             const float *cos_t, /* (T, hd/2) */
                             const float *sin_t, /* (T, hd/2) */
                             int B, int T, int nh, int hd);

  /* ---- causal attention with grouped-query heads -------------------------------------
   * Query head h reads key/value head h / (nh/nkv). q and k have hd features per head, v
   * and out hv (hv == hd but under multi-head latent attention: DeepSeek-V2's v_head_dim
   * beside qk_nope + qk_rope). Scale 1/sqrt(hd); position t attends to positions <= t. Forward saves only lse (the log-sum-exp of each scaled score row),
   * flash-attention style: backward recomputes the probabilities from q, k and lse, so
   * no (T, T) matrix is ever stored. */
  mp_status (*attention_forward)(mp_kctx *kc,
                                 void *out,       /* (B, T, nh, hv) */
                                 float *lse,      /* (B, nh, T) saved for backward */
                                 const void *q,   /* (B, T, nh, hd) */
                                 const void *k,   /* (B, T, nkv, hd) */
                                 const void *v,   /* (B, T, nkv, hv) */
                                 int B, int T, int nh, int nkv, int hd, int hv);
  mp_status (*attention_backward)(mp_kctx *kc,
                                  void *dq,          /* (B, T, nh, hd) += */
                                  void *dk,          /* (B, T, nkv, hd) += */
                                  void *dv,          /* (B, T, nkv, hv) += */
                                  const void *dout,  /* (B, T, nh, hv) */
                                  const void *q,     /* (B, T, nh, hd) */
                                  const void *k,     /* (B, T, nkv, hd) */
                                  const void *v,     /* (B, T, nkv, hv) */
                                  const void *out,   /* (B, T, nh, hv) forward output */
                                  const float *lse,  /* (B, nh, T) */
                                  int B, int T, int nh, int nkv, int hd, int hv);

  /* ---- attention over a span of keys: the pieces of ring (context-parallel) attention ---
   * Key j of the kv chunk is visible from query i of the q chunk iff kv_pos + j <= q_pos + i
   * (causal by global position); heads and scale as attention_forward. A query's attention
   * over every key is assembled one kv chunk at a time in a running state per (batch, head,
   * query): acc, the softmax-weighted mean of the values of the keys merged so far, and
   * lse, the log-sum-exp of their scaled scores. lse = -inf is the empty state (no key yet;
   * acc is then not read). Every entry returns at once when Tq or Tk is 0.
   *   span_init      lse = -inf: the state before the first pair.
   *   span_forward   merges one pair into the state of the q chunk's rows. With o and l the
   *                  pair's own softmax mean and log-sum-exp over its visible keys,
   *                  lse' = log(e^lse + e^l), acc' = acc e^(lse - lse') + o e^(l - lse')
   *                  (the online-softmax merge; PyTorch's ring attention, _merge_sdpa). A
   *                  row that sees no key of the pair keeps its state bit for bit, and a
   *                  pair whose keys all lie after its last query returns at once, so a
   *                  rank may run every pair of the ring in any order.
   *   span_finalize  out = acc in X, 0 on a row still empty. lse is then the final lse: the
   *                  one attention_forward saves and every pair's backward takes.
   *   span_dot       D = rowsum(dout * out) per (batch, head, query) of a whole tensor: once
   *                  per backward, before the pairs (FlashAttention-2's D; each pair reads it).
   *   span_backward  one pair's gradients from the FINAL lse and D: p = exp(s - lse),
   *                  ds = p (<dout, v> - D); dq of the q chunk's rows and dk, dv of the kv
   *                  chunk's rows accumulate (+=) the pair's terms, so dk and dv may travel
   *                  the ring with k and v and collect every q chunk's share. Rows whose
   *                  lse is -inf contribute nothing.
   * One chunk at position 0 (q_row = kv_row = q_pos = kv_pos = 0, Tq = Tk = Sq = Sk = T)
   * computes what attention_forward does (span_init, span_forward, span_finalize) and what
   * attention_backward does (span_dot, span_backward). Memory: acc is fp32 whatever the X dtype, so a rank's state
   * is 4 bytes per element of its queries, beside out. */
  mp_status (*attention_span_init)(mp_kctx *kc, float *lse /* (n) */, size_t n);
  mp_status (*attention_span_forward)(mp_kctx *kc,
                                      float *acc,     /* (B, Sq, nh, hd) merged into */
                                      float *lse,     /* (B, nh, Sq) merged into */
                                      const void *q,  /* (B, Sq, nh, hd) */
                                      const void *k,  /* (B, Sk, nkv, hd) */
                                      const void *v,  /* (B, Sk, nkv, hd) */
                                      const mp_attn_span *sp);
  mp_status (*attention_span_finalize)(mp_kctx *kc,
                                       void *out,        /* (B, S, nh, hd) */
                                       const float *acc, /* (B, S, nh, hd) */
                                       const float *lse, /* (B, nh, S) */
                                       int B, int S, int nh, int hd);
  mp_status (*attention_span_dot)(mp_kctx *kc,
                                  float *D,          /* (B, nh, S) */
                                  const void *dout,  /* (B, S, nh, hd) */
                                  const void *out,   /* (B, S, nh, hd) */
                                  int B, int S, int nh, int hd);
  mp_status (*attention_span_backward)(mp_kctx *kc,
                                       void *dq,          /* (B, Sq, nh, hd) += */
                                       void *dk,          /* (B, Sk, nkv, hd) += */
                                       void *dv,          /* (B, Sk, nkv, hd) += */
                                       const void *dout,  /* (B, Sq, nh, hd) */
                                       const void *q,     /* (B, Sq, nh, hd) */
                                       const void *k,     /* (B, Sk, nkv, hd) */
                                       const void *v,     /* (B, Sk, nkv, hd) */
                                       const float *lse,  /* (B, nh, Sq) final */
                                       const float *D,    /* (B, nh, Sq) span_dot */
                                       const mp_attn_span *sp);

  /* ---- activations -------------------------------------------------------------------
   * GELU, tanh approximation (GPT-2, PyTorch approximate="tanh"):
   *   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
   * SwiGLU: out = silu(gate) * up, silu(g) = g / (1 + exp(-g)). */
  mp_status (*gelu_forward)(mp_kctx *kc, void *out, const void *x, size_t n); /* (n) */
  mp_status (*gelu_backward)(mp_kctx *kc,
                             void *dx,         /* (n) += */
                             const void *dout, /* (n) */
                             const void *x,    /* (n) */
                             size_t n);
  mp_status (*swiglu_forward)(mp_kctx *kc,
                              void *out,        /* (N, H) */
                              const void *gate, /* (N, H) */
                              const void *up,   /* (N, H) */
                              size_t n);        /* N*H */
  mp_status (*swiglu_backward)(mp_kctx *kc,
                               void *dgate,      /* (N, H) += */
                               void *dup,        /* (N, H) += */
                               const void *dout, /* (N, H) */
                               const void *gate, /* (N, H) */
                               const void *up,   /* (N, H) */
                               size_t n);

  /* ---- Linear: out = inp W^T + bias (PyTorch nn.Linear weight layout (M, K)) --------
   * Backward: dinp += dout W; dweight += dout^T inp; dbias += column sums of dout. Any of
   * dinp, dweight, dbias may be NULL (not needed: frozen weight, first layer). */
  mp_status (*matmul_forward)(mp_kctx *kc,
                              void *out,          /* (N, M) */
                              const void *inp,    /* (N, K) */
                              const void *weight, /* (M, K) */
                              const void *bias,   /* (M) or NULL */
                              int N, int K, int M);
  mp_status (*matmul_backward)(mp_kctx *kc,
                               void *dinp,         /* (N, K) += or NULL */
                               float *dweight,     /* (M, K) += or NULL */
                               float *dbias,       /* (M) += or NULL */
                               const void *dout,   /* (N, M) */
                               const void *inp,    /* (N, K) */
                               const void *weight, /* (M, K) */
                               int N, int K, int M);

  /* ---- MoE router ---------------------------------------------------------------------
   * probs = softmax(logits) over experts; the k largest (ties: lower expert index first)
   * give topk_idx in descending probability order and topk_w = their probabilities,
   * divided by their sum when norm_topk_prob (Qwen-MoE/Mixtral option). Backward takes
   * the gradient of topk_w and, optionally, of probs (from the auxiliary loss). */
  mp_status (*router_forward)(mp_kctx *kc,
                              float *probs,        /* (N, E) saved for backward */
                              int32_t *topk_idx,   /* (N, k) */
                              float *topk_w,       /* (N, k) */
                              const void *logits,  /* (N, E) */
                              int N, int E, int k, int norm_topk_prob);
  mp_status (*router_backward)(mp_kctx *kc,
                               void *dlogits,          /* (N, E) += */
                               const float *dtopk_w,   /* (N, k) */
                               const float *dprobs,    /* (N, E) or NULL */
                               const float *probs,     /* (N, E) */
                               const int32_t *topk_idx, /* (N, k) */
                               int N, int E, int k, int norm_topk_prob);
  /* Load-balancing loss (Switch Transformer; Mixtral/HF convention for k > 1):
   *   aux = E * sum_e f_e * P_e,  f_e = (tokens whose top-k holds e) / N,
   *                               P_e = mean over tokens of probs[:, e].
   * f is piecewise constant (no gradient); the coefficient is the caller's (it scales
   * dloss). Backward: dprobs[n, e] += dloss * E * f_e / N. */
  mp_status (*router_aux_loss_forward)(mp_kctx *kc,
                                       float *aux,              /* (1) */
                                       float *f,                /* (E) saved for backward */
                                       const float *probs,      /* (N, E) */
                                       const int32_t *topk_idx, /* (N, k) */
                                       int N, int E, int k);
  mp_status (*router_aux_loss_backward)(mp_kctx *kc,
                                        float *dprobs,   /* (N, E) += */
                                        const float *f,  /* (E) */
                                        float dloss, int N, int E);

  /* ---- token permute / unpermute (group tokens by expert) ----------------------------
   * moe_plan orders the N*k (token, slot) pairs by expert, stably (token order within an
   * expert): row r of the permuted layout holds pair perm[r] = n*k + j; inv is its
   * inverse (inv[n*k + j] = r); counts[e] rows go to expert e, experts in order, so the
   * rows of experts [e0, e1) are contiguous (what EP's all-to-all sends). An expert
   * index of -1 marks a dropped pair (over its expert's capacity): it takes no row (inv
   * -1; counts sum to the placed pairs; perm -1 on the rows after them, which
   * permute_forward zeroes) and permute/unpermute skip it in both directions. The CPU
   * backend implements dropped pairs; exec/runtime/check.c refuses the capacity factor on
   * the others. */
  mp_status (*moe_plan)(mp_kctx *kc,
                        int32_t *perm,           /* (N*k) */
                        int32_t *inv,            /* (N*k) */
                        int32_t *counts,         /* (E) */
                        const int32_t *topk_idx, /* (N, k) */
                        int N, int E, int k);
  /* out[r] = x[perm[r] / k]. */
  mp_status (*permute_forward)(mp_kctx *kc,
                               void *out,           /* (N*k, C) */
                               const void *x,       /* (N, C) */
                               const int32_t *perm, /* (N*k) */
                               int N, int k, int C);
  /* dx[n] += sum_j dout[inv[n*k + j]]. */
  mp_status (*permute_backward)(mp_kctx *kc,
                                void *dx,           /* (N, C) += */
                                const void *dout,   /* (N*k, C) */
                                const int32_t *inv, /* (N*k) */
                                int N, int k, int C);
  /* out[n] = sum_j topk_w[n, j] * y[inv[n*k + j]] (combine expert outputs). */
  mp_status (*unpermute_forward)(mp_kctx *kc,
                                 void *out,            /* (N, C) */
                                 const void *y,        /* (N*k, C) expert outputs */
                                 const float *topk_w,  /* (N, k) */
                                 const int32_t *inv,   /* (N*k) */
                                 int N, int k, int C);
  /* dy[inv[n*k+j]] += w[n,j] dout[n];  dtopk_w[n,j] += <dout[n], y[inv[n*k+j]]>. */
  mp_status (*unpermute_backward)(mp_kctx *kc,
                                  void *dy,             /* (N*k, C) += */
                                  float *dtopk_w,       /* (N, k) += */
                                  const void *dout,     /* (N, C) */
                                  const void *y,        /* (N*k, C) */
                                  const float *topk_w,  /* (N, k) */
                                  const int32_t *inv,   /* (N*k) */
                                  int N, int k, int C);

  /* ---- cross-entropy -------------------------------------------------------------------
   * Whole vocabulary: losses[n] = lse_n - logits[n, t_n]; loss_mean = mean over rows with
   * t_n >= 0 (a negative target is ignored, as PyTorch's ignore_index; loss 0 there).
   * Backward: dlogits[n] += dloss * (softmax(logits[n]) - onehot(t_n)) for t_n >= 0; for a
   * mean over n_valid rows the caller passes dloss = upstream / n_valid (global count
   * when data-parallel). */
  mp_status (*cross_entropy_forward)(mp_kctx *kc,
                                     float *losses,          /* (N) */
                                     float *loss_mean,       /* (1) */
                                     float *lse,             /* (N) saved for backward */
                                     const void *logits,     /* (N, V) */
                                     const int32_t *targets, /* (N) */
                                     int N, int V);
  /* Vocab-parallel pieces (shard holds vocabulary [vocab_start, vocab_start + Vl)); the
   * runtime glues them: gmax = allreduce_max(local_max); gsum = allreduce_sum(
   * local_sumexp(gmax)); tgt = allreduce_sum(local_target); then ce_vp_combine gives
   * losses and lse; ce_backward with the global lse gives each shard's dlogits. With
   * one shard (vocab_start 0, Vl = V) this is exactly the whole-vocabulary op. */
  mp_status (*ce_local_max)(mp_kctx *kc,
                            float *lmax,        /* (N) */
                            const void *logits, /* (N, Vl) */
                            int N, int Vl);
  mp_status (*ce_local_sumexp)(mp_kctx *kc,
                               float *lsum,        /* (N) sum_v exp(logit - gmax) */
                               const void *logits, /* (N, Vl) */
                               const float *gmax,  /* (N) */
                               int N, int Vl);
  mp_status (*ce_local_target)(mp_kctx *kc,
                               float *ltgt,            /* (N) logit of target, 0 if not here */
                               const void *logits,     /* (N, Vl) */
                               const int32_t *targets, /* (N) global ids */
                               int N, int Vl, int vocab_start);
  mp_status (*ce_vp_combine)(mp_kctx *kc,
                             float *losses,          /* (N) */
                             float *loss_mean,       /* (1) over this rank's valid rows */
                             float *lse,             /* (N) */
                             const float *gmax,      /* (N) */
                             const float *gsum,      /* (N) */
                             const float *gtgt,      /* (N) */
                             const int32_t *targets, /* (N) */
                             int N);
  mp_status (*ce_backward)(mp_kctx *kc,
                           void *dlogits,          /* (N, Vl) += */
                           const void *logits,     /* (N, Vl) */
                           const float *lse,       /* (N) global */
                           const int32_t *targets, /* (N) global ids */
                           float dloss, int N, int Vl, int vocab_start);

  /* ---- optimizer and gradient norm (fp32 master state) --------------------------------
   * AdamW (PyTorch torch.optim.AdamW): g = grad * grad_scale (grad_scale carries the
   * clip factor, 1 when not clipping); p -= lr * wd * p (decoupled decay);
   * m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2;
   * p -= lr * (m / (1 - b1^step)) / (sqrt(v / (1 - b2^step)) + eps); step >= 1. */
  mp_status (*adamw_update)(mp_kctx *kc,
                            float *param,      /* (n) */
                            const float *grad, /* (n) */
                            float *m,          /* (n) */
                            float *v,          /* (n) */
                            size_t n, float lr, float beta1, float beta2, float eps,
                            float weight_decay, int step, float grad_scale);
  /* *sumsq += sum x^2 (accumulated in double inside, deterministic order). The global
   * norm is sqrt(allreduce_sum over every shard and group); mp_clip_scale gives the
   * factor; scale_f32 applies it in place (or pass it to adamw_update as grad_scale). */
  mp_status (*sum_squares)(mp_kctx *kc, float *sumsq /* (1) += */, const float *x,
                           size_t n);
  mp_status (*scale_f32)(mp_kctx *kc, float *x /* (n) */, size_t n, float s);

  /* ---- residual -------------------------------------------------------------------- *
   * Forward out = a + b. Backward: the same dout reaches both branches, so it is two
   * calls of accumulate (y += x). */
  mp_status (*residual_forward)(mp_kctx *kc, void *out, const void *a, const void *b,
                                size_t n);
  mp_status (*accumulate)(mp_kctx *kc, void *y /* (n) += */, const void *x, size_t n);
  mp_status (*accumulate_f32)(mp_kctx *kc, float *y /* (n) += */, const float *x,
                              size_t n);
  /* A block of rows x cols X elements between strided tensors (cudaMemcpy2D's shape, in
   * elements): dst[r ld_dst + c] = src[r ld_src + c], or += when add. Multi-head latent
   * attention assembles its heads with it (the nope and rope parts of q and k, v out of
   * kv_b_proj's output) and takes them apart in backward. ld_dst, ld_src >= cols. */
  mp_status (*copy2d)(mp_kctx *kc, void *dst, size_t ld_dst, const void *src, size_t ld_src,
                      size_t rows, size_t cols, int add);

  /* ---- float8 (tensorwise scaling, torchao "dynamic" recipe) --------------------------
   * amax = max |x|; scale = fp8_max / max(amax, 1e-12) (fp32); code = cast(x * scale)
   * rounding to nearest even and saturating at +-fp8_max; dequantised value =
   * decode(code) / scale. fake_quantize = dequantize(quantize(x)) in one pass: the CPU
   * runtime's faithful emulation of a float8 Linear (E4M3 for inputs and weights in
   * forward, E5M2 for output gradients in backward) feeds fake-quantised operands to
   * matmul; a CUDA backend instead runs cuBLASLt on the codes. Scales live on the device
   * so the CUDA path needs no host round trip. NaN maps to the format's NaN. */
  mp_status (*f8_amax)(mp_kctx *kc, float *amax /* (1) */, const void *x, size_t n);
  mp_status (*f8_scale_from_amax)(mp_kctx *kc, float *scale /* (1) */,
                                  const float *amax /* (1) */, mp_f8_format fmt);
  mp_status (*f8_quantize)(mp_kctx *kc, uint8_t *codes /* (n) */, const void *x,
                           const float *scale /* (1) */, size_t n, mp_f8_format fmt);
  mp_status (*f8_dequantize)(mp_kctx *kc, void *x /* (n) */, const uint8_t *codes,
                             const float *scale /* (1) */, size_t n, mp_f8_format fmt);
  mp_status (*f8_fake_quantize)(mp_kctx *kc, void *out /* (n) */, const void *x,
                                const float *scale /* (1) */, size_t n, mp_f8_format fmt);
  /* Float8 GEMM on codes, "TN" as cuBLASLt wants it: out = (A / a_scale) (B / b_scale)^T
   * with A (R, K) codes in fmt_a and B (S, K) codes in fmt_b, row-major, fp32
   * accumulation. Exactly one output is non-NULL: out_x (R, S) X tensor, written (=), or
   * out_f32 (R, S) fp32, accumulated (+=, for weight gradients). Forward y = x W^T is
   * A = x (E4M3), B = W (E4M3); dgrad dx = dy W is A = dy (E5M2), B = W^T (E4M3, via
   * f8_transpose); wgrad dW = dy^T x is A = dy^T (E5M2), B = x^T (E4M3). The CUDA backend
   * needs K, R and S multiples of 16 and compute capability >= 8.9 (it refuses otherwise
   * with MP_ERR_UNSUPPORTED); the CPU backend decodes and multiplies (the reference).
   * flags: MP_F8_GEMM_ADD accumulates into out_x (+=, the dgrad contract: one pass over
   * the output instead of a temporary and an accumulate); MP_F8_GEMM_FAST_ACCUM allows
   * the device's fast float8 accumulation (Hopper's tensor cores then skip the periodic
   * promotion of partial sums to fp32: torchao's default for the forward GEMM only, whose
   * K is a layer width; never for weight gradients, whose K is the token count). The CPU
   * reference accumulates in fp32 either way. */
  mp_status (*matmul_f8)(mp_kctx *kc, void *out_x, float *out_f32,
                         const uint8_t *a, const float *a_scale, mp_f8_format fmt_a,
                         const uint8_t *b, const float *b_scale, mp_f8_format fmt_b,
                         int R, int K, int S, unsigned flags /* MP_F8_GEMM_* */);
  /* Fused amax (optional: NULL where a backend has none; the runtime then calls f8_amax
   * after the plain op). Each does exactly what its plain op does and also writes the
   * amax (max |v|, written, not max-accumulated) of each output as stored, i.e. after
   * rounding to X and, for swiglu_backward, after the += update: bit for bit what f8_amax
   * of that output would return. A float8 Linear's dynamic scale then costs no extra read
   * of its input (RMSNorm feeds q/k/v and gate/up, SwiGLU feeds down) or of its output
   * gradient (SwiGLU's backward feeds gate's and up's). NaN in an output gives a NaN
   * amax, as f8_amax does. */
  mp_status (*rmsnorm_forward_amax)(mp_kctx *kc, void *out /* (N, C) */, float *rstd /* (N) */,
                                    const void *x /* (N, C) */, const void *w /* (C) */,
                                    int N, int C, float eps, float *amax /* (1) */);
  mp_status (*swiglu_forward_amax)(mp_kctx *kc, void *out /* (n) */, const void *gate,
                                   const void *up, size_t n, float *amax /* (1) */);
  mp_status (*swiglu_backward_amax)(mp_kctx *kc, void *dgate /* (n) += */, void *dup /* (n) += */,
                                    const void *dout, const void *gate, const void *up, size_t n,
                                    float *amax_dgate /* (1) */, float *amax_dup /* (1) */);
  /* out (C, R) = in (R, C) transposed, float8 codes. */
  mp_status (*f8_transpose)(mp_kctx *kc, uint8_t *out, const uint8_t *in, int R, int C);
  /* f8_quantize and f8_transpose in one pass over x: codes (R, C) = f8_quantize(x) and
   * codes_t (C, R) = its transpose, bit for bit what the two ops give. The float8 backward
   * GEMMs need dy and x in both orientations (matmul_f8 wants both operands
   * K-contiguous); this reads the X tensor once for both. Either output may be NULL (not
   * both), and they must not overlap. */
  mp_status (*f8_quantize_t)(mp_kctx *kc, uint8_t *codes /* (R, C) or NULL */,
                             uint8_t *codes_t /* (C, R) or NULL */, const void *x /* (R, C) X */,
                             const float *scale /* (1) */, int R, int C, mp_f8_format fmt);
};

/* ---- host utilities (plain C, no device; implemented with the CPU backend) ---------- */

/* RoPE tables for positions pos0 .. pos0+T-1: angle = pos * theta^(-2i/hd), i < hd/2
 * (HF Llama's inv_freq). hd must be even. cos_t, sin_t: (T, hd/2). */
void mp_rope_tables(float *cos_t, float *sin_t, int T, int hd, float theta, int pos0);

/* Float8 scalar cast: nearest-even, saturating to +-max; NaN -> NaN code. */
uint8_t mp_f8_encode(float x, mp_f8_format fmt);
float mp_f8_decode(uint8_t code, mp_f8_format fmt);
float mp_f8_max(mp_f8_format fmt);

/* bf16 as the upper 16 bits of fp32, rounded to nearest even (NaN stays NaN). */
uint16_t mp_bf16_from_f32(float x);
float mp_bf16_to_f32(uint16_t h);

/* PyTorch clip_grad_norm_: min(1, max_norm / (norm + 1e-6)). */
float mp_clip_scale(float global_norm, float max_norm);

#ifdef __cplusplus
}
#endif
#endif
