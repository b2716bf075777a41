/* Step schedule builder: one strategy table per memory model (mem_strategy,
 * schedule_internal.h), and the steps the autograd runtimes share (the builder's overview:
 * schedule.c).
 *
 *   torchtitan     PyTorch FSDP2 as torchtitan runs it: bf16 activations, what autograd
 *                  saves, one block of gather prefetch, a pipeline stage's outputs kept
 *   megatron       Megatron-LM: the tensors Korthikanti et al. count, DDP's state (main
 *                  gradients, masters, Adam; sharded with the distributed optimizer), SP
 *                  re-gathering its inputs in backward, Transformer Engine's p2p ring
 *   meshplan-cpu   meshplan's runtime on the CPU: its activation layout in fp32, blocking
 *                  MPI collectives, float8 emulated (or on codes when the plan asks)
 *   meshplan-cuda  the same runtime on CUDA: bf16, NCCL's overlap, float8 on codes
 * The steps are the autograd runtimes' (here and in schedule_ops.c, schedule_act.c) or the
 * meshplan runtimes' (schedule_rt.c). */
#include "exec/schedule_internal.h"

/* ---- the autograd runtimes' steps (torchtitan, Megatron-LM) ----------------------------- */

/* The resident state: the rank's shards in the master dtype, as many gradients and two AdamW
 * states (FSDP); under DDP the model-dtype parameters beside the fp32 masters, the fp32
 * main gradients, the masters and Adam state whole or on the rank's 1/d
 * (mp_plan_ddp_state). */
static int64_t expert_numel(const mp_schedule_prep *pr) {
  int64_t n = 0;
  for (int u = 0; u < pr->n_ui; u++) n += pr->ui[u].numel_expert;
  return n;
}

/* DDP's state of the stage's n parameters, ne of them routed experts whose optimizer is cut
 * over the expert-DP group (mp_plan_ddp_expert_state); ne is 0 unless the experts are
 * reduced apart. */
static void ddp_state(const gen *g, int64_t n, int64_t ne, int64_t *param_bytes, int64_t *grad_bytes,
                      int64_t *optimizer_bytes, int64_t *shard) {
  mp_plan_ddp_state(g->p, n - ne, param_bytes, grad_bytes, optimizer_bytes, shard);
  if (ne <= 0) return;
  int64_t pb, gb, ob, sh;
  mp_plan_ddp_expert_state(g->p, ne, &pb, &gb, &ob, &sh);
  *param_bytes += pb, *grad_bytes += gb, *optimizer_bytes += ob, *shard += sh;
}

/* Megatron FSDP's all-gather prefetch beyond the one block the builder gathers ahead
 * (schedule.c): without --fsdp-double-buffer, AllGatherPipeline.all_gather_params adds the
 * next units while fewer than suggested_AG_prefetch_size elements are prefetched, that is
 * half of suggested_communication_unit_size, 10^9 elements unless set (megatron_fsdp.py,
 * core_v0.14.0): ceil(5 x 10^8 / e) blocks of e elements ahead, within the model chunk (one
 * MegatronFSDP instance a chunk). Returns the gathered bytes of the blocks past the first,
 * held beside the current block's (the largest block's, at the gather dtype); with the
 * double buffer (two units' fixed buffers: the current and the next) none. */
int64_t mp_sched_mfsdp_prefetch_extra_bytes(const gen *g) {
  if (!mp_plan_is_megatron_fsdp(g->p) || g->p->opts.fsdp_double_buffer) return 0;
  const int64_t window = 500000000;
  int64_t numel = 0;
  double bytes = 0;
  for (int l = 0; l < (int)g->p->model.n_layers; l++) {
    if (g->first_unit[l] < 0) continue;
    int64_t e = 0;
    double b = 0;
    for (int k = 0; k < g->n_units[l]; k++) e += g->ui[g->first_unit[l] + k].numel_tp, b += g->ui[g->first_unit[l] + k].gather_bytes;
    if (e > numel) numel = e, bytes = b;
  }
  if (numel == 0) return 0;
  int64_t ahead = (window + numel - 1) / numel, room = g->p->layers_per_chunk - 2;
  if (ahead - 1 < room) room = ahead - 1;
  return room > 0 ? (int64_t)bytes * room : 0;
}

/* --fp8-param-gather's float8 model weights on the stage (schedule_prep.c's sums per unit):
 * their tp-local elements, of them the routed experts' reduced apart, the rank's at rest
 * (its FSDP shard, or all of them under DDP) and their tensors. */
typedef struct f8_weights {
  int64_t tp, expert, local, tensors;
} f8_weights;

static f8_weights f8_of(const mp_schedule_prep *pr) {
  f8_weights f = {0, 0, 0, 0};
  for (int u = 0; u < pr->n_ui; u++)
    f.tp += pr->ui[u].numel_f8, f.expert += pr->ui[u].numel_f8_expert, f.local += pr->ui[u].numel_f8_local,
        f.tensors += pr->ui[u].n_f8;
  return f;
}

/* The model dtype's bytes of n parameters, f of them float8 weights (1 byte each). */
static double model_bytes(const gen *g, int64_t n, int64_t f) {
  return (double)(n - f) * mp_dtype_bytes(g->param_dtype) + (double)f;
}

/* Transformer Engine's float8 copies of layer l's float8 weights (l < 0: the stage's). */
static int64_t f8_held_bytes(const gen *g, const unit_info *ui, int n_ui, int l) {
  int64_t b = 0;
  if (l < 0) {
    for (int u = 0; u < n_ui; u++) b += ui[u].f8_held_bytes;
    return b;
  }
  if (g->first_unit[l] < 0) return 0;
  for (int k = 0; k < g->n_units[l]; k++) b += ui[g->first_unit[l] + k].f8_held_bytes;
  return b;
}

/* The float8 copies that live within a step (blockwise's column-wise copy of a float8 model
 * weight: mp_fp8_te_copy_per_step) are made by the layer's forward in the step's first
 * micro-batch (Float8BlockwiseQTensorBase._create_columnwise from get_weight_workspace's
 * update_usage) and dropped in the optimizer step (autograd_optimizer). */
void mp_sched_f8_held_fwd(gen *g) {
  if (!g->sh.f8_held_per_step || g->phase == MP_PHASE_RECOMPUTE || g->layer < 0) return;
  const int64_t b = f8_held_bytes(g, g->ui, g->n_ui, g->layer);
  if (b <= 0) return;
  const int32_t i = mem(g, MP_OP_ALLOC, MP_MEM_FP8, BUF_F8_HELD, b, g->layer, -1, MP_STREAM_COMPUTE);
  if (i >= 0) g->ops[i].when = MP_WHEN_FIRST_MICRO;
}

void mp_sched_f8_held_layer(gen *g, int bwd, int alloc) {
  if (!g->sh.f8_held_per_layer || g->layer < 0 || (!bwd && g->phase == MP_PHASE_RECOMPUTE)) return;
  const int64_t b = f8_held_bytes(g, g->ui, g->n_ui, g->layer);
  if (b > 0) mem(g, alloc ? MP_OP_ALLOC : MP_OP_FREE, MP_MEM_FP8, BUF_F8_HELD, b, g->layer, -1, MP_STREAM_COMPUTE);
}

static void f8_held_free(gen *g) {
  if (!g->sh.f8_held_per_step) return;
  for (int l = 0; l < (int)g->p->model.n_layers; l++) {
    const int64_t b = f8_held_bytes(g, g->ui, g->n_ui, l);
    if (b > 0) mem(g, MP_OP_FREE, MP_MEM_FP8, BUF_F8_HELD, b, l, -1, MP_STREAM_COMPUTE);
  }
}

static void autograd_resident(gen *g, const mp_schedule_prep *pr) {
  const int64_t mb = mp_dtype_bytes(g->p->opts.master_dtype), n = pr->params_numel;
  int64_t param_bytes = n * mb, grad_bytes = n * mb;
  int64_t optimizer_bytes = mp_plan_adamw_moment_bytes(&g->p->opts, n);
  if (g->ddp) {
    int64_t shard;
    ddp_state(g, n, expert_numel(pr), &param_bytes, &grad_bytes, &optimizer_bytes, &shard);
  }
  /* Megatron FSDP (optim_grads_params): the model-dtype weights' shard beside the fp32 main
   * weights' (param_and_grad_buffer.py: model_weight_buffer and main_weight_buffer, both
   * distributed), the main gradients' shard (main_grad_buffer: fp32 with grad_reduce_in_fp32,
   * else the weights' bf16; _init_each_parameter_group_buffers at core_v0.14.0) */
  if (mp_plan_is_megatron_fsdp(g->p)) {
    param_bytes += n * mp_dtype_bytes(g->param_dtype);
    grad_bytes = n * mp_dtype_bytes(g->reduce_dtype);
  }
  /* --fp8-param-gather: the float8 Linears' model weights are Transformer Engine float8
   * tensors, 1 byte an element where the model dtype's are 2 (DDP's whole copy, Megatron
   * FSDP's shard); their scales (an fp32 a tensor) are left out */
  param_bytes -= f8_of(pr).local * (mp_dtype_bytes(g->param_dtype) - 1);
  /* MXFP8's (fp8_param_gather_bf16): the bf16 parameters' buffer stays allocated while
   * reuse_grad_buf_for_mxfp8_param_ag leaves them on their own storage (param_and_grad_buffer.py
   * _ParamAndGradBuffer.__init__, core_v0.14.0 to core_v0.16.0): their model dtype twice */
  if (g->sh.fp8_param_gather_bf16 && g->ddp)
    param_bytes += (pr->params_numel - f8_of(pr).local) * mp_dtype_bytes(g->param_dtype);
  mp_sched_resident(g, MP_MEM_PARAMS, BUF_PARAMS, param_bytes);
  mp_sched_resident(g, MP_MEM_OPTIMIZER, BUF_OPTIMIZER, optimizer_bytes);
  mp_sched_resident(g, MP_MEM_GRADS, BUF_GRADS, grad_bytes);
  /* Transformer Engine's float8 weight copies, written in place each step and held through
   * it (mp_fp8_te_weight_copy_bytes); those that live within a step are mp_sched_f8_held_fwd's */
  const int64_t held =
      g->sh.f8_held_per_step || g->sh.f8_held_per_layer ? 0 : f8_held_bytes(g, pr->ui, pr->n_ui, -1);
  if (held > 0) mp_sched_resident(g, MP_MEM_FP8, BUF_F8_HELD, held);
  const int64_t ahead = mp_sched_mfsdp_prefetch_extra_bytes(g);
  if (ahead > 0) mp_sched_resident(g, MP_MEM_GATHERED, BUF_GATHERED, ahead);
}

/* The end of a chunk's backward: after the stage's last chunk the root unit's parameters
 * are freed and its gradients reduced. */
static void autograd_chunk_bwd_end(gen *g, int last_chunk) {
  if (!last_chunk || g->root_unit < 0) return;
  mp_sched_free_units(g, -1, g->root_unit, 1, 0, 0);
  mp_sched_reduce_units(g, -1, g->root_unit, 1, 0, 0);
}

/* The optimizer: the global gradient norm (clipping), AdamW on the shard. Under DDP with
 * its optimizer sharded the rank steps its 1/d of the parameters, refreshes its
 * model-dtype copy and, without overlap, all-gathers the updated parameters over the
 * data-parallel group here; with overlap (--overlap-param-gather) the next forward gathers
 * them block by block (mp_sched_dopt_gather). Under DDP every rank then zeroes its whole
 * gradient buffer. */
static void autograd_optimizer(gen *g, const mp_schedule_prep *pr, int world_reduce) {
  int64_t shard_n = pr->params_numel, gb = 0;
  if (g->ddp) {
    int64_t pb, ob;
    ddp_state(g, pr->params_numel, expert_numel(pr), &pb, &gb, &ob, &shard_n);
  }
  const double shard = (double)shard_n;
  int32_t gn = compute(g, MP_KERNEL_GRAD_NORM, MP_VAR_FWD, -1, (int64_t)shard, 0, 0, 1, 2.0 * shard,
                       4.0 * shard, MP_DTYPE_FP32);
  add_dep(g, gn, g->last_reduce, 0);
  if (world_reduce) comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_WORLD, MP_STREAM_COMPUTE, 4.0, MP_DTYPE_FP32, -1);
  /* read the master and the gradient and write the master (BYTES_ADAMW's three fp32 tensors
   * of its seven), m and v each read and written at the moments' bytes */
  const double opt_bytes =
      BYTES_ADAMW - 16.0 + 2.0 * (double)mp_plan_adamw_moment_bytes(&g->p->opts, 1);
  compute(g, MP_KERNEL_OPTIMIZER, MP_VAR_FWD, -1, (int64_t)shard, 0, 0, 1, FLOPS_ADAMW * shard,
          opt_bytes * shard, MP_DTYPE_FP32);
  const int mfsdp = mp_plan_is_megatron_fsdp(g->p);
  if (g->ddp || mfsdp) {
    /* the model dtype's parameters refreshed from the masters (Megatron FSDP's
     * copy_main_weights_to_model_weights: the rank's shard) */
    compute(g, MP_KERNEL_COPY, MP_VAR_FWD, -1, (int64_t)shard, 0, 0, 1, 0.0,
            (4.0 + mp_dtype_bytes(g->param_dtype)) * shard, MP_DTYPE_FP32);
    /* the gradient buffer zeroed for the next step's accumulation (Megatron-LM's
     * zero_grad_buffer, called by train_step each step: megatron/core/distributed/
     * param_and_grad_buffer.py grad_data.zero_(), core_v0.14.0; buffer_.zero() in v2.5's
     * megatron/model/distributed.py): DDP's whole buffer, Megatron FSDP's main-gradient shard */
    const int64_t rb = mp_dtype_bytes(g->reduce_dtype), zero = mfsdp ? rb * (int64_t)shard : gb;
    compute(g, MP_KERNEL_COPY, MP_VAR_FWD, -1, zero / rb, 0, 0, 1, 0.0, (double)zero, MP_DTYPE_FP32);
  }
  f8_held_free(g);
  const f8_weights f8 = f8_of(pr);
  if (g->sh.fp8_param_gather_bf16 && g->ddp && f8.local > 0) {
    /* MXFP8 weights gathered in bf16 through the gradient buffer: after the gather each
     * bucket's weights are copied out of it (the float8 ones quantized: the forward's
     * once-a-step cast) and its bf16 view zeroed for the gradients (bucket.param_data.zero_(),
     * param_and_grad_buffer.py finish_param_sync, core_v0.14.0): the bf16 weights read and
     * written, the whole view written */
    const double n = (double)pr->params_numel, pb = mp_dtype_bytes(g->param_dtype);
    compute(g, MP_KERNEL_COPY, MP_VAR_FWD, -1, pr->params_numel, 0, 0, 1, 0.0,
            pb * n + 2.0 * pb * (n - (double)f8.local), MP_DTYPE_FP32);
  }
  if (f8.local > 0 && !g->sh.fp8_param_gather_bf16 && (g->ddp || mfsdp)) {
    /* the float8 weights' part of the shard (the distributed optimizer cuts the buffer
     * evenly, so its share of the rank's 1/d) refreshed from the masters */
    const int64_t f8_shard = g->ddp ? (int64_t)((double)f8.local * shard / (double)pr->params_numel) : f8.local;
    mp_sched_f8_weight_refresh(g, f8_shard, f8.tp, f8.tensors, g->ddp ? mp_sched_ddp_group(g) : MP_GROUP_FSDP);
  }
  const int64_t ne = expert_numel(pr);
  if (g->shard_optimizer && !g->p->opts.ddp.overlap && mp_sched_dopt_ways(g) > 1)
    comm(g, MP_COLL_ALL_GATHER, mp_sched_ddp_group(g), MP_STREAM_COMPUTE,
         model_bytes(g, pr->params_numel - ne, f8.tp - f8.expert), g->param_dtype, -1);
  const mp_group eg = mp_plan_ddp_expert_group(g->p);
  if (g->shard_optimizer && !g->p->opts.ddp.overlap && ne > 0 && mp_mesh_group_size(&g->p->mesh, eg) > 1)
    comm(g, MP_COLL_ALL_GATHER, eg, MP_STREAM_COMPUTE, model_bytes(g, ne, f8.expert), g->param_dtype,
         -1); /* the experts' over expert-DP (the instance's part of it) */
}

/* ---- the tables ------------------------------------------------------------------------ */

static const mem_strategy k_torchtitan = {
    .x_bytes = 2, .prefetch = 1, .keeps_stage_output = 1, .dtensor_tp = 1, .saved = SAVED_AUTOGRAD,
    .fp8_tp_codes = 1, .rc_early_stop = 1,
    .resident = autograd_resident, .block_fwd = mp_sched_block_fwd_tt, .block_bwd = mp_sched_block_bwd_tt,
    .head_fwd = mp_sched_head_fwd, .head_bwd = mp_sched_head_bwd, .chunk_bwd_end = autograd_chunk_bwd_end,
    .optimizer = autograd_optimizer,
};

static const mem_strategy k_megatron = {
    .x_bytes = 2, .prefetch = 1, .sp_regathers = 1, .cp_kv_grouped = 1, .saved = SAVED_KORTHIKANTI,
    .fp8_tp_codes = 1, .fp8_te = 1,
    .resident = autograd_resident, .block_fwd = mp_sched_block_fwd_tt, .block_bwd = mp_sched_block_bwd_tt,
    .head_fwd = mp_sched_head_fwd, .head_bwd = mp_sched_head_bwd, .chunk_bwd_end = autograd_chunk_bwd_end,
    .optimizer = autograd_optimizer,
};

static const mem_strategy k_meshplan_cpu = {
    .runtime = 1, .x_bytes = 4, .host_mem = 1, .top_gathers_own = 1, .saved = SAVED_LAYOUT,
    .rc_early_stop = 1,
    .resident = mp_sched_rt_resident, .block_fwd = mp_sched_rt_block_fwd, .block_bwd = mp_sched_rt_block_bwd,
    .head_fwd = mp_sched_head_fwd_rt, .head_bwd = mp_sched_head_bwd_rt, .chunk_bwd_end = mp_sched_rt_chunk_bwd_end,
    .optimizer = mp_sched_rt_optimizer,
};

static const mem_strategy k_meshplan_cuda = {
    .runtime = 1, .x_bytes = 2, .f8_codes = 1, .overlap = 1, .prefetch = 1, .top_gathers_own = 1,
    .rc_early_stop = 1, .saved = SAVED_LAYOUT, .resident = mp_sched_rt_resident, .block_fwd = mp_sched_rt_block_fwd,
    .block_bwd = mp_sched_rt_block_bwd, .head_fwd = mp_sched_head_fwd_rt, .head_bwd = mp_sched_head_bwd_rt,
    .chunk_bwd_end = mp_sched_rt_chunk_bwd_end, .optimizer = mp_sched_rt_optimizer,
};

const mem_strategy *mp_sched_strategy(mp_mem_model m) {
  switch (m) {
    case MP_MEM_MODEL_TORCHTITAN: return &k_torchtitan;
    case MP_MEM_MODEL_MEGATRON: return &k_megatron;
    case MP_MEM_MODEL_MESHPLAN_CPU: return &k_meshplan_cpu;
    case MP_MEM_MODEL_MESHPLAN_CUDA: return &k_meshplan_cuda;
    default: return NULL;
  }
}
