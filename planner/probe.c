/* A planner search described apart from its cluster (see probe.h). */
#include "planner/probe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "exec/rules.h"
#include "planner/batch.h"

void mp_plan_setup_batch(const mp_plan_setup *s, const mp_cluster *c, int64_t *global_batch, int64_t *target_seqs,
                         char *rule, size_t cap) {
  if (cap) rule[0] = '\0';
  if (s->global_batch > 0) {
    *global_batch = s->global_batch;
    *target_seqs = 0;
    return;
  }
  const double n_params = (double)mp_model_param_count(s->model);
  const int64_t n_gpus = mp_cluster_n_gpus(c);
  *target_seqs = mp_batch_rule_seqs(mp_batch_rule_tokens(n_params, n_gpus), s->seq);
  *global_batch = *target_seqs;
  mp_batch_rule_str(n_params, n_gpus, rule, cap);
}

mp_status mp_plan_setup_evaluator(mp_ctx *ctx, const mp_plan_setup *s, const mp_cluster *c, mp_sim_evaluator *ev) {
  int64_t gb = 0, target = 0;
  mp_plan_setup_batch(s, c, &gb, &target, NULL, 0);
  MP_CHECK(mp_sim_evaluator_init(ctx, ev, s->model, c, s->seq, gb, s->headroom, s->stack));
  /* what the command line checked against its own stack, on the stacks that run it */
  if (s->cp_rotate_given && !mp_mem_model_is_runtime(ev->stack.mem_model)) ev->base.cp_rotate = s->cp_rotate;
  if (ev->stack.mem_model == MP_MEM_MODEL_MEGATRON) ev->base.cp_comm = s->cp_comm;
  if (s->async_tp > 0 && ev->stack.async_tp && ev->base.sp != 0) ev->base.tp_comm_fused = 1;
  if (s->async_tp < 0) ev->base.tp_comm_fused = 0;
  return mp_plan_setup_options(ctx, s, c, ev);
}

mp_status mp_plan_setup_options(mp_ctx *ctx, const mp_plan_setup *s, const mp_cluster *c, mp_sim_evaluator *ev) {
  /* the flex dispatcher (DeepEP, HybridEP) is Megatron-Core's: on another cluster's stack
   * that does not run it the question cannot be asked there */
  if (mp_moe_dispatch_by_node(s->moe_dispatcher) && ev->stack.mem_model != MP_MEM_MODEL_MEGATRON)
    return mp_error(ctx, MP_ERR_USAGE, "--moe-dispatcher %s is Megatron-Core's flex dispatcher; stack %s does not "
                    "run it: name a megatron stack or drop it",
                    s->moe_dispatcher == MP_MOE_DISPATCH_DEEPEP ? "deepep" : "hybridep", ev->stack.name);
  ev->base.moe_dispatcher = s->moe_dispatcher;
  /* torchtitan's ChunkedLossWrapper runs on torchtitan stacks only: another stack is refused
   * here, once for the whole search, as a usage error naming the stack. The count's other
   * rule, that it divide each rank's sequence (seq / cp), depends on the mesh and is left to
   * each candidate's plan (mp_plan_loss_check, as torchtitan's own check refuses the run) */
  if (s->loss_chunks > 1 && ev->stack.mem_model != MP_MEM_MODEL_TORCHTITAN)
    return mp_error(ctx, MP_ERR_USAGE, "--loss-chunks is torchtitan's ChunkedLossWrapper; stack %s does not run "
                    "it: name a torchtitan stack or drop it", ev->stack.name);
  ev->base.loss_chunks = s->loss_chunks;
  MP_CHECK(mp_plan_setup_moe_routing(ctx, s, ev));
  return mp_plan_setup_fp8_recipe(ctx, s, c, ev);
}

mp_status mp_plan_setup_moe_routing(mp_ctx *ctx, const mp_plan_setup *s, mp_sim_evaluator *ev) {
  const mp_moe_routing *r = &s->moe_routing;
  if (!(r->imbalance > 1.0 || r->capacity_factor > 0.0)) return MP_OK;
  if (!mp_model_is_moe(s->model))
    return mp_error(ctx, MP_ERR_USAGE, "--moe-imbalance and --moe-capacity-factor load routed experts; %s has "
                    "none: drop them", s->model->name);
  if (mp_mem_model_is_runtime(ev->stack.mem_model))
    return mp_error(ctx, MP_ERR_USAGE, "--moe-imbalance and --moe-capacity-factor: stack %s is meshplan's "
                    "runtime, which routes the real tokens; name a torchtitan or megatron stack",
                    ev->stack.name);
  ev->base.moe_routing = *r;
  return MP_OK;
}

mp_status mp_plan_setup_fp8_recipe(mp_ctx *ctx, const mp_plan_setup *s, const mp_cluster *c, mp_sim_evaluator *ev) {
  if (s->fp8_recipe == MP_FP8_DEFAULT) return MP_OK;
  MP_CHECK(mp_rule_fp8_recipe_check(ctx, ev->stack.mem_model, s->fp8_recipe, ev->base.fp8_opts.all_gather));
  MP_CHECK(mp_sim_fp8_recipe_check(ctx, &c->gpu, s->fp8_recipe));
  ev->base.fp8_opts.recipe = s->fp8_recipe;
  return MP_OK;
}

void mp_plan_setup_search(const mp_plan_setup *s, const mp_cluster *c, mp_sim_evaluator *ev,
                          mp_search_config *cfg) {
  int64_t gb = 0, target = 0;
  mp_plan_setup_batch(s, c, &gb, &target, NULL, 0);
  mp_sim_search_config(cfg, ev, c, s->headroom);
  cfg->allow_cross_node_tp = s->allow_cross_node_tp;
  cfg->executable_only = s->executable_only;
  cfg->n_threads = s->n_threads;
  cfg->fix = s->fix;
  cfg->target_batch = target;
  cfg->search_fp8 = s->fp8_auto && mp_gpu_has_float8(&c->gpu);
  /* a policy recomputing more is never faster: pruned unless ranking by memory */
  cfg->prune_dominated = s->objective != MP_OBJECTIVE_MEMORY;
}

mp_status mp_plan_probe(mp_ctx *ctx, const mp_plan_setup *s, const mp_cluster *c, mp_probe_result *out) {
  memset(out, 0, sizeof *out);
  mp_sim_evaluator *ev = calloc(1, sizeof *ev);
  MP_CHECK_ALLOC(ctx, ev);
  mp_planner_request req;
  memset(&req, 0, sizeof req);
  mp_planner_result res;
  memset(&res, 0, sizeof res);
  mp_status st = mp_plan_setup_evaluator(ctx, s, c, ev);
  if (st == MP_OK) {
    mp_plan_setup_search(s, c, ev, &req.search);
    req.objective = s->objective;
    req.price_per_gpu_hour = s->price_per_gpu_hour;
    st = mp_planner_run(ctx, &req, NULL, &res);
  }
  if (st == MP_OK) {
    int64_t target = 0;
    mp_plan_setup_batch(s, c, &out->global_batch, &target, NULL, 0);
    out->n_candidates = res.search->n;
    out->n_ranked = res.n_order;
    if (res.n_order > 0) out->best = res.search->cands[res.order[0]];
    out->best.error = NULL; /* in the search's arena, freed below */
  }
  mp_planner_result_free(&res);
  mp_sim_evaluator_free(ev);
  free(ev);
  return st;
}

mp_status mp_cluster_resize(mp_ctx *ctx, const mp_cluster *c, int64_t n, int gpus_per_node, mp_cluster *out) {
  if (n < 1 || n > MP_LIM_GPUS)
    return mp_error(ctx, MP_ERR_INVALID, "%lld GPUs is out of range; accepted 1..%lld", (long long)n,
                    (long long)MP_LIM_GPUS);
  int64_t per = gpus_per_node > 0 ? gpus_per_node : 8;
  if (n < per) per = n;
  if (n % per)
    return mp_error(ctx, MP_ERR_INVALID, "%lld GPUs is not a whole number of nodes of %lld", (long long)n,
                    (long long)per);
  *out = *c;
  out->gpus_per_node = (int)per;
  out->n_nodes = (int)(n / per);
  snprintf(out->name, sizeof out->name, "%lldx%s", (long long)n, c->gpu.name);
  return MP_OK;
}

void mp_cluster_with_gpu(const mp_cluster *c, const mp_gpu *g, mp_cluster *out) {
  *out = *c;
  out->gpu = *g;
  out->intra_node_GBps_per_gpu = g->nvlink_GBps_per_dir;
  snprintf(out->name, sizeof out->name, "%dx%s", mp_cluster_n_gpus(c), g->name);
}
