/* train --db PATH --plan-id ID: the plan stored as row ID of the plans table (by `meshplan
 * plan --db`, `train --auto --db` or `train --db`) trained as stored. From the row
 * (planner/store.h): the whole mesh (mp_plan_row_mesh: every dim, ep, etp, dopt), the
 * micro-batch, the AC policy, float8, reshard_after_forward, SP (with tp > 1), the
 * pipeline's chunks per stage (pp_virtual 1: 1F1B, more: interleaved, the two schedules the
 * search enumerates, planner/search.h) and its split (pp_split: the embedding and the loss
 * counted as a layer each); from its run: the model, the world size, seq and the global
 * batch (the plan's own, plans.global_batch, else the run's). An option given beside
 * --plan-id must say what the plan says; what the runtime does not execute is refused later
 * by the runtime's rule book (exec/runtime/check.c), as for a --mesh given.
 * The settings the plan was predicted under (planner/store.h mp_plan_settings): loss_chunks
 * goes into the plan options, so a chunked loss, which the runtime's memory models do not
 * run, is refused by the plan's own rule (exec/plan_loss.c) before anything is launched; the
 * float8 recipe goes into the plan options too, so a recipe the runtime does not run
 * (tensorwise only) is refused by the float8 pass's rule (exec/rules.c); the expert capacity
 * factor is the runtime's drop rule (--moe-capacity-factor, which a value
 * given must equal; the runtime's capacity check refuses it off the CPU backend); the stack,
 * the NCCL version and the experts' imbalance describe the prediction, not what the runtime
 * executes (it runs its own stack, meshplan-cpu or meshplan-cuda, on the MPI or NCCL it was
 * built with, and routes the real tokens), and are stated in the run's plan line. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/limits.h"
#include "common/status.h"
#include "exec/mesh.h"
#include "exec/plan.h"
#include "exec/runtime/check.h"
#include "app/train_job.h"
#include "planner/report.h"
#include "planner/search.h"
#include "planner/store.h"

/* Plan j->plan_id's row and its run from --db, which must exist (the plan is read, never
 * created) and be a meshplan database (mp_store_open's refusal otherwise). */
static mp_status read_stored(train_job *j, mp_plan_row *r, mp_run_row *run) {
  if (access(j->db, F_OK) != 0)
    return mp_error(j->ctx, MP_ERR_NOT_FOUND, "--plan-id %lld: %s does not exist; give the --db that `meshplan "
                    "plan --db` wrote the plan into", j->plan_id, j->db);
  mp_store *st = NULL;
  mp_status s = mp_store_open(j->ctx, j->db, &st);
  if (s == MP_OK) s = mp_store_get_plan(j->ctx, st, j->plan_id, r);
  if (s == MP_OK) s = mp_store_get_run(j->ctx, st, r->run_id, run);
  mp_store_close(st);
  if (s != MP_OK) mp_error_prefix(j->ctx, "--plan-id %lld", j->plan_id);
  return s;
}

/* An option given beside --plan-id that says otherwise than the plan: refused naming both. */
static mp_status agree(train_job *j, const char *opt, int given, long long value, long long plan_value) {
  if (!given || value == plan_value) return MP_OK;
  return mp_error(j->ctx, MP_ERR_USAGE, "%s %lld contradicts plan %lld's %lld (%s); drop %s to train the plan as "
                  "stored, or drop --plan-id", opt, value, j->plan_id, plan_value, j->db, opt);
}

/* The run's model (its name and its MTP depth, which --mtp-num-layers sets beside the name)
 * and world size must be the plan's. */
static mp_status check_run(train_job *j, const mp_plan_row *r, const mp_run_row *run) {
  if (strcmp(run->model, j->model.name) != 0)
    return mp_error(j->ctx, MP_ERR_USAGE, "--plan-id %lld is a plan for model %s (run %lld of %s), not %s; give "
                    "--model %s or a plan of %s", j->plan_id, run->model, (long long)r->run_id, j->db,
                    j->model.name, run->model, j->model.name);
  if (run->n_gpus != j->launch.world)
    return mp_error(j->ctx, MP_ERR_USAGE, "--plan-id %lld is a plan for %d ranks (run %lld of %s), this run has "
                    "%d; launch it with mpirun -np %d, or plan for %d", j->plan_id, run->n_gpus,
                    (long long)r->run_id, j->db, j->launch.world, run->n_gpus, j->launch.world);
  if (r->mtp_layers >= 0 && r->mtp_layers != j->model.mtp_layers)
    return mp_error(j->ctx, MP_ERR_USAGE, "--plan-id %lld is a plan of %s with %d multi-token-prediction modules "
                    "(run %lld of %s), this run's has %lld; give --mtp-num-layers %d, or a plan of this model",
                    j->plan_id, run->model, r->mtp_layers, (long long)r->run_id, j->db,
                    (long long)j->model.mtp_layers, r->mtp_layers);
  if (r->ac < 0)
    return mp_error(j->ctx, MP_ERR_DB, "plan %lld in %s has an AC policy this meshplan does not know; plan "
                    "again with this build", j->plan_id, j->db);
  return MP_OK;
}

/* The options given beside --plan-id, each against the plan's value. */
static mp_status check_given(train_job *j, const mp_plan_row *r, const mp_run_row *run, int64_t global_batch) {
  const mp_cmd_spec *sp = j->spec;
  const mp_plan_options *po = &j->po;
  const int interleaved = r->pp_virtual > 1;
  if (mp_args_has(sp, "--pp-layers"))
    return mp_error(j->ctx, MP_ERR_USAGE, "--pp-layers: plan %lld's stages are its own (pp_split %d); drop "
                    "--pp-layers, or drop --plan-id and give --mesh", j->plan_id, r->pp_split);
  if (mp_args_has(sp, "--pp-schedule") && po->pp_schedule != (interleaved ? MP_PP_INTERLEAVED : MP_PP_1F1B))
    return mp_error(j->ctx, MP_ERR_USAGE, "--pp-schedule %s contradicts plan %lld's %s (%s); drop --pp-schedule "
                    "to train the plan as stored, or drop --plan-id", mp_pp_schedule_name(po->pp_schedule),
                    j->plan_id, interleaved ? "interleaved" : "1f1b", j->db);
  if (mp_args_has(sp, "--ac") && (po->ac != (mp_ac_mode)r->ac || (r->ac == MP_AC_FULL && po->ac_every != r->ac_every)))
    return mp_error(j->ctx, MP_ERR_USAGE, "--ac %s contradicts plan %lld's %s (%s); drop --ac to train the plan as "
                    "stored, or drop --plan-id", mp_args_get(sp, "--ac"), j->plan_id, mp_search_ac_name(r->ac), j->db);
  MP_CHECK(agree(j, "--seq", mp_args_has(sp, "--seq"), po->seq, run->seq));
  MP_CHECK(agree(j, "--micro-batch", mp_args_has(sp, "--micro-batch"), po->micro_batch, r->micro_batch));
  MP_CHECK(agree(j, "--global-batch", po->global_batch > 0, po->global_batch, global_batch));
  MP_CHECK(agree(j, "--pp-virtual", mp_args_has(sp, "--pp-virtual"), po->pp_virtual, r->pp_virtual));
  MP_CHECK(agree(j, "--fp8 (1: on)", mp_args_has(sp, "--fp8"), po->fp8, r->fp8));
  mp_fp8_recipe given = MP_FP8_DEFAULT, stored = MP_FP8_DEFAULT; /* --fp8 RECIPE against the plan's */
  const char *fp8 = mp_args_get(sp, "--fp8");
  if (fp8 && mp_fp8_recipe_parse(fp8, &given) && given != MP_FP8_DEFAULT && r->fp8_recipe[0] &&
      (!mp_fp8_recipe_parse(r->fp8_recipe, &stored) || given != stored))
    return mp_error(j->ctx, MP_ERR_USAGE, "--fp8 %s contradicts plan %lld's float8 recipe %s (%s); drop --fp8 to "
                    "train the plan as stored, or drop --plan-id", fp8, j->plan_id, r->fp8_recipe, j->db);
  double cf = 0;
  MP_CHECK(mp_args_double(j->ctx, sp, "--moe-capacity-factor", 0, MP_LIM_MOE_LOAD, MP_RANGE_OPEN_LO, &cf));
  if (mp_args_has(sp, "--moe-capacity-factor") && cf != r->moe_capacity_factor)
    return mp_error(j->ctx, MP_ERR_USAGE, "--moe-capacity-factor %g contradicts plan %lld's %g (%s; 0: dropless); "
                    "drop --moe-capacity-factor to train the plan as stored, or drop --plan-id", cf, j->plan_id,
                    r->moe_capacity_factor, j->db);
  return agree(j, "--sp (1) / --no-sp (0)", po->sp >= 0 && r->tp > 1, po->sp, r->sp);
}

int mp_train_take_settings(const mp_candidate *c, int64_t n_layers, mp_plan_options *po) {
  po->micro_batch = c->micro_batch;
  po->ac = (mp_ac_mode)c->ac;
  po->ac_every = c->ac_every;
  po->fp8 = c->fp8;
  po->fsdp.reshard_after_forward = c->reshard;
  po->pp_virtual = c->pp_virtual > 1 ? c->pp_virtual : 1;
  po->pp_schedule = c->pp_virtual > 1 ? MP_PP_INTERLEAVED : MP_PP_1F1B;
  return !c->pp_split || mp_pp_layout_embedding_loss(n_layers, c->mesh.size[MP_DIM_PP], po->pp_virtual, po);
}

mp_status mp_train_stored_plan(train_job *j) {
  mp_plan_row r;
  mp_run_row run;
  MP_CHECK(read_stored(j, &r, &run));
  MP_CHECK(check_run(j, &r, &run));
  const int64_t global_batch = r.global_batch > 0 ? r.global_batch : run.global_batch;
  MP_CHECK(check_given(j, &r, &run, global_batch));
  mp_plan_options *po = &j->po;
  po->seq = run.seq;
  MP_CHECK(mp_cmd_check_seq(j->ctx, j->spec, &j->model, po->seq));
  MP_CHECK(mp_runtime_model_check(j->ctx, &j->model, po->seq));
  po->global_batch = global_batch;
  po->loss_chunks = r.loss_chunks;
  /* a float8 plan's recipe, so the float8 pass refuses one the runtime does not run
   * (exec/rules.c mp_rule_fp8_recipe_check) instead of the runtime's tensorwise standing in */
  if (r.fp8 && r.fp8_recipe[0] && !mp_fp8_recipe_parse(r.fp8_recipe, &po->fp8_opts.recipe))
    return mp_error(j->ctx, MP_ERR_DB, "plan %lld in %s has a float8 recipe this meshplan does not know (%s); plan "
                    "again with this build", j->plan_id, j->db, r.fp8_recipe);
  j->stored_capacity_factor = r.moe_capacity_factor; /* the runtime's drop rule (train_loop.c) */
  if (r.tp > 1) po->sp = r.sp;
  po->n_pp_layers = 0;
  mp_candidate c;
  memset(&c, 0, sizeof c);
  mp_plan_row_mesh(&r, &c.mesh);
  c.micro_batch = r.micro_batch, c.ac = (uint8_t)r.ac, c.ac_every = (uint16_t)r.ac_every, c.fp8 = (uint8_t)r.fp8;
  c.reshard = (uint8_t)r.reshard, c.pp_virtual = (uint16_t)r.pp_virtual, c.pp_split = (uint8_t)r.pp_split;
  if (!mp_train_take_settings(&c, j->model.n_layers, po))
    return mp_error(j->ctx, MP_ERR_DB, "plan %lld in %s counts the embedding and loss in the split of %lld "
                    "layers over pp=%d x %d chunks, which they do not divide; plan again with this build",
                    j->plan_id, j->db, (long long)j->model.n_layers, r.pp, po->pp_virtual);
  j->stored_mesh = c.mesh;
  char mesh_s[128], ac[32], pipe[64] = "no pipeline", settings[160];
  mp_plan_row_settings_str(&r, settings, sizeof settings);
  mp_mesh_format(&j->stored_mesh, mesh_s, sizeof mesh_s);
  if (r.ac == MP_AC_FULL && r.ac_every > 1) snprintf(ac, sizeof ac, "full:%d", r.ac_every);
  else snprintf(ac, sizeof ac, "%s", mp_search_ac_name(r.ac));
  if (r.pp > 1 && po->pp_virtual > 1) snprintf(pipe, sizeof pipe, "interleaved schedule, %d chunks a stage", po->pp_virtual);
  else if (r.pp > 1) snprintf(pipe, sizeof pipe, "1f1b schedule");
  if (r.pp > 1 && r.pp_split) snprintf(pipe + strlen(pipe), sizeof pipe - strlen(pipe), ", embedding and loss in the split");
  snprintf(j->stored_line, sizeof j->stored_line,
           "plan %lld of %s (run %lld: %s on %s, %s profile): mesh %s, micro-batch %lld, ac %s, float8 %s, %s%s; "
           "predicted under %s",
           j->plan_id, j->db, (long long)r.run_id, run.model, run.cluster, run.gpu, mesh_s,
           (long long)r.micro_batch, ac, r.fp8 ? (r.fp8_recipe[0] ? r.fp8_recipe : "on") : "off",
           pipe,
           r.tp > 1 ? (r.sp ? ", sp" : ", no sp") : "", settings);
  return MP_OK;
}

mp_status mp_train_stored_mesh(train_job *j, const char *mspec) {
  if (!mspec) {
    long long ep = 0;
    MP_CHECK(mp_args_int(j->ctx, j->spec, "--ep", 1, MP_MESH_MAX_WORLD, &ep));
    MP_CHECK(agree(j, "--ep", ep > 0, ep, j->stored_mesh.ep));
  } else {
    mp_mesh given;
    MP_CHECK(mp_mesh_parse(j->ctx, mspec, 0, &given));
    MP_CHECK(mp_cmd_mesh_ep(j->ctx, j->spec, &given));
    char a[128], b[128];
    mp_mesh_format(&given, a, sizeof a);
    mp_mesh_format(&j->stored_mesh, b, sizeof b);
    if (strcmp(a, b) != 0)
      return mp_error(j->ctx, MP_ERR_USAGE, "--mesh %s contradicts plan %lld's mesh %s (%s); drop --mesh to train "
                      "the plan's, or drop --plan-id", a, j->plan_id, b, j->db);
  }
  j->mesh = j->stored_mesh;
  return MP_OK;
}
