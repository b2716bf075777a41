/* meshplan explain --json (explain.h): the plan as one JSON document (cJSON): the model,
 * mesh and batch, the passes with their notes, the context-parallel and pipeline sections,
 * every parameter (global, after TP/EP and at-rest shapes, offset, bytes, placements), the
 * FSDP units, the rank's totals; --param's tiles on every rank; --schedule's ops with their
 * predicted durations. */
#include <string.h>

#include <cjson/cJSON.h>

#include "app/commands.h"
#include "app/explain.h"

static void fmt_place(const mp_placement *pl, char *buf, size_t cap) {
  if (pl->kind == MP_PLACEMENT_SHARD) snprintf(buf, cap, "Shard(%d)", pl->dim);
  else snprintf(buf, cap, "Replicate");
}

static cJSON *shape_json(const int64_t *s, int ndim) {
  cJSON *a = cJSON_CreateArray();
  for (int i = 0; i < ndim; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)s[i]));
  return a;
}

/* The model, the mesh and the rank, the batch, and the plan-wide choices of the passes. */
static void add_plan_facts(cJSON *root, const explain *e) {
  const mp_plan *p = e->plan;
  char mesh_s[128];
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
  if (p->opts.recompute_method != MP_RECOMPUTE_NONE) { /* Megatron-Core's, under full */
    cJSON_AddStringToObject(root, "recompute_method", mp_recompute_method_name(p->opts.recompute_method));
    cJSON_AddNumberToObject(root, "recompute_num_layers", p->opts.recompute_num_layers);
  }
  cJSON_AddBoolToObject(root, "fp8", p->opts.fp8 != 0);
  cJSON_AddBoolToObject(root, "shard_logits", p->opts.tp.shard_logits != 0);
}

/* The passes applied, in order, each with the notes it left ("name: note"). */
static void add_passes(cJSON *root, const mp_plan *p) {
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
}

/* pp > 1: the rank's pipeline (mp_explain_pipeline_facts) with its sentence. */
static void add_pipeline(cJSON *root, const explain *e) {
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

/* One parameter: its shapes (global, after TP/EP, at rest on the rank with its offset, null
 * where the rank holds none of it), its bytes at rest in the master dtype, its placement on
 * each mesh axis and its FSDP unit. */
static cJSON *param_json(const explain *e, const mp_param *prm) {
  const mp_plan *p = e->plan;
  const int mb = mp_dtype_bytes(p->opts.master_dtype);
  const char *axes[MP_AXIS_COUNT] = {"dp_replicate", "fsdp", "ep", "tp"};
  char buf[64];
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
    /* a routed expert's tp axis is its expert-TP split (exec/pass_ep.c) */
    cJSON_AddStringToObject(pl, a == MP_AXIS_TP && prm->is_expert ? "etp" : axes[a], buf);
  }
  cJSON_AddBoolToObject(j, "float8", prm->float8 != 0);
  cJSON_AddNumberToObject(j, "fsdp_unit", prm->fsdp_unit);
  cJSON_AddStringToObject(j, "fsdp_group", mp_group_name(prm->fsdp_group));
  cJSON_AddNumberToObject(j, "pp_stage", prm->pp_stage);
  return j;
}

/* One FSDP unit: its group and sizes, and its parameters by name. */
static cJSON *unit_json(const mp_plan *p, const mp_fsdp_unit *un) {
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
  return j;
}

/* The rank's totals at rest (mp_plan_rank_totals). */
static void add_totals(cJSON *root, const explain *e) {
  mp_plan_totals t;
  mp_plan_rank_totals(e->plan, e->rank, &t);
  cJSON *tj = cJSON_AddObjectToObject(root, "totals");
  cJSON_AddNumberToObject(tj, "params_numel", (double)t.params_numel);
  cJSON_AddNumberToObject(tj, "param_bytes", (double)t.param_bytes);
  cJSON_AddNumberToObject(tj, "grad_bytes", (double)t.grad_bytes);
  cJSON_AddNumberToObject(tj, "optimizer_bytes", (double)t.optimizer_bytes);
  cJSON_AddNumberToObject(tj, "max_unit_gathered_bytes", (double)t.max_unit_gathered_bytes);
}

/* The plan on the rank: its facts, the passes, the context-parallel and pipeline sections
 * where they apply, every parameter, the FSDP units and the totals. */
static cJSON *plan_json(const explain *e) {
  const mp_plan *p = e->plan;
  cJSON *root = cJSON_CreateObject();
  add_plan_facts(root, e);
  add_passes(root, p);
  char cpn[1536];
  mp_explain_cp_note(p, cpn, sizeof cpn);
  if (cpn[0]) cJSON_AddStringToObject(root, "context_parallel", cpn);
  mp_explain_moe f;
  if (mp_explain_moe_note(e, &f, cpn, sizeof cpn)) {
    cJSON *mo = cJSON_AddObjectToObject(root, "routed_experts");
    cJSON_AddNumberToObject(mo, "experts_local", (double)f.experts_local);
    cJSON_AddNumberToObject(mo, "rows_per_expert", f.rows);
    cJSON_AddNumberToObject(mo, "rows_computed", (double)f.rows_computed);
    cJSON_AddNumberToObject(mo, "load", f.load);
    cJSON_AddNumberToObject(mo, "grouped_gemm_eff", f.grouped_eff);
    cJSON_AddNumberToObject(mo, "dense_gemm_eff", f.dense_eff);
    cJSON_AddNumberToObject(mo, "dispatch_rows", (double)f.dispatch_rows);
    cJSON_AddNumberToObject(mo, "etp_gather_rows", (double)f.etp_gather_rows);
    cJSON_AddStringToObject(mo, "note", cpn);
  }
  if (e->pp_note[0]) add_pipeline(root, e);
  cJSON *params = cJSON_AddArrayToObject(root, "params");
  for (int i = 0; i < p->n_params; i++) cJSON_AddItemToArray(params, param_json(e, &p->params[i]));
  cJSON *units = cJSON_AddArrayToObject(root, "units");
  for (int u = 0; u < p->n_units; u++) cJSON_AddItemToArray(units, unit_json(p, &p->units[u]));
  add_totals(root, e);
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

static cJSON *schedule_json(const explain *e, const mp_schedule *s) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "predicted_on", e->predicted_on);
  if (e->kernels_json) cJSON_AddItemReferenceToObject(o, "kernels", e->kernels_json);
  cJSON_AddNumberToObject(o, "predicted_step_s", e->res.step_time_s);
  if (s->offload_bytes > 0) { /* CPU offloading: one layer's copy, and what the step's copies expose */
    cJSON_AddNumberToObject(o, "offload_bytes_per_layer", (double)s->offload_bytes);
    cJSON_AddNumberToObject(o, "offload_exposed_s", e->res.offload_exposed_s);
  }
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

void mp_explain_print_json(const explain *e, const mp_param *prm, const mp_schedule *sched) {
  cJSON *root = plan_json(e);
  if (prm) cJSON_AddItemToObject(root, "param", tiles_json(e, prm));
  if (sched) cJSON_AddItemToObject(root, "schedule", schedule_json(e, sched));
  mp_cmd_print_json(root);
}
