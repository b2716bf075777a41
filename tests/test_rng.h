// Deterministic test data shared by the kernel suites (tests/kernels, tests/kernels_cuda):
// a xorshift generator seeded per test, uniform floats, and bf16-representable values (the
// CUDA kernels read bf16, so inputs rounded to it compare exactly with the CPU reference).
#ifndef MP_TESTS_TEST_RNG_H
#define MP_TESTS_TEST_RNG_H

#include <cstddef>
#include <cstdint>
#include <vector>

#include "kernels/ops.h"

namespace mp_test {

struct Rng {
  uint64_t s;
  explicit Rng(uint64_t seed) : s(seed * 2654435761u + 1) {}
  uint32_t next() {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    return (uint32_t)(s >> 11);
  }
  float uni(float lo = -1.0f, float hi = 1.0f) {
    return lo + (hi - lo) * (float)(next() & 0xFFFFFF) / (float)0x1000000;
  }
  std::vector<float> vec(size_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(n);
    for (auto &x : v) x = uni(lo, hi);
    return v;
  }
};

// x rounded to the nearest bf16.
inline float bf(float x) { return mp_bf16_to_f32(mp_bf16_from_f32(x)); }

// n uniform values in [lo, hi), each rounded to bf16.
inline std::vector<float> rand_bf16(Rng &r, size_t n, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  for (auto &x : v) x = bf(r.uni(lo, hi));
  return v;
}

}  // namespace mp_test

#endif
