/* Pass 4: activation checkpointing, recorded per plan (mp_ac_mode, exec/plan.h): the policy
 * and, for full AC, which blocks are wrapped (every block, every N-th, or Megatron-Core's recompute
 * method per model chunk). The schedule turns the policy into saved activations and recompute
 * ops per block (exec/schedule_act.c). AC must run before FSDP: the checkpoint wrapper has
 * to sit inside the FSDP unit, so that the recomputation runs while the unit's parameters are gathered. */
#include "exec/plan.h"

/* Megatron-Core's recompute method (exec/plan.h, mp_recompute_method) as its config takes it
 * (transformer_config.py __post_init__, core_v0.14.0: a method only under full granularity,
 * recompute_num_layers with it), on the megatron memory model, whose stack runs it; uniform's
 * groups must tile each model chunk: custom(layer_idx, layer_idx + N) past the chunk's last
 * layer indexes self.layers out of range (transformer_block.py _checkpointed_forward). */
static mp_status check_recompute_method(mp_ctx *ctx, const mp_plan *p, mp_ac_mode mode) {
  const mp_plan_options *o = &p->opts;
  const int n = o->recompute_num_layers;
  if (o->recompute_method == MP_RECOMPUTE_NONE) {
    if (n == 0) return MP_OK;
    return mp_error(ctx, MP_ERR_INVALID, "recompute_num_layers %d without a recompute method: "
                    "give --recompute-method block or uniform with it, or drop it", n);
  }
  const char *name = mp_recompute_method_name(o->recompute_method);
  if ((unsigned)o->recompute_method > MP_RECOMPUTE_UNIFORM || n < 1)
    return mp_error(ctx, MP_ERR_INVALID, "recompute method %d with %d layers: choose block or uniform "
                    "with --recompute-num-layers N >= 1", (int)o->recompute_method, n);
  if (mode != MP_AC_FULL || o->ac_every > 1)
    return mp_error(ctx, MP_ERR_INVALID, "recompute method %s applies to full AC (Megatron-Core's "
                    "--recompute-granularity full; selective granularity refuses a method): use --ac full", name);
  if (o->mem_model != MP_MEM_MODEL_MEGATRON || mp_model_is_hybrid(&p->model))
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "recompute method %s is Megatron-Core's TransformerBlock's "
                    "(the megatron memory model, a model without Mamba layers); elsewhere use --ac full "
                    "or full:N", name);
  if (o->recompute_method != MP_RECOMPUTE_UNIFORM) return MP_OK;
  const int pp = p->mesh.size[MP_DIM_PP] > 0 ? p->mesh.size[MP_DIM_PP] : 1;
  for (int s = 0; s < pp; s++)
    for (int c = 0; c < mp_plan_virtual_stages(p); c++) {
      int64_t l0, l1;
      mp_plan_chunk_layers(p, s, c, &l0, &l1);
      if ((l1 - l0) % n != 0)
        return mp_error(ctx, MP_ERR_INVALID, "recompute method uniform with %d layers: model chunk %lld "
                        "(stage %d) holds %lld layers, which %d does not divide (Megatron-Core's "
                        "group past the chunk's last layer indexes out of range); choose a divisor",
                        n, (long long)mp_plan_chunk_index(p, s, c), s, (long long)(l1 - l0), n);
    }
  return MP_OK;
}

mp_status mp_apply_ac(mp_ctx *ctx, mp_plan *p, mp_ac_mode mode) {
  if (p->applied & MP_PASS_FSDP)
    return mp_error(ctx, MP_ERR_ORDER,
                    "AC after FSDP: the checkpoint wrapper would sit outside the FSDP units, so "
                    "the recomputation in backward would run on resharded parameters (or gather "
                    "them a second time); apply AC before FSDP");
  MP_CHECK(mp_plan_check_pass(ctx, p, MP_PASS_AC));
  if ((unsigned)mode >= MP_AC_COUNT)
    return mp_error(ctx, MP_ERR_INVALID, "unknown activation checkpointing policy %d; choose none, "
                                         "selective, selective-op, selective-core or full", (int)mode);
  if (mp_model_is_hybrid(&p->model) && mode != MP_AC_NONE && mode != MP_AC_FULL)
    return mp_error(ctx, MP_ERR_UNSUPPORTED,
                    "AC %s on hybrid model %s is not modelled (its Mamba layers' recompute); choose none or full",
                    mp_ac_mode_name(mode), p->model.name);
  MP_CHECK(check_recompute_method(ctx, p, mode));
  p->ac = mode;
  p->opts.ac = mode;
  if (mode != MP_AC_FULL || p->opts.ac_every < 1) p->opts.ac_every = 1;
  mp_plan_note_ac(p, &p->opts);
  mp_plan_mark_applied(p, MP_PASS_AC);
  return MP_OK;
}

void mp_plan_note_ac(mp_plan *p, const mp_plan_options *o) {
  switch (o->ac) {
    case MP_AC_SELECTIVE:
      mp_plan_note(p, "AC: selective: the attention module recomputed in backward in every block "
                      "(its input saved)");
      break;
    case MP_AC_SELECTIVE_OP:
      mp_plan_note(p, "AC: selective-op: matmul outputs saved except every second one of a block, "
                      "attention outputs and reduce-scatters saved, everything else recomputed");
      break;
    case MP_AC_SELECTIVE_CORE:
      mp_plan_note(p, "AC: selective-core: the core attention recomputed in backward from the "
                      "saved q, k, v");
      break;
    case MP_AC_FULL:
      if (o->recompute_method == MP_RECOMPUTE_BLOCK)
        mp_plan_note(p, "AC: full, recompute method block %d: the first %d layers of each model chunk "
                        "recomputed in backward from their saved inputs, the others save everything",
                     o->recompute_num_layers, o->recompute_num_layers);
      else if (o->recompute_method == MP_RECOMPUTE_UNIFORM)
        mp_plan_note(p, "AC: full, recompute method uniform %d: each model chunk's layers in groups of %d, "
                        "one input saved a group, the group's forward re-run whole before its backward",
                     o->recompute_num_layers, o->recompute_num_layers);
      else if (o->ac_every > 1)
        mp_plan_note(p, "AC: full:%d: every %d-th block recomputed in backward from its saved "
                        "input, the others save everything",
                     o->ac_every, o->ac_every);
      else
        mp_plan_note(p, "AC: full: every block recomputed in backward from its saved input");
      break;
    default: break;
  }
  if (!o->recompute_modules) return;
  /* Megatron-Core's two mechanisms (exec/plan.h, mp_rc_module) */
  const uint32_t whole = (1u << MP_RC_MLP) | (1u << MP_RC_MOE) | (1u << MP_RC_SHARED_EXPERTS);
  char names[96];
  mp_recompute_modules_format(o->recompute_modules, names, sizeof names);
  mp_plan_note(p, "AC: recompute modules %s:%s%s", names,
               o->recompute_modules & ~whole ? " the output-discarding ones free their output once its consumer "
                                               "ran and recompute it in backward;" : "",
               o->recompute_modules & whole ? " the checkpointed ones keep their input and re-run their forward, "
                                              "collectives included, before their backward" : "");
}
