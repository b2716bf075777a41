/* --from and --from-args (app/from_config.h): the file read by its framework's reader
 * (app/from_torchtitan.c, app/from_megatron.c) into an mp_from_plan, then said as the
 * flags of the command at hand, which parses its command line again with them. */
#include "app/from_config.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "app/commands.h"
#include "app/from_internal.h"
#include "common/file.h"

#define FROM_MAX_FLAGS 32

void mp_from_ignore(mp_from_plan *p, const char *key) {
  const size_t n = strlen(p->ignored), k = strlen(key);
  if (n + k + 6 >= sizeof p->ignored) {
    if (n + 4 < sizeof p->ignored && (n < 3 || strcmp(p->ignored + n - 3, "...") != 0))
      strcat(p->ignored, "...");
    return;
  }
  snprintf(p->ignored + n, sizeof p->ignored - n, "%s%s", n ? ", " : "", key);
}

/* Derived flags: name and value (NULL for a switch), the values owned by vals. */
typedef struct flag_list {
  const char *name[FROM_MAX_FLAGS];
  char val[FROM_MAX_FLAGS][sizeof ((mp_from_plan *)0)->pp_layers + 32]; /* the longest: a layout */
  int has_val[FROM_MAX_FLAGS];
  int n;
} flag_list;

static void add(flag_list *f, const char *name, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
static void add(flag_list *f, const char *name, const char *fmt, ...) {
  if (f->n >= FROM_MAX_FLAGS) return;
  f->name[f->n] = name;
  f->has_val[f->n] = fmt != NULL;
  f->val[f->n][0] = '\0';
  if (fmt) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(f->val[f->n], sizeof f->val[f->n], fmt, ap);
    va_end(ap);
  }
  f->n++;
}

/* Megatron-Core's recompute modules and method as simulate's flags; plan searches AC
 * policies and takes neither. */
static mp_status recompute_flags(mp_ctx *ctx, const mp_from_plan *p, int is_plan, flag_list *f) {
  if (p->recompute_modules[0] && is_plan)
    return mp_error(ctx, MP_ERR_USAGE, "--from: meshplan plan searches AC policies, not recompute modules "
                    "(--recompute-modules %s); use meshplan simulate --from or explain --from", p->recompute_modules);
  if (p->recompute_modules[0]) add(f, "--recompute-modules", "%s", p->recompute_modules);
  if (p->recompute_method[0] && is_plan)
    return mp_error(ctx, MP_ERR_USAGE, "--from: meshplan plan searches AC policies, not Megatron-Core's recompute "
                    "method (--recompute-method %s); use meshplan simulate --from or explain --from", p->recompute_method);
  if (!p->recompute_method[0]) return MP_OK;
  add(f, "--recompute-method", "%s", p->recompute_method);
  add(f, "--recompute-num-layers", "%d", p->recompute_num_layers);
  return MP_OK;
}

/* Megatron's CPU offloading as simulate's and explain's flag; plan searches no offloading. */
static mp_status offload_flag(mp_ctx *ctx, const mp_from_plan *p, int is_plan, flag_list *f) {
  if (p->cpu_offload_layers <= 0) return MP_OK;
  if (is_plan)
    return mp_error(ctx, MP_ERR_USAGE, "--from: meshplan plan does not search CPU offloading "
                    "(--cpu-offloading-num-layers %lld); use meshplan simulate --from or explain --from",
                    (long long)p->cpu_offload_layers);
  add(f, "--cpu-offload-layers", "%lld", (long long)p->cpu_offload_layers);
  return MP_OK;
}

/* The float8 recipe and its options. */
static void fp8_flags(const mp_from_plan *p, flag_list *f) {
  add(f, "--fp8", "%s", p->fp8[0] ? p->fp8 : "off");
  if (p->fp8_param_gather) add(f, "--fp8-param-gather", NULL);
  if (p->fp8_dpa) add(f, "--fp8-dpa", NULL);
  if (p->fp8_all_gather) add(f, "--fp8-all-gather", NULL);
  if (p->fp8_scope[0]) add(f, "--fp8-scope", "%s", p->fp8_scope);
}

/* The flags that say p to the command of spec: simulate and explain take the pipeline's
 * schedule and resharding as flags, plan as --fix keys. */
static mp_status to_flags(mp_ctx *ctx, const mp_cmd_spec *spec, const mp_from_plan *p, flag_list *f) {
  const int is_plan = mp_args_get(spec, "--fix") != NULL || strcmp(spec->name, "plan") == 0;
  if (p->model[0]) add(f, "--model", "%s", p->model);
  add(f, "--stack", "%s", p->stack);
  char etp[32] = "";
  if (p->etp) snprintf(etp, sizeof etp, ",etp=%d", p->etp);
  if (p->dopt > 1) snprintf(etp + strlen(etp), sizeof etp - strlen(etp), ",dopt=%d", p->dopt);
  add(f, "--mesh", "pp=%d,dp_replicate=%d,dp_shard=%d,cp=%d,tp=%d,ep=%d%s", p->pp, p->dp_replicate, p->dp_shard,
      p->cp, p->tp, p->ep, etp);
  add(f, "--ac", "%s", p->ac);
  add(f, "--mtp-num-layers", "%lld", (long long)p->mtp_layers);
  MP_CHECK(recompute_flags(ctx, p, is_plan, f));
  MP_CHECK(offload_flag(ctx, p, is_plan, f));
  if (p->capacity_factor[0]) add(f, "--moe-capacity-factor", "%s", p->capacity_factor);
  if (p->pad_to_capacity) add(f, "--moe-pad-expert-input-to-capacity", NULL);
  fp8_flags(p, f);
  if (p->sp >= 0) add(f, p->sp ? "--sp" : "--no-sp", NULL);
  add(f, "--seq", "%lld", (long long)p->seq);
  add(f, "--micro-batch", "%lld", (long long)p->micro_batch);
  add(f, "--global-batch", "%lld", (long long)p->global_batch);
  if (p->cp_rotate[0]) add(f, "--cp-rotate", "%s", p->cp_rotate);
  if (p->cp_comm_type[0]) add(f, "--cp-comm-type", "%s", p->cp_comm_type);
  if (p->mfsdp_strategy[0]) add(f, "--data-parallel-sharding-strategy", "%s", p->mfsdp_strategy);
  if (p->fsdp_double_buffer) add(f, "--fsdp-double-buffer", NULL);
  if (p->async_tp) add(f, p->async_tp > 0 ? "--async-tp" : "--no-async-tp", NULL);
  if (p->moe_deepep) add(f, "--moe-dispatcher", "deepep"); /* plan: every candidate's */
  if (!is_plan) {
    if (p->moe_a2a_overlap) add(f, "--overlap-moe-comm", NULL);
    if (p->ce_fusion) add(f, "--cross-entropy-loss-fusion", NULL);
    if (p->ce_fusion == 2) add(f, "--cross-entropy-fusion-impl", "te");
    if (p->cuda_graphs[0]) add(f, "--cuda-graphs", "%s", p->cuda_graphs);
    if (p->ddp_average) add(f, "--ddp-average-in-collective", NULL);
    if (p->ddp_no_check) add(f, "--no-check-for-nan-in-loss-and-grad", NULL);
    if (p->ddp_align) add(f, "--align-param-gather", NULL);
    if (p->wgrad_unfused) add(f, "--no-gradient-accumulation-fusion", NULL);
    if (p->ddp_bucket > 0) add(f, "--ddp-bucket-size", "%lld", (long long)p->ddp_bucket);
    if (p->grad_bf16) add(f, "--fsdp-reduce-dtype", "bf16");
    if (p->reshard == 0) add(f, "--no-reshard", NULL);
    if (p->pp > 1) add(f, "--pp-schedule", "%s", mp_pp_schedule_name(p->pp_schedule));
    if (p->pp > 1 && (p->pp_schedule == MP_PP_INTERLEAVED || p->pp_schedule == MP_PP_INTERLEAVED_ZB))
      add(f, "--pp-virtual", "%d", p->pp_virtual);
    if (p->pp_layers[0]) add(f, "--pp-layers", "%s", p->pp_layers);
    return MP_OK;
  }
  if (p->pp_layers[0])
    return mp_error(ctx, MP_ERR_USAGE, "--from: meshplan plan searches the default layer split; a stated one "
                    "(--decoder-first/last-pipeline-num-layers) is simulate's and explain's --pp-layers");
  if (p->pp > 1 && p->pp_schedule == MP_PP_GPIPE)
    return mp_error(ctx, MP_ERR_USAGE, "--from: meshplan plan searches 1F1B and interleaved pipelines, not GPipe; "
                    "use meshplan simulate --from");
  if (p->moe_a2a_overlap)
    return mp_error(ctx, MP_ERR_USAGE, "--from: meshplan plan searches the dispatchers without their overlap; "
                    "--overlap-moe-expert-parallel-comm is simulate's and explain's --overlap-moe-comm");
  if (p->cuda_graphs[0])
    return mp_error(ctx, MP_ERR_USAGE, "--from: meshplan plan searches eager launches; CUDA graphs "
                    "(--enable-cuda-graph, --external-cuda-graph) are simulate's and explain's --cuda-graphs %s",
                    p->cuda_graphs);
  if (p->ce_fusion || p->ddp_average || p->ddp_no_check || p->ddp_align || p->ddp_bucket > 0 || p->wgrad_unfused)
    return mp_error(ctx, MP_ERR_USAGE, "--from: meshplan plan searches the stack's own cross-entropy and DDP; "
                    "--cross-entropy-loss-fusion, --ddp-average-in-collective, "
                    "--no-check-for-nan-in-loss-and-grad, --align-param-gather, --ddp-bucket-size and "
                    "--no-gradient-accumulation-fusion are simulate's and explain's options of those names");
  if (p->grad_bf16)
    return mp_error(ctx, MP_ERR_USAGE, "--from: meshplan plan searches fp32 main gradients; "
                    "--grad-reduce-in-bf16 is simulate's and explain's --fsdp-reduce-dtype bf16");
  /* the user's --fix keys beside the file's: a key in both is refused by --fix's parser */
  const char *fix = mp_args_get(spec, "--fix");
  /* reshard only where there is an FSDP group to reshard over (the search's own rule) */
  char rs[24] = "";
  if (p->reshard >= 0 && p->dp_shard * p->cp > 1) snprintf(rs, sizeof rs, "reshard=%d,", p->reshard);
  add(f, "--fix", "%s%s%spp_virtual=%d", fix ? fix : "", fix ? "," : "", rs, p->pp > 1 ? p->pp_virtual : 1);
  return MP_OK;
}

/* The cluster's GPUs as the command line gives them; 0 for plan's sweep (--gpus A..B). */
static mp_status world_of(mp_ctx *ctx, const mp_cmd_spec *spec, int *world) {
  const char *g = mp_args_get(spec, "--gpus");
  *world = 0;
  if (g && strstr(g, "..")) return MP_OK;
  mp_cluster c;
  MP_CHECK(mp_cmd_load_cluster(ctx, spec, &c));
  *world = mp_cluster_n_gpus(&c);
  return MP_OK;
}

/* The configuration given, read by its framework's reader. A --from FILE is torchtitan's
 * TOML unless its first word is a flag (--...) or a launcher's (torchrun, python). */
static mp_status read_plan(mp_ctx *ctx, const mp_cmd_spec *spec, mp_from_plan *p) {
  const char *path = mp_args_get(spec, "--from"), *args = mp_args_get(spec, "--from-args");
  if (path && args) return mp_error(ctx, MP_ERR_USAGE, "give --from FILE or --from-args 'ARGS', not both");
  int world = 0;
  MP_CHECK(world_of(ctx, spec, &world));
  char *text = NULL;
  if (path) MP_CHECK(mp_read_file_max(ctx, path, MP_FILE_MAX_CONFIG_BYTES, &text, NULL));
  const char *t = path ? text : args;
  char origin[600];
  snprintf(origin, sizeof origin, "%s%s", path ? "--from " : "--from-args", path ? path : "");
  const char *w = t;
  for (;;) { /* the first word after blanks and comment lines */
    w += strspn(w, " \t\r\n");
    if (*w != '#') break;
    w += strcspn(w, "\n");
  }
  const int megatron = args || strncmp(w, "--", 2) == 0 || strncmp(w, "torchrun", 8) == 0 ||
                       strncmp(w, "python", 6) == 0;
  mp_status st = MP_OK;
  if (megatron) {
    mp_model given;
    const int has = mp_args_has(spec, "--model") || mp_args_has(spec, "--hf-config");
    if (has) st = mp_cmd_load_model(ctx, spec, "llama3.1-8b", &given);
    if (st == MP_OK) st = mp_from_megatron(ctx, t, origin, world, has ? &given : NULL, p);
  } else {
    st = mp_from_torchtitan(ctx, t, origin, world, p);
  }
  free(text);
  return st;
}

/* Refuses a derived flag the command line gives with another value. */
static mp_status check_conflicts(mp_ctx *ctx, const mp_cmd_spec *spec, const flag_list *f, const char *src) {
  for (int i = 0; i < f->n; i++) {
    if (strcmp(f->name[i], "--fix") == 0) continue; /* merged */
    const char *v = mp_args_get(spec, f->name[i]);
    if (v && (!f->has_val[i] || strcmp(v, f->val[i]) == 0)) continue;
    if (v)
      return mp_error(ctx, MP_ERR_USAGE, "%s '%s' contradicts %s, which says %s %s; give one", f->name[i], v, src,
                      f->name[i], f->val[i]);
  }
  return MP_OK;
}

void mp_from_free_argv(char **owned) {
  if (owned == NULL) return;
  for (char **a = owned; *a; a++) free(*a);
  free(owned);
}

/* "--model llama3.1-8b --mesh ..." into buf. */
static void flags_str(const flag_list *f, char *buf, size_t cap) {
  buf[0] = '\0';
  for (int i = 0; i < f->n; i++)
    snprintf(buf + strlen(buf), cap - strlen(buf), "%s%s%s%s", i ? " " : "", f->name[i], f->has_val[i] ? " " : "",
             f->has_val[i] ? f->val[i] : "");
}

mp_status mp_from_apply(mp_ctx *ctx, mp_cmd_spec *spec, int *argc, char ***argv, const char **pos, int *n_pos,
                        char ***owned, char *note, size_t cap) {
  *owned = NULL;
  note[0] = '\0';
  if (!mp_args_has(spec, "--from") && !mp_args_has(spec, "--from-args")) return MP_OK;
  mp_from_plan *p = calloc(1, sizeof *p);
  flag_list *f = calloc(1, sizeof *f);
  mp_status st = p && f ? MP_OK : mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  if (st == MP_OK) st = read_plan(ctx, spec, p);
  if (st == MP_OK) st = to_flags(ctx, spec, p, f);
  const char *src = mp_args_has(spec, "--from") ? mp_args_get(spec, "--from") : "--from-args";
  char src_b[600];
  snprintf(src_b, sizeof src_b, "%s%s", mp_args_has(spec, "--from") ? "--from " : "", src);
  if (st == MP_OK) st = check_conflicts(ctx, spec, f, src_b);
  char **a = st == MP_OK ? calloc((size_t)*argc + 2 * FROM_MAX_FLAGS + 1, sizeof *a) : NULL;
  if (st == MP_OK && a == NULL) st = mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  int n = 0;
  for (int i = 0; st == MP_OK && i < *argc; i++) a[n++] = strdup((*argv)[i]);
  for (int i = 0; st == MP_OK && i < f->n; i++) {
    a[n++] = strdup(f->name[i]);
    if (f->has_val[i]) a[n++] = strdup(f->val[i]);
  }
  for (int i = 0; st == MP_OK && i < n; i++)
    if (a[i] == NULL) st = mp_error(ctx, MP_ERR_NOMEM, "out of memory");
  int help = 0;
  if (st == MP_OK) st = mp_args_parse(ctx, spec, n, a, pos, n_pos, &help);
  if (st == MP_OK) {
    char flags[2048];
    flags_str(f, flags, sizeof flags);
    snprintf(note, cap, "%s (%s) read as: %s%s%s", src_b, p->framework, flags,
             p->ignored[0] ? "; ignored, as they change no cost: " : "", p->ignored);
    *argc = n;
    *argv = a;
    *owned = a;
  } else {
    mp_from_free_argv(a);
  }
  free(p);
  free(f);
  return st;
}
