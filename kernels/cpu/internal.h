/* The CPU kernels, one file per op (kernels/cpu/<op>.c), gathered into the table in
 * backend.c, and the blocked SGEMM they share. Each op mp_cpu_<op> is declared from the
 * table's own entry type (kernels/op_impl.h), so the compiler checks every definition
 * against kernels/ops.h, where the contracts are. Private to kernels/cpu. */
#ifndef MP_KERNELS_CPU_INTERNAL_H
#define MP_KERNELS_CPU_INTERNAL_H

#include "kernels/op_impl.h"
#include "kernels/ops.h"

#define MP_CPU_DECLARE(op) MP_KERNEL_DECLARE(mp_cpu_, op);
MP_KERNEL_OPS(MP_CPU_DECLARE)
#undef MP_CPU_DECLARE

/* C(M x N) += op(A)(M x K) * op(B)(K x N); op(A)[i][p] = transA ? A[p*lda + i] :
 * A[i*lda + p], likewise B. Blocked and packed, OpenMP over output tiles. Returns
 * MP_ERR_NOMEM (with a message) if a pack buffer cannot be allocated. */
mp_status mp_cpu_sgemm(mp_kctx *kc, int transA, int transB, int M, int N, int K,
                       const float *A, int lda, const float *B, int ldb, float *C, int ldc);

#endif
