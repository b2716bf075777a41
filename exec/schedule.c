/* Step schedule builder: from a plan (exec/plan.h), the ordered ops of one training step on
 * one rank (exec/schedule.h). Walks the rank's pipeline stage: prologue, forward (embedding,
 * blocks, the MTP modules, head and loss), backward in reverse, optimizer.
 *
 * The builder's files:
 *   schedule.c          the builder's steps, the block segments
 *   schedule_mem.c      one strategy table per memory model (mem_strategy), the autograd
 *                       runtimes' resident state and optimizer
 *   schedule_prep.c     what the builder reads from a plan once (shapes, FSDP units, runs
 *                       of identical blocks)
 *   schedule_block.c    a block's ops, forward and backward, in the step's order
 *   schedule_head.c     the embedding, the head and the loss
 *   schedule_mtp.c      the multi-token-prediction modules' input side and heads
 *   schedule_ops.c      emission primitives, GEMMs and Linears, TP and EP collectives,
 *                       norms (the FLOP and byte conventions)
 *   schedule_act.c      what a block saves under each AC policy, its recompute (the
 *                       autograd runtimes)
 *   schedule_mla.c      multi-head latent attention's projections
 *   schedule_cp.c       context parallelism's ring attention
 *   schedule_pp.c       the pipeline order of a stage (mp_pp_order)
 *   schedule_fsdp.c     FSDP's gathers, reshards and gradient reductions; DDP's buckets
 *   schedule_rt.c       the meshplan runtimes' memory (their activation layout's events)
 *   schedule_program.c  the step program the runtime walks
 *   schedule_walk.c     iteration, self-check, totals, names
 *   schedule_internal.h the builder's state (gen) shared by them
 *
 * Invariants:
 *   - Both modes run the same generator; COMPACT only changes how many consecutive blocks
 *     one segment stands for. Blocks collapse when they have the same kind (dense / MoE),
 *     the same neighbour kinds (what they prefetch), the same FSDP unit layout and the same
 *     unit sizes, so every repetition of a segment is the same ops with layer advanced by
 *     layer_step and unit by unit_step. Block ops are written for the segment's first layer.
 *   - Memory: every ALLOC has a FREE with the same (buf, layer, unit) later in the same
 *     micro-batch, except the prologue's resident allocations; mp_schedule_check replays.
 *   - No string formatting and no malloc per op: ops and segments live in the arena, in
 *     arrays that double when full.
 *   - The first failure (arena out of memory, a builder bug) is kept on gen.st with its
 *     message on the ctx; every later emission is a no-op and the build returns it.
 *
 * Memory models (p->opts.mem_model, named by the stack profile): what the ALLOC/FREE events
 * describe is the memory of the runtime that executes the plan. MP_MEM_MODEL_TORCHTITAN
 * (PyTorch FSDP2 under torchtitan; the GPU stacks, validated against published figures) is
 * described here and in schedule_ops.c and schedule_fsdp.c; the meshplan runtimes'
 * (MESHPLAN_CPU, MESHPLAN_CUDA) in schedule_rt.c. What a block saves for backward under
 * each AC policy and what its backward recomputes (the torchtitan model) is
 * schedule_act.c's. */
#include "common/assert.h"
#include "exec/schedule_internal.h"

/* ---- blocks: forward and backward segments ------------------------------------------- */

static void block_fwd_segment(gen *g, const stage_info *st, int32_t l, int32_t repeat,
                              carry *c) {
  const int kind = mp_sched_kind_of(g, l, st);
  const int nu = g->n_units[l];
  const int32_t u0 = g->first_unit[l];
  mp_sched_seg_open(g, MP_PHASE_FORWARD, l, 1);
  const int32_t prev_last = g->last_compute;
  /* prefetch the next block's units, or (no prefetch) gather this block's own */
  int32_t patch[N_PARTS], n_patch = 0;
  int32_t next_g[N_PARTS] = {-1, -1, -1}, own_g[N_PARTS] = {-1, -1, -1};
  if (g->ms->prefetch && mp_sched_kind_of(g, l + 1, st) != KIND_NONE)
    mp_sched_gather_block(g, l + 1, next_g, prev_last, patch, &n_patch);
  if (!g->ms->prefetch) mp_sched_gather_units(g, l, u0, nu, own_g, prev_last, patch, &n_patch);
  /* aligned, Megatron's pre-hook dispatches the block's own gather after the compute before it */
  const int32_t dopt_g = mp_sched_dopt_gather(g, l, u0, nu, mp_sched_dopt_gather_at_use(g) ? prev_last : -1, patch,
                                              &n_patch);
  part_deps pd;
  for (int k = 0; k < N_PARTS; k++) {
    /* part k's unit: a single-unit block has everything in its unit 0 */
    const int src = nu == 1 ? (k == 0 ? 0 : -1) : k;
    pd.dep[k][0] = src >= 0 ? (g->ms->prefetch ? c->gather[src] : own_g[src]) : -1;
    pd.flags[k][0] = 0;
    pd.dep[k][1] = g->ms->prefetch && src >= 0 && repeat > 1 ? next_g[src] : -1;
    pd.flags[k][1] = MP_DEP_PREV_REP;
  }
  if (dopt_g >= 0) pd.dep[0][0] = dopt_g; /* the block's first op waits for its parameters */
  if (mp_model_layer_is_mtp(&g->p->model, l)) { /* an MTP module's input side first */
    attach(g, &pd, PART_ATTN);
    mp_sched_mtp_in_fwd(g);
  }
  g->ms->block_fwd(g, kind, &pd);
  if (g->reshard) mp_sched_free_units(g, l, u0, nu, 0, N_PARTS - 1);
  /* the segment's last compute-stream op: what the next segment's gathers wait for */
  const int32_t block_last = g->last_compute;
  /* a gather issued in this segment waits for the previous repetition's compute */
  for (int i = 0; i < n_patch; i++) add_dep(g, patch[i], block_last, MP_DEP_PREV_REP);
  mp_sched_seg_close(g, MP_PHASE_FORWARD, repeat, 1, nu);
  for (int k = 0; k < N_PARTS; k++) c->gather[k] = next_g[k];
}

static void block_bwd_segment(gen *g, const stage_info *st, int32_t l, int32_t repeat,
                              carry *c) {
  const int kind = mp_sched_kind_of(g, l, st);
  const int nu = g->n_units[l];
  const int32_t u0 = g->first_unit[l];
  mp_sched_seg_open(g, MP_PHASE_BACKWARD, l, -1);
  const int32_t prev_last = g->last_compute;
  /* the runtimes: x[l + 1] goes as the block above (or the head) finishes its backward */
  mp_sched_rt_mem(g, MP_ACT_ALLOC_X, kind, 0);
  int32_t patch[N_PARTS], n_patch = 0;
  int32_t next_g[N_PARTS] = {-1, -1, -1}, own_g[N_PARTS] = {-1, -1, -1};
  /* resharded, a block gathers its own units without prefetch; with it, the block above
   * prefetched them, but the runtime's top block gathers its own once the head is done */
  const int own = g->reshard && (!g->ms->prefetch || (g->ms->top_gathers_own && l == st->l1 - 1));
  if (own) mp_sched_gather_units(g, l, u0, nu, own_g, prev_last, patch, &n_patch);
  if (g->ms->prefetch && g->reshard && mp_sched_kind_of(g, l - 1, st) != KIND_NONE)
    mp_sched_gather_block(g, l - 1, next_g, prev_last, patch, &n_patch);
  /* resharded: each part's first use waits for its gather, issued by the block above
   * (the previous segment, or the previous repetition of this one), or by this block */
  part_deps pd;
  for (int k = 0; k < N_PARTS; k++) {
    const int src = nu == 1 ? (k == 0 ? 0 : -1) : k;
    pd.dep[k][0] = g->reshard && src >= 0 ? (own ? own_g[src] : c->gather[src]) : -1;
    pd.flags[k][0] = 0;
    pd.dep[k][1] = g->ms->prefetch && g->reshard && src >= 0 && repeat > 1 ? next_g[src] : -1;
    pd.flags[k][1] = MP_DEP_PREV_REP;
  }
  mp_sched_grads_alloc(g, l, u0, nu);
  g->ms->block_bwd(g, l, kind, &pd);
  const int32_t block_last = g->last_compute;
  for (int i = 0; i < n_patch; i++) add_dep(g, patch[i], block_last, MP_DEP_PREV_REP);
  mp_sched_seg_close(g, MP_PHASE_BACKWARD, repeat, -1, -nu);
  for (int k = 0; k < N_PARTS; k++) c->gather[k] = next_g[k];
  /* NCCL: the reduce-scatter in flight after the segment is the last repetition's */
  if (g->rs_in_flight.on && g->rs_in_flight.layer == l) {
    g->rs_in_flight.layer -= repeat - 1;
    g->rs_in_flight.unit -= (repeat - 1) * nu;
  }
}

/* ---- the builder's steps -------------------------------------------------------------- */

/* The op array's initial capacity: about what the step takes (a prologue and optimizer,
 * per chunk a head and a tail, per run of identical blocks a forward and a backward segment
 * of up to a few hundred ops: an MoE block with a CP ring and AC's recompute), so that it
 * rarely grows (each growth copies the ops so far). Only an allocation size: it never
 * changes a schedule. */
static int32_t ops_estimate(const mp_schedule_prep *pr) {
  int32_t runs = 0;
  for (int c = 0; c < pr->v; c++)
    for (int32_t l = pr->chunk[c].l0; l < pr->chunk[c].l1; l++) runs += pr->run_len[l] > 0;
  return 256 + 600 * runs;
}

/* The builder's state for plan p from its prep: the prep's tables (read only from here
 * on), the micro-batch's shapes, and the memory model's properties. */
static void gen_init(gen *g, mp_ctx *ctx, const mp_plan *p, const mp_schedule_prep *pr,
                     mp_arena *arena, mp_schedule *s) {
  memset(g, 0, sizeof *g);
  g->ctx = ctx;
  g->arena = arena;
  g->p = p;
  g->s = s;
  g->last_compute = g->last_reduce = -1;
  g->reshard = p->opts.fsdp.reshard_after_forward;
  g->param_dtype = pr->param_dtype;
  g->reduce_dtype = pr->reduce_dtype;
  g->sh = pr->sh;
  mp_sched_shapes_for_batch(&g->sh, p, p->opts.micro_batch);
  g->has_fsdp = pr->has_fsdp;
  g->pp_fsdp = pr->has_fsdp && mp_plan_pp_fsdp(p);
  g->fsdp2_copies = pr->has_fsdp && p->opts.mem_model == MP_MEM_MODEL_TORCHTITAN && !p->opts.fsdp.flat_params;
  g->fsdp1_flat_grad = pr->has_fsdp && p->opts.mem_model == MP_MEM_MODEL_TORCHTITAN && p->opts.fsdp.flat_params;
  g->ui = pr->ui;
  g->n_ui = pr->n_ui;
  g->first_unit = pr->first_unit;
  g->n_units = pr->n_units;
  g->root_unit = pr->root_unit;
  g->ops_hint = ops_estimate(pr);
  g->ms = mp_sched_strategy(p->opts.mem_model);
  g->ddp = p->opts.dp == MP_DP_DDP;
  g->shard_optimizer = g->ddp && p->opts.ddp.shard_optimizer;
  int64_t expert_numel = 0;
  for (int u = 0; u < pr->n_ui; u++) expert_numel += pr->ui[u].numel_expert;
  g->stage_grad_bytes = (pr->params_numel - expert_numel) * mp_dtype_bytes(g->reduce_dtype);
  g->stage_expert_grad_bytes = expert_numel * mp_dtype_bytes(g->reduce_dtype);
  g->fp8_codes = g->ms->f8_codes || (g->ms->runtime && p->opts.f8_codes);
  g->fp8_weights_sharded = g->has_fsdp && mp_mesh_group_size(&p->mesh, MP_GROUP_FSDP) > 1;
  if (g->ms->runtime) mp_sched_rt_layout_fill(g, p->opts.micro_batch);
}

/* The schedule's header: who, how many micro-batches, and the model FLOPs for MFU. */
static void schedule_header(mp_schedule *s, const mp_plan *p, const mp_schedule_prep *pr,
                            int64_t local_batch, int64_t n_micro) {
  const mp_mesh *mesh = &p->mesh;
  s->plan = p;
  s->rank = pr->rank;
  s->pp_stage = pr->stage;
  s->mode = pr->mode;
  s->n_micro = n_micro;
  s->micro_batch = p->opts.micro_batch;
  s->seq = p->opts.seq;
  s->tokens_per_step_per_rank = local_batch * p->opts.seq;
  const int cp = mesh->size[MP_DIM_CP], tp = mesh->size[MP_DIM_TP], pp = mesh->size[MP_DIM_PP];
  s->model_flops_per_step =
      pr->flops_per_token * (double)s->tokens_per_step_per_rank / ((double)tp * pp * cp);
}

/* A resident allocation of the prologue. */
void mp_sched_resident(gen *g, mp_mem_cat cat, int buf, int64_t bytes) {
  g->s->resident_bytes[cat] = bytes;
  mem(g, MP_OP_ALLOC, cat, buf, bytes, -1, -1, MP_STREAM_COMPUTE);
}

/* Prologue: the resident state, as the memory model holds it (mem_strategy.resident). */
static void emit_prologue(gen *g, const mp_schedule_prep *pr) {
  mp_sched_seg_open(g, MP_PHASE_PROLOGUE, -1, 0);
  g->ms->resident(g, pr);
  mp_sched_seg_close(g, MP_PHASE_PROLOGUE, 1, 0, 0);
}

/* Activations crossing a pipeline stage boundary, [Ts, H] bf16 (sequence-sharded under
 * SP), to or from the neighbouring virtual stage. */
static int32_t stage_p2p(gen *g, mp_coll c, mp_peer peer) {
  const int32_t i = comm(g, c, MP_GROUP_PP, MP_STREAM_P2P, 2.0 * (double)(g->sh.tokens_sp * g->sh.d_model),
                         MP_DTYPE_BF16, -1);
  if (i >= 0) g->ops[i].peer = (uint8_t)peer;
  return i;
}

/* Forward head of a chunk: its input received from the previous virtual stage, the root
 * unit's gather (the stage's first chunk) and the chunk's first block's, the embedding (the
 * model's first chunk). Returns the root gather (-1 where there is none). */
static int32_t emit_forward_head(gen *g, const stage_info *st, carry *c, int first_chunk) {
  int32_t root_g[N_PARTS] = {-1, -1, -1};
  mp_sched_seg_open(g, MP_PHASE_FORWARD, -1, 0);
  int32_t recv = -1;
  if (first_chunk) mp_sched_rt_mem(g, MP_ACT_ALLOC_TOKENS, KIND_DENSE, 1);
  if (!st->first) recv = stage_p2p(g, MP_COLL_RECV, MP_PEER_PREV);
  if (first_chunk && g->root_unit >= 0) {
    mp_sched_gather_units(g, -1, g->root_unit, 1, root_g, -1, NULL, NULL);
    const int32_t dg = mp_sched_dopt_gather(g, -1, g->root_unit, 1, -1, NULL, NULL);
    if (dg >= 0) root_g[0] = dg;
  }
  if (g->ms->prefetch && st->l1 > st->l0)
    mp_sched_gather_block(g, st->l0, c->gather, -1, NULL, NULL);
  mp_sched_rt_mem(g, MP_ACT_ALLOC_X, KIND_DENSE, 1); /* the runtimes: x[0], the stage's input */
  if (st->first) {
    const int32_t dep[2] = {root_g[0], -1};
    const uint8_t flags[2] = {0, 0};
    mp_sched_gather_wait(g, dep, flags, g->root_unit);
    mp_sched_embedding_fwd(g);
  }
  mp_sched_seg_close(g, MP_PHASE_FORWARD, 1, 0, 0);
  if (recv >= 0) pend_dep(g, recv, 0); /* the chunk's first block waits for its input */
  return root_g[0];
}

/* The output a chunk sends on, [Ts, H] bf16, held until the chunk's backward under the
 * torchtitan memory model: torch.distributed.pipelining's stage keeps each micro-batch's
 * output in its fwd_cache to run the backward from it (stage.py, forward_one_chunk), where
 * Megatron-LM frees the sent tensor's storage (deallocate_pipeline_outputs) and the meshplan
 * runtimes account for x[l1] themselves. */
static void pp_out_mem(gen *g, int alloc) {
  if (!g->ms->keeps_stage_output) return;
  const int32_t i = mem(g, alloc ? MP_OP_ALLOC : MP_OP_FREE, MP_MEM_ACTIVATIONS, BUF_PP_OUT,
                        2 * g->sh.tokens_sp * g->sh.d_model, -1, -1, MP_STREAM_COMPUTE);
  if (i >= 0) g->ops[i].variant = MP_MEM_KEPT;
}

/* Forward tail of a chunk: head and loss (the model's last chunk), or the send to the next
 * virtual stage. */
static void emit_forward_tail(gen *g, const stage_info *st, int32_t root_gather) {
  mp_sched_seg_open(g, MP_PHASE_FORWARD, -1, 0);
  mp_sched_f8_amax_reduce(g, st->l1 - st->l0, 0);
  if (st->last) {
    pend_dep(g, root_gather, 0);
    g->ms->head_fwd(g);
  } else {
    const int32_t send = stage_p2p(g, MP_COLL_SEND, MP_PEER_NEXT);
    add_dep(g, send, g->last_compute, 0);
    pp_out_mem(g, 1);
  }
  mp_sched_seg_close(g, MP_PHASE_FORWARD, 1, 0, 0);
}

/* Backward head of a chunk: loss and head backward, or the gradient from the next virtual
 * stage; the root unit's gradients (the stage's first backward chunk); the chunk's last
 * block's units prefetched when they were resharded (the runtime's top block gathers its
 * own). */
/* CPU offloading: Transformer Engine reloads each offloaded group ahead of its layer's
 * backward (cpu_offload.py, v2.8: AsyncDoubleBufferGroupOffloadHandler.on_group_commit_backward
 * issues group k's copy back at layer_window_map[k], the layer whose forward waited for its
 * copy out, and holds it to layer k's backward). The first reload starts as the backward
 * reaches the top layer, so one layer's tensors more than the schedule's own reloads are on
 * the GPU there, beside every kept layer's: at most that many as the backward goes down (the
 * window map spaces the reloads as the layers' own tensors go). Held from the head's
 * backward to the chunk's end. */
static void offload_ahead(gen *g, int alloc) {
  const int64_t b = g->s->offload_bytes;
  if (b > 0) mem(g, alloc ? MP_OP_ALLOC : MP_OP_FREE, MP_MEM_ACTIVATIONS, BUF_ACT_OFF_AHEAD, b, -1, -1, MP_STREAM_COMPUTE);
}

static void emit_backward_head(gen *g, const stage_info *st, carry *c, int first_chunk) {
  mp_sched_seg_open(g, MP_PHASE_BACKWARD, -1, 0);
  if (first_chunk && g->root_unit >= 0) mp_sched_grads_alloc(g, -1, g->root_unit, 1);
  const int32_t recv = st->last ? -1 : stage_p2p(g, MP_COLL_RECV, MP_PEER_NEXT);
  for (int k = 0; k < N_PARTS; k++) c->gather[k] = -1;
  if (g->ms->prefetch && g->reshard && st->l1 > st->l0 && !g->ms->top_gathers_own)
    mp_sched_gather_block(g, st->l1 - 1, c->gather, g->last_compute, NULL, NULL);
  if (st->last) g->ms->head_bwd(g);
  else mp_sched_rt_mem(g, MP_ACT_ALLOC_DRES, KIND_DENSE, 1); /* the runtimes: the gradient in */
  if (!st->last) pp_out_mem(g, 0);
  offload_ahead(g, 1);
  mp_sched_seg_close(g, MP_PHASE_BACKWARD, 1, 0, 0);
  if (recv >= 0) pend_dep(g, recv, 0);
}

/* Backward tail of a chunk: the embedding's backward, or the gradient sent to the previous
 * virtual stage; the root unit's reduction after the stage's last backward chunk. */
/* DDP without overlap: bytes of the stage's gradients all-reduced (reduce-scattered with the
 * optimizer sharded) over grp once the last micro-batch's backward is done. */
static void stage_grad_reduce(gen *g, mp_group grp, int64_t bytes) {
  const int inside = mp_mesh_group_size(&g->p->mesh, grp) > 1;
  if (bytes <= 0 || (!inside && !mp_sched_dopt_across(g, grp))) return;
  const int32_t after = mp_sched_ddp_bucket_prep(g, bytes / mp_dtype_bytes(g->reduce_dtype), g->last_compute);
  const int32_t i = inside ? grad_comm(g, g->shard_optimizer ? MP_COLL_REDUCE_SCATTER : MP_COLL_ALL_REDUCE, grp,
                                       bytes, -1, -1, after)
                           : after;
  if (inside && i >= 0) g->ops[i].when = MP_WHEN_LAST_MICRO;
  mp_sched_dopt_inter(g, grp, bytes / mp_dtype_bytes(g->reduce_dtype), -1, -1, i);
}

static void emit_backward_tail(gen *g, const stage_info *st, int last_chunk) {
  mp_sched_seg_open(g, MP_PHASE_BACKWARD, -1, 0);
  offload_ahead(g, 0);
  mp_sched_f8_amax_reduce(g, st->l1 - st->l0, 1);
  if (st->first) {
    mp_sched_embedding_bwd(g);
  } else {
    const int32_t send = stage_p2p(g, MP_COLL_SEND, MP_PEER_PREV);
    add_dep(g, send, g->last_compute, 0);
  }
  g->ms->chunk_bwd_end(g, last_chunk);
  /* FSDP under a pipeline: the chunk's (and with its last, the root unit's) accumulated
   * gradients reduced once the last micro-batch's backward of the chunk is done */
  if (g->pp_fsdp) mp_sched_pp_fsdp_reduce(g, st->l0, st->l1, last_chunk && g->root_unit >= 0);
  /* DDP without overlap: the whole stage's gradients all-reduced (reduce-scattered with the
   * optimizer sharded) over dp_replicate (x cp) once its last micro-batch's backward is
   * done */
  if (g->ddp && !g->p->opts.ddp.overlap && last_chunk) {
    stage_grad_reduce(g, mp_sched_ddp_group(g), g->stage_grad_bytes);
    stage_grad_reduce(g, mp_plan_ddp_expert_group(g->p), g->stage_expert_grad_bytes); /* the experts' */
  }
  mp_sched_seg_close(g, MP_PHASE_BACKWARD, 1, 0, 0);
}

/* A tied model's embedding copies under pp > 1 (stage 0's, the last stage's): their
 * gradients all-reduced between the two stages once the step's backward is done
 * (Megatron-LM's embedding group, finalize_model_grads), before the gradient norm. */
static void emit_tied_all_reduce(gen *g, const mp_schedule_prep *pr) {
  if (pr->tied_grad_bytes <= 0) return;
  int32_t i = comm(g, MP_COLL_ALL_REDUCE, MP_GROUP_PP, MP_STREAM_COMPUTE,
                   (double)pr->tied_grad_bytes, g->reduce_dtype, MP_MOD_TOK_EMBEDDINGS);
  if (i >= 0) g->ops[i].peer = MP_PEER_ENDS;
  add_dep(g, i, g->last_reduce, 0);
}

/* Optimizer: the tied embedding's all-reduce, then the memory model's step
 * (mem_strategy.optimizer). */
static void emit_optimizer(gen *g, const mp_schedule_prep *pr) {
  const int world_reduce = mp_mesh_world(&g->p->mesh) > 1;
  mp_sched_seg_open(g, MP_PHASE_OPTIMIZER, -1, 0);
  emit_tied_all_reduce(g, pr);
  g->ms->optimizer(g, pr, world_reduce);
  mp_sched_seg_close(g, MP_PHASE_OPTIMIZER, 1, 0, 0);
}

/* What splits a run of identical blocks into segments: the layer's AC policy (full:N
 * alternates it, the block recompute method ends it a chunk's first N layers in), its place
 * in a uniform recompute group (the bottom saves the group's input, the top holds the group's
 * recompute: schedule_act.c) and whether CPU offloading copies its tensors to the host (the
 * first cpu_offload_layers layers). */
static int layer_class(const mp_plan *p, int32_t l) {
  int64_t first, n;
  int role = 0;
  if (mp_plan_layer_rc_group(p, l, &first, &n) && n > 1) role = l == first ? 1 : l == first + n - 1 ? 3 : 2;
  return 4 * (2 * (int)mp_plan_layer_ac(p, l) + (l < p->opts.cpu_offload_layers)) + role;
}

/* Sub-run [a, a + r) of a run of identical blocks whose blocks also share their class: its
 * length from a, at most r. */
static int32_t same_ac_len(const gen *g, int32_t a, int32_t r) {
  const mp_plan_options *o = &g->p->opts;
  if (o->ac_every <= 1 && o->cpu_offload_layers == 0 && o->recompute_method == MP_RECOMPUTE_NONE) return r;
  const int c = layer_class(g->p, a);
  int32_t n = 1;
  while (n < r && layer_class(g->p, a + n) == c) n++;
  return n;
}

/* A chunk's blocks, forward in order, or backward from the top: one segment per run of
 * identical blocks (pr->run_len) that share their AC policy. */
static void emit_blocks(gen *g, const mp_schedule_prep *pr, const stage_info *st, int backward,
                        carry *c) {
  const int32_t *run_len = pr->run_len;
  const int32_t end = st->l1 < pr->mtp_l0 ? st->l1 : pr->mtp_l0; /* the trunk's */
  if (!backward) {
    for (int32_t l = st->l0; l < end; l++) {
      if (run_len[l] == 0) continue;
      for (int32_t a = l, r; a < l + run_len[l]; a += r) {
        r = same_ac_len(g, a, l + run_len[l] - a);
        block_fwd_segment(g, st, a, r, c);
      }
    }
    return;
  }
  for (int32_t l = end - 1; l >= st->l0; l--) {
    /* a run [a, a + r) is written backward starting at its top layer */
    int32_t a = l;
    while (run_len[a] == 0) a--;
    const int32_t r = run_len[a];
    /* its sub-runs of one AC policy, from the top */
    for (int32_t top = a + r - 1; top >= a;) {
      int32_t lo = top;
      while (lo > a && layer_class(g->p, lo - 1) == layer_class(g->p, top)) lo--;
      block_bwd_segment(g, st, top, top - lo + 1, c);
      top = lo - 1;
    }
    l = a;
  }
}

/* The MTP modules after the trunk of the stage's last chunk (schedule_mtp.c), forward in
 * depth order: each one's block segment (its input side first) and head; or backward from
 * the deepest. */
static void emit_mtp(gen *g, const mp_schedule_prep *pr, const stage_info *st, int backward, carry *c) {
  if (!st->last) return;
  if (!backward) {
    for (int32_t l = pr->mtp_l0; l < pr->mtp_l1; l++) {
      block_fwd_segment(g, st, l, 1, c); /* its input side, then the block */
      mp_sched_mtp_head_fwd(g, l);
    }
    return;
  }
  for (int32_t l = pr->mtp_l1 - 1; l >= pr->mtp_l0; l--) {
    mp_sched_mtp_head_bwd(g, l);
    block_bwd_segment(g, st, l, 1, c); /* the block, then its input side */
  }
}

/* Op i's name, for an assertion's message. */
static const char *op_label(const mp_schedule *s, int32_t i, char *buf) {
  mp_op_name(s, &s->ops[i], s->ops[i].layer, buf, 160);
  return buf;
}

/* schedule.h's shape, in debug and sanitizer builds: segments cover the ops in order, each
 * repeated at least once, every op's dependencies within MP_OP_MAX_DEPS and never pointing
 * forward (an unflagged one to an earlier op, an MP_DEP_PREV_REP one inside its own
 * segment), and the instance count the sum of the segments' ops x repeats. */
static void assert_well_formed(const mp_schedule *s) {
  int64_t instances = 0;
  char name[160];
  for (int32_t g = 0; g < s->n_segs; g++) {
    const mp_segment *sg = &s->segs[g];
    const int32_t end = sg->first_op + sg->n_ops;
    MP_ASSERT(sg->first_op == (g ? s->segs[g - 1].first_op + s->segs[g - 1].n_ops : 0) && sg->n_ops > 0,
              "segment %d (ops %d..%d): segments cover the ops in order", g, sg->first_op, end);
    MP_ASSERT(sg->repeat >= 1 && sg->first_index == instances, "segment %d: repeat %d, first instance %lld of %lld", g,
              sg->repeat, (long long)sg->first_index, (long long)instances);
    instances += (int64_t)sg->n_ops * sg->repeat;
    for (int32_t i = sg->first_op; i < end; i++) {
      const mp_op *op = &s->ops[i];
      MP_ASSERT(op->n_dep <= MP_OP_MAX_DEPS, "op %d: %d dependencies", i, op->n_dep);
      for (int k = 0; k < op->n_dep; k++) {
        const int32_t d = op->dep[k];
        const int prev = (op->dep_flags[k] & MP_DEP_PREV_REP) != 0;
        MP_ASSERT(prev ? d >= sg->first_op && d < end : d >= 0 && d < i,
                  "op %d (%s) of segment %d depends on op %d%s: a dependency never points forward", i,
                  op_label(s, i, name), g, d, prev ? " of the previous repetition" : "");
      }
    }
  }
  MP_ASSERT(s->n_ops == (s->n_segs ? s->segs[s->n_segs - 1].first_op + s->segs[s->n_segs - 1].n_ops : 0) &&
                s->n_instances == instances,
            "%d ops, %lld instances: the segments hold every op", s->n_ops, (long long)s->n_instances);
}

/* The ops and segments into s, with each segment's first instance index. */
static void schedule_finish(mp_schedule *s, const gen *g) {
  s->ops = g->ops;
  s->n_ops = g->n_ops;
  s->segs = g->segs;
  s->n_segs = g->n_segs;
  int64_t idx = 0;
  for (int32_t i = 0; i < s->n_segs; i++) {
    s->segs[i].first_index = idx;
    idx += (int64_t)s->segs[i].n_ops * s->segs[i].repeat;
  }
  s->n_instances = idx;
  assert_well_formed(s);
}

static mp_status build_prepped(mp_ctx *ctx, const mp_plan *p, const mp_schedule_prep *pr,
                               mp_arena *arena, mp_schedule **out) {
  int64_t local_batch = 0, n_micro = 0;
  MP_CHECK(mp_plan_batch(ctx, p, &local_batch, &n_micro));
  mp_schedule *s = mp_arena_alloc(arena, sizeof *s);
  MP_CHECK_ALLOC(ctx, s);
  gen g;
  gen_init(&g, ctx, p, pr, arena, s);
  schedule_header(s, p, pr, local_batch, n_micro);
  emit_prologue(&g, pr);
  carry c = {{-1, -1, -1}};
  int32_t root_gather = -1;
  for (int k = 0; k < pr->v; k++) { /* the chunks' forwards, in order */
    g.chunk = (uint8_t)k;
    const int32_t rg = emit_forward_head(&g, &pr->chunk[k], &c, k == 0);
    if (k == 0) root_gather = rg;
    emit_blocks(&g, pr, &pr->chunk[k], 0, &c);
    emit_mtp(&g, pr, &pr->chunk[k], 0, &c);
    emit_forward_tail(&g, &pr->chunk[k], root_gather);
  }
  for (int k = pr->v - 1; k >= 0; k--) { /* their backwards, in reverse */
    g.chunk = (uint8_t)k;
    emit_backward_head(&g, &pr->chunk[k], &c, k == pr->v - 1);
    emit_mtp(&g, pr, &pr->chunk[k], 1, &c);
    emit_blocks(&g, pr, &pr->chunk[k], 1, &c);
    emit_backward_tail(&g, &pr->chunk[k], k == 0);
  }
  g.chunk = 0;
  emit_optimizer(&g, pr);
  if (g.status != MP_OK) return g.status; /* its message is on ctx */
  schedule_finish(s, &g);
  *out = s;
  return MP_OK;
}

/* ---- the interface (schedule.h) ------------------------------------------------------ */

mp_status mp_schedule_build_prepped(mp_ctx *ctx, const mp_plan *p, const mp_schedule_prep *pr,
                                    mp_arena *arena, mp_schedule **out) {
  *out = NULL;
  if (pr == NULL || !mp_sched_prep_serves(pr, p))
    return mp_error(ctx, MP_ERR_INVALID,
                    "schedule prep was made for another plan (other parameters, mesh or "
                    "options); make one with mp_schedule_prep_create for this plan");
  return build_prepped(ctx, p, pr, arena, out);
}

mp_status mp_schedule_build(mp_ctx *ctx, const mp_plan *p, int rank, mp_schedule_mode mode,
                            mp_arena *arena, mp_schedule **out) {
  *out = NULL;
  MP_CHECK(mp_sched_check_plan_rank(ctx, p, rank));
  int64_t local_batch = 0, n_micro = 0;
  MP_CHECK(mp_plan_batch(ctx, p, &local_batch, &n_micro));
  mp_schedule_prep *pr = NULL;
  MP_CHECK(mp_sched_prep_fill(ctx, p, rank, mode, arena, &pr));
  return build_prepped(ctx, p, pr, arena, out);
}
