/* meshplan export: a training checkpoint (exec/runtime/ckpt.h; saved under any mesh) as a
 * folder transformers loads: model.safetensors (the fp32 master weights under Hugging
 * Face names, or bf16 with --dtype bf16), config.json (LlamaForCausalLM, or
 * MixtralForCausalLM for an MoE it can express; exec/runtime/hf.h) and the tokenizer's
 * files: the tokenizer.json that scripts/tokenize wrote beside the shards the checkpoint
 * trained on, or --tokenizer's. The manifest is checked as a load checks it, and every
 * shard byte read against its checksum, so a damaged checkpoint fails with the file and
 * tensor named. */
#include <stdio.h>
#include <string.h>

#include "exec/runtime/ckpt.h"
#include "exec/runtime/hf.h"
#include "app/commands.h"

static mp_opt k_opts[] = {
    {"--checkpoint", "D", "a checkpoint folder (its newest step) or one step_N folder", NULL},
    {"--out", "DIR", "the folder to write model.safetensors, config.json and the tokenizer's files into (created "
     "if missing)", NULL},
    {"--dtype", "T", "the weights' type: fp32 (the masters as they are) or bf16 (rounded to nearest even) "
     "(default fp32)", NULL},
    {"--tokenizer", "PATH", "the tokenizer.json to copy (default: the one beside the shards the checkpoint "
     "trained on, as scripts/tokenize writes it; none for synthetic data)", NULL},
    MP_OPT_END,
};

static mp_cmd_spec k_spec = {"export", "Write a training checkpoint as a Hugging Face folder (safetensors + config.json).",
                             "--checkpoint D --out DIR [--dtype fp32|bf16] [--tokenizer PATH]", k_opts, 0};

/* --dtype and --tokenizer (or the tokenizer found beside the checkpoint's data). */
static mp_status read_options(mp_ctx *ctx, const mp_ckpt_manifest *man, mp_hf_export_options *o, char *found,
                              size_t cap) {
  const char *dt = mp_args_get(&k_spec, "--dtype");
  o->dtype = MP_ST_F32;
  if (dt && strcmp(dt, "bf16") == 0) o->dtype = MP_ST_BF16;
  else if (dt && strcmp(dt, "fp32") != 0) return mp_error(ctx, MP_ERR_USAGE, "--dtype %s: choose fp32 or bf16", dt);
  o->tokenizer = mp_args_get(&k_spec, "--tokenizer");
  if (!o->tokenizer && mp_hf_tokenizer_beside_data(man, found, cap)) o->tokenizer = found;
  return MP_OK;
}

static int run_export(mp_ctx *ctx, const mp_cmd_call *call) {
  (void)call;
  const char *ck = mp_args_get(&k_spec, "--checkpoint"), *out = mp_args_get(&k_spec, "--out");
  if (!ck || !out)
    return mp_cmd_fail(ctx, mp_error(ctx, MP_ERR_USAGE, "meshplan export: give --checkpoint D and --out DIR"));
  char dir[MP_CKPT_PATH_MAX], found[MP_CKPT_PATH_MAX + 32];
  mp_status st = mp_ckpt_resolve(ctx, ck, dir, sizeof dir);
  if (st != MP_OK) return mp_cmd_fail(ctx, st);
  mp_ckpt_manifest man;
  mp_hf_export_options o;
  mp_hf_special sp;
  st = mp_ckpt_manifest_read(ctx, dir, &man);
  if (st == MP_OK) st = read_options(ctx, &man, &o, found, sizeof found);
  if (st == MP_OK) st = mp_hf_export(ctx, &man, out, &o, &sp);
  const long long step = (long long)man.meta.step;
  const char *data = cJSON_GetStringValue(cJSON_GetObjectItem(man.meta.train, "data"));
  if (st == MP_OK) {
    printf("exported %s (step %lld) to %s/model.safetensors (%s) and %s/config.json\n", dir, step, out,
           o.dtype == MP_ST_BF16 ? "bf16" : "fp32", out);
    if (o.tokenizer)
      printf("tokenizer: %s copied with tokenizer_config.json; bos %s = %lld, eos %s = %lld\n", o.tokenizer,
             sp.bos_id >= 0 ? sp.bos : "(none)", (long long)sp.bos_id, sp.eos_id >= 0 ? sp.eos : "(none)",
             (long long)sp.eos_id);
    else
      printf("tokenizer: none (%s%s); config.json's bos_token_id and eos_token_id are null; --tokenizer PATH "
             "adds one\n", data && strcmp(data, "synthetic") != 0 ? "no tokenizer.json beside " : "the checkpoint "
             "trained on synthetic data", data && strcmp(data, "synthetic") != 0 ? data : "");
  }
  mp_ckpt_manifest_free(&man);
  return st == MP_OK ? 0 : mp_cmd_fail(ctx, st);
}

const mp_command mp_command_export = {&k_spec, "write a training checkpoint as safetensors + config.json",
                                      run_export};
