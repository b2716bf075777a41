/* meshplan explain's report as text (explain.h): the header (model, mesh, the rank's
 * coordinates, batch), the passes and what each changed, the context-parallel and pipeline
 * sections, a per-parameter table (global shape, after TP/EP, at rest on the rank, bytes at
 * rest in the master dtype), the FSDP units, the per-rank totals; --param's tile diagram
 * (one character grid per rank: '#' rows/columns the rank stores, '+' a cell it stores
 * part of, '.' nothing); --schedule's step schedule and --summary's busy time by class.
 *
 * Tables collapse consecutive layers whose rows are identical ("layers.0-31.mlp.
 * up_proj.weight"); the JSON (explain_json.c) lists every parameter. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/intmath.h"
#include "app/explain.h"

/* ---- formatting helpers ----------------------------------------------------------- */

static void fmt_shape(const int64_t *s, int ndim, char *buf, size_t cap) {
  size_t used = (size_t)snprintf(buf, cap, "[");
  for (int i = 0; i < ndim && used < cap; i++)
    used += (size_t)snprintf(buf + used, cap - used, "%s%lld", i ? ", " : "", (long long)s[i]);
  if (used < cap) snprintf(buf + used, cap - used, "]");
}

void mp_explain_fmt_bytes(double b, char *buf, size_t cap) {
  const char *u[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (b >= 1024.0 && i < 4) {
    b /= 1024.0;
    i++;
  }
  if (i == 0) snprintf(buf, cap, "%.0f B", b);
  else snprintf(buf, cap, "%.2f %s", b, u[i]);
}

/* "tp:col fsdp:S0 ep:S0" (only the axes that shard). */
static void fmt_placements(const mp_param *prm, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = 0;
  if (prm->tp_style != MP_TP_NONE)
    used += (size_t)snprintf(buf + used, cap - used, "tp:%s ", mp_tp_style_name(prm->tp_style));
  if (prm->place[MP_AXIS_EP].kind == MP_PLACEMENT_SHARD && used < cap)
    used += (size_t)snprintf(buf + used, cap - used, "ep:S(0) ");
  if (prm->is_expert && prm->place[MP_AXIS_TP].kind == MP_PLACEMENT_SHARD && used < cap) /* exec/pass_ep.c */
    used += (size_t)snprintf(buf + used, cap - used, "etp:S(%d) ", prm->place[MP_AXIS_TP].dim);
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

/* ---- the header, passes and notes ------------------------------------------------- */

/* The rank's distributed-optimizer instance (the mesh's dopt), its place in the instance's
 * dense group and, with the routed experts reduced apart, in the instance's slice of their
 * expert-DP group (exec/mesh.h's MP_GROUP_DOPT and MP_GROUP_EDOPT). */
static void print_instance(const explain *e) {
  const mp_plan *p = e->plan;
  const mp_mesh *m = &p->mesh;
  if (mp_mesh_dopt(m) <= 1) return;
  printf("      distributed-optimizer instance %d of %d: rank %d of its %d dense ranks",
         mp_mesh_group_index(m, MP_GROUP_DOPT_INTER, e->rank), mp_mesh_dopt(m),
         mp_mesh_group_index(m, MP_GROUP_DOPT, e->rank), mp_mesh_group_size(m, MP_GROUP_DOPT));
  if (mp_plan_ddp_experts_apart(p))
    printf(", %d of the %d of its expert-DP group's %d in it", mp_mesh_group_index(m, MP_GROUP_EDOPT, e->rank),
           mp_mesh_group_size(m, MP_GROUP_EDOPT), mp_mesh_group_size(m, MP_GROUP_EDP));
  printf("\n");
}

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
  if (p->model.mtp_layers > 0) /* outside the published totals, as DeepSeek-V3 counts them */
    printf("      + %.2fB in %lld multi-token-prediction module(s) (layers %lld..%lld, the last stage)\n",
           (double)mp_model_mtp_params(&p->model) / 1e9, (long long)p->model.mtp_layers,
           (long long)p->model.n_layers, (long long)mp_model_n_blocks(&p->model) - 1);
  printf("mesh  %s: %d ranks; rank %d is pp %d, dp_replicate %d, dp_shard %d (ep %d, efsdp %d), "
         "cp %d, tp %d",
         mesh_s, e->world, e->rank, c[MP_DIM_PP], c[MP_DIM_DP_REPLICATE], c[MP_DIM_DP_SHARD],
         mp_mesh_ep_index(&p->mesh, e->rank), mp_mesh_efsdp_index(&p->mesh, e->rank), c[MP_DIM_CP],
         c[MP_DIM_TP]);
  if (p->mesh.etp > 1) /* its place in the expert grid [edp, ep, etp] */
    printf(" (etp %d, expert-DP %d of %d)", mp_mesh_group_index(&p->mesh, MP_GROUP_ETP, e->rank),
           mp_mesh_group_index(&p->mesh, MP_GROUP_EDP, e->rank), mp_mesh_group_size(&p->mesh, MP_GROUP_EDP));
  printf("\n");
  print_instance(e);
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

static void print_pipeline(const explain *e) {
  if (e->pp_note[0]) printf("\npipeline\n  %s\n", e->pp_note);
  if (e->mb_rule[0]) printf("  micro-batches: %s\n", e->mb_rule);
}

static void print_moe(const explain *e) {
  char note[1536];
  mp_explain_moe f;
  if (mp_explain_moe_note(e, &f, note, sizeof note)) printf("\nrouted experts\n  %s\n", note);
}

static void print_cp(const mp_plan *p) {
  char note[1024];
  mp_explain_cp_note(p, note, sizeof note);
  if (note[0]) printf("\ncontext parallel\n  %s\n", note);
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

/* ---- parameters, units and totals ------------------------------------------------- */

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
    mp_explain_fmt_bytes((double)numel * mb, b, sizeof b);
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
    mp_explain_fmt_bytes((double)un->numel_tp * pb, gb, sizeof gb);
    printf("  %-32s %-6s %5d %7d %14lld %12s %14lld\n", name,
           un->group == MP_GROUP_EFSDP ? "efsdp" : "fsdp", mp_mesh_group_size(&p->mesh, un->group),
           un->n_params, (long long)un->numel_tp, gb, (long long)un->numel_shard);
  }
  free(done);
}

/* The rank's routed-expert elements DDP reduces over their own expert-DP group
 * (mp_plan_ddp_experts_apart), 0 where it does not. */
static int64_t rank_expert_numel(const explain *e) {
  const mp_plan *p = e->plan;
  int64_t n = 0;
  if (!mp_plan_ddp_experts_apart(p)) return 0;
  for (int i = 0; i < p->n_params; i++)
    if (p->params[i].is_expert) n += mp_param_local_numel(p, &p->params[i], e->rank);
  return n;
}

/* Megatron-LM's resident state on the rank (exec/schedule.c's prologue): the 16-bit
 * parameters and the main gradients (fp32, bf16 with --grad-reduce-in-bf16) whole, the fp32
 * master weights and Adam m, v on the rank's 1/d of them under the distributed optimizer (d:
 * dp_replicate x cp, or one instance's part; the routed experts' over their expert-DP group,
 * or its instance slice: mp_plan_ddp_expert_state), else whole. */
static void print_totals_megatron(const explain *e, const mp_plan_totals *t) {
  const mp_plan *p = e->plan;
  const int64_t n = t->params_numel, ne = rank_expert_numel(e);
  int64_t param_bytes, grad_bytes, opt_bytes, shard, pb_e = 0, gb_e = 0, ob_e = 0, sh_e = 0;
  mp_plan_ddp_state(p, n - ne, &param_bytes, &grad_bytes, &opt_bytes, &shard);
  if (ne > 0) mp_plan_ddp_expert_state(p, ne, &pb_e, &gb_e, &ob_e, &sh_e);
  param_bytes += pb_e, grad_bytes += gb_e, opt_bytes += ob_e;
  /* Megatron FSDP's n is already the rank's shard (over dp_shard x cp; its hybrid
   * sharding's instances, dp_replicate, hold copies of it) */
  const int sharded = p->opts.ddp.shard_optimizer && !mp_plan_is_megatron_fsdp(p);
  const int64_t d = sharded ? mp_mesh_group_size(&p->mesh, mp_plan_ddp_group(p)) : 1,
                de = sharded ? mp_mesh_group_size(&p->mesh, mp_plan_ddp_expert_group(p)) : 1;
  const int64_t pb = mp_dtype_bytes(p->opts.fsdp.param_dtype);
  char a[32], m[32], b[32], c[32], s[32];
  mp_explain_fmt_bytes((double)(n * pb), a, sizeof a);
  mp_explain_fmt_bytes((double)(param_bytes - n * pb), m, sizeof m);
  mp_explain_fmt_bytes((double)grad_bytes, b, sizeof b);
  mp_explain_fmt_bytes((double)opt_bytes, c, sizeof c);
  mp_explain_fmt_bytes((double)(param_bytes + grad_bytes + opt_bytes), s, sizeof s);
  printf("\nper-rank totals at rest (rank %d, Megatron-LM: %s parameters, %s main gradients, "
         "fp32 master weights and Adam state%s):\n",
         e->rank, mp_dtype_name(p->opts.fsdp.param_dtype), mp_dtype_name(p->opts.fsdp.reduce_dtype),
         mp_plan_is_megatron_fsdp(p) ? ", each on the rank's shard (Megatron FSDP)"
         : d > 1 || de > 1           ? " on the rank's shard (distributed optimizer)"
                                     : "");
  printf("  parameters        %lld elements, %s\n", (long long)n, a);
  if (ne > 0 && (d > 1 || de > 1))
    printf("  master weights    %lld elements (1/%lld of %lld dense, 1/%lld of %lld routed-expert), %s\n",
           (long long)(shard + sh_e), (long long)d, (long long)(n - ne), (long long)de, (long long)ne, m);
  else if (d > 1)
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
  mp_explain_fmt_bytes((double)t.param_bytes, a, sizeof a);
  mp_explain_fmt_bytes((double)t.grad_bytes, b, sizeof b);
  mp_explain_fmt_bytes((double)t.optimizer_bytes, c, sizeof c);
  mp_explain_fmt_bytes((double)t.max_unit_gathered_bytes, d, sizeof d);
  mp_explain_fmt_bytes((double)(t.param_bytes + t.grad_bytes + t.optimizer_bytes), s, sizeof s);
  printf("\nper-rank totals at rest (rank %d, %s master weights and AdamW state):\n", e->rank,
         mp_dtype_name(e->plan->opts.master_dtype));
  printf("  parameters        %lld elements, %s\n", (long long)t.params_numel, a);
  printf("  gradients         %s\n", b);
  printf("  optimizer (m, v)  %s\n", c);
  printf("  sum               %s\n", s);
  printf("  largest unit gathered  %s (%s)\n", d, mp_dtype_name(e->plan->opts.fsdp.param_dtype));
}

/* ---- --param: the tile diagram ---------------------------------------------------- */

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

/* ---- --schedule, --summary -------------------------------------------------------- */

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
  if (e->plan && e->plan->opts.cpu_offload_layers > 0)
    printf("  CPU offloading: the first %d layers' marked tensors to the host and back, %s of copies exposed past "
           "Transformer Engine's windows (in exposed communication)\n",
           e->plan->opts.cpu_offload_layers, (fmt_time(r->offload_exposed_s, c, sizeof c), c));
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
        mp_explain_fmt_bytes(op->bytes, b, sizeof b);
        snprintf(det, sizeof det, "over %s (%d ranks), %s payload", mp_group_name((mp_group)op->group),
                 mp_mesh_group_size(&s->plan->mesh, (mp_group)op->group), b);
        break;
      case MP_OP_ALLOC:
      case MP_OP_FREE:
        kind = op->type == MP_OP_ALLOC ? "alloc" : "free";
        mp_explain_fmt_bytes((double)op->mem_bytes, b, sizeof b);
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

void mp_explain_print_text(const explain *e, const mp_param *prm, const mp_schedule *sched) {
  print_header(e);
  print_passes(e->plan);
  print_cp(e->plan);
  print_moe(e);
  print_pipeline(e);
  print_other_notes(e->plan);
  print_params(e);
  print_units(e);
  print_totals(e);
  if (prm) print_tiles(e, prm);
  if (sched && e->schedule) print_schedule(e, sched);
  if (sched && e->summary) print_summary(e);
}
