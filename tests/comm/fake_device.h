// The CPU kernel backend standing in for a device, for the staged communicators' tests.
//
// Memory from FakeDevice::Alloc is "device" memory: the backend's memcpy entries check
// that every device-side pointer lies inside such an allocation and every host-side one
// does not, and count the copies. A staged backend that read a device buffer directly, or
// passed host and device pointers the wrong way round, fails these checks even though the
// memory is host memory underneath; the counts show that the data really went through
// the backend's copies. One FakeDevice is current at a time (the last one made).
#ifndef MP_TESTS_COMM_FAKE_DEVICE_H
#define MP_TESTS_COMM_FAKE_DEVICE_H

#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/cpu.h"
#include "kernels/ops.h"

class FakeDevice {
 public:
  FakeDevice() {
    mp_ctx_init(&err_);
    kc_.err = &err_;
    kc_.impl = nullptr;
    kc_.device = 0;
    be_ = *mp_backend_cpu();
    be_.name = "cpu-as-device";
    be_.memcpy_h2d = &H2D;
    be_.memcpy_d2h = &D2H;
    be_.memcpy_d2d = &D2D;
    Current() = this;
  }
  ~FakeDevice() {
    for (auto &a : allocs_) mp_backend_cpu()->free(&kc_, a.first);
    if (Current() == this) Current() = nullptr;
  }
  const mp_backend *backend() { return &be_; }
  mp_kctx *kc() { return &kc_; }

  // Device buffer holding `host` (bytes copied in with plain memcpy: setup is not counted).
  template <typename T>
  T *Upload(const std::vector<T> &host) {
    void *p = Alloc(host.size() * sizeof(T));
    if (!host.empty()) std::memcpy(p, host.data(), host.size() * sizeof(T));
    return static_cast<T *>(p);
  }
  template <typename T>
  std::vector<T> Download(const T *dev, size_t n) {
    std::vector<T> h(n);
    if (n) std::memcpy(h.data(), dev, n * sizeof(T));
    return h;
  }
  void *Alloc(size_t bytes) {
    void *p = nullptr;
    EXPECT_EQ(mp_backend_cpu()->alloc(&kc_, &p, bytes ? bytes : 1), MP_OK);
    allocs_.push_back({p, bytes ? bytes : 1});
    return p;
  }
  bool IsDevice(const void *p, size_t bytes) const {
    auto a = reinterpret_cast<uintptr_t>(p);
    for (auto &r : allocs_) {
      auto b = reinterpret_cast<uintptr_t>(r.first);
      if (a >= b && a + bytes <= b + r.second) return true;
    }
    return false;
  }
  bool Overlaps(const void *p, size_t bytes) const {
    auto a = reinterpret_cast<uintptr_t>(p);
    for (auto &r : allocs_) {
      auto b = reinterpret_cast<uintptr_t>(r.first);
      if (a < b + r.second && b < a + bytes) return true;
    }
    return false;
  }

  int h2d = 0, d2h = 0, d2d = 0;
  int bad = 0;  // copies with a pointer on the wrong side

 private:
  static FakeDevice *&Current() {
    static FakeDevice *cur = nullptr;
    return cur;
  }
  static mp_status H2D(mp_kctx *kc, void *dst, const void *src, size_t bytes) {
    FakeDevice *d = Current();
    d->h2d++;
    if (!d->IsDevice(dst, bytes) || d->Overlaps(src, bytes)) d->bad++;
    return mp_backend_cpu()->memcpy_h2d(kc, dst, src, bytes);
  }
  static mp_status D2H(mp_kctx *kc, void *dst, const void *src, size_t bytes) {
    FakeDevice *d = Current();
    d->d2h++;
    if (!d->IsDevice(src, bytes) || d->Overlaps(dst, bytes)) d->bad++;
    return mp_backend_cpu()->memcpy_d2h(kc, dst, src, bytes);
  }
  static mp_status D2D(mp_kctx *kc, void *dst, const void *src, size_t bytes) {
    FakeDevice *d = Current();
    d->d2d++;
    if (!d->IsDevice(dst, bytes) || !d->IsDevice(src, bytes)) d->bad++;
    return mp_backend_cpu()->memcpy_d2d(kc, dst, src, bytes);
  }

  mp_ctx err_;
  mp_kctx kc_;
  mp_backend be_;
  std::vector<std::pair<void *, size_t>> allocs_;
};

#endif
