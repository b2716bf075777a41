/* C-callable pieces of the CUDA GEMM code (matmul.cu) that are not in cuda_internal.h,
 * which is C++ and private to the .cu files: mp_cuda_matmul_f8 / mp_cuda_f8_transpose, the
 * ops.h entries of the same names (backend.cu includes this header to fill them in; the
 * GPU test checks the table holds them).
 * Without a CUDA build (MP_HAVE_CUDA undefined) nothing here is defined. */
#ifndef MP_KERNELS_CUDA_GEMM_H
#define MP_KERNELS_CUDA_GEMM_H

#include "common/status.h"
#include "kernels/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ops.h matmul_f8 on cuBLASLt float8 tensor cores ("TN": both operands K-contiguous, as
 * ops.h lays them out). flags: MP_F8_GEMM_ADD makes out_x an in-place update (bf16 C = D,
 * beta 1: out_x = bf16(out_x + A B^T), rounded once); MP_F8_GEMM_FAST_ACCUM sets cuBLASLt's
 * CUBLASLT_MATMUL_DESC_FAST_ACCUM (no periodic promotion of the tensor-core partial sums;
 * the algorithm cache keeps the two modes apart). Any other flag bit is refused with
 * MP_ERR_INVALID, on every device. Refuses with MP_ERR_UNSUPPORTED on compute capability <
 * 8.9, on R, K or S not multiples of 16, on operands not 16-byte aligned, on E5M2 x E5M2
 * (no cuBLASLt kernel), and when cuBLASLt runs neither the direct form (bf16 D written or
 * updated in place, or fp32 D updated in place) nor its fallback (fp32 D into scratch,
 * without fast accumulation, then one pass that rounds it into out_x, adds it to out_x
 * rounding once, or adds it to out_f32). */
mp_status mp_cuda_matmul_f8(mp_kctx *kc, void *out_x, float *out_f32, const uint8_t *a,
                            const float *a_scale, mp_f8_format fmt_a, const uint8_t *b,
                            const float *b_scale, mp_f8_format fmt_b, int R, int K, int S,
                            unsigned flags);
/* ops.h f8_transpose: out (C, R) = in (R, C), bytes. */
mp_status mp_cuda_f8_transpose(mp_kctx *kc, uint8_t *out, const uint8_t *in, int R, int C);

#ifdef __cplusplus
}
#endif
#endif
