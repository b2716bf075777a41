/* The checkpoint's internals shared by its files (ckpt.h is the interface):
 *   ckpt.c       hashing, files and folders, the save
 *   ckpt_read.c  the manifest, reading boxes, the load */
#ifndef MP_EXEC_RUNTIME_CKPT_INTERNAL_H
#define MP_EXEC_RUNTIME_CKPT_INTERNAL_H

#include <stdio.h>

#include "exec/runtime/ckpt.h"

/* The name of state k of parameter fqn in a checkpoint (ckpt.h). */
static inline void ckpt_tensor_name(char *out, size_t cap, const char *fqn, mp_state_kind k) {
  if (k == MP_STATE_PARAM)
    snprintf(out, cap, "%s", fqn);
  else
    snprintf(out, cap, "optim.%s.%s", fqn, k == MP_STATE_EXP_AVG ? "exp_avg" : "exp_avg_sq");
}

/* fn(ctx, rt, i, buf, arg) for every parameter i, buf a host buffer of at least the
 * rank's tile of it (numel of mp_runtime_param_tile; 1 when empty); stops at the first
 * failure. (ckpt_read.c) */
typedef mp_status (*mp_ckpt_tile_fn)(mp_ctx *ctx, mp_runtime *rt, int i, float *buf, void *arg);
mp_status mp_ckpt_each_tile(mp_ctx *ctx, mp_runtime *rt, mp_ckpt_tile_fn fn, void *arg);

#endif
