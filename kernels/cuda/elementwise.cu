/* Elementwise CUDA kernels: X<->fp32 conversion, embedding lookup and its scatter-add,
 * GELU (tanh), SwiGLU, residual add and the accumulations (kernels/ops.h contracts).
 *
 * Every op loads bf16 into fp32, computes in fp32 with the same formula as the CPU
 * reference (kernels/cpu/gelu.c, swiglu.c), and rounds once on store; a += on an X tensor
 * reads the old bf16 value, adds in fp32 and rounds once. The embedding backward adds into
 * fp32 dwte with atomicAdd (repeated tokens add in an unspecified order: fp32 rounding
 * differences only, not determinism of the set of contributions).
 *
 * Bandwidth. These ops do a few flops per byte, so they are bound by HBM traffic. The
 * activation, residual and accumulation ops therefore have two paths with one per-element
 * function (so both give the same bits): a vector path, one thread per 8 consecutive
 * elements moved as 16-byte loads and stores (mp_ld8 / mp_st8), taken when every pointer
 * is 16-byte aligned, with the last n % 8 elements done by the first threads of block 0;
 * and a grid-stride scalar path for any other alignment. The vector grid has
 * one thread per vector (up to the 65535-block cap, then a grid-stride loop), which keeps
 * 2048 threads x 16-48 bytes in flight per SM: enough to cover HBM latency on H100.
 *
 * Fused amax (swiglu_forward_amax, swiglu_backward_amax; ops.h). The SwiGLU kernels are
 * templates on kAmax: the plain instantiation is the op of ops.h; the fused one runs the
 * same paths (vector with its scalar tail, or scalar) and also keeps the max of the bf16
 * patterns each thread stores, reduced per block and combined into the zeroed amax slot
 * with one atomicMax per block (cuda_kernels.cuh, fused amax). So a float8 scale costs no
 * extra pass over the output, and the result is f8_amax's bit for bit. */
#include <math.h>

#include "kernels/cuda/cuda_kernels.cuh"

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

__global__ void k_x_from_f32(mp_bf16 *dst, const float *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    mp_stx(dst, i, src[i]);
}

__global__ void k_x_to_f32(float *dst, const mp_bf16 *src, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    dst[i] = mp_ldx(src, i);
}

mp_status mp_cuda_x_from_f32(mp_kctx *kc, void *dst_x, const float *src, size_t n) {
  if (n == 0) return MP_OK;
  k_x_from_f32<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)dst_x, src, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_x_to_f32(mp_kctx *kc, float *dst, const void *src_x, size_t n) {
  if (n == 0) return MP_OK;
  k_x_to_f32<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      dst, (const mp_bf16 *)src_x, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

/* ---- embedding -------------------------------------------------------------------- */

__global__ void k_embedding_forward(mp_bf16 *out, const int32_t *tokens, const mp_bf16 *wte,
                                    int N, int C, int vs, int ve) {
  size_t total = (size_t)N * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t n = i / C, c = i % C;
    int t = tokens[n];
    out[i] = (t >= vs && t < ve) ? wte[(size_t)(t - vs) * C + c] : __float2bfloat16_rn(0.0f);
  }
}

__global__ void k_embedding_backward(float *dwte, const mp_bf16 *dout, const int32_t *tokens,
                                     int N, int C, int vs, int ve) {
  size_t total = (size_t)N * C;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < total;
       i += (size_t)gridDim.x * blockDim.x) {
    size_t n = i / C, c = i % C;
    int t = tokens[n];
    if (t >= vs && t < ve) atomicAdd(dwte + (size_t)(t - vs) * C + c, mp_ldx(dout, i));
  }
}

mp_status mp_cuda_embedding_forward(mp_kctx *kc, void *out, const int32_t *tokens,
                                    const void *wte, int N, int C, int vs, int ve) {
  MP_KREQUIRE(kc, N >= 0 && C >= 0 && 0 <= vs && vs <= ve, "embedding_forward");
  size_t n = (size_t)N * C;
  if (n == 0) return MP_OK;
  k_embedding_forward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                        MP_CUDA_STREAM(kc)>>>((mp_bf16 *)out, tokens, (const mp_bf16 *)wte,
                                              N, C, vs, ve);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_embedding_backward(mp_kctx *kc, float *dwte, const void *dout,
                                     const int32_t *tokens, int N, int C, int vs, int ve) {
  MP_KREQUIRE(kc, N >= 0 && C >= 0 && 0 <= vs && vs <= ve, "embedding_backward");
  size_t n = (size_t)N * C;
  if (n == 0) return MP_OK;
  k_embedding_backward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                         MP_CUDA_STREAM(kc)>>>(dwte, (const mp_bf16 *)dout, tokens, N, C,
                                               vs, ve);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

/* ---- per-element functions (shared by the scalar and vector paths) ------------------- */

__device__ __forceinline__ float gelu_f(float v) {
  return 0.5f * v * (1.0f + tanhf(GELU_K * (v + GELU_A * v * v * v)));
}

/* d gelu / dv */
__device__ __forceinline__ float gelu_grad_f(float v) {
  float th = tanhf(GELU_K * (v + GELU_A * v * v * v));
  return 0.5f * (1.0f + th) + 0.5f * v * (1.0f - th * th) * GELU_K * (1.0f + 3.0f * GELU_A * v * v);
}

__device__ __forceinline__ float sigmoid_f(float g) { return 1.0f / (1.0f + expf(-g)); }

/* Vector count and tail of an n-element op on the vector path. */
struct vec_split {
  size_t nvec, tail0; /* vectors [0, nvec); scalar elements [tail0, n) */
};
__device__ __forceinline__ vec_split split_vec(size_t n) {
  return {n / MP_VEC, n / MP_VEC * MP_VEC};
}

/* Scalar elements [tail0, n) (fewer than 8) go to the first threads of block 0. */
#define TAIL_INDEX(tail0, n, i)                                                          \
  size_t i = (tail0) + threadIdx.x;                                                     \
  if (blockIdx.x == 0 && i < (n))

#define VEC_LOOP(v, nvec)                                                                \
  for (size_t v = blockIdx.x * (size_t)blockDim.x + threadIdx.x; v < (nvec);              \
       v += (size_t)gridDim.x * blockDim.x)

static bool all_aligned16(const void *a, const void *b = NULL, const void *c = NULL,
                          const void *d = NULL, const void *e = NULL) {
  return mp_aligned16(a) && mp_aligned16(b) && mp_aligned16(c) && mp_aligned16(d) &&
         mp_aligned16(e);
}

/* ---- GELU, SwiGLU --------------------------------------------------------------------- */

__global__ void k_gelu_forward(mp_bf16 *out, const mp_bf16 *x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    mp_stx(out, i, gelu_f(mp_ldx(x, i)));
}

__global__ void k_gelu_forward_vec(mp_bf16 *out, const mp_bf16 *x, size_t n) {
  const vec_split sp = split_vec(n);
  VEC_LOOP(v, sp.nvec) {
    float f[8];
    mp_ld8(x + v * MP_VEC, f);
#pragma unroll
    for (int j = 0; j < 8; j++) f[j] = gelu_f(f[j]);
    mp_st8(out + v * MP_VEC, f);
  }
  TAIL_INDEX(sp.tail0, n, i) mp_stx(out, i, gelu_f(mp_ldx(x, i)));
}

__global__ void k_gelu_backward(mp_bf16 *dx, const mp_bf16 *dout, const mp_bf16 *x,
                                size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    mp_stx(dx, i, mp_ldx(dx, i) + gelu_grad_f(mp_ldx(x, i)) * mp_ldx(dout, i));
}

__global__ void k_gelu_backward_vec(mp_bf16 *dx, const mp_bf16 *dout, const mp_bf16 *x,
                                    size_t n) {
  const vec_split sp = split_vec(n);
  VEC_LOOP(v, sp.nvec) {
    float fx[8], fd[8], fo[8];
    mp_ld8(x + v * MP_VEC, fx);
    mp_ld8(dout + v * MP_VEC, fd);
    mp_ld8_rw(dx + v * MP_VEC, fo);
#pragma unroll
    for (int j = 0; j < 8; j++) fo[j] = fo[j] + gelu_grad_f(fx[j]) * fd[j];
    mp_st8(dx + v * MP_VEC, fo);
  }
  TAIL_INDEX(sp.tail0, n, i)
  mp_stx(dx, i, mp_ldx(dx, i) + gelu_grad_f(mp_ldx(x, i)) * mp_ldx(dout, i));
}

__device__ __forceinline__ float swiglu_f(float g, float u) { return g * sigmoid_f(g) * u; }

/* SwiGLU kernels are templated on kAmax: false is the plain op (no amax code at all);
 * true also folds every stored bf16 pattern into a per-thread max and commits it to
 * amax[] at the end (cuda_kernels.cuh, mp_amax_commit), which is why the fused variants
 * keep every thread alive to the end of the kernel (no early exit; the grid-stride and
 * tail guards already do). The stored values are the same expressions in both, so the
 * fused op's outputs are the plain op's bit for bit. */
template <bool kAmax>
__global__ void k_swiglu_forward(mp_bf16 *out, const mp_bf16 *gate, const mp_bf16 *up,
                                 size_t n, float *amax) {
  uint32_t am = 0;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const mp_bf16 h = __float2bfloat16_rn(swiglu_f(mp_ldx(gate, i), mp_ldx(up, i)));
    out[i] = h;
    if constexpr (kAmax) am = mp_amax_fold1(am, h);
  }
  if constexpr (kAmax) mp_amax_commit<1>(&amax, &am);
}

template <bool kAmax>
__global__ void k_swiglu_forward_vec(mp_bf16 *out, const mp_bf16 *gate, const mp_bf16 *up,
                                     size_t n, float *amax) {
  const vec_split sp = split_vec(n);
  uint32_t am = 0;
  VEC_LOOP(v, sp.nvec) {
    float g[8], u[8];
    mp_ld8(gate + v * MP_VEC, g);
    mp_ld8(up + v * MP_VEC, u);
#pragma unroll
    for (int j = 0; j < 8; j++) g[j] = swiglu_f(g[j], u[j]);
    const uint4 o = mp_pack8(g);
    *(uint4 *)(out + v * MP_VEC) = o;
    if constexpr (kAmax) am = mp_amax_fold8(am, o);
  }
  TAIL_INDEX(sp.tail0, n, i) {
    const mp_bf16 h = __float2bfloat16_rn(swiglu_f(mp_ldx(gate, i), mp_ldx(up, i)));
    out[i] = h;
    if constexpr (kAmax) am = mp_amax_fold1(am, h);
  }
  if constexpr (kAmax) mp_amax_commit<1>(&amax, &am);
}

/* dgate += d u sg (1 + g (1 - sg)); dup += d g sg (either may be NULL). */
__device__ __forceinline__ void swiglu_grads_f(float g, float u, float d, float *dg,
                                               float *du) {
  float sg = sigmoid_f(g);
  *dg = d * u * sg * (1.0f + g * (1.0f - sg));
  *du = d * g * sg;
}

/* amax (kAmax): [0] of dgate, [1] of dup, both non-NULL then. */
/* Element i of swiglu_backward: dgate[i] += .., dup[i] += .. (either may be NULL), and with
 * kAmax the stored bf16 values folded into am[0] and am[1]. The scalar kernel's body and the
 * vector kernel's tail. */
template <bool kAmax>
__device__ __forceinline__ void swiglu_backward_one(mp_bf16 *dgate, mp_bf16 *dup, const mp_bf16 *dout,
                                                    const mp_bf16 *gate, const mp_bf16 *up, size_t i,
                                                    uint32_t am[2]) {
  float dg, du;
  swiglu_grads_f(mp_ldx(gate, i), mp_ldx(up, i), mp_ldx(dout, i), &dg, &du);
  if (dgate) {
    const mp_bf16 h = __float2bfloat16_rn(mp_ldx(dgate, i) + dg);
    dgate[i] = h;
    if constexpr (kAmax) am[0] = mp_amax_fold1(am[0], h);
  }
  if (dup) {
    const mp_bf16 h = __float2bfloat16_rn(mp_ldx(dup, i) + du);
    dup[i] = h;
    if constexpr (kAmax) am[1] = mp_amax_fold1(am[1], h);
  }
}

template <bool kAmax>
__global__ void k_swiglu_backward(mp_bf16 *dgate, mp_bf16 *dup, const mp_bf16 *dout,
                                  const mp_bf16 *gate, const mp_bf16 *up, size_t n,
                                  float *amax_dgate, float *amax_dup) {
  uint32_t am[2] = {0, 0};
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    swiglu_backward_one<kAmax>(dgate, dup, dout, gate, up, i, am);
  }
  if constexpr (kAmax) {
    float *slots[2] = {amax_dgate, amax_dup};
    mp_amax_commit<2>(slots, am);
  }
}

template <bool kAmax>
__global__ void k_swiglu_backward_vec(mp_bf16 *dgate, mp_bf16 *dup, const mp_bf16 *dout,
                                      const mp_bf16 *gate, const mp_bf16 *up, size_t n,
                                      float *amax_dgate, float *amax_dup) {
  const vec_split sp = split_vec(n);
  uint32_t am[2] = {0, 0};
  VEC_LOOP(v, sp.nvec) {
    const size_t o = v * MP_VEC;
    float g[8], u[8], d[8], ag[8] = {}, au[8] = {};
    mp_ld8(gate + o, g);
    mp_ld8(up + o, u);
    mp_ld8(dout + o, d);
    if (dgate) mp_ld8_rw(dgate + o, ag);
    if (dup) mp_ld8_rw(dup + o, au);
#pragma unroll
    for (int j = 0; j < 8; j++) {
      float dg, du;
      swiglu_grads_f(g[j], u[j], d[j], &dg, &du);
      ag[j] += dg;
      au[j] += du;
    }
    if (dgate) {
      const uint4 pg = mp_pack8(ag);
      *(uint4 *)(dgate + o) = pg;
      if constexpr (kAmax) am[0] = mp_amax_fold8(am[0], pg);
    }
    if (dup) {
      const uint4 pu = mp_pack8(au);
      *(uint4 *)(dup + o) = pu;
      if constexpr (kAmax) am[1] = mp_amax_fold8(am[1], pu);
    }
  }
  TAIL_INDEX(sp.tail0, n, i) {
    swiglu_backward_one<kAmax>(dgate, dup, dout, gate, up, i, am);
  }
  if constexpr (kAmax) {
    float *slots[2] = {amax_dgate, amax_dup};
    mp_amax_commit<2>(slots, am);
  }
}

mp_status mp_cuda_gelu_forward(mp_kctx *kc, void *out, const void *x, size_t n) {
  if (n == 0) return MP_OK;
  if (all_aligned16(out, x))
    k_gelu_forward_vec<<<mp_cuda_grid(n / MP_VEC, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                         MP_CUDA_STREAM(kc)>>>((mp_bf16 *)out, (const mp_bf16 *)x, n);
  else
    k_gelu_forward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
        (mp_bf16 *)out, (const mp_bf16 *)x, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_gelu_backward(mp_kctx *kc, void *dx, const void *dout, const void *x,
                                size_t n) {
  if (n == 0) return MP_OK;
  if (all_aligned16(dx, dout, x))
    k_gelu_backward_vec<<<mp_cuda_grid(n / MP_VEC, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                          MP_CUDA_STREAM(kc)>>>((mp_bf16 *)dx, (const mp_bf16 *)dout,
                                                (const mp_bf16 *)x, n);
  else
    k_gelu_backward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
        (mp_bf16 *)dx, (const mp_bf16 *)dout, (const mp_bf16 *)x, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

/* The SwiGLU launches: the vector kernel when every operand is 16-byte aligned, the
 * scalar one otherwise, in both the plain (kAmax false, amax NULL) and fused forms. */
template <bool kAmax>
static mp_status swiglu_forward_launch(mp_kctx *kc, void *out, const void *gate,
                                       const void *up, size_t n, float *amax) {
  if (all_aligned16(out, gate, up))
    k_swiglu_forward_vec<kAmax><<<mp_cuda_grid(n / MP_VEC, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                                  MP_CUDA_STREAM(kc)>>>((mp_bf16 *)out, (const mp_bf16 *)gate,
                                                        (const mp_bf16 *)up, n, amax);
  else
    k_swiglu_forward<kAmax><<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                              MP_CUDA_STREAM(kc)>>>((mp_bf16 *)out, (const mp_bf16 *)gate,
                                                    (const mp_bf16 *)up, n, amax);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

template <bool kAmax>
static mp_status swiglu_backward_launch(mp_kctx *kc, void *dgate, void *dup, const void *dout,
                                        const void *gate, const void *up, size_t n,
                                        float *amax_dgate, float *amax_dup) {
  if (all_aligned16(dgate, dup, dout, gate, up))
    k_swiglu_backward_vec<kAmax><<<mp_cuda_grid(n / MP_VEC, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                                   MP_CUDA_STREAM(kc)>>>(
        (mp_bf16 *)dgate, (mp_bf16 *)dup, (const mp_bf16 *)dout, (const mp_bf16 *)gate,
        (const mp_bf16 *)up, n, amax_dgate, amax_dup);
  else
    k_swiglu_backward<kAmax><<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                               MP_CUDA_STREAM(kc)>>>(
        (mp_bf16 *)dgate, (mp_bf16 *)dup, (const mp_bf16 *)dout, (const mp_bf16 *)gate,
        (const mp_bf16 *)up, n, amax_dgate, amax_dup);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_swiglu_forward(mp_kctx *kc, void *out, const void *gate, const void *up,
                                 size_t n) {
  if (n == 0) return MP_OK;
  return swiglu_forward_launch<false>(kc, out, gate, up, n, NULL);
}

mp_status mp_cuda_swiglu_backward(mp_kctx *kc, void *dgate, void *dup, const void *dout,
                                  const void *gate, const void *up, size_t n) {
  if (n == 0 || (!dgate && !dup)) return MP_OK;
  return swiglu_backward_launch<false>(kc, dgate, dup, dout, gate, up, n, NULL, NULL);
}

/* The fused amax ops (ops.h): the slots are zeroed on the stream, then the kernels
 * max-combine into them (cuda_kernels.cuh, fused amax), so n == 0 gives amax 0. */
mp_status mp_cuda_swiglu_forward_amax(mp_kctx *kc, void *out, const void *gate,
                                      const void *up, size_t n, float *amax) {
  MP_KREQUIRE(kc, amax != NULL && (n == 0 || (out && gate && up)), "swiglu_forward_amax");
  MP_CUDA_CHECK(kc, cudaMemsetAsync(amax, 0, sizeof(float), MP_CUDA_STREAM(kc)));
  if (n == 0) return MP_OK;
  return swiglu_forward_launch<true>(kc, out, gate, up, n, amax);
}

mp_status mp_cuda_swiglu_backward_amax(mp_kctx *kc, void *dgate, void *dup, const void *dout,
                                       const void *gate, const void *up, size_t n,
                                       float *amax_dgate, float *amax_dup) {
  MP_KREQUIRE(kc, dgate && dup && amax_dgate && amax_dup && amax_dgate != amax_dup,
                  "swiglu_backward_amax");
  MP_KREQUIRE(kc, n == 0 || (dout && gate && up), "swiglu_backward_amax");
  cudaStream_t st = MP_CUDA_STREAM(kc);
  MP_CUDA_CHECK(kc, cudaMemsetAsync(amax_dgate, 0, sizeof(float), st));
  MP_CUDA_CHECK(kc, cudaMemsetAsync(amax_dup, 0, sizeof(float), st));
  if (n == 0) return MP_OK;
  return swiglu_backward_launch<true>(kc, dgate, dup, dout, gate, up, n, amax_dgate, amax_dup);
}

/* ---- residual and accumulation ----------------------------------------------------- */

__global__ void k_residual_forward(mp_bf16 *out, const mp_bf16 *a, const mp_bf16 *b,
                                   size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    mp_stx(out, i, mp_ldx(a, i) + mp_ldx(b, i));
}

/* out = a + b, or (acc) out += b with a == out: the += reads out with a coherent load. */
template <bool kAcc>
__global__ void k_add_vec(mp_bf16 *out, const mp_bf16 *a, const mp_bf16 *b, size_t n) {
  const vec_split sp = split_vec(n);
  VEC_LOOP(v, sp.nvec) {
    float fa[8], fb[8];
    if (kAcc)
      mp_ld8_rw(a + v * MP_VEC, fa);
    else
      mp_ld8(a + v * MP_VEC, fa);
    mp_ld8(b + v * MP_VEC, fb);
#pragma unroll
    for (int j = 0; j < 8; j++) fa[j] = fa[j] + fb[j];
    mp_st8(out + v * MP_VEC, fa);
  }
  TAIL_INDEX(sp.tail0, n, i) mp_stx(out, i, mp_ldx(a, i) + mp_ldx(b, i));
}

__global__ void k_accumulate(mp_bf16 *y, const mp_bf16 *x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    mp_stx(y, i, mp_ldx(y, i) + mp_ldx(x, i));
}

/* copy2d: one thread per element of the rows x cols block. */
__global__ void k_copy2d(mp_bf16 *dst, size_t ld_dst, const mp_bf16 *src, size_t ld_src, size_t rows,
                         size_t cols, int add) {
  const size_t n = rows * cols;
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x) {
    const size_t r = i / cols, c = i % cols, d = r * ld_dst + c;
    const float x = mp_ldx(src, r * ld_src + c);
    mp_stx(dst, d, add ? mp_ldx(dst, d) + x : x);
  }
}

__global__ void k_accumulate_f32(float *y, const float *x, size_t n) {
  for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
       i += (size_t)gridDim.x * blockDim.x)
    y[i] += x[i];
}

/* y += x as float4 (n / 4 vectors, the last n % 4 elements by block 0). */
__global__ void k_accumulate_f32_vec(float *y, const float *x, size_t n) {
  const size_t nvec = n / 4;
  VEC_LOOP(v, nvec) {
    float4 a = ((float4 *)y)[v], b = __ldg((const float4 *)x + v);
    a.x += b.x;
    a.y += b.y;
    a.z += b.z;
    a.w += b.w;
    ((float4 *)y)[v] = a;
  }
  TAIL_INDEX(nvec * 4, n, i) y[i] += x[i];
}

mp_status mp_cuda_residual_forward(mp_kctx *kc, void *out, const void *a, const void *b,
                                   size_t n) {
  if (n == 0) return MP_OK;
  if (all_aligned16(out, a, b))
    k_add_vec<false><<<mp_cuda_grid(n / MP_VEC, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                       MP_CUDA_STREAM(kc)>>>((mp_bf16 *)out, (const mp_bf16 *)a,
                                             (const mp_bf16 *)b, n);
  else
    k_residual_forward<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                         MP_CUDA_STREAM(kc)>>>((mp_bf16 *)out, (const mp_bf16 *)a,
                                               (const mp_bf16 *)b, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_accumulate(mp_kctx *kc, void *y, const void *x, size_t n) {
  if (n == 0) return MP_OK;
  if (all_aligned16(y, x))
    k_add_vec<true><<<mp_cuda_grid(n / MP_VEC, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                      MP_CUDA_STREAM(kc)>>>((mp_bf16 *)y, (const mp_bf16 *)y,
                                            (const mp_bf16 *)x, n);
  else
    k_accumulate<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
        (mp_bf16 *)y, (const mp_bf16 *)x, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_copy2d(mp_kctx *kc, void *dst, size_t ld_dst, const void *src, size_t ld_src,
                         size_t rows, size_t cols, int add) {
  MP_KREQUIRE(kc, (dst && src) || rows == 0 || cols == 0, "copy2d");
  MP_KREQUIRE(kc, ld_dst >= cols && ld_src >= cols, "copy2d");
  const size_t n = rows * cols;
  if (n == 0) return MP_OK;
  k_copy2d<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0, MP_CUDA_STREAM(kc)>>>(
      (mp_bf16 *)dst, ld_dst, (const mp_bf16 *)src, ld_src, rows, cols, add);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}

mp_status mp_cuda_accumulate_f32(mp_kctx *kc, float *y, const float *x, size_t n) {
  if (n == 0) return MP_OK;
  if (all_aligned16(y, x))
    k_accumulate_f32_vec<<<mp_cuda_grid(n / 4, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                           MP_CUDA_STREAM(kc)>>>(y, x, n);
  else
    k_accumulate_f32<<<mp_cuda_grid(n, MP_CUDA_BLOCK), MP_CUDA_BLOCK, 0,
                       MP_CUDA_STREAM(kc)>>>(y, x, n);
  MP_CUDA_LAUNCH_CHECK(kc);
  return MP_OK;
}
