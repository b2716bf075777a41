// The advice when no plan fits (planner/advise.h): how the more-GPUs hint searches GPU
// counts, derived by hand against a known threshold; the constraints refused as usage
// mistakes before any search, each naming its rule.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "planner/advise.h"
#include "tests/planner/fake.h"

namespace {

// A setup "fits" from `threshold` GPUs up; every count searched is recorded.
struct Threshold {
  int64_t threshold;
  std::vector<int64_t> searched;
};

mp_status fits_from(void *user, mp_ctx *ctx, int64_t n, int *fits) {
  (void)ctx;
  Threshold *t = static_cast<Threshold *>(user);
  t->searched.push_back(n);
  *fits = n >= t->threshold;
  return MP_OK;
}

// From 1 GPU, fitting from 20 in nodes of 8: 2, 4, 8, 16 do not fit, 32 does; between 16
// and 32 the whole nodes are halved: 24 fits, and 16 and 24 are a node apart: 24 GPUs, 16 not.
TEST(AdviseGpuCount, DoublesThenHalvesInWholeNodes) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  Threshold t{20, {}};
  int64_t fit = 0, no_fit = 0;
  ASSERT_EQ(mp_advise_gpu_count(&ctx, 1, 8, 1 << 20, 16, fits_from, &t, &fit, &no_fit), MP_OK);
  EXPECT_EQ(fit, 24);
  EXPECT_EQ(no_fit, 16);
  EXPECT_EQ(t.searched, (std::vector<int64_t>{2, 4, 8, 16, 32, 24}));
  // 64 to 1,000 in nodes of 8: 128, 256, 512 no, 1024 yes; 768 no, 896 no, 960 no, 992 no,
  // 1000 yes (8 apart from 992): the fewest whole nodes that fit
  t = {1000, {}};
  ASSERT_EQ(mp_advise_gpu_count(&ctx, 64, 8, 1 << 20, 16, fits_from, &t, &fit, &no_fit), MP_OK);
  EXPECT_EQ(fit, 1000);
  EXPECT_EQ(no_fit, 992);
  // the search stops at max_probes, keeping what it verified
  t = {1000, {}};
  ASSERT_EQ(mp_advise_gpu_count(&ctx, 64, 8, 1 << 20, 5, fits_from, &t, &fit, &no_fit), MP_OK);
  EXPECT_EQ(t.searched.size(), 5u);
  EXPECT_EQ(fit, 896 + 128);  // 1024: 768 searched and not fitting
  EXPECT_EQ(no_fit, 768);
  // nothing fits up to max_gpus: no count
  t = {1 << 30, {}};
  ASSERT_EQ(mp_advise_gpu_count(&ctx, 8, 8, 4096, 16, fits_from, &t, &fit, &no_fit), MP_OK);
  EXPECT_EQ(fit, 0);
  EXPECT_EQ(t.searched.back(), 4096);
}

// The constraints that are usage mistakes, each refused with its rule before a search.
TEST(AdviseCheck, UsageMistakesNameTheRule) {
  mp_model dense = fake_dense_model(), moe = fake_moe_model(8);
  mp_cluster c = fake_cluster(1, 8);
  mp_plan_setup s;
  memset(&s, 0, sizeof s);
  s.seq = 4096;
  mp_search_fix_init(&s.fix);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  struct Case {
    const mp_model *m;
    int ep, tp, dp_shard;
    int64_t mb, gb;
    const char *want;
  } cases[] = {
      {&dense, 2, -1, -1, -1, 0, "ep=2: fake-dense is dense (no routed experts)"},
      {&moe, 3, -1, -1, -1, 0, "ep=3 does not divide the 8 experts of fake-moe (each EP rank holds the same "
                               "number of whole experts); choose ep in {1, 2, 4, 8}"},
      {&dense, -1, 3, -1, -1, 0, "the fixed mesh dims multiply to 3, which does not divide the 8 GPUs"},
      {&moe, 4, -1, 2, -1, 0, "ep=4 does not divide dp_shard=2"},
      {&dense, -1, -1, -1, 1024, 8, "--micro-batch 1024 is larger than --global-batch 8"},
  };
  for (const Case &k : cases) {
    SCOPED_TRACE(k.want);
    s.model = k.m;
    mp_search_fix_init(&s.fix);
    s.fix.ep = k.ep;
    s.fix.tp = k.tp;
    s.fix.dp_shard = k.dp_shard;
    s.fix.micro_batch = k.mb;
    s.global_batch = k.gb;
    EXPECT_EQ(mp_plan_setup_check(&ctx, &s, &c), MP_ERR_USAGE);
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find(k.want), std::string::npos) << mp_errmsg(&ctx);
  }
  // what the rules allow passes
  s.model = &moe;
  mp_search_fix_init(&s.fix);
  s.fix.ep = 4;
  s.fix.tp = 2;
  s.fix.micro_batch = 8;
  s.global_batch = 8;
  EXPECT_EQ(mp_plan_setup_check(&ctx, &s, &c), MP_OK) << mp_errmsg(&ctx);
}

}  // namespace
