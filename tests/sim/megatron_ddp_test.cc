// Megatron-LM's DDP prepares each gradient bucket on the compute stream before reducing it,
// in the last micro-batch only (megatron/core/distributed/param_and_grad_buffer.py
// start_grad_sync, core_v0.14.0): its norm checked for NaN and Inf, its elements scaled by
// 1/dp. Under a pipeline each stage's step is composed from a steady micro-batch's chunk
// times (sim/pipeline.c), so the last micro-batch's extra work must still reach the step.
#include "tests/sim/plan_case.h"

namespace {

// The megatron-core stack's options on k, one 4096-token sequence a micro-batch.
void MegatronCore(PlanCase &k, int64_t global_batch) {
  ASSERT_EQ(mp_stack_load(&k.ctx, "megatron-core", &k.prof), MP_OK) << mp_errmsg(&k.ctx);
  mp_stack_plan_options(&k.prof, &k.c.gpu, &k.o);
  k.o.seq = 4096;
  k.o.micro_batch = 1;
  k.o.global_batch = global_batch;
}

// llama3.1-8b on 8 H100s, pp 2 x dp_replicate 4 under megatron-core, four micro-batches of
// one 4096-token sequence. Stage 0 holds the embedding (128256 x 4096 = 525,336,576) and 16
// blocks of 218,112,000 parameters: 4,015,128,576 (stage 1 the 16 others, the final norm and
// the output layer: 4096 more). Their fp32 gradients, 4 bytes each, are read once by the norm
// and read and written by the scaling, 12 bytes a parameter at the stack's achieved HBM
// rate, plus the stack's launch overhead for two kernels a bucket (17 buckets: 16 blocks and
// the root's). The stage that ends the step runs all of it after its last micro-batch's
// blocks, so the step grows by that, less at most the data-parallel communication that
// was exposed without it (the later reduce-scatters can hide behind it), and no more.
TEST(MegatronDdp, BucketPreparationReachesThePipelinedStep) {
  double step[2], exposed[2];
  for (int on = 0; on <= 1; on++) {
    PlanCase k("llama3.1-8b", "h100-8", "pp=2,dp_replicate=4");
    MegatronCore(k, 16);
    k.o.ddp.scale_grads = k.o.ddp.check_grads = on;
    const mp_sim_result r = k.Sim();
    step[on] = r.step_time_s;
    exposed[on] = r.exposed_comm_s;
    if (!on) continue;
    const double params = 4015128576.0;
    const double prep = 12.0 * params / (k.c.gpu.hbm_GBps * 1e9 * k.prof.hbm_eff) + 2 * 17 * k.prof.kernel_overhead_s;
    EXPECT_LE(step[1] - step[0], prep * 1.001);
    EXPECT_GE(step[1] - step[0], prep - exposed[0]);
  }
}

// Megatron-Core's --align-param-gather leaves each bucket's gather to the schedule's
// param_sync_func, which forward_backward_no_pipelining never calls (core_v0.13.1
// pipeline_parallel/schedules.py), so each block's forward pre-hook dispatches its own gather
// and waits for it (distributed_data_parallel.py, finish_param_sync with
// skip_next_bucket_dispatch), and ProcessGroupNCCL starts it after the compute queued before it.
// llama3.1-8b on one H100 node, dp_replicate 8, distributed optimizer with overlapped gathers,
// one 4096-token sequence a rank. The same collectives run either way, so the gather stream's
// busy time G (the root unit's gather and the 32 blocks') is unchanged. Aligned, every gather
// runs while the compute stream waits for it, so the exposed time is at least G; the step
// grows by G less the gather time already exposed unaligned (at most its whole exposed time),
// and by no more than G. Under the interleaved schedule the gathers are the schedule's: the
// step does not move.
TEST(MegatronDdp, AlignedParamGatherWaitsBlockByBlock) {
  double step[2], exposed[2], gather[2];
  for (int on = 0; on <= 1; on++) {
    PlanCase k("llama3.1-8b", "h100-8", "dp_replicate=8");
    MegatronCore(k, 8);
    ASSERT_TRUE(k.o.ddp.shard_optimizer && k.o.ddp.overlap);
    k.o.ddp.align_param_gather = on;
    const mp_sim_result r = k.Sim();
    step[on] = r.step_time_s;
    exposed[on] = r.exposed_comm_s;
    gather[on] = r.comm_s[MP_STREAM_GATHER];
  }
  EXPECT_GT(gather[0], 0.0);
  EXPECT_NEAR(gather[1], gather[0], 1e-12);
  EXPECT_GE(exposed[1], gather[1] * 0.999);
  EXPECT_LE(step[1] - step[0], gather[0] * 1.001);
  EXPECT_GE(step[1] - step[0], gather[0] - exposed[0]);
  EXPECT_GT(step[1] - step[0], 0.0);

  double interleaved[2];
  for (int on = 0; on <= 1; on++) {
    PlanCase k("llama3.1-8b", "h100-8", "pp=2,dp_replicate=4");
    MegatronCore(k, 16);
    k.o.pp_schedule = MP_PP_INTERLEAVED;
    k.o.pp_virtual = 2;
    k.o.ddp.align_param_gather = on;
    interleaved[on] = k.Sim().step_time_s;
  }
  EXPECT_EQ(interleaved[1], interleaved[0]);
}

// Megatron-Core's --ddp-bucket-size (param_and_grad_buffer.py at core_v0.14.0): parameters
// taken in reverse order, a bucket closing once it holds bucket_size elements. llama3.1-8b's
// block is, in reverse order, fc2 (14336 x 4096 = 58,720,256), fc1 (2 x 14336 x 4096 =
// 117,440,512), the MLP norm (4096), proj (4096 x 4096 = 16,777,216), qkv (6144 x 4096 =
// 25,165,824) and the attention norm (4096): 218,112,000. A bucket size of exactly that
// closes one bucket on the block's last parameter, and one of 1e12 never closes one: both
// are meshplan's one bucket a block, so the step is the default's to the bit. A bucket size
// of 64 makes each of the six parameters a bucket, each gathered by its own all-gather: the
// bytes are the same, the gather stream's busy time grows by five more collectives' latency
// a block. Aligned (each block's gathers waited for at once) every gather is exposed, so
// the step grows by at least that growth; it grows by no more than it plus the reduce
// stream's growth (the six reduce-scatters a block) and the two preparation kernels (norm
// and scaling) of each of the 32 x 5 extra buckets.
TEST(MegatronDdp, BucketSizeSplitsEachBlocksCollectives) {
  const int64_t sizes[4] = {0, 218112000, 1000000000000LL, 64};
  double step[4], exposed[4], gather[4], reduce[4], overhead = 0.0;
  for (int s = 0; s < 4; s++) {
    PlanCase k("llama3.1-8b", "h100-8", "dp_replicate=8");
    MegatronCore(k, 8);
    k.o.ddp.align_param_gather = 1;
    k.o.ddp.bucket_size = sizes[s];
    const mp_sim_result r = k.Sim();
    step[s] = r.step_time_s;
    exposed[s] = r.exposed_comm_s;
    gather[s] = r.comm_s[MP_STREAM_GATHER];
    reduce[s] = r.comm_s[MP_STREAM_REDUCE];
    overhead = k.prof.kernel_overhead_s;
  }
  EXPECT_EQ(step[1], step[0]);
  EXPECT_EQ(step[2], step[0]);
  EXPECT_GT(gather[3], gather[0]);
  EXPECT_GT(reduce[3], reduce[0]);
  EXPECT_GE(exposed[3], gather[3] * 0.999);
  EXPECT_GE(step[3] - step[0], (gather[3] - gather[0]) * 0.999);
  EXPECT_LE(step[3] - step[0], (gather[3] - gather[0]) + (reduce[3] - reduce[0]) + 2 * 32 * 5 * overhead * 1.001);
}

}  // namespace

namespace {

// The kernels --no-gradient-accumulation-fusion adds to one micro-batch of the plan on mesh
// spec (llama3.1-8b on 8 H100s under megatron-core, one 4096-token sequence a rank): the
// copy kernels that follow a weight-gradient GEMM, their count (each op's `count` launches),
// elements, bytes and FLOPs; and the fused-accumulation bytes the plan leaves the GEMMs.
struct Unfused {
  int64_t n = 0;
  double elems = 0, bytes = 0, flops = 0, fused_bytes = -1;
};
Unfused UnfusedOps(const char *spec, int unfused) {
  PlanCase k("llama3.1-8b", "h100-8", spec);
  MegatronCore(k, 8);
  k.o.ddp.wgrad_unfused = unfused;
  mp_plan *p = nullptr;
  EXPECT_EQ(mp_build_plan(&k.ctx, &k.m, &k.mesh, &k.o, &p), MP_OK) << mp_errmsg(&k.ctx);
  Unfused u;
  if (!p) return u;
  mp_arena *a = mp_arena_create();
  mp_schedule *s = nullptr;
  EXPECT_EQ(mp_schedule_build(&k.ctx, p, 0, MP_SCHEDULE_EXPANDED, a, &s), MP_OK) << mp_errmsg(&k.ctx);
  for (int32_t i = 1; s && i < s->n_ops; i++) {
    const mp_op *op = &s->ops[i], *prev = &s->ops[i - 1];
    if (op->type != MP_OP_COMPUTE || op->kernel != MP_KERNEL_COPY || prev->type != MP_OP_COMPUTE ||
        prev->kernel != MP_KERNEL_GEMM || prev->variant != MP_VAR_WGRAD)
      continue;
    const int c = op->count > 1 ? op->count : 1;
    u.n += c;
    u.elems += c * (double)op->m;
    u.bytes += c * op->bytes;
    u.flops += c * op->flops;
  }
  u.fused_bytes = mp_sim_wgrad_accum_bytes(&k.prof, p);
  mp_arena_destroy(a);
  mp_plan_destroy(p);
  return u;
}

}  // namespace

// Megatron-LM's --no-gradient-accumulation-fusion: each weight-gradient GEMM writes the bf16
// param.grad and the parameter's hook moves it into the fp32 main_grad in a kernel of its own; the
// GEMM does not accumulate into it (the fused form's 6 extra bytes an element are not spent).
// llama3.1-8b's Linears a block: q 4096 x 4096, k and v 1024 x 4096, o 4096 x 4096, gate and up
// 14336 x 4096, down 4096 x 14336: 218,103,808 elements, 7 kernels; the output layer 128256 x 4096
// = 525,336,576, one more: 32 x 218,103,808 + 525,336,576 = 7,504,658,432 elements in 32 x 7 + 1 =
// 225 kernels. Megatron FSDP (optim_grads_params) copies (megatron_fsdp.py core_v0.14.0,
// main_grad.copy_): a 2-byte read and a 4-byte write, 45,027,950,592 bytes, no FLOPs; Megatron's
// DDP adds (distributed_data_parallel.py: main_grad.add_), reading the main_grad too: 10 bytes and
// one FLOP an element, 75,046,584,320 bytes. With the fusion none, and the GEMMs keep their 6
// bytes.
TEST(MegatronDdp, UnfusedWeightGradientsMoveIntoTheMainGrad) {
  const Unfused fsdp = UnfusedOps("dp_shard=8", 1);
  EXPECT_EQ(fsdp.n, 225);
  EXPECT_EQ(fsdp.elems, 7504658432.0);
  EXPECT_EQ(fsdp.bytes, 45027950592.0);
  EXPECT_EQ(fsdp.flops, 0.0);
  EXPECT_EQ(fsdp.fused_bytes, 0.0);
  const Unfused ddp = UnfusedOps("dp_replicate=8", 1);
  EXPECT_EQ(ddp.n, 225);
  EXPECT_EQ(ddp.bytes, 75046584320.0);
  EXPECT_EQ(ddp.flops, 7504658432.0);
  const Unfused fused = UnfusedOps("dp_shard=8", 0);
  EXPECT_EQ(fused.n, 0);
  EXPECT_EQ(fused.fused_bytes, 6.0);
}
