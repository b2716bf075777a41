// What MoE's routed experts cost, from their mechanism, each against a hand derivation:
//   - a grouped expert GEMM's tokens padded to the stack's tile (sim/cost.c), bf16 and
//     float8, forward and weight gradient, compute- and memory-bound;
//   - the slowest EP rank's rows under an imbalance and a capacity factor, dropped or
//     padded (exec/schedule_prep.c, mp_sched_moe_rows: Megatron-Core's get_capacity);
//   - the same in a real plan's schedule: the grouped ops' rows, the all-to-all bytes, the
//     step time and the refusals of nonsense.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>

#include "exec/plan.h"
#include "exec/schedule.h"
#include "sim/sim.h"
#include "sim/stack.h"
#include "tests/sim/moe_ops.h"

namespace {

// A stack whose GEMMs run at exactly half of peak at every size (gemm_eff_half_mnk 0: the
// curve x / (x + 0) is 1), HBM at its full rate, no launch overhead; grouped GEMMs tiled
// 128 rows by 64 tokens of reduction (PyTorch's torch._grouped_mm on SM90: TileShape
// 128 x 256 x 64, aten/src/ATen/native/cuda/GroupMM.cu).
const char *kStack =
    "{\"name\": \"moe-test\", \"gemm_eff_max\": 0.5, \"gemm_eff_half_mnk\": 0, \"fp8_gemm_eff_max\": 0.5,"
    " \"attention_eff\": 0.5, \"hbm_eff\": 1.0, \"link_eff\": 1.0, \"kernel_overhead_us\": 0,"
    " \"comm_overhead_us\": 0, \"frag_factor\": 1.0, \"source\": \"test\", %s}";

// The profile of `text`, a stack's JSON.
mp_stack_profile Parse(const char *text) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile p;
  EXPECT_EQ(mp_stack_from_text(&ctx, text, "moe-test", &p), MP_OK) << mp_errmsg(&ctx);
  return p;
}

mp_stack_profile Stack(const char *tiles) {
  char text[1024];
  snprintf(text, sizeof text, kStack, tiles);
  return Parse(text);
}

// An H100-like GPU with round peaks: bf16 1000 TFLOP/s, float8 2000, HBM 3350 GB/s (the
// H100 SXM's HBM3, data/gpus/h100-sxm.json).
mp_gpu Gpu() {
  mp_gpu g;
  memset(&g, 0, sizeof g);
  g.peak_tflops[MP_DTYPE_BF16] = 1000;
  g.peak_tflops[MP_DTYPE_FP8_E4M3] = g.peak_tflops[MP_DTYPE_FP8_E5M2] = 2000;
  g.peak_tflops[MP_DTYPE_FP32] = 60;
  g.hbm_GBps = 3350;
  return g;
}

// A grouped GEMM op of `experts` experts as the schedule writes it (exec/schedule_internal.h,
// gemm()): forward/input gradient m rows x n x k, weight gradient m x n x k tokens.
mp_op Grouped(int variant, int64_t m, int64_t n, int64_t k, int64_t experts, int dtype) {
  mp_op o;
  memset(&o, 0, sizeof o);
  o.type = MP_OP_COMPUTE;
  o.kernel = MP_KERNEL_GEMM;
  o.variant = (uint8_t)variant;
  o.dtype = (uint8_t)dtype;
  o.m = m;
  o.n = n;
  o.k = k;
  o.batch = experts;
  o.flops = 2.0 * (double)m * (double)n * (double)k * (double)experts;
  o.bytes = mp_gemm_bytes((double)m, (double)n, (double)k, (double)experts, mp_dtype_bytes((mp_dtype)dtype));
  o.grouped = 1;
  return o;
}

// The op's time on Gpu() under Stack() tiled 128 rows by 64 tokens.
double Tiled(const mp_op &op) {
  const mp_gpu g = Gpu();
  const mp_stack_profile tiled = Stack("\"grouped_gemm_tile_m\": 128, \"grouped_gemm_tile_k\": 64");
  return mp_sim_compute_op_s(&op, &g, &tiled);
}

// A stack whose GEMMs follow 0.5 x / (x + 2e9), a 5 us launch, 128-row tiles, grouped GEMMs on
// `streams` streams (0: one kernel).
mp_stack_profile TeStack(int streams) {
  const char *base =
      "{\"name\": \"te-test\", \"gemm_eff_max\": 0.5, \"gemm_eff_half_mnk\": 2e9, \"fp8_gemm_eff_max\": 0.5,"
      " \"attention_eff\": 0.5, \"hbm_eff\": 1.0, \"link_eff\": 1.0, \"kernel_overhead_us\": 5,"
      " \"comm_overhead_us\": 0, \"frag_factor\": 1.0, \"source\": \"test\", \"grouped_gemm_tile_m\": 128,"
      " \"grouped_gemm_streams\": %d}";
  char text[1024];
  snprintf(text, sizeof text, base, streams);
  return Parse(text);
}

}  // namespace

// DeepSeek-V3's expert gate (d_ff_expert 2048 x d_model 7168), 4 local experts of 200 rows
// each. The kernel runs 200 rows as two 128-row tiles, 256 rows:
//   padded FLOPs 2 x 256 x 2048 x 7168 x 4 = 30,064,771,072 at 0.5 x 1e15: 60.1295 us
//   bytes 4 x ((200 x 7168 + 7168 x 2048) x 2 + 200 x 2048 x 2) = 132,186,112 at 3.35e12:
//   39.4585 us
// so compute-bound at 60.1295 us; unpadded (a dense GEMM of the same FLOPs, or a stack
// stating no tile) 2 x 200 x 2048 x 7168 x 4 = 23,488,102,400: 46.9762 us.
TEST(MoeCost, GroupedGemmPadsRowsToTheTile) {
  const mp_gpu g = Gpu();
  const mp_stack_profile untiled = Stack("\"grouped_gemm_tile_m\": 0");
  mp_op op = Grouped(MP_VAR_FWD, 200, 2048, 7168, 4, MP_DTYPE_BF16);
  EXPECT_NEAR(Tiled(op), 60.129542144e-6, 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &untiled), 46.9762048e-6, 1e-12);
  op.grouped = 0; /* a dense GEMM of the same FLOPs: no tile padding */
  EXPECT_NEAR(Tiled(op), 46.9762048e-6, 1e-12);
  // 256 rows fill two tiles exactly: the same as unpadded, 2 x 256 x 2048 x 7168 x 4 at 5e14
  EXPECT_NEAR(Tiled(Grouped(MP_VAR_FWD, 256, 2048, 7168, 4, MP_DTYPE_BF16)), 60.129542144e-6, 1e-12);
}

// The weight gradient dW[2048, 7168] = dy^T x over 200 tokens per expert: the tokens are the
// reduction, run in 64-token steps, 4 of them, 256 tokens: the same padded FLOPs as above,
// 60.1295 us; its bytes 4 x ((2048 x 200 + 200 x 7168) x 2 + 2048 x 7168 x 2) = 132,186,112
// (39.4585 us) stay below.
TEST(MoeCost, GroupedWeightGradientPadsTheReduction) {
  EXPECT_NEAR(Tiled(Grouped(MP_VAR_WGRAD, 2048, 7168, 200, 4, MP_DTYPE_BF16)), 60.129542144e-6, 1e-12);
  // the input gradient dx[200, 7168] = dy W: rows padded as the forward's
  EXPECT_NEAR(Tiled(Grouped(MP_VAR_DGRAD, 200, 7168, 2048, 4, MP_DTYPE_BF16)), 60.129542144e-6, 1e-12);
}

// Float8 (E4M3, one byte an operand): padded FLOPs 30,064,771,072 at 0.5 x 2e15: 30.0648 us;
// bytes 4 x ((200 x 7168 + 7168 x 2048) x 1 + 200 x 2048 x 2) = 67,731,456: 20.2183 us.
TEST(MoeCost, GroupedGemmFloat8) {
  const mp_op op = Grouped(MP_VAR_FWD, 200, 2048, 7168, 4, MP_DTYPE_FP8_E4M3);
  EXPECT_NEAR(Tiled(op), 30.064771072e-6, 1e-12);
  EXPECT_NEAR(op.bytes, 67731456.0, 0.5);
}

// Small experts: 16 rows each. Padded to one 128-row tile the MMA work is 2 x 128 x 2048 x
// 7168 x 4 = 15,032,385,536 (30.0648 us), but the experts' weights must be read once per
// GEMM whatever the rows: bytes 4 x ((16 x 7168 + 7168 x 2048) x 2 + 16 x 2048 x 2) =
// 118,620,160 at 3.35e12 = 35.4090 us, the time. The useful FLOPs 2 x 16 x 2048 x 7168 x 4 =
// 1,879,048,192 reach 1,879,048,192 / (1e15 x 35.4090e-6) = 5.3 % of the bf16 peak, a tenth
// of the stack's 50 % for large GEMMs.
TEST(MoeCost, SmallExpertsAreBoundByTheirWeights) {
  const mp_op op = Grouped(MP_VAR_FWD, 16, 2048, 7168, 4, MP_DTYPE_BF16);
  const double t = Tiled(op);
  EXPECT_NEAR(t, 118620160.0 / 3350e9, 1e-12);
  EXPECT_NEAR(op.flops / (1e15 * t), 0.05307, 1e-4);
}

// The rows of the slowest EP rank's experts. DeepSeek-V3's layer at 4096 tokens a rank, top-8
// of 256 experts, ep 64: a rank routes r = 4096 x 8 / 256 = 128 rows to each expert, so a
// local expert gets 64 x 128 = 8192 balanced.
TEST(MoeCost, ImbalanceAndCapacityRows) {
  mp_moe_routing rt;
  memset(&rt, 0, sizeof rt);
  double load = 0;
  EXPECT_EQ(mp_sched_moe_rows(&rt, 4096, 8, 256, 64, 1, &load), 8192.0);
  EXPECT_EQ(load, 1.0);
  rt.imbalance = 1.5; /* the busiest rank gets 1.5 x: 12288 rows an expert */
  EXPECT_EQ(mp_sched_moe_rows(&rt, 4096, 8, 256, 64, 1, &load), 12288.0);
  EXPECT_EQ(load, 1.5);
  // capacity 1.25: ceil(128 x 1.25) = 160 rows an expert from each rank, 64 x 160 = 10240 <
  // 12288: the excess dropped, load 1.25
  rt.capacity_factor = 1.25;
  EXPECT_EQ(mp_sched_moe_rows(&rt, 4096, 8, 256, 64, 1, &load), 10240.0);
  EXPECT_EQ(load, 1.25);
  // an imbalance within the capacity keeps its rows: 1.1 x 8192 = 9011.2 < 10240
  rt.imbalance = 1.1;
  EXPECT_NEAR(mp_sched_moe_rows(&rt, 4096, 8, 256, 64, 1, &load), 9011.2, 1e-9);
  // padded to capacity: exactly 10240 whatever the imbalance
  rt.pad_to_capacity = 1;
  EXPECT_EQ(mp_sched_moe_rows(&rt, 4096, 8, 256, 64, 1, &load), 10240.0);
  rt.imbalance = 1.0;
  EXPECT_EQ(mp_sched_moe_rows(&rt, 4096, 8, 256, 64, 1, &load), 10240.0);
  // a capacity below the mean drops tokens even when balanced: C 0.5, 64 x 64 = 4096
  rt.pad_to_capacity = 0;
  rt.capacity_factor = 0.5;
  EXPECT_EQ(mp_sched_moe_rows(&rt, 4096, 8, 256, 64, 1, &load), 4096.0);
  EXPECT_EQ(load, 0.5);
  // Megatron-Core rounds a rank's capacity up: 100 tokens x top-2 of 64 experts is 3.125 an
  // expert, C 1: ceil(3.125) = 4 from each of 8 ranks, 32 rows (balanced 25, so no drop)
  rt.capacity_factor = 1.0;
  rt.pad_to_capacity = 1;
  EXPECT_EQ(mp_sched_moe_rows(&rt, 100, 2, 64, 8, 1, &load), 32.0);
  EXPECT_EQ(load, 32.0 / 25.0);
}

namespace {

// Qwen3-30B-A3B (128 experts, top-8, d_ff_expert 768) over 8 H100 with ep 8 under
// torchtitan-compile, 4096 tokens a micro-batch: 4096 x 8 x 8 / 128 = 2048 rows an expert,
// 16 local experts.
struct Qwen {
  mp_ctx ctx;
  mp_model m;
  mp_mesh mesh;
  mp_stack_profile prof;
  mp_plan_options o;
  Qwen() {
    mp_ctx_init(&ctx);
    EXPECT_EQ(mp_model_load(&ctx, "qwen3-30b-a3b", &m), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(mp_mesh_parse(&ctx, "dp_shard=8,ep=8", 8, &mesh), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(mp_stack_load(&ctx, "torchtitan-compile", &prof), MP_OK) << mp_errmsg(&ctx);
    mp_plan_options_init(&o);
    mp_gpu gpu;
    EXPECT_EQ(mp_gpu_load(&ctx, "h100-sxm", &gpu), MP_OK) << mp_errmsg(&ctx);
    mp_stack_plan_options(&prof, &gpu, &o);
    o.seq = 4096;
    o.micro_batch = 1;
    o.global_batch = 8;
    o.ac = MP_AC_NONE; /* every block's saved tensors held: the received rows' show in the peak */
  }
  // The first layer's forward gate GEMM and dispatch all-to-all of the plan's schedule.
  void Ops(mp_op *gate, mp_op *a2a) { MoeGateAndDispatch(&ctx, &m, &mesh, &o, gate, a2a); }
  // The plan simulated on one node of 8 H100 SXM.
  mp_sim_result Sim() {
    mp_cluster c;
    EXPECT_EQ(mp_cluster_make(&ctx, "h100-sxm", 8, 8, &c), MP_OK) << mp_errmsg(&ctx);
    mp_sim_config cfg = {};
    cfg.cluster = &c;
    cfg.stack = &prof;
    mp_sim_result r;
    EXPECT_EQ(mp_simulate_plan(&ctx, &m, &mesh, &o, &cfg, &r), MP_OK) << mp_errmsg(&ctx);
    return r;
  }
};

}  // namespace

// Balanced: the grouped gate GEMM is 16 experts of 2048 rows x 768 x 2048, one grouped launch;
// the dispatch sends the rank's 4096 x 8 rows of 2048 bf16 values, 134,217,728 bytes. With an
// imbalance of 1.5 the slowest rank's experts take 3072 rows each and its all-to-all 1.5 x the
// bytes; a capacity of 1.25 bounds them at 8 x ceil(256 x 1.25) = 2560 rows and 1.25 x.
TEST(MoeCost, ScheduleScalesTheSlowestRank) {
  Qwen q;
  const double bytes = 4096.0 * 8 * 2048 * 2;
  struct Step {
    double f, c;       /* the routing */
    int64_t rows;      /* the gate GEMM's rows an expert */
    double load;       /* the all-to-all's bytes over the balanced ones */
  } steps[] = {{0, 0, 2048, 1.0}, {1.5, 0, 3072, 1.5}, {1.5, 1.25, 2560, 1.25}};
  mp_sim_result r[3];
  for (int i = 0; i < 3; i++) {
    q.o.moe_routing.imbalance = steps[i].f;
    q.o.moe_routing.capacity_factor = steps[i].c;
    mp_op gate, a2a;
    q.Ops(&gate, &a2a);
    EXPECT_EQ(gate.m, steps[i].rows);
    EXPECT_EQ(gate.batch, 16);
    EXPECT_EQ(gate.grouped, 1);
    EXPECT_EQ(a2a.bytes, steps[i].load * bytes);
    r[i] = q.Sim();
  }
  EXPECT_GT(r[1].step_time_s, r[0].step_time_s);
  EXPECT_GT(r[1].peak_mem_bytes, r[0].peak_mem_bytes); /* the received rows' tensors */
  EXPECT_LT(r[2].step_time_s, r[1].step_time_s);       /* bounded by the capacity */
  EXPECT_GT(r[2].step_time_s, r[0].step_time_s);
}

// Nonsense is refused by the plan, naming what is wrong.
TEST(MoeCost, RoutingRefusals) {
  struct Case {
    double f, c;
    int pad;
    const char *model, *stack, *mesh, *words;
  } cases[] = {
      {0.5, 0, 0, "qwen3-30b-a3b", "torchtitan-compile", "dp_shard=8,ep=8", "at least 1"},
      {1, -1, 0, "qwen3-30b-a3b", "torchtitan-compile", "dp_shard=8,ep=8", "capacity factor -1"},
      {1, 0, 1, "qwen3-30b-a3b", "torchtitan-compile", "dp_shard=8,ep=8", "needs a capacity factor"},
      {1.5, 0, 0, "llama3.1-8b", "torchtitan-compile", "dp_shard=8", "dense model"},
      {9, 0, 0, "qwen3-30b-a3b", "torchtitan-compile", "dp_shard=8,ep=8", "exceeds 8"},
      {1.5, 0, 0, "tiny-moe", "meshplan-cpu", "dp_shard=2,ep=2", "meshplan's runtime"},
  };
  for (const Case &k : cases) {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_model m;
    mp_mesh mesh;
    mp_stack_profile prof;
    ASSERT_EQ(mp_model_load(&ctx, k.model, &m), MP_OK) << mp_errmsg(&ctx);
    ASSERT_EQ(mp_mesh_parse(&ctx, k.mesh, 0, &mesh), MP_OK) << mp_errmsg(&ctx);
    ASSERT_EQ(mp_stack_load(&ctx, k.stack, &prof), MP_OK) << mp_errmsg(&ctx);
    mp_plan_options o;
    mp_plan_options_init(&o);
    mp_gpu gpu;
    EXPECT_EQ(mp_gpu_load(&ctx, "h100-sxm", &gpu), MP_OK) << mp_errmsg(&ctx);
    mp_stack_plan_options(&prof, &gpu, &o);
    o.seq = 64;
    o.moe_routing.imbalance = k.f;
    o.moe_routing.capacity_factor = k.c;
    o.moe_routing.pad_to_capacity = k.pad;
    mp_plan *p = nullptr;
    EXPECT_EQ(mp_build_plan(&ctx, &m, &mesh, &o, &p), MP_ERR_INVALID) << k.words;
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find(k.words), std::string::npos) << mp_errmsg(&ctx);
    mp_plan_destroy(p);
  }
}

// A stack of moe-test's with `keys` is refused, its message naming `key`.
static void ExpectRefused(const char *keys, const char *key) {
  char text[1024];
  snprintf(text, sizeof text, kStack, keys);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_stack_profile p;
  EXPECT_EQ(mp_stack_from_text(&ctx, text, "moe-test", &p), MP_ERR_INVALID) << keys;
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find(key), std::string::npos) << mp_errmsg(&ctx);
}

// A tile outside 0..1024 is refused naming the key.
TEST(MoeCost, TileKeyRange) { ExpectRefused("\"grouped_gemm_tile_m\": 2048", "grouped_gemm_tile_m"); }

// Transformer Engine's GroupedLinear (stack key grouped_gemm_streams 4): one cuBLAS GEMM per
// expert, round-robin on 4 streams (transformer_engine/common/gemm/cublaslt_gemm.cu v2.2,
// nvte_multi_stream_cublas_gemm). A stack whose GEMMs follow 0.5 x / (x + 2e9) with a 5 us
// launch, on Gpu(). Qwen3-235B-A22B's expert gate under TP 4 x EP 8: 16 local experts of 512
// rows (whole 128-row tiles), n 1536, k 4096:
//   an expert's m n k = 512 x 1536 x 4096 = 3,221,225,472; FLOPs x 16 x 2 = 103,079,215,104;
//   bytes 16 x ((512 x 4096 + 4096 x 1536) x 2 + 512 x 1536 x 2) = 293,601,280: 87.6422 us
//   (below the compute time either way).
//   One kernel over the 16 (key 0): the curve at 16 x 3,221,225,472 = 51,539,607,552,
//   0.5 x 51,539,607,552 / 53,539,607,552 = 0.481322: 214.1584 us + 5 us = 219.1584 us.
//   Per expert on 4 streams: 4 kernels in flight fill the GPU together, the curve at
//   4 x 3,221,225,472 = 12,884,901,888, 0.5 x 12,884,901,888 / 14,884,901,888 = 0.432818:
//   238.1584 us, and 16 launches, 80 us: 318.1584 us.
// Two experts (fewer than the streams): both in flight, the curve at 2 x 3,221,225,472 as one
// kernel reads it (0.381551: 2 x 2 x 3,221,225,472 / (1e15 x 0.381551) = 33.7698 us), and two
// launches: 43.7698 us where one kernel takes 38.7698 us.
TEST(MoeCost, TransformerEngineLaunchesAGemmPerExpert) {
  const mp_stack_profile one = TeStack(0), te = TeStack(4);
  const mp_gpu g = Gpu();
  const mp_op op = Grouped(MP_VAR_FWD, 512, 1536, 4096, 16, MP_DTYPE_BF16);
  EXPECT_NEAR(op.bytes, 293601280.0, 0.5);
  EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &one), 219.158430208e-6, 1e-11);
  EXPECT_NEAR(mp_sim_compute_op_s(&op, &g, &te), 318.158430208e-6, 1e-11);
  const mp_op two = Grouped(MP_VAR_FWD, 512, 1536, 4096, 2, MP_DTYPE_BF16);
  EXPECT_NEAR(mp_sim_compute_op_s(&two, &g, &te), 43.769803776e-6, 1e-11);
  EXPECT_NEAR(mp_sim_compute_op_s(&two, &g, &one), 38.769803776e-6, 1e-11);
  EXPECT_EQ(mp_sim_op_launches(&op, &te), 16.0);
  EXPECT_EQ(mp_sim_op_launches(&op, &one), 1.0);
  // a dense GEMM (not grouped) is one kernel under either stack
  mp_op dense = op;
  dense.grouped = 0;
  EXPECT_DOUBLE_EQ(mp_sim_compute_op_s(&dense, &g, &te), mp_sim_compute_op_s(&dense, &g, &one));
  EXPECT_EQ(mp_sim_op_launches(&dense, &te), 1.0);
}

// Transformer Engine's GroupedLinear quantizes expert by expert (tex.split_quantize, one
// kernel a split outside delayed scaling: exec/schedule_ops.c te_expert_casts): a grouped
// float8 cast launches a kernel for each of its experts whatever the GEMM streams. Qwen3-30B-
// A3B's experts' fc1 input cast under blockwise, 16 local experts of 2048 rows of 2048: 67,108,864
// elements, 2 + 1 + 1 + 8/128 bytes each = 272,629,760 bytes at 3.35e12: 81.3820 us (its FLOPs,
// 4 an element at 60e12: 4.4739 us, below); one launch 5 us: 86.3820 us; 16 launches 80 us:
// 161.3820 us, on both stacks (streams 0 and 4).
TEST(MoeCost, TransformerEngineQuantizesPerExpert) {
  const mp_gpu g = Gpu();
  mp_op cast;
  memset(&cast, 0, sizeof cast);
  cast.type = MP_OP_COMPUTE;
  cast.kernel = MP_KERNEL_FP8_CAST;
  cast.dtype = MP_DTYPE_BF16;
  cast.m = 67108864;
  cast.batch = 1;
  cast.flops = 4.0 * 67108864.0;
  cast.bytes = (4.0 + 8.0 / 128.0) * 67108864.0;
  EXPECT_DOUBLE_EQ(cast.bytes, 272629760.0);
  for (int streams : {0, 4}) {
    const mp_stack_profile p = TeStack(streams);
    mp_op one = cast;
    EXPECT_NEAR(mp_sim_compute_op_s(&one, &g, &p), 86.38201791e-6, 1e-11) << streams;
    EXPECT_EQ(mp_sim_op_launches(&one, &p), 1.0);
    mp_op per_expert = cast;
    per_expert.batch = 16;
    per_expert.grouped = 1;
    EXPECT_NEAR(mp_sim_compute_op_s(&per_expert, &g, &p), 161.38201791e-6, 1e-11) << streams;
    EXPECT_EQ(mp_sim_op_launches(&per_expert, &p), 16.0);
  }
}

// A stream count outside 0..64 is refused naming the key.
TEST(MoeCost, StreamsKeyRange) { ExpectRefused("\"grouped_gemm_streams\": 65", "grouped_gemm_streams"); }

// Megatron-LM's gradient accumulation fusion (stack key wgrad_accum_fp32): the weight
// gradient GEMM adds into the fp32 main_grad, reading and writing 4-byte elements where an
// unfused GEMM writes 2-byte ones. Qwen3-235B-A22B's expert gate, dW[1536, 4096] over 512
// tokens an expert (64-token steps: no padding), 16 local experts:
//   FLOPs 2 x 1536 x 4096 x 512 x 16 = 103,079,215,104 at 0.5 x 1e15: 206.1584 us
//   bytes unfused 16 x ((1536 x 512 + 512 x 4096) x 2 + 1536 x 4096 x 2) = 293,601,280:
//   87.6422 us, so compute-bound at 206.1584 us;
//   fused 293,601,280 + 16 x 1536 x 4096 x 6 = 897,581,056 at 3.35e12: 267.9346 us,
//   memory-bound: the output's 8 bytes an element outweigh 512 tokens of reduction.
// At 2048 tokens an expert and 4 experts (the same FLOPs) the fused bytes are
// 4 x ((1536 x 2048 + 2048 x 4096) x 2 + 1536 x 4096 x 8) = 293,601,280: 87.6422 us, and
// the GEMM stays compute-bound at 206.1584 us. The forward and input gradient are unchanged.
TEST(MoeCost, FusedWeightGradientAccumulatesInFp32) {
  const mp_gpu g = Gpu();
  const mp_stack_profile plain = Stack("\"memory_model\": \"megatron\", \"grouped_gemm_tile_k\": 64");
  const mp_stack_profile fused =
      Stack("\"memory_model\": \"megatron\", \"grouped_gemm_tile_k\": 64, \"wgrad_accum_fp32\": true");
  const mp_op small = Grouped(MP_VAR_WGRAD, 1536, 4096, 512, 16, MP_DTYPE_BF16);
  EXPECT_NEAR(mp_sim_compute_op_s(&small, &g, &plain), 206.158430208e-6, 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_s(&small, &g, &fused), 897581056.0 / 3350e9, 1e-12);
  const mp_op large = Grouped(MP_VAR_WGRAD, 1536, 4096, 2048, 4, MP_DTYPE_BF16);
  EXPECT_NEAR(mp_sim_compute_op_s(&large, &g, &fused), 206.158430208e-6, 1e-12);
  const mp_op fwd = Grouped(MP_VAR_FWD, 512, 1536, 4096, 16, MP_DTYPE_BF16);
  EXPECT_DOUBLE_EQ(mp_sim_compute_op_s(&fwd, &g, &fused), mp_sim_compute_op_s(&fwd, &g, &plain));
}

// The main_grad the fusion accumulates into has the run's gradient dtype: bf16 under
// --grad-reduce-in-bf16 (the plan's fsdp.reduce_dtype; distributed_data_parallel.py
// core_v0.14.0 grad_dtype), which Transformer Engine's GEMM reads and writes as 2-byte
// elements (linear.py v2.5: out_dtype = main_grad.dtype, out = main_grad, accumulate). The
// bytes an element over the bf16 write: fp32 2 x 4 - 2 = 6, bf16 2 x 2 - 2 = 2, none without
// the fusion. The same 16-expert gate as above into bf16:
//   293,601,280 + 16 x 1536 x 4096 x 2 = 494,927,872 bytes at 3.35e12: 147.7397 us, under
//   the 206.1584 us of its FLOPs: compute-bound where the fp32 main_grad made it memory-bound.
TEST(MoeCost, FusedWeightGradientAccumulatesInTheMainGradDtype) {
  const mp_gpu g = Gpu();
  const mp_stack_profile plain = Stack("\"memory_model\": \"megatron\", \"grouped_gemm_tile_k\": 64");
  const mp_stack_profile fused =
      Stack("\"memory_model\": \"megatron\", \"grouped_gemm_tile_k\": 64, \"wgrad_accum_fp32\": true");
  static mp_plan fp32, bf16;  // zeroed; only the gradient dtype is read
  fp32.opts.fsdp.reduce_dtype = MP_DTYPE_FP32;
  bf16.opts.fsdp.reduce_dtype = MP_DTYPE_BF16;
  EXPECT_EQ(mp_sim_wgrad_accum_bytes(&fused, &fp32), 6.0);
  EXPECT_EQ(mp_sim_wgrad_accum_bytes(&fused, nullptr), 6.0);
  EXPECT_EQ(mp_sim_wgrad_accum_bytes(&fused, &bf16), 2.0);
  EXPECT_EQ(mp_sim_wgrad_accum_bytes(&plain, &bf16), 0.0);
  const mp_op small = Grouped(MP_VAR_WGRAD, 1536, 4096, 512, 16, MP_DTYPE_BF16);
  EXPECT_NEAR(mp_sim_compute_op_in_plan_s(&small, &g, &fused, &fp32), 897581056.0 / 3350e9, 1e-12);
  EXPECT_NEAR(mp_sim_compute_op_in_plan_s(&small, &g, &fused, &bf16), 206.158430208e-6, 1e-12);
  const mp_op wide = Grouped(MP_VAR_WGRAD, 1536, 4096, 64, 16, MP_DTYPE_BF16);
  // at 64 tokens an expert both are memory-bound: (1536 x 64 + 64 x 4096) x 2 x 16 +
  // 1536 x 4096 x 16 x (2 + 2) = 11,534,336 + 402,653,184 = 414,187,520 bytes into bf16
  EXPECT_NEAR(mp_sim_compute_op_in_plan_s(&wide, &g, &fused, &bf16), 414187520.0 / 3350e9, 1e-12);
}

// The key names Megatron-LM's fusion: a stack of another memory model is refused.
TEST(MoeCost, FusedWeightGradientIsMegatrons) {
  ExpectRefused("\"memory_model\": \"torchtitan\", \"wgrad_accum_fp32\": true", "wgrad_accum_fp32");
}

// With tp x cp = 1 the expert grid (etp=1) over dp_shard 8 with ep 4 puts the same ranks in
// the same EP groups (4 consecutive dp_shard ranks) and expert-FSDP groups (the other 2) as
// EP inside dp_shard, and each rank routes its whole micro-batch either way (tp 1): the same
// plan to the bit, time and memory, which is why the planner's default search leaves such a
// grid to the layout inside dp_shard (planner/search.c, grid_ep_ok).
TEST(MoeCost, GridWithoutTpOrCpIsTheLayoutInsideDpShard) {
  Qwen q;
  mp_sim_result r[2];
  const char *meshes[2] = {"dp_shard=8,ep=4", "dp_shard=8,ep=4,etp=1"};
  for (int i = 0; i < 2; i++) {
    ASSERT_EQ(mp_mesh_parse(&q.ctx, meshes[i], 8, &q.mesh), MP_OK) << mp_errmsg(&q.ctx);
    EXPECT_EQ(mp_mesh_expert_grid(&q.mesh), i);
    r[i] = q.Sim();
  }
  EXPECT_GT(r[0].step_time_s, 0.0);
  EXPECT_EQ(r[0].step_time_s, r[1].step_time_s);
  EXPECT_EQ(r[0].peak_mem_bytes, r[1].peak_mem_bytes);
  EXPECT_EQ(r[0].fits, r[1].fits);
}
