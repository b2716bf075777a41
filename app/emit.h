/* Plans as the job configurations of the frameworks people train with, and back.
 *
 * Emit (meshplan plan --emit, meshplan simulate --emit): a chosen plan written as
 *  - torchtitan v0.2.0's job-config TOML (pytorch/torchtitan tag v0.2.0, commit 29624e37:
 *    the keys are torchtitan/config/job_config.py's dataclasses, the model names and flavors
 *    torchtitan/models/<name>/__init__.py's), launched by `torchrun -m torchtitan.train
 *    --job.config_file FILE` (run_train.sh at that tag);
 *  - Megatron-LM core_v0.14.0's pretrain_gpt.py arguments (NVIDIA/Megatron-LM tag
 *    core_v0.14.0, commit 23e00ed0: megatron/training/arguments.py), one flag a line.
 * Each file opens with comments holding the prediction it was emitted with (step time,
 * tokens/s per GPU, peak memory per GPU), the meshplan version and command, and the launch
 * lines, so a run can be checked against it. A plan feature the target cannot express is
 * refused by name (MP_ERR_USAGE), never written approximately.
 *
 * Read (--from FILE, --from-args '...'; app/from_config.h): the same files back into
 * meshplan's model, mesh and options.
 *
 * Invariant: what an emitter writes, the reader maps back to the same model, mesh and options,
 * hence the same prediction (tests/cli/emit_test.py checks it plan by plan). */
#ifndef MP_APP_EMIT_H
#define MP_APP_EMIT_H

#include <stdint.h>
#include <stdio.h>

#include "common/status.h"
#include "exec/mesh.h"
#include "exec/model.h"
#include "exec/plan.h"
#include "sim/cluster.h"
#include "sim/sim.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum mp_emit_target { MP_EMIT_TORCHTITAN = 0, MP_EMIT_MEGATRON } mp_emit_target;

/* One plan with the prediction it is emitted with. */
typedef struct mp_emit_plan {
  const mp_model *model;
  const mp_cluster *cluster;
  const mp_mesh *mesh;
  const mp_plan_options *o;     /* resolved by mp_plan_create: sp, seq, global batch, recipe */
  const mp_stack_profile *stack; /* the stack it was predicted under */
  double step_time_s, tokens_per_s_per_gpu;
  int64_t peak_mem_bytes;       /* per GPU */
  const char *command;          /* the meshplan command line that chose it */
} mp_emit_plan;

/* "torchtitan" or "megatron" into *out: 1, else 0 (the caller words the refusal). */
int mp_emit_target_parse(const char *s, mp_emit_target *out);
/* The release a target's files follow, for messages and headers:
 * "torchtitan v0.2.0", "Megatron-LM core_v0.14.0". */
const char *mp_emit_target_release(mp_emit_target t);
/* --emit's value (NULL: not given) into *t and *on; --out without --emit, or a target
 * other than torchtitan and megatron, is MP_ERR_USAGE. */
mp_status mp_emit_args(mp_ctx *ctx, const char *emit, int has_out, mp_emit_target *t, int *on);
/* The file's extension: "toml" or "args". */
const char *mp_emit_target_ext(mp_emit_target t);

/* torchtitan v0.2.0's model name and flavor of a meshplan model (data/models stem), or 0
 * where torchtitan ships none of its shape. */
int mp_emit_torchtitan_model(const char *meshplan_name, const char **tt_name, const char **flavor);
/* The meshplan model of torchtitan's name and flavor, or NULL. */
const char *mp_emit_torchtitan_model_of(const char *tt_name, const char *flavor);

/* The file's text (malloc'd, NUL-terminated, the caller frees) for plan p. A plan the target
 * cannot express: MP_ERR_USAGE naming the feature and what to do. */
mp_status mp_emit_render(mp_ctx *ctx, mp_emit_target t, const mp_emit_plan *p, const char *file_name,
                         char **out);
/* Renders p and writes it to dir/stem.<ext> (a temporary name, then renamed: a reader never
 * sees half a file); the path written into path. */
mp_status mp_emit_write(mp_ctx *ctx, mp_emit_target t, const mp_emit_plan *p, const char *dir,
                        const char *stem, char *path, size_t cap);

/* meshplan plan --emit (app/emit_plan.c): the ranked candidates order[0..n) of the search s
 * (evaluated by ev on cluster c), each into dir/plan-<rank>.<ext> (rank from 1). A plan the
 * target cannot express is skipped with its reason; each file written and each plan skipped
 * get a line on report (NULL: none). MP_ERR_USAGE when none could be written; a failure to
 * write ends it. */
struct mp_sim_evaluator;
struct mp_search;
mp_status mp_emit_ranked(mp_ctx *ctx, mp_emit_target t, const struct mp_sim_evaluator *ev, const mp_cluster *c,
                         const struct mp_search *s, const int64_t *order, int64_t n, const char *command,
                         const char *dir, FILE *report);

/* "meshplan <command> <args...>", each argument holding a space or a quote single-quoted as
 * a shell reads it back; malloc'd (the caller frees), NULL when out of memory. */
char *mp_emit_command_line(const char *command, int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif
