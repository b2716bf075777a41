// The fixture of the CPU kernel suites: the CPU backend (be) initialised on its own kernel
// context (kc) and error context (err).
#ifndef MP_TESTS_KERNELS_CPU_FIXTURE_H
#define MP_TESTS_KERNELS_CPU_FIXTURE_H

#include <gtest/gtest.h>

#include "kernels/cpu/cpu.h"

namespace mp_test {

class CpuKernels : public ::testing::Test {
 protected:
  void SetUp() override {
    mp_ctx_init(&err);
    kc.err = &err;
    kc.impl = nullptr;
    kc.device = 0;
    be = mp_backend_cpu();
    ASSERT_EQ(be->init(&kc, 0), MP_OK);
  }
  mp_ctx err;
  mp_kctx kc;
  const mp_backend *be;
};

}  // namespace mp_test

#endif
