// CUDA graphs and the host's issue of kernels (sim/cost.c): what a captured kernel costs
// under each of Megatron-Core's scopes, and how long a GPU stream waits for the host after
// the MoE token dispatcher synchronises it, on schedules built by hand and worked by hand;
// the plan's refusals (exec/rules.c) and a real MoE plan's step.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "exec/plan.h"
#include "exec/rules.h"
#include "sim/sim.h"
#include "tests/sim/plan_case.h"
#include "tests/sim/round_figures.h"

namespace {

// A forward segment of hand-made compute ops on a plan whose model has routed experts and
// whose memory model is Megatron's (the dispatcher synchronises: exec/plan.h,
// mp_moe_host_sync).
struct HostCase {
  mp_plan plan;
  std::vector<mp_op> ops;
  mp_segment seg;
  mp_schedule s;
  double host_scale = 0.0;  // the cluster GPU's host_launch_scale (0: not stated)
  HostCase() {
    memset(&plan, 0, sizeof plan);
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    EXPECT_EQ(mp_mesh_parse(&ctx, "dp_shard=8", 0, &plan.mesh), MP_OK) << mp_errmsg(&ctx);
    plan.opts.pp_virtual = 1;
    plan.opts.mem_model = MP_MEM_MODEL_MEGATRON;
    plan.model.n_experts = 8;
    memset(&s, 0, sizeof s);
    s.n_micro = s.micro_batch = 1;
    s.seq = s.tokens_per_step_per_rank = 1024;
  }
  // A bf16 GEMM of t seconds on Cluster() with Profile() (0.5 of 1e15 FLOP/s), its kernel
  // overhead aside; `experts` > 1: a grouped GEMM of that many per-expert launches.
  mp_op &Gemm(double t, int experts = 1) {
    mp_op o;
    memset(&o, 0, sizeof o);
    o.type = MP_OP_COMPUTE;
    o.phase = MP_PHASE_FORWARD;
    o.stream = MP_STREAM_COMPUTE;
    o.kernel = MP_KERNEL_GEMM;
    o.dtype = MP_DTYPE_BF16;
    o.module = -1;
    o.layer = -1;
    o.unit = -1;
    o.batch = experts;
    o.grouped = experts > 1;
    o.m = o.n = o.k = 1024;
    o.flops = t * 0.5e15;
    ops.push_back(o);
    return ops.back();
  }
  // The ops as one forward segment on Cluster() under stack p: its status, the message on ctx.
  mp_status Run(mp_ctx *ctx, const mp_stack_profile &p, mp_sim_result *r) {
    memset(&seg, 0, sizeof seg);
    seg.n_ops = (int32_t)ops.size();
    seg.repeat = 1;
    seg.phase = MP_PHASE_FORWARD;
    s.plan = &plan;
    s.ops = ops.data();
    s.n_ops = (int32_t)ops.size();
    s.segs = &seg;
    s.n_segs = 1;
    mp_cluster c = Cluster();
    c.gpu.host_launch_scale = host_scale;
    mp_sim_config cfg{};
    cfg.cluster = &c;
    cfg.stack = &p;
    return mp_simulate(ctx, &s, &cfg, r, NULL);
  }
  double Step(const mp_stack_profile &p) {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_sim_result r;
    EXPECT_EQ(Run(&ctx, p, &r), MP_OK) << mp_errmsg(&ctx);
    return r.step_time_s;
  }
};

// The host takes 10 us to launch a kernel; GEMMs of 20, 5, 5, 5 and 30 us after the synchronisation. The
// host issues them at 10, 20, 30, 40 and 50 us; the GPU runs the first 10-30, the second
// 30-35 (issued at 20), the third 35-40, the fourth 40-45 (issued at 40), the fifth from
// its issue at 50 to 80: 80 us where the kernels sum to 65, 15 us waiting for the host.
TEST(HostIssue, StreamWaitsForTheHostAfterASync) {
  mp_stack_profile p = Profile();
  p.host_launch_s = 10e-6;
  HostCase k;
  const double t[5] = {20e-6, 5e-6, 5e-6, 5e-6, 30e-6};
  for (double d : t) k.Gemm(d);
  EXPECT_NEAR(k.Step(p), 65e-6, 1e-12);  // no synchronisation: the kernels' sum
  k.ops[0].host_sync = 1;
  EXPECT_NEAR(k.Step(p), 80e-6, 1e-12);
  // padded to capacity, Megatron's alltoall dispatcher never synchronises (no_sync)
  k.plan.opts.moe_routing.capacity_factor = 1.0;
  k.plan.opts.moe_routing.pad_to_capacity = 1;
  EXPECT_NEAR(k.Step(p), 65e-6, 1e-12);
  // DeepEP's dispatch waits for the received counts whatever the padding
  k.plan.opts.moe_dispatcher = MP_MOE_DISPATCH_DEEPEP;
  EXPECT_NEAR(k.Step(p), 80e-6, 1e-12);
  // HybridEP likewise, unless a rank capacity fixes its buffer: no host read, the 15 us gone
  k.plan.opts.moe_dispatcher = MP_MOE_DISPATCH_HYBRIDEP;
  EXPECT_NEAR(k.Step(p), 80e-6, 1e-12);
  k.plan.opts.moe_routing.rank_capacity = 1.5;
  EXPECT_NEAR(k.Step(p), 65e-6, 1e-12);
}

// A grouped GEMM's per-expert launches (Transformer Engine's, grouped_gemm_streams 4), each
// issued in turn: host 20 us a launch, a 20 us GEMM (the sync's) then four experts of 10 us
// (40 us, the four in flight together, so 10 us of the stream each). The host issues at
// 20 (the GEMM: 20-40), then the experts at 40, 60, 80, 100, each running 10 us from its
// issue: the stream ends at 110 where the kernels sum to 60. With host 10 us the experts
// are issued at 20, 30, 40, 50 and wait for the stream instead: 10 + 60 = 70.
TEST(HostIssue, GroupedGemmIssuesItsExpertsOneByOne) {
  mp_stack_profile p = Profile();
  p.grouped_streams = 4;
  HostCase k;
  k.Gemm(20e-6).host_sync = 1;
  k.Gemm(40e-6, 4);
  p.host_launch_s = 20e-6;
  EXPECT_NEAR(k.Step(p), 110e-6, 1e-12);
  p.host_launch_s = 10e-6;
  EXPECT_NEAR(k.Step(p), 70e-6, 1e-12);
}

// The window ends at the next synchronisation: two syncs of 10 us host each before GEMMs of
// 30 us: each waits for its first launch only, 10 us, and the stream ends at 80.
TEST(HostIssue, EachSyncWaitsForItsOwnIssue) {
  mp_stack_profile p = Profile();
  p.host_launch_s = 10e-6;
  HostCase k;
  k.Gemm(30e-6).host_sync = 1;
  k.Gemm(30e-6).host_sync = 1;
  EXPECT_NEAR(k.Step(p), 80e-6, 1e-12);
}

// Where the stack states its host issue time, every segment (a layer's pass) runs no faster
// than the host issues it, synchronised or not: five GEMMs of 5 us a launch at 10 us each
// take the host 50 us where the kernels sum to 25, so the pass takes 50. Kernels of 20 us
// (100 us) outrun the host (50 us): their sum. A stack stating none (host_launch_s < 0) takes
// the host to run ahead, and a host as fast as the kernels (5 us) never binds.
TEST(HostIssue, EveryPassRunsNoFasterThanTheHostIssuesIt) {
  mp_stack_profile p = Profile();
  p.host_launch_s = 10e-6;
  HostCase slow, fast;
  for (int i = 0; i < 5; i++) {
    slow.Gemm(5e-6);
    fast.Gemm(20e-6);
  }
  EXPECT_NEAR(slow.Step(p), 50e-6, 1e-12);
  EXPECT_NEAR(fast.Step(p), 100e-6, 1e-12);
  p.host_launch_s = 5e-6;
  EXPECT_NEAR(slow.Step(p), 25e-6, 1e-12);
  p.host_launch_s = -1.0;
  EXPECT_NEAR(slow.Step(p), 25e-6, 1e-12);
}

// The stack's host time is a DGX H100 host's; the GPU's host_launch_scale converts it to its
// own host (gb200: its Grace CPU takes 37.08 us for a torch.nn.Linear forward's host work
// where a DGX H100's Xeon 8480C takes 13.48, 2.751x: data/gpus/gb200.json). Stated 5 us
// on a host 2x slower: 10 us a launch, so five GEMMs of 5 us take the host 50 us where the
// kernels sum to 25 (the pass 50). A stack stating none (its kernel overhead standing in,
// a stream-side figure) is not scaled: 25.
TEST(HostIssue, TheGpusHostScalesTheStatedIssueTime) {
  mp_stack_profile p = Profile();
  p.host_launch_s = 5e-6;
  HostCase k;
  for (int i = 0; i < 5; i++) k.Gemm(5e-6);
  EXPECT_NEAR(k.Step(p), 25e-6, 1e-12);
  k.host_scale = 2.0;
  EXPECT_NEAR(k.Step(p), 50e-6, 1e-12);
  p.host_launch_s = -1.0;
  EXPECT_NEAR(k.Step(p), 25e-6, 1e-12);
  // the gb200 profile states Grace's figure; the HGX B200's x86 host states none
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_gpu g;
  ASSERT_EQ(mp_gpu_load(&ctx, "gb200", &g), MP_OK) << mp_errmsg(&ctx);
  EXPECT_NEAR(g.host_launch_scale, 37.08 / 13.48, 1e-3);
  ASSERT_EQ(mp_gpu_load(&ctx, "b200", &g), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(g.host_launch_scale, 0.0);
  const char *bad = "{\"name\": \"g\", \"peak_tflops\": {\"bf16\": 100, \"fp32\": 10}, \"mem_gib\": 16, "
                    "\"hbm_GBps\": 100, \"nvlink_GBps_per_dir\": 10, \"host_launch_scale\": -2}";
  EXPECT_EQ(mp_gpu_from_text(&ctx, bad, "g.json", &g), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "g.json: host_launch_scale = -2 is out of range"), nullptr) << mp_errmsg(&ctx);
}

// Before a segment's first synchronisation only the rate binds, after it the drained queue:
// host 10 us, GEMMs of 5, 5 (the pass's start: host 20, kernels 10, so 10 us more), then a
// sync before GEMMs of 30 and 30 (the host issues them at 10 and 20, the stream waits 10 us
// for the first). Kernels 70 + 10 + 10 = 90 us.
TEST(HostIssue, ThePassBeforeASyncTakesTheRateBound) {
  mp_stack_profile p = Profile();
  p.host_launch_s = 10e-6;
  HostCase k;
  k.Gemm(5e-6);
  k.Gemm(5e-6);
  k.Gemm(30e-6).host_sync = 1;
  k.Gemm(30e-6);
  EXPECT_NEAR(k.Step(p), 90e-6, 1e-12);
}

// A captured kernel costs the stack's in-graph overhead (0.5 us) instead of its eager one
// (5 us). Four 20 us GEMMs in a forward: q of layer 0 (the attention's), gate of layer 0
// (a dense MLP's), the router of layer 0 and the output layer's (outside the blocks), then
// the optimizer's 20 us: eager 5 x 25 = 125 us; attn captures q: 120.5; layers q, gate and
// the router: 111.5; iteration the four forward ones, not the optimizer step: 107; the
// moe_router scopes q and the router: 116.
TEST(CudaGraphs, CapturedKernelsCostTheInGraphOverhead) {
  mp_stack_profile p = Profile();
  p.kernel_overhead_s = 5e-6;
  p.graph_kernel_overhead_s = 0.5e-6;
  HostCase k;
  k.plan.model.n_experts = 0;
  k.Gemm(20e-6).module = MP_MOD_Q;
  k.ops.back().layer = 0;
  k.Gemm(20e-6).module = MP_MOD_GATE;
  k.ops.back().layer = 0;
  k.Gemm(20e-6).module = MP_MOD_ROUTER;
  k.ops.back().layer = 0;
  k.Gemm(20e-6).module = MP_MOD_OUTPUT;
  k.Gemm(20e-6).phase = MP_PHASE_OPTIMIZER;
  const double want[MP_CUDA_GRAPHS_COUNT] = {125e-6, 120.5e-6, 111.5e-6, 107e-6, 116e-6, 116e-6};
  for (int g = 0; g < MP_CUDA_GRAPHS_COUNT; g++) {
    k.plan.opts.cuda_graphs = (mp_cuda_graphs)g;
    EXPECT_NEAR(k.Step(p), want[g], 1e-12) << mp_cuda_graphs_name((mp_cuda_graphs)g);
  }
  // a stack that states no in-graph cost is refused by name
  p.graph_kernel_overhead_s = -1.0;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_sim_result r;
  EXPECT_EQ(k.Run(&ctx, p, &r), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "graph_kernel_overhead_us"), nullptr) << mp_errmsg(&ctx);
}

// A tiny MoE layer's pass after the dispatcher's synchronisation, the host 10 us a launch
// and no kernel overhead: layer 0's experts (5 us, the first op the host issues after the
// sync), then layer 1's q, pre-MLP norm and router (2 us each) and its experts (30 us).
// Eager, the host issues them at 10, 20, 30, 40 and 50 us: the GPU waits for each (the
// stream ends at 50 + 30 = 80 where the kernels sum to 41). Under attn q is a graph of one
// launch, as eager: 80. Under attn+moe_router q, the norm and the router are one graph, one
// launch at 20, the experts issued at 30: the stream runs 10-15, 20-26, 30-60: 60, the
// host's two launches of the norm and the router (20 us) gone. moe_preprocess adds no op of
// its own (the router's op holds the count kernels): 60.
TEST(HostIssue, RouterGraphRemovesTheRoutersLaunches) {
  mp_stack_profile p = Profile();
  p.host_launch_s = 10e-6;
  HostCase k;
  const struct {
    double t;
    int module, layer;
  } ops[] = {{5e-6, MP_MOD_EXPERTS_DOWN, 0},
             {2e-6, MP_MOD_Q, 1},
             {2e-6, MP_MOD_FFN_NORM, 1},
             {2e-6, MP_MOD_ROUTER, 1},
             {30e-6, MP_MOD_EXPERTS_GATE, 1}};
  for (const auto &o : ops) {
    k.Gemm(o.t).module = o.module;
    k.ops.back().layer = o.layer;
  }
  k.ops[0].host_sync = 1;
  const double want[][2] = {{MP_CUDA_GRAPHS_NONE, 80e-6},
                            {MP_CUDA_GRAPHS_ATTN, 80e-6},
                            {MP_CUDA_GRAPHS_ROUTER, 60e-6},
                            {MP_CUDA_GRAPHS_PREPROCESS, 60e-6}};
  for (const auto &w : want) {
    k.plan.opts.cuda_graphs = (mp_cuda_graphs)w[0];
    EXPECT_NEAR(k.Step(p), w[1], 1e-12) << mp_cuda_graphs_name(k.plan.opts.cuda_graphs);
  }
}

// Megatron-Core's rules for its graphs (transformer_config.py, arguments.py, core_v0.14.0),
// each refused by name.
TEST(CudaGraphs, RulesRefuseWhatMegatronRefuses) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model dense, moe;
  ASSERT_EQ(mp_model_load(&ctx, "llama3.1-8b", &dense), MP_OK) << mp_errmsg(&ctx);
  ASSERT_EQ(mp_model_load(&ctx, "mixtral-8x7b", &moe), MP_OK) << mp_errmsg(&ctx);
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.cuda_graphs = MP_CUDA_GRAPHS_LAYERS;
  EXPECT_EQ(mp_rule_cuda_graphs_check(&ctx, &dense, &o), MP_OK) << mp_errmsg(&ctx);
  struct {
    const mp_model *m;
    mp_cuda_graphs g;
    mp_ac_mode ac;
    int check_grads;
    mp_mem_model mm;
    const char *words;  // nullptr: accepted
  } cases[] = {
      {&dense, MP_CUDA_GRAPHS_LAYERS, MP_AC_NONE, 0, MP_MEM_MODEL_TORCHTITAN, "launches its kernels eagerly"},
      {&dense, MP_CUDA_GRAPHS_LAYERS, MP_AC_SELECTIVE_CORE, 0, MP_MEM_MODEL_MEGATRON, "--recompute-granularity"},
      {&dense, MP_CUDA_GRAPHS_ATTN, MP_AC_SELECTIVE_CORE, 0, MP_MEM_MODEL_MEGATRON, nullptr},
      {&dense, MP_CUDA_GRAPHS_ATTN, MP_AC_FULL, 0, MP_MEM_MODEL_MEGATRON, "full recompute"},
      {&moe, MP_CUDA_GRAPHS_LAYERS, MP_AC_NONE, 0, MP_MEM_MODEL_MEGATRON, "synchronises the host"},
      {&moe, MP_CUDA_GRAPHS_ITERATION, MP_AC_NONE, 0, MP_MEM_MODEL_MEGATRON, "synchronises the host"},
      {&moe, MP_CUDA_GRAPHS_ATTN, MP_AC_NONE, 0, MP_MEM_MODEL_MEGATRON, nullptr},
      {&moe, MP_CUDA_GRAPHS_ROUTER, MP_AC_NONE, 0, MP_MEM_MODEL_MEGATRON, nullptr},
      {&moe, MP_CUDA_GRAPHS_PREPROCESS, MP_AC_NONE, 0, MP_MEM_MODEL_MEGATRON, nullptr},
      {&moe, MP_CUDA_GRAPHS_PREPROCESS, MP_AC_SELECTIVE_CORE, 0, MP_MEM_MODEL_MEGATRON, nullptr},
      {&moe, MP_CUDA_GRAPHS_ROUTER, MP_AC_FULL, 0, MP_MEM_MODEL_MEGATRON, "full recompute"},
      {&dense, MP_CUDA_GRAPHS_ROUTER, MP_AC_NONE, 0, MP_MEM_MODEL_MEGATRON, "has no MoE layer"},
      {&dense, MP_CUDA_GRAPHS_PREPROCESS, MP_AC_NONE, 0, MP_MEM_MODEL_MEGATRON, "has no MoE layer"},
      {&dense, MP_CUDA_GRAPHS_ITERATION, MP_AC_NONE, 1, MP_MEM_MODEL_MEGATRON, "--no-check-for-nan-in-loss-and-grad"},
      {&dense, MP_CUDA_GRAPHS_ITERATION, MP_AC_NONE, 0, MP_MEM_MODEL_MEGATRON, nullptr},
  };
  for (const auto &c : cases) {
    o.cuda_graphs = c.g;
    o.ac = c.ac;
    o.ddp.check_grads = c.check_grads;
    o.mem_model = c.mm;
    const mp_status st = mp_rule_cuda_graphs_check(&ctx, c.m, &o);
    if (!c.words) {
      EXPECT_EQ(st, MP_OK) << mp_errmsg(&ctx);
      continue;
    }
    EXPECT_EQ(st, MP_ERR_INVALID);
    EXPECT_NE(strstr(mp_errmsg(&ctx), c.words), nullptr) << mp_errmsg(&ctx);
  }
  // padded to a capacity the alltoall dispatcher does not synchronise: the layers capture
  o.ac = MP_AC_NONE;
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.cuda_graphs = MP_CUDA_GRAPHS_LAYERS;
  o.moe_routing.capacity_factor = 1.0;
  o.moe_routing.pad_to_capacity = 1;
  EXPECT_EQ(mp_rule_cuda_graphs_check(&ctx, &moe, &o), MP_OK) << mp_errmsg(&ctx);
  o.cuda_graphs = MP_CUDA_GRAPHS_PREPROCESS;
  EXPECT_EQ(mp_rule_cuda_graphs_check(&ctx, &moe, &o), MP_OK) << mp_errmsg(&ctx);
  // dropping without padding, alltoall's preprocess copies the output size to the host
  // (core_v0.16.0 transformer_config.py refuses moe_preprocess there, not moe_router)
  o.moe_routing.pad_to_capacity = 0;
  EXPECT_EQ(mp_rule_cuda_graphs_check(&ctx, &moe, &o), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "drops without padding"), nullptr) << mp_errmsg(&ctx);
  o.cuda_graphs = MP_CUDA_GRAPHS_ROUTER;
  EXPECT_EQ(mp_rule_cuda_graphs_check(&ctx, &moe, &o), MP_OK) << mp_errmsg(&ctx);
  o.moe_dispatcher = MP_MOE_DISPATCH_DEEPEP;  // DeepEP's preprocess copies nothing to the host
  o.cuda_graphs = MP_CUDA_GRAPHS_PREPROCESS;
  EXPECT_EQ(mp_rule_cuda_graphs_check(&ctx, &moe, &o), MP_OK) << mp_errmsg(&ctx);
}

// tiny-moe (2 layers, both MoE) under megatron-core on 8 H100s, dp_replicate 8, two
// micro-batches of one 64-token sequence a rank: without EP each layer's forward
// synchronises before its experts ("before_finish") and the stream waits for the host's
// first launch; every op after it takes at least its launches x the kernel overhead, which
// is the host's issue time here (host_launch_s set to it), so the host never falls further
// behind, nor outruns any pass. The step grows by 2 micro-batches x 2 layers x 5 us, the
// stack's kernel overhead.
TEST(HostIssue, MegatronMoEStepWaitsOnceALayer) {
  double step[2];
  for (int on = 0; on <= 1; on++) {
    PlanCase k("tiny-moe", "h100-8", "dp_replicate=8");
    ASSERT_EQ(mp_stack_load(&k.ctx, "megatron-core", &k.prof), MP_OK) << mp_errmsg(&k.ctx);
    ASSERT_EQ(mp_model_n_moe_layers(&k.m), 2);
    mp_stack_plan_options(&k.prof, &k.c.gpu, &k.o);
    k.o.seq = 64;
    k.o.micro_batch = 1;
    k.o.global_batch = 16;
    k.prof.host_launch_s = on ? k.prof.kernel_overhead_s : 0.0;
    step[on] = k.Sim().step_time_s;
  }
  EXPECT_NEAR(step[1] - step[0], 2 * 2 * 5e-6, 1e-12);
}

// tiny-moe (2 MoE layers, one shared expert) as above with the host never binding
// (host_launch_s 0), the data-parallel all-reduce after the backward, the stack's 5 us kernel overhead and 0.5 us in a graph: attn+moe_router
// adds to attn's graphs each layer pass's pre-MLP norm, router and shared expert. A layer's
// forward: the norm, the router's GEMM and its softmax/top-k, the shared expert's gate, up,
// SwiGLU and down (7 kernels); its backward: the shared down's, gate's and up's two GEMMs each,
// the SwiGLU's, the router's softmax and two GEMMs and the norm's (11). 2 micro-batches x 2
// layers x 18 kernels x 4.5 us = 324 us off the step.
TEST(CudaGraphs, RouterScopeCapturesATinyMoELayersRouter) {
  double step[2];
  const mp_cuda_graphs g[2] = {MP_CUDA_GRAPHS_ATTN, MP_CUDA_GRAPHS_ROUTER};
  for (int i = 0; i < 2; i++) {
    PlanCase k("tiny-moe", "h100-8", "dp_replicate=8");
    ASSERT_EQ(mp_stack_load(&k.ctx, "megatron-core", &k.prof), MP_OK) << mp_errmsg(&k.ctx);
    mp_stack_plan_options(&k.prof, &k.c.gpu, &k.o);
    k.o.seq = 64;
    k.o.micro_batch = 1;
    k.o.global_batch = 16;
    k.o.cuda_graphs = g[i];
    k.o.ddp.overlap = 0;  // the gradients' all-reduce after the backward, beside no kernel
    k.prof.host_launch_s = 0.0;
    k.prof.kernel_overhead_s = 5e-6;
    k.prof.graph_kernel_overhead_s = 0.5e-6;
    step[i] = k.Sim().step_time_s;
  }
  EXPECT_NEAR(step[0] - step[1], 2 * 2 * 18 * 4.5e-6, 1e-9);
}

}  // namespace
