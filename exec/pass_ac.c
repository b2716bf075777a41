/* Pass 4: activation checkpointing, recorded per plan (every block gets the same wrapper):
 *   none       every activation saved for backward
 *   selective  attention recomputed in backward (its inputs and the MLP's activations saved)
 *   full       only each block's input saved; the whole block recomputed in backward
 * The schedule turns the mode into saved activations and recompute ops. AC must run
 * before FSDP: the checkpoint wrapper has to sit inside the FSDP unit, so that the
 * recomputation runs while the unit's parameters are gathered. */
#include "exec/plan.h"

mp_status mp_apply_ac(mp_ctx *ctx, mp_plan *p, mp_ac_mode mode) {
  if (p->applied & MP_PASS_FSDP)
    return mp_error(ctx, MP_ERR_ORDER,
                    "AC after FSDP: the checkpoint wrapper would sit outside the FSDP units, so "
                    "the recomputation in backward would run on resharded parameters (or gather "
                    "them a second time); apply AC before FSDP");
  MP_CHECK(mp_plan_check_pass(ctx, p, MP_PASS_AC));
  if ((unsigned)mode > MP_AC_FULL)
    return mp_error(ctx, MP_ERR_INVALID, "unknown activation checkpointing mode %d; choose none, "
                                         "selective or full", (int)mode);
  p->ac = mode;
  p->opts.ac = mode;
  mp_plan_note_ac(p, mode);
  mp_plan_mark_applied(p, MP_PASS_AC);
  return MP_OK;
}

void mp_plan_note_ac(mp_plan *p, mp_ac_mode mode) {
  if (mode == MP_AC_SELECTIVE)
    mp_plan_note(p, "AC: selective: attention recomputed in backward in every block");
  else if (mode == MP_AC_FULL)
    mp_plan_note(p, "AC: full: every block recomputed in backward from its saved input");
}
