/* What the emitters (app/emit_torchtitan.c, app/emit_megatron.c) share with app/emit.c: a
 * growing text buffer and the header of prediction comments every emitted file opens with. */
#ifndef MP_APP_EMIT_INTERNAL_H
#define MP_APP_EMIT_INTERNAL_H

#include <stddef.h>

#include "app/emit.h"

/* Text that grows as it is appended to; oom is set once an allocation fails (then nothing
 * more is appended and the render fails with MP_ERR_NOMEM). */
typedef struct mp_emit_buf {
  char *s;
  size_t n, cap;
  int oom;
} mp_emit_buf;

#if defined(__GNUC__)
__attribute__((format(printf, 2, 3)))
#endif
void mp_emit_printf(mp_emit_buf *b, const char *fmt, ...);

/* The header: "# " lines with the target's release and its sources, the plan, its
 * prediction, meshplan's version and command, and the launch lines (torchrun on one node;
 * with more than one node, torchrun on each node and srun for Slurm). `launch` is the
 * command after torchrun's own flags ("-m torchtitan.train --job.config_file plan.toml"). */
void mp_emit_header(mp_emit_buf *b, mp_emit_target t, const mp_emit_plan *p, const char *launch);

/* The data-parallel ranks of the plan: dp_replicate x dp_shard. */
int mp_emit_dp(const mp_mesh *m);

/* The renderers: append the body of the file (after the header) or refuse by name. */
mp_status mp_emit_torchtitan(mp_ctx *ctx, const mp_emit_plan *p, const char *file_name, mp_emit_buf *b);
mp_status mp_emit_megatron(mp_ctx *ctx, const mp_emit_plan *p, const char *file_name, mp_emit_buf *b);

#endif
