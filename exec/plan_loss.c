/* The plan's check of torchtitan's chunked LM head and loss (plan loss_chunks;
 * exec/schedule_head.c prices it): a torchtitan stack's ChunkedLossWrapper
 * (components/loss.py) splits the rank's sequence into loss_chunks equal chunks. */
#include <stdint.h>

#include "exec/plan.h"

mp_status mp_plan_loss_check(mp_ctx *ctx, const mp_mesh *mesh, const mp_plan_options *o) {
  const int n = o->loss_chunks;
  if (n < 0)
    return mp_error(ctx, MP_ERR_INVALID, "loss_chunks %d: give a count of sequence chunks, 1 or more", n);
  if (n <= 1) return MP_OK;
  if (o->mem_model != MP_MEM_MODEL_TORCHTITAN)
    return mp_error(ctx, MP_ERR_INVALID, "loss_chunks %d is torchtitan's ChunkedLossWrapper; the %s memory "
                    "model computes the loss on the whole micro-batch: use a torchtitan stack or drop it",
                    n, mp_mem_model_name(o->mem_model));
  /* components/loss.py: torch._check(seq_len % num_chunks == 0) on the rank's sequence */
  const int64_t s = o->seq / mesh->size[MP_DIM_CP];
  if (o->seq > 0 && s % n != 0)
    return mp_error(ctx, MP_ERR_INVALID, "loss_chunks %d does not divide the rank's sequence of %lld tokens "
                    "(torchtitan's ChunkedLossWrapper splits it evenly): choose a divisor of %lld",
                    n, (long long)s, (long long)s);
  return MP_OK;
}
