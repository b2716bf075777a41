/* Tensor-core causal grouped-query attention, FlashAttention-2 algorithm, forward and
 * backward (kernels/ops.h attention_forward / attention_backward), for head dims 32, 64,
 * 96 and 128. attention.cu decides which calls come here (mp_cuda_attention_fa2_supports)
 * and keeps its scalar kernels for every other shape and for MP_ATTENTION_KERNEL=scalar.
 *
 * Arithmetic: mma.sync.m16n8k16 bf16 x bf16 -> fp32 (sm_80 and sm_90 alike; no wgmma),
 * operands staged in shared memory with cp.async (16-byte chunks, zero-filled past T) and
 * read with ldmatrix. Softmax is in base 2 with fp32 statistics; probabilities (P) and
 * score gradients (dS) are rounded to bf16 once, as the second GEMM's operand, as in
 * FlashAttention. Tensors: q, out, dout, dq (B, T, nh, HD); k, v, dk, dv (B, T, nkv, HD);
 * lse and D (B, nh, T) fp32. Query head h reads kv head h / (nh / nkv).
 *
 * Kernels (BM query rows x BN key rows per tile; every warp owns 16 rows of its output):
 *   fwd:  one block per (BM=128 queries, head, batch), 8 warps. K and V tiles of 64 keys
 *         in separate buffers: V(n) loads while S = Q K(n)^T runs, K(n+1) while O += P V(n)
 *         runs (FlashAttention-2's overlap). Q fragments stay in registers.
 *   dot:  D_t = <dout_t, out_t> (fp32, one warp per row) into the backend scratch.
 *   dkdv: one block per (64 keys, kv head, batch), 4 warps; loops over the query heads of
 *         its group (the GQA reduction stays in registers) and the causal 64-query tiles,
 *         Q / dout / lse / D tiles double-buffered: S^T = K Q^T, P^T, dV += P^T dO,
 *         dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += dS^T Q.
 *   dq:   one block per (64 queries, head, batch), 4 warps, K / V tiles of 64 keys
 *         double-buffered: S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K. dO
 *         fragments stay in registers, Q's only for HD <= 64 (at 96 and 128 they would
 *         spill, so Q is re-read from shared memory).
 * No atomics: each output row belongs to one warp of one block, the sums run in a fixed
 * order, so results are bitwise reproducible. The += into the bf16 gradients is one
 * read-add-round-write per element, after the fp32 accumulation (scale applied in fp32).
 * Heavy causal tiles are scheduled first (fwd, dq: last query tile first; dkdv: key tile 0,
 * which sees every query, first).
 *
 * Masking. Key j is visible from query i iff j <= i. Rows past T are zero-filled in shared
 * memory, so every product is finite. fwd and dq only store rows i < T, for which j <= i
 * also excludes j >= T; dkdv stores rows j < T and must also drop queries i >= T. The mask
 * is applied only to tiles that cross the diagonal or T; warps whose 16 rows are all
 * masked for a tile skip its math (they still take part in loads and barriers).
 *
 * Fragment layout relied on (PTX ISA, "mma.m16n8k16" and "ldmatrix"); lane = 0..31,
 * g = lane / 4 (row group), c = lane % 4; each .b32 register holds two bf16, the lower
 * column (or k) index in the low half:
 *   A (16 x 16, row-major)  a0 = A[g][2c, 2c+1]    a1 = A[g+8][2c, 2c+1]
 *                           a2 = A[g][2c+8, +9]    a3 = A[g+8][2c+8, +9]
 *   B (16 x 8, k x n)       b0 = B[2c, 2c+1][g]    b1 = B[2c+8, 2c+9][g]
 *   C (16 x 8, fp32)        c0, c1 = C[g][2c, 2c+1]   c2, c3 = C[g+8][2c, 2c+1]
 *   ldmatrix.x4: lanes 8i..8i+7 give the row addresses of 8x8 matrix i, and register i
 *   receives M_i[g][2c, 2c+1]; with .trans it receives (M_i[2c][g], M_i[2c+1][g]).
 * Hence three address patterns (row offset, column offset within a 16 x 16 block):
 *   frag_a   (lane % 16, (lane / 16) * 8): a 16 x 16 A block of a row-major [m][k] array
 *            (Q for S = Q K^T, K for S^T = K Q^T);
 *   frag_bnk (lane % 8 + (lane / 16) * 8, ((lane / 8) % 2) * 8): two B fragments of n-tiles
 *            n0, n0 + 8 from an [n][k] array (K for S = Q K^T): r0, r1 = b0, b1 of n0;
 *            r2, r3 = b0, b1 of n0 + 8;
 *   frag_bkn (lane % 8 + ((lane / 8) % 2) * 8, (lane / 16) * 8) with .trans: the same from a
 *            [k][n] array (V for O = P V): r0, r1 for n-tile n0, r2, r3 for n0 + 8.
 * An S accumulator (C layout) over keys 16kk..16kk+15 (n-tiles 2kk, 2kk+1) is exactly the
 * A operand of the next GEMM: a0 = (s[2kk].c0, c1), a1 = (s[2kk].c2, c3),
 * a2 = (s[2kk+1].c0, c1), a3 = (s[2kk+1].c2, c3).
 * Shared-memory rows are padded to HD + 8 elements (a 16-byte shift per row), so the 8
 * rows of one ldmatrix matrix fall in 8 distinct 4-bank groups: no bank conflicts. */
#include <math.h>
#include <stdint.h>

#include "kernels/cuda/cuda_kernels.cuh"

namespace {

typedef __nv_bfloat16 bf16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kPad = 8;          /* elements of padding per shared-memory row */
constexpr int kFwdWarps = 8;     /* fwd: 128 query rows per block */
constexpr int kFwdBlockN = 64;   /* fwd: keys per tile */
constexpr int kBwdWarps = 4;     /* dkdv: 64 keys per block; dq: 64 queries per block */
constexpr int kBwdBlockM = 64;   /* dkdv: queries per tile */
constexpr int kDqBlockN = 64;    /* dq: keys per tile */
constexpr int kDotWarps = 8;     /* dot: rows per block */

/* ---- PTX wrappers --------------------------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_u32(const void *p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared, asynchronous; zero-fills when !valid (src is then not read,
 * but it is still a valid address: callers pass the tensor's base). */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void *src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0));
}

/* 4 bytes, same rules (lse and D rows, which are not 16-byte aligned for every T). */
__device__ __forceinline__ void cp_async4(uint32_t dst, const void *src, bool valid) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 4 : 0));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

/* Waits until at most N of this thread's committed groups are still in flight. */
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldsm_x4(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t r[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

/* c += A B for one 16 x 8 x 16 tile (layouts in the file comment). */
__device__ __forceinline__ void mma16816(float c[4], const uint32_t a[4], uint32_t b0,
                                         uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats as a bf16 pair, lo in the low half (round to nearest even). */
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t *>(&v);
}

/* 2^x (MUFU, ~2 ulp); 2^-inf = +0, which is how masked scores become zero weights. */
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

/* ---- fragment addressing ---------------------------------------------------------------
 * Byte offsets, within a 16 x 16 block of a padded [row][col] bf16 array with LD elements
 * per row, of the address this lane gives ldmatrix.x4 (patterns in the file comment). */
template <int LD>
__device__ __forceinline__ uint32_t off_a(int lane) {
  return (uint32_t)(((lane & 15) * LD + (lane >> 4) * 8) * 2);
}
template <int LD>
__device__ __forceinline__ uint32_t off_bnk(int lane) {
  return (uint32_t)((((lane & 7) + ((lane >> 4) << 3)) * LD + (lane & 8)) * 2);
}
template <int LD>
__device__ __forceinline__ uint32_t off_bkn(int lane) {
  return (uint32_t)((((lane & 7) + (lane & 8)) * LD + (lane >> 4) * 8) * 2);
}

/* Byte address of element (row, col) of a padded array at shared address base. */
template <int LD>
__device__ __forceinline__ uint32_t at(uint32_t base, int row, int col) {
  return base + (uint32_t)((row * LD + col) * 2);
}

/* acc (16 x 8*NT, C layout) += A (16 x 16*KC from `a`, the frag_a layout of a row-major
 * [16][KC*16] block at shared byte address a_base + lane offset) times B^T, B an [n][k]
 * array (n = 8*NT rows at shared byte address b_base + frag_bnk offset). Both offsets are
 * already added by the caller. A fragments are loaded once per k-chunk. */
template <int LD, int KC, int NT>
__device__ __forceinline__ void gemm_abt_smem(float (&acc)[NT][4], uint32_t a_addr,
                                              uint32_t b_addr) {
#pragma unroll
  for (int kc = 0; kc < KC; kc++) {
    uint32_t a[4];
    ldsm_x4(a, a_addr + kc * 32);
#pragma unroll
    for (int np = 0; np < NT / 2; np++) {
      uint32_t bf[4];
      ldsm_x4(bf, at<LD>(b_addr, np * 16, kc * 16));
      mma16816(acc[2 * np], a, bf[0], bf[1]);
      mma16816(acc[2 * np + 1], a, bf[2], bf[3]);
    }
  }
}

/* Same with A already in registers (frag_a layout, one [4] per 16-column chunk). */
template <int LD, int KC, int NT>
__device__ __forceinline__ void gemm_abt_reg(float (&acc)[NT][4], const uint32_t (&a)[KC][4],
                                             uint32_t b_addr) {
#pragma unroll
  for (int kc = 0; kc < KC; kc++) {
#pragma unroll
    for (int np = 0; np < NT / 2; np++) {
      uint32_t bf[4];
      ldsm_x4(bf, at<LD>(b_addr, np * 16, kc * 16));
      mma16816(acc[2 * np], a[kc], bf[0], bf[1]);
      mma16816(acc[2 * np + 1], a[kc], bf[2], bf[3]);
    }
  }
}

/* acc (16 x HD, C layout, DT = HD/8 n-tiles) += P (16 x 8*NP from the fp32 C-layout tile
 * p, rounded to bf16) times B, B a [k][n] array of 8*NP rows x HD columns at shared byte
 * address b_addr (frag_bkn offset already added), read with ldmatrix.trans. */
template <int LD, int NP, int DT>
__device__ __forceinline__ void gemm_pv(float (&acc)[DT][4], const float (&p)[NP][4],
                                        uint32_t b_addr) {
#pragma unroll
  for (int kk = 0; kk < NP / 2; kk++) {
    uint32_t a[4];
    a[0] = pack_bf16(p[2 * kk][0], p[2 * kk][1]);
    a[1] = pack_bf16(p[2 * kk][2], p[2 * kk][3]);
    a[2] = pack_bf16(p[2 * kk + 1][0], p[2 * kk + 1][1]);
    a[3] = pack_bf16(p[2 * kk + 1][2], p[2 * kk + 1][3]);
#pragma unroll
    for (int dp = 0; dp < DT / 2; dp++) {
      uint32_t bf[4];
      ldsm_x4_t(bf, at<LD>(b_addr, kk * 16, dp * 16));
      mma16816(acc[2 * dp], a, bf[0], bf[1]);
      mma16816(acc[2 * dp + 1], a, bf[2], bf[3]);
    }
  }
}

template <int NT>
__device__ __forceinline__ void zero(float (&acc)[NT][4]) {
#pragma unroll
  for (int i = 0; i < NT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.0f;
}

/* Stages rows [r0, r0 + ROWS) of one head of a (B, T, heads, HD) tensor into a padded
 * shared array (row stride in global memory: `stride` elements; g points at (b, 0, head,
 * 0)); rows at or past T are zero-filled. Asynchronous: the caller commits and waits. */
template <int ROWS, int HD, int NTHR>
__device__ __forceinline__ void load_rows(uint32_t sm, const bf16 *g, size_t stride, int r0,
                                          int T) {
  constexpr int CPR = HD / 8, LD = HD + kPad; /* 16-byte chunks per row */
  static_assert((ROWS * CPR) % NTHR == 0, "tile chunks must divide evenly among threads");
#pragma unroll
  for (int it = 0; it < ROWS * CPR / NTHR; it++) {
    const int i = it * NTHR + (int)threadIdx.x, r = i / CPR, c = i % CPR, t = r0 + r;
    const bool ok = t < T;
    const bf16 *src = ok ? g + (size_t)t * stride + c * 8 : g;
    cp_async16(sm + (uint32_t)((r * LD + c * 8) * 2), src, ok);
  }
}

/* X[i] = bf16(X[i] + a), X[i+1] = bf16(X[i+1] + b): the += of a gradient pair. */
__device__ __forceinline__ void add_pair(bf16 *p, float a, float b) {
  __nv_bfloat162 *q = reinterpret_cast<__nv_bfloat162 *>(p);
  float2 old = __bfloat1622float2(*q);
  *q = __floats2bfloat162_rn(old.x + a, old.y + b);
}

/* ---- forward ------------------------------------------------------------------------- */

template <int HD>
constexpr size_t fwd_smem_bytes() {
  return (size_t)(16 * kFwdWarps + 2 * kFwdBlockN) * (HD + kPad) * sizeof(bf16);
}

template <int HD>
__global__ void __launch_bounds__(kFwdWarps * 32, 1)
    fa2_fwd_kernel(bf16 *__restrict__ out, float *__restrict__ lse, const bf16 *__restrict__ q,
                   const bf16 *__restrict__ k, const bf16 *__restrict__ v, int T, int nh, int nkv,
                   float sl2) {
  constexpr int BM = 16 * kFwdWarps, BN = kFwdBlockN, LD = HD + kPad, NTHR = kFwdWarps * 32;
  constexpr int KC = HD / 16, DT = HD / 8, NT = BN / 8;
  extern __shared__ __align__(16) unsigned char smem[];
  const uint32_t sQ = smem_u32(smem), sK = sQ + BM * LD * 2, sV = sK + BN * LD * 2;

  const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
  const int gi = lane >> 2, ci = lane & 3;
  const int qt = (int)gridDim.x - 1 - (int)blockIdx.x; /* heavy (late) tiles first */
  const int h = blockIdx.y, b = blockIdx.z, g = h / (nh / nkv);
  const int q0 = qt * BM, w0 = q0 + warp * 16; /* first row of the block, of the warp */
  const size_t qs = (size_t)nh * HD, ks = (size_t)nkv * HD;
  const bf16 *qb = q + ((size_t)b * T * nh + h) * HD;
  const bf16 *kb = k + ((size_t)b * T * nkv + g) * HD;
  const bf16 *vb = v + ((size_t)b * T * nkv + g) * HD;
  const int kv_end = min(T, q0 + BM), n_kv = (kv_end + BN - 1) / BN;

  load_rows<BM, HD, NTHR>(sQ, qb, qs, q0, T);
  load_rows<BN, HD, NTHR>(sK, kb, ks, 0, T);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  uint32_t qf[KC][4];
#pragma unroll
  for (int kc = 0; kc < KC; kc++) ldsm_x4(qf[kc], at<LD>(sQ, warp * 16, kc * 16) + off_a<LD>(lane));
  const uint32_t kaddr = sK + off_bnk<LD>(lane), vaddr = sV + off_bkn<LD>(lane);

  float o[DT][4];
  zero(o);
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f}; /* m in unscaled score units */
  const bool warp_live = w0 < T;

  for (int n = 0; n < n_kv; n++) {
    const int k0 = n * BN;
    load_rows<BN, HD, NTHR>(sV, vb, ks, k0, T); /* V(n) overlaps S = Q K(n)^T */
    cp_async_commit();
    /* Some key of the tile is <= the warp's last row. */
    const bool active = warp_live && k0 <= w0 + 15;
    float s[NT][4];
    if (active) {
      zero(s);
      gemm_abt_reg<LD, KC, NT>(s, qf, kaddr);
      if (k0 + BN - 1 > w0) { /* crosses the diagonal */
#pragma unroll
        for (int nt = 0; nt < NT; nt++)
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int col = k0 + nt * 8 + 2 * ci + (e & 1), row = w0 + gi + (e >> 1) * 8;
            if (col > row) s[nt][e] = -INFINITY;
          }
      }
      /* Online softmax; rows gi (e = 0, 1) and gi + 8 (e = 2, 3), each spread over the 4
       * lanes of the row group. l stays a per-lane partial sum until the end. */
      float mx[2] = {m[0], m[1]};
#pragma unroll
      for (int nt = 0; nt < NT; nt++) {
        mx[0] = fmaxf(mx[0], fmaxf(s[nt][0], s[nt][1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[nt][2], s[nt][3]));
      }
#pragma unroll
      for (int r = 0; r < 2; r++) {
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
        mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
      }
      float ms[2], corr[2];
#pragma unroll
      for (int r = 0; r < 2; r++) {
        /* A row with every key so far masked keeps max -inf; subtracting 0 then keeps
         * exp2(-inf) = 0 instead of NaN. */
        ms[r] = mx[r] == -INFINITY ? 0.0f : mx[r] * sl2;
        corr[r] = fast_exp2(m[r] * sl2 - ms[r]); /* 0 on the first tile (m = -inf) */
        m[r] = mx[r];
        l[r] *= corr[r];
      }
#pragma unroll
      for (int dt = 0; dt < DT; dt++) {
        o[dt][0] *= corr[0];
        o[dt][1] *= corr[0];
        o[dt][2] *= corr[1];
        o[dt][3] *= corr[1];
      }
#pragma unroll
      for (int nt = 0; nt < NT; nt++) {
        s[nt][0] = fast_exp2(fmaf(s[nt][0], sl2, -ms[0]));
        s[nt][1] = fast_exp2(fmaf(s[nt][1], sl2, -ms[0]));
        s[nt][2] = fast_exp2(fmaf(s[nt][2], sl2, -ms[1]));
        s[nt][3] = fast_exp2(fmaf(s[nt][3], sl2, -ms[1]));
        l[0] += s[nt][0] + s[nt][1];
        l[1] += s[nt][2] + s[nt][3];
      }
    }
    cp_async_wait<0>(); /* V(n) has landed */
    __syncthreads();    /* ... for every thread, and no warp reads K(n) any more */
    if (n + 1 < n_kv) {
      load_rows<BN, HD, NTHR>(sK, kb, ks, k0 + BN, T); /* K(n+1) overlaps O += P V(n) */
      cp_async_commit();
    }
    if (active) gemm_pv<LD, NT, DT>(o, s, vaddr);
    cp_async_wait<0>(); /* K(n+1) has landed */
    __syncthreads();    /* ... and no warp reads V(n) any more */
  }

  if (!warp_live) return;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
    l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
  }
  bf16 *ob = out + ((size_t)b * T * nh + h) * HD;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = w0 + gi + r * 8;
    if (row >= T) continue;
    const float inv = l[r] > 0.0f ? 1.0f / l[r] : 0.0f; /* l > 0: key 0 is always visible */
    bf16 *orow = ob + (size_t)row * qs + 2 * ci;
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
      *reinterpret_cast<__nv_bfloat162 *>(orow + dt * 8) =
          __floats2bfloat162_rn(o[dt][2 * r] * inv, o[dt][2 * r + 1] * inv);
    if (ci == 0) lse[((size_t)b * nh + h) * T + row] = (m[r] * sl2 + log2f(l[r])) * kLn2;
  }
}

/* ---- backward: D = rowsum(dout * out) ------------------------------------------------ */

/* One warp per (b, t, h) row; lanes take pairs of dims, summed in a fixed shuffle tree. */
__global__ void __launch_bounds__(kDotWarps * 32)
    fa2_bwd_dot_kernel(float *__restrict__ D, const bf16 *__restrict__ dout,
                       const bf16 *__restrict__ out, int T, int nh, int hd, size_t n_rows) {
  const size_t row = (size_t)blockIdx.x * kDotWarps + (threadIdx.x >> 5);
  const int lane = threadIdx.x & 31;
  if (row >= n_rows) return;
  const bf16 *a = dout + row * hd, *o = out + row * hd;
  float acc = 0.0f;
  for (int d = 2 * lane; d < hd; d += 64) {
    float2 x = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(a + d));
    float2 y = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(o + d));
    acc = fmaf(x.x, y.x, fmaf(x.y, y.y, acc));
  }
  acc = mp_warp_sum(acc);
  if (lane == 0) {
    const int h = (int)(row % nh);
    const size_t bt = row / nh, b = bt / T, t = bt % T;
    D[(b * nh + h) * T + t] = acc;
  }
}

/* ---- backward: dK, dV (one block per key tile and kv head) --------------------------- */

template <int HD>
constexpr size_t dkdv_smem_bytes() {
  return (size_t)(2 * 16 * kBwdWarps + 4 * kBwdBlockM) * (HD + kPad) * sizeof(bf16) +
         (size_t)4 * kBwdBlockM * sizeof(float);
}

template <int HD>
__global__ void __launch_bounds__(kBwdWarps * 32)
    fa2_bwd_dkdv_kernel(bf16 *__restrict__ dk, bf16 *__restrict__ dv,
                        const bf16 *__restrict__ dout, const bf16 *__restrict__ q,
                        const bf16 *__restrict__ k, const bf16 *__restrict__ v,
                        const float *__restrict__ lse, const float *__restrict__ D, int T, int nh,
                        int nkv, float sl2, float scale) {
  constexpr int BN = 16 * kBwdWarps, BM = kBwdBlockM, LD = HD + kPad, NTHR = kBwdWarps * 32;
  constexpr int KC = HD / 16, DT = HD / 8, NQ = BM / 8;
  constexpr uint32_t kTileBytes = BM * LD * 2;
  extern __shared__ __align__(16) unsigned char smem[];
  /* K, V (BN rows); Q[2], dO[2] (BM rows); lse[2], D[2] (BM floats). */
  const uint32_t sK = smem_u32(smem), sV = sK + BN * LD * 2, sQ = sV + BN * LD * 2;
  const uint32_t sO = sQ + 2 * kTileBytes;
  float *Ls = reinterpret_cast<float *>(smem + 2 * BN * LD * 2 + 4 * kTileBytes);
  float *Ds = Ls + 2 * BM;

  const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
  const int gi = lane >> 2, ci = lane & 3;
  const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z, grp = nh / nkv;
  const int k0 = kt * BN, w0 = k0 + warp * 16;
  const size_t qs = (size_t)nh * HD, ks = (size_t)nkv * HD;
  const bf16 *kb = k + ((size_t)b * T * nkv + g) * HD;
  const bf16 *vb = v + ((size_t)b * T * nkv + g) * HD;
  /* Query tiles that see this key tile: from the one holding query k0 to the end. */
  const int qt0 = k0 / BM, per_h = (T + BM - 1) / BM - qt0, n_it = grp * per_h;

  load_rows<BN, HD, NTHR>(sK, kb, ks, k0, T);
  load_rows<BN, HD, NTHR>(sV, vb, ks, k0, T);
  /* Iteration `it` covers query head g*grp + it/per_h, query tile qt0 + it%per_h. */
  auto load_iter = [&](int it, int buf) {
    const int h = g * grp + it / per_h, i0 = (qt0 + it % per_h) * BM;
    const size_t head = ((size_t)b * T * nh + h) * HD;
    load_rows<BM, HD, NTHR>(sQ + buf * kTileBytes, q + head, qs, i0, T);
    load_rows<BM, HD, NTHR>(sO + buf * kTileBytes, dout + head, qs, i0, T);
    const int tid = (int)threadIdx.x;
    if (tid < BM) {
      const size_t lrow = ((size_t)b * nh + h) * T;
      const bool ok = i0 + tid < T;
      cp_async4(smem_u32(Ls + buf * BM + tid), ok ? lse + lrow + i0 + tid : lse, ok);
      cp_async4(smem_u32(Ds + buf * BM + tid), ok ? D + lrow + i0 + tid : D, ok);
    }
  };
  load_iter(0, 0);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  float dka[DT][4], dva[DT][4];
  zero(dka);
  zero(dva);
  const bool warp_live = w0 < T;
  const uint32_t ka = at<LD>(sK, warp * 16, 0) + off_a<LD>(lane);
  const uint32_t va = at<LD>(sV, warp * 16, 0) + off_a<LD>(lane);

  for (int it = 0; it < n_it; it++) {
    const int buf = it & 1;
    if (it + 1 < n_it) { /* prefetch the next tile into the other buffer */
      load_iter(it + 1, buf ^ 1);
      cp_async_commit();
    }
    const int i0 = (qt0 + it % per_h) * BM;
    /* Some query of the tile is >= the warp's first key. */
    if (warp_live && i0 + BM - 1 >= w0) {
      const uint32_t qa = sQ + buf * kTileBytes, oa = sO + buf * kTileBytes;
      const float *Lb = Ls + buf * BM, *Db = Ds + buf * BM;
      /* S^T = K Q^T: rows are this warp's keys, columns the tile's queries. */
      float s[NQ][4];
      zero(s);
      gemm_abt_smem<LD, KC, NQ>(s, ka, qa + off_bnk<LD>(lane));
      const bool need_mask = i0 < w0 + 15 || i0 + BM > T;
#pragma unroll
      for (int nt = 0; nt < NQ; nt++) {
        const float2 L = *reinterpret_cast<const float2 *>(Lb + nt * 8 + 2 * ci);
        const float l0 = L.x * kLog2e, l1 = L.y * kLog2e;
        s[nt][0] = fast_exp2(fmaf(s[nt][0], sl2, -l0));
        s[nt][1] = fast_exp2(fmaf(s[nt][1], sl2, -l1));
        s[nt][2] = fast_exp2(fmaf(s[nt][2], sl2, -l0));
        s[nt][3] = fast_exp2(fmaf(s[nt][3], sl2, -l1));
        if (need_mask) {
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int col = i0 + nt * 8 + 2 * ci + (e & 1), row = w0 + gi + (e >> 1) * 8;
            if (col < row || col >= T) s[nt][e] = 0.0f;
          }
        }
      }
      /* dV += P^T dO. */
      gemm_pv<LD, NQ, DT>(dva, s, oa + off_bkn<LD>(lane));
      /* dP^T = V dO^T, then dS^T = P^T (dP^T - D) in place. */
      float dp[NQ][4];
      zero(dp);
      gemm_abt_smem<LD, KC, NQ>(dp, va, oa + off_bnk<LD>(lane));
#pragma unroll
      for (int nt = 0; nt < NQ; nt++) {
        const float2 Dv = *reinterpret_cast<const float2 *>(Db + nt * 8 + 2 * ci);
        dp[nt][0] = s[nt][0] * (dp[nt][0] - Dv.x);
        dp[nt][1] = s[nt][1] * (dp[nt][1] - Dv.y);
        dp[nt][2] = s[nt][2] * (dp[nt][2] - Dv.x);
        dp[nt][3] = s[nt][3] * (dp[nt][3] - Dv.y);
      }
      /* dK += dS^T Q (scale applied at the end). */
      gemm_pv<LD, NQ, DT>(dka, dp, qa + off_bkn<LD>(lane));
    }
    cp_async_wait<0>(); /* the prefetched tile has landed */
    __syncthreads();    /* ... for every thread, and this buffer is no longer read */
  }

  if (!warp_live) return;
  bf16 *dkb = dk + ((size_t)b * T * nkv + g) * HD, *dvb = dv + ((size_t)b * T * nkv + g) * HD;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = w0 + gi + r * 8;
    if (row >= T) continue;
    const size_t off = (size_t)row * ks + 2 * ci;
#pragma unroll
    for (int dt = 0; dt < DT; dt++) {
      add_pair(dkb + off + dt * 8, dka[dt][2 * r] * scale, dka[dt][2 * r + 1] * scale);
      add_pair(dvb + off + dt * 8, dva[dt][2 * r], dva[dt][2 * r + 1]);
    }
  }
}

/* ---- backward: dQ (one block per query tile and head) -------------------------------- */

template <int HD>
constexpr size_t dq_smem_bytes() {
  return (size_t)(2 * 16 * kBwdWarps + 4 * kDqBlockN) * (HD + kPad) * sizeof(bf16);
}

template <int HD>
__global__ void __launch_bounds__(kBwdWarps * 32)
    fa2_bwd_dq_kernel(bf16 *__restrict__ dq, const bf16 *__restrict__ dout,
                      const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                      const bf16 *__restrict__ v, const float *__restrict__ lse,
                      const float *__restrict__ D, int T, int nh, int nkv, float sl2,
                      float scale) {
  constexpr int BM = 16 * kBwdWarps, BN = kDqBlockN, LD = HD + kPad, NTHR = kBwdWarps * 32;
  constexpr int KC = HD / 16, DT = HD / 8, NT = BN / 8;
  constexpr uint32_t kTileBytes = BN * LD * 2;
  extern __shared__ __align__(16) unsigned char smem[];
  /* Q, dO (BM rows); K[2], V[2] (BN rows). */
  const uint32_t sQ = smem_u32(smem), sO = sQ + BM * LD * 2, sK = sO + BM * LD * 2;
  const uint32_t sV = sK + 2 * kTileBytes;

  const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
  const int gi = lane >> 2, ci = lane & 3;
  const int qt = (int)gridDim.x - 1 - (int)blockIdx.x; /* heavy (late) tiles first */
  const int h = blockIdx.y, b = blockIdx.z, g = h / (nh / nkv);
  const int q0 = qt * BM, w0 = q0 + warp * 16;
  const size_t qs = (size_t)nh * HD, ks = (size_t)nkv * HD;
  const size_t head = ((size_t)b * T * nh + h) * HD;
  const bf16 *kb = k + ((size_t)b * T * nkv + g) * HD;
  const bf16 *vb = v + ((size_t)b * T * nkv + g) * HD;
  const int kv_end = min(T, q0 + BM), n_kv = (kv_end + BN - 1) / BN;

  load_rows<BM, HD, NTHR>(sQ, q + head, qs, q0, T);
  load_rows<BM, HD, NTHR>(sO, dout + head, qs, q0, T);
  load_rows<BN, HD, NTHR>(sK, kb, ks, 0, T);
  load_rows<BN, HD, NTHR>(sV, vb, ks, 0, T);
  cp_async_commit();

  /* This lane's rows w0 + gi and w0 + gi + 8: lse (base 2) and D; 0 past T (such rows
   * are computed on zero inputs and never stored). */
  const size_t lrow = ((size_t)b * nh + h) * T;
  float L[2], Dr[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = w0 + gi + r * 8;
    L[r] = row < T ? lse[lrow + row] * kLog2e : 0.0f;
    Dr[r] = row < T ? D[lrow + row] : 0.0f;
  }
  cp_async_wait<0>();
  __syncthreads();

  /* dO fragments live in registers; Q's too when they fit (HD <= 64): at HD 128 the
   * 32 more registers would spill, so Q is re-read from shared memory per key tile (one
   * extra ldmatrix per 16 dims, shared by the tile's NT/2 B loads). */
  constexpr bool kQInRegs = HD <= 64;
  constexpr int KQ = kQInRegs ? KC : 1;
  uint32_t qf[KQ][4], of[KC][4];
  const uint32_t qa = at<LD>(sQ, warp * 16, 0) + off_a<LD>(lane);
#pragma unroll
  for (int kc = 0; kc < KC; kc++) {
    if constexpr (kQInRegs) ldsm_x4(qf[kc], qa + kc * 32);
    ldsm_x4(of[kc], at<LD>(sO, warp * 16, kc * 16) + off_a<LD>(lane));
  }
  float dqa[DT][4];
  zero(dqa);
  const bool warp_live = w0 < T;

  for (int n = 0; n < n_kv; n++) {
    const int buf = n & 1, k0 = n * BN;
    if (n + 1 < n_kv) { /* prefetch the next K, V tiles into the other buffers */
      load_rows<BN, HD, NTHR>(sK + (buf ^ 1) * kTileBytes, kb, ks, k0 + BN, T);
      load_rows<BN, HD, NTHR>(sV + (buf ^ 1) * kTileBytes, vb, ks, k0 + BN, T);
      cp_async_commit();
    }
    if (warp_live && k0 <= w0 + 15) {
      const uint32_t kt = sK + buf * kTileBytes, vt = sV + buf * kTileBytes;
      float s[NT][4], dp[NT][4];
      zero(s);
      zero(dp);
      if constexpr (kQInRegs)
        gemm_abt_reg<LD, KC, NT>(s, qf, kt + off_bnk<LD>(lane));
      else
        gemm_abt_smem<LD, KC, NT>(s, qa, kt + off_bnk<LD>(lane));
      gemm_abt_reg<LD, KC, NT>(dp, of, vt + off_bnk<LD>(lane));
      const bool need_mask = k0 + BN - 1 > w0;
      /* dS = P (dP - D), P = exp2(S sl2 - lse2), into s. */
#pragma unroll
      for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int r = e >> 1;
          float p = fast_exp2(fmaf(s[nt][e], sl2, -L[r]));
          if (need_mask && k0 + nt * 8 + 2 * ci + (e & 1) > w0 + gi + r * 8) p = 0.0f;
          s[nt][e] = p * (dp[nt][e] - Dr[r]);
        }
      /* dQ += dS K (scale applied at the end). */
      gemm_pv<LD, NT, DT>(dqa, s, kt + off_bkn<LD>(lane));
    }
    cp_async_wait<0>(); /* the prefetched tiles have landed */
    __syncthreads();    /* ... for every thread, and this buffer is no longer read */
  }

  if (!warp_live) return;
  bf16 *dqb = dq + head;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = w0 + gi + r * 8;
    if (row >= T) continue;
    bf16 *drow = dqb + (size_t)row * qs + 2 * ci;
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
      add_pair(drow + dt * 8, dqa[dt][2 * r] * scale, dqa[dt][2 * r + 1] * scale);
  }
}

/* ---- launchers ------------------------------------------------------------------------ */

/* Opts `kernel` into `bytes` of dynamic shared memory (> 48 KB needs it) and asks for the
 * largest shared-memory carveout, so two backward blocks (~103 KB each at HD 128) fit on
 * one H100 SM. Attributes are per device, so this runs on every call (it is cheap). */
template <class Kernel>
mp_status set_smem(mp_kctx *kc, Kernel *kernel, size_t bytes) {
  MP_CUDA_CHECK(kc, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)bytes));
  MP_CUDA_CHECK(kc, cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         (int)cudaSharedmemCarveoutMaxShared));
  return MP_OK;
}

template <int HD>
mp_status launch_fwd(mp_kctx *kc, bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                     const bf16 *v, int B, int T, int nh, int nkv) {
  cudaStream_t st = mp_cuda_impl_of(kc)->stream;
  const size_t smem = fwd_smem_bytes<HD>();
  MP_CHECK(set_smem(kc, fa2_fwd_kernel<HD>, smem));
  const int bm = 16 * kFwdWarps;
  dim3 grid((unsigned)((T + bm - 1) / bm), (unsigned)nh, (unsigned)B);
  fa2_fwd_kernel<HD><<<grid, kFwdWarps * 32, smem, st>>>(out, lse, q, k, v, T, nh, nkv,
                                                         kLog2e / sqrtf((float)HD));
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

template <int HD>
mp_status launch_bwd(mp_kctx *kc, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
                     const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out,
                     const float *lse, int B, int T, int nh, int nkv) {
  cudaStream_t st = mp_cuda_impl_of(kc)->stream;
  const size_t n_rows = (size_t)B * T * nh;
  float *D = NULL;
  MP_CHECK(mp_cuda_scratch(kc, n_rows * sizeof(float), (void **)&D));
  const float scale = 1.0f / sqrtf((float)HD), sl2 = kLog2e * scale;

  fa2_bwd_dot_kernel<<<(unsigned)((n_rows + kDotWarps - 1) / kDotWarps), kDotWarps * 32, 0,
                       st>>>(D, dout, out, T, nh, HD, n_rows);
  MP_CUDA_LAUNCH_CHECK(kc);

  const size_t smem_kv = dkdv_smem_bytes<HD>(), smem_q = dq_smem_bytes<HD>();
  MP_CHECK(set_smem(kc, fa2_bwd_dkdv_kernel<HD>, smem_kv));
  MP_CHECK(set_smem(kc, fa2_bwd_dq_kernel<HD>, smem_q));
  const int bt = 16 * kBwdWarps;
  const unsigned n_t = (unsigned)((T + bt - 1) / bt);
  fa2_bwd_dkdv_kernel<HD><<<dim3(n_t, (unsigned)nkv, (unsigned)B), kBwdWarps * 32, smem_kv,
                            st>>>(dk, dv, dout, q, k, v, lse, D, T, nh, nkv, sl2, scale);
  MP_CUDA_LAUNCH_CHECK(kc);
  fa2_bwd_dq_kernel<HD><<<dim3(n_t, (unsigned)nh, (unsigned)B), kBwdWarps * 32, smem_q, st>>>(
      dq, dout, q, k, v, lse, D, T, nh, nkv, sl2, scale);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

}  // namespace

int mp_cuda_attention_fa2_supports(int hd) {
  return hd == 32 || hd == 64 || hd == 96 || hd == 128;
}

mp_status mp_cuda_attention_fa2_forward(mp_kctx *kc, void *out, float *lse, const void *q,
                                        const void *k, const void *v, int B, int T, int nh,
                                        int nkv, int hd) {
  bf16 *O = (bf16 *)out;
  const bf16 *Q = (const bf16 *)q, *K = (const bf16 *)k, *V = (const bf16 *)v;
  switch (hd) {
    case 32: return launch_fwd<32>(kc, O, lse, Q, K, V, B, T, nh, nkv);
    case 64: return launch_fwd<64>(kc, O, lse, Q, K, V, B, T, nh, nkv);
    case 96: return launch_fwd<96>(kc, O, lse, Q, K, V, B, T, nh, nkv);
    case 128: return launch_fwd<128>(kc, O, lse, Q, K, V, B, T, nh, nkv);
  }
  return mp_error(kc->err, MP_ERR_INTERNAL, "attention_forward: tensor-core kernel called "
                  "with head dim %d; attention.cu must check mp_cuda_attention_fa2_supports",
                  hd);
}

mp_status mp_cuda_attention_fa2_backward(mp_kctx *kc, void *dq, void *dk, void *dv,
                                         const void *dout, const void *q, const void *k,
                                         const void *v, const void *out, const float *lse,
                                         int B, int T, int nh, int nkv, int hd) {
  bf16 *dQ = (bf16 *)dq, *dK = (bf16 *)dk, *dV = (bf16 *)dv;
  const bf16 *dO = (const bf16 *)dout, *Q = (const bf16 *)q, *K = (const bf16 *)k,
             *V = (const bf16 *)v, *O = (const bf16 *)out;
  switch (hd) {
    case 32: return launch_bwd<32>(kc, dQ, dK, dV, dO, Q, K, V, O, lse, B, T, nh, nkv);
    case 64: return launch_bwd<64>(kc, dQ, dK, dV, dO, Q, K, V, O, lse, B, T, nh, nkv);
    case 96: return launch_bwd<96>(kc, dQ, dK, dV, dO, Q, K, V, O, lse, B, T, nh, nkv);
    case 128: return launch_bwd<128>(kc, dQ, dK, dV, dO, Q, K, V, O, lse, B, T, nh, nkv);
  }
  return mp_error(kc->err, MP_ERR_INTERNAL, "attention_backward: tensor-core kernel called "
                  "with head dim %d; attention.cu must check mp_cuda_attention_fa2_supports",
                  hd);
}
