// The simulator's shortcut for repeated work (sim/engine.c run_segment and the middle
// micro-batches of mp_sim_run_step: a window skipped once two in a row advance alike) against
// the full simulation of every layer and micro-batch (record_trace set: nothing skipped), on
// real layouts of the megatron-core stack. The shortcut claims the same step time to within
// floating-point noise (k x an advance against k additions) and the same peak to the byte.
#include <gtest/gtest.h>

#include <cstring>

#include "exec/plan.h"
#include "sim/cluster.h"
#include "sim/sim.h"
#include "sim/stack.h"

namespace {

struct Layout {
  const char *model, *gpu;
  int64_t gpus;
  const char *mesh, *fp8, *graphs;
  int pp_virtual, double_buffer, param_gather, deepep;
  int64_t seq, global_batch;
};

// Simulates l with the shortcut and without it; the two results in *fast and *full.
void Both(const Layout &l, mp_sim_result *fast, mp_sim_result *full) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  mp_cluster c;
  mp_mesh mesh;
  mp_stack_profile prof;
  ASSERT_EQ(mp_model_load(&ctx, l.model, &m), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_cluster_make(&ctx, l.gpu, l.gpus, 8, &c), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_mesh_parse(&ctx, l.mesh, l.gpus, &mesh), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_stack_load(&ctx, "megatron-core", &prof), MP_OK) << mp_errmsg(&ctx);
  mp_plan_options o;
  mp_plan_options_init(&o);
  mp_stack_plan_options(&prof, &c.gpu, &o);
  o.seq = l.seq;
  o.micro_batch = 1;
  o.global_batch = l.global_batch;
  o.fp8 = l.fp8 != nullptr;
  if (l.fp8) {
    ASSERT_TRUE(mp_fp8_recipe_parse(l.fp8, &o.fp8_opts.recipe)) << l.fp8;
  }
  if (l.graphs) {
    ASSERT_TRUE(mp_cuda_graphs_parse(l.graphs, &o.cuda_graphs)) << l.graphs;
  }
  if (l.pp_virtual > 1) {
    o.pp_schedule = MP_PP_INTERLEAVED;
    o.pp_virtual = l.pp_virtual;
  }
  o.fsdp_double_buffer = l.double_buffer;
  o.fp8_opts.param_gather = l.param_gather;
  if (l.deepep) o.moe_dispatcher = MP_MOE_DISPATCH_DEEPEP;
  mp_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.cluster = &c;
  cfg.stack = &prof;
  ASSERT_EQ(mp_simulate_plan(&ctx, &m, &mesh, &o, &cfg, fast), MP_OK) << mp_errmsg(&ctx);
  cfg.record_trace = 1; /* every instance simulated (sim/engine.c: nothing extrapolated) */
  ASSERT_EQ(mp_simulate_plan(&ctx, &m, &mesh, &o, &cfg, full), MP_OK) << mp_errmsg(&ctx);
}

void ExpectSame(const Layout &l, const char *what) {
  mp_sim_result fast, full;
  Both(l, &fast, &full);
  EXPECT_GT(full.step_time_s, 0.0) << what;
  EXPECT_NEAR(fast.step_time_s, full.step_time_s, 1e-9 * full.step_time_s) << what;
  EXPECT_NEAR(fast.exposed_comm_s, full.exposed_comm_s, 1e-9 * full.step_time_s) << what;
  EXPECT_EQ(fast.peak_mem_bytes, full.peak_mem_bytes) << what;
}

// Megatron FSDP with the double buffer, Llama 3 70B on 64 B200 (2 micro-batches of 8192
// tokens a rank, 80 layers, float8 current scaling). The last backward layers'
// reduce-scatters hold SMs (NCCL's channels) past the end of micro-batch 0's backward: the
// first forward layers of micro-batch 1 run at the rate those SMs leave, their gathers
// beside them, so layers 0 and 1 advance alike while the reduce-scatter's stream stays put.
// During layer 2 the compute stream passes the reduce-scatter's end and the layers after
// it run faster: skipping layers 2..78 at layer 1's advance (a steady state taken from two
// contended layers) gave 4.681 s where every layer simulated gives 4.607 s (1.6 % long).
TEST(Extrapolate, MegatronFsdpDoubleBuffer) {
  ExpectSame({"llama3-70b", "b200", 64, "dp_shard=64", "current", nullptr, 0, 1, 0, 0, 8192, 128},
             "70B mfsdp double buffer");
}

// The same model under an interleaved pipeline: TP 2, PP 4 of 5 virtual stages, MXFP8.
TEST(Extrapolate, InterleavedPipeline) {
  ExpectSame({"llama3-70b", "b200", 64, "tp=2,pp=4,dp_shard=8", "mxfp8", nullptr, 5, 0, 0, 0, 8192, 128},
             "70B interleaved pipeline");
}

// MoE: Qwen3-30B-A3B on 32 H100, EP 8 over DP 32 with DeepEP, float8 blockwise with the
// float8 parameter gather and the attention and router in CUDA graphs. The compute stream
// waits for nothing over the skipped windows, so the time it last started after a wait
// (which bounds how far back a collective issued behind its kernels slows them) stays where
// it was; the shortcut moved it on with the windows, so the collectives after them slowed
// fewer kernels and the step came out 1.3e-4 s (4e-5) short.
TEST(Extrapolate, MoeDeepEp) {
  ExpectSame({"qwen3-30b-a3b", "h100-sxm", 32, "dp_replicate=32,ep=8", "blockwise", "attn+moe_router+moe_preprocess",
              0, 0, 1, 1, 4096, 256},
             "Qwen3 30B EP 8");
}

}  // namespace
