// The cluster's GPU decides Transformer Engine's float8 copies (exec/plan.h,
// mp_fp8_gemm_any_layout): mp_stack_plan_options carries its compute capability into the
// plan, and the simulator refuses a megatron float8 plan laid out for another GPU, so a
// caller that builds its options without the cluster's GPU cannot price a B200 as an H100.
#include <string>

#include "tests/sim/plan_case.h"

namespace {

void MegatronFp8(PlanCase *k) {
  ASSERT_EQ(mp_stack_load(&k->ctx, "megatron-core", &k->prof), MP_OK) << mp_errmsg(&k->ctx);
  mp_stack_plan_options(&k->prof, &k->c.gpu, &k->o);
  k->o.seq = 4096;
  k->o.fp8 = 1;
}

}  // namespace

TEST(Fp8LayoutSim, PlanCarriesTheClustersComputeCapability) {
  PlanCase b("llama3.1-8b", "b200-8", "dp_replicate=8");
  MegatronFp8(&b);
  EXPECT_EQ(b.o.fp8_opts.gpu_cc, 100);
  mp_sim_result ok;
  ASSERT_EQ(mp_simulate_plan(&b.ctx, &b.m, &b.mesh, &b.o, &b.cfg, &ok), MP_OK) << mp_errmsg(&b.ctx);
  // the same options laid out for an H100 (9.0: transposed copies) refused on the B200
  b.o.fp8_opts.gpu_cc = 90;
  mp_sim_result r;
  EXPECT_EQ(mp_simulate_plan(&b.ctx, &b.m, &b.mesh, &b.o, &b.cfg, &r), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find("compute capability 9.0 but b200 is 10.0"), std::string::npos)
      << mp_errmsg(&b.ctx);
  // 12.0 takes TN operands alone, as the H100 does: refused on the B200 too
  b.o.fp8_opts.gpu_cc = 120;
  EXPECT_EQ(mp_simulate_plan(&b.ctx, &b.m, &b.mesh, &b.o, &b.cfg, &r), MP_ERR_INVALID);
  // bf16 plans carry no float8 copies: any compute capability
  b.o.fp8 = 0;
  EXPECT_EQ(mp_simulate_plan(&b.ctx, &b.m, &b.mesh, &b.o, &b.cfg, &r), MP_OK) << mp_errmsg(&b.ctx);
  PlanCase h("llama3.1-8b", "h100-8", "dp_replicate=8");
  MegatronFp8(&h);
  EXPECT_EQ(h.o.fp8_opts.gpu_cc, 90);
  ASSERT_EQ(mp_simulate_plan(&h.ctx, &h.m, &h.mesh, &h.o, &h.cfg, &r), MP_OK) << mp_errmsg(&h.ctx);
}
