/* Pass 4: activation checkpointing, recorded per plan (mp_ac_mode, exec/plan.h): the policy
 * and, for full AC, how often a block is wrapped (every block, or every N-th). The schedule
 * turns the policy into saved activations and recompute ops per block
 * (exec/schedule_act.c). AC must run before FSDP: the checkpoint wrapper has to sit inside
 * the FSDP unit, so that the recomputation runs while the unit's parameters are gathered. */
#include "exec/plan.h"

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
      if (o->ac_every > 1)
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
