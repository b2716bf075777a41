// The schedule tests' fixture: a plan built from options and one rank's schedule, and the
// schedule expanded into its op instances.
#ifndef MP_TESTS_SCHEDULE_BUILT_H
#define MP_TESTS_SCHEDULE_BUILT_H

#include <gtest/gtest.h>

#include <vector>

#include "exec/plan.h"
#include "exec/schedule.h"

namespace sched_test {

struct Built {
  mp_ctx ctx;
  mp_model model;
  mp_plan *plan = nullptr;
  mp_arena *arena = nullptr;
  mp_schedule *s = nullptr;
  ~Built() {
    mp_arena_destroy(arena);
    mp_plan_destroy(plan);
  }
};

struct Opts {
  const char *model = "llama3.1-8b";
  const char *mesh = "dp_shard=8";
  mp_ac_mode ac = MP_AC_NONE;
  int fp8 = 0;
  mp_fp8_recipe fp8_recipe = MP_FP8_DEFAULT;  // the stack's (mp_fp8_recipe_of)
  int gpu_cc = 0;  // the GPU's compute capability (mp_float8_options.gpu_cc; 0: Hopper's layouts)
  int fp8_param_gather = 0;                   // Megatron-Core's --fp8-param-gather
  int fp8_all_gather = 0;                     // torchtitan's enable_fsdp_float8_all_gather
  int nvfp4_no_rht = 0;                       // NVFP4 without the random Hadamard transform
  int fp8_dpa = 0;                            // Transformer Engine's float8 attention
  int fp8_amax_tp = 0;                        // delayed scaling's amaxes over TP only
  mp_fp8_scope fp8_scope = MP_FP8_SCOPE_LINEARS;  // torchtitan's float8 Linears and/or grouped GEMMs
  int reshard = 1;
  int shard_logits = 1;
  int sp = -1;  // the plan's default: on with tp > 1
  mp_mem_model mem_model = MP_MEM_MODEL_TORCHTITAN;
  mp_attn_impl attn = MP_ATTN_FLASH;
  mp_loss_impl loss = MP_LOSS_EAGER;
  int64_t micro_batch = 1;
  int64_t global_batch = 0;
  int64_t seq = 8192;
  int rank = 0;
  mp_pp_schedule pp_schedule = MP_PP_1F1B;
  int pp_virtual = 1;
  mp_cp_rotate cp_rotate = MP_CP_ROTATE_ALLGATHER;
  mp_cp_comm cp_comm = MP_CP_COMM_P2P;
  int dp_overlap = 0;
  int dist_opt = 0;
  int ddp_scale = 0, ddp_check = 0;  // Megatron's DDP bucket preparation (mp_ddp_options;
                                     // ddp_scale 0: --ddp-average-in-collective)
  mp_schedule_mode mode = MP_SCHEDULE_EXPANDED;
  int moe_fp8_dispatch = 0;
  mp_moe_dispatcher moe_dispatcher = MP_MOE_DISPATCH_ALLTOALL;  // the flex dispatcher's backends too
  uint32_t recompute_modules = 0;  // bits 1 << mp_rc_module
  int fp8_act_cache = 0;
  mp_dtype moment_dtype = MP_DTYPE_FP32;
  mp_mfsdp_strategy mfsdp_strategy = MP_MFSDP_OPTIM_GRADS_PARAMS;  // Megatron FSDP's
  int fsdp_double_buffer = 0;
  mp_dtype reduce_dtype = MP_DTYPE_FP32;  // FSDP's gradient reduction (mp_fsdp_options)
  int flat_params = 0;                    // FSDP1's flat parameters (mp_fsdp_options)
  int async_tp = 0;                       // torchtitan's AsyncTP (tp_comm_fused)
  int te_spec = 0;                        // Megatron-Core's TE layer spec (mp_plan_options)
  int loss_chunks = 0;                    // torchtitan's ChunkedLossWrapper (0, 1: off)
  mp_recompute_method recompute_method = MP_RECOMPUTE_NONE;  // Megatron-Core's, under full AC
  int recompute_num_layers = 0;
};

inline void FillOptions(const Opts &o, mp_plan_options *out) {
  mp_plan_options &po = *out;
  mp_plan_options_init(&po);
  po.ac = o.ac;
  po.fp8 = o.fp8;
  po.fp8_opts.recipe = o.fp8_recipe;
  po.fp8_opts.gpu_cc = o.gpu_cc;
  po.fp8_opts.param_gather = o.fp8_param_gather;
  po.fp8_opts.all_gather = o.fp8_all_gather;
  po.fp8_opts.nvfp4_no_rht = o.nvfp4_no_rht;
  po.fp8_opts.dpa = o.fp8_dpa;
  po.fp8_opts.amax_tp = o.fp8_amax_tp;
  po.fp8_opts.scope = o.fp8_scope;
  po.fsdp.reshard_after_forward = o.reshard;
  po.tp.shard_logits = o.shard_logits;
  po.sp = o.sp;
  po.mem_model = o.mem_model;
  po.attn = o.attn;
  po.loss = o.loss;
  po.micro_batch = o.micro_batch;
  po.global_batch = o.global_batch;
  po.seq = o.seq;
  po.pp_schedule = o.pp_schedule;
  po.pp_virtual = o.pp_virtual;
  po.cp_rotate = o.cp_rotate;
  po.cp_comm = o.cp_comm;
  po.ddp.overlap = o.dp_overlap;
  po.ddp.shard_optimizer = o.dist_opt;
  po.ddp.scale_grads = o.ddp_scale;
  po.ddp.check_grads = o.ddp_check;
  po.moe_dispatcher = o.moe_dispatcher;
  po.moe_fp8_dispatch = o.moe_fp8_dispatch;
  po.recompute_modules = o.recompute_modules;
  po.fp8_act_cache = o.fp8_act_cache;
  po.moment_dtype = o.moment_dtype;
  po.mfsdp_strategy = o.mfsdp_strategy;
  po.fsdp_double_buffer = o.fsdp_double_buffer;
  po.fsdp.reduce_dtype = o.reduce_dtype;
  po.fsdp.flat_params = o.flat_params;
  po.tp_comm_fused = o.async_tp;
  po.te_spec = o.te_spec;
  po.loss_chunks = o.loss_chunks;
  po.recompute_method = o.recompute_method;
  po.recompute_num_layers = o.recompute_num_layers;
}

// Megatron-LM's memory model on `mesh`: its vocab-parallel cross-entropy (in place),
// sequences of 4096 tokens.
inline Opts Megatron(const char *mesh) {
  Opts o;
  o.mesh = mesh;
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.loss = MP_LOSS_INPLACE;
  o.seq = 4096;
  return o;
}

// The plan of o alone: mp_build_plan's status (its message on b->ctx).
inline mp_status PlanOnly(Built *b, const Opts &o) {
  mp_ctx_init(&b->ctx);
  if (mp_model_load(&b->ctx, o.model, &b->model) != MP_OK) return b->ctx.last;
  mp_mesh mesh;
  if (mp_mesh_parse(&b->ctx, o.mesh, 0, &mesh) != MP_OK) return b->ctx.last;
  mp_plan_options po;
  FillOptions(o, &po);
  return mp_build_plan(&b->ctx, &b->model, &mesh, &po, &b->plan);
}

inline void Build(Built *b, const Opts &o) {
  ASSERT_EQ(PlanOnly(b, o), MP_OK) << mp_errmsg(&b->ctx);
  b->arena = mp_arena_create();
  ASSERT_EQ(mp_schedule_build(&b->ctx, b->plan, o.rank, o.mode, b->arena, &b->s), MP_OK)
      << mp_errmsg(&b->ctx);
  ASSERT_EQ(mp_schedule_check(&b->ctx, b->s), MP_OK) << mp_errmsg(&b->ctx);
}

// One expanded op instance, with everything the mode must not change.
struct Inst {
  const mp_op *op;
  int32_t layer, unit;
  int64_t index;
  std::vector<int64_t> deps;
};

inline std::vector<Inst> Expand(const mp_schedule *s) {
  std::vector<Inst> v;
  mp_schedule_iter it;
  mp_schedule_iter_begin(s, &it);
  while (mp_schedule_iter_next(&it)) {
    Inst x{it.op, it.layer, it.unit, it.index, {}};
    for (int i = 0; i < it.op->n_dep; i++) x.deps.push_back(mp_schedule_iter_dep(&it, i));
    v.push_back(x);
  }
  return v;
}

// Net ACTIVATIONS bytes block `layer`'s forward leaves saved for its backward.
inline int64_t SavedByBlock(const mp_schedule *s, int layer) {
  int64_t net = 0;
  for (const Inst &x : Expand(s)) {
    if (x.layer != layer || x.op->phase != MP_PHASE_FORWARD || x.op->mem_cat != MP_MEM_ACTIVATIONS)
      continue;
    if (x.op->type == MP_OP_ALLOC) net += x.op->mem_bytes;
    if (x.op->type == MP_OP_FREE) net -= x.op->mem_bytes;
  }
  return net;
}

}  // namespace sched_test

#endif
