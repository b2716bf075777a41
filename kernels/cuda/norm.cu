/* LayerNorm and RMSNorm on CUDA, forward and backward (kernels/ops.h contracts; the CPU
 * reference is kernels/cpu/layernorm.c and rmsnorm.c, whose formulas these follow).
 *
 * Row work (forward, and dx in backward) is one warp per row: lanes stride over the C
 * channels, accumulate in fp32 and combine with a shuffle tree. Statistics are two-pass
 * (mean, then the centred variance) so rows with a large mean lose nothing to
 * cancellation. 1/sqrt uses IEEE sqrtf and a division, not rsqrtf, to stay within an ulp
 * of the reference.
 *
 * Parameter gradients (dw, db) are column sums over N rows. To stay deterministic without
 * atomics they take two kernels: blocks of 32 columns x 8 row lanes sum a fixed slice of
 * rows each into fp32 partials (scratch, R slices per column), then one thread per column
 * adds its R partials in slice order and accumulates into dw / db. */
#include <math.h>

#include "kernels/cuda/cuda_kernels.cuh"

enum { ROWS_PER_BLOCK = 8 };   /* warps per block in the row kernels */
enum { COL_TILE = 32, ROW_LANES = 8, MAX_SLICES = 128 };

__global__ void k_layernorm_forward(mp_bf16 *out, float *mean, float *rstd, const mp_bf16 *x,
                                    const mp_bf16 *w, const mp_bf16 *b, int N, int C,
                                    float eps) {
  int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return; /* whole warp leaves together; no block barrier follows */
  const mp_bf16 *xr = x + (size_t)row * C;
  float s = 0.0f;
  for (int c = lane; c < C; c += 32) s += mp_ldx(xr, c);
  float m = mp_warp_sum(s) / C;
  float v = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float d = mp_ldx(xr, c) - m;
    v += d * d;
  }
  v = mp_warp_sum(v) / C;
  float r = 1.0f / sqrtf(v + eps);
  mp_bf16 *o = out + (size_t)row * C;
  for (int c = lane; c < C; c += 32)
    mp_stx(o, c, (mp_ldx(xr, c) - m) * r * mp_ldx(w, c) + (b ? mp_ldx(b, c) : 0.0f));
  if (lane == 0) {
    if (mean) mean[row] = m;
    rstd[row] = r;
  }
}

__global__ void k_layernorm_backward_dx(mp_bf16 *dx, const mp_bf16 *dout, const mp_bf16 *x,
                                        const mp_bf16 *w, const float *mean,
                                        const float *rstd, int N, int C) {
  int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const mp_bf16 *g = dout + (size_t)row * C, *xr = x + (size_t)row * C;
  float m = mean[row], r = rstd[row];
  float sdn = 0.0f, sdnx = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float xh = (mp_ldx(xr, c) - m) * r, dn = mp_ldx(g, c) * mp_ldx(w, c);
    sdn += dn;
    sdnx += dn * xh;
  }
  float a = mp_warp_sum(sdn) / C, bb = mp_warp_sum(sdnx) / C;
  mp_bf16 *d = dx + (size_t)row * C;
  for (int c = lane; c < C; c += 32) {
    float xh = (mp_ldx(xr, c) - m) * r;
    mp_stx(d, c, mp_ldx(d, c) + r * (mp_ldx(g, c) * mp_ldx(w, c) - a - xh * bb));
  }
}

__global__ void k_rmsnorm_forward(mp_bf16 *out, float *rstd, const mp_bf16 *x,
                                  const mp_bf16 *w, int N, int C, float eps) {
  int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const mp_bf16 *xr = x + (size_t)row * C;
  float ss = 0.0f;
  for (int c = lane; c < C; c += 32) {
    float v = mp_ldx(xr, c);
    ss += v * v;
  }
  float r = 1.0f / sqrtf(mp_warp_sum(ss) / C + eps);
  mp_bf16 *o = out + (size_t)row * C;
  for (int c = lane; c < C; c += 32) mp_stx(o, c, mp_ldx(xr, c) * r * mp_ldx(w, c));
  if (lane == 0) rstd[row] = r;
}

__global__ void k_rmsnorm_backward_dx(mp_bf16 *dx, const mp_bf16 *dout, const mp_bf16 *x,
                                      const mp_bf16 *w, const float *rstd, int N, int C) {
  int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (row >= N) return;
  const mp_bf16 *g = dout + (size_t)row * C, *xr = x + (size_t)row * C;
  float r = rstd[row];
  float dot = 0.0f;
  for (int c = lane; c < C; c += 32) dot += mp_ldx(g, c) * mp_ldx(w, c) * mp_ldx(xr, c);
  float coef = (mp_warp_sum(dot) / C) * r * r;
  mp_bf16 *d = dx + (size_t)row * C;
  for (int c = lane; c < C; c += 32)
    mp_stx(d, c, mp_ldx(d, c) + r * (mp_ldx(g, c) * mp_ldx(w, c) - mp_ldx(xr, c) * coef));
}

/* Partial column sums over a slice of rows. Block (COL_TILE, ROW_LANES), grid
 * (ceil(C / COL_TILE), R). pw[s * C + c] = sum over the slice's rows of dout * xhat, where
 * xhat = (x - mean) * rstd (mean NULL: RMSNorm, xhat = x * rstd); pb likewise of dout
 * (pb NULL: not wanted). Slice s holds rows n with (n / ROW_LANES) % R == s. */
__global__ void k_norm_param_partials(float *pw, float *pb, const mp_bf16 *dout,
                                      const mp_bf16 *x, const float *mean, const float *rstd,
                                      int N, int C) {
  __shared__ float sw[ROW_LANES][COL_TILE], sb[ROW_LANES][COL_TILE];
  int c = blockIdx.x * COL_TILE + threadIdx.x, R = gridDim.y;
  float aw = 0.0f, ab = 0.0f;
  if (c < C) {
    for (int n = blockIdx.y * ROW_LANES + threadIdx.y; n < N; n += R * ROW_LANES) {
      size_t i = (size_t)n * C + c;
      float g = mp_ldx(dout, i);
      float xh = (mp_ldx(x, i) - (mean ? mean[n] : 0.0f)) * rstd[n];
      aw += g * xh;
      ab += g;
    }
  }
  sw[threadIdx.y][threadIdx.x] = aw;
  sb[threadIdx.y][threadIdx.x] = ab;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tw = 0.0f, tb = 0.0f;
    for (int l = 0; l < ROW_LANES; l++) {
      tw += sw[l][threadIdx.x];
      tb += sb[l][threadIdx.x];
    }
    pw[(size_t)blockIdx.y * C + c] = tw;
    if (pb) pb[(size_t)blockIdx.y * C + c] = tb;
  }
}

__global__ void k_norm_param_finish(float *dw, float *db, const float *pw, const float *pb,
                                    int R, int C) {
  for (int c = blockIdx.x * blockDim.x + threadIdx.x; c < C; c += gridDim.x * blockDim.x) {
    float tw = 0.0f, tb = 0.0f;
    for (int s = 0; s < R; s++) {
      tw += pw[(size_t)s * C + c];
      if (pb) tb += pb[(size_t)s * C + c];
    }
    if (dw) dw[c] += tw;
    if (db) db[c] += tb;
  }
}

/* dw (and db when wanted) += column sums; mean NULL means RMSNorm's xhat. */
static mp_status norm_param_grads(mp_kctx *kc, float *dw, float *db, const void *dout,
                                  const void *x, const float *mean, const float *rstd, int N,
                                  int C) {
  if (!dw && !db) return MP_OK;
  int R = (N + ROW_LANES - 1) / ROW_LANES;
  if (R > MAX_SLICES) R = MAX_SLICES;
  if (R < 1) R = 1;
  void *scratch = NULL;
  size_t per = (size_t)R * C;
  MP_CHECK(mp_cuda_scratch(kc, per * sizeof(float) * (db ? 2 : 1), &scratch));
  float *pw = (float *)scratch, *pb = db ? pw + per : NULL;
  dim3 block(COL_TILE, ROW_LANES), grid((C + COL_TILE - 1) / COL_TILE, R);
  k_norm_param_partials<<<grid, block, 0, MP_CUDA_STREAM(kc)>>>(
      pw, pb, (const mp_bf16 *)dout, (const mp_bf16 *)x, mean, rstd, N, C);
  MP_CUDA_LAUNCH_CHECK(kc);
  k_norm_param_finish<<<mp_cuda_grid((size_t)C, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                        MP_CUDA_STREAM(kc)>>>(dw, db, pw, pb, R, C);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

static unsigned row_blocks(int N) { return (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

mp_status mp_cuda_layernorm_forward(mp_kctx *kc, void *out, float *mean, float *rstd,
                                    const void *x, const void *w, const void *b, int N,
                                    int C, float eps) {
  MP_CUDA_REQUIRE(kc, N >= 0 && C > 0 && rstd, "layernorm_forward");
  if (N == 0) return MP_OK;
  k_layernorm_forward<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)out, mean, rstd, (const mp_bf16 *)x, (const mp_bf16 *)w,
      (const mp_bf16 *)b, N, C, eps);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_layernorm_backward(mp_kctx *kc, void *dx, float *dw, float *db,
                                     const void *dout, const void *x, const void *w,
                                     const float *mean, const float *rstd, int N, int C) {
  MP_CUDA_REQUIRE(kc, N >= 0 && C > 0 && mean && rstd, "layernorm_backward");
  if (N == 0) return MP_OK;
  if (dx) {
    k_layernorm_backward_dx<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, MP_CUDA_STREAM(kc)>>>(
        (mp_bf16 *)dx, (const mp_bf16 *)dout, (const mp_bf16 *)x, (const mp_bf16 *)w, mean,
        rstd, N, C);
    MP_CUDA_LAUNCH_CHECK(kc);
  }
  return norm_param_grads(kc, dw, db, dout, x, mean, rstd, N, C);
}

mp_status mp_cuda_rmsnorm_forward(mp_kctx *kc, void *out, float *rstd, const void *x,
                                  const void *w, int N, int C, float eps) {
  MP_CUDA_REQUIRE(kc, N >= 0 && C > 0 && rstd, "rmsnorm_forward");
  if (N == 0) return MP_OK;
  k_rmsnorm_forward<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)out, rstd, (const mp_bf16 *)x, (const mp_bf16 *)w, N, C, eps);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_rmsnorm_backward(mp_kctx *kc, void *dx, float *dw, const void *dout,
                                   const void *x, const void *w, const float *rstd, int N,
                                   int C) {
  MP_CUDA_REQUIRE(kc, N >= 0 && C > 0 && rstd, "rmsnorm_backward");
  if (N == 0) return MP_OK;
  if (dx) {
    k_rmsnorm_backward_dx<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, MP_CUDA_STREAM(kc)>>>(
        (mp_bf16 *)dx, (const mp_bf16 *)dout, (const mp_bf16 *)x, (const mp_bf16 *)w, rstd,
        N, C);
    MP_CUDA_LAUNCH_CHECK(kc);
  }
  return norm_param_grads(kc, dw, NULL, dout, x, NULL, rstd, N, C);
}
