/* meshplan explain: what a plan does to a model on a mesh, pass by pass.
 *
 * Builds the plan the stack runs (--stack, else the GPU's default: its memory model,
 * attention, loss, SP and context-parallel ring, as simulate builds it) with mp_build_plan
 * (TP -> EP -> Float8 -> AC -> FSDP) and prints: the
 * passes applied and what each changed (the plan's notes), a per-parameter table (global
 * shape, after TP/EP, at rest on --rank, bytes at rest in the master dtype), the FSDP
 * units, the per-rank totals; --param FQN adds a tile diagram of one weight (one
 * character grid per rank: '#' rows/columns the rank stores, '+' a cell it stores part
 * of, '.' nothing); --schedule the rank's step schedule (exec/schedule.h); --json all
 * of it as one JSON document (cJSON). With cp > 1 a "context parallel" section says how the
 * ring runs; with pp > 1 a "pipeline" section gives the layer split, the rank's warm-up and
 * in-flight chunks in the stack's schedule implementation, the bubble and the boundary
 * transfers.
 *
 * Text tables collapse consecutive layers whose rows are identical ("layers.0-31.mlp.
 * up_proj.weight"); the JSON lists every parameter. Errors (bad mesh, a pass refusing,
 * an unknown --param) are one line and exit 2 through mp_cmd_fail. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "common/arena.h"
#include "common/intmath.h"
#include "exec/model.h"
#include "exec/plan.h"
#include "exec/schedule.h"
#include "app/commands.h"
#include "sim/sim.h"
#include "sim/stack.h"

static mp_opt k_opts[] = {
    MP_OPT_MODEL("llama3.1-8b"),
    MP_OPT_HF_CONFIG,
    MP_OPT_MESH("default dp_shard=8"),
    MP_OPT_EP(""),
    MP_OPT_AC(""),
    MP_OPT_FP8(""),
    MP_OPT_SP,
    MP_OPT_NO_SP,
    MP_OPT_PP_SCHEDULE,
    MP_OPT_PP_VIRTUAL,
    MP_OPT_CP_ROTATE,
    MP_OPT_ASYNC_TP,
    {"--pad-vocab", NULL, "pad the vocabulary to a multiple of tp instead of refusing", NULL},
    {"--param", "FQN", "tile diagram of one parameter, e.g. layers.0.mlp.up_proj.weight", NULL},
    {"--rank", "R", "rank whose at-rest shapes and totals are shown (default 0)", NULL},
    MP_OPT_SEQ("min(8192, the model's max_seq)"),
    MP_OPT_ALLOW_LONG_SEQ,
    MP_OPT_MICRO_BATCH("1; with pp > 1 under a stack that splits its local batch into pp micro-batches, as torchtitan does, that split"),
    MP_OPT_GLOBAL_BATCH_RULE,
    MP_OPT_GLOBAL_BATCH_TOKENS,
    {"--schedule", NULL, "print the rank's step schedule, each op with its predicted duration", NULL},
    {"--summary", NULL, "where the predicted step goes: time and count per kernel class and per collective "
                        "group (with or instead of --schedule)", NULL},
    MP_OPT_CLUSTER("--gpus of the mesh's world"),
    MP_OPT_GPUS,
    MP_OPT_GPU_OF_GPUS("default h100-sxm"),
    MP_OPT_GPUS_PER_NODE("8, or N when N < 8"),
    MP_OPT_INTER_GBPS,
    MP_OPT_STACK("the GPU's default"),
    MP_OPT_JSON("everything"),
    MP_OPT_END,
};

static mp_cmd_spec k_spec = {
    "explain", "Show the sharding passes, parameter shapes, FSDP units and schedule of one plan.",
    "[--model M | --hf-config PATH] [--mesh SPEC] [--ep N] [--pp-schedule 1f1b|interleaved|gpipe [--pp-virtual V]] "
    "[--cp-rotate M] [--ac MODE] [--fp8] [--sp|--no-sp] [--param FQN] [--rank R] [--json] "
    "[--schedule] [--summary] [--cluster C | --gpus N] [--seq S] [--micro-batch B] [--global-batch G]",
    k_opts, 0};

/* ---- formatting helpers ----------------------------------------------------------- */

static void fmt_shape(const int64_t *s, int ndim, char *buf, size_t cap) {
  size_t used = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, "%s%lld", i ? ", " : "", (long long)s[i]);
  if (used < cap) snprintf(buf + used, cap - used, "]");
}

static void fmt_bytes(double b, char *buf, size_t cap) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024.0 && i < 4) {
    b /= 1024.0;
    i++;
  }
  if (i == 0) snprintf(buf, cap, "%.0f B", b);
  else snprintf(buf, cap, "%.2f %s", b, u[i]);
}

static void fmt_place(const mp_placement *pl, char *buf, size_t cap) {
  if (pl->kind == MP_PLACEMENT_SHARD) snprintf(buf, cap, "Shard(%d)", pl->dim);
  else snprintf(buf, cap, "Replicate");
}

/* "tp:col fsdp:S0 ep:S0" (only the axes that shard). */
static void fmt_placements(const mp_param *prm, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = 0;
  if (prm->tp_style != MP_TP_NONE)
    used += (size_t)snprintf(buf + used, cap - used, "tp:%s ", mp_tp_style_name(prm->tp_style));
  if (prm->place[MP_AXIS_EP].kind == MP_PLACEMENT_SHARD && used < cap)
    used += (size_t)snprintf(buf + used, cap - used, "ep:S(0) ");
  if (prm->place[MP_AXIS_FSDP].kind == MP_PLACEMENT_SHARD && used < cap)
    used += (size_t)snprintf(buf + used, cap - used, "%s:S(0) ",
                             prm->fsdp_group == MP_GROUP_EFSDP ? "efsdp" : "fsdp");
  if (prm->float8 && used < cap) used += (size_t)snprintf(buf + used, cap - used, "fp8 ");
  if (used > 0 && used <= cap) buf[used - 1] = 0;
  if (used == 0) snprintf(buf, cap, "replicated");
}

/* FQN with the layer index replaced by a range: "layers.0-31.mlp.up_proj.weight". */
static void fmt_fqn_range(const mp_param *prm, int first, int last, char *buf, size_t cap) {
  if (prm->layer < 0 || first == last) {
    if (prm->layer < 0) snprintf(buf, cap, "%s", prm->fqn);
    else snprintf(buf, cap, "layers.%d.%s.%s", first, mp_module_name(prm->module),
                  prm->role == MP_ROLE_WEIGHT ? "weight" : "bias");
    return;
  }
  snprintf(buf, cap, "layers.%d-%d.%s.%s", first, last, mp_module_name(prm->module),
           prm->role == MP_ROLE_WEIGHT ? "weight" : "bias");
}

/* ---- explain state ---------------------------------------------------------------- */

typedef struct explain {
  mp_plan *plan;
  int rank;
  int world;
  const char *param_fqn;
  int schedule;
  int summary;
  int json;
  double *dur;         /* --schedule, --summary: per op of the schedule, its predicted s */
  mp_sim_busy busy;    /* the predicted step's busy time by class */
  mp_sim_result res;   /* the predicted step */
  char predicted_on[200]; /* "8 x h100-sxm, stack torchtitan-compile" */
  char kernels[512];      /* how the stack's kernel efficiencies carry to the GPU (sim/stack.h) */
  cJSON *kernels_json;    /* the same for --json (mp_cmd_kernel_scale_json), owned */
  int64_t local_batch; /* sequences per data-parallel rank per step */
  int64_t n_micro;     /* micro-batches per step */
  /* pp > 1: the rank's pipeline (pipeline_facts) */
  char pp_note[1024];
  char mb_rule[300];      /* the stack's pipeline micro-batching (mp_cmd_stack_micro_batch) */
  mp_pp_flavor pp_flavor;
  int pp_warmup;          /* forwards before the rank's first backward */
  int64_t pp_inflight;    /* the most chunk activations the rank holds at once */
  double pp_bubble;       /* (pp - 1) / m, or / (v m) interleaved: equal stages' idle share */
  double pp_send_bytes;   /* one stage boundary's activation (or its gradient) per micro-batch */
  double pp_chunk_layers[MP_MAX_LAYERS]; /* layers of model chunk k = c x pp + s */
  int pp_chunks;
  mp_cluster cluster;     /* the cluster predicted on and the stack (explain_stack) */
  mp_stack_profile prof;
} explain;

/* Row of the collapsed parameter table. */
typedef struct row {
  int param;         /* representative (first layer) */
  int first, last;   /* layer range */
  int64_t rest[MP_MAX_NDIM];
  int has_rest;
} row;

static int same_row(const mp_plan *p, const mp_param *a, const mp_param *b, int rank) {
  if (a->ndim != b->ndim || a->tp_style != b->tp_style || a->float8 != b->float8 ||
      a->fsdp_group != b->fsdp_group)
    return 0;
  for (int i = 0; i < a->ndim; i++)
    if (a->shape[i] != b->shape[i] || a->tp_shape[i] != b->tp_shape[i]) return 0;
  int64_t oa[MP_MAX_NDIM], la[MP_MAX_NDIM], ob[MP_MAX_NDIM], lb[MP_MAX_NDIM];
  int ha = mp_param_tile(p, a, rank, oa, la), hb = mp_param_tile(p, b, rank, ob, lb);
  if (ha != hb) return 0;
  for (int i = 0; ha && i < a->ndim; i++)
    if (la[i] != lb[i]) return 0;
  return 1;
}

static int build_rows(const mp_plan *p, int rank, row **out) {
  row *rows = calloc((size_t)p->n_params + 1, sizeof *rows);
  if (rows == NULL) return -1;
  int last_row[MP_MOD_COUNT][2];
  for (int m = 0; m < MP_MOD_COUNT; m++) last_row[m][0] = last_row[m][1] = -1;
  int n = 0;
  for (int i = 0; i < p->n_params; i++) {
    const mp_param *prm = &p->params[i];
    int *lr = &last_row[prm->module][prm->role];
    if (prm->layer >= 0 && *lr >= 0 && rows[*lr].last == prm->layer - 1 &&
        same_row(p, &p->params[rows[*lr].param], prm, rank)) {
      rows[*lr].last = prm->layer;
      continue;
    }
    row *r = &rows[n];
    r->param = i;
    r->first = r->last = prm->layer;
    int64_t off[MP_MAX_NDIM];
    r->has_rest = mp_param_tile(p, prm, rank, off, r->rest);
    if (prm->layer >= 0) *lr = n;
    n++;
  }
  *out = rows;
  return n;
}

/* ---- text output ------------------------------------------------------------------ */

static void print_header(const explain *e) {
  const mp_plan *p = e->plan;
  char mesh_s[128];
  mp_mesh_format(&p->mesh, mesh_s, sizeof mesh_s);
  int c[MP_MESH_NDIMS];
  mp_mesh_coords(&p->mesh, e->rank, c);
  printf("model %s: %s family, %.4g parameters, %lld layers, d_model %lld\n", p->model.name,
         p->model.family == MP_FAMILY_GPT ? "gpt" : "llama",
         (double)mp_model_param_count(&p->model), (long long)p->model.n_layers,
         (long long)p->model.d_model);
  if (mp_model_is_moe(&p->model)) /* the two counts publishers quote for a MoE model */
    printf("      %.2fB of %.2fB parameters activated per token (both embeddings counted); "
           "%.2fB without the input embedding's lookup\n",
           (double)mp_model_active_param_count(&p->model) / 1e9,
           (double)mp_model_param_count(&p->model) / 1e9,
           (double)mp_model_matmul_param_count(&p->model) / 1e9);
  printf("mesh  %s: %d ranks; rank %d is pp %d, dp_replicate %d, dp_shard %d (ep %d, efsdp %d), "
         "cp %d, tp %d\n",
         mesh_s, e->world, e->rank, c[MP_DIM_PP], c[MP_DIM_DP_REPLICATE], c[MP_DIM_DP_SHARD],
         mp_mesh_ep_index(&p->mesh, e->rank), mp_mesh_efsdp_index(&p->mesh, e->rank), c[MP_DIM_CP],
         c[MP_DIM_TP]);
  printf("batch seq %lld, global batch %lld: %lld sequences per data-parallel rank in %lld "
         "micro-batches of %lld\n",
         (long long)p->opts.seq, (long long)p->opts.global_batch, (long long)e->local_batch,
         (long long)e->n_micro, (long long)p->opts.micro_batch);
}

static void print_passes(const mp_plan *p) {
  printf("\npasses applied (in order):\n");
  for (int i = 0; i < p->n_passes; i++) {
    const char *name = mp_pass_name((unsigned)p->pass_order[i]);
    printf("  %d. %s\n", i + 1, name);
    size_t nl = strlen(name);
    int said = 0;
    for (int k = 0; k < p->n_notes; k++)
      if (strncmp(p->notes[k], name, nl) == 0 && p->notes[k][nl] == ':') {
        printf("     %s\n", p->notes[k] + nl + 2);
        said = 1;
      }
    if (!said && p->pass_order[i] == MP_PASS_AC)
      printf("     none: every activation saved for backward, nothing recomputed\n");
    else if (!said)
      printf("     (no change)\n");
  }
  const unsigned all[] = {MP_PASS_TP, MP_PASS_EP, MP_PASS_FLOAT8};
  for (int i = 0; i < 3; i++)
    if (!(p->applied & all[i]))
      printf("  -  %s not applied%s\n", mp_pass_name(all[i]),
             all[i] == MP_PASS_TP ? " (tp=1)" : all[i] == MP_PASS_EP ? " (ep=1)" : " (no --fp8)");
}

/* With cp > 1, how the attention core runs (exec/schedule_cp.c's ring, as the plan's memory
 * model runs it): the load-balanced chunks, what travels and by which collective. "" with
 * cp = 1. */
static void cp_note(const mp_plan *p, char *buf, size_t cap) {
  buf[0] = '\0';
  const int cp = p->mesh.size[MP_DIM_CP], tp = p->mesh.size[MP_DIM_TP];
  if (cp <= 1) return;
  const mp_model *m = &p->model;
  const int64_t T = p->opts.seq / cp * p->opts.micro_batch;
  const int mla = mp_model_is_mla(m);
  int n = snprintf(buf, cap,
                   "cp=%d: ring attention with causal load balancing, the sequence in %d chunks, "
                   "rank i holding chunks i and %d - i (%lld tokens a micro-batch); ",
                   cp, 2 * cp, 2 * cp - 1, (long long)T);
  if (n < 0 || (size_t)n >= cap) return;
  if (mp_mem_model_is_runtime(p->opts.mem_model)) {
    snprintf(buf + n, cap - (size_t)n,
             "the rank's K and V (its %lld kv heads) passed to the next rank after every step, "
             "and in backward their gradients too, each transfer blocking (meshplan's runtime)",
             (long long)(m->n_kv_heads / tp));
    return;
  }
  int64_t kw, vw;
  const int mg = p->opts.mem_model == MP_MEM_MODEL_MEGATRON;
  mp_cp_ring_widths(m, tp, mg, &kw, &vw);
  const double kv = 2.0 * (double)(T * (kw + vw));
  const mp_cp_rotate rot = p->opts.cp_rotate;
  char a[32], g[32], d[32], moved[320];
  fmt_bytes(kv, a, sizeof a);
  fmt_bytes(2.0 * kv, d, sizeof d);
  fmt_bytes(kv * mp_cp_ring_kv_units(cp, rot, mg), g, sizeof g);
  if (mg) {
    snprintf(buf + n, cap - (size_t)n,
             "K and V %s (%s a rank), passed to the next rank before every step but the last, "
             "each transfer beside that step's attention and waited for by the next step (%s "
             "held: every step's K, V buffer is kept until the pass ends), the fp32 dK, dV (%s) "
             "passed to the next rank after every backward step (Megatron-LM's context "
             "parallelism: Transformer Engine's p2p ring; gradients all-reduced over "
             "dp_replicate x cp)",
             mla ? "at their decompressed widths" : "of the kv heads", a, g, d);
    return;
  }
  const int sync = p->opts.cp_wait_at_issue;
  if (rot == MP_CP_ROTATE_ALLTOALL) {
    snprintf(moved, sizeof moved,
             " (%s a rank), copied and passed to the next rank before every step but the last, "
             "each transfer %s and waited for by the next step (%s held: the K, V in use, the "
             "copy sent, the one arriving)",
             a, sync ? "between two steps" : "beside that step's attention", g);
  } else {
    fmt_bytes(kv * cp, g, sizeof g); /* the gathered ones, the send buffer aside */
    snprintf(moved, sizeof moved,
             ", all-gathered on the CP group once per pass (%s a rank, %s gathered and held "
             "through the ring; %s)",
             a, g, sync ? "before step 0" : "only step 0 hides the gather");
  }
  snprintf(buf + n, cap - (size_t)n,
           "K and V %s%s, the fp32 dK, dV (%s) passed to the next rank after every backward step "
           "(torchtitan's %s%s rotate method)%s",
           mla ? "at their decompressed widths" : "expanded to every query head", moved, d,
           mla ? "" : "repeat_kv and ", mp_cp_rotate_name(rot),
           sync ? "; the ring is compiled with its block (torch.compile), where each of these "
                  "collectives is waited for where it is issued, so none runs beside an "
                  "attention step"
                : "");
}

/* With pp > 1, the rank's pipeline: the layer split, its stage's warm-up and in-flight
 * chunks walking mp_pp_order as the stack's implementation runs it, the bubble of equal
 * stages and what crosses a stage boundary; e->pp_note the sentence. MP_ERR_INVALID where
 * the schedule refuses the micro-batch count (the interleaved schedule's groups of pp). */
static mp_status pipeline_facts(mp_ctx *ctx, explain *e, const mp_stack_profile *prof) {
  const mp_plan *p = e->plan;
  const int pp = p->mesh.size[MP_DIM_PP], v = mp_plan_virtual_stages(p);
  e->pp_note[0] = '\0';
  if (pp <= 1) return MP_OK;
  e->pp_flavor = prof->pp_flavor;
  const int stage = mp_plan_rank_stage(p, e->rank);
  e->pp_chunks = pp * v;
  for (int c = 0; c < v; c++)
    for (int s = 0; s < pp; s++) {
      int64_t l0, l1;
      mp_plan_chunk_layers(p, s, c, &l0, &l1);
      e->pp_chunk_layers[c * pp + s] = (double)(l1 - l0);
    }
  const size_t n = (size_t)(2 * e->n_micro * v);
  mp_pp_step *ord = malloc(n * sizeof *ord);
  if (ord == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the pipeline order");
  int64_t got = 0;
  mp_status st = mp_pp_order(ctx, p->opts.pp_schedule, e->pp_flavor, pp, v, e->n_micro, stage, ord, &got);
  if (st != MP_OK) {
    free(ord);
    return st;
  }
  e->pp_warmup = 0;
  while (e->pp_warmup < got && !ord[e->pp_warmup].bwd) e->pp_warmup++;
  e->pp_inflight = mp_pp_inflight(ord, got);
  free(ord);
  const int interleaved = p->opts.pp_schedule == MP_PP_INTERLEAVED && v > 1;
  e->pp_bubble = (double)(pp - 1) / (double)((interleaved ? v : 1) * e->n_micro);
  const int tp = p->mesh.size[MP_DIM_TP];
  int64_t T = p->opts.micro_batch * (p->opts.seq / p->mesh.size[MP_DIM_CP]);
  if (p->opts.sp && tp > 1) T /= tp;
  e->pp_send_bytes = (double)T * (double)p->model.d_model * 2.0;
  char split[256], mine[160], sb[32];
  mp_cmd_fmt_runs(e->pp_chunk_layers, e->pp_chunks, "%.0f", split, sizeof split);
  size_t u = 0;
  mine[0] = '\0';
  for (int c = 0; c < v && u < sizeof mine; c++) {
    int64_t l0, l1;
    mp_plan_chunk_layers(p, stage, c, &l0, &l1);
    u += (size_t)snprintf(mine + u, sizeof mine - u, "%s%lld-%lld", c ? " and " : "", (long long)l0,
                          (long long)l1 - 1);
  }
  fmt_bytes(e->pp_send_bytes, sb, sizeof sb);
  char sched[48];
  if (interleaved) snprintf(sched, sizeof sched, "interleaved 1F1B x%d", v);
  else snprintf(sched, sizeof sched, "%s", p->opts.pp_schedule == MP_PP_GPIPE ? "GPipe" : "1F1B");
  snprintf(e->pp_note, sizeof e->pp_note,
           "pp=%d, %s as %s runs it (stack %s), %lld micro-batches a step; layers %s over the "
           "%d model chunks%s%s; rank %d (stage %d) holds layers %s, runs %d forwards before its "
           "first backward and holds at most %lld chunk activations (micro-batch x chunk); "
           "bubble with equal stages (pp - 1) / %s = %.3f of the busy time; a stage boundary "
           "passes the %s activation forward and its gradient back, %s a micro-batch each way",
           pp, sched,
           e->pp_flavor == MP_PP_FLAVOR_TORCH ? "torch.distributed.pipelining" : "Megatron-LM",
           prof->name, (long long)e->n_micro, split, e->pp_chunks,
           interleaved ? ", chunk c x pp + s on stage s" : "",
           p->model.n_layers % e->pp_chunks ? ", the remainder one each to the chunks after the "
                                              "first (torchtitan's split)"
                                            : "",
           e->rank, stage, mine, e->pp_warmup,
           (long long)e->pp_inflight, interleaved ? "(v m)" : "m", e->pp_bubble,
           p->opts.sp && tp > 1 ? "[T/tp, H] bf16" : "[T, H] bf16", sb);
  return MP_OK;
}

static void print_pipeline(const explain *e) {
  if (e->pp_note[0]) printf("\npipeline\n  %s\n", e->pp_note);
  if (e->mb_rule[0]) printf("  micro-batches: %s\n", e->mb_rule);
}

static void print_cp(const mp_plan *p) {
  char note[1024];
  cp_note(p, note, sizeof note);
  if (note[0]) printf("\ncontext parallel\n  %s\n", note);
}

static void print_params(const explain *e) {
  const mp_plan *p = e->plan;
  row *rows = NULL;
  int n = build_rows(p, e->rank, &rows);
  if (n < 0) return;
  const int mb = mp_dtype_bytes(p->opts.master_dtype);
  printf("\nparameters (global -> after TP/EP -> at rest on rank %d; bytes at rest in %s, each):\n",
         e->rank, mp_dtype_name(p->opts.master_dtype));
  /* the FQN column is as wide as its longest name (46 at least, the llama names) */
  int w = 46;
  for (int i = 0; i < n; i++) {
    char fqn[160];
    fmt_fqn_range(&p->params[rows[i].param], rows[i].first, rows[i].last, fqn, sizeof fqn);
    if ((int)strlen(fqn) > w) w = (int)strlen(fqn);
  }
  printf("  %-*s %-20s %-20s %-20s %11s  %s\n", w, "FQN", "global", "after TP/EP", "at rest",
         "bytes", "placement");
  for (int i = 0; i < n; i++) {
    const mp_param *prm = &p->params[rows[i].param];
    char fqn[160], g[64], t[64], r[64], b[32], pl[96];
    fmt_fqn_range(prm, rows[i].first, rows[i].last, fqn, sizeof fqn);
    fmt_shape(prm->shape, prm->ndim, g, sizeof g);
    fmt_shape(prm->tp_shape, prm->ndim, t, sizeof t);
    int64_t numel = 0;
    if (rows[i].has_rest) {
      fmt_shape(rows[i].rest, prm->ndim, r, sizeof r);
      numel = 1;
      for (int d = 0; d < prm->ndim; d++) numel *= rows[i].rest[d];
    } else {
      snprintf(r, sizeof r, prm->pp_stage != mp_plan_rank_stage(p, e->rank) ? "(stage %d)" : "(none)",
               prm->pp_stage);
    }
    fmt_bytes((double)numel * mb, b, sizeof b);
    fmt_placements(prm, pl, sizeof pl);
    printf("  %-*s %-20s %-20s %-20s %11s  %s\n", w, fqn, g, t, r, b, pl);
  }
  free(rows);
}

static int same_unit(const mp_plan *p, const mp_fsdp_unit *a, const mp_fsdp_unit *b) {
  (void)p;
  if (a->layer < 0 || b->layer < 0) return 0;
  const char *sa = strchr(a->name + 7, '.'), *sb = strchr(b->name + 7, '.');
  if ((sa == NULL) != (sb == NULL) || (sa && strcmp(sa, sb) != 0)) return 0;
  return a->group == b->group && a->n_params == b->n_params && a->numel_tp == b->numel_tp &&
         a->numel_shard == b->numel_shard;
}

/* Units of consecutive layers with the same suffix (none, ".attention", ".moe",
 * ".moe.experts") and the same sizes print as one row; with three units per block the
 * runs interleave, so printed units are marked rather than skipped by position. */
static void print_units(const explain *e) {
  const mp_plan *p = e->plan;
  /* Megatron-LM runs no FSDP: its units only carry the per-block gradient buckets */
  if (!(p->applied & MP_PASS_FSDP) || p->opts.mem_model == MP_MEM_MODEL_MEGATRON) return;
  const int pb = mp_dtype_bytes(p->opts.fsdp.param_dtype);
  printf("\nFSDP units (%d; params gathered in %s, gradients reduced in %s, %s after forward):\n",
         p->n_units, mp_dtype_name(p->opts.fsdp.param_dtype),
         mp_dtype_name(p->opts.fsdp.reduce_dtype),
         p->opts.fsdp.reshard_after_forward ? "resharded" : "kept");
  printf("  %-32s %-6s %5s %7s %14s %12s %14s\n", "unit", "group", "size", "params",
         "gathered elems", "gathered", "shard elems");
  char *done = calloc((size_t)p->n_units + 1, 1);
  if (done == NULL) return;
  for (int u = 0; u < p->n_units; u++) {
    if (done[u]) continue;
    const mp_fsdp_unit *un = &p->units[u];
    int last = u;
    done[u] = 1;
    if (un->layer >= 0)
      for (int v = u + 1; v < p->n_units; v++) {
        if (done[v] || p->units[v].layer != p->units[last].layer + 1) continue;
        if (!same_unit(p, un, &p->units[v])) {
          if (p->units[v].layer > p->units[last].layer + 1) break;
          continue;
        }
        done[v] = 1;
        last = v;
      }
    char name[96], gb[32];
    const char *suffix = un->layer >= 0 ? strchr(un->name + 7, '.') : NULL;
    if (last != u)
      snprintf(name, sizeof name, "layers.%d-%d%s", un->layer, p->units[last].layer,
               suffix ? suffix : "");
    else
      snprintf(name, sizeof name, "%s", un->name);
    fmt_bytes((double)un->numel_tp * pb, gb, sizeof gb);
    printf("  %-32s %-6s %5d %7d %14lld %12s %14lld\n", name,
           un->group == MP_GROUP_EFSDP ? "efsdp" : "fsdp", mp_mesh_group_size(&p->mesh, un->group),
           un->n_params, (long long)un->numel_tp, gb, (long long)un->numel_shard);
  }
  free(done);
}

/* Megatron-LM's resident state on the rank (exec/schedule.c's prologue): the 16-bit
 * parameters and fp32 main gradients whole, the fp32 master weights and Adam m, v on the
 * rank's 1/d of them under the distributed optimizer (d: dp_replicate x cp), else whole. */
static void print_totals_megatron(const explain *e, const mp_plan_totals *t) {
  const mp_plan *p = e->plan;
  const int64_t n = t->params_numel;
  int64_t param_bytes, grad_bytes, opt_bytes, shard;
  mp_plan_ddp_state(p, n, &param_bytes, &grad_bytes, &opt_bytes, &shard);
  const int64_t d = p->opts.ddp.shard_optimizer ? mp_mesh_group_size(&p->mesh, mp_plan_ddp_group(p)) : 1;
  const int64_t pb = mp_dtype_bytes(p->opts.fsdp.param_dtype);
  char a[32], m[32], b[32], c[32], s[32];
  fmt_bytes((double)(n * pb), a, sizeof a);
  fmt_bytes((double)(param_bytes - n * pb), m, sizeof m);
  fmt_bytes((double)grad_bytes, b, sizeof b);
  fmt_bytes((double)opt_bytes, c, sizeof c);
  fmt_bytes((double)(param_bytes + grad_bytes + opt_bytes), s, sizeof s);
  printf("\nper-rank totals at rest (rank %d, Megatron-LM: %s parameters, fp32 main gradients, "
         "fp32 master weights and Adam state%s):\n",
         e->rank, mp_dtype_name(p->opts.fsdp.param_dtype),
         d > 1 ? " on the rank's shard (distributed optimizer)" : "");
  printf("  parameters        %lld elements, %s\n", (long long)n, a);
  if (d > 1)
    printf("  master weights    %lld elements (1/%lld), %s\n", (long long)shard, (long long)d, m);
  else
    printf("  master weights    %s\n", m);
  printf("  gradients         %s\n", b);
  printf("  optimizer (m, v)  %s\n", c);
  printf("  sum               %s\n", s);
}

static void print_totals(const explain *e) {
  mp_plan_totals t;
  mp_plan_rank_totals(e->plan, e->rank, &t);
  if (e->plan->opts.mem_model == MP_MEM_MODEL_MEGATRON) {
    print_totals_megatron(e, &t);
    return;
  }
  char a[32], b[32], c[32], d[32], s[32];
  fmt_bytes((double)t.param_bytes, a, sizeof a);
  fmt_bytes((double)t.grad_bytes, b, sizeof b);
  fmt_bytes((double)t.optimizer_bytes, c, sizeof c);
  fmt_bytes((double)t.max_unit_gathered_bytes, d, sizeof d);
  fmt_bytes((double)(t.param_bytes + t.grad_bytes + t.optimizer_bytes), s, sizeof s);
  printf("\nper-rank totals at rest (rank %d, %s master weights and AdamW state):\n", e->rank,
         mp_dtype_name(e->plan->opts.master_dtype));
  printf("  parameters        %lld elements, %s\n", (long long)t.params_numel, a);
  printf("  gradients         %s\n", b);
  printf("  optimizer (m, v)  %s\n", c);
  printf("  sum               %s\n", s);
  printf("  largest unit gathered  %s (%s)\n", d, mp_dtype_name(e->plan->opts.fsdp.param_dtype));
}

/* Cell size along one dim of length n: the gcd of n and every tile boundary on that dim
 * (so cells line up with the blocks), grown to keep at most max_cells cells, or split
 * (by a divisor, keeping the alignment) to show at least min_cells where n allows. */
static int64_t grid_step(const explain *e, const mp_param *prm, int dim, int64_t n, int min_cells,
                         int max_cells) {
  int64_t g = n;
  for (int r = 0; r < e->world && dim < prm->ndim; r++) {
    int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM];
    if (!mp_param_tile(e->plan, prm, r, off, len)) continue;
    g = mp_gcd64(g, off[dim]);
    g = mp_gcd64(g, off[dim] + len[dim]);
  }
  if (g < 1) g = 1;
  int64_t cells = n / g;
  if (cells > max_cells) return g * ((cells + max_cells - 1) / max_cells);
  int64_t k = (min_cells + cells - 1) / cells;
  while (k < g && g % k != 0) k++;
  return k >= g ? 1 : g / k;
}

static void print_tiles(const explain *e, const mp_param *prm) {
  const mp_plan *p = e->plan;
  /* Rows: dim 0; columns: dim 1 (1-D: one column; 3-D experts: dim 2 is never split). */
  const int64_t R = prm->shape[0], C = prm->ndim > 1 ? prm->shape[1] : 1;
  const int64_t rs = grid_step(e, prm, 0, R, 4, 16), cs = grid_step(e, prm, 1, C, 8, 32);
  const int nr = (int)((R + rs - 1) / rs), nc = (int)((C + cs - 1) / cs);
  char g[64], t[64];
  fmt_shape(prm->shape, prm->ndim, g, sizeof g);
  fmt_shape(prm->tp_shape, prm->ndim, t, sizeof t);
  printf("\ntiles of %s: global %s, after TP/EP %s; grid %d x %d cells of %lld x %lld%s\n",
         prm->fqn, g, t, nr, nc, (long long)rs, (long long)cs,
         prm->ndim == 3 ? " (rows: experts, columns: dim 1; dim 2 whole)" : "");
  printf("('#' stored, '+' partly stored, '.' not stored)\n");
  const int per_line = nc <= 12 ? 6 : nc <= 20 ? 4 : 3;
  const int width = nc > 20 ? nc : 20;
  for (int r0 = 0; r0 < e->world; r0 += per_line) {
    int r1 = r0 + per_line < e->world ? r0 + per_line : e->world;
    int64_t off[MP_MAX_NDIM][8], len[MP_MAX_NDIM][8];
    int has[8];
    for (int r = r0; r < r1; r++) {
      int64_t o[MP_MAX_NDIM], l[MP_MAX_NDIM];
      has[r - r0] = mp_param_tile(p, prm, r, o, l);
      for (int d = 0; d < MP_MAX_NDIM; d++) {
        off[d][r - r0] = o[d];
        len[d][r - r0] = l[d];
      }
    }
    printf("\n");
    for (int r = r0; r < r1; r++) {
      char lab[64];
      snprintf(lab, sizeof lab, "rank %d", r);
      printf("  %-*s", width + 2, lab);
    }
    printf("\n");
    for (int r = r0; r < r1; r++) {
      char lab[64];
      int k = r - r0;
      if (!has[k]) snprintf(lab, sizeof lab, "(nothing)");
      else if (prm->ndim > 1)
        snprintf(lab, sizeof lab, "r%lld+%lld c%lld+%lld", (long long)off[0][k], (long long)len[0][k],
                 (long long)off[1][k], (long long)len[1][k]);
      else snprintf(lab, sizeof lab, "r%lld+%lld", (long long)off[0][k], (long long)len[0][k]);
      printf("  %-*s", width + 2, lab);
    }
    printf("\n");
    for (int i = 0; i < nr; i++) {
      const int64_t ra = (int64_t)i * rs, rb = ra + rs < R ? ra + rs : R;
      for (int r = r0; r < r1; r++) {
        int k = r - r0;
        char line[80];
        for (int j = 0; j < nc; j++) {
          const int64_t ca = (int64_t)j * cs, cb = ca + cs < C ? ca + cs : C;
          char ch = '.';
          if (has[k]) {
            int64_t r_lo = off[0][k], r_hi = off[0][k] + len[0][k];
            int64_t c_lo = prm->ndim > 1 ? off[1][k] : 0, c_hi = prm->ndim > 1 ? off[1][k] + len[1][k] : 1;
            int64_t ir = (rb < r_hi ? rb : r_hi) - (ra > r_lo ? ra : r_lo);
            int64_t ic = (cb < c_hi ? cb : c_hi) - (ca > c_lo ? ca : c_lo);
            if (ir > 0 && ic > 0) ch = (ir == rb - ra && ic == cb - ca) ? '#' : '+';
          }
          line[j] = ch;
        }
        line[nc] = 0;
        printf("  %-*s", width + 2, line);
      }
      printf("\n");
    }
  }
}

/* ---- schedule ------------------------------------------------------------------- */

/* The cluster the durations are predicted on: --cluster or --gpus (mp_cmd_load_cluster),
 * else the mesh's world of h100-sxm GPUs, 8 per node. */
static mp_status explain_cluster(mp_ctx *ctx, const explain *e, mp_cluster *c) {
  if (mp_args_has(&k_spec, "--cluster") || mp_args_has(&k_spec, "--gpus") || mp_args_has(&k_spec, "--gpu") ||
      mp_args_has(&k_spec, "--gpus-per-node") || mp_args_has(&k_spec, "--inter-gbps"))
    return mp_cmd_load_cluster(ctx, &k_spec, c);
  return mp_cluster_make(ctx, "h100-sxm", e->world, e->world < 8 ? e->world : 8, c);
}

/* The cluster explain predicts on and the stack: --stack, else the GPU's default. */
static mp_status explain_stack(mp_ctx *ctx, const explain *e, mp_cluster *c, mp_stack_profile *prof) {
  MP_CHECK(explain_cluster(ctx, e, c));
  const char *stack = mp_args_get(&k_spec, "--stack");
  if (stack) return mp_stack_load(ctx, stack, prof);
  return mp_stack_default(ctx, &c->gpu, prof);
}

/* The rank's expanded schedule, simulated with its trace: each op's predicted duration
 * (e->dur) and the step's busy time by class (e->busy); the cost figures are the stack's on
 * the cluster's GPU. */
static mp_status build_schedule(mp_ctx *ctx, explain *e, mp_arena **arena, mp_schedule **s) {
  *arena = mp_arena_create();
  if (*arena == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the schedule");
  MP_CHECK(mp_schedule_build(ctx, e->plan, e->rank, MP_SCHEDULE_EXPANDED, *arena, s));
  const mp_cluster *c = &e->cluster;
  const mp_stack_profile *prof = &e->prof;
  if (mp_mesh_world(&e->plan->mesh) > mp_cluster_n_gpus(c))
    return mp_error(ctx, MP_ERR_USAGE, "the mesh has %d ranks and cluster %s %d GPUs; give --gpus %d or a larger "
                    "--cluster", mp_mesh_world(&e->plan->mesh), c->name, mp_cluster_n_gpus(c),
                    mp_mesh_world(&e->plan->mesh));
  mp_sim_config cfg;
  memset(&cfg, 0, sizeof cfg);
  cfg.cluster = c;
  cfg.stack = prof;
  cfg.mem_headroom = 0.05;
  cfg.record_trace = 1;
  mp_sim_trace *t = NULL;
  MP_CHECK(mp_simulate(ctx, *s, &cfg, &e->res, &t));
  e->dur = mp_arena_alloc(*arena, (size_t)((*s)->n_ops > 0 ? (*s)->n_ops : 1) * sizeof *e->dur);
  if (e->dur == NULL) {
    mp_sim_trace_destroy(t);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the schedule's durations");
  }
  mp_sim_trace_op_durations(t, e->dur, (*s)->n_ops);
  mp_sim_trace_busy(t, &e->busy);
  mp_sim_trace_destroy(t);
  snprintf(e->predicted_on, sizeof e->predicted_on, "%d x %s, stack %s", mp_cluster_n_gpus(c), c->gpu.name,
           prof->name);
  mp_stack_kernel_scale_format(prof, &c->gpu, e->kernels, sizeof e->kernels);
  e->kernels_json = mp_cmd_kernel_scale_json(prof, &c->gpu);
  return MP_OK;
}

/* "1.234 ms", "56.7 us", "2.31 s": a duration in the unit that keeps three figures. */
static void fmt_time(double s, char *buf, size_t cap) {
  if (s < 0) snprintf(buf, cap, "-");
  else if (s == 0) snprintf(buf, cap, "0");
  else if (s < 1e-3) snprintf(buf, cap, "%.1f us", s * 1e6);
  else if (s < 1.0) snprintf(buf, cap, "%.3f ms", s * 1e3);
  else snprintf(buf, cap, "%.3f s", s);
}

/* --summary: the predicted step and where its time goes, by kernel class and collective
 * group, largest first. */
static void print_summary(const explain *e) {
  const mp_sim_result *r = &e->res;
  char a[32], b[32], c[32];
  fmt_time(r->step_time_s, a, sizeof a);
  fmt_time(r->compute_s, b, sizeof b);
  fmt_time(r->exposed_comm_s, c, sizeof c);
  printf("\npredicted step of rank %d on %s: %s (compute %s, exposed communication %s), %.0f tokens/s per GPU, "
         "MFU %.1f %%\n", e->rank, e->predicted_on, a, b, c, r->tokens_per_s_per_gpu, 100.0 * r->mfu);
  printf("  kernels: %s\n", e->kernels);
  typedef struct { const char *what; double s; int64_t n; } line;
  line ls[MP_KERNEL_COUNT + MP_GROUP_COUNT];
  int n = 0;
  double total = 0;
  for (int k = 0; k < MP_KERNEL_COUNT; k++)
    if (e->busy.kernel_n[k]) {
      ls[n++] = (line){mp_kernel_name((mp_kernel)k), e->busy.kernel_s[k], e->busy.kernel_n[k]};
      total += e->busy.kernel_s[k];
    }
  const int first_comm = n;
  for (int g = 0; g < MP_GROUP_COUNT; g++)
    if (e->busy.comm_n[g]) ls[n++] = (line){mp_group_name((mp_group)g), e->busy.comm_s[g], e->busy.comm_n[g]};
  for (int i = 1; i < n; i++) /* largest first within kernels and within collectives */
    for (int j = i; j > 0 && (j != first_comm) && ls[j].s > ls[j - 1].s; j--) {
      line t = ls[j];
      ls[j] = ls[j - 1];
      ls[j - 1] = t;
    }
  printf("  %-22s %8s %12s %7s\n", "kernel class", "ops", "busy", "share");
  for (int i = 0; i < n; i++) {
    if (i == first_comm)
      printf("  %-22s %8s %12s %7s\n", "collectives over", "ops", "busy", "(overlap: on their own streams)");
    fmt_time(ls[i].s, a, sizeof a);
    if (i < first_comm)
      printf("  %-22s %8lld %12s %6.1f%%\n", ls[i].what, (long long)ls[i].n, a, total > 0 ? 100.0 * ls[i].s / total : 0.0);
    else
      printf("  %-22s %8lld %12s\n", ls[i].what, (long long)ls[i].n, a);
  }
}

static void print_schedule(const explain *e, const mp_schedule *s) {
  printf("\nstep schedule of rank %d (stage %d): %lld micro-batches of %lld x %lld tokens; one micro-batch's "
         "ops with the prologue and optimizer, durations predicted on %s\n",
         s->rank, s->pp_stage, (long long)s->n_micro, (long long)s->micro_batch, (long long)s->seq,
         e->predicted_on);
  printf("  kernels: %s\n", e->kernels);
  printf("  %6s %-9s %-7s %-10s %10s  %-44s %s\n", "#", "phase", "stream", "op", "predicted", "name", "details");
  mp_schedule_iter it;
  mp_schedule_iter_begin(s, &it);
  while (mp_schedule_iter_next(&it)) {
    const mp_op *op = it.op;
    char name[160], det[200], b[32];
    mp_op_name(s, op, it.layer, name, sizeof name);
    const char *kind = "";
    switch (op->type) {
      case MP_OP_COMPUTE:
        kind = mp_kernel_name((mp_kernel)op->kernel);
        if (op->kernel == MP_KERNEL_GEMM)
          snprintf(det, sizeof det, "%s m=%lld n=%lld k=%lld%s, %.3g FLOP, %s",
                   op->variant == MP_VAR_FWD ? "fwd" : op->variant == MP_VAR_DGRAD ? "dgrad" : "wgrad",
                   (long long)op->m, (long long)op->n, (long long)op->k,
                   op->batch > 1 ? " (batched)" : "", op->flops, mp_dtype_name((mp_dtype)op->dtype));
        else
          snprintf(det, sizeof det, "%lld elems, %.3g FLOP, %.3g bytes", (long long)op->m,
                   op->flops, op->bytes);
        break;
      case MP_OP_COMM:
        kind = mp_coll_name((mp_coll)op->coll);
        fmt_bytes(op->bytes, b, sizeof b);
        snprintf(det, sizeof det, "over %s (%d ranks), %s payload", mp_group_name((mp_group)op->group),
                 mp_mesh_group_size(&s->plan->mesh, (mp_group)op->group), b);
        break;
      case MP_OP_ALLOC:
      case MP_OP_FREE:
        kind = op->type == MP_OP_ALLOC ? "alloc" : "free";
        fmt_bytes((double)op->mem_bytes, b, sizeof b);
        snprintf(det, sizeof det, "%s %s", mp_mem_cat_name((mp_mem_cat)op->mem_cat), b);
        break;
    }
    char d[32];
    fmt_time(e->dur ? e->dur[op - s->ops] : -1.0, d, sizeof d);
    printf("  %6lld %-9s %-7s %-10s %10s  %-44s %s\n", (long long)it.index,
           mp_phase_name((mp_phase)op->phase), mp_stream_name((mp_stream)op->stream), kind, d, name,
           det);
  }
}

static cJSON *schedule_json(const explain *e, const mp_schedule *s) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "predicted_on", e->predicted_on);
  if (e->kernels_json) cJSON_AddItemReferenceToObject(o, "kernels", e->kernels_json);
  cJSON_AddNumberToObject(o, "predicted_step_s", e->res.step_time_s);
  cJSON_AddNumberToObject(o, "rank", s->rank);
  cJSON_AddNumberToObject(o, "pp_stage", s->pp_stage);
  cJSON_AddNumberToObject(o, "n_micro", (double)s->n_micro);
  cJSON_AddNumberToObject(o, "micro_batch", (double)s->micro_batch);
  cJSON_AddNumberToObject(o, "seq", (double)s->seq);
  cJSON *ops = cJSON_AddArrayToObject(o, "ops");
  mp_schedule_iter it;
  mp_schedule_iter_begin(s, &it);
  while (mp_schedule_iter_next(&it)) {
    const mp_op *op = it.op;
    cJSON *j = cJSON_CreateObject();
    char name[160];
    mp_op_name(s, op, it.layer, name, sizeof name);
    cJSON_AddNumberToObject(j, "index", (double)it.index);
    cJSON_AddStringToObject(j, "phase", mp_phase_name((mp_phase)op->phase));
    cJSON_AddStringToObject(j, "stream", mp_stream_name((mp_stream)op->stream));
    cJSON_AddStringToObject(j, "name", name);
    cJSON_AddNumberToObject(j, "layer", it.layer);
    if (e->dur) cJSON_AddNumberToObject(j, "predicted_s", e->dur[op - s->ops]);
    switch (op->type) {
      case MP_OP_COMPUTE:
        cJSON_AddStringToObject(j, "type", "compute");
        cJSON_AddStringToObject(j, "kernel", mp_kernel_name((mp_kernel)op->kernel));
        cJSON_AddNumberToObject(j, "m", (double)op->m);
        cJSON_AddNumberToObject(j, "n", (double)op->n);
        cJSON_AddNumberToObject(j, "k", (double)op->k);
        cJSON_AddNumberToObject(j, "batch", (double)op->batch);
        cJSON_AddNumberToObject(j, "flops", op->flops);
        cJSON_AddNumberToObject(j, "bytes", op->bytes);
        cJSON_AddStringToObject(j, "dtype", mp_dtype_name((mp_dtype)op->dtype));
        break;
      case MP_OP_COMM:
        cJSON_AddStringToObject(j, "type", "comm");
        cJSON_AddStringToObject(j, "coll", mp_coll_name((mp_coll)op->coll));
        cJSON_AddStringToObject(j, "group", mp_group_name((mp_group)op->group));
        cJSON_AddNumberToObject(j, "bytes", op->bytes);
        break;
      default:
        cJSON_AddStringToObject(j, "type", op->type == MP_OP_ALLOC ? "alloc" : "free");
        cJSON_AddStringToObject(j, "category", mp_mem_cat_name((mp_mem_cat)op->mem_cat));
        cJSON_AddNumberToObject(j, "bytes", (double)op->mem_bytes);
        break;
    }
    cJSON_AddItemToArray(ops, j);
  }
  return o;
}

/* ---- JSON --------------------------------------------------------------------------- */

static cJSON *shape_json(const int64_t *s, int ndim) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < ndim; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)s[i]));
  return a;
}

static cJSON *plan_json(const explain *e) {
  const mp_plan *p = e->plan;
  cJSON *root = cJSON_CreateObject();
  char mesh_s[128], buf[64];
  mp_mesh_format(&p->mesh, mesh_s, sizeof mesh_s);
  cJSON_AddStringToObject(root, "model", p->model.name);
  cJSON_AddNumberToObject(root, "model_params", (double)mp_model_param_count(&p->model));
  cJSON_AddNumberToObject(root, "model_active_params", (double)mp_model_active_param_count(&p->model));
  cJSON_AddNumberToObject(root, "model_active_params_without_lookup",
                          (double)mp_model_matmul_param_count(&p->model));
  cJSON_AddStringToObject(root, "mesh", mesh_s);
  cJSON_AddNumberToObject(root, "world", e->world);
  cJSON_AddNumberToObject(root, "rank", e->rank);
  cJSON_AddNumberToObject(root, "seq", (double)p->opts.seq);
  cJSON_AddNumberToObject(root, "micro_batch", (double)p->opts.micro_batch);
  cJSON_AddNumberToObject(root, "global_batch", (double)p->opts.global_batch);
  cJSON_AddNumberToObject(root, "local_batch", (double)e->local_batch);
  cJSON_AddNumberToObject(root, "n_micro", (double)e->n_micro);
  cJSON_AddNumberToObject(root, "vocab_padded", (double)p->vocab_padded);
  cJSON_AddStringToObject(root, "ac", mp_ac_mode_name(p->ac));
  cJSON_AddBoolToObject(root, "fp8", p->opts.fp8 != 0);
  cJSON_AddBoolToObject(root, "shard_logits", p->opts.tp.shard_logits != 0);
  cJSON *passes = cJSON_AddArrayToObject(root, "passes");
  for (int i = 0; i < p->n_passes; i++) {
    const char *name = mp_pass_name((unsigned)p->pass_order[i]);
    size_t nl = strlen(name);
    cJSON *ps = cJSON_CreateObject();
    cJSON_AddStringToObject(ps, "name", name);
    cJSON *notes = cJSON_AddArrayToObject(ps, "notes");
    for (int k = 0; k < p->n_notes; k++)
      if (strncmp(p->notes[k], name, nl) == 0 && p->notes[k][nl] == ':')
        cJSON_AddItemToArray(notes, cJSON_CreateString(p->notes[k] + nl + 2));
    cJSON_AddItemToArray(passes, ps);
  }
  char cpn[1024];
  cp_note(p, cpn, sizeof cpn);
  if (cpn[0]) cJSON_AddStringToObject(root, "context_parallel", cpn);
  if (e->pp_note[0]) {
    const mp_plan *q = e->plan;
    cJSON *pl = cJSON_AddObjectToObject(root, "pipeline");
    cJSON_AddStringToObject(pl, "schedule", mp_pp_schedule_name(q->opts.pp_schedule));
    cJSON_AddNumberToObject(pl, "pp_virtual", mp_plan_virtual_stages(q));
    cJSON_AddStringToObject(pl, "order", e->pp_flavor == MP_PP_FLAVOR_TORCH ? "torch" : "megatron");
    cJSON_AddNumberToObject(pl, "n_micro", (double)e->n_micro);
    cJSON *cl = cJSON_AddArrayToObject(pl, "chunk_layers");
    for (int k = 0; k < e->pp_chunks; k++) cJSON_AddItemToArray(cl, cJSON_CreateNumber(e->pp_chunk_layers[k]));
    cJSON_AddNumberToObject(pl, "stage", mp_plan_rank_stage(q, e->rank));
    cJSON_AddNumberToObject(pl, "warmup_forwards", e->pp_warmup);
    cJSON_AddNumberToObject(pl, "max_chunks_in_flight", (double)e->pp_inflight);
    cJSON_AddNumberToObject(pl, "bubble_fraction", e->pp_bubble);
    cJSON_AddNumberToObject(pl, "boundary_bytes", e->pp_send_bytes);
    cJSON_AddStringToObject(pl, "note", e->pp_note);
    if (e->mb_rule[0]) cJSON_AddStringToObject(pl, "micro_batches", e->mb_rule);
  }
  cJSON *params = cJSON_AddArrayToObject(root, "params");
  const int mb = mp_dtype_bytes(p->opts.master_dtype);
  const char *axes[MP_AXIS_COUNT] = {"dp_replicate", "fsdp", "ep", "tp"};
  for (int i = 0; i < p->n_params; i++) {
    const mp_param *prm = &p->params[i];
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "fqn", prm->fqn);
    cJSON_AddStringToObject(j, "module", mp_module_name(prm->module));
    cJSON_AddNumberToObject(j, "layer", prm->layer);
    cJSON_AddItemToObject(j, "global", shape_json(prm->shape, prm->ndim));
    cJSON_AddItemToObject(j, "after_tp", shape_json(prm->tp_shape, prm->ndim));
    int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM];
    if (mp_param_tile(p, prm, e->rank, off, len)) {
      cJSON_AddItemToObject(j, "at_rest", shape_json(len, prm->ndim));
      cJSON_AddItemToObject(j, "offset", shape_json(off, prm->ndim));
    } else {
      cJSON_AddNullToObject(j, "at_rest");
      cJSON_AddNullToObject(j, "offset");
    }
    cJSON_AddNumberToObject(j, "bytes", (double)(mp_param_local_numel(p, prm, e->rank) * mb));
    cJSON_AddStringToObject(j, "tp_style", mp_tp_style_name(prm->tp_style));
    cJSON *pl = cJSON_AddObjectToObject(j, "placements");
    for (int a = 0; a < MP_AXIS_COUNT; a++) {
      fmt_place(&prm->place[a], buf, sizeof buf);
      cJSON_AddStringToObject(pl, axes[a], buf);
    }
    cJSON_AddBoolToObject(j, "float8", prm->float8 != 0);
    cJSON_AddNumberToObject(j, "fsdp_unit", prm->fsdp_unit);
    cJSON_AddStringToObject(j, "fsdp_group", mp_group_name(prm->fsdp_group));
    cJSON_AddNumberToObject(j, "pp_stage", prm->pp_stage);
    cJSON_AddItemToArray(params, j);
  }
  cJSON *units = cJSON_AddArrayToObject(root, "units");
  for (int u = 0; u < p->n_units; u++) {
    const mp_fsdp_unit *un = &p->units[u];
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "name", un->name);
    cJSON_AddNumberToObject(j, "layer", un->layer);
    cJSON_AddStringToObject(j, "group", mp_group_name(un->group));
    cJSON_AddNumberToObject(j, "group_size", mp_mesh_group_size(&p->mesh, un->group));
    cJSON_AddNumberToObject(j, "numel_tp", (double)un->numel_tp);
    cJSON_AddNumberToObject(j, "numel_shard", (double)un->numel_shard);
    cJSON *ps = cJSON_AddArrayToObject(j, "params");
    for (int k = 0; k < un->n_params; k++)
      cJSON_AddItemToArray(ps, cJSON_CreateString(p->params[un->params[k]].fqn));
    cJSON_AddItemToArray(units, j);
  }
  mp_plan_totals t;
  mp_plan_rank_totals(p, e->rank, &t);
  cJSON *tj = cJSON_AddObjectToObject(root, "totals");
  cJSON_AddNumberToObject(tj, "params_numel", (double)t.params_numel);
  cJSON_AddNumberToObject(tj, "param_bytes", (double)t.param_bytes);
  cJSON_AddNumberToObject(tj, "grad_bytes", (double)t.grad_bytes);
  cJSON_AddNumberToObject(tj, "optimizer_bytes", (double)t.optimizer_bytes);
  cJSON_AddNumberToObject(tj, "max_unit_gathered_bytes", (double)t.max_unit_gathered_bytes);
  return root;
}

static cJSON *tiles_json(const explain *e, const mp_param *prm) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "fqn", prm->fqn);
  cJSON_AddItemToObject(o, "global", shape_json(prm->shape, prm->ndim));
  cJSON *tiles = cJSON_AddArrayToObject(o, "tiles");
  for (int r = 0; r < e->world; r++) {
    int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM];
    cJSON *t = cJSON_CreateObject();
    cJSON_AddNumberToObject(t, "rank", r);
    if (mp_param_tile(e->plan, prm, r, off, len)) {
      cJSON_AddItemToObject(t, "offset", shape_json(off, prm->ndim));
      cJSON_AddItemToObject(t, "length", shape_json(len, prm->ndim));
    } else {
      cJSON_AddNullToObject(t, "offset");
      cJSON_AddNullToObject(t, "length");
    }
    cJSON_AddItemToArray(tiles, t);
  }
  return o;
}

/* ---- the command ----------------------------------------------------------------- */

static mp_status parse_options(mp_ctx *ctx, mp_model *m, mp_mesh *mesh, mp_plan_options *o,
                               explain *e) {
  MP_CHECK(mp_cmd_load_model(ctx, &k_spec, "llama3.1-8b", m));
  const char *ms = mp_args_get(&k_spec, "--mesh");
  MP_CHECK(mp_mesh_parse(ctx, ms ? ms : "dp_shard=8", 0, mesh));
  MP_CHECK(mp_cmd_mesh_ep(ctx, &k_spec, mesh));
  mp_plan_options_init(o);
  MP_CHECK(mp_cmd_plan_options(ctx, &k_spec, o));
  MP_CHECK(mp_cmd_pp_schedule(ctx, &k_spec, o));
  e->world = mp_mesh_world(mesh);
  /* the plan the stack runs, as simulate builds it: its memory model, attention, loss, SP
   * and context-parallel ring */
  MP_CHECK(explain_stack(ctx, e, &e->cluster, &e->prof));
  if (o->sp == 1 && !e->prof.sp)
    return mp_error(ctx, MP_ERR_USAGE, "--sp: stack %s does not run sequence parallelism",
                    e->prof.name);
  mp_stack_plan_options(&e->prof, o);
  MP_CHECK(mp_cmd_cp_rotate(ctx, &k_spec, &e->prof, o));
  MP_CHECK(mp_cmd_async_tp(ctx, &k_spec, &e->prof, o));
  const int64_t seq = o->seq > 0 ? o->seq : (m->max_seq < 8192 ? m->max_seq : 8192);
  MP_CHECK(mp_cmd_check_seq(ctx, &k_spec, m, seq));
  MP_CHECK(mp_cmd_batch_tokens(ctx, &k_spec, seq, &o->global_batch));
  if (o->global_batch == 0) {
    char rule[400];
    mp_cmd_default_batch(m, mesh, seq, o->micro_batch, &o->global_batch, rule, sizeof rule);
  }
  o->tp.pad_vocab = mp_args_has(&k_spec, "--pad-vocab");
  long long rank = 0;
  MP_CHECK(mp_args_int(ctx, &k_spec, "--rank", 0, MP_MESH_MAX_WORLD - 1, &rank));
  if (rank >= e->world)
    return mp_error(ctx, MP_ERR_USAGE, "--rank %lld is outside the mesh's %d ranks "
                    "(0..%d)", rank, e->world, e->world - 1);
  e->rank = (int)rank;
  e->param_fqn = mp_args_get(&k_spec, "--param");
  e->schedule = mp_args_has(&k_spec, "--schedule");
  e->summary = mp_args_has(&k_spec, "--summary");
  e->json = mp_args_has(&k_spec, "--json");
  return MP_OK;
}

/* The plan's notes that no pass line above already shows. */
static void print_other_notes(const mp_plan *p) {
  for (int k = 0; k < p->n_notes; k++) {
    const char *n = p->notes[k];
    int pass_note = 0;
    for (unsigned b = MP_PASS_TP; b <= MP_PASS_FSDP; b <<= 1) {
      size_t nl = strlen(mp_pass_name(b));
      pass_note |= strncmp(n, mp_pass_name(b), nl) == 0 && n[nl] == ':';
    }
    if (!pass_note) printf("  note: %s\n", n);
  }
}

static void print_json(const explain *e, const mp_param *prm, const mp_schedule *sched) {
  cJSON *root = plan_json(e);
  if (prm) cJSON_AddItemToObject(root, "param", tiles_json(e, prm));
  if (sched) cJSON_AddItemToObject(root, "schedule", schedule_json(e, sched));
  mp_cmd_print_json(root);
}

static void print_text(const explain *e, const mp_param *prm, const mp_schedule *sched) {
  print_header(e);
  print_passes(e->plan);
  print_cp(e->plan);
  print_pipeline(e);
  print_other_notes(e->plan);
  print_params(e);
  print_units(e);
  print_totals(e);
  if (prm) print_tiles(e, prm);
  if (sched && e->schedule) print_schedule(e, sched);
  if (sched && e->summary) print_summary(e);
}

/* --param's parameter into *out (NULL without --param). */
static mp_status find_param(mp_ctx *ctx, const explain *e, const mp_model *m, const mp_param **out) {
  *out = NULL;
  if (!e->param_fqn) return MP_OK;
  int i = mp_plan_find_param(e->plan, e->param_fqn);
  if (i < 0)
    return mp_error(ctx, MP_ERR_NOT_FOUND,
                    "no parameter '%s' in %s; names look like layers.0.mlp.up_proj.weight (see "
                    "the table of meshplan explain without --param)",
                    e->param_fqn, m->name);
  *out = &e->plan->params[i];
  return MP_OK;
}

static int run_explain(mp_ctx *ctx, const mp_cmd_call *call) {
  (void)call;
  mp_model m;
  mp_mesh mesh;
  mp_plan_options o;
  explain e;
  memset(&e, 0, sizeof e);
  const mp_param *prm = NULL;
  mp_arena *sarena = NULL;
  mp_schedule *sched = NULL;
  mp_status st = parse_options(ctx, &m, &mesh, &o, &e);
  if (st != MP_OK) return mp_cmd_fail(ctx, st);
  if (mesh.size[MP_DIM_PP] > 1) /* the stack's pipeline order and micro-batching */
    mp_cmd_stack_micro_batch(&k_spec, &e.prof, &mesh, &o, e.mb_rule, sizeof e.mb_rule);
  st = mp_build_plan(ctx, &m, &mesh, &o, &e.plan);
  if (st != MP_OK) return mp_cmd_fail(ctx, st);
  MP_CHECK_GOTO(find_param(ctx, &e, &m, &prm), st, out);
  MP_CHECK_GOTO(mp_plan_batch(ctx, e.plan, &e.local_batch, &e.n_micro), st, out);
  if (mesh.size[MP_DIM_PP] > 1) MP_CHECK_GOTO(pipeline_facts(ctx, &e, &e.prof), st, out);
  if (e.schedule || e.summary) MP_CHECK_GOTO(build_schedule(ctx, &e, &sarena, &sched), st, out);
  if (e.json)
    print_json(&e, prm, sched);
  else
    print_text(&e, prm, sched);
out:
  cJSON_Delete(e.kernels_json);
  mp_arena_destroy(sarena);
  mp_plan_destroy(e.plan);
  return st != MP_OK ? mp_cmd_fail(ctx, st) : 0;
}

const mp_command mp_command_explain = {&k_spec, "show the sharding passes, parameter shapes and schedule of one plan",
                                       run_explain};
