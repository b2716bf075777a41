/* Causal grouped-query flash attention, forward and backward, bf16 storage and fp32
 * arithmetic (kernels/ops.h attention_forward / attention_backward): the entry points,
 * which dispatch, and the scalar kernels.
 *
 * Dispatch. Head dims 32, 64, 96 and 128 with 16-byte aligned inputs go to the tensor-core
 * FlashAttention-2 kernels (attention_fa2.cu); every other even head dim <= 128 (or
 * MP_ATTENTION_KERNEL=scalar in the environment, read at the first call, for A/B checks)
 * runs the scalar kernels below, which are the fallback and the on-device reference.
 * The tensor-core kernels' tile configuration is theirs to choose (MP_ATTENTION_FWD_CFG,
 * MP_ATTENTION_DKDV_CFG, MP_ATTENTION_DQ_CFG; attention_fa2.cu, bench/attention_bench.c).
 *
 * Layout of the work. A "row group" of TPR adjacent lanes owns one query row (forward,
 * dq) or one key row (dk/dv); lane `part` of the group owns head dimensions
 * [32 part, 32 part + 32), zero-padded past hd, so one kernel serves every even hd <= 128
 * (TPR = 2 for hd <= 64, 4 above). Dot products are summed per lane and then across the
 * group with butterfly shuffles in a fixed order. Tiles of 64 rows of the other operand
 * are staged in shared memory as bf16 (16-byte loads, broadcast across row groups).
 * Arithmetic is scalar fp32 (CUDA cores, no tensor cores): simple and exact enough to be
 * checked against the CPU reference; the benchmark reports how far that is from the
 * tensor-core bound.
 *
 * Forward: one block per (64 query rows, head, batch); K/V tiles up to the block's last
 * causal key; online softmax in base 2 (scores pre-multiplied by log2(e)/sqrt(hd)),
 * rescaling the fp32 accumulator once per 16 keys. Saves lse in natural log units.
 *
 * Backward (FlashAttention-2 identities, no atomics, deterministic):
 *   dq kernel:   one block per (64 query rows, head, batch): D_t = <dout_t, out_t>, then
 *                for every causal key p = exp(s - lse), ds = p (<dout_t, v_j> - D_t),
 *                dq_t += scale ds k_j. Writes D to a scratch buffer.
 *   dk/dv kernel: one block per (64 key rows, kv head, batch): loops over the query heads
 *                of its group (the GQA reduction) and the causal query tiles:
 *                dv_j += p dout_t, dk_j += scale ds q_t.
 * Each output row is owned by one row group, so the += into the bf16 gradients is a plain
 * read-modify-write (one rounding). P is recomputed in both kernels, which costs one
 * extra QK^T and dO V^T pass compared with atomics on dq but keeps results bitwise
 * reproducible. Heavy causal tiles are scheduled first (forward, dq: reversed tile order;
 * dk/dv: tile 0 has the most queries and goes first).
 *
 * Span attention (the attention_span_* ops). The kernels take the pair's geometry (Rows):
 * tq query rows and tk key rows, batch strides of sq and sk rows, and delta = q_pos -
 * kv_pos, so key j is visible from query i iff j <= i + delta; pointers arrive offset to
 * the chunks' first rows. The monolithic ops are the pair tq = tk = sq = sk = T, delta 0.
 * The forward's MERGE variant merges the pair into the fp32 running state (acc, lse)
 * instead of writing out and lse (the merge: kernels/ops.h); the dq kernel's SPAN variant
 * reads D (span_dot) instead of computing it, and rows whose lse is -inf (empty) are left
 * out of both backward kernels. span_init and span_finalize are the element-wise kernels
 * at the end of this file; span_dot is the tensor-core path's D kernel (attention_fa2.cu),
 * which serves every even head dim. */
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <atomic>

#include "kernels/cuda/cuda_kernels.cuh"

namespace {

typedef __nv_bfloat16 bf16;

constexpr int kRows = 64;  /* rows per tile, both operands */
constexpr int kDpt = 32;   /* head dims per lane */
constexpr int kChunk = 16; /* keys (queries) per online-softmax step */
constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr unsigned kFull = 0xffffffffu;

/* Sum over the TPR lanes of a row group (adjacent lanes). */
template <int TPR>
__device__ __forceinline__ float group_sum(float x) {
  x += __shfl_xor_sync(kFull, x, 1);
  if (TPR == 4) x += __shfl_xor_sync(kFull, x, 2);
  return x;
}

/* sum_i x[i] * y[i] over 32 dims; y is 16-byte aligned bf16 in shared memory. */
__device__ __forceinline__ float dot32(const float *x, const bf16 *y) {
  const uint4 *y4 = reinterpret_cast<const uint4 *>(y);
  float acc = 0.0f;
#pragma unroll
  for (int i = 0; i < 4; i++) {
    uint4 u = y4[i];
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
      __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162 *>(&w[k]);
      float2 f = __bfloat1622float2(h);
      acc = fmaf(x[i * 8 + 2 * k], f.x, acc);
      acc = fmaf(x[i * 8 + 2 * k + 1], f.y, acc);
    }
  }
  return acc;
}

/* o[i] += a * y[i] over 32 dims (y as in dot32). */
__device__ __forceinline__ void axpy32(float *o, float a, const bf16 *y) {
  const uint4 *y4 = reinterpret_cast<const uint4 *>(y);
#pragma unroll
  for (int i = 0; i < 4; i++) {
    uint4 u = y4[i];
    const unsigned w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int k = 0; k < 4; k++) {
      __nv_bfloat162 h = *reinterpret_cast<const __nv_bfloat162 *>(&w[k]);
      float2 f = __bfloat1622float2(h);
      o[i * 8 + 2 * k] = fmaf(a, f.x, o[i * 8 + 2 * k]);
      o[i * 8 + 2 * k + 1] = fmaf(a, f.y, o[i * 8 + 2 * k + 1]);
    }
  }
}

/* A (query chunk, key/value chunk) pair as the kernels see it: tq query rows and tk key
 * rows, batch strides of sq and sk rows in their tensors, and delta = q_pos - kv_pos (key j
 * is visible from query i iff j <= i + delta). The monolithic ops: T, T, T, T, 0. */
struct Rows {
  int tq, tk, sq, sk, delta;
};

/* Element offset of (b, t, head, 0) in a (B, S, nheads, hd) tensor (S rows per batch). */
__device__ __forceinline__ size_t row_off(int b, int t, int S, int nheads, int head, int hd) {
  return (((size_t)b * S + t) * nheads + head) * hd;
}

/* Stages rows [r0, r0 + kRows) of head `head` of X (B, S, nheads, hd) into sm
 * (kRows x 32*TPR bf16), zeros at rows >= n and past hd. hd is even and X 4-byte aligned,
 * so pairs are aligned. */
template <int TPR>
__device__ __forceinline__ void load_tile(bf16 *sm, const bf16 *X, int b, int S, int n,
                                          int nheads, int head, int hd, int r0) {
  constexpr int HDP = kDpt * TPR, PAIRS = HDP / 2;
  for (int i = threadIdx.x; i < kRows * PAIRS; i += blockDim.x) {
    int r = i / PAIRS, d = (i % PAIRS) * 2, t = r0 + r;
    __nv_bfloat162 v = __floats2bfloat162_rn(0.0f, 0.0f);
    if (t < n && d < hd)
      v = *reinterpret_cast<const __nv_bfloat162 *>(X + row_off(b, t, S, nheads, head, hd) + d);
    *reinterpret_cast<__nv_bfloat162 *>(sm + r * HDP + d) = v;
  }
}

/* Loads this lane's 32 dims of one row into registers, times mul; zeros past hd or when
 * the row does not exist. */
__device__ __forceinline__ void load_row(float *dst, const bf16 *X, bool valid, size_t off,
                                         int d0, int hd, float mul) {
#pragma unroll
  for (int i = 0; i < kDpt; i += 2) {
    float2 f = make_float2(0.0f, 0.0f);
    if (valid && d0 + i < hd)
      f = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(X + off + d0 + i));
    dst[i] = f.x * mul;
    dst[i + 1] = f.y * mul;
  }
}

/* X[off + d] = bf16(X[off + d] * keep + add[d] * mul) for this lane's dims < hd:
 * keep = 0 writes, keep = 1 accumulates. */
__device__ __forceinline__ void store_row(bf16 *X, size_t off, int d0, int hd, const float *add,
                                          float mul, float keep) {
#pragma unroll
  for (int i = 0; i < kDpt; i += 2) {
    if (d0 + i < hd) {
      __nv_bfloat162 *p = reinterpret_cast<__nv_bfloat162 *>(X + off + d0 + i);
      float2 old = keep != 0.0f ? __bfloat1622float2(*p) : make_float2(0.0f, 0.0f);
      *p = __floats2bfloat162_rn(old.x + add[i] * mul, old.y + add[i + 1] * mul);
    }
  }
}

/* The pair's (o, l) merged into the running state of one row: all TPR lanes of the row
 * group call it with their 32 dims of o (unnormalised, weights summing to l > 0) and the
 * row's old lse, which they all read before any lane writes (the caller's __syncwarp);
 * lane 0 of the group writes the new lse. lp is the pair's lse in natural units. */
__device__ __forceinline__ void merge_row(float *acc, float *lse_out, int d0, int hd,
                                          const float *o, float l, float lp, float old,
                                          bool write_lse) {
  float nl, wa, wb;
  mp_attn_merge_weights(old, lp, &nl, &wa, &wb);
  const float inv = (1.0f / l) * wb;
#pragma unroll
  for (int i = 0; i < kDpt; i += 2) {
    if (d0 + i < hd) {
      float2 *p = reinterpret_cast<float2 *>(acc + d0 + i);
      const float2 a = old != -INFINITY ? *p : make_float2(0.0f, 0.0f);
      *p = make_float2(a.x * wa + o[i] * inv, a.y * wa + o[i + 1] * inv);
    }
  }
  if (write_lse) *lse_out = nl;
}

/* MERGE false: writes out (bf16) and lse; true: merges into acc (fp32, the q chunk's row 0
 * at `out`'s place) and the running lse. */
template <int TPR, bool MERGE>
__global__ void __launch_bounds__(kRows *TPR)
    attn_fwd_kernel(bf16 *out, float *acc, float *lse, const bf16 *q, const bf16 *k,
                    const bf16 *v, Rows rw, int nh, int nkv, int hd, float scale_log2) {
  constexpr int HDP = kDpt * TPR;
  __shared__ __align__(16) bf16 Ks[kRows * HDP];
  __shared__ __align__(16) bf16 Vs[kRows * HDP];
  const int n_tiles = (rw.tq + kRows - 1) / kRows;
  const int qt = n_tiles - 1 - (int)blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, g = h / (nh / nkv);
  const int part = threadIdx.x % TPR, d0 = part * kDpt;
  const int t = qt * kRows + (int)threadIdx.x / TPR;
  const bool valid = t < rw.tq;
  const size_t qoff = valid ? row_off(b, t, rw.sq, nh, h, hd) : 0;

  float qr[kDpt], o[kDpt];
  load_row(qr, q, valid, qoff, d0, hd, scale_log2);
#pragma unroll
  for (int i = 0; i < kDpt; i++) o[i] = 0.0f;
  float m = -INFINITY, l = 0.0f;

  /* Keys up to the block's last query's last visible one. */
  const int kv_end = min(rw.tk, (qt + 1) * kRows + rw.delta);
  for (int j0 = 0; j0 < kv_end; j0 += kRows) {
    __syncthreads(); /* the previous tile is not read again */
    load_tile<TPR>(Ks, k, b, rw.sk, rw.tk, nkv, g, hd, j0);
    load_tile<TPR>(Vs, v, b, rw.sk, rw.tk, nkv, g, hd, j0);
    __syncthreads();
    for (int jc = 0; jc < kRows && j0 + jc < kv_end; jc += kChunk) {
      float s[kChunk];
#pragma unroll
      for (int jj = 0; jj < kChunk; jj++) s[jj] = group_sum<TPR>(dot32(qr, Ks + (jc + jj) * HDP + d0));
      float mx = m;
#pragma unroll
      for (int jj = 0; jj < kChunk; jj++) {
        int j = j0 + jc + jj;
        if (j > t + rw.delta || j >= rw.tk) s[jj] = -INFINITY;
        mx = fmaxf(mx, s[jj]);
      }
      if (mx == -INFINITY) continue; /* padding row, or keys all in the future */
      float corr = exp2f(m - mx);    /* 0 on the first step (m = -inf) */
      l *= corr;
#pragma unroll
      for (int i = 0; i < kDpt; i++) o[i] *= corr;
#pragma unroll
      for (int jj = 0; jj < kChunk; jj++) {
        float p = exp2f(s[jj] - mx);
        l += p;
        axpy32(o, p, Vs + (jc + jj) * HDP + d0);
      }
      m = mx;
    }
  }
  if constexpr (MERGE) {
    float *lrow = lse + ((size_t)b * nh + h) * rw.sq + t;
    const float old = valid ? *lrow : -INFINITY;
    __syncwarp(); /* every lane of the group has read the old lse */
    if (valid && l > 0.0f)
      merge_row(acc + qoff, lrow, d0, hd, o, l, (m + log2f(l)) * kLn2, old, part == 0);
  } else if (valid) {
    store_row(out, qoff, d0, hd, o, 1.0f / l, 0.0f);
    if (part == 0) lse[((size_t)b * nh + h) * rw.sq + t] = (m + log2f(l)) * kLn2;
  }
}

/* SPAN false: computes D_t = <dout_t, out_t> and writes it to Dbuf; true: reads D from
 * Dbuf (span_dot), and a row whose lse is -inf (empty) is left out. */
template <int TPR, bool SPAN>
__global__ void __launch_bounds__(kRows *TPR)
    attn_bwd_dq_kernel(bf16 *dq, float *Dbuf, const bf16 *dout, const bf16 *q, const bf16 *k,
                       const bf16 *v, const bf16 *out, const float *lse, Rows rw, int nh,
                       int nkv, int hd, float scale_log2, float scale) {
  constexpr int HDP = kDpt * TPR;
  __shared__ __align__(16) bf16 Ks[kRows * HDP];
  __shared__ __align__(16) bf16 Vs[kRows * HDP];
  const int n_tiles = (rw.tq + kRows - 1) / kRows;
  const int qt = n_tiles - 1 - (int)blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z, g = h / (nh / nkv);
  const int part = threadIdx.x % TPR, d0 = part * kDpt;
  const int t = qt * kRows + (int)threadIdx.x / TPR;
  const size_t lrow = ((size_t)b * nh + h) * rw.sq + t;
  const bool valid = t < rw.tq && (!SPAN || lse[lrow] != -INFINITY);
  const size_t qoff = valid ? row_off(b, t, rw.sq, nh, h, hd) : 0;

  float qr[kDpt], dor[kDpt], acc[kDpt];
  load_row(dor, dout, valid, qoff, d0, hd, 1.0f);
  float D = 0.0f;
  if constexpr (SPAN) {
    D = valid ? Dbuf[lrow] : 0.0f;
  } else {
    /* D = <dout_t, out_t>, reusing acc for out_t before it becomes the dq accumulator. */
    load_row(acc, out, valid, qoff, d0, hd, 1.0f);
#pragma unroll
    for (int i = 0; i < kDpt; i++) D = fmaf(dor[i], acc[i], D);
    D = group_sum<TPR>(D);
  }
  load_row(qr, q, valid, qoff, d0, hd, scale_log2);
#pragma unroll
  for (int i = 0; i < kDpt; i++) acc[i] = 0.0f;
  const float lse2 = valid ? lse[lrow] * kLog2e : 0.0f;

  const int kv_end = min(rw.tk, (qt + 1) * kRows + rw.delta);
  for (int j0 = 0; j0 < kv_end; j0 += kRows) {
    __syncthreads();
    load_tile<TPR>(Ks, k, b, rw.sk, rw.tk, nkv, g, hd, j0);
    load_tile<TPR>(Vs, v, b, rw.sk, rw.tk, nkv, g, hd, j0);
    __syncthreads();
    for (int jc = 0; jc < kRows && j0 + jc < kv_end; jc += kChunk) {
      float s[kChunk], dp[kChunk];
#pragma unroll
      for (int jj = 0; jj < kChunk; jj++) {
        s[jj] = group_sum<TPR>(dot32(qr, Ks + (jc + jj) * HDP + d0));
        dp[jj] = group_sum<TPR>(dot32(dor, Vs + (jc + jj) * HDP + d0));
      }
#pragma unroll
      for (int jj = 0; jj < kChunk; jj++) {
        int j = j0 + jc + jj;
        float p = (valid && j <= t + rw.delta && j < rw.tk) ? exp2f(s[jj] - lse2) : 0.0f;
        axpy32(acc, p * (dp[jj] - D), Ks + (jc + jj) * HDP + d0);
      }
    }
  }
  if (valid) {
    store_row(dq, qoff, d0, hd, acc, scale, 1.0f);
    if (!SPAN && part == 0) Dbuf[lrow] = D;
  }
}

template <int TPR>
__global__ void __launch_bounds__(kRows *TPR)
    attn_bwd_dkdv_kernel(bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q, const bf16 *k,
                         const bf16 *v, const float *lse, const float *Dbuf, Rows rw, int nh,
                         int nkv, int hd, float scale_log2, float scale) {
  constexpr int HDP = kDpt * TPR;
  __shared__ __align__(16) bf16 Qs[kRows * HDP];
  __shared__ __align__(16) bf16 Os[kRows * HDP]; /* dout tile */
  __shared__ float lse2s[kRows], Ds[kRows];
  const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  const int grp = nh / nkv;
  const int part = threadIdx.x % TPR, d0 = part * kDpt;
  const int j = kt * kRows + (int)threadIdx.x / TPR;
  const bool valid = j < rw.tk;
  const size_t koff = valid ? row_off(b, j, rw.sk, nkv, g, hd) : 0;

  float kr[kDpt], vr[kDpt], dka[kDpt], dva[kDpt];
  load_row(kr, k, valid, koff, d0, hd, scale_log2);
  load_row(vr, v, valid, koff, d0, hd, 1.0f);
#pragma unroll
  for (int i = 0; i < kDpt; i++) dka[i] = dva[i] = 0.0f;

  /* Queries t >= the tile's first key - delta see some key of the tile. */
  const int t0 = max(0, kt * kRows - rw.delta);
  for (int h = g * grp; h < (g + 1) * grp; h++) {
    const size_t lrow = ((size_t)b * nh + h) * rw.sq;
    for (int q0 = t0; q0 < rw.tq; q0 += kRows) {
      __syncthreads();
      load_tile<TPR>(Qs, q, b, rw.sq, rw.tq, nh, h, hd, q0);
      load_tile<TPR>(Os, dout, b, rw.sq, rw.tq, nh, h, hd, q0);
      for (int i = threadIdx.x; i < kRows; i += blockDim.x) {
        /* An empty row (lse -inf) gets +inf: p = 2^(s - inf) = 0. */
        const float L = q0 + i < rw.tq ? lse[lrow + q0 + i] : 0.0f;
        lse2s[i] = L == -INFINITY ? INFINITY : L * kLog2e;
        Ds[i] = q0 + i < rw.tq ? Dbuf[lrow + q0 + i] : 0.0f;
      }
      __syncthreads();
      for (int ic = 0; ic < kRows && q0 + ic < rw.tq; ic += kChunk) {
        float s[kChunk], dp[kChunk];
#pragma unroll
        for (int ii = 0; ii < kChunk; ii++) {
          s[ii] = group_sum<TPR>(dot32(kr, Qs + (ic + ii) * HDP + d0));
          dp[ii] = group_sum<TPR>(dot32(vr, Os + (ic + ii) * HDP + d0));
        }
#pragma unroll
        for (int ii = 0; ii < kChunk; ii++) {
          int t = q0 + ic + ii;
          float p = (valid && t + rw.delta >= j && t < rw.tq) ? exp2f(s[ii] - lse2s[ic + ii]) : 0.0f;
          axpy32(dva, p, Os + (ic + ii) * HDP + d0);
          axpy32(dka, p * (dp[ii] - Ds[ic + ii]), Qs + (ic + ii) * HDP + d0);
        }
      }
    }
  }
  if (valid) {
    store_row(dk, koff, d0, hd, dka, scale, 1.0f);
    store_row(dv, koff, d0, hd, dva, 1.0f, 1.0f);
  }
}

bool aligned4(const void *p) { return ((uintptr_t)p & 3u) == 0; }
bool aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* MP_ATTENTION_KERNEL, read once: 0 unset, empty or "auto" (tensor cores where they
 * apply), 1 "scalar", -1 anything else (an error at every call, so a typo in an A/B run
 * is not silently the default). */
int env_kernel_choice() {
  static const int choice = [] {
    const char *e = getenv("MP_ATTENTION_KERNEL");
    if (!e || !*e || strcmp(e, "auto") == 0) return 0;
    return strcmp(e, "scalar") == 0 ? 1 : -1;
  }();
  return choice;
}

std::atomic<int> g_force_scalar{0}; /* mp_cuda_attention_force_scalar (tests) */

/* Sets *fa2 to whether the tensor-core kernels take this call: a supported head dim, the
 * cp.async inputs 16-byte aligned, and not forced to the scalar kernels. */
mp_status choose_kernel(mp_kctx *kc, const char *op, int hd, const void *const *inputs,
                        int n_inputs, bool *fa2) {
  *fa2 = false;
  const int choice = env_kernel_choice();
  if (choice < 0)
    return mp_error(kc->err, MP_ERR_INVALID, "%s: MP_ATTENTION_KERNEL=%s is not understood; "
                    "set it to auto (tensor cores where supported) or scalar, or unset it",
                    op, getenv("MP_ATTENTION_KERNEL"));
  if (choice == 1 || g_force_scalar.load() || !mp_cuda_attention_fa2_supports(hd)) return MP_OK;
  for (int i = 0; i < n_inputs; i++)
    if (!aligned16(inputs[i])) return MP_OK;
  *fa2 = true;
  return MP_OK;
}

mp_status check_args(mp_kctx *kc, const char *op, int B, int T, int nh, int nkv, int hd, int hv) {
  if (B < 0 || T < 0 || nh <= 0 || nkv <= 0 || nh % nkv != 0)
    return mp_error(kc->err, MP_ERR_INVALID, "%s: invalid shape B=%d T=%d nh=%d nkv=%d; "
                    "need B, T >= 0 and nkv dividing nh", op, B, T, nh, nkv);
  /* the scalar and tensor-core kernels index v and the output with the q/k head */
  if (hv != hd)
    return mp_error(kc->err, MP_ERR_UNSUPPORTED, "%s: value head dim %d differs from the query/key "
                    "head dim %d (multi-head latent attention); the CUDA attention kernels take one "
                    "head dim: run MLA on the CPU backend", op, hv, hd);
  if (hd <= 0 || hd % 2 != 0 || hd > 128)
    return mp_error(kc->err, MP_ERR_UNSUPPORTED, "%s: head dim %d is not supported by the "
                    "CUDA flash attention kernel; it needs an even head dim <= 128", op, hd);
  if (B > 65535 || nh > 65535)
    return mp_error(kc->err, MP_ERR_UNSUPPORTED, "%s: B=%d or nh=%d exceeds 65535 (grid "
                    "limit); split the batch", op, B, nh);
  if (!kc->impl)
    return mp_error(kc->err, MP_ERR_INVALID, "%s: kc->impl is NULL; initialise the CUDA "
                    "backend first", op);
  return MP_OK;
}

/* The scalar forward at TPR 2 (hd <= 64) or 4. */
template <bool MERGE>
mp_status launch_scalar_fwd(mp_kctx *kc, bf16 *out, float *acc, float *lse, const bf16 *q,
                            const bf16 *k, const bf16 *v, Rows rw, int B, int nh, int nkv,
                            int hd) {
  cudaStream_t st = mp_cuda_impl_of(kc)->stream;
  const float scale_log2 = kLog2e / sqrtf((float)hd);
  dim3 grid((unsigned)((rw.tq + kRows - 1) / kRows), (unsigned)nh, (unsigned)B);
  if (hd <= 64)
    attn_fwd_kernel<2, MERGE><<<grid, kRows * 2, 0, st>>>(out, acc, lse, q, k, v, rw, nh, nkv,
                                                          hd, scale_log2);
  else
    attn_fwd_kernel<4, MERGE><<<grid, kRows * 4, 0, st>>>(out, acc, lse, q, k, v, rw, nh, nkv,
                                                          hd, scale_log2);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

/* The scalar backward at TPR lanes per row: the dq kernel (SPAN false: writes D into Dbuf;
 * true: reads it), then the dk/dv kernel. Returns the first launch error. */
template <int TPR, bool SPAN>
cudaError_t launch_scalar_bwd_tpr(cudaStream_t st, bf16 *dq, bf16 *dk, bf16 *dv, float *Dbuf,
                                  const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                                  const bf16 *out, const float *lse, Rows rw, int B, int nh,
                                  int nkv, int hd) {
  const float scale = 1.0f / sqrtf((float)hd), scale_log2 = kLog2e * scale;
  dim3 gq((unsigned)((rw.tq + kRows - 1) / kRows), (unsigned)nh, (unsigned)B);
  dim3 gk((unsigned)((rw.tk + kRows - 1) / kRows), (unsigned)nkv, (unsigned)B);
  attn_bwd_dq_kernel<TPR, SPAN><<<gq, kRows * TPR, 0, st>>>(dq, Dbuf, dout, q, k, v, out, lse,
                                                            rw, nh, nkv, hd, scale_log2, scale);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  attn_bwd_dkdv_kernel<TPR><<<gk, kRows * TPR, 0, st>>>(dk, dv, dout, q, k, v, lse, Dbuf, rw, nh,
                                                        nkv, hd, scale_log2, scale);
  return cudaGetLastError();
}

/* The scalar backward at TPR 2 (hd <= 64) or 4. */
template <bool SPAN>
cudaError_t launch_scalar_bwd(mp_kctx *kc, bf16 *dq, bf16 *dk, bf16 *dv, float *Dbuf,
                              const bf16 *dout, const bf16 *q, const bf16 *k, const bf16 *v,
                              const bf16 *out, const float *lse, Rows rw, int B, int nh,
                              int nkv, int hd) {
  cudaStream_t st = mp_cuda_impl_of(kc)->stream;
  return hd <= 64 ? launch_scalar_bwd_tpr<2, SPAN>(st, dq, dk, dv, Dbuf, dout, q, k, v, out,
                                                    lse, rw, B, nh, nkv, hd)
                  : launch_scalar_bwd_tpr<4, SPAN>(st, dq, dk, dv, Dbuf, dout, q, k, v, out,
                                                    lse, rw, B, nh, nkv, hd);
}

}  // namespace

mp_status mp_cuda_attention_forward(mp_kctx *kc, void *out, float *lse, const void *q,
                                    const void *k, const void *v, int B, int T, int nh, int nkv,
                                    int hd, int hv) {
  MP_CHECK(check_args(kc, "attention_forward", B, T, nh, nkv, hd, hv));
  if (B == 0 || T == 0) return MP_OK;
  if (!out || !lse || !q || !k || !v || !aligned4(out) || !aligned4(q) || !aligned4(k) ||
      !aligned4(v))
    return mp_error(kc->err, MP_ERR_INVALID, "attention_forward: NULL or misaligned tensor "
                    "(bf16 tensors must be 4-byte aligned)");
  const void *inputs[3] = {q, k, v};
  bool fa2 = false;
  MP_CHECK(choose_kernel(kc, "attention_forward", hd, inputs, 3, &fa2));
  if (fa2) return mp_cuda_attention_fa2_forward(kc, out, lse, q, k, v, B, T, nh, nkv, hd);
  return launch_scalar_fwd<false>(kc, (bf16 *)out, NULL, lse, (const bf16 *)q, (const bf16 *)k,
                                  (const bf16 *)v, Rows{T, T, T, T, 0}, B, nh, nkv, hd);
}

mp_status mp_cuda_attention_backward(mp_kctx *kc, void *dq, void *dk, void *dv, const void *dout,
                                     const void *q, const void *k, const void *v, const void *out,
                                     const float *lse, int B, int T, int nh, int nkv, int hd,
                                     int hv) {
  MP_CHECK(check_args(kc, "attention_backward", B, T, nh, nkv, hd, hv));
  if (B == 0 || T == 0) return MP_OK;
  const void *ptrs[8] = {dq, dk, dv, dout, q, k, v, out};
  for (int i = 0; i < 8; i++)
    if (!ptrs[i] || !aligned4(ptrs[i]))
      return mp_error(kc->err, MP_ERR_INVALID, "attention_backward: NULL or misaligned tensor "
                      "#%d (bf16 tensors must be 4-byte aligned; all gradients are required)",
                      i);
  if (!lse)
    return mp_error(kc->err, MP_ERR_INVALID, "attention_backward: lse is NULL; pass the "
                    "forward's saved lse");
  const void *inputs[4] = {dout, q, k, v};
  bool fa2 = false;
  MP_CHECK(choose_kernel(kc, "attention_backward", hd, inputs, 4, &fa2));
  if (fa2)
    return mp_cuda_attention_fa2_backward(kc, dq, dk, dv, dout, q, k, v, out, lse, B, T, nh,
                                          nkv, hd);
  cudaStream_t st = mp_cuda_impl_of(kc)->stream;
  /* D (B, nh, T): written by the dq kernel, read by the dk/dv kernel. Stream-ordered
   * allocation, so the free waits for the kernels without a host synchronisation. */
  float *Dbuf = NULL;
  MP_CUDA_CHECK(kc, cudaMallocAsync((void **)&Dbuf, (size_t)B * nh * T * sizeof(float), st));
  cudaError_t launch = launch_scalar_bwd<false>(kc, (bf16 *)dq, (bf16 *)dk, (bf16 *)dv, Dbuf,
                                                (const bf16 *)dout, (const bf16 *)q,
                                                (const bf16 *)k, (const bf16 *)v,
                                                (const bf16 *)out, lse, Rows{T, T, T, T, 0}, B,
                                                nh, nkv, hd);
  cudaError_t freed = cudaFreeAsync(Dbuf, st);
  if (launch != cudaSuccess)
    return mp_error(kc->err, MP_ERR_CUDA, "%s:%d: attention_backward kernel launch failed on "
                    "cuda device %d: %s", __FILE__, __LINE__, kc->device,
                    cudaGetErrorString(launch));
  MP_CUDA_CHECK(kc, freed);
  return MP_OK;
}

void mp_cuda_attention_force_scalar(int on) { g_force_scalar.store(on ? 1 : 0); }

/* ---- span attention -------------------------------------------------------------------- */

namespace {

/* The span ops' checks beyond mp_attn_span_ok (the same message as the CPU backend): the
 * kernels' head dims and grid limits, and the tensors. */
mp_status check_span(mp_kctx *kc, const char *op, const mp_attn_span *sp,
                     const void *const *ptrs, int n_ptrs) {
  MP_CHECK(check_args(kc, op, sp->B, sp->Tq, sp->nh, sp->nkv, sp->hd, sp->hd));
  for (int i = 0; i < n_ptrs; i++)
    if (!ptrs[i] || !aligned4(ptrs[i]))
      return mp_error(kc->err, MP_ERR_INVALID, "%s: NULL or misaligned tensor #%d (bf16 "
                      "tensors must be 4-byte aligned, fp32 state 8-byte aligned)", op, i);
  return MP_OK;
}

__global__ void fill_neg_inf_kernel(float *x, size_t n) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    x[i] = -INFINITY;
}

/* out = acc in bf16 where the row's lse is finite, 0 on an empty row; two elements per
 * thread (hd is even). */
__global__ void span_finalize_kernel(bf16 *out, const float *acc, const float *lse, int S,
                                     int nh, int hd, size_t n_pairs) {
  for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < n_pairs;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t e = 2 * i, row = e / hd, t = row / nh % S, h = row % nh, b = row / nh / S;
    const bool empty = lse[(b * nh + h) * S + t] == -INFINITY;
    const float2 a = empty ? make_float2(0.0f, 0.0f) : *reinterpret_cast<const float2 *>(acc + e);
    *reinterpret_cast<__nv_bfloat162 *>(out + e) = __floats2bfloat162_rn(a.x, a.y);
  }
}

unsigned grid_for(size_t n) {
  size_t g = (n + 255) / 256;
  return (unsigned)(g < 1 ? 1 : g > 65535 ? 65535 : g);
}

}  // namespace

mp_status mp_cuda_attention_span_init(mp_kctx *kc, float *lse, size_t n) {
  MP_KREQUIRE(kc, lse || n == 0, "attention_span_init");
  if (n == 0) return MP_OK;
  if (!kc->impl)
    return mp_error(kc->err, MP_ERR_INVALID, "attention_span_init: kc->impl is NULL; "
                    "initialise the CUDA backend first");
  fill_neg_inf_kernel<<<grid_for(n), 256, 0, mp_cuda_impl_of(kc)->stream>>>(lse, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_attention_span_forward(mp_kctx *kc, float *acc, float *lse, const void *q,
                                         const void *k, const void *v, const mp_attn_span *sp) {
  MP_KREQUIRE(kc, mp_attn_span_ok(sp), "attention_span_forward");
  const void *ptrs[5] = {acc, lse, q, k, v};
  MP_CHECK(check_span(kc, "attention_span_forward", sp, ptrs, 5));
  if (((uintptr_t)acc & 7u) != 0)
    return mp_error(kc->err, MP_ERR_INVALID, "attention_span_forward: acc is not 8-byte "
                    "aligned (the fp32 state is read and written in pairs)");
  if (!mp_attn_span_active(sp)) return MP_OK;
  const size_t qo = (size_t)sp->q_row * sp->nh * sp->hd, ko = (size_t)sp->kv_row * sp->nkv * sp->hd;
  const bf16 *Q = (const bf16 *)q + qo, *K = (const bf16 *)k + ko, *V = (const bf16 *)v + ko;
  const void *inputs[3] = {Q, K, V};
  bool fa2 = false;
  MP_CHECK(choose_kernel(kc, "attention_span_forward", sp->hd, inputs, 3, &fa2));
  if (fa2) return mp_cuda_attention_fa2_span_forward(kc, acc, lse, q, k, v, sp);
  const Rows rw = {sp->Tq, sp->Tk, sp->Sq, sp->Sk,
                   (int)((long long)sp->q_pos - sp->kv_pos)};
  return launch_scalar_fwd<true>(kc, NULL, acc + qo, lse + sp->q_row, Q, K, V, rw, sp->B,
                                 sp->nh, sp->nkv, sp->hd);
}

mp_status mp_cuda_attention_span_finalize(mp_kctx *kc, void *out, const float *acc,
                                          const float *lse, int B, int S, int nh, int hd) {
  MP_KREQUIRE(kc, B >= 0 && S >= 0 && nh > 0 && hd > 0, "attention_span_finalize");
  const size_t n = (size_t)B * S * nh * hd;
  if (n == 0) return MP_OK;
  if (hd % 2 != 0)
    return mp_error(kc->err, MP_ERR_UNSUPPORTED, "attention_span_finalize: head dim %d is "
                    "odd; the CUDA attention kernels need an even head dim", hd);
  if (!kc->impl || !out || !acc || !lse || !aligned4(out) || ((uintptr_t)acc & 7u) != 0)
    return mp_error(kc->err, MP_ERR_INVALID, "attention_span_finalize: NULL or misaligned "
                    "tensor (out 4-byte, acc 8-byte aligned), or the backend not initialised");
  span_finalize_kernel<<<grid_for(n / 2), 256, 0, mp_cuda_impl_of(kc)->stream>>>(
      (bf16 *)out, acc, lse, S, nh, hd, n / 2);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_attention_span_dot(mp_kctx *kc, float *D, const void *dout, const void *out,
                                     int B, int S, int nh, int hd) {
  MP_KREQUIRE(kc, B >= 0 && S >= 0 && nh > 0 && hd > 0, "attention_span_dot");
  if ((size_t)B * S * nh == 0) return MP_OK;
  if (hd % 2 != 0)
    return mp_error(kc->err, MP_ERR_UNSUPPORTED, "attention_span_dot: head dim %d is odd; "
                    "the CUDA attention kernels need an even head dim", hd);
  if (!kc->impl || !D || !dout || !out || !aligned4(dout) || !aligned4(out))
    return mp_error(kc->err, MP_ERR_INVALID, "attention_span_dot: NULL or misaligned tensor "
                    "(bf16 tensors must be 4-byte aligned), or the backend not initialised");
  return mp_cuda_attention_dot(kc, D, dout, out, B, S, nh, hd);
}

mp_status mp_cuda_attention_span_backward(mp_kctx *kc, void *dq, void *dk, void *dv,
                                          const void *dout, const void *q, const void *k,
                                          const void *v, const float *lse, const float *D,
                                          const mp_attn_span *sp) {
  MP_KREQUIRE(kc, mp_attn_span_ok(sp) && D, "attention_span_backward");
  const void *ptrs[9] = {dq, dk, dv, dout, q, k, v, lse, D};
  MP_CHECK(check_span(kc, "attention_span_backward", sp, ptrs, 9));
  if (!mp_attn_span_active(sp)) return MP_OK;
  const size_t qo = (size_t)sp->q_row * sp->nh * sp->hd, ko = (size_t)sp->kv_row * sp->nkv * sp->hd;
  const bf16 *dO = (const bf16 *)dout + qo, *Q = (const bf16 *)q + qo, *K = (const bf16 *)k + ko,
             *V = (const bf16 *)v + ko;
  const void *inputs[4] = {dO, Q, K, V};
  bool fa2 = false;
  MP_CHECK(choose_kernel(kc, "attention_span_backward", sp->hd, inputs, 4, &fa2));
  if (fa2) return mp_cuda_attention_fa2_span_backward(kc, dq, dk, dv, dout, q, k, v, lse, D, sp);
  const Rows rw = {sp->Tq, sp->Tk, sp->Sq, sp->Sk,
                   (int)((long long)sp->q_pos - sp->kv_pos)};
  cudaError_t launch = launch_scalar_bwd<true>(
      kc, (bf16 *)dq + qo, (bf16 *)dk + ko, (bf16 *)dv + ko, (float *)(D + sp->q_row), dO, Q, K,
      V, NULL, lse + sp->q_row, rw, sp->B, sp->nh, sp->nkv, sp->hd);
  if (launch != cudaSuccess)
    return mp_error(kc->err, MP_ERR_CUDA, "%s:%d: attention_span_backward kernel launch failed "
                    "on cuda device %d: %s", __FILE__, __LINE__, kc->device,
                    cudaGetErrorString(launch));
  return MP_OK;
}
