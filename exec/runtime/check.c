/* The runtime's executable-plan rules (check.h), in the order a plan is read: mesh and
 * options, passes, model. */
#include "exec/runtime/check.h"

#include <math.h>

#include "exec/mesh.h"
#include "exec/model.h"
#include "exec/rules.h"

mp_status mp_runtime_plan_check(mp_ctx *ctx, const mp_plan *p) {
  return mp_runtime_check(ctx, &p->model, &p->mesh, &p->opts, p->applied);
}

/* The expert grid (exec/mesh.h) the runtime executes: EP over dp_shard x tp, each tp rank
 * routing its own sequence shard (runtime_block.c), experts whole on a rank (etp = 1) or
 * split over their expert-TP group (etp > 1, runtime_etp.c: the received rows all-gathered
 * over the group, the outputs reduce-scattered, as Megatron-Core's all-to-all dispatcher)
 * on the CPU backend, inside pipeline stages too (each micro-batch keeps its per-block
 * counts, runtime_pp.c), their gradients reduced over the expert-FSDP group and
 * dp_replicate (runtime_fsdp.c, runtime_step.c); EP may reach into dp_replicate on the CPU
 * backend, the gradients then summed over the expert-DP group. etp is any size the mesh
 * accepts (ep x etp consecutive ranks, exec/mesh.c), as Megatron-Core takes
 * --expert-tensor-parallel-size apart from tp (parallel_state.py, core_v0.14.0): etp
 * dividing tp, equal to it, a multiple of it, or above 1 with tp = 1. Every rank routes
 * its own rows (its sequence shard under tp with SP, else its micro-batch), so the
 * expert-TP group gathers what its ranks received whichever dense ranks it spans. */
static mp_status grid_check(mp_ctx *ctx, const mp_mesh *mesh, const mp_plan_options *o, const char *mb) {
  if (!mp_mesh_expert_grid(mesh)) return MP_OK;
  const int tp = mesh->size[MP_DIM_TP], in = mesh->size[MP_DIM_DP_SHARD] * tp;
  const int etp = mesh->etp > 1 ? mesh->etp : 1;
  if (mesh->ep == 1)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "mesh %s: etp with ep=1 (every rank holding every expert while "
                    "each tp rank routes its own shard) is planned and simulated only; drop etp or set ep > 1",
                    mb);
  if (etp > 1 && o->mem_model != MP_MEM_MODEL_MESHPLAN_CPU)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "mesh %s: expert tensor parallelism (etp=%d, each expert split over "
                    "its expert-TP group) is executed by the runtime's CPU backend only (its ring of sendrecvs "
                    "over the group runs on host memory); train it without --device cuda, or plan and simulate "
                    "it", mb, etp);
  /* EP reaching into dp_replicate (Megatron-Core's expert grid over its whole data-parallel
   * group): the experts whole on a rank, their gradients summed over the expert-DP group
   * (mp_mesh_expert_replica_group), run by tests/runtime/parity_matrix.py on the CPU backend */
  if (in % (mesh->ep * etp) && o->mem_model != MP_MEM_MODEL_MESHPLAN_CPU)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "mesh %s: EP reaching into dp_replicate (ep x etp a multiple of "
                    "dp_shard x tp = %d) is executed by the runtime's CPU backend only; train it without --device "
                    "cuda, or plan and simulate it", mb, in);
  /* without SP every tp rank holds all N rows; torchtitan then splits them over tp before
   * the dispatch (ReordererSequenceParallel), which the runtime does not */
  if (tp > 1 && o->sp != 1)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "mesh %s: the runtime executes the expert grid with tp only under "
                    "sequence parallelism (each tp rank routes its sequence shard); drop --no-sp", mb);
  return MP_OK;
}

/* Multi-head latent attention (runtime_mla.c) runs on the CPU backend, without cp and float8:
 * the CUDA attention kernels take one head dim for q, k and v (MLA's v_head_dim differs),
 * ring attention's spans carry K and V at one width, and the latent down projections are
 * plain GEMMs on row blocks of kv_a_proj_with_mqa. */
static mp_status mla_check(mp_ctx *ctx, const mp_model *m, const char *mb, int cp, const mp_plan_options *o) {
  if (!mp_model_is_mla(m)) return MP_OK;
  if (o->mem_model != MP_MEM_MODEL_MESHPLAN_CPU)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: multi-head latent attention is executed by the "
                    "runtime's CPU backend only (the CUDA attention kernels take one head dim for q, k and v; "
                    "MLA's v_head_dim differs): train it without --device cuda, or with torchtitan or "
                    "Megatron-LM", m->name);
  if (cp > 1)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "mesh %s: the runtime does not execute multi-head latent "
                    "attention with context parallelism (ring attention's K and V travel at one head "
                    "width); use cp=1", mb);
  if (o->fp8)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: the runtime does not execute float8 Linears in "
                    "multi-head latent attention; drop --fp8", m->name);
  return MP_OK;
}

mp_status mp_runtime_check(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh, const mp_plan_options *o,
                           unsigned applied) {
  char mb[128];
  mp_mesh_format(mesh, mb, sizeof mb);
  const int pp = mesh->size[MP_DIM_PP], cp = mesh->size[MP_DIM_CP];
  if (!mp_rule_cp_ring_ok(o->seq, cp))
    return mp_error(ctx, MP_ERR_INVALID, "mesh %s: context parallelism cuts each sequence into 2 x cp = %d "
                    "chunks; choose seq a multiple of %d", mb, 2 * cp, 2 * cp);
  if (cp > 1 && mesh->ep > 1)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "mesh %s: the runtime does not execute expert parallelism with "
                    "context parallelism yet (the routed experts' gradients are not summed over cp); use ep=1 "
                    "or cp=1", mb);
  MP_CHECK(grid_check(ctx, mesh, o, mb));
  /* pipeline stages (runtime_pp.c): every schedule, MoE blocks included (each micro-batch
   * keeps its routing; EP's all-to-alls stay inside a stage); float8 keeps per-layer scales
   * from a block's forward for its backward, one micro-batch at a time */
  if (pp > 1 && o->pp_schedule == MP_PP_DUALPIPE)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "mesh %s: the runtime does not execute DualPipe (two model stages "
                    "a rank, fed from both ends); it is priced by simulate: train with --pp-schedule 1f1b, "
                    "interleaved or gpipe", mb);
  if (pp > 1 && mp_pp_schedule_splits_w(o->pp_schedule))
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "mesh %s: the runtime does not execute the zero-bubble schedule %s "
                    "(its backward is not split into input and weight gradients); it is priced by simulate: "
                    "train with --pp-schedule 1f1b, interleaved or gpipe", mb, mp_pp_schedule_name(o->pp_schedule));
  if (pp > 1 && o->fp8)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "mesh %s: float8 with pipeline parallelism is not executed (a "
                    "stage holds several micro-batches between forward and backward); drop --fp8 or use pp=1", mb);
  /* a chunk of no layers (a stated layout's embedding or head alone) trains as the single
   * rank does, but the memory the runtime holds for it is not yet what the simulator
   * predicts to the byte (tests/runtime/parity_matrix.py runs layouts of one layer and more) */
  for (int k = 0; k < o->n_pp_layers; k++)
    if (o->pp_layers[k] == 0)
      return mp_error(ctx, MP_ERR_UNSUPPORTED, "mesh %s: pp_layers gives model chunk %d no layers (the embedding "
                      "or the head alone); that layout is planned and simulated only: give every chunk a layer",
                      mb, k);
  /* the kernels scale each tensor by its own amax (kernels/cpu/fp8.c, kernels/cuda) */
  if (o->fp8 && o->fp8_opts.recipe != MP_FP8_DEFAULT && o->fp8_opts.recipe != MP_FP8_TENSORWISE)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "mesh %s: the runtime casts float8 tensorwise (one scale per tensor "
                    "from its own amax); recipe %s is planned and simulated only: train with --fp8 tensorwise",
                    mb, mp_fp8_recipe_name(o->fp8_opts.recipe));
  if (mesh->size[MP_DIM_TP] > 1 && o->sp == 1) {
    const int tp = mesh->size[MP_DIM_TP];
    const int64_t tokens = o->micro_batch * o->seq;
    /* the residual stream's sequence shards: N / tp rows each, every rank the same */
    if (o->micro_batch > 0 && tokens % tp)
      return mp_error(ctx, MP_ERR_INVALID, "mesh %s: sequence parallelism splits a micro-batch's %lld tokens "
                      "(micro_batch x seq) into tp=%d shards; choose micro_batch x seq divisible by %d, or "
                      "--no-sp", mb, (long long)tokens, tp, tp);
    if (applied & MP_PASS_FLOAT8)
      return mp_error(ctx, MP_ERR_UNSUPPORTED, "mesh %s: the runtime does not execute float8 Linears with "
                      "sequence parallelism (their amax would cover one sequence shard); train with --no-sp "
                      "or without float8", mb);
  }
  if (mesh->size[MP_DIM_DP_SHARD] > 1 && !(applied & MP_PASS_FSDP))
    return mp_error(ctx, MP_ERR_INTERNAL, "mesh %s has dp_shard > 1 but the plan has no FSDP pass", mb);
  MP_CHECK(mp_runtime_model_check(ctx, m, o->seq));
  MP_CHECK(mla_check(ctx, m, mb, cp, o));
  if (mesh->size[MP_DIM_TP] > 1 && !o->tp.shard_logits)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "tp=%d with logits gathered over tp (shard_logits=0) is not "
                    "executed; the runtime computes the loss vocab-parallel (the default)", mesh->size[MP_DIM_TP]);
  if (mesh->size[MP_DIM_TP] > 1 && m->tied_embeddings)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s ties its embeddings; with tp > 1 the runtime does not "
                    "execute tied vocab-parallel embedding and head yet", m->name);
  return MP_OK;
}

mp_status mp_runtime_capacity_check(mp_ctx *ctx, const mp_model *m, const mp_plan_options *o, double cf) {
  if (cf == 0) return MP_OK;
  if (!(cf > 0) || !isfinite(cf))
    return mp_error(ctx, MP_ERR_INVALID, "--moe-capacity-factor %g: give a positive number (1.0: each expert "
                    "takes its balanced share of a micro-batch's assignments)", cf);
  if (m->n_experts <= 0)
    return mp_error(ctx, MP_ERR_INVALID, "model %s has no routed experts; --moe-capacity-factor applies to MoE "
                    "models", m->name);
  if (o->mem_model != MP_MEM_MODEL_MESHPLAN_CPU)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "--moe-capacity-factor: the runtime drops tokens over an expert's "
                    "capacity on the CPU backend only (the CUDA MoE kernels place every routed pair); train "
                    "it without --device cuda, or dropless");
  return MP_OK;
}

mp_status mp_runtime_model_check(mp_ctx *ctx, const mp_model *m, int64_t seq) {
  if (m->family != MP_FAMILY_LLAMA)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: the runtime implements the llama family only "
                    "(RMSNorm, RoPE, SwiGLU); gpt models are not implemented yet", m->name);
  if (mp_model_is_hybrid(m)) /* before the MLP's check: the layers are what the runtime lacks first */
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: its %lld Mamba-2 layers (hybrid_override_pattern M: in_proj, "
                    "conv1d, the SSD scan, gated RMSNorm) and its single-part layers are not implemented in the "
                    "runtime; plan and simulate it only", m->name,
                    (long long)mp_model_n_layers_of(m, MP_LAYER_MAMBA));
  if (mp_model_is_mla(m) && m->qk_rope_head_dim % 2)
    return mp_error(ctx, MP_ERR_INVALID, "model %s: RoPE needs an even qk_rope_head_dim (got %lld)", m->name,
                    (long long)m->qk_rope_head_dim);
  const int gated = mp_model_mlp_gated(m), layer_norm = mp_model_norm(m) == MP_NORM_LAYER;
  if (!gated || layer_norm) { /* the kernels: SwiGLU, RMSNorm */
    const char *mlp = gated ? "" : mp_model_mlp(m) == MP_MLP_SQUARED_RELU ? "squared-ReLU MLP" : "GELU MLP";
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: its %s%s%s %s not implemented in the runtime, whose "
                    "kernels are SwiGLU and RMSNorm; plan and simulate it only", m->name, mlp,
                    !gated && layer_norm ? " and " : "", layer_norm ? "LayerNorms" : "", layer_norm ? "are" : "is");
  }
  if (m->attn_chunk > 0)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: Llama 4's chunked attention with RoPE-free global "
                    "blocks (attn_chunk %lld) and its sigmoid router are not implemented in the runtime; plan "
                    "and simulate it only", m->name, (long long)m->attn_chunk);
  if (m->qkv_bias || m->qk_norm || m->bias)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: q/k/v biases and q/k norms (Qwen2/Qwen3) are not "
                    "implemented in the runtime yet", m->name);
  if (m->mtp_layers > 0)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: its %lld multi-token-prediction module%s (mtp_layers, "
                    "DeepSeek-V3 sec. 2.2) %s planned and simulated only, not built in the runtime: train "
                    "with --mtp-num-layers 0", m->name, (long long)m->mtp_layers, m->mtp_layers > 1 ? "s" : "",
                    m->mtp_layers > 1 ? "are" : "is");
  if (!mp_model_is_mla(m) && m->head_dim % 2)
    return mp_error(ctx, MP_ERR_INVALID, "model %s: RoPE needs an even head_dim (got %lld)", m->name,
                    (long long)m->head_dim);
  if (mp_model_window_applies(m, seq)) { /* the kernels attend to the whole causal prefix */
    char why[512];
    mp_model_window_refusal(m, seq, why, sizeof why);
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "%s", why);
  }
  return MP_OK;
}

