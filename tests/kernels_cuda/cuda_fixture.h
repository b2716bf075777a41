// The fixture the CUDA kernel suites share (attention_test.cc, gemm_attention_test.cc):
// the CPU backend as the reference and the CUDA backend under test, both on one error
// context; skips cleanly without a CUDA build or device. Device buffers start poisoned
// (0xFF bytes: bf16 NaN patterns), so an op that leaves part of its output unwritten fails
// the comparison, and are freed at the end of the test.
#ifndef MP_TESTS_KERNELS_CUDA_CUDA_FIXTURE_H
#define MP_TESTS_KERNELS_CUDA_CUDA_FIXTURE_H

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda.h"
#ifdef MP_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace mp_test {

// ||got - want|| / ||norm_of|| (L2 over the tensor); infinity when got holds a NaN or inf
// (poison left behind) or the sizes differ.
inline double rel_err(const std::vector<float> &got, const std::vector<float> &want,
                      const std::vector<float> &norm_of) {
  if (got.size() != want.size() || got.size() != norm_of.size()) return INFINITY;
  double e = 0, n = 0;
  for (size_t i = 0; i < got.size(); i++) {
    if (!std::isfinite(got[i])) return INFINITY;
    e += ((double)got[i] - want[i]) * ((double)got[i] - want[i]);
    n += (double)norm_of[i] * norm_of[i];
  }
  return std::sqrt(e / (n > 0 ? n : 1));
}

// Relative L2 error of got against ref.
inline double rel_l2(const std::vector<float> &got, const std::vector<float> &ref) {
  return rel_err(got, ref, ref);
}

class CudaVsCpu : public ::testing::Test {
 protected:
  using Vec = std::vector<float>;

  void SetUp() override {
    mp_ctx_init(&err);
    kc = {&err, nullptr, 0};
    cpu_kc = {&err, nullptr, 0};
    cpu = mp_backend_cpu();
    ASSERT_EQ(cpu->init(&cpu_kc, 0), MP_OK);
#ifndef MP_HAVE_CUDA
    GTEST_SKIP() << "not built with CUDA";
#else
    if (mp_cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
    be = mp_cuda_backend();
    ASSERT_EQ(be->init(&kc, 0), MP_OK) << mp_errmsg(&err);
    ready = true;
    int major = 0, minor = 0;
    ASSERT_EQ(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, 0), cudaSuccess);
    ASSERT_EQ(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, 0), cudaSuccess);
    cc = major * 10 + minor;
#endif
  }
  void TearDown() override {
    if (!ready) return;
    for (void *p : allocs) be->free(&kc, p);
    be->shutdown(&kc);
  }

  // Device buffer of `bytes` filled with 0xFF.
  void *poisoned(size_t bytes) {
    void *p = nullptr;
    EXPECT_EQ(be->alloc(&kc, &p, bytes), MP_OK) << mp_errmsg(&err);
    allocs.push_back(p);
    std::vector<unsigned char> ff(bytes, 0xFF);
    EXPECT_EQ(be->memcpy_h2d(&kc, p, ff.data(), bytes), MP_OK);
    return p;
  }
  // X (bf16) copy of h, `skew` bytes past the allocation's (256-byte aligned) start.
  void *dev_x(const Vec &h, size_t skew = 0) {
    char *p = (char *)poisoned(h.size() * 2 + 16 + skew);
    EXPECT_EQ(be->to_device_f32(&kc, p + skew, h.data(), h.size()), MP_OK) << mp_errmsg(&err);
    return p + skew;
  }
  float *dev_f32(const Vec &h) {
    float *p = (float *)poisoned(h.size() * 4 + 4);
    EXPECT_EQ(be->memcpy_h2d(&kc, p, h.data(), h.size() * 4), MP_OK);
    return p;
  }
  void *dev_bytes(const std::vector<uint8_t> &h) {
    void *p = poisoned(h.size() + 16);
    EXPECT_EQ(be->memcpy_h2d(&kc, p, h.data(), h.size()), MP_OK);
    return p;
  }
  // Host copies after the device's queue drained (asynchronous faults surface here).
  Vec get_x(const void *p, size_t n) {
    Vec h(n);
    EXPECT_EQ(be->synchronize(&kc), MP_OK) << mp_errmsg(&err);
    EXPECT_EQ(be->from_device_f32(&kc, h.data(), p, n), MP_OK) << mp_errmsg(&err);
    return h;
  }
  Vec get_f32(const float *p, size_t n) {
    Vec h(n);
    EXPECT_EQ(be->synchronize(&kc), MP_OK) << mp_errmsg(&err);
    EXPECT_EQ(be->memcpy_d2h(&kc, h.data(), p, n * 4), MP_OK) << mp_errmsg(&err);
    return h;
  }
  std::vector<unsigned char> get_bytes(const void *p, size_t n) {
    std::vector<unsigned char> h(n);
    EXPECT_EQ(be->synchronize(&kc), MP_OK) << mp_errmsg(&err);
    EXPECT_EQ(be->memcpy_d2h(&kc, h.data(), p, n), MP_OK) << mp_errmsg(&err);
    return h;
  }

  mp_ctx err;
  mp_kctx kc, cpu_kc;
  const mp_backend *cpu = nullptr, *be = nullptr;
  bool ready = false;
  int cc = 0; /* compute capability, 90 for sm_90 */
  std::vector<void *> allocs;
};

}  // namespace mp_test

#endif
