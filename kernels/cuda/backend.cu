/* The CUDA backend table (kernels/ops.h): lifecycle, memory, host<->device conversion, and
 * the kernels of this folder, assembled like the CPU table (kernels/cpu/backend.c) so a
 * missing entry is NULL, never a wrong function.
 *
 * Invariants:
 * - One mp_cuda_impl per mp_kctx (kc->impl), created by init on `device`: a non-blocking
 *   stream that carries all of the context's work, the device's compute capability and
 *   SM count, a scratch buffer (owned here, grown on demand by mp_cuda_scratch) and the
 *   cuBLASLt state that matmul.cu creates in mp_cuda_gemm_init.
 * - Kernels are asynchronous; the memcpy entries and the host conversions return only
 *   when the copy is complete (the caller may reuse or read its host buffer at once),
 *   as the synchronous CPU backend does. alloc is cudaMalloc (256-byte aligned, usable
 *   from any stream at once); free is cudaFree, which waits for the device.
 * - X tensors are bf16. to_device_f32 stages fp32 on the device in scratch-sized chunks
 *   and converts with a kernel (round to nearest even, as mp_bf16_from_f32), so no host
 *   thread converts large tensors. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda.h"
#include "kernels/cuda/cuda_kernels.cuh"
#include "kernels/cuda/gemm.h" /* mp_cuda_matmul_f8, mp_cuda_f8_transpose */

enum { SCRATCH_INIT_BYTES = 8 << 20 }; /* reductions, norm partials, conversion staging */

mp_status mp_cuda_scratch(mp_kctx *kc, size_t bytes, void **ptr) {
  mp_cuda_impl *impl = mp_cuda_impl_of(kc);
  if (bytes > impl->scratch_bytes) {
    size_t want = impl->scratch_bytes * 2 > bytes ? impl->scratch_bytes * 2 : bytes;
    want = (want + 255) & ~(size_t)255;
    /* Work already queued may still read the old buffer. */
    MP_CUDA_CHECK(kc, cudaStreamSynchronize(impl->stream));
    if (impl->scratch) MP_CUDA_CHECK(kc, cudaFree(impl->scratch));
    impl->scratch = NULL;
    impl->scratch_bytes = 0;
    MP_CUDA_CHECK(kc, cudaMalloc((void **)&impl->scratch, want));
    impl->scratch_bytes = want;
  }
  *ptr = impl->scratch;
  return MP_OK;
}

static void cuda_shutdown(mp_kctx *kc) {
  mp_cuda_impl *impl = mp_cuda_impl_of(kc);
  if (!impl) return;
  /* Errors are ignored here: shutdown has no status and must release what it can. */
  cudaSetDevice(impl->device);
  if (impl->stream) cudaStreamSynchronize(impl->stream);
  if (impl->lt || impl->workspace || impl->gemm_cache) mp_cuda_gemm_shutdown(kc);
  if (impl->scratch) cudaFree(impl->scratch);
  if (impl->stream) cudaStreamDestroy(impl->stream);
  cudaGetLastError(); /* leave no sticky-free error behind for the next caller */
  free(impl);
  kc->impl = NULL;
}

static mp_status cuda_init_impl(mp_kctx *kc, mp_cuda_impl *impl, int device) {
  MP_CUDA_CHECK(kc, cudaSetDevice(device));
  MP_CUDA_CHECK(kc, cudaDeviceGetAttribute(&impl->cc_major,
                                           cudaDevAttrComputeCapabilityMajor, device));
  MP_CUDA_CHECK(kc, cudaDeviceGetAttribute(&impl->cc_minor,
                                           cudaDevAttrComputeCapabilityMinor, device));
  MP_CUDA_CHECK(kc, cudaDeviceGetAttribute(&impl->n_sms, cudaDevAttrMultiProcessorCount,
                                           device));
  if (impl->cc_major < 8)
    return mp_error(kc->err, MP_ERR_UNSUPPORTED, "cuda device %d has compute capability "
                    "%d.%d; the bf16 kernels need 8.0 or newer (A100, H100, RTX 30xx+)",
                    device, impl->cc_major, impl->cc_minor);
  MP_CUDA_CHECK(kc, cudaStreamCreateWithFlags(&impl->stream, cudaStreamNonBlocking));
  MP_CUDA_CHECK(kc, cudaMalloc((void **)&impl->scratch, SCRATCH_INIT_BYTES));
  impl->scratch_bytes = SCRATCH_INIT_BYTES;
  return mp_cuda_gemm_init(kc);
}

static mp_status cuda_init(mp_kctx *kc, int device) {
  kc->impl = NULL;
  int count = mp_cuda_device_count();
  if (device < 0 || device >= count)
    return mp_error(kc->err, MP_ERR_INVALID, "cuda backend: device %d does not exist (%d "
                    "visible); check CUDA_VISIBLE_DEVICES and the driver", device, count);
  mp_cuda_impl *impl = (mp_cuda_impl *)calloc(1, sizeof *impl);
  MP_CHECK_ALLOC(kc->err, impl);
  impl->device = device;
  kc->impl = impl;
  kc->device = device;
  mp_status st = cuda_init_impl(kc, impl, device);
  if (st != MP_OK) cuda_shutdown(kc);
  return st;
}

static mp_status cuda_alloc(mp_kctx *kc, void **ptr, size_t bytes) {
  *ptr = NULL;
  if (bytes == 0) return MP_OK;
  cudaError_t e = cudaMalloc(ptr, bytes); /* 256-byte aligned */
  if (e != cudaSuccess) {
    *ptr = NULL;
    cudaGetLastError();
    return mp_error(kc->err, e == cudaErrorMemoryAllocation ? MP_ERR_NOMEM : MP_ERR_CUDA,
                    "cuda device %d: allocating %zu bytes failed: %s; reduce the "
                    "micro-batch or shard further", kc->device, bytes, cudaGetErrorString(e));
  }
  return MP_OK;
}

static void cuda_free(mp_kctx *kc, void *ptr) {
  (void)kc;
  if (ptr) cudaFree(ptr);
}

static mp_status cuda_memcpy_kind(mp_kctx *kc, void *dst, const void *src, size_t bytes,
                                  cudaMemcpyKind kind) {
  if (bytes == 0) return MP_OK;
  cudaStream_t s = MP_CUDA_STREAM(kc);
  MP_CUDA_CHECK(kc, cudaMemcpyAsync(dst, src, bytes, kind, s));
  if (kind != cudaMemcpyDeviceToDevice) MP_CUDA_CHECK(kc, cudaStreamSynchronize(s));
  return MP_OK;
}

static mp_status cuda_memcpy_h2d(mp_kctx *kc, void *dst, const void *src, size_t bytes) {
  return cuda_memcpy_kind(kc, dst, src, bytes, cudaMemcpyHostToDevice);
}
static mp_status cuda_memcpy_d2h(mp_kctx *kc, void *dst, const void *src, size_t bytes) {
  return cuda_memcpy_kind(kc, dst, src, bytes, cudaMemcpyDeviceToHost);
}
static mp_status cuda_memcpy_d2d(mp_kctx *kc, void *dst, const void *src, size_t bytes) {
  return cuda_memcpy_kind(kc, dst, src, bytes, cudaMemcpyDeviceToDevice);
}

static mp_status cuda_memset_zero(mp_kctx *kc, void *ptr, size_t bytes) {
  if (bytes == 0) return MP_OK;
  MP_CUDA_CHECK(kc, cudaMemsetAsync(ptr, 0, bytes, MP_CUDA_STREAM(kc)));
  return MP_OK;
}

static mp_status cuda_synchronize(mp_kctx *kc) {
  MP_CUDA_CHECK(kc, cudaStreamSynchronize(MP_CUDA_STREAM(kc)));
  return MP_OK;
}

/* Host fp32 -> device bf16 through fp32 staging chunks in scratch. */
static mp_status cuda_to_device_f32(mp_kctx *kc, void *dst_x, const float *src, size_t n) {
  if (n == 0) return MP_OK;
  size_t chunk = SCRATCH_INIT_BYTES / sizeof(float);
  void *stage = NULL;
  MP_CHECK(mp_cuda_scratch(kc, (n < chunk ? n : chunk) * sizeof(float), &stage));
  cudaStream_t s = MP_CUDA_STREAM(kc);
  for (size_t i0 = 0; i0 < n; i0 += chunk) {
    size_t m = n - i0 < chunk ? n - i0 : chunk;
    /* Stream order: this copy waits for the previous chunk's kernel to finish reading. */
    MP_CUDA_CHECK(kc, cudaMemcpyAsync(stage, src + i0, m * sizeof(float),
                                      cudaMemcpyHostToDevice, s));
    MP_CHECK(mp_cuda_x_from_f32(kc, (mp_bf16 *)dst_x + i0, (const float *)stage, m));
  }
  MP_CUDA_CHECK(kc, cudaStreamSynchronize(s));
  return MP_OK;
}

static mp_status cuda_from_device_f32(mp_kctx *kc, float *dst, const void *src_x, size_t n) {
  if (n == 0) return MP_OK;
  size_t chunk = SCRATCH_INIT_BYTES / sizeof(float);
  void *stage = NULL;
  MP_CHECK(mp_cuda_scratch(kc, (n < chunk ? n : chunk) * sizeof(float), &stage));
  cudaStream_t s = MP_CUDA_STREAM(kc);
  for (size_t i0 = 0; i0 < n; i0 += chunk) {
    size_t m = n - i0 < chunk ? n - i0 : chunk;
    MP_CHECK(mp_cuda_x_to_f32(kc, (float *)stage, (const mp_bf16 *)src_x + i0, m));
    MP_CUDA_CHECK(kc, cudaMemcpyAsync(dst + i0, stage, m * sizeof(float),
                                      cudaMemcpyDeviceToHost, s));
  }
  MP_CUDA_CHECK(kc, cudaStreamSynchronize(s));
  return MP_OK;
}

static const mp_backend cuda_backend = {
    .name = "cuda",
    .x_dtype = MP_KDTYPE_BF16,
    .init = cuda_init,
    .shutdown = cuda_shutdown,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .memcpy_h2d = cuda_memcpy_h2d,
    .memcpy_d2h = cuda_memcpy_d2h,
    .memcpy_d2d = cuda_memcpy_d2d,
    .memset_zero = cuda_memset_zero,
    .synchronize = cuda_synchronize,
    .to_device_f32 = cuda_to_device_f32,
    .from_device_f32 = cuda_from_device_f32,
    .x_from_f32 = mp_cuda_x_from_f32,
    .x_to_f32 = mp_cuda_x_to_f32,
    .embedding_forward = mp_cuda_embedding_forward,
    .embedding_backward = mp_cuda_embedding_backward,
    .layernorm_forward = mp_cuda_layernorm_forward,
    .layernorm_backward = mp_cuda_layernorm_backward,
    .rmsnorm_forward = mp_cuda_rmsnorm_forward,
    .rmsnorm_backward = mp_cuda_rmsnorm_backward,
    .rope_forward = mp_cuda_rope_forward,
    .rope_backward = mp_cuda_rope_backward,
    .attention_forward = mp_cuda_attention_forward,
    .attention_backward = mp_cuda_attention_backward,
    .attention_span_init = mp_cuda_attention_span_init,
    .attention_span_forward = mp_cuda_attention_span_forward,
    .attention_span_finalize = mp_cuda_attention_span_finalize,
    .attention_span_dot = mp_cuda_attention_span_dot,
    .attention_span_backward = mp_cuda_attention_span_backward,
    .gelu_forward = mp_cuda_gelu_forward,
    .gelu_backward = mp_cuda_gelu_backward,
    .swiglu_forward = mp_cuda_swiglu_forward,
    .swiglu_backward = mp_cuda_swiglu_backward,
    .matmul_forward = mp_cuda_matmul_forward,
    .matmul_backward = mp_cuda_matmul_backward,
    .router_forward = mp_cuda_router_forward,
    .router_backward = mp_cuda_router_backward,
    .router_aux_loss_forward = mp_cuda_router_aux_loss_forward,
    .router_aux_loss_backward = mp_cuda_router_aux_loss_backward,
    .moe_plan = mp_cuda_moe_plan,
    .permute_forward = mp_cuda_permute_forward,
    .permute_backward = mp_cuda_permute_backward,
    .unpermute_forward = mp_cuda_unpermute_forward,
    .unpermute_backward = mp_cuda_unpermute_backward,
    .cross_entropy_forward = mp_cuda_cross_entropy_forward,
    .ce_local_max = mp_cuda_ce_local_max,
    .ce_local_sumexp = mp_cuda_ce_local_sumexp,
    .ce_local_target = mp_cuda_ce_local_target,
    .ce_vp_combine = mp_cuda_ce_vp_combine,
    .ce_backward = mp_cuda_ce_backward,
    .adamw_update = mp_cuda_adamw_update,
    .sum_squares = mp_cuda_sum_squares,
    .scale_f32 = mp_cuda_scale_f32,
    .residual_forward = mp_cuda_residual_forward,
    .accumulate = mp_cuda_accumulate,
    .accumulate_f32 = mp_cuda_accumulate_f32,
    .copy2d = mp_cuda_copy2d,
    .f8_amax = mp_cuda_f8_amax,
    .f8_scale_from_amax = mp_cuda_f8_scale_from_amax,
    .f8_quantize = mp_cuda_f8_quantize,
    .f8_dequantize = mp_cuda_f8_dequantize,
    .f8_fake_quantize = mp_cuda_f8_fake_quantize,
    .matmul_f8 = mp_cuda_matmul_f8,
    .rmsnorm_forward_amax = mp_cuda_rmsnorm_forward_amax,
    .swiglu_forward_amax = mp_cuda_swiglu_forward_amax,
    .swiglu_backward_amax = mp_cuda_swiglu_backward_amax,
    .f8_transpose = mp_cuda_f8_transpose,
    .f8_quantize_t = mp_cuda_f8_quantize_t,
};

extern "C" int mp_cuda_built(void) { return 1; }

extern "C" const mp_backend *mp_cuda_backend(void) { return &cuda_backend; }

extern "C" void *mp_cuda_stream(mp_kctx *kc) {
  mp_cuda_impl *im = kc ? mp_cuda_impl_of(kc) : NULL;
  return im ? (void *)im->stream : NULL;
}

extern "C" int mp_cuda_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) n = 0;
  cudaGetLastError(); /* no driver / no device is an answer here, not a pending error */
  return n;
}
