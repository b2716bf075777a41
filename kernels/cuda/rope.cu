/* RoPE on CUDA, HF Llama rotate_half convention (kernels/ops.h; reference
 * kernels/cpu/rope.c).
 *
 * One thread per rotated pair (i, i + hd/2) of one head at one position: it reads both
 * inputs before writing either output, so forward in place (out == x) is safe, and no two
 * threads touch the same element. Backward rotates dout by -theta and adds into dx. */
#include "kernels/cuda/cuda_kernels.cuh"

/* dir = +1: out = rot(theta) x; dir = -1: out += rot(-theta) x. */
__global__ void k_rope(mp_bf16 *out, const mp_bf16 *x, const float *cos_t,
                       const float *sin_t, int T, int nh, int hd, float dir, int accumulate,
                       size_t pairs) {
  int h2 = hd / 2;
  for (size_t p = blockIdx.x * (size_t)blockDim.x + threadIdx.x; p < pairs;
       p += (size_t)gridDim.x * blockDim.x) {
    size_t row = p / h2; /* (b, t, head) flattened */
    int i = (int)(p % h2);
    int t = (int)((row / nh) % T);
    float c = cos_t[(size_t)t * h2 + i], s = dir * sin_t[(size_t)t * h2 + i];
    size_t i1 = row * hd + i, i2 = i1 + h2;
    float x1 = mp_ldx(x, i1), x2 = mp_ldx(x, i2);
    float y1 = x1 * c - x2 * s, y2 = x2 * c + x1 * s;
    if (accumulate) {
      y1 += mp_ldx(out, i1);
      y2 += mp_ldx(out, i2);
    }
    mp_stx(out, i1, y1);
    mp_stx(out, i2, y2);
  }
}

static mp_status rope_launch(mp_kctx *kc, void *out, const void *x, const float *cos_t,
                             const float *sin_t, int B, int T, int nh, int hd, float dir,
                             int accumulate) {
  size_t pairs = (size_t)B * T * nh * (hd / 2);
  if (pairs == 0) return MP_OK;
  k_rope<<<mp_cuda_grid(pairs, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)out, (const mp_bf16 *)x, cos_t, sin_t, T, nh, hd, dir, accumulate, pairs);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_rope_forward(mp_kctx *kc, void *out, const void *x, const float *cos_t,
                               const float *sin_t, int B, int T, int nh, int hd) {
  MP_KREQUIRE(kc, B >= 0 && T >= 0 && nh >= 0 && hd > 0 && hd % 2 == 0, "rope_forward");
  return rope_launch(kc, out, x, cos_t, sin_t, B, T, nh, hd, 1.0f, 0);
}

mp_status mp_cuda_rope_backward(mp_kctx *kc, void *dx, const void *dout,
                                const float *cos_t, const float *sin_t, int B, int T,
                                int nh, int hd) {
  MP_KREQUIRE(kc, B >= 0 && T >= 0 && nh >= 0 && hd > 0 && hd % 2 == 0 && dx != dout,
                  "rope_backward");
  return rope_launch(kc, dx, dout, cos_t, sin_t, B, T, nh, hd, -1.0f, 1);
}
