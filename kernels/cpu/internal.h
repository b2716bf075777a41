/* Prototypes of the CPU kernels, one file per op (kernels/cpu/<op>.c), gathered into the
 * table in backend.c. Contracts are in kernels/ops.h; this header only lets the compiler
 * check each definition against the table's function-pointer types. Private to
 * kernels/cpu. */
#ifndef MP_KERNELS_CPU_INTERNAL_H
#define MP_KERNELS_CPU_INTERNAL_H

#include "kernels/ops.h"

mp_status mp_cpu_embedding_forward(mp_kctx *kc, void *out, const int32_t *tokens,
                                   const void *wte, int N, int C, int vs, int ve);
mp_status mp_cpu_embedding_backward(mp_kctx *kc, float *dwte, const void *dout,
                                    const int32_t *tokens, int N, int C, int vs, int ve);
mp_status mp_cpu_layernorm_forward(mp_kctx *kc, void *out, float *mean, float *rstd,
                                   const void *x, const void *w, const void *b, int N,
                                   int C, float eps);
mp_status mp_cpu_layernorm_backward(mp_kctx *kc, void *dx, float *dw, float *db,
                                    const void *dout, const void *x, const void *w,
                                    const float *mean, const float *rstd, int N, int C);
mp_status mp_cpu_rmsnorm_forward(mp_kctx *kc, void *out, float *rstd, const void *x,
                                 const void *w, int N, int C, float eps);
mp_status mp_cpu_rmsnorm_backward(mp_kctx *kc, void *dx, float *dw, const void *dout,
                                  const void *x, const void *w, const float *rstd, int N,
                                  int C);
mp_status mp_cpu_rope_forward(mp_kctx *kc, void *out, const void *x, const float *cos_t,
                              const float *sin_t, int B, int T, int nh, int hd);
mp_status mp_cpu_rope_backward(mp_kctx *kc, void *dx, const void *dout,
                               const float *cos_t, const float *sin_t, int B, int T,
                               int nh, int hd);
mp_status mp_cpu_attention_forward(mp_kctx *kc, void *out, float *lse, const void *q,
                                   const void *k, const void *v, int B, int T, int nh,
                                   int nkv, int hd);
mp_status mp_cpu_attention_backward(mp_kctx *kc, void *dq, void *dk, void *dv,
                                    const void *dout, const void *q, const void *k,
                                    const void *v, const void *out, const float *lse,
                                    int B, int T, int nh, int nkv, int hd);
mp_status mp_cpu_gelu_forward(mp_kctx *kc, void *out, const void *x, size_t n);
mp_status mp_cpu_gelu_backward(mp_kctx *kc, void *dx, const void *dout, const void *x,
                               size_t n);
mp_status mp_cpu_swiglu_forward(mp_kctx *kc, void *out, const void *gate, const void *up,
                                size_t n);
mp_status mp_cpu_swiglu_backward(mp_kctx *kc, void *dgate, void *dup, const void *dout,
                                 const void *gate, const void *up, size_t n);
mp_status mp_cpu_matmul_forward(mp_kctx *kc, void *out, const void *inp,
                                const void *weight, const void *bias, int N, int K, int M);
mp_status mp_cpu_matmul_backward(mp_kctx *kc, void *dinp, float *dweight, float *dbias,
                                 const void *dout, const void *inp, const void *weight,
                                 int N, int K, int M);
mp_status mp_cpu_router_forward(mp_kctx *kc, float *probs, int32_t *topk_idx,
                                float *topk_w, const void *logits, int N, int E, int k,
                                int norm_topk_prob);
mp_status mp_cpu_router_backward(mp_kctx *kc, void *dlogits, const float *dtopk_w,
                                 const float *dprobs, const float *probs,
                                 const int32_t *topk_idx, int N, int E, int k,
                                 int norm_topk_prob);
mp_status mp_cpu_router_aux_loss_forward(mp_kctx *kc, float *aux, float *f,
                                         const float *probs, const int32_t *topk_idx,
                                         int N, int E, int k);
mp_status mp_cpu_router_aux_loss_backward(mp_kctx *kc, float *dprobs, const float *f,
                                          float dloss, int N, int E);
mp_status mp_cpu_moe_plan(mp_kctx *kc, int32_t *perm, int32_t *inv, int32_t *counts,
                          const int32_t *topk_idx, int N, int E, int k);
mp_status mp_cpu_permute_forward(mp_kctx *kc, void *out, const void *x,
                                 const int32_t *perm, int N, int k, int C);
mp_status mp_cpu_permute_backward(mp_kctx *kc, void *dx, const void *dout,
                                  const int32_t *inv, int N, int k, int C);
mp_status mp_cpu_unpermute_forward(mp_kctx *kc, void *out, const void *y,
                                   const float *topk_w, const int32_t *inv, int N, int k,
                                   int C);
mp_status mp_cpu_unpermute_backward(mp_kctx *kc, void *dy, float *dtopk_w,
                                    const void *dout, const void *y, const float *topk_w,
                                    const int32_t *inv, int N, int k, int C);
mp_status mp_cpu_cross_entropy_forward(mp_kctx *kc, float *losses, float *loss_mean,
                                       float *lse, const void *logits,
                                       const int32_t *targets, int N, int V);
mp_status mp_cpu_ce_local_max(mp_kctx *kc, float *lmax, const void *logits, int N, int Vl);
mp_status mp_cpu_ce_local_sumexp(mp_kctx *kc, float *lsum, const void *logits,
                                 const float *gmax, int N, int Vl);
mp_status mp_cpu_ce_local_target(mp_kctx *kc, float *ltgt, const void *logits,
                                 const int32_t *targets, int N, int Vl, int vocab_start);
mp_status mp_cpu_ce_vp_combine(mp_kctx *kc, float *losses, float *loss_mean, float *lse,
                               const float *gmax, const float *gsum, const float *gtgt,
                               const int32_t *targets, int N);
mp_status mp_cpu_ce_backward(mp_kctx *kc, void *dlogits, const void *logits,
                             const float *lse, const int32_t *targets, float dloss, int N,
                             int Vl, int vocab_start);
mp_status mp_cpu_adamw_update(mp_kctx *kc, float *param, const float *grad, float *m,
                              float *v, size_t n, float lr, float beta1, float beta2,
                              float eps, float weight_decay, int step, float grad_scale);
mp_status mp_cpu_sum_squares(mp_kctx *kc, float *sumsq, const float *x, size_t n);
mp_status mp_cpu_scale_f32(mp_kctx *kc, float *x, size_t n, float s);
mp_status mp_cpu_residual_forward(mp_kctx *kc, void *out, const void *a, const void *b,
                                  size_t n);
mp_status mp_cpu_accumulate(mp_kctx *kc, void *y, const void *x, size_t n);
mp_status mp_cpu_accumulate_f32(mp_kctx *kc, float *y, const float *x, size_t n);
mp_status mp_cpu_rmsnorm_forward_amax(mp_kctx *kc, void *out, float *rstd, const void *x,
                                      const void *w, int N, int C, float eps, float *amax);
mp_status mp_cpu_swiglu_forward_amax(mp_kctx *kc, void *out, const void *gate, const void *up,
                                     size_t n, float *amax);
mp_status mp_cpu_swiglu_backward_amax(mp_kctx *kc, void *dgate, void *dup, const void *dout,
                                      const void *gate, const void *up, size_t n,
                                      float *amax_dgate, float *amax_dup);
mp_status mp_cpu_f8_amax(mp_kctx *kc, float *amax, const void *x, size_t n);
mp_status mp_cpu_f8_scale_from_amax(mp_kctx *kc, float *scale, const float *amax,
                                    mp_f8_format fmt);
mp_status mp_cpu_f8_quantize(mp_kctx *kc, uint8_t *codes, const void *x,
                             const float *scale, size_t n, mp_f8_format fmt);
mp_status mp_cpu_f8_dequantize(mp_kctx *kc, void *x, const uint8_t *codes,
                               const float *scale, size_t n, mp_f8_format fmt);
mp_status mp_cpu_f8_fake_quantize(mp_kctx *kc, void *out, const void *x,
                                  const float *scale, size_t n, mp_f8_format fmt);
mp_status mp_cpu_matmul_f8(mp_kctx *kc, void *out_x, float *out_f32, const uint8_t *a,
                           const float *a_scale, mp_f8_format fmt_a, const uint8_t *b,
                           const float *b_scale, mp_f8_format fmt_b, int R, int K, int S,
                           unsigned flags);
mp_status mp_cpu_f8_transpose(mp_kctx *kc, uint8_t *out, const uint8_t *in, int R, int C);
mp_status mp_cpu_f8_quantize_t(mp_kctx *kc, uint8_t *codes, uint8_t *codes_t, const void *x,
                               const float *scale, int R, int C, mp_f8_format fmt);

/* C(M x N) += op(A)(M x K) * op(B)(K x N); op(A)[i][p] = transA ? A[p*lda + i] :
 * A[i*lda + p], likewise B. Blocked and packed, OpenMP over output tiles. Returns
 * MP_ERR_NOMEM (with a message) if a pack buffer cannot be allocated. */
mp_status mp_cpu_sgemm(mp_kctx *kc, int transA, int transB, int M, int N, int K,
                       const float *A, int lda, const float *B, int ldb, float *C, int ldc);

/* Rejects negative sizes and NULL required pointers with a message naming the op. */
#define MP_CPU_REQUIRE(kc, cond, op)                                                   \
  do {                                                                                 \
    if (!(cond))                                                                       \
      return mp_error((kc)->err, MP_ERR_INVALID, "%s: invalid argument (%s); check "  \
                      "shapes and pointers", (op), #cond);                            \
  } while (0)

#endif
