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
 * Kernels (BM query rows x BN key rows per tile; every warp owns 16 rows of its output, or
 * in the forward two blocks of 16 where the configuration says so). Tile sizes, warps,
 * rows per warp, pipeline stages and register residency are template parameters taken
 * from the configuration tables below (kFwdCfgs, kDkdvCfgs, kDqCfgs); row 0 of each is
 * the default, the sizes quoted here:
 *   fwd:  one block per (BM=128 queries, head, batch), 8 warps. K and V tiles of 64 keys.
 *         1 stage: separate K and V buffers, V(n) loads while S = Q K(n)^T runs, K(n+1)
 *         while O += P V(n) runs (FlashAttention-2's overlap); 2 stages: two of each, tile
 *         n+1 loads under all of tile n. Q fragments in registers (or re-read from shared
 *         memory per key tile where the configuration says so).
 *   dot:  D_t = <dout_t, out_t> (fp32, one warp per row) into the backend scratch.
 *   dkdv: one block per (BN=64 keys, kv head, batch), 4 warps; loops over the query heads
 *         of its group (the GQA reduction stays in registers) and the causal BM=64-query
 *         tiles, Q / dout / lse / D tiles in a ring of `stages` buffers (2: double
 *         buffering): S^T = K Q^T, P^T, dV += P^T dO, dP^T = V dO^T, dS^T = P^T (dP^T - D),
 *         dK += dS^T Q.
 *   dq:   one block per (BM=64 queries, head, batch), 4 warps, K / V tiles of BN=64 keys in
 *         a ring of `stages` buffers: S = Q K^T, dP = dO V^T, dS = P (dP - D), dQ += dS K.
 *         dO fragments stay in registers, Q's only for HD <= 64 by default (at 96 and 128
 *         they would spill with 64-key tiles, so Q is re-read from shared memory).
 * No atomics: each output row belongs to one warp of one block, the sums run in a fixed
 * order, so results are bitwise reproducible. The += into the bf16 gradients is one
 * read-add-round-write per element, after the fp32 accumulation (scale applied in fp32).
 * Heavy causal tiles are scheduled first (fwd, dq: last query tile first; dkdv: key tile 0,
 * which sees every query, first).
 *
 * Configurations change only how many 16-row blocks, 16-key chunks and buffers a block
 * (or warp) has: every fragment is loaded, multiplied and masked by the same code in every
 * configuration. The backward sums
 * run over 16-row chunks aligned to multiples of 16 in the same order whatever the tile
 * sizes, and an all-masked chunk adds exact zeros, so every dK / dV / dQ configuration
 * gives the same bits as configuration 0. The forward's online softmax rescales once per
 * key tile, so a different BN rounds differently (a few bf16 ulps); BM, warps, rows per
 * warp, stages and Q residency do not change its bits. Tile sizes are tuned for head dims 64 and
 * 128 (mp_cuda_attention_fa2 hooks, bench/attention_bench.c); 32 and 96 always run
 * configuration 0. Selection: MP_ATTENTION_FWD_CFG, MP_ATTENTION_DKDV_CFG,
 * MP_ATTENTION_DQ_CFG in the environment (read once; unset: the measured best, tuned_default), overridden by the test
 * hook mp_cuda_attention_fa2_force_config.
 *
 * Masking. Key j is visible from query i iff j <= i. Rows past T are zero-filled in shared
 * memory, so every product is finite. fwd and dq only store rows i < T, for which j <= i
 * also excludes j >= T; dkdv stores rows j < T and must also drop queries i >= T. The mask
 * is applied only to tiles that cross the diagonal or T; warps whose rows are all masked
 * for a tile skip its math (they still take part in loads and barriers).
 *
 * Span attention (kernels/ops.h attention_span_*). Each kernel has a SPAN variant (template
 * argument) for one (query chunk, key/value chunk) pair: Tq query rows, Tk key rows, and
 * key j visible from query i iff j <= i + delta, delta = q_pos - kv_pos (the diagonal
 * shifted), keys past Tk masked as well; a block whose keys all lie after its queries
 * (or, dkdv, whose queries all lie before its keys) returns before loading anything. The
 * forward's SPAN epilogue merges the pair into the fp32 running state instead of writing
 * out and lse (fwd_merge); the backward's reads the final lse and the D of span_dot, a row
 * with lse -inf (empty) contributing nothing. SPAN false is the code above unchanged: the
 * span fields sit behind SPAN or add a delta that is 0 there, so the monolithic kernels
 * compile to what they compiled to without the variant. Configurations apply to both.
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
#include <stdio.h>
#include <stdlib.h>

#include <array>
#include <atomic>

#include "kernels/cuda/cuda_kernels.cuh"

namespace {

typedef __nv_bfloat16 bf16;

constexpr float kLog2e = 1.4426950408889634f;
constexpr float kLn2 = 0.6931471805599453f;
constexpr int kPad = 8;          /* elements of padding per shared-memory row */
constexpr int kDotWarps = 8;     /* dot: rows per block */
constexpr size_t kSmemMax = 227 * 1024; /* sm_90's per-block opt-in limit (sm_80: 163 KB) */

/* ---- configurations --------------------------------------------------------------------
 * One row per compiled variant of a kernel; the index is what MP_ATTENTION_*_CFG selects.
 * Row 0 is the default and must stay the configuration every other row is compared with
 * (tests/kernels_cuda/attention_test.cc runs all rows, bench/attention_bench.c times them).
 * Registers are the binding limit at HD 128 (65536 per SM, at most 255 per thread): the
 * accumulators alone take HD / 2 (dq, and fwd per 16-row block) or HD (dkdv) per thread,
 * S and dP another BN / 4 each (per block), register-resident Q or dO fragments HD / 4.
 * `min_blocks` goes to __launch_bounds__, so ptxas caps registers at
 * 65536 / (min_blocks * threads); 0 gives no minimum, which is not the same as 1: with 1
 * ptxas spends registers more freely (HD 64 dK/dV: 216 instead of 182). Check
 * -Xptxas -v for spills when adding a row. */
struct FwdCfg {
  int warps;      /* BM = 16 * mt * warps query rows per block */
  int mt;         /* 16-row blocks per warp: 1, or 2 to use each K / V fragment twice */
  int bn;         /* keys per K / V tile */
  int q_regs_hd;  /* Q fragments in registers when HD <= q_regs_hd, else from shared memory */
  int stages;     /* 1: one K and one V buffer; 2: two of each (see the file comment) */
  int min_blocks; /* resident blocks per SM asked of ptxas */
};
constexpr FwdCfg kFwdCfgs[] = {
    {8, 1, 64, 128, 1, 1}, /* 0: 8 warps share each K / V tile; 1 block (8 warps) per SM */
    {4, 1, 64, 128, 1, 2}, /* 1: half the block, 2 per SM: one block's barriers overlap the
                              other's math */
    {4, 1, 64, 128, 2, 2}, /* 2: as 1, K and V double-buffered: one barrier per key tile */
    {4, 1, 64, 0, 1, 3},   /* 3: Q re-read from shared memory, <= 168 registers: 3 blocks
                              (12 warps) per SM */
    {8, 1, 128, 64, 1, 1}, /* 4: 128-key tiles: half the barriers and softmax rescales */
    {4, 2, 32, 64, 1, 2},  /* 5: FlashAttention-2's layout: 32 rows per warp, so each K / V
                              fragment read from shared memory feeds two MMAs (half the
                              ldmatrix traffic per MMA of 1); 2 blocks per SM */
    {4, 2, 32, 64, 2, 2},  /* 6: as 5, K and V double-buffered */
};
constexpr int kNumFwdCfgs = (int)(sizeof(kFwdCfgs) / sizeof(kFwdCfgs[0]));

struct DkdvCfg {
  int warps;      /* BN = 16 * warps keys per block */
  int bm;         /* queries per Q / dO tile */
  int stages;     /* Q / dO / lse / D buffers in the ring (2: double buffering) */
  int min_blocks; /* resident blocks per SM asked of ptxas, 0 = none */
};
constexpr DkdvCfg kDkdvCfgs[] = {
    {4, 64, 2, 0}, /* 0: 64 keys x 64 queries; 2 blocks (8 warps) per SM at HD 128 */
    {4, 32, 2, 0}, /* 1: 32-query tiles: S^T and dP^T take half the registers */
    {4, 32, 3, 0}, /* 2: as 1 with a third buffer: two tiles in flight */
    {8, 64, 2, 0}, /* 3: 128 keys per block: each Q / dO tile feeds twice the keys */
    {8, 32, 2, 0}, /* 4: 128 keys x 32 queries */
    {4, 16, 3, 3}, /* 5: 16-query tiles, <= 168 registers: 3 blocks (12 warps) per SM */
};
constexpr int kNumDkdvCfgs = (int)(sizeof(kDkdvCfgs) / sizeof(kDkdvCfgs[0]));

struct DqCfg {
  int warps;      /* BM = 16 * warps queries per block */
  int bn;         /* keys per K / V tile */
  int q_regs_hd;  /* Q fragments in registers when HD <= q_regs_hd, else from shared memory */
  int stages;     /* K / V buffers in the ring (2: double buffering) */
  int min_blocks; /* resident blocks per SM asked of ptxas, 0 = none */
};
constexpr DqCfg kDqCfgs[] = {
    {4, 64, 64, 2, 0},  /* 0: 64 queries x 64 keys; 2 blocks (8 warps) per SM at HD 128 */
    {4, 32, 128, 2, 0}, /* 1: 32-key tiles free the registers to keep Q resident */
    {4, 32, 128, 3, 0}, /* 2: as 1 with a third K / V buffer */
    {8, 64, 64, 2, 0},  /* 3: 128 queries per block: each K / V tile feeds twice the rows */
    {8, 32, 128, 2, 0}, /* 4: 128 queries x 32 keys, Q resident */
    {4, 16, 0, 3, 3},   /* 5: Q from shared memory, <= 168 registers: 3 blocks (12 warps)
                           per SM */
};
constexpr int kNumDqCfgs = (int)(sizeof(kDqCfgs) / sizeof(kDqCfgs[0]));

/* Head dims with more than configuration 0 compiled. */
__host__ __device__ constexpr bool tuned_hd(int hd) { return hd == 64 || hd == 128; }

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

/* The forward's GEMMs for MT blocks of 16 rows per warp (the warp's rows 16 mt ..
 * 16 mt + 15 in block mt), each B fragment loaded once for all MT blocks; with MT = 1
 * they issue exactly gemm_abt_reg / gemm_abt_smem and gemm_pv's sequences.
 * gemm_qk: acc[mt] += Q_mt K^T, Q's A fragments from registers (QREG: qf[mt][kc]) or
 * from shared memory at q_addr (frag_a offset added; block mt 16 rows further down). */
template <int LD, int KC, int NT, int MT, bool QREG, int Q1, int Q2>
__device__ __forceinline__ void gemm_qk(float (&acc)[MT][NT][4], const uint32_t (&qf)[Q1][Q2][4],
                                        uint32_t q_addr, uint32_t k_addr) {
#pragma unroll
  for (int kc = 0; kc < KC; kc++) {
    uint32_t a[QREG ? 1 : MT][4];
    if constexpr (!QREG) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++) ldsm_x4(a[mt], q_addr + mt * 16 * LD * 2 + kc * 32);
    }
#pragma unroll
    for (int np = 0; np < NT / 2; np++) {
      uint32_t bf[4];
      ldsm_x4(bf, at<LD>(k_addr, np * 16, kc * 16));
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        const uint32_t *am = QREG ? qf[QREG ? mt : 0][QREG ? kc : 0] : a[QREG ? 0 : mt];
        mma16816(acc[mt][2 * np], am, bf[0], bf[1]);
        mma16816(acc[mt][2 * np + 1], am, bf[2], bf[3]);
      }
    }
  }
}

/* acc[mt] += P_mt V (gemm_pv for MT row blocks sharing each V fragment). */
template <int LD, int NP, int DT, int MT>
__device__ __forceinline__ void gemm_pv_mt(float (&acc)[MT][DT][4], const float (&p)[MT][NP][4],
                                           uint32_t b_addr) {
#pragma unroll
  for (int kk = 0; kk < NP / 2; kk++) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
      a[mt][0] = pack_bf16(p[mt][2 * kk][0], p[mt][2 * kk][1]);
      a[mt][1] = pack_bf16(p[mt][2 * kk][2], p[mt][2 * kk][3]);
      a[mt][2] = pack_bf16(p[mt][2 * kk + 1][0], p[mt][2 * kk + 1][1]);
      a[mt][3] = pack_bf16(p[mt][2 * kk + 1][2], p[mt][2 * kk + 1][3]);
    }
#pragma unroll
    for (int dp = 0; dp < DT / 2; dp++) {
      uint32_t bf[4];
      ldsm_x4_t(bf, at<LD>(b_addr, kk * 16, dp * 16));
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        mma16816(acc[mt][2 * dp], a[mt], bf[0], bf[1]);
        mma16816(acc[mt][2 * dp + 1], a[mt], bf[2], bf[3]);
      }
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
  constexpr int CPR = HD / 8, LD = HD + kPad, N = ROWS * CPR; /* 16-byte chunks per row */
#pragma unroll
  for (int it = 0; it < (N + NTHR - 1) / NTHR; it++) {
    const int i = it * NTHR + (int)threadIdx.x, r = i / CPR, c = i % CPR, t = r0 + r;
    if (N % NTHR != 0 && i >= N) break; /* the last round is partial */
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

/* ---- span attention: the pair's geometry and the forward's merge -------------------------
 * Span (the attention_span_* ops): the kernels' SPAN variants read their chunk sizes, batch
 * strides and causal offset from here, tensors arriving offset to the chunks' first rows;
 * key j is visible from query i iff j <= i + delta (delta = q_pos - kv_pos), and keys at
 * or past tk are masked too (a chunk's keys end where the queries' diagonal need not). The
 * monolithic variants (SPAN false) never read it, and their code is what it is without
 * it: every use of these fields sits behind SPAN, or adds a delta that is 0 there. */
struct Span {
  int tq, tk;   /* query rows, key rows */
  int sq, sk;   /* rows per batch of the tensors holding them */
  int delta;    /* q_pos - kv_pos */
  float *acc;   /* forward: the fp32 running output (B, sq, nh, HD) at the q chunk's row 0 */
};

/* The forward's SPAN epilogue: each row's (o, m, l) of this pair merged into the running
 * state (acc, lse at the q chunk's row 0; kernels/ops.h gives the merge): lse' =
 * log(e^lse + e^lp), acc' = acc e^(lse - lse') + (o / l) e^(lp - lse'), with lp = m sl2 +
 * log2 l in base 2 converted as the monolithic kernel converts its lse. A row with no
 * visible key (l = 0) keeps its state; an empty state (lse -inf) is not read, so the
 * first pair writes o / l and lp as the monolithic kernel writes out and lse. The four
 * lanes of a row group read the old lse before lane 0 writes the new one (__syncwarp). */
template <int HD, int MT>
__device__ __forceinline__ void fwd_merge(float *acc, float *lse, float (&o)[MT][HD / 8][4],
                                          const float (&m)[MT][2], float (&l)[MT][2], int b,
                                          int h, int nh, int w0, int tq, int sq, float sl2,
                                          int gi, int ci) {
  constexpr int DT = HD / 8;
  const size_t lrow = ((size_t)b * nh + h) * sq;
  float old[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 1);
      l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 2);
      const int row = w0 + mt * 16 + gi + r * 8;
      old[mt][r] = row < tq ? lse[lrow + row] : -INFINITY;
    }
  __syncwarp();
#pragma unroll
  for (int mt = 0; mt < MT; mt++)
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int row = w0 + mt * 16 + gi + r * 8;
      const float lr = l[mt][r], a_lse = old[mt][r];
      if (row >= tq || !(lr > 0.0f)) continue;
      const float lp = (m[mt][r] * sl2 + log2f(lr)) * kLn2;
      float nl, wa, wb;
      mp_attn_merge_weights(a_lse, lp, &nl, &wa, &wb);
      const float inv = (1.0f / lr) * wb;
      float *arow = acc + ((size_t)b * sq + row) * nh * HD + (size_t)h * HD + 2 * ci;
#pragma unroll
      for (int dt = 0; dt < DT; dt++) {
        float2 *p = reinterpret_cast<float2 *>(arow + dt * 8);
        const float2 a = a_lse != -INFINITY ? *p : make_float2(0.0f, 0.0f);
        *p = make_float2(a.x * wa + o[mt][dt][2 * r] * inv, a.y * wa + o[mt][dt][2 * r + 1] * inv);
      }
      if (ci == 0) lse[lrow + row] = nl;
    }
}

/* ---- forward ------------------------------------------------------------------------- */

template <int HD, int CFG>
__host__ __device__ constexpr size_t fwd_smem_bytes() {
  constexpr FwdCfg C = kFwdCfgs[CFG];
  return (size_t)(16 * C.mt * C.warps + 2 * C.stages * C.bn) * (HD + kPad) * sizeof(bf16);
}

template <int HD, int CFG, bool SPAN>
__global__ void __launch_bounds__(kFwdCfgs[CFG].warps * 32, kFwdCfgs[CFG].min_blocks)
    fa2_fwd_kernel(bf16 *__restrict__ out, float *__restrict__ lse, const bf16 *__restrict__ q,
                   const bf16 *__restrict__ k, const bf16 *__restrict__ v, int T, int nh, int nkv,
                   float sl2, const Span sp) {
  constexpr FwdCfg C = kFwdCfgs[CFG];
  constexpr int MT = C.mt, WR = 16 * MT; /* 16-row blocks per warp, rows per warp */
  constexpr int BM = WR * C.warps, BN = C.bn, LD = HD + kPad, NTHR = C.warps * 32;
  constexpr int KC = HD / 16, DT = HD / 8, NT = BN / 8, ST = C.stages;
  constexpr bool kQInRegs = HD <= C.q_regs_hd;
  constexpr uint32_t kTileBytes = BN * LD * 2; /* one K or V buffer */
  static_assert(BN % 16 == 0 && (ST == 1 || ST == 2), "fwd: BN a multiple of 16, 1 or 2 stages");
  static_assert(MT == 1 || MT == 2, "fwd: 16 or 32 rows per warp");
  static_assert(fwd_smem_bytes<HD, CFG>() <= kSmemMax, "fwd: shared memory over the limit");
  extern __shared__ __align__(16) unsigned char smem[];
  /* Q (BM rows); K[ST], V[ST] (BN rows each). */
  const uint32_t sQ = smem_u32(smem), sK = sQ + BM * LD * 2, sV = sK + ST * kTileBytes;

  const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
  const int gi = lane >> 2, ci = lane & 3;
  const int qt = (int)gridDim.x - 1 - (int)blockIdx.x; /* heavy (late) tiles first */
  const int h = blockIdx.y, b = blockIdx.z, g = h / (nh / nkv);
  const int q0 = qt * BM, w0 = q0 + warp * WR; /* first row of the block, of the warp */
  const int Tq = SPAN ? sp.tq : T, Tk = SPAN ? sp.tk : T, delta = SPAN ? sp.delta : 0;
  const size_t qs = (size_t)nh * HD, ks = (size_t)nkv * HD;
  const bf16 *qb = q + ((size_t)b * (SPAN ? sp.sq : T) * nh + h) * HD;
  const bf16 *kb = k + ((size_t)b * (SPAN ? sp.sk : T) * nkv + g) * HD;
  const bf16 *vb = v + ((size_t)b * (SPAN ? sp.sk : T) * nkv + g) * HD;
  const int kv_end = min(Tk, q0 + BM + delta), n_kv = (kv_end + BN - 1) / BN;
  if (SPAN && kv_end <= 0) return; /* every key of the chunk after the block's queries */

  load_rows<BM, HD, NTHR>(sQ, qb, qs, q0, Tq);
  load_rows<BN, HD, NTHR>(sK, kb, ks, 0, Tk);
  if constexpr (ST == 2) load_rows<BN, HD, NTHR>(sV, vb, ks, 0, Tk);
  cp_async_commit();
  cp_async_wait<0>();
  __syncthreads();

  /* Q as A fragments: in registers, or this warp's rows in shared memory. */
  const uint32_t qa = at<LD>(sQ, warp * WR, 0) + off_a<LD>(lane);
  uint32_t qf[kQInRegs ? MT : 1][kQInRegs ? KC : 1][4];
  if constexpr (kQInRegs) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
      for (int kc = 0; kc < KC; kc++)
        ldsm_x4(qf[mt][kc], at<LD>(sQ, warp * WR + mt * 16, kc * 16) + off_a<LD>(lane));
  }
  const uint32_t kaddr0 = sK + off_bnk<LD>(lane), vaddr0 = sV + off_bkn<LD>(lane);

  float o[MT][DT][4];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) zero(o[mt]);
  /* Per 16-row block: rows gi (r = 0) and gi + 8 (r = 1); m in unscaled score units. */
  float m[MT][2], l[MT][2];
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
    m[mt][0] = m[mt][1] = -INFINITY;
    l[mt][0] = l[mt][1] = 0.0f;
  }
  const bool warp_live = w0 < Tq;

  for (int n = 0; n < n_kv; n++) {
    const int k0 = n * BN, buf = ST == 2 ? (n & 1) : 0;
    const uint32_t kaddr = kaddr0 + buf * kTileBytes, vaddr = vaddr0 + buf * kTileBytes;
    if constexpr (ST == 1) {
      load_rows<BN, HD, NTHR>(sV, vb, ks, k0, Tk); /* V(n) overlaps S = Q K(n)^T */
      cp_async_commit();
    } else if (n + 1 < n_kv) { /* tile n+1 overlaps all of tile n */
      load_rows<BN, HD, NTHR>(sK + (buf ^ 1) * kTileBytes, kb, ks, k0 + BN, Tk);
      load_rows<BN, HD, NTHR>(sV + (buf ^ 1) * kTileBytes, vb, ks, k0 + BN, Tk);
      cp_async_commit();
    }
    /* Some key of the tile is visible from the warp's last row. */
    const bool active = warp_live && k0 <= w0 + WR - 1 + delta;
    float s[MT][NT][4];
    if (active) {
#pragma unroll
      for (int mt = 0; mt < MT; mt++) zero(s[mt]);
      gemm_qk<LD, KC, NT, MT, kQInRegs>(s, qf, qa, kaddr);
#pragma unroll
      for (int mt = 0; mt < MT; mt++) {
        const int r0 = w0 + mt * 16; /* first row of the 16-row block */
        /* crosses the diagonal (or, for a chunk, its last key) */
        if (k0 + BN - 1 > r0 + delta || (SPAN && k0 + BN > Tk)) {
#pragma unroll
          for (int nt = 0; nt < NT; nt++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
              const int col = k0 + nt * 8 + 2 * ci + (e & 1), row = r0 + gi + (e >> 1) * 8;
              if (col > row + delta || (SPAN && col >= Tk)) s[mt][nt][e] = -INFINITY;
            }
        }
        /* Online softmax; rows gi (e = 0, 1) and gi + 8 (e = 2, 3), each spread over the
         * 4 lanes of the row group. l stays a per-lane partial sum until the end. */
        float mx[2] = {m[mt][0], m[mt][1]};
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
          mx[0] = fmaxf(mx[0], fmaxf(s[mt][nt][0], s[mt][nt][1]));
          mx[1] = fmaxf(mx[1], fmaxf(s[mt][nt][2], s[mt][nt][3]));
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
          corr[r] = fast_exp2(m[mt][r] * sl2 - ms[r]); /* 0 on the first tile (m = -inf) */
          m[mt][r] = mx[r];
          l[mt][r] *= corr[r];
        }
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
          o[mt][dt][0] *= corr[0];
          o[mt][dt][1] *= corr[0];
          o[mt][dt][2] *= corr[1];
          o[mt][dt][3] *= corr[1];
        }
#pragma unroll
        for (int nt = 0; nt < NT; nt++) {
          s[mt][nt][0] = fast_exp2(fmaf(s[mt][nt][0], sl2, -ms[0]));
          s[mt][nt][1] = fast_exp2(fmaf(s[mt][nt][1], sl2, -ms[0]));
          s[mt][nt][2] = fast_exp2(fmaf(s[mt][nt][2], sl2, -ms[1]));
          s[mt][nt][3] = fast_exp2(fmaf(s[mt][nt][3], sl2, -ms[1]));
          l[mt][0] += s[mt][nt][0] + s[mt][nt][1];
          l[mt][1] += s[mt][nt][2] + s[mt][nt][3];
        }
      }
    }
    if constexpr (ST == 1) {
      cp_async_wait<0>(); /* V(n) has landed */
      __syncthreads();    /* ... for every thread, and no warp reads K(n) any more */
      if (n + 1 < n_kv) {
        load_rows<BN, HD, NTHR>(sK, kb, ks, k0 + BN, Tk); /* K(n+1) overlaps O += P V(n) */
        cp_async_commit();
      }
    }
    if (active) gemm_pv_mt<LD, NT, DT, MT>(o, s, vaddr);
    cp_async_wait<0>(); /* K(n+1) (and V(n+1) with 2 stages) has landed */
    __syncthreads();    /* ... for every thread, and no warp reads V(n) (K(n)) any more */
  }

  if (!warp_live) return;
  if constexpr (SPAN) {
    fwd_merge<HD, MT>(sp.acc, lse, o, m, l, b, h, nh, w0, Tq, sp.sq, sl2, gi, ci);
    return;
  }
  bf16 *ob = out + ((size_t)b * T * nh + h) * HD;
#pragma unroll
  for (int mt = 0; mt < MT; mt++) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
      l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 1);
      l[mt][r] += __shfl_xor_sync(0xffffffffu, l[mt][r], 2);
    }
#pragma unroll
    for (int r = 0; r < 2; r++) {
      const int row = w0 + mt * 16 + gi + r * 8;
      if (row >= T) continue;
      /* l > 0: key 0 is always visible */
      const float inv = l[mt][r] > 0.0f ? 1.0f / l[mt][r] : 0.0f;
      bf16 *orow = ob + (size_t)row * qs + 2 * ci;
#pragma unroll
      for (int dt = 0; dt < DT; dt++)
        *reinterpret_cast<__nv_bfloat162 *>(orow + dt * 8) =
            __floats2bfloat162_rn(o[mt][dt][2 * r] * inv, o[mt][dt][2 * r + 1] * inv);
      if (ci == 0)
        lse[((size_t)b * nh + h) * T + row] = (m[mt][r] * sl2 + log2f(l[mt][r])) * kLn2;
    }
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

template <int HD, int CFG>
__host__ __device__ constexpr size_t dkdv_smem_bytes() {
  constexpr DkdvCfg C = kDkdvCfgs[CFG];
  return (size_t)(2 * 16 * C.warps + 2 * C.stages * C.bm) * (HD + kPad) * sizeof(bf16) +
         (size_t)2 * C.stages * C.bm * sizeof(float);
}

/* Ring pipeline (both backward kernels; ST = 2 is plain double buffering): the prologue
 * commits one cp.async group per tile 0 .. ST-2, waits for tile 0 and syncs. Iteration
 * `it` starts tile it+ST-1 into buffer (it+ST-1) % ST = (it-1) % ST, which every warp has
 * finished reading (the barrier that ended iteration it-1), commits its group (for ST > 2
 * an empty one when no tile is left, so the count of groups stays exact; ST = 2 waits for
 * all), computes on buffer it % ST, then waits until at most ST-2 groups are pending
 * (tile it+1 has landed) and syncs (every thread's part of it is visible, and buffer
 * it % ST is free). */
template <int HD, int CFG, bool SPAN>
__global__ void __launch_bounds__(kDkdvCfgs[CFG].warps * 32, kDkdvCfgs[CFG].min_blocks)
    fa2_bwd_dkdv_kernel(bf16 *__restrict__ dk, bf16 *__restrict__ dv,
                        const bf16 *__restrict__ dout, const bf16 *__restrict__ q,
                        const bf16 *__restrict__ k, const bf16 *__restrict__ v,
                        const float *__restrict__ lse, const float *__restrict__ D, int T, int nh,
                        int nkv, float sl2, float scale, const Span sp) {
  constexpr DkdvCfg C = kDkdvCfgs[CFG];
  constexpr int BN = 16 * C.warps, BM = C.bm, LD = HD + kPad, NTHR = C.warps * 32;
  constexpr int KC = HD / 16, DT = HD / 8, NQ = BM / 8, ST = C.stages;
  constexpr uint32_t kTileBytes = BM * LD * 2;
  static_assert(BM % 16 == 0 && BM <= NTHR, "dkdv: BM a multiple of 16, one thread per query");
  static_assert(ST >= 2, "dkdv: at least double buffering");
  static_assert(dkdv_smem_bytes<HD, CFG>() <= kSmemMax, "dkdv: shared memory over the limit");
  extern __shared__ __align__(16) unsigned char smem[];
  /* K, V (BN rows); Q[ST], dO[ST] (BM rows); lse[ST], D[ST] (BM floats). */
  const uint32_t sK = smem_u32(smem), sV = sK + BN * LD * 2, sQ = sV + BN * LD * 2;
  const uint32_t sO = sQ + ST * kTileBytes;
  float *Ls = reinterpret_cast<float *>(smem + 2 * BN * LD * 2 + 2 * ST * kTileBytes);
  float *Ds = Ls + ST * BM;

  const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
  const int gi = lane >> 2, ci = lane & 3;
  const int kt = blockIdx.x, g = blockIdx.y, b = blockIdx.z, grp = nh / nkv;
  const int k0 = kt * BN, w0 = k0 + warp * 16;
  const int Tq = SPAN ? sp.tq : T, Tk = SPAN ? sp.tk : T, Sq = SPAN ? sp.sq : T;
  const int delta = SPAN ? sp.delta : 0;
  const size_t qs = (size_t)nh * HD, ks = (size_t)nkv * HD;
  const bf16 *kb = k + ((size_t)b * (SPAN ? sp.sk : T) * nkv + g) * HD;
  const bf16 *vb = v + ((size_t)b * (SPAN ? sp.sk : T) * nkv + g) * HD;
  /* Query tiles that see this key tile: from the one holding query k0 - delta (the first
   * that sees key k0) to the end. */
  const int qt0 = (SPAN ? max(0, k0 - delta) : k0) / BM, per_h = (Tq + BM - 1) / BM - qt0;
  const int n_it = grp * per_h;
  if (SPAN && per_h <= 0) return; /* every query of the chunk before the tile's keys */

  load_rows<BN, HD, NTHR>(sK, kb, ks, k0, Tk);
  load_rows<BN, HD, NTHR>(sV, vb, ks, k0, Tk);
  /* Iteration `it` covers query head g*grp + it/per_h, query tile qt0 + it%per_h. */
  auto load_iter = [&](int it, int buf) {
    const int h = g * grp + it / per_h, i0 = (qt0 + it % per_h) * BM;
    const size_t head = ((size_t)b * Sq * nh + h) * HD;
    load_rows<BM, HD, NTHR>(sQ + buf * kTileBytes, q + head, qs, i0, Tq);
    load_rows<BM, HD, NTHR>(sO + buf * kTileBytes, dout + head, qs, i0, Tq);
    const int tid = (int)threadIdx.x;
    if (tid < BM) {
      const size_t lrow = ((size_t)b * nh + h) * Sq;
      const bool ok = i0 + tid < Tq;
      cp_async4(smem_u32(Ls + buf * BM + tid), ok ? lse + lrow + i0 + tid : lse, ok);
      cp_async4(smem_u32(Ds + buf * BM + tid), ok ? D + lrow + i0 + tid : D, ok);
    }
  };
#pragma unroll
  for (int s = 0; s < ST - 1; s++) { /* K and V ride in the first group; n_it >= 1 */
    if (s == 0 || s < n_it) load_iter(s, s);
    cp_async_commit();
  }
  cp_async_wait<ST - 2>();
  __syncthreads();

  float dka[DT][4], dva[DT][4];
  zero(dka);
  zero(dva);
  const bool warp_live = w0 < Tk;
  const uint32_t ka = at<LD>(sK, warp * 16, 0) + off_a<LD>(lane);
  const uint32_t va = at<LD>(sV, warp * 16, 0) + off_a<LD>(lane);

  for (int it = 0; it < n_it; it++) {
    const int buf = ST == 2 ? it & 1 : it % ST;
    if (it + ST - 1 < n_it) /* ring pipeline above */
      load_iter(it + ST - 1, ST == 2 ? buf ^ 1 : (it + ST - 1) % ST);
    if (ST > 2 || it + ST - 1 < n_it) cp_async_commit(); /* ST = 2: wait<0> needs none */
    const int i0 = (qt0 + it % per_h) * BM;
    /* Some query of the tile sees the warp's first key. */
    if (warp_live && i0 + BM - 1 + delta >= w0) {
      const uint32_t qa = sQ + buf * kTileBytes, oa = sO + buf * kTileBytes;
      const float *Lb = Ls + buf * BM, *Db = Ds + buf * BM;
      /* S^T = K Q^T: rows are this warp's keys, columns the tile's queries. */
      float s[NQ][4];
      zero(s);
      gemm_abt_smem<LD, KC, NQ>(s, ka, qa + off_bnk<LD>(lane));
      const bool need_mask = i0 + delta < w0 + 15 || i0 + BM > Tq;
#pragma unroll
      for (int nt = 0; nt < NQ; nt++) {
        const float2 L = *reinterpret_cast<const float2 *>(Lb + nt * 8 + 2 * ci);
        float l0 = L.x * kLog2e, l1 = L.y * kLog2e;
        if (SPAN) { /* an empty row (lse -inf): p = 2^(s - inf) = 0 */
          l0 = L.x == -INFINITY ? INFINITY : l0;
          l1 = L.y == -INFINITY ? INFINITY : l1;
        }
        s[nt][0] = fast_exp2(fmaf(s[nt][0], sl2, -l0));
        s[nt][1] = fast_exp2(fmaf(s[nt][1], sl2, -l1));
        s[nt][2] = fast_exp2(fmaf(s[nt][2], sl2, -l0));
        s[nt][3] = fast_exp2(fmaf(s[nt][3], sl2, -l1));
        if (need_mask) {
#pragma unroll
          for (int e = 0; e < 4; e++) {
            const int col = i0 + nt * 8 + 2 * ci + (e & 1), row = w0 + gi + (e >> 1) * 8;
            if (col < row - delta || col >= Tq) s[nt][e] = 0.0f;
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
    cp_async_wait<ST - 2>(); /* the next tile has landed */
    __syncthreads();         /* ... for every thread, and this buffer is not read again */
  }

  if (!warp_live) return;
  const size_t kvo = ((size_t)b * (SPAN ? sp.sk : T) * nkv + g) * HD;
  bf16 *dkb = dk + kvo, *dvb = dv + kvo;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = w0 + gi + r * 8;
    if (row >= Tk) continue;
    const size_t off = (size_t)row * ks + 2 * ci;
#pragma unroll
    for (int dt = 0; dt < DT; dt++) {
      add_pair(dkb + off + dt * 8, dka[dt][2 * r] * scale, dka[dt][2 * r + 1] * scale);
      add_pair(dvb + off + dt * 8, dva[dt][2 * r], dva[dt][2 * r + 1]);
    }
  }
}

/* ---- backward: dQ (one block per query tile and head) -------------------------------- */

template <int HD, int CFG>
__host__ __device__ constexpr size_t dq_smem_bytes() {
  constexpr DqCfg C = kDqCfgs[CFG];
  return (size_t)(2 * 16 * C.warps + 2 * C.stages * C.bn) * (HD + kPad) * sizeof(bf16);
}

template <int HD, int CFG, bool SPAN>
__global__ void __launch_bounds__(kDqCfgs[CFG].warps * 32, kDqCfgs[CFG].min_blocks)
    fa2_bwd_dq_kernel(bf16 *__restrict__ dq, const bf16 *__restrict__ dout,
                      const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                      const bf16 *__restrict__ v, const float *__restrict__ lse,
                      const float *__restrict__ D, int T, int nh, int nkv, float sl2,
                      float scale, const Span sp) {
  constexpr DqCfg C = kDqCfgs[CFG];
  constexpr int BM = 16 * C.warps, BN = C.bn, LD = HD + kPad, NTHR = C.warps * 32;
  constexpr int KC = HD / 16, DT = HD / 8, NT = BN / 8, ST = C.stages;
  constexpr uint32_t kTileBytes = BN * LD * 2;
  static_assert(BN % 16 == 0 && ST >= 2, "dq: BN a multiple of 16, at least double buffering");
  static_assert(dq_smem_bytes<HD, CFG>() <= kSmemMax, "dq: shared memory over the limit");
  extern __shared__ __align__(16) unsigned char smem[];
  /* Q, dO (BM rows); K[ST], V[ST] (BN rows). */
  const uint32_t sQ = smem_u32(smem), sO = sQ + BM * LD * 2, sK = sO + BM * LD * 2;
  const uint32_t sV = sK + ST * kTileBytes;

  const int warp = (int)threadIdx.x >> 5, lane = (int)threadIdx.x & 31;
  const int gi = lane >> 2, ci = lane & 3;
  const int qt = (int)gridDim.x - 1 - (int)blockIdx.x; /* heavy (late) tiles first */
  const int h = blockIdx.y, b = blockIdx.z, g = h / (nh / nkv);
  const int q0 = qt * BM, w0 = q0 + warp * 16;
  const int Tq = SPAN ? sp.tq : T, Tk = SPAN ? sp.tk : T, Sq = SPAN ? sp.sq : T;
  const int delta = SPAN ? sp.delta : 0;
  const size_t qs = (size_t)nh * HD, ks = (size_t)nkv * HD;
  const size_t head = ((size_t)b * Sq * nh + h) * HD;
  const bf16 *kb = k + ((size_t)b * (SPAN ? sp.sk : T) * nkv + g) * HD;
  const bf16 *vb = v + ((size_t)b * (SPAN ? sp.sk : T) * nkv + g) * HD;
  const int kv_end = min(Tk, q0 + BM + delta), n_kv = (kv_end + BN - 1) / BN;
  if (SPAN && kv_end <= 0) return; /* every key of the chunk after the block's queries */

  /* Ring pipeline as in dkdv; Q and dO ride in the first group. */
  load_rows<BM, HD, NTHR>(sQ, q + head, qs, q0, Tq);
  load_rows<BM, HD, NTHR>(sO, dout + head, qs, q0, Tq);
#pragma unroll
  for (int s = 0; s < ST - 1; s++) {
    if (s == 0 || s < n_kv) { /* n_kv >= 1 */
      load_rows<BN, HD, NTHR>(sK + s * kTileBytes, kb, ks, s * BN, Tk);
      load_rows<BN, HD, NTHR>(sV + s * kTileBytes, vb, ks, s * BN, Tk);
    }
    cp_async_commit();
  }

  /* This lane's rows w0 + gi and w0 + gi + 8: lse (base 2) and D; 0 past the chunk (such
   * rows are computed on zero inputs and never stored); +inf for an empty row of a span
   * (lse -inf), whose p = 2^(s - inf) is then 0. */
  const size_t lrow = ((size_t)b * nh + h) * Sq;
  float L[2], Dr[2];
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = w0 + gi + r * 8;
    L[r] = row < Tq ? lse[lrow + row] * kLog2e : 0.0f;
    if (SPAN && L[r] == -INFINITY) L[r] = INFINITY;
    Dr[r] = row < Tq ? D[lrow + row] : 0.0f;
  }
  cp_async_wait<ST - 2>(); /* Q, dO and K / V tile 0 have landed (ring pipeline above) */
  __syncthreads();

  /* dO fragments live in registers; Q's too when the configuration has room for them
   * (HD <= q_regs_hd); otherwise Q is re-read from shared memory per key tile (one extra
   * ldmatrix per 16 dims, shared by the tile's NT/2 B loads). */
  constexpr bool kQInRegs = HD <= C.q_regs_hd;
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
  const bool warp_live = w0 < Tq;

  for (int n = 0; n < n_kv; n++) {
    const int buf = ST == 2 ? n & 1 : n % ST, k0 = n * BN;
    if (n + ST - 1 < n_kv) {
      const int nb = ST == 2 ? buf ^ 1 : (n + ST - 1) % ST, k1 = k0 + (ST - 1) * BN;
      load_rows<BN, HD, NTHR>(sK + nb * kTileBytes, kb, ks, k1, Tk);
      load_rows<BN, HD, NTHR>(sV + nb * kTileBytes, vb, ks, k1, Tk);
    }
    if (ST > 2 || n + ST - 1 < n_kv) cp_async_commit(); /* ST = 2: wait<0> needs none */
    if (warp_live && k0 <= w0 + 15 + delta) {
      const uint32_t kt = sK + buf * kTileBytes, vt = sV + buf * kTileBytes;
      float s[NT][4], dp[NT][4];
      zero(s);
      zero(dp);
      if constexpr (kQInRegs)
        gemm_abt_reg<LD, KC, NT>(s, qf, kt + off_bnk<LD>(lane));
      else
        gemm_abt_smem<LD, KC, NT>(s, qa, kt + off_bnk<LD>(lane));
      gemm_abt_reg<LD, KC, NT>(dp, of, vt + off_bnk<LD>(lane));
      const bool need_mask = k0 + BN - 1 > w0 + delta || (SPAN && k0 + BN > Tk);
      /* dS = P (dP - D), P = exp2(S sl2 - lse2), into s. */
#pragma unroll
      for (int nt = 0; nt < NT; nt++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
          const int r = e >> 1;
          float p = fast_exp2(fmaf(s[nt][e], sl2, -L[r]));
          if (need_mask && (k0 + nt * 8 + 2 * ci + (e & 1) > w0 + gi + r * 8 + delta ||
                            (SPAN && k0 + nt * 8 + 2 * ci + (e & 1) >= Tk)))
            p = 0.0f;
          s[nt][e] = p * (dp[nt][e] - Dr[r]);
        }
      /* dQ += dS K (scale applied at the end). */
      gemm_pv<LD, NT, DT>(dqa, s, kt + off_bkn<LD>(lane));
    }
    cp_async_wait<ST - 2>(); /* the next K, V tiles have landed */
    __syncthreads();         /* ... for every thread, and this buffer is not read again */
  }

  if (!warp_live) return;
  bf16 *dqb = dq + head;
#pragma unroll
  for (int r = 0; r < 2; r++) {
    const int row = w0 + gi + r * 8;
    if (row >= Tq) continue;
    bf16 *drow = dqb + (size_t)row * qs + 2 * ci;
#pragma unroll
    for (int dt = 0; dt < DT; dt++)
      add_pair(drow + dt * 8, dqa[dt][2 * r] * scale, dqa[dt][2 * r + 1] * scale);
  }
}

/* ---- configuration choice ------------------------------------------------------------- */

constexpr int kNumKernels = 3; /* MP_FA2_FWD, MP_FA2_DKDV, MP_FA2_DQ (attention_hooks.h) */
constexpr int kNumCfgs[kNumKernels] = {kNumFwdCfgs, kNumDkdvCfgs, kNumDqCfgs};
const char *const kCfgEnv[kNumKernels] = {"MP_ATTENTION_FWD_CFG", "MP_ATTENTION_DKDV_CFG",
                                          "MP_ATTENTION_DQ_CFG"};
const char *const kKernelName[kNumKernels] = {"forward", "dK/dV", "dQ"};

/* mp_cuda_attention_fa2_force_config: -1 = follow the environment. */
std::atomic<int> g_forced_cfg[kNumKernels] = {{-1}, {-1}, {-1}};
/* mp_cuda_attention_fa2_bwd_kernels: the backward kernels to launch, 0 = all. */
std::atomic<unsigned> g_bwd_mask{0};

/* The environment's choice for `kernel`, read once: -2 when unset or empty (the tuned
 * default), -1 when not an index of a compiled configuration (an error at every call, so
 * a typo in a sweep is not silently the default). */
int env_config(int kernel) {
  static const std::array<int, kNumKernels> choice = [] {
    std::array<int, kNumKernels> c;
    for (int i = 0; i < kNumKernels; i++) {
      const char *e = getenv(kCfgEnv[i]);
      char *end = NULL;
      const long v = e && *e ? strtol(e, &end, 10) : 0;
      c[i] = !(e && *e) ? -2 : *end != '\0' || v < 0 || v >= kNumCfgs[i] ? -1 : (int)v;
    }
    return c;
  }();
  return choice[kernel];
}

/* The fastest configuration per kernel and head dim measured by bench/attention_bench on
 * an H100 80GB HBM3 (2026-11-22; B4 T2048 nh16 nkv8 hd128 and B8 T2048 nh32 nkv8 hd64,
 * causal): hd 128 forward 6 (238 vs 184 TF/s for row 0), dQ 1; hd 64 forward 2, dK/dV 1,
 * dQ 2. Other head dims (and devices not measured) run row 0. */
int tuned_default(int kernel, int hd) {
  static const int k128[kNumKernels] = {6, 0, 1}, k64[kNumKernels] = {2, 1, 2};
  return hd == 128 ? k128[kernel] : hd == 64 ? k64[kernel] : 0;
}

/* Sets *cfg to the configuration `kernel` runs with at head dim hd. */
mp_status choose_config(mp_kctx *kc, int kernel, int hd, int *cfg) {
  int c = g_forced_cfg[kernel].load();
  if (c < 0) {
    c = env_config(kernel);
    if (c == -2) c = tuned_default(kernel, hd);
  }
  if (c < 0)
    return mp_error(kc->err, MP_ERR_INVALID, "attention %s: %s=%s is not a configuration of "
                    "the tensor-core kernel; set it to 0..%d (bench/attention_bench lists "
                    "them) or unset it", kKernelName[kernel], kCfgEnv[kernel],
                    getenv(kCfgEnv[kernel]), kNumCfgs[kernel] - 1);
  *cfg = tuned_hd(hd) ? c : 0;
  return MP_OK;
}

/* ---- launchers ------------------------------------------------------------------------ */

/* Opts `kernel` into `bytes` of dynamic shared memory (> 48 KB needs it) and asks for the
 * largest shared-memory carveout, so two backward blocks (~103 KB each at HD 128) fit on
 * one H100 SM. Attributes are per device, so this runs on every call (it is cheap). A
 * configuration over the device's per-block limit (sm_80: 163 KB) is an error that names
 * it, not a failed launch. */
template <class Kernel>
mp_status set_smem(mp_kctx *kc, Kernel *kernel, size_t bytes, int which, int cfg) {
  int optin = 0;
  MP_CUDA_CHECK(kc, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                           kc->device));
  if (bytes > (size_t)optin)
    return mp_error(kc->err, MP_ERR_UNSUPPORTED, "attention %s: configuration %d needs %zu "
                    "bytes of shared memory per block, cuda device %d allows %d; choose "
                    "another %s", kKernelName[which], cfg, bytes, kc->device, optin,
                    kCfgEnv[which]);
  MP_CUDA_CHECK(kc, cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)bytes));
  MP_CUDA_CHECK(kc, cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                         (int)cudaSharedmemCarveoutMaxShared));
  return MP_OK;
}

/* The kernel, its dynamic shared memory and its block size for (kernel, HD, CFG), so the
 * launchers and mp_cuda_attention_fa2_config_info read one place. */
template <int HD, int CFG>
struct FwdKernel {
  static constexpr auto fn = fa2_fwd_kernel<HD, CFG, false>;
  static constexpr size_t smem = fwd_smem_bytes<HD, CFG>();
  static constexpr int threads = kFwdCfgs[CFG].warps * 32,
                       rows = 16 * kFwdCfgs[CFG].mt * kFwdCfgs[CFG].warps;
};
template <int HD, int CFG>
struct DkdvKernel {
  static constexpr auto fn = fa2_bwd_dkdv_kernel<HD, CFG, false>;
  static constexpr size_t smem = dkdv_smem_bytes<HD, CFG>();
  static constexpr int threads = kDkdvCfgs[CFG].warps * 32, rows = 16 * kDkdvCfgs[CFG].warps;
};
template <int HD, int CFG>
struct DqKernel {
  static constexpr auto fn = fa2_bwd_dq_kernel<HD, CFG, false>;
  static constexpr size_t smem = dq_smem_bytes<HD, CFG>();
  static constexpr int threads = kDqCfgs[CFG].warps * 32, rows = 16 * kDqCfgs[CFG].warps;
};

/* Calls F<HD, CFG>::run(args...) for the run-time cfg (< kNumCfgs of F's kernel; HD
 * outside tuned_hd has only configuration 0 compiled). */
template <template <int, int> class F, int HD, int N, int CFG = 0, class... Args>
mp_status dispatch(int cfg, Args... args) {
  if constexpr (CFG + 1 < (tuned_hd(HD) ? N : 1))
    if (cfg != CFG) return dispatch<F, HD, N, CFG + 1>(cfg, args...);
  return F<HD, CFG>::run(args...);
}

/* The launchers: sp NULL runs the monolithic kernel on T rows, else the SPAN variant on
 * the chunks sp describes (tensors already offset to their first rows; T unused). The
 * grid covers the query rows (fwd, dq) or the key rows (dkdv). */
template <int HD, int CFG>
struct LaunchFwd {
  static mp_status run(mp_kctx *kc, bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                       const bf16 *v, int B, int T, int nh, int nkv, const Span *sp) {
    using K = FwdKernel<HD, CFG>;
    const auto fn = sp ? fa2_fwd_kernel<HD, CFG, true> : K::fn;
    MP_CHECK(set_smem(kc, fn, K::smem, MP_FA2_FWD, CFG));
    const int rows = sp ? sp->tq : T;
    dim3 grid((unsigned)((rows + K::rows - 1) / K::rows), (unsigned)nh, (unsigned)B);
    fn<<<grid, K::threads, K::smem, mp_cuda_impl_of(kc)->stream>>>(
        out, lse, q, k, v, T, nh, nkv, kLog2e / sqrtf((float)HD), sp ? *sp : Span{});
    MP_CUDA_LAUNCH_CHECK(kc);
    return MP_OK;
  }
};

template <int HD, int CFG>
struct LaunchDkdv {
  static mp_status run(mp_kctx *kc, bf16 *dk, bf16 *dv, const bf16 *dout, const bf16 *q,
                       const bf16 *k, const bf16 *v, const float *lse, const float *D, int B,
                       int T, int nh, int nkv, const Span *sp) {
    using K = DkdvKernel<HD, CFG>;
    const auto fn = sp ? fa2_bwd_dkdv_kernel<HD, CFG, true> : K::fn;
    MP_CHECK(set_smem(kc, fn, K::smem, MP_FA2_DKDV, CFG));
    const float scale = 1.0f / sqrtf((float)HD), sl2 = kLog2e * scale;
    const int rows = sp ? sp->tk : T;
    dim3 grid((unsigned)((rows + K::rows - 1) / K::rows), (unsigned)nkv, (unsigned)B);
    fn<<<grid, K::threads, K::smem, mp_cuda_impl_of(kc)->stream>>>(
        dk, dv, dout, q, k, v, lse, D, T, nh, nkv, sl2, scale, sp ? *sp : Span{});
    MP_CUDA_LAUNCH_CHECK(kc);
    return MP_OK;
  }
};

template <int HD, int CFG>
struct LaunchDq {
  static mp_status run(mp_kctx *kc, bf16 *dq, const bf16 *dout, const bf16 *q, const bf16 *k,
                       const bf16 *v, const float *lse, const float *D, int B, int T, int nh,
                       int nkv, const Span *sp) {
    using K = DqKernel<HD, CFG>;
    const auto fn = sp ? fa2_bwd_dq_kernel<HD, CFG, true> : K::fn;
    MP_CHECK(set_smem(kc, fn, K::smem, MP_FA2_DQ, CFG));
    const float scale = 1.0f / sqrtf((float)HD), sl2 = kLog2e * scale;
    const int rows = sp ? sp->tq : T;
    dim3 grid((unsigned)((rows + K::rows - 1) / K::rows), (unsigned)nh, (unsigned)B);
    fn<<<grid, K::threads, K::smem, mp_cuda_impl_of(kc)->stream>>>(
        dq, dout, q, k, v, lse, D, T, nh, nkv, sl2, scale, sp ? *sp : Span{});
    MP_CUDA_LAUNCH_CHECK(kc);
    return MP_OK;
  }
};

template <int HD>
mp_status launch_fwd(mp_kctx *kc, bf16 *out, float *lse, const bf16 *q, const bf16 *k,
                     const bf16 *v, int B, int T, int nh, int nkv, const Span *sp) {
  int cfg = 0;
  MP_CHECK(choose_config(kc, MP_FA2_FWD, HD, &cfg));
  return dispatch<LaunchFwd, HD, kNumFwdCfgs>(cfg, kc, out, lse, q, k, v, B, T, nh, nkv, sp);
}

/* The span backward: dK/dV then dQ of one pair, D given (span_dot). */
template <int HD>
mp_status launch_span_bwd(mp_kctx *kc, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
                          const bf16 *q, const bf16 *k, const bf16 *v, const float *lse,
                          const float *D, int B, int nh, int nkv, const Span *sp) {
  int cfg_kv = 0, cfg_q = 0;
  MP_CHECK(choose_config(kc, MP_FA2_DKDV, HD, &cfg_kv));
  MP_CHECK(choose_config(kc, MP_FA2_DQ, HD, &cfg_q));
  MP_CHECK((dispatch<LaunchDkdv, HD, kNumDkdvCfgs>(cfg_kv, kc, dk, dv, dout, q, k, v, lse, D, B,
                                                     0, nh, nkv, sp)));
  return dispatch<LaunchDq, HD, kNumDqCfgs>(cfg_q, kc, dq, dout, q, k, v, lse, D, B, 0, nh, nkv,
                                            sp);
}

template <int HD>
mp_status launch_bwd(mp_kctx *kc, bf16 *dq, bf16 *dk, bf16 *dv, const bf16 *dout,
                     const bf16 *q, const bf16 *k, const bf16 *v, const bf16 *out,
                     const float *lse, int B, int T, int nh, int nkv) {
  int cfg_kv = 0, cfg_q = 0;
  MP_CHECK(choose_config(kc, MP_FA2_DKDV, HD, &cfg_kv));
  MP_CHECK(choose_config(kc, MP_FA2_DQ, HD, &cfg_q));
  const unsigned mask = g_bwd_mask.load();
  cudaStream_t st = mp_cuda_impl_of(kc)->stream;
  const size_t n_rows = (size_t)B * T * nh;
  float *D = NULL;
  MP_CHECK(mp_cuda_scratch(kc, n_rows * sizeof(float), (void **)&D));

  if (!mask || (mask & (1u << MP_FA2_DOT))) {
    fa2_bwd_dot_kernel<<<(unsigned)((n_rows + kDotWarps - 1) / kDotWarps), kDotWarps * 32, 0,
                         st>>>(D, dout, out, T, nh, HD, n_rows);
    MP_CUDA_LAUNCH_CHECK(kc);
  }
  const Span *mono = NULL;
  if (!mask || (mask & (1u << MP_FA2_DKDV)))
    MP_CHECK((dispatch<LaunchDkdv, HD, kNumDkdvCfgs>(cfg_kv, kc, dk, dv, dout, q, k, v, lse, D,
                                                       B, T, nh, nkv, mono)));
  if (!mask || (mask & (1u << MP_FA2_DQ)))
    MP_CHECK((dispatch<LaunchDq, HD, kNumDqCfgs>(cfg_q, kc, dq, dout, q, k, v, lse, D, B, T,
                                                   nh, nkv, mono)));
  return MP_OK;
}

/* ---- configuration info (the bench's table) ------------------------------------------- */

struct CfgInfo {
  const void *fn;
  size_t smem;
  int threads;
};

template <template <int, int> class K, int HD, int CFG>
struct InfoOf {
  static mp_status run(CfgInfo *info) {
    info->fn = (const void *)K<HD, CFG>::fn;
    info->smem = K<HD, CFG>::smem;
    info->threads = K<HD, CFG>::threads;
    return MP_OK;
  }
};
template <int HD, int CFG> using FwdInfo = InfoOf<FwdKernel, HD, CFG>;
template <int HD, int CFG> using DkdvInfo = InfoOf<DkdvKernel, HD, CFG>;
template <int HD, int CFG> using DqInfo = InfoOf<DqKernel, HD, CFG>;

template <int HD>
void info_of(int kernel, int cfg, CfgInfo *info) {
  if (kernel == MP_FA2_FWD) dispatch<FwdInfo, HD, kNumFwdCfgs>(cfg, info);
  else if (kernel == MP_FA2_DKDV) dispatch<DkdvInfo, HD, kNumDkdvCfgs>(cfg, info);
  else dispatch<DqInfo, HD, kNumDqCfgs>(cfg, info);
}

/* "BM128 BN64 8w Qreg 1st": the configuration's row, as the bench prints it. */
void describe(int kernel, int cfg, int hd, char *buf, size_t n) {
  if (kernel == MP_FA2_FWD) {
    const FwdCfg &c = kFwdCfgs[cfg];
    snprintf(buf, n, "BM%d BN%d %dw%s Q%s %dst", 16 * c.mt * c.warps, c.bn, c.warps,
             c.mt > 1 ? "x32" : "", hd <= c.q_regs_hd ? "reg" : "smem", c.stages);
  } else if (kernel == MP_FA2_DKDV) {
    const DkdvCfg &c = kDkdvCfgs[cfg];
    snprintf(buf, n, "BN%d BM%d %dw %dst", 16 * c.warps, c.bm, c.warps, c.stages);
  } else {
    const DqCfg &c = kDqCfgs[cfg];
    snprintf(buf, n, "BM%d BN%d %dw Q%s %dst", 16 * c.warps, c.bn, c.warps,
             hd <= c.q_regs_hd ? "reg" : "smem", c.stages);
  }
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
  const Span *mono = NULL;
  switch (hd) {
    case 32: return launch_fwd<32>(kc, O, lse, Q, K, V, B, T, nh, nkv, mono);
    case 64: return launch_fwd<64>(kc, O, lse, Q, K, V, B, T, nh, nkv, mono);
    case 96: return launch_fwd<96>(kc, O, lse, Q, K, V, B, T, nh, nkv, mono);
    case 128: return launch_fwd<128>(kc, O, lse, Q, K, V, B, T, nh, nkv, mono);
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

namespace {

/* The kernels' view of sp: chunk sizes, batch strides, delta = q_pos - kv_pos. */
Span span_of(const mp_attn_span *sp, float *acc) {
  Span s;
  s.tq = sp->Tq;
  s.tk = sp->Tk;
  s.sq = sp->Sq;
  s.sk = sp->Sk;
  s.delta = (int)((long long)sp->q_pos - sp->kv_pos);
  s.acc = acc;
  return s;
}

}  // namespace

mp_status mp_cuda_attention_fa2_span_forward(mp_kctx *kc, float *acc, float *lse, const void *q,
                                             const void *k, const void *v,
                                             const mp_attn_span *sp) {
  const size_t qo = (size_t)sp->q_row * sp->nh * sp->hd, ko = (size_t)sp->kv_row * sp->nkv * sp->hd;
  const Span s = span_of(sp, acc + qo);
  const bf16 *Q = (const bf16 *)q + qo, *K = (const bf16 *)k + ko, *V = (const bf16 *)v + ko;
  float *L = lse + sp->q_row;
  const int B = sp->B, nh = sp->nh, nkv = sp->nkv;
  switch (sp->hd) {
    case 32: return launch_fwd<32>(kc, NULL, L, Q, K, V, B, 0, nh, nkv, &s);
    case 64: return launch_fwd<64>(kc, NULL, L, Q, K, V, B, 0, nh, nkv, &s);
    case 96: return launch_fwd<96>(kc, NULL, L, Q, K, V, B, 0, nh, nkv, &s);
    case 128: return launch_fwd<128>(kc, NULL, L, Q, K, V, B, 0, nh, nkv, &s);
  }
  return mp_error(kc->err, MP_ERR_INTERNAL, "attention_span_forward: tensor-core kernel "
                  "called with head dim %d; attention.cu must check "
                  "mp_cuda_attention_fa2_supports", sp->hd);
}

mp_status mp_cuda_attention_fa2_span_backward(mp_kctx *kc, void *dq, void *dk, void *dv,
                                              const void *dout, const void *q, const void *k,
                                              const void *v, const float *lse, const float *D,
                                              const mp_attn_span *sp) {
  const size_t qo = (size_t)sp->q_row * sp->nh * sp->hd, ko = (size_t)sp->kv_row * sp->nkv * sp->hd;
  const Span s = span_of(sp, NULL);
  bf16 *dQ = (bf16 *)dq + qo, *dK = (bf16 *)dk + ko, *dV = (bf16 *)dv + ko;
  const bf16 *dO = (const bf16 *)dout + qo, *Q = (const bf16 *)q + qo, *K = (const bf16 *)k + ko,
             *V = (const bf16 *)v + ko;
  const float *L = lse + sp->q_row, *Dq = D + sp->q_row;
  const int B = sp->B, nh = sp->nh, nkv = sp->nkv;
  switch (sp->hd) {
    case 32: return launch_span_bwd<32>(kc, dQ, dK, dV, dO, Q, K, V, L, Dq, B, nh, nkv, &s);
    case 64: return launch_span_bwd<64>(kc, dQ, dK, dV, dO, Q, K, V, L, Dq, B, nh, nkv, &s);
    case 96: return launch_span_bwd<96>(kc, dQ, dK, dV, dO, Q, K, V, L, Dq, B, nh, nkv, &s);
    case 128: return launch_span_bwd<128>(kc, dQ, dK, dV, dO, Q, K, V, L, Dq, B, nh, nkv, &s);
  }
  return mp_error(kc->err, MP_ERR_INTERNAL, "attention_span_backward: tensor-core kernel "
                  "called with head dim %d; attention.cu must check "
                  "mp_cuda_attention_fa2_supports", sp->hd);
}

mp_status mp_cuda_attention_dot(mp_kctx *kc, float *D, const void *dout, const void *out, int B,
                                int S, int nh, int hd) {
  const size_t n_rows = (size_t)B * S * nh;
  fa2_bwd_dot_kernel<<<(unsigned)((n_rows + kDotWarps - 1) / kDotWarps), kDotWarps * 32, 0,
                       mp_cuda_impl_of(kc)->stream>>>(D, (const bf16 *)dout, (const bf16 *)out, S,
                                                      nh, hd, n_rows);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

/* ---- tuning hooks (C linkage; cuda_internal.h) ----------------------------------------- */

extern "C" int mp_cuda_attention_fa2_n_configs(int kernel) {
  return kernel >= 0 && kernel < kNumKernels ? kNumCfgs[kernel] : 0;
}

extern "C" int mp_cuda_attention_fa2_config(int kernel) {
  if (kernel < 0 || kernel >= kNumKernels) return -1;
  const int c = g_forced_cfg[kernel].load();
  return c >= 0 ? c : env_config(kernel);
}

extern "C" void mp_cuda_attention_fa2_force_config(int kernel, int cfg) {
  if (kernel >= 0 && kernel < kNumKernels)
    g_forced_cfg[kernel].store(cfg >= 0 && cfg < kNumCfgs[kernel] ? cfg : -1);
}

extern "C" void mp_cuda_attention_fa2_bwd_kernels(unsigned mask) { g_bwd_mask.store(mask); }

extern "C" mp_status mp_cuda_attention_fa2_config_info(mp_kctx *kc, int kernel, int cfg, int hd,
                                                       char *desc, size_t desc_bytes,
                                                       int *regs, int *smem_bytes,
                                                       int *local_bytes, int *blocks_per_sm) {
  if (kernel < 0 || kernel >= kNumKernels || cfg < 0 || cfg >= kNumCfgs[kernel] ||
      !tuned_hd(hd))
    return mp_error(kc->err, MP_ERR_INVALID, "attention config info: no configuration %d of "
                    "kernel %d at head dim %d (kernels 0..%d, head dims 64 and 128)", cfg,
                    kernel, hd, kNumKernels - 1);
  if (desc && desc_bytes) describe(kernel, cfg, hd, desc, desc_bytes);
  CfgInfo info = {NULL, 0, 0};
  if (hd == 64) info_of<64>(kernel, cfg, &info);
  else info_of<128>(kernel, cfg, &info);
  cudaFuncAttributes attr;
  MP_CUDA_CHECK(kc, cudaFuncGetAttributes(&attr, info.fn));
  int blocks = 0, optin = 0;
  MP_CUDA_CHECK(kc, cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin,
                                           kc->device));
  if (info.smem <= (size_t)optin) {
    MP_CUDA_CHECK(kc, cudaFuncSetAttribute(info.fn, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           (int)info.smem));
    MP_CUDA_CHECK(kc, cudaFuncSetAttribute(info.fn,
                                           cudaFuncAttributePreferredSharedMemoryCarveout,
                                           (int)cudaSharedmemCarveoutMaxShared));
    MP_CUDA_CHECK(kc, cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, info.fn,
                                                                    info.threads, info.smem));
  }
  if (regs) *regs = attr.numRegs;
  if (smem_bytes) *smem_bytes = (int)info.smem;
  if (local_bytes) *local_bytes = (int)attr.localSizeBytes;
  if (blocks_per_sm) *blocks_per_sm = blocks;
  return MP_OK;
}
