// A graph-safe MoE dispatch and what it costs, each against a hand derivation: HybridEP's rank
// capacity (Megatron-Core's --moe-expert-rank-capacity-factor, core_v0.18.0
// token_dispatcher.py _HybridEPManager) fixes each EP rank's receive buffer at C_r x tokens x
// top_k rows, so the host reads no routed count and whole-layer and full-iteration CUDA graphs
// capture the MoE layer (exec/rules.c, mp_moe_host_sync); under float8 HybridEP pads each local
// expert's rows to a multiple of 256 (get_align_size_for_quantization under Transformer
// Engine's op fuser), the padded expert GEMMs (exec/schedule_prep.c, mp_sched_moe_rows); the
// host's wait after each layer's read of the counts is gone from the step.
#include <gtest/gtest.h>

#include <cstring>

#include "exec/plan.h"
#include "exec/rules.h"
#include "exec/schedule.h"
#include "sim/sim.h"
#include "tests/sim/moe_ops.h"
#include "tests/sim/plan_case.h"

namespace {

// 100 tokens a rank, top-2 of 64 experts, ep 8: a rank routes r = 100 x 2 / 64 = 3.125 rows to
// each expert, so a local expert receives 8 x 3.125 = 25 balanced; the rank's budget under C_r
// 1.5 is 100 x 2 x 1.5 = 300 rows, 37.5 an expert.
TEST(MoeGraphSafe, RankCapacityKeepsTheBudgetAndPadsEachExpert) {
  mp_moe_routing rt;
  memset(&rt, 0, sizeof rt);
  rt.rank_capacity = 1.5;
  double load = 0;
  // balanced, bf16 (align 1): the 25 rows, nothing dropped, no padding
  EXPECT_EQ(mp_sched_moe_rows(&rt, 100, 2, 64, 8, 1, &load), 25.0);
  EXPECT_EQ(load, 1.0);
  // float8: ceil(25 / 256) x 256 = 256 rows an expert, 256 / 25 = 10.24 x the GEMM FLOPs; the
  // all-to-all still moves the 25 (load 1)
  EXPECT_EQ(mp_sched_moe_rows(&rt, 100, 2, 64, 8, MP_MOE_HYBRIDEP_ALIGN, &load), 256.0);
  EXPECT_EQ(load, 1.0);
  // imbalance 2: 50 rows wanted, the budget keeps 37.5 (load 1.5), padded to 256 under float8
  rt.imbalance = 2.0;
  EXPECT_EQ(mp_sched_moe_rows(&rt, 100, 2, 64, 8, 1, &load), 37.5);
  EXPECT_EQ(load, 1.5);
  EXPECT_EQ(mp_sched_moe_rows(&rt, 100, 2, 64, 8, MP_MOE_HYBRIDEP_ALIGN, &load), 256.0);
  // DeepSeek-V3's layer (4096 tokens, top-8 of 256, ep 64): 8192 rows an expert, a multiple of
  // 256, so float8 pads nothing; imbalance 1.1: 9011.2 rows kept (within 1.5), padded to
  // ceil(9011.2 / 256) = 36 x 256 = 9216
  rt.imbalance = 1.0;
  EXPECT_EQ(mp_sched_moe_rows(&rt, 4096, 8, 256, 64, MP_MOE_HYBRIDEP_ALIGN, &load), 8192.0);
  rt.imbalance = 1.1;
  EXPECT_EQ(mp_sched_moe_rows(&rt, 4096, 8, 256, 64, MP_MOE_HYBRIDEP_ALIGN, &load), 9216.0);
  EXPECT_NEAR(load, 1.1, 1e-12);
}

// tiny-moe (8 experts, top-2, d_model 64, d_ff_expert 32, 2 MoE layers) on 8 H100s under
// megatron-core with ep 8 and HybridEP, one 64-token sequence a micro-batch.
struct Tiny : PlanCase {
  Tiny() : PlanCase("tiny-moe", "h100-8", "dp_shard=8,ep=8") {
    EXPECT_EQ(mp_stack_load(&ctx, "megatron-core", &prof), MP_OK) << mp_errmsg(&ctx);
    mp_stack_plan_options(&prof, &c.gpu, &o);
    o.moe_dispatcher = MP_MOE_DISPATCH_HYBRIDEP;
    o.seq = 64;
    o.micro_batch = 1;
    o.global_batch = 16;
    o.ddp.check_grads = 0; /* full-iteration graphs need the NaN check off (exec/rules.c) */
  }
  // The first layer's forward gate GEMM and dispatch all-to-all.
  void Ops(mp_op *gate, mp_op *a2a) { MoeGateAndDispatch(&ctx, &m, &mesh, &o, gate, a2a); }
};

// A rank routes 64 x 2 = 128 rows, 128 x 8 / 8 = 128 to its one local expert. Dropless or under
// C_r 1.5 in bf16 the gate GEMM is 128 rows x 32 x 64: 2 x 128 x 32 x 64 = 524,288 FLOPs. Under
// C_r with float8 (tensorwise) HybridEP pads the expert's 128 rows to 256: 1,048,576 FLOPs, twice;
// the dispatch's bytes stay the rank's 128 rows in every case.
TEST(MoeGraphSafe, Float8RankCapacityPadsTheExpertGemms) {
  struct {
    double rank_capacity;
    int fp8;
    int64_t rows;
  } cases[] = {{0.0, 0, 128}, {1.5, 0, 128}, {0.0, 1, 128}, {1.5, 1, 256}};
  double a2a_bytes = -1.0;
  for (const auto &c : cases) {
    Tiny k;
    k.o.moe_routing.rank_capacity = c.rank_capacity;
    k.o.fp8 = c.fp8;
    mp_op gate, a2a;
    k.Ops(&gate, &a2a);
    EXPECT_EQ(gate.m, c.rows) << c.rank_capacity << " fp8 " << c.fp8;
    EXPECT_EQ(gate.flops, 2.0 * (double)c.rows * 32 * 64) << c.rank_capacity << " fp8 " << c.fp8;
    if (a2a_bytes < 0) a2a_bytes = a2a.bytes;
    EXPECT_EQ(a2a.bytes, a2a_bytes);
  }
}

// The same plan with the host's issue at the stack's kernel overhead (5 us) as in
// cuda_graphs_test.cc's MegatronMoEStepWaitsOnceALayer: HybridEP without a budget reads the
// counts on the host each layer's forward, and the stream waits for the host's first launch
// after it, 5 us; 2 micro-batches x 2 layers x 5 us = 20 us. Under C_r 1.5 (bf16: the same
// rows) the host reads nothing and the waits are gone.
TEST(MoeGraphSafe, RankCapacityRemovesTheHostWaits) {
  double step[2];
  for (int budget = 0; budget <= 1; budget++) {
    Tiny k;
    k.o.moe_routing.rank_capacity = budget ? 1.5 : 0.0;
    k.prof.host_launch_s = k.prof.kernel_overhead_s;
    ASSERT_DOUBLE_EQ(k.prof.kernel_overhead_s, 5e-6);
    step[budget] = k.Sim().step_time_s;
  }
  EXPECT_NEAR(step[0] - step[1], 2 * 2 * 5e-6, 1e-12);
}

// The rules: the budget is HybridEP's alone; with it whole-layer and full-iteration graphs
// capture the MoE layer, without it they are refused by name, DeepEP's by its host list.
TEST(MoeGraphSafe, RulesTakeTheBudgetAndRefuseTheRest) {
  Tiny k;
  k.o.cuda_graphs = MP_CUDA_GRAPHS_ITERATION;
  EXPECT_EQ(mp_rule_cuda_graphs_check(&k.ctx, &k.m, &k.o), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&k.ctx), "HybridEP and no rank capacity"), nullptr) << mp_errmsg(&k.ctx);
  k.o.moe_routing.rank_capacity = 1.5;
  EXPECT_EQ(mp_rule_moe_routing_check(&k.ctx, &k.m, &k.mesh, &k.o), MP_OK) << mp_errmsg(&k.ctx);
  for (mp_cuda_graphs g : {MP_CUDA_GRAPHS_LAYERS, MP_CUDA_GRAPHS_ITERATION}) {
    k.o.cuda_graphs = g;
    EXPECT_EQ(mp_rule_cuda_graphs_check(&k.ctx, &k.m, &k.o), MP_OK) << mp_errmsg(&k.ctx);
  }
  k.o.moe_dispatcher = MP_MOE_DISPATCH_DEEPEP;
  EXPECT_EQ(mp_rule_moe_routing_check(&k.ctx, &k.m, &k.mesh, &k.o), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&k.ctx), "'hybridep'"), nullptr) << mp_errmsg(&k.ctx);
  k.o.moe_routing.rank_capacity = 0.0;
  EXPECT_EQ(mp_rule_cuda_graphs_check(&k.ctx, &k.m, &k.o), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&k.ctx), "num_worst_tokens"), nullptr) << mp_errmsg(&k.ctx);
}

// Selective recompute modules under the full-iteration graph (core_v0.16.0 to core_v0.18.0
// transformer_config.py take them); mlp and moe refused by name (graphed only with
// hidden_dropout 0), and the per-layer graphs still refuse any.
TEST(MoeGraphSafe, FullIterationGraphTakesSelectiveModules) {
  Tiny k;
  k.o.moe_routing.rank_capacity = 1.5;
  k.o.cuda_graphs = MP_CUDA_GRAPHS_ITERATION;
  k.o.recompute_modules = (1u << MP_RC_LAYERNORM) | (1u << MP_RC_MOE_ACT);
  EXPECT_EQ(mp_rule_cuda_graphs_check(&k.ctx, &k.m, &k.o), MP_OK) << mp_errmsg(&k.ctx);
  k.o.recompute_modules = 1u << MP_RC_MOE;
  EXPECT_EQ(mp_rule_cuda_graphs_check(&k.ctx, &k.m, &k.o), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&k.ctx), "hidden_dropout"), nullptr) << mp_errmsg(&k.ctx);
  k.o.recompute_modules = 1u << MP_RC_LAYERNORM;
  k.o.cuda_graphs = MP_CUDA_GRAPHS_LAYERS;
  EXPECT_EQ(mp_rule_cuda_graphs_check(&k.ctx, &k.m, &k.o), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&k.ctx), "--enable-cuda-graph"), nullptr) << mp_errmsg(&k.ctx);
}

}  // namespace
