/* Float8 GEMM reference and float8 transpose (kernels/ops.h, matmul_f8 / f8_transpose).
 *
 * The CPU backend has no float8 arithmetic, so the reference decodes each code with
 * mp_f8_decode, divides by its tensor's scale (the dequantised value ops.h defines), and
 * runs the fp32 GEMM of matmul.c:  out (R, S) = A (R, K) * B (S, K)^T.  This is what a
 * float8 tensor-core GEMM computes up to accumulation order: products of two float8 values
 * are exact in fp32, and cuBLASLt multiplies the product of the two dequant scales in at
 * the end, where we divide each operand first; the two differ only by fp32 rounding.
 *
 * Invariants: exactly one of out_x (written, or accumulated with MP_F8_GEMM_ADD) and out_f32
 * (accumulated) is non-NULL; a NaN
 * code decodes to NaN and propagates, as on the device. Each output element is summed by
 * one thread in k order (mp_cpu_sgemm), so results do not depend on the thread count. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/internal.h"

/* dst[i] = decode(codes[i]) / scale for n codes. */
static void decode_scaled(float *dst, const uint8_t *codes, size_t n, float scale,
                          mp_f8_format fmt) {
  /* The decode table costs 256 calls and turns n calls into lookups. */
  float table[256];
  for (int c = 0; c < 256; c++) table[c] = mp_f8_decode((uint8_t)c, fmt) / scale;
#pragma omp parallel for if (n > 65536)
  for (size_t i = 0; i < n; i++) dst[i] = table[codes[i]];
}

mp_status mp_cpu_matmul_f8(mp_kctx *kc, void *out_x, float *out_f32, const uint8_t *a,
                           const float *a_scale, mp_f8_format fmt_a, const uint8_t *b,
                           const float *b_scale, mp_f8_format fmt_b, int R, int K, int S,
                           unsigned flags) {
  MP_KREQUIRE(kc, R >= 0 && K >= 0 && S >= 0, "matmul_f8");
  MP_KREQUIRE(kc, (out_x == NULL) != (out_f32 == NULL), "matmul_f8");
  MP_KREQUIRE(kc, a_scale && b_scale, "matmul_f8");
  MP_KREQUIRE(kc, (a && b) || (size_t)R * S * K == 0, "matmul_f8");
  MP_KREQUIRE(kc, (flags & ~(MP_F8_GEMM_ADD | MP_F8_GEMM_FAST_ACCUM)) == 0, "matmul_f8");
  float *out = out_x ? (float *)out_x : out_f32;
  /* written unless MP_F8_GEMM_ADD; fp32 accumulation regardless of FAST_ACCUM (the
   * reference) */
  if (out_x && !(flags & MP_F8_GEMM_ADD)) memset(out, 0, sizeof(float) * (size_t)R * (size_t)S);
  if (R == 0 || S == 0 || K == 0) return MP_OK;
  size_t na = (size_t)R * K, nb = (size_t)S * K;
  float *fa = (float *)malloc(sizeof(float) * na);
  float *fb = (float *)malloc(sizeof(float) * nb);
  if (!fa || !fb) {
    free(fa);
    free(fb);
    return mp_error(kc->err, MP_ERR_NOMEM, "matmul_f8: out of memory decoding operands "
                    "(%zu bytes); use smaller GEMM shapes on the CPU backend",
                    sizeof(float) * (na + nb));
  }
  decode_scaled(fa, a, na, *a_scale, fmt_a);
  decode_scaled(fb, b, nb, *b_scale, fmt_b);
  mp_status st = mp_cpu_sgemm(kc, 0, 1, R, S, K, fa, K, fb, K, out, S);
  free(fa);
  free(fb);
  return st;
}

mp_status mp_cpu_f8_transpose(mp_kctx *kc, uint8_t *out, const uint8_t *in, int R, int C) {
  MP_KREQUIRE(kc, R >= 0 && C >= 0, "f8_transpose");
  MP_KREQUIRE(kc, (out && in) || (size_t)R * C == 0, "f8_transpose");
  MP_KREQUIRE(kc, out != in || (size_t)R * C == 0, "f8_transpose");
  enum { TB = 64 }; /* 64 x 64 byte tiles: both sides stay in L1 */
#pragma omp parallel for collapse(2) if ((size_t)R * C > 1 << 20)
  for (int r0 = 0; r0 < R; r0 += TB)
    for (int c0 = 0; c0 < C; c0 += TB) {
      int r1 = r0 + TB < R ? r0 + TB : R, c1 = c0 + TB < C ? c0 + TB : C;
      for (int r = r0; r < r1; r++)
        for (int c = c0; c < c1; c++) out[(size_t)c * R + r] = in[(size_t)r * C + c];
    }
  return MP_OK;
}
