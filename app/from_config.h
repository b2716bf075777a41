/* --from FILE and --from-args 'ARGS' (simulate, explain, plan): a plan read from a
 * framework's configuration, torchtitan v0.2.0's job TOML or Megatron-LM core_v0.14.0's
 * pretrain_gpt.py arguments (the releases app/emit.h writes), as the meshplan flags that
 * say the same plan.
 *
 * Every key is accounted for: mapped onto a flag (the model, the stack, --mesh, --ac, --fp8,
 * --sp/--no-sp, --no-reshard, --seq, --micro-batch, --global-batch, --pp-schedule and
 * --pp-virtual, or plan's --fix, --cp-rotate, --async-tp, --no-async-tp); refused by name
 * when it changes cost in a way meshplan does not model; or, when it changes no cost
 * (logging, paths, seeds, the optimizer's hyper-parameters), listed in the note as ignored.
 * An unknown key is refused: it may change cost. */
#ifndef MP_APP_FROM_CONFIG_H
#define MP_APP_FROM_CONFIG_H

#include "app/args.h"
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* When spec holds a given --from or --from-args: reads it, refuses a flag it derives that
 * the command line also gives with another value, and parses the command line again with
 * the derived flags after the given ones. *argv and *argc then point to the new command line
 * (*owned, to free with mp_from_free_argv, holds it); the note (what was read, what was
 * ignored) into note. Nothing when neither was given (*owned NULL, note ""). */
mp_status mp_from_apply(mp_ctx *ctx, mp_cmd_spec *spec, int *argc, char ***argv, const char **pos, int *n_pos,
                        char ***owned, char *note, size_t cap);
void mp_from_free_argv(char **owned);

#ifdef __cplusplus
}
#endif
#endif
