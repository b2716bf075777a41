// Transformer Engine's Linear backward without --tp-comm-overlap on a real schedule
// (sim/cost.c, price_async_dgrad): Llama 3.1 8B at seq 8192 on two H100s of one node, tp 2
// with SP, one micro-batch, Megatron-Core's stack with its TP comm overlap off. Each
// layer's q, k, v and gate, up regions and the output layer end their backward with a
// reduce-scatter of the [8192, 4096] bf16 input gradient (64 MiB): 2 x 32 + 1 = 65 of them.
// Each region's weight-gradient GEMMs outlast it (q, k, v: 4096 x 3072 x 8192 x 2 = 206
// GFLOP; gate, up: 962 GFLOP; the head 4.3 TFLOP; about 0.35 ms and more on an H100 against
// a collective of about 0.11 ms), so the collective is hidden whole: the step shortens by
// the 65 collectives' time C each. Where NCCL's 24 channels of the node hold their SMs
// beside those GEMMs, they run at 108/132 of their pace while it runs, and the step
// shortens by C x 108/132 each.
#include <gtest/gtest.h>

#include "sim/sim.h"
#include "tests/sim/plan_case.h"

namespace {

double Step(int async_dgrad, int contended, double *rs_s) {
  PlanCase k("llama3.1-8b", "h100-8", "dp_replicate=4,tp=2");  // made 2 GPUs below
  EXPECT_EQ(mp_cluster_make(&k.ctx, "h100-sxm", 2, 8, &k.c), MP_OK) << mp_errmsg(&k.ctx);
  EXPECT_EQ(mp_mesh_parse(&k.ctx, "tp=2", 2, &k.mesh), MP_OK) << mp_errmsg(&k.ctx);
  EXPECT_EQ(mp_stack_load(&k.ctx, "megatron-core", &k.prof), MP_OK) << mp_errmsg(&k.ctx);
  k.prof.tp_dgrad_async = async_dgrad;
  k.prof.nccl_sm_contention = contended;
  mp_stack_plan_options(&k.prof, &k.c.gpu, &k.o);
  k.o.tp_comm_fused = 0;
  k.o.seq = 8192;
  k.o.micro_batch = 1;
  k.o.global_batch = 1;
  // the reduce-scatter's own time, as the simulator's network model costs it (sim/network.c)
  mp_sim_link l;
  EXPECT_EQ(mp_sim_group_link(&k.ctx, &k.c, &k.mesh, MP_GROUP_TP, 0, &l), MP_OK) << mp_errmsg(&k.ctx);
  *rs_s = mp_sim_nccl_collective_s(MP_COLL_REDUCE_SCATTER, 2.0 * 8192 * 4096, 2, &l, l.GBps * k.prof.link_eff,
                                  &k.c.gpu, 0, 0) +
          k.prof.comm_overhead_s;
  return k.Sim().step_time_s;
}

TEST(TpDgradAsync, RegionsHideTheirInputGradientsReduceScatter) {
  double c = 0.0;
  const double serial = Step(0, 0, &c), hidden = Step(1, 0, &c);
  EXPECT_GT(c, 0.05e-3);
  EXPECT_NEAR(serial - hidden, 65 * c, 1e-9);
  const double serial_sm = Step(0, 1, &c), hidden_sm = Step(1, 1, &c);
  EXPECT_NEAR(serial_sm - hidden_sm, 65 * c * 108.0 / 132.0, 1e-9);
}

}  // namespace
