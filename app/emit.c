/* Emitted plans (app/emit.h): the targets, the header of prediction comments every file
 * opens with, and the write through a temporary name. */
#include "app/emit.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "app/commands.h"
#include "app/emit_internal.h"
#include "common/file.h"

int mp_emit_target_parse(const char *s, mp_emit_target *out) {
  if (strcmp(s, "torchtitan") == 0) *out = MP_EMIT_TORCHTITAN;
  else if (strcmp(s, "megatron") == 0) *out = MP_EMIT_MEGATRON;
  else return 0;
  return 1;
}

mp_status mp_emit_args(mp_ctx *ctx, const char *emit, int has_out, mp_emit_target *t, int *on) {
  *on = emit != NULL;
  if (!emit && has_out) return mp_error(ctx, MP_ERR_USAGE, "--out is where --emit writes; add --emit torchtitan|megatron");
  if (emit && !mp_emit_target_parse(emit, t))
    return mp_error(ctx, MP_ERR_USAGE, "--emit '%s': choose torchtitan or megatron", emit);
  return MP_OK;
}

const char *mp_emit_target_release(mp_emit_target t) {
  return t == MP_EMIT_TORCHTITAN ? "torchtitan v0.2.0" : "Megatron-LM core_v0.14.0";
}

const char *mp_emit_target_ext(mp_emit_target t) { return t == MP_EMIT_TORCHTITAN ? "toml" : "args"; }

/* The models torchtitan v0.2.0 ships a flavor of, with meshplan's model of the same shape:
 * torchtitan/models/llama3/__init__.py ("8B", "70B", "405B": Llama 3.1's shapes, rope theta
 * 500000, 131072 positions), deepseek_v3/__init__.py ("671B"), qwen3/__init__.py ("8B",
 * "30B-A3B"). */
static const struct {
  const char *meshplan, *name, *flavor;
} k_tt_models[] = {
    {"llama3.1-8b", "llama3", "8B"},         {"llama3.1-70b", "llama3", "70B"},
    {"llama3.1-405b", "llama3", "405B"},     {"deepseek-v3", "deepseek_v3", "671B"},
    {"qwen3-8b", "qwen3", "8B"},             {"qwen3-30b-a3b", "qwen3", "30B-A3B"},
};

int mp_emit_torchtitan_model(const char *meshplan_name, const char **tt_name, const char **flavor) {
  for (size_t i = 0; i < sizeof k_tt_models / sizeof k_tt_models[0]; i++)
    if (strcmp(k_tt_models[i].meshplan, meshplan_name) == 0) {
      *tt_name = k_tt_models[i].name;
      *flavor = k_tt_models[i].flavor;
      return 1;
    }
  return 0;
}

const char *mp_emit_torchtitan_model_of(const char *tt_name, const char *flavor) {
  for (size_t i = 0; i < sizeof k_tt_models / sizeof k_tt_models[0]; i++)
    if (strcmp(k_tt_models[i].name, tt_name) == 0 && strcmp(k_tt_models[i].flavor, flavor) == 0)
      return k_tt_models[i].meshplan;
  return NULL;
}

void mp_emit_printf(mp_emit_buf *b, const char *fmt, ...) {
  if (b->oom) return;
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    const int k = vsnprintf(b->s ? b->s + b->n : NULL, b->s ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) {
      b->oom = 1;
      return;
    }
    if (b->s && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return;
    }
    size_t cap = b->cap ? 2 * b->cap : 4096;
    while (cap < b->n + (size_t)k + 1) cap *= 2;
    char *s = realloc(b->s, cap);
    if (s == NULL) {
      b->oom = 1;
      return;
    }
    b->s = s;
    b->cap = cap;
  }
}

int mp_emit_dp(const mp_mesh *m) { return m->size[MP_DIM_DP_REPLICATE] * m->size[MP_DIM_DP_SHARD]; }

void mp_emit_header(mp_emit_buf *b, mp_emit_target t, const mp_emit_plan *p, const char *launch) {
  char ms[128], ac[32], model[4 * MP_NAME_MAX], cluster[256], stack[256];
  /* user-given names: a newline in one would end the comment line */
  MP_CMD_CELL(p->model->name, model);
  MP_CMD_CELL(p->cluster->name, cluster);
  MP_CMD_CELL(p->stack->name, stack);
  char gpu[256];
  MP_CMD_CELL(p->cluster->gpu.name, gpu);
  mp_mesh_format(p->mesh, ms, sizeof ms);
  mp_ac_format(p->o->ac, p->o->ac_every, ac, sizeof ac);
  const int world = mp_mesh_world(p->mesh);
  const int per = p->cluster->gpus_per_node < world ? p->cluster->gpus_per_node : world;
  const int nodes = (world + per - 1) / per;
  mp_emit_printf(b, "# %s for %s, written by meshplan %s (docs/usage.md, \"Emit and read\").\n",
                 t == MP_EMIT_TORCHTITAN ? "torchtitan job config" : "Megatron-LM pretrain_gpt.py arguments",
                 mp_emit_target_release(t), MESHPLAN_VERSION);
  mp_emit_printf(b, "# Schema: %s.\n",
                 t == MP_EMIT_TORCHTITAN ? "pytorch/torchtitan v0.2.0 (29624e37), torchtitan/config/job_config.py"
                                         : "NVIDIA/Megatron-LM core_v0.14.0 (23e00ed0), megatron/training/arguments.py");
  mp_emit_printf(b, "# Plan: %s on %d x %s (%s), mesh %s, ac %s%s%s, seq %lld, micro-batch %lld, global batch %lld\n",
                 model, world, gpu, cluster, ms, ac, p->o->fp8 ? ", fp8 " : "",
                 p->o->fp8 ? mp_fp8_recipe_name(p->o->fp8_opts.recipe) : "", (long long)p->o->seq,
                 (long long)p->o->micro_batch, (long long)p->o->global_batch);
  mp_emit_printf(b, "# Predicted (stack %s): step time %.4f s, %.0f tokens/s per GPU, peak memory %.2f GiB per GPU\n",
                 stack, p->step_time_s, p->tokens_per_s_per_gpu,
                 (double)p->peak_mem_bytes / (1024.0 * 1024.0 * 1024.0));
  mp_emit_printf(b, "# Command: %s\n", p->command ? p->command : "meshplan");
  if (nodes <= 1) {
    mp_emit_printf(b, "# Launch: torchrun --nproc_per_node=%d %s\n", per, launch);
  } else {
    mp_emit_printf(b, "# Launch, on each of the %d nodes: torchrun --nnodes=%d --nproc_per_node=%d "
                   "--rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500 %s\n", nodes, nodes, per, launch);
    mp_emit_printf(b, "# Launch under Slurm: srun --nodes=%d --ntasks-per-node=1 --gpus-per-node=%d torchrun "
                   "--nnodes=%d --nproc_per_node=%d --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500 %s\n",
                   nodes, per, nodes, per, launch);
  }
}

mp_status mp_emit_render(mp_ctx *ctx, mp_emit_target t, const mp_emit_plan *p, const char *file_name,
                         char **out) {
  *out = NULL;
  mp_emit_buf b = {NULL, 0, 0, 0};
  mp_status st = t == MP_EMIT_TORCHTITAN ? mp_emit_torchtitan(ctx, p, file_name, &b)
                                         : mp_emit_megatron(ctx, p, file_name, &b);
  if (st == MP_OK && (b.oom || b.s == NULL)) st = mp_error(ctx, MP_ERR_NOMEM, "out of memory writing a plan");
  if (st != MP_OK) {
    free(b.s);
    return st;
  }
  *out = b.s;
  return MP_OK;
}

mp_status mp_emit_write(mp_ctx *ctx, mp_emit_target t, const mp_emit_plan *p, const char *dir,
                        const char *stem, char *path, size_t cap) {
  const int n = snprintf(path, cap, "%s/%s.%s", dir, stem, mp_emit_target_ext(t));
  if (n < 0 || (size_t)n >= cap) return mp_error(ctx, MP_ERR_USAGE, "--out '%s': path too long", dir);
  /* --out DIR is made when missing, as --plot's is (one level: a missing parent is an error) */
  struct stat sb;
  if (stat(dir, &sb) != 0 && mkdir(dir, 0777) != 0 && errno != EEXIST)
    return mp_error(ctx, MP_ERR_IO, "--out %s: cannot create the folder: %s", dir, strerror(errno));
  if (stat(dir, &sb) == 0 && !S_ISDIR(sb.st_mode))
    return mp_error(ctx, MP_ERR_USAGE, "--out %s exists and is not a folder", dir);
  char *text = NULL;
  MP_CHECK(mp_emit_render(ctx, t, p, path, &text));
  mp_status st = mp_write_file_atomic(ctx, path, text, strlen(text));
  free(text);
  return st;
}

char *mp_emit_command_line(const char *command, int argc, char **argv) {
  mp_emit_buf b = {NULL, 0, 0, 0};
  mp_emit_printf(&b, "meshplan %s", command);
  for (int i = 0; i < argc; i++) {
    int plain = argv[i][0] != '\0' && strpbrk(argv[i], " '\"$\\") == NULL;
    for (const char *c = argv[i]; *c; c++) plain = plain && (unsigned char)*c >= 0x20 && *c != 0x7f;
    if (plain) {
      mp_emit_printf(&b, " %s", argv[i]);
      continue;
    }
    mp_emit_printf(&b, " '");
    /* a control character would end the header's comment line: written as \xHH */
    for (const char *c = argv[i]; *c; c++) {
      if ((unsigned char)*c < 0x20 || *c == 0x7f) mp_emit_printf(&b, "\\x%02x", (unsigned char)*c);
      else mp_emit_printf(&b, *c == '\'' ? "'\\''" : "%c", *c);
    }
    mp_emit_printf(&b, "'");
  }
  if (b.oom) {
    free(b.s);
    return NULL;
  }
  return b.s;
}
