/* Shared internals of the CUDA backend (kernels/cuda/): the per-context state behind
 * mp_kctx.impl, the checking macros, and the entry points each .cu file provides to the
 * backend table in backend.cu.
 *
 * Invariants:
 * - Every CUDA runtime / cuBLASLt call goes through MP_CUDA_CHECK / MP_CUBLAS_CHECK and
 *   every kernel launch is followed by MP_CUDA_LAUNCH_CHECK: a failure becomes an
 *   mp_status with the statement, the device ordinal and CUDA's message on kc->err.
 * - All work of one mp_kctx is queued on impl->stream; ops are asynchronous with respect
 *   to the host, synchronize waits for them.
 * - X tensors are bf16 (__nv_bfloat16) in device memory; every kernel accumulates in fp32.
 * This header is C++ (included by .cu files only); the C side sees kernels/cuda/cuda.h. */
#ifndef MP_KERNELS_CUDA_INTERNAL_H
#define MP_KERNELS_CUDA_INTERNAL_H

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "common/status.h"
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

#define MP_CUDA_CHECK(kc, stmt)                                                             \
  do {                                                                                      \
    cudaError_t mp_ce_ = (stmt);                                                            \
    if (mp_ce_ != cudaSuccess)                                                              \
      return mp_error((kc)->err, MP_ERR_CUDA, "%s:%d: %s failed on cuda device %d: %s",   \
                      __FILE__, __LINE__, #stmt, (kc)->device, cudaGetErrorString(mp_ce_)); \
  } while (0)

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

/* ---- entry points provided by matmul.cu and attention.cu (helper "gemm/attention") ---- */
/* Same signatures and semantics as the ops.h table entries of the same name. */
mp_status mp_cuda_matmul_forward(mp_kctx *kc, void *out, const void *inp, const void *weight,
                                 const void *bias, int N, int K, int M);
mp_status mp_cuda_matmul_backward(mp_kctx *kc, void *dinp, float *dweight, float *dbias,
                                  const void *dout, const void *inp, const void *weight,
                                  int N, int K, int M);
mp_status mp_cuda_attention_forward(mp_kctx *kc, void *out, float *lse, const void *q,
                                    const void *k, const void *v, int B, int T, int nh, int nkv,
                                    int hd);
mp_status mp_cuda_attention_backward(mp_kctx *kc, void *dq, void *dk, void *dv, const void *dout,
                                     const void *q, const void *k, const void *v, const void *out,
                                     const float *lse, int B, int T, int nh, int nkv, int hd);
/* Tensor-core (FlashAttention-2) attention for the head dims where supports() is 1
 * (attention_fa2.cu); attention.cu dispatches to it and keeps its scalar kernels for the
 * rest. Test hook: force_scalar(1) routes attention through the scalar kernels, (0)
 * returns to the default (MP_ATTENTION_KERNEL=scalar in the environment, read once). */
int mp_cuda_attention_fa2_supports(int hd);
mp_status mp_cuda_attention_fa2_forward(mp_kctx *kc, void *out, float *lse, const void *q,
                                        const void *k, const void *v, int B, int T, int nh,
                                        int nkv, int hd);
mp_status mp_cuda_attention_fa2_backward(mp_kctx *kc, void *dq, void *dk, void *dv,
                                         const void *dout, const void *q, const void *k,
                                         const void *v, const void *out, const float *lse,
                                         int B, int T, int nh, int nkv, int hd);
void mp_cuda_attention_force_scalar(int on);
/* Tile configurations of the tensor-core attention kernels (attention_fa2.cu), for
 * tests/kernels_cuda/attention_test.cc and bench/attention_bench.c (C linkage: the bench
 * is C and declares these itself). Kernels: MP_FA2_FWD, MP_FA2_DKDV, MP_FA2_DQ have
 * n_configs(kernel) configurations each; the environment (MP_ATTENTION_FWD_CFG,
 * MP_ATTENTION_DKDV_CFG, MP_ATTENTION_DQ_CFG, read once) selects one for head dims 64 and
 * 128 (unset: the tuned default measured on an H100; 32 and 96 always run 0).
 * force_config(kernel, cfg) overrides the environment (cfg -1: back to it); config(kernel)
 * is the one in effect (-2: unset, the tuned default; -1: the environment names no
 * configuration, an error at the next call).
 * bwd_kernels(mask) makes attention_backward launch only the kernels whose bit
 * (1u << MP_FA2_DKDV, 1u << MP_FA2_DQ, 1u << MP_FA2_DOT for D = rowsum(dout * out)) is
 * set, 0 = all: leaving the dot kernel out reuses the D left in the context's scratch by
 * the previous backward, so it is for timing one kernel right after a full backward.
 * config_info describes configuration cfg at head dim 64 or 128 ("BM128 BN64 8w Qreg
 * 1st") and reports its registers, shared memory, local (spill) bytes and resident
 * blocks per SM on kc's device (0 where it does not fit). */
#ifdef __cplusplus
extern "C" {
#endif
enum { MP_FA2_FWD = 0, MP_FA2_DKDV = 1, MP_FA2_DQ = 2, MP_FA2_DOT = 3 };
int mp_cuda_attention_fa2_n_configs(int kernel);
int mp_cuda_attention_fa2_config(int kernel);
void mp_cuda_attention_fa2_force_config(int kernel, int cfg);
void mp_cuda_attention_fa2_bwd_kernels(unsigned mask);
mp_status mp_cuda_attention_fa2_config_info(mp_kctx *kc, int kernel, int cfg, int hd,
                                            char *desc, size_t desc_bytes, int *regs,
                                            int *smem_bytes, int *local_bytes,
                                            int *blocks_per_sm);
#ifdef __cplusplus
}
#endif
/* cuBLASLt lifecycle: called from backend init/shutdown (creates lt, workspace, cache). */
mp_status mp_cuda_gemm_init(mp_kctx *kc);
void mp_cuda_gemm_shutdown(mp_kctx *kc);

#endif
