/* LayerNorm and RMSNorm on CUDA, forward and backward (kernels/ops.h contracts; the CPU
 * reference is kernels/cpu/layernorm.c and rmsnorm.c, whose formulas these follow).
 *
 * Statistics are two-pass (mean, then the centred variance) so rows with a large mean lose
 * nothing to cancellation. 1/sqrt uses IEEE sqrtf and a division, not rsqrtf, to stay
 * within an ulp of the reference. Every reduction is a fixed shuffle/shared-memory tree
 * and every column sum runs in a fixed order, so results are the same on every run.
 *
 * Two paths. These ops move 2-4 bytes per flop, so they are bound by HBM traffic:
 *
 * - Vector path (C % 8 == 0, every X pointer 16-byte aligned, C <= 16384): rows move as
 *   16-byte vectors (8 bf16); backward C <= 8192 (4 vectors a thread: the dw/db
 *   accumulators live in registers). Forward: a group of 32 lanes (C <= 4096) or of a whole block
 *   (larger C) owns a row; each thread loads its NV vectors of x at once and keeps them in
 *   registers, so x is read from memory exactly once (the statistics and the output come
 *   from registers) and NV independent loads per thread are in flight. Backward: one block
 *   per row, grid-stride over rows with a grid fixed by N (G = min(N, 1024) blocks), and
 *   each thread owns the same columns in every row; it updates dx for its columns and
 *   accumulates its columns' dw (db) terms in registers across the block's rows. So dout
 *   and x are read once for dx and the parameter gradients together; the G per-block
 *   partials (G x C fp32, ~8 MB at C = 2048) are then summed per column in a fixed order
 *   by two small kernels (chunks of 64 partials, then the chunks), in place of a second
 *   pass over dout and x.
 *
 * - Scalar path (anything else): one warp per row, lanes stride over the C channels one
 *   bf16 at a time; parameter gradients take a second pass (blocks of 32 columns x 8 row
 *   lanes sum fixed slices of rows into partials, then one thread per column adds them in
 *   slice order).
 *
 * Fused amax (rmsnorm_forward_amax, ops.h): the RMSNorm forward kernels of both paths are
 * templates on kAmax; the fused instantiation computes and stores exactly what the plain
 * one does, and also folds the stored bf16 patterns into a per-thread max that each block
 * reduces and combines into the zeroed amax slot with one atomicMax (cuda_kernels.cuh,
 * fused amax). In that form a warp without a row stays (idle) to the block reduction
 * instead of leaving, since every thread must reach its barrier. */
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

/* kAmax: also the amax of the stored output into *amax (cuda_kernels.cuh, fused amax). The
 * plain form lets a warp without a row leave at once; the fused form keeps it (idle) to
 * the block's amax reduction at the end, which every thread must reach. */
template <bool kAmax>
__global__ void k_rmsnorm_forward(mp_bf16 *out, float *rstd, const mp_bf16 *x,
                                  const mp_bf16 *w, int N, int C, float eps, float *amax) {
  int row = blockIdx.x * ROWS_PER_BLOCK + (threadIdx.x >> 5), lane = threadIdx.x & 31;
  if (!kAmax && row >= N) return;
  uint32_t am = 0;
  if (row < N) { /* whole warps: row is uniform over the warp */
    const mp_bf16 *xr = x + (size_t)row * C;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) {
      float v = mp_ldx(xr, c);
      ss += v * v;
    }
    float r = 1.0f / sqrtf(mp_warp_sum(ss) / C + eps);
    mp_bf16 *o = out + (size_t)row * C;
    for (int c = lane; c < C; c += 32) {
      const mp_bf16 h = __float2bfloat16_rn(mp_ldx(xr, c) * r * mp_ldx(w, c));
      o[c] = h;
      if constexpr (kAmax) am = mp_amax_fold1(am, h);
    }
    if (lane == 0) rstd[row] = r;
  }
  if constexpr (kAmax) mp_amax_commit<1>(&amax, &am);
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

/* ---- vector path ------------------------------------------------------------------------ */

enum { VEC_THREADS = 256, BWD_MAX_BLOCKS = 1024, PART_CHUNK = 64 };

/* Sum over a group of kGroup threads (32: a warp, shuffles only; else the whole block,
 * blockDim.x == kGroup, through sh). Every thread of the group gets the result. */
template <int kGroup>
__device__ __forceinline__ float group_sum(float v, float *sh) {
  if (kGroup == 32) return mp_warp_sum(v);
  return mp_block_sum(v, sh);
}

/* Forward. kGroup threads own a row (rows_per_block = blockDim.x / kGroup), thread t of
 * the group holds vectors t, t + kGroup, ... (NV of them) of the row in registers.
 * kAmax (RMSNorm's rmsnorm_forward_amax): also the amax of the stored output into *amax
 * (cuda_kernels.cuh, fused amax); every thread then stays to the block's reduction at the
 * end, a warp group without a row idle. */
template <int NV, int kGroup, bool kLN, bool kAmax>
__global__ void __launch_bounds__(VEC_THREADS)
    k_norm_forward_vec(mp_bf16 *out, float *mean, float *rstd, const mp_bf16 *x,
                       const mp_bf16 *w, const mp_bf16 *b, int N, int C, float eps,
                       float *amax) {
  __shared__ float sh[32];
  const int t = threadIdx.x % kGroup;
  const int row = blockIdx.x * (blockDim.x / kGroup) + threadIdx.x / kGroup;
  /* A warp group leaves as a whole (no barrier follows); a block group always has a row
   * (the grid is exactly N blocks then). */
  if (!kAmax && row >= N) return;
  uint32_t am = 0;
  if (row < N) { /* uniform over the group: always true in the plain form, see above */
    const int nv = C / MP_VEC;
    const uint4 *xr = (const uint4 *)(x + (size_t)row * C);
    uint4 xv[NV];
#pragma unroll
    for (int j = 0; j < NV; j++)
      if (t + j * kGroup < nv) xv[j] = __ldg(xr + t + j * kGroup);
    float m = 0.0f;
    if (kLN) {
      float s = 0.0f;
#pragma unroll
      for (int j = 0; j < NV; j++)
        if (t + j * kGroup < nv) {
          float f[8];
          mp_unpack8(xv[j], f);
#pragma unroll
          for (int k = 0; k < 8; k++) s += f[k];
        }
      m = group_sum<kGroup>(s, sh) / C;
    }
    float v = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; j++)
      if (t + j * kGroup < nv) {
        float f[8];
        mp_unpack8(xv[j], f);
#pragma unroll
        for (int k = 0; k < 8; k++) {
          float d = kLN ? f[k] - m : f[k];
          v += d * d;
        }
      }
    const float r = 1.0f / sqrtf(group_sum<kGroup>(v, sh) / C + eps);
    mp_bf16 *o = out + (size_t)row * C;
#pragma unroll
    for (int j = 0; j < NV; j++) {
      const int vi = t + j * kGroup;
      if (vi < nv) {
        float f[8], fw[8], fb[8];
        mp_unpack8(xv[j], f);
        mp_ld8(w + (size_t)vi * MP_VEC, fw);
        if (kLN && b) mp_ld8(b + (size_t)vi * MP_VEC, fb);
#pragma unroll
        for (int k = 0; k < 8; k++)
          f[k] = kLN ? (f[k] - m) * r * fw[k] + (b ? fb[k] : 0.0f) : f[k] * r * fw[k];
        const uint4 ov = mp_pack8(f);
        *(uint4 *)(o + (size_t)vi * MP_VEC) = ov;
        if constexpr (kAmax) am = mp_amax_fold8(am, ov);
      }
    }
    if (t == 0) {
      if (kLN && mean) mean[row] = m;
      rstd[row] = r;
    }
  }
  if constexpr (kAmax) mp_amax_commit<1>(&amax, &am);
}

/* Backward, one block per row (grid-stride), thread t owns vectors t, t + blockDim.x, ...
 * of every row. dx (or NULL) += the row formula of the scalar kernels; pw / pb (or NULL)
 * get this block's column sums of dout * xhat and of dout, row by row in order:
 * pw[blockIdx.x * C + c]. RMSNorm (kLN false): xhat = x * rstd, no pb. */
template <int NV, bool kLN>
__global__ void __launch_bounds__(VEC_THREADS)
    k_norm_backward_vec(mp_bf16 *dx, float *pw, float *pb, const mp_bf16 *dout,
                        const mp_bf16 *x, const mp_bf16 *w, const float *mean,
                        const float *rstd, int N, int C) {
  __shared__ float sh[32];
  const int nv = C / MP_VEC, t = threadIdx.x, T = blockDim.x;
  float fw[NV][8], aw[NV][8], ab[NV][8];
#pragma unroll
  for (int j = 0; j < NV; j++) {
    if (t + j * T < nv) mp_ld8(w + (size_t)(t + j * T) * MP_VEC, fw[j]);
#pragma unroll
    for (int k = 0; k < 8; k++) aw[j][k] = ab[j][k] = 0.0f;
  }
  for (int row = blockIdx.x; row < N; row += gridDim.x) {
    const size_t base = (size_t)row * C;
    uint4 gv[NV], xv[NV], dv[NV];
    /* All loads of the row first: 2-3 NV independent 16-byte loads in flight. */
#pragma unroll
    for (int j = 0; j < NV; j++) {
      const int vi = t + j * T;
      if (vi < nv) {
        gv[j] = __ldg((const uint4 *)(dout + base) + vi);
        xv[j] = __ldg((const uint4 *)(x + base) + vi);
        if (dx) dv[j] = *((const uint4 *)(dx + base) + vi);
      }
    }
    const float m = kLN ? mean[row] : 0.0f, r = rstd[row];
    /* LN: s1 = sum dn, s2 = sum dn xhat (dn = g w); RMS: s2 = sum g w x. */
    float s1 = 0.0f, s2 = 0.0f;
#pragma unroll
    for (int j = 0; j < NV; j++)
      if (t + j * T < nv) {
        float g[8], xx[8];
        mp_unpack8(gv[j], g);
        mp_unpack8(xv[j], xx);
#pragma unroll
        for (int k = 0; k < 8; k++) {
          float dn = g[k] * fw[j][k];
          if (kLN) {
            s1 += dn;
            s2 += dn * ((xx[k] - m) * r);
          } else {
            s2 += g[k] * fw[j][k] * xx[k];
          }
        }
      }
    if (kLN) s1 = mp_block_sum(s1, sh) / C;
    s2 = mp_block_sum(s2, sh) / C;
    const float coef = kLN ? s2 : s2 * r * r; /* RMS: (dot / C) r^2 */
#pragma unroll
    for (int j = 0; j < NV; j++) {
      const int vi = t + j * T;
      if (vi < nv) {
        float g[8], xx[8];
        mp_unpack8(gv[j], g);
        mp_unpack8(xv[j], xx);
        if (dx) {
          float d[8];
          mp_unpack8(dv[j], d);
#pragma unroll
          for (int k = 0; k < 8; k++) {
            if (kLN) {
              float xh = (xx[k] - m) * r;
              d[k] = d[k] + r * (g[k] * fw[j][k] - s1 - xh * coef);
            } else {
              d[k] = d[k] + r * (g[k] * fw[j][k] - xx[k] * coef);
            }
          }
          mp_st8(dx + base + (size_t)vi * MP_VEC, d);
        }
#pragma unroll
        for (int k = 0; k < 8; k++) {
          aw[j][k] += g[k] * ((xx[k] - m) * r);
          if (kLN) ab[j][k] += g[k];
        }
      }
    }
  }
  if (!pw) return;
#pragma unroll
  for (int j = 0; j < NV; j++) {
    const int vi = t + j * T;
    if (vi < nv)
#pragma unroll
      for (int k = 0; k < 8; k++) {
        const size_t c = (size_t)vi * MP_VEC + k;
        pw[(size_t)blockIdx.x * C + c] = aw[j][k];
        if (kLN && pb) pb[(size_t)blockIdx.x * C + c] = ab[j][k];
      }
  }
}

/* Level 1 of the column sums of R partial rows (p: R x C): q[chunk * C + c] = sum of rows
 * [chunk * PART_CHUNK, +PART_CHUNK) of column c, in a fixed order (8 row lanes each sum a
 * strided subset in order, then lane 0 adds the 8 lanes in order). Block (COL_TILE,
 * ROW_LANES), grid (ceil(C / COL_TILE), ceil(R / PART_CHUNK)). */
__global__ void k_colsum_chunks(float *q, const float *p, int R, int C) {
  __shared__ float sh[ROW_LANES][COL_TILE + 1];
  const int c = blockIdx.x * COL_TILE + threadIdx.x;
  const int r0 = blockIdx.y * PART_CHUNK, r1 = min(R, r0 + PART_CHUNK);
  float s = 0.0f;
  if (c < C)
    for (int r = r0 + (int)threadIdx.y; r < r1; r += ROW_LANES) s += p[(size_t)r * C + c];
  sh[threadIdx.y][threadIdx.x] = s;
  __syncthreads();
  if (threadIdx.y == 0 && c < C) {
    float tsum = 0.0f;
    for (int l = 0; l < ROW_LANES; l++) tsum += sh[l][threadIdx.x];
    q[(size_t)blockIdx.y * C + c] = tsum;
  }
}

static int pick_nv(int nvec, int per_nv, int max_nv) {
  for (int nv = 1; nv <= max_nv; nv *= 2)
    if (nvec <= per_nv * nv) return nv;
  return 0;
}

/* Launches the forward vector path; false when the shape or alignment does not fit it.
 * kAmax: the fused-amax form (amax non-NULL, zeroed by the caller). */
template <bool kLN, bool kAmax>
static bool norm_forward_vec(mp_kctx *kc, void *out, float *mean, float *rstd, const void *x,
                             const void *w, const void *b, int N, int C, float eps,
                             float *amax) {
  if (C % MP_VEC || !mp_aligned16(out) || !mp_aligned16(x) || !mp_aligned16(w) ||
      !mp_aligned16(b))
    return false;
  const int nvec = C / MP_VEC;
  cudaStream_t st = MP_CUDA_STREAM(kc);
  mp_bf16 *o = (mp_bf16 *)out;
  const mp_bf16 *xx = (const mp_bf16 *)x, *ww = (const mp_bf16 *)w, *bb = (const mp_bf16 *)b;
  const unsigned warp_grid = (unsigned)((N + VEC_THREADS / 32 - 1) / (VEC_THREADS / 32));
#define NORM_FWD(NV, G, GRID)                                                             \
  k_norm_forward_vec<NV, G, kLN, kAmax><<<(GRID), VEC_THREADS, 0, st>>>(o, mean, rstd, xx, ww, \
                                                                        bb, N, C, eps, amax)
  switch (pick_nv(nvec, 32, 16)) {
    case 1: NORM_FWD(1, 32, warp_grid); return true;
    case 2: NORM_FWD(2, 32, warp_grid); return true;
    case 4: NORM_FWD(4, 32, warp_grid); return true;
    case 8: NORM_FWD(8, 32, warp_grid); return true;
    case 16: NORM_FWD(16, 32, warp_grid); return true;
    default: break;
  }
  switch (pick_nv(nvec, VEC_THREADS, 8)) {
    case 1: NORM_FWD(1, VEC_THREADS, (unsigned)N); return true;
    case 2: NORM_FWD(2, VEC_THREADS, (unsigned)N); return true;
    case 4: NORM_FWD(4, VEC_THREADS, (unsigned)N); return true;
    case 8: NORM_FWD(8, VEC_THREADS, (unsigned)N); return true;
    default: return false;
  }
#undef NORM_FWD
}

/* Backward vector path: dx (or NULL) and dw, db (or NULL) in one pass over dout and x.
 * *done is false (nothing queued) when the shape or alignment does not fit it. */
template <bool kLN>
static mp_status norm_backward_vec(mp_kctx *kc, bool *done, void *dx, float *dw, float *db,
                                   const void *dout, const void *x, const void *w,
                                   const float *mean, const float *rstd, int N, int C) {
  *done = false;
  if (C % MP_VEC || !mp_aligned16(dx) || !mp_aligned16(dout) || !mp_aligned16(x) ||
      !mp_aligned16(w))
    return MP_OK;
  const int nvec = C / MP_VEC, nv = pick_nv(nvec, VEC_THREADS, 4);
  if (nv == 0) return MP_OK;
  *done = true;
  /* Threads per block: enough 32-lane warps that NV vectors each cover the row. */
  const int per = (nvec + nv - 1) / nv;
  const int threads = ((per + 31) / 32) * 32;
  const int G = N < BWD_MAX_BLOCKS ? N : BWD_MAX_BLOCKS;
  const int chunks = (G + PART_CHUNK - 1) / PART_CHUNK;
  float *pw = NULL, *pb = NULL, *qw = NULL, *qb = NULL;
  if (dw || db) {
    /* Partials (G x C) and chunk sums (chunks x C), for dw and, with db, again for db.
     * pw is always computed (the kernel writes it whenever partials are wanted). */
    const size_t part = (size_t)G * C, chunk = (size_t)chunks * C;
    const int arrays = db ? 2 : 1;
    void *scratch = NULL;
    MP_CHECK(mp_cuda_scratch(kc, (part + chunk) * sizeof(float) * arrays, &scratch));
    pw = (float *)scratch;
    qw = pw + part;
    if (db) {
      pb = qw + chunk;
      qb = pb + part;
    }
  }
  cudaStream_t st = MP_CUDA_STREAM(kc);
  mp_bf16 *d = (mp_bf16 *)dx;
  const mp_bf16 *g = (const mp_bf16 *)dout, *xx = (const mp_bf16 *)x, *ww = (const mp_bf16 *)w;
#define NORM_BWD(NV)                                                                      \
  k_norm_backward_vec<NV, kLN><<<(unsigned)G, threads, 0, st>>>(d, pw, pb, g, xx, ww, mean, \
                                                               rstd, N, C)
  switch (nv) {
    case 1: NORM_BWD(1); break;
    case 2: NORM_BWD(2); break;
    default: NORM_BWD(4); break;
  }
#undef NORM_BWD
  MP_CUDA_LAUNCH_CHECK(kc);
  if (!pw) return MP_OK;
  dim3 block(COL_TILE, ROW_LANES), grid((C + COL_TILE - 1) / COL_TILE, chunks);
  k_colsum_chunks<<<grid, block, 0, st>>>(qw, pw, G, C);
  MP_CUDA_LAUNCH_CHECK(kc);
  if (pb) {
    k_colsum_chunks<<<grid, block, 0, st>>>(qb, pb, G, C);
    MP_CUDA_LAUNCH_CHECK(kc);
  }
  k_norm_param_finish<<<mp_cuda_grid((size_t)C, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, st>>>(
      dw, db, qw, qb, chunks, C);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

static unsigned row_blocks(int N) { return (unsigned)((N + ROWS_PER_BLOCK - 1) / ROWS_PER_BLOCK); }

mp_status mp_cuda_layernorm_forward(mp_kctx *kc, void *out, float *mean, float *rstd,
                                    const void *x, const void *w, const void *b, int N,
                                    int C, float eps) {
  MP_KREQUIRE(kc, N >= 0 && C > 0 && rstd, "layernorm_forward");
  if (N == 0) return MP_OK;
  if (norm_forward_vec<true, false>(kc, out, mean, rstd, x, w, b, N, C, eps, NULL)) {
    MP_CUDA_LAUNCH_CHECK(kc);
    return MP_OK;
  }
  k_layernorm_forward<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)out, mean, rstd, (const mp_bf16 *)x, (const mp_bf16 *)w,
      (const mp_bf16 *)b, N, C, eps);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_layernorm_backward(mp_kctx *kc, void *dx, float *dw, float *db,
                                     const void *dout, const void *x, const void *w,
                                     const float *mean, const float *rstd, int N, int C) {
  MP_KREQUIRE(kc, N >= 0 && C > 0 && mean && rstd, "layernorm_backward");
  if (N == 0 || (!dx && !dw && !db)) return MP_OK;
  bool done = false;
  MP_CHECK(norm_backward_vec<true>(kc, &done, dx, dw, db, dout, x, w, mean, rstd, N, C));
  if (done) return MP_OK;
  if (dx) {
    k_layernorm_backward_dx<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, MP_CUDA_STREAM(kc)>>>(
        (mp_bf16 *)dx, (const mp_bf16 *)dout, (const mp_bf16 *)x, (const mp_bf16 *)w, mean,
        rstd, N, C);
    MP_CUDA_LAUNCH_CHECK(kc);
  }
  return norm_param_grads(kc, dw, db, dout, x, mean, rstd, N, C);
}

/* The RMSNorm forward launches, plain (kAmax false, amax NULL) or fused. */
template <bool kAmax>
static mp_status rmsnorm_forward_launch(mp_kctx *kc, void *out, float *rstd, const void *x,
                                        const void *w, int N, int C, float eps, float *amax) {
  if (norm_forward_vec<false, kAmax>(kc, out, NULL, rstd, x, w, NULL, N, C, eps, amax)) {
    MP_CUDA_LAUNCH_CHECK(kc);
    return MP_OK;
  }
  k_rmsnorm_forward<kAmax><<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)out, rstd, (const mp_bf16 *)x, (const mp_bf16 *)w, N, C, eps, amax);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_rmsnorm_forward(mp_kctx *kc, void *out, float *rstd, const void *x,
                                  const void *w, int N, int C, float eps) {
  MP_KREQUIRE(kc, N >= 0 && C > 0 && rstd, "rmsnorm_forward");
  if (N == 0) return MP_OK;
  return rmsnorm_forward_launch<false>(kc, out, rstd, x, w, N, C, eps, NULL);
}

/* ops.h rmsnorm_forward_amax: the slot is zeroed on the stream, then the same kernels as
 * rmsnorm_forward (their kAmax form) max-combine the stored output into it. */
mp_status mp_cuda_rmsnorm_forward_amax(mp_kctx *kc, void *out, float *rstd, const void *x,
                                       const void *w, int N, int C, float eps, float *amax) {
  MP_KREQUIRE(kc, N >= 0 && C > 0 && rstd && amax, "rmsnorm_forward_amax");
  MP_CUDA_CHECK(kc, cudaMemsetAsync(amax, 0, sizeof(float), MP_CUDA_STREAM(kc)));
  if (N == 0) return MP_OK;
  return rmsnorm_forward_launch<true>(kc, out, rstd, x, w, N, C, eps, amax);
}

mp_status mp_cuda_rmsnorm_backward(mp_kctx *kc, void *dx, float *dw, const void *dout,
                                   const void *x, const void *w, const float *rstd, int N,
                                   int C) {
  MP_KREQUIRE(kc, N >= 0 && C > 0 && rstd, "rmsnorm_backward");
  if (N == 0 || (!dx && !dw)) return MP_OK;
  bool done = false;
  MP_CHECK(norm_backward_vec<false>(kc, &done, dx, dw, NULL, dout, x, w, NULL, rstd, N, C));
  if (done) return MP_OK;
  if (dx) {
    k_rmsnorm_backward_dx<<<row_blocks(N), ROWS_PER_BLOCK * 32, 0, MP_CUDA_STREAM(kc)>>>(
        (mp_bf16 *)dx, (const mp_bf16 *)dout, (const mp_bf16 *)x, (const mp_bf16 *)w, rstd,
        N, C);
    MP_CUDA_LAUNCH_CHECK(kc);
  }
  return norm_param_grads(kc, dw, NULL, dout, x, NULL, rstd, N, C);
}
