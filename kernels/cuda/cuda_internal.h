/* Shared internals of the CUDA backend (kernels/cuda/): the per-context state behind
 * mp_kctx.impl, the checking macros, and the declarations of the ops each .cu file
 * provides to the backend table in backend.cu.
 *
 * Invariants:
 * - Every CUDA runtime / cuBLASLt call goes through MP_CUDA_CHECK (cuda_check.h) /
 *   MP_CUBLAS_CHECK and every kernel launch is followed by MP_CUDA_LAUNCH_CHECK: a failure
 *   becomes an mp_status with the statement, the device ordinal and CUDA's message on
 *   kc->err.
 * - All work of one mp_kctx is queued on impl->stream; ops are asynchronous with respect
 *   to the host, synchronize waits for them.
 * - X tensors are bf16 (__nv_bfloat16) in device memory; every kernel accumulates in fp32.
 * - Every op of the table is mp_cuda_<op> with C linkage, declared here from the table's
 *   own entry type (kernels/op_impl.h); the .cu file of its family defines it.
 * This header is C++ (included by .cu files only); the C side sees kernels/cuda/cuda.h. */
#ifndef MP_KERNELS_CUDA_INTERNAL_H
#define MP_KERNELS_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/status.h"
#include "kernels/cuda/attention_hooks.h"
#include "kernels/cuda/cuda_check.h"
#include "kernels/op_impl.h"
#include "kernels/ops.h"

typedef struct mp_cuda_impl {
  int device;
  int cc_major, cc_minor;  /* compute capability: float8 GEMMs need >= 8.9 */
  int n_sms;
  cudaStream_t stream;
  cublasLtHandle_t lt;
  void *workspace;         /* cuBLASLt workspace (matmul.cu) */
  size_t workspace_bytes;
  void *gemm_cache;        /* matmul.cu's per-shape algorithm cache; owned by matmul.cu */
  float *scratch;          /* small device scratch (reductions); backend.cu owns it */
  size_t scratch_bytes;
} mp_cuda_impl;

static inline mp_cuda_impl *mp_cuda_impl_of(mp_kctx *kc) { return (mp_cuda_impl *)kc->impl; }

#define MP_CUDA_LAUNCH_CHECK(kc)                                                          \
  do {                                                                                    \
    cudaError_t mp_ce_ = cudaGetLastError();                                              \
    if (mp_ce_ != cudaSuccess)                                                            \
      return mp_error((kc)->err, MP_ERR_CUDA, "%s:%d: kernel launch failed on cuda "    \
                      "device %d: %s", __FILE__, __LINE__, (kc)->device,                  \
                      cudaGetErrorString(mp_ce_));                                        \
  } while (0)

#define MP_CUBLAS_CHECK(kc, stmt)                                                          \
  do {                                                                                     \
    cublasStatus_t mp_cs_ = (stmt);                                                        \
    if (mp_cs_ != CUBLAS_STATUS_SUCCESS)                                                   \
      return mp_error((kc)->err, MP_ERR_CUDA, "%s:%d: %s failed on cuda device %d: "     \
                      "cublas status %d (%s)", __FILE__, __LINE__, #stmt, (kc)->device,    \
                      (int)mp_cs_, cublasLtGetStatusString(mp_cs_));                       \
  } while (0)

/* ---- the ops of the table: mp_cuda_<op> for every op of MP_KERNEL_OPS, plus the
 * conversions between X and fp32 on the device (elementwise.cu) ---- */
extern "C" {
#define MP_CUDA_DECLARE(op) MP_KERNEL_DECLARE(mp_cuda_, op);
MP_KERNEL_OPS(MP_CUDA_DECLARE)
MP_CUDA_DECLARE(x_from_f32)
MP_CUDA_DECLARE(x_to_f32)
#undef MP_CUDA_DECLARE
}

/* Tensor-core (FlashAttention-2) attention for the head dims where supports() is 1
 * (attention_fa2.cu); attention.cu dispatches to it and keeps its scalar kernels for the
 * rest. The test and tuning hooks are in attention_hooks.h. */
int mp_cuda_attention_fa2_supports(int hd);
mp_status mp_cuda_attention_fa2_forward(mp_kctx *kc, void *out, float *lse, const void *q,
                                        const void *k, const void *v, int B, int T, int nh,
                                        int nkv, int hd);
mp_status mp_cuda_attention_fa2_backward(mp_kctx *kc, void *dq, void *dk, void *dv,
                                         const void *dout, const void *q, const void *k,
                                         const void *v, const void *out, const float *lse,
                                         int B, int T, int nh, int nkv, int hd);
/* The span ops on the tensor-core kernels (attention.cu checks the arguments, that the
 * pair is active and that supports(hd) holds with 16-byte aligned chunk rows); pointers
 * are the whole tensors, the chunks' rows found from sp. */
mp_status mp_cuda_attention_fa2_span_forward(mp_kctx *kc, float *acc, float *lse, const void *q,
                                             const void *k, const void *v,
                                             const mp_attn_span *sp);
mp_status mp_cuda_attention_fa2_span_backward(mp_kctx *kc, void *dq, void *dk, void *dv,
                                              const void *dout, const void *q, const void *k,
                                              const void *v, const float *lse, const float *D,
                                              const mp_attn_span *sp);
/* D (B, nh, S) = rowsum(dout * out) over (B, S, nh, hd) X tensors, any even hd, 4-byte
 * aligned (the tensor-core backward's dot kernel). */
mp_status mp_cuda_attention_dot(mp_kctx *kc, float *D, const void *dout, const void *out, int B,
                                int S, int nh, int hd);
/* cuBLASLt lifecycle: called from backend init/shutdown (creates lt, workspace, cache). */
mp_status mp_cuda_gemm_init(mp_kctx *kc);
void mp_cuda_gemm_shutdown(mp_kctx *kc);

#endif
