/* Linear layer (y = x W^T + b) forward and backward over one blocked fp32 GEMM.
 *
 * mp_cpu_sgemm is a small Goto-style GEMM: the output is cut into MC x NC tiles, one
 * OpenMP task per tile; for each KC slice a tile packs its A rows into MR-row panels and
 * its B columns into NR-column panels (zero-padded at ragged edges), and a register-
 * blocked MR x NR micro-kernel accumulates panel products. A tile re-packs the B slice
 * that neighbouring tiles also pack; that costs 1/MC of the arithmetic and keeps tiles
 * independent (no barriers) and the result independent of the thread count, since each
 * output element is summed by one thread in k order. The micro-kernel is compiled twice
 * (x86-64-v3 with AVX2/FMA, and baseline) and picked at load time, so the binary runs on
 * any x86-64 and uses FMA where present; results may differ in the last bits between
 * those two machines, never between runs on one machine.
 *
 * Linear mapping (row-major, PyTorch weight layout W (M, K)):
 *   out  (N x M) = inp (N x K) * W^T          A = inp,        B = W (transposed)
 *   dinp (N x K) += dout (N x M) * W (M x K)   A = dout,       B = W
 *   dW   (M x K) += dout^T (M x N) * inp        A = dout (T),   B = inp */
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "kernels/cpu/internal.h"

/* MR, NR are fixed by the micro-kernel below (6 rows x two 8-float vectors). */
enum { MR = 6, NR = 16, MC = 72, NC = 128, KC = 256 };

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define MP_GEMM_CLONES __attribute__((target_clones("arch=x86-64-v3", "default")))
#else
#define MP_GEMM_CLONES
#endif

/* C[0..mr) x [0..nr) += Ap (kc x MR) * Bp (kc x NR). The MR x NR accumulators are GCC
 * vector values (two 8-float halves per row) so they stay in registers: 12 ymm registers
 * on AVX2; the baseline clone lowers each to SSE pairs. */
typedef float v8f __attribute__((vector_size(32)));

MP_GEMM_CLONES
static void micro_kernel(int kc, const float *restrict Ap, const float *restrict Bp,
                         float *restrict C, int ldc, int mr, int nr) {
  /* Written out by row: GCC at -O2 keeps named vector locals in registers but spills an
   * indexed accumulator array to the stack. */
  v8f c00 = {0}, c01 = {0}, c10 = {0}, c11 = {0}, c20 = {0}, c21 = {0};
  v8f c30 = {0}, c31 = {0}, c40 = {0}, c41 = {0}, c50 = {0}, c51 = {0};
  for (int p = 0; p < kc; p++) {
    const float *a = Ap + (size_t)p * MR;
    v8f b0, b1;
    memcpy(&b0, Bp + (size_t)p * NR, sizeof(b0));
    memcpy(&b1, Bp + (size_t)p * NR + 8, sizeof(b1));
#define MP_ROW(i, x0, x1)          \
  do {                             \
    v8f ai = (v8f){0} + a[i];      \
    x0 += ai * b0;                 \
    x1 += ai * b1;                 \
  } while (0)
    MP_ROW(0, c00, c01);
    MP_ROW(1, c10, c11);
    MP_ROW(2, c20, c21);
    MP_ROW(3, c30, c31);
    MP_ROW(4, c40, c41);
    MP_ROW(5, c50, c51);
#undef MP_ROW
  }
  v8f acc[MR][2] = {{c00, c01}, {c10, c11}, {c20, c21}, {c30, c31}, {c40, c41}, {c50, c51}};
  for (int i = 0; i < mr; i++) {
    float row[NR];
    memcpy(row, &acc[i][0], sizeof(acc[i][0]));
    memcpy(row + 8, &acc[i][1], sizeof(acc[i][1]));
    for (int j = 0; j < nr; j++) C[(size_t)i * ldc + j] += row[j];
  }
}

static inline float op_at(const float *X, int trans, int ld, int r, int c) {
  return trans ? X[(size_t)c * ld + r] : X[(size_t)r * ld + c];
}

mp_status mp_cpu_sgemm(mp_kctx *kc_, int transA, int transB, int M, int N, int K,
                       const float *A, int lda, const float *B, int ldb, float *C, int ldc) {
  MP_KREQUIRE(kc_, M >= 0 && N >= 0 && K >= 0, "sgemm");
  if (M == 0 || N == 0 || K == 0) return MP_OK;
  MP_ASSERT(lda >= (transA ? M : K) && ldb >= (transB ? K : N) && ldc >= N,
            "internal.h's shapes: op(A) M x K, op(B) K x N and C M x N, row-major in their leading dims");
  const int mt = (M + MC - 1) / MC, nt = (N + NC - 1) / NC;
  int failed = 0;
#pragma omp parallel if ((double)M * N * K > 1e5)
  {
    float *Ap = (float *)malloc(sizeof(float) * MC * KC);
    float *Bp = (float *)malloc(sizeof(float) * NC * KC);
    if (!Ap || !Bp) {
#pragma omp atomic write
      failed = 1;
    }
#pragma omp for collapse(2) schedule(dynamic, 1)
    for (int ti = 0; ti < mt; ti++)
      for (int tj = 0; tj < nt; tj++) {
        if (!Ap || !Bp) continue;
        int i0 = ti * MC, j0 = tj * NC;
        int mc = M - i0 < MC ? M - i0 : MC, nc = N - j0 < NC ? N - j0 : NC;
        for (int p0 = 0; p0 < K; p0 += KC) {
          int kc = K - p0 < KC ? K - p0 : KC;
          /* Pack B slice: NR-column panels, rows p, zero beyond nc. */
          for (int jp = 0; jp < nc; jp += NR) {
            float *dst = Bp + (size_t)jp * kc;
            for (int p = 0; p < kc; p++)
              for (int j = 0; j < NR; j++)
                dst[(size_t)p * NR + j] =
                    jp + j < nc ? op_at(B, transB, ldb, p0 + p, j0 + jp + j) : 0.0f;
          }
          /* Pack A slice: MR-row panels, zero beyond mc. */
          for (int ip = 0; ip < mc; ip += MR) {
            float *dst = Ap + (size_t)ip * kc;
            for (int p = 0; p < kc; p++)
              for (int i = 0; i < MR; i++)
                dst[(size_t)p * MR + i] =
                    ip + i < mc ? op_at(A, transA, lda, i0 + ip + i, p0 + p) : 0.0f;
          }
          for (int ip = 0; ip < mc; ip += MR)
            for (int jp = 0; jp < nc; jp += NR)
              micro_kernel(kc, Ap + (size_t)ip * kc, Bp + (size_t)jp * kc,
                           C + (size_t)(i0 + ip) * ldc + j0 + jp, ldc,
                           mc - ip < MR ? mc - ip : MR, nc - jp < NR ? nc - jp : NR);
        }
      }
    free(Ap);
    free(Bp);
  }
  if (failed)
    return mp_error(kc_->err, MP_ERR_NOMEM, "sgemm: out of memory for pack buffers "
                    "(%zu bytes per thread)", sizeof(float) * (MC + NC) * KC);
  return MP_OK;
}

mp_status mp_cpu_matmul_forward(mp_kctx *kc, void *out_, const void *inp,
                                const void *weight, const void *bias_, int N, int K, int M) {
  MP_KREQUIRE(kc, N >= 0 && K >= 0 && M >= 0, "matmul_forward");
  float *out = (float *)out_;
  const float *bias = (const float *)bias_;
  for (int n = 0; n < N; n++) {
    float *o = out + (size_t)n * M;
    if (bias)
      memcpy(o, bias, sizeof(float) * (size_t)M);
    else
      memset(o, 0, sizeof(float) * (size_t)M);
  }
  return mp_cpu_sgemm(kc, 0, 1, N, M, K, (const float *)inp, K, (const float *)weight, K,
                      out, M);
}

mp_status mp_cpu_matmul_backward(mp_kctx *kc, void *dinp, float *dweight, float *dbias,
                                 const void *dout_, const void *inp, const void *weight,
                                 int N, int K, int M) {
  MP_KREQUIRE(kc, N >= 0 && K >= 0 && M >= 0, "matmul_backward");
  const float *dout = (const float *)dout_;
  if (dinp)
    MP_CHECK(mp_cpu_sgemm(kc, 0, 0, N, K, M, dout, M, (const float *)weight, K,
                          (float *)dinp, K));
  if (dweight)
    MP_CHECK(mp_cpu_sgemm(kc, 1, 0, M, K, N, dout, M, (const float *)inp, K, dweight, K));
  if (dbias) {
    enum { CB = 64 };
    int nblk = (M + CB - 1) / CB;
#pragma omp parallel for if ((long)N * M > 65536)
    for (int blk = 0; blk < nblk; blk++) {
      int c0 = blk * CB, c1 = c0 + CB < M ? c0 + CB : M;
      double acc[CB] = {0};
      for (int n = 0; n < N; n++)
        for (int c = c0; c < c1; c++) acc[c - c0] += dout[(size_t)n * M + c];
      for (int c = c0; c < c1; c++) dbias[c] += (float)acc[c - c0];
    }
  }
  return MP_OK;
}
