/* A standalone op table for the GEMM and attention kernels (kernels/cuda/gemm.h): device
 * memory hooks plus the entries of matmul.cu and attention.cu, on a context of its own
 * (a non-blocking stream, cuBLASLt state from mp_cuda_gemm_init). The GPU tests and the
 * kernel benchmark use it so they need nothing from backend.cu; it is not the CUDA backend
 * (entries it does not list stay NULL).
 *
 * Memory hooks are synchronous on the context's stream (copies wait for queued work), which
 * is what tests and benchmarks want. bf16 conversion on the host uses mp_bf16_from_f32, the
 * rounding the CPU side of the tests also applies. */
#include <stdlib.h>
#include <string.h>

#include "kernels/cuda/cuda_internal.h"
#include "kernels/cuda/gemm.h"

namespace {

mp_status sa_init(mp_kctx *kc, int device) {
  kc->impl = NULL;
  kc->device = device;
  int n = 0;
  MP_CUDA_CHECK(kc, cudaGetDeviceCount(&n));
  if (device < 0 || device >= n)
    return mp_error(kc->err, MP_ERR_INVALID, "cuda-gemm: device %d does not exist (%d "
                    "visible); pick 0..%d", device, n, n - 1);
  MP_CUDA_CHECK(kc, cudaSetDevice(device));
  mp_cuda_impl *im = (mp_cuda_impl *)calloc(1, sizeof(mp_cuda_impl));
  if (!im) return mp_error(kc->err, MP_ERR_NOMEM, "cuda-gemm: out of host memory");
  im->device = device;
  cudaDeviceProp prop;
  cudaError_t ce = cudaGetDeviceProperties(&prop, device);
  if (ce == cudaSuccess) ce = cudaStreamCreateWithFlags(&im->stream, cudaStreamNonBlocking);
  if (ce != cudaSuccess) {
    free(im);
    return mp_error(kc->err, MP_ERR_CUDA, "cuda-gemm: device %d setup failed: %s", device,
                    cudaGetErrorString(ce));
  }
  im->cc_major = prop.major;
  im->cc_minor = prop.minor;
  im->n_sms = prop.multiProcessorCount;
  kc->impl = im;
  mp_status st = mp_cuda_gemm_init(kc);
  if (st != MP_OK) {
    cudaStreamDestroy(im->stream);
    free(im);
    kc->impl = NULL;
  }
  return st;
}

void sa_shutdown(mp_kctx *kc) {
  mp_cuda_impl *im = mp_cuda_impl_of(kc);
  if (!im) return;
  cudaStreamSynchronize(im->stream);
  mp_cuda_gemm_shutdown(kc);
  cudaStreamDestroy(im->stream);
  free(im);
  kc->impl = NULL;
}

mp_status sa_alloc(mp_kctx *kc, void **ptr, size_t bytes) {
  *ptr = NULL;
  if (bytes == 0) return MP_OK;
  cudaError_t ce = cudaMalloc(ptr, bytes); /* 256-byte aligned */
  if (ce != cudaSuccess) {
    *ptr = NULL;
    return mp_error(kc->err, MP_ERR_NOMEM, "cuda-gemm: cudaMalloc of %zu bytes failed on "
                    "device %d: %s", bytes, kc->device, cudaGetErrorString(ce));
  }
  return MP_OK;
}

void sa_free(mp_kctx *kc, void *ptr) {
  (void)kc;
  if (ptr) cudaFree(ptr);
}

mp_status sa_copy(mp_kctx *kc, void *dst, const void *src, size_t bytes, cudaMemcpyKind kind) {
  if (!bytes) return MP_OK;
  cudaStream_t s = mp_cuda_impl_of(kc)->stream;
  MP_CUDA_CHECK(kc, cudaMemcpyAsync(dst, src, bytes, kind, s));
  MP_CUDA_CHECK(kc, cudaStreamSynchronize(s));
  return MP_OK;
}

mp_status sa_h2d(mp_kctx *kc, void *dst, const void *src, size_t bytes) {
  return sa_copy(kc, dst, src, bytes, cudaMemcpyHostToDevice);
}
mp_status sa_d2h(mp_kctx *kc, void *dst, const void *src, size_t bytes) {
  return sa_copy(kc, dst, src, bytes, cudaMemcpyDeviceToHost);
}
mp_status sa_d2d(mp_kctx *kc, void *dst, const void *src, size_t bytes) {
  if (!bytes) return MP_OK;
  MP_CUDA_CHECK(kc, cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToDevice,
                                    mp_cuda_impl_of(kc)->stream));
  return MP_OK;
}

mp_status sa_memset_zero(mp_kctx *kc, void *ptr, size_t bytes) {
  if (!bytes) return MP_OK;
  MP_CUDA_CHECK(kc, cudaMemsetAsync(ptr, 0, bytes, mp_cuda_impl_of(kc)->stream));
  return MP_OK;
}

mp_status sa_synchronize(mp_kctx *kc) {
  MP_CUDA_CHECK(kc, cudaStreamSynchronize(mp_cuda_impl_of(kc)->stream));
  return MP_OK;
}

mp_status sa_to_x(mp_kctx *kc, void *dst, const float *src, size_t n) {
  if (!n) return MP_OK;
  uint16_t *h = (uint16_t *)malloc(n * sizeof(uint16_t));
  if (!h) return mp_error(kc->err, MP_ERR_NOMEM, "cuda-gemm: out of host memory (%zu bf16)", n);
  for (size_t i = 0; i < n; i++) h[i] = mp_bf16_from_f32(src[i]);
  mp_status st = sa_h2d(kc, dst, h, n * sizeof(uint16_t));
  free(h);
  return st;
}

mp_status sa_from_x(mp_kctx *kc, float *dst, const void *src, size_t n) {
  if (!n) return MP_OK;
  uint16_t *h = (uint16_t *)malloc(n * sizeof(uint16_t));
  if (!h) return mp_error(kc->err, MP_ERR_NOMEM, "cuda-gemm: out of host memory (%zu bf16)", n);
  mp_status st = sa_d2h(kc, h, src, n * sizeof(uint16_t));
  if (st == MP_OK)
    for (size_t i = 0; i < n; i++) dst[i] = mp_bf16_to_f32(h[i]);
  free(h);
  return st;
}

mp_backend make_table() {
  mp_backend t;
  memset(&t, 0, sizeof(t));
  t.name = "cuda-gemm";
  t.x_dtype = MP_KDTYPE_BF16;
  t.init = sa_init;
  t.shutdown = sa_shutdown;
  t.alloc = sa_alloc;
  t.free = sa_free;
  t.memcpy_h2d = sa_h2d;
  t.memcpy_d2h = sa_d2h;
  t.memcpy_d2d = sa_d2d;
  t.memset_zero = sa_memset_zero;
  t.synchronize = sa_synchronize;
  t.to_device_f32 = sa_to_x;
  t.from_device_f32 = sa_from_x;
  t.matmul_forward = mp_cuda_matmul_forward;
  t.matmul_backward = mp_cuda_matmul_backward;
  t.attention_forward = mp_cuda_attention_forward;
  t.attention_backward = mp_cuda_attention_backward;
  t.matmul_f8 = mp_cuda_matmul_f8;
  t.f8_transpose = mp_cuda_f8_transpose;
  return t;
}

const mp_backend kTable = make_table();

}  // namespace

extern "C" const mp_backend *mp_cuda_gemm_backend(void) { return &kTable; }

extern "C" void *mp_cuda_gemm_stream(mp_kctx *kc) {
  mp_cuda_impl *im = mp_cuda_impl_of(kc);
  return im ? (void *)im->stream : NULL;
}

extern "C" int mp_cuda_gemm_device_count(void) {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError(); /* clear the sticky "no driver" error for later calls */
    return 0;
  }
  return n;
}
