/* meshplan export: a training checkpoint (exec/runtime/ckpt.h; saved under any mesh) as a
 * folder transformers loads: model.safetensors (the fp32 master weights under Hugging
 * Face names) and config.json (LlamaForCausalLM, or MixtralForCausalLM for an MoE it can
 * express; exec/runtime/hf.h). Every shard byte read is checked against the manifest's
 * checksum, so a corrupt checkpoint fails with the file and tensor named. */
#include <stdio.h>

#include "exec/runtime/ckpt.h"
#include "exec/runtime/hf.h"
#include "app/commands.h"

static mp_opt k_opts[] = {
    {"--checkpoint", "D", "a checkpoint folder (its newest step) or one step_N folder", NULL},
    {"--out", "DIR", "the folder to write model.safetensors and config.json into (created if missing)", NULL},
    MP_OPT_END,
};

static mp_cmd_spec k_spec = {"export", "Write a training checkpoint as a Hugging Face folder (safetensors + config.json).",
                             "--checkpoint D --out DIR", k_opts, 0};

static int run_export(mp_ctx *ctx, const mp_cmd_call *call) {
  (void)call;
  const char *ck = mp_args_get(&k_spec, "--checkpoint"), *out = mp_args_get(&k_spec, "--out");
  if (!ck || !out)
    return mp_cmd_fail(ctx, mp_error(ctx, MP_ERR_USAGE, "meshplan export: give --checkpoint D and --out DIR"));
  char dir[MP_CKPT_PATH_MAX];
  mp_status st = mp_ckpt_resolve(ctx, ck, dir, sizeof dir);
  if (st != MP_OK) return mp_cmd_fail(ctx, st);
  mp_ckpt_manifest man;
  st = mp_ckpt_manifest_read(ctx, dir, &man);
  if (st == MP_OK) st = mp_hf_export(ctx, &man, out);
  const long long step = (long long)man.meta.step;
  mp_ckpt_manifest_free(&man);
  if (st != MP_OK) return mp_cmd_fail(ctx, st);
  printf("exported %s (step %lld) to %s/model.safetensors and %s/config.json\n", dir, step, out, out);
  return 0;
}

const mp_command mp_command_export = {&k_spec, "write a training checkpoint as safetensors + config.json",
                                      run_export};
