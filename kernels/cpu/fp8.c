/* Float8 emulation: E4M3 ("fn": no inf, max 448) and E5M2 (max 57344) casts with
 * round-to-nearest-even and saturation, tensorwise amax and scale, and quantization with
 * the transposed codes written in the same pass (kernels/ops.h).
 *
 * Encoding works on the value grid, in double: below the smallest normal the quantum is
 * the subnormal step 2^(emin - mbits); above it, 2^(floor(log2|x|) - mbits). rint() in
 * the default rounding mode is round-half-to-even, which is exactly the IEEE cast, and a
 * value that rounds above max saturates (torchao clamps to +-max before casting, which
 * gives the same code). Infinity saturates too; NaN maps to the format's NaN. */
#include <math.h>

#include "kernels/cpu/internal.h"

typedef struct f8_spec {
  int mbits, bias;
  float max;
  uint8_t nan_code;
} f8_spec;

static f8_spec spec_of(mp_f8_format fmt) {
  if (fmt == MP_F8_E5M2) return (f8_spec){2, 15, MP_F8_E5M2_MAX, 0x7E};
  return (f8_spec){3, 7, MP_F8_E4M3_MAX, 0x7F};
}

float mp_f8_max(mp_f8_format fmt) { return spec_of(fmt).max; }

uint8_t mp_f8_encode(float x, mp_f8_format fmt) {
  f8_spec s = spec_of(fmt);
  if (isnan(x)) return s.nan_code;
  uint8_t sign = signbit(x) ? 0x80 : 0;
  double a = fabs((double)x);
  int emin = 1 - s.bias;
  int e;
  frexp(a, &e); /* a = f * 2^e, f in [0.5, 1): floor(log2 a) = e - 1 */
  e = e - 1;
  if (a == 0.0 || e < emin) e = emin;
  double q = ldexp(1.0, e - s.mbits);
  double r = rint(a / q) * q;
  if (r > s.max) r = s.max;
  if (r == 0.0) return sign;
  int er;
  double f = frexp(r, &er);
  er -= 1; /* r = (2f) * 2^er, 2f in [1, 2) */
  if (er < emin) /* subnormal: exponent field 0 */
    return sign | (uint8_t)lrint(r / ldexp(1.0, emin - s.mbits));
  int mant = (int)lrint((2.0 * f - 1.0) * (1 << s.mbits));
  return sign | (uint8_t)((er + s.bias) << s.mbits) | (uint8_t)mant;
}

float mp_f8_decode(uint8_t code, mp_f8_format fmt) {
  f8_spec s = spec_of(fmt);
  int ebits = 7 - s.mbits;
  int ef = (code >> s.mbits) & ((1 << ebits) - 1);
  int mant = code & ((1 << s.mbits) - 1);
  float sign = (code & 0x80) ? -1.0f : 1.0f;
  if (fmt == MP_F8_E4M3 && ef == 15 && mant == 7) return NAN;
  if (fmt == MP_F8_E5M2 && ef == 31) return mant ? NAN : sign * INFINITY;
  double v = ef == 0 ? ldexp((double)mant, 1 - s.bias - s.mbits)
                     : ldexp(1.0 + (double)mant / (1 << s.mbits), ef - s.bias);
  return sign * (float)v;
}

mp_status mp_cpu_f8_amax(mp_kctx *kc, float *amax, const void *x_, size_t n) {
  (void)kc;
  const float *x = (const float *)x_;
  float m = 0.0f;
  int nan = 0;
#pragma omp parallel for reduction(max : m) reduction(| : nan) if (n > 262144)
  for (size_t i = 0; i < n; i++) {
    float a = fabsf(x[i]);
    nan |= isnan(a);
    m = a > m ? a : m;
  }
  *amax = nan ? NAN : m;
  return MP_OK;
}

mp_status mp_cpu_f8_scale_from_amax(mp_kctx *kc, float *scale, const float *amax,
                                    mp_f8_format fmt) {
  (void)kc;
  float a = *amax > 1e-12f ? *amax : 1e-12f; /* torchao's EPS clamp: all-zero tensors */
  *scale = mp_f8_max(fmt) / a;
  return MP_OK;
}

mp_status mp_cpu_f8_quantize(mp_kctx *kc, uint8_t *codes, const void *x_,
                             const float *scale, size_t n, mp_f8_format fmt) {
  (void)kc;
  const float *x = (const float *)x_;
  float s = *scale;
#pragma omp parallel for if (n > 65536)
  for (size_t i = 0; i < n; i++) codes[i] = mp_f8_encode(x[i] * s, fmt);
  return MP_OK;
}

mp_status mp_cpu_f8_dequantize(mp_kctx *kc, void *x_, const uint8_t *codes,
                               const float *scale, size_t n, mp_f8_format fmt) {
  (void)kc;
  float *x = (float *)x_;
  float s = *scale;
#pragma omp parallel for if (n > 65536)
  for (size_t i = 0; i < n; i++) x[i] = mp_f8_decode(codes[i], fmt) / s;
  return MP_OK;
}

mp_status mp_cpu_f8_fake_quantize(mp_kctx *kc, void *out_, const void *x_,
                                  const float *scale, size_t n, mp_f8_format fmt) {
  (void)kc;
  float *out = (float *)out_;
  const float *x = (const float *)x_;
  float s = *scale;
#pragma omp parallel for if (n > 65536)
  for (size_t i = 0; i < n; i++) out[i] = mp_f8_decode(mp_f8_encode(x[i] * s, fmt), fmt) / s;
  return MP_OK;
}

/* f8_quantize and f8_transpose in one pass: 64 x 64 tiles of x encoded into a local
 * buffer, then copied out row-major (codes) and column-major (codes_t). Each code is
 * mp_f8_encode(x * scale), as in mp_cpu_f8_quantize, so the results are those of the two
 * ops bit for bit; each tile is owned by one thread. */
mp_status mp_cpu_f8_quantize_t(mp_kctx *kc, uint8_t *codes, uint8_t *codes_t, const void *x_,
                               const float *scale, int R, int C, mp_f8_format fmt) {
  MP_KREQUIRE(kc, R >= 0 && C >= 0, "f8_quantize_t");
  MP_KREQUIRE(kc, codes || codes_t, "f8_quantize_t");
  if (R == 0 || C == 0) return MP_OK;
  MP_KREQUIRE(kc, x_ && scale && codes != codes_t, "f8_quantize_t");
  if (!codes_t) return mp_cpu_f8_quantize(kc, codes, x_, scale, (size_t)R * C, fmt);
  const float *x = (const float *)x_;
  const float s = *scale;
  enum { TB = 64 };
#pragma omp parallel for collapse(2) if ((size_t)R * C > 65536)
  for (int r0 = 0; r0 < R; r0 += TB)
    for (int c0 = 0; c0 < C; c0 += TB) {
      uint8_t tile[TB][TB];
      int nr = R - r0 < TB ? R - r0 : TB, nc = C - c0 < TB ? C - c0 : TB;
      for (int i = 0; i < nr; i++)
        for (int j = 0; j < nc; j++)
          tile[i][j] = mp_f8_encode(x[(size_t)(r0 + i) * C + c0 + j] * s, fmt);
      if (codes)
        for (int i = 0; i < nr; i++)
          for (int j = 0; j < nc; j++) codes[(size_t)(r0 + i) * C + c0 + j] = tile[i][j];
      for (int j = 0; j < nc; j++)
        for (int i = 0; i < nr; i++) codes_t[(size_t)(c0 + j) * R + r0 + i] = tile[i][j];
    }
  return MP_OK;
}
