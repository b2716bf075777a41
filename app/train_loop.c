/* meshplan train: the loop around the steps (train_job.h lists train's files).
 *
 * Restore: --resume loads a checkpoint saved under any mesh (exec/runtime/ckpt.h) with the
 * optimizer's step count and moments, the data position and the seed; else --init-from
 * loads safetensors weights (exec/runtime/hf.h). Step s (1-based) then runs with the LR
 * schedule's lr(s) (exec/runtime/lr.h) on the batch at the data position, which advances
 * by the global batch; so a run resumed from step k computes steps k+1.. exactly as the
 * straight run did. A NaN or infinite loss or gradient norm stops the run at that step
 * (the runtime leaves the state untouched) with the last good checkpoint on disk.
 *
 * Test hook (for tests only; never set it in a real run): MESHPLAN_TEST_KILL makes a rank
 * fail on purpose: "step:N[:RANK[:HOW[:ATTEMPT]]]" before step N, "save:POINT:STEP[:RANK[:HOW
 * [:ATTEMPT]]]" at a named point of the save of STEP (ckpt.h's hook points). RANK defaults to
 * 0. HOW is kill (default: SIGKILL, as a crash or a scheduler's kill -9) or stop (SIGSTOP: a
 * hung rank, which the others report after MESHPLAN_COMM_TIMEOUT_S). ATTEMPT is the
 * train --elastic attempt it fires in (MESHPLAN_ELASTIC_ATTEMPT; default 0, the first launch
 * and every run without the supervisor), so a restarted job does not fail again at the
 * same step unless a test asks for it. Several specs, separated by ';', fail ranks in
 * several attempts (the first spec of the current attempt applies). */
#define _GNU_SOURCE
#include <errno.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/checked.h"
#include "common/file.h"
#include "common/json.h"
#include "common/limits.h"
#include "common/timeutil.h"
#include "sim/cluster.h"
#include "exec/runtime/check.h"
#include "exec/runtime/hf.h"
#include "exec/runtime/threads.h"
#include "exec/runtime/weights.h"
#include "app/elastic.h"
#include "app/train_job.h"

/* ---- the test hook ---------------------------------------------------------------------- */

static struct {
  int on, rank, stop; /* stop: SIGSTOP instead of SIGKILL */
  long long step;     /* step:N */
  char point[32];     /* save:POINT:STEP */
} g_kill;

static void kill_now(void) {
  fflush(stdout);
  raise(g_kill.stop ? SIGSTOP : SIGKILL);
}

static void kill_hook(const char *point, int rank, int64_t step, void *arg) {
  (void)arg;
  if (g_kill.point[0] && rank == g_kill.rank && step == g_kill.step && strcmp(point, g_kill.point) == 0) kill_now();
}

/* One spec of the hook into g_kill; 0 when it is not this attempt's. */
static int kill_spec(const char *v, int attempt_now) {
  char how[16] = "kill";
  int attempt = 0;
  memset(&g_kill, 0, sizeof g_kill);
  if (sscanf(v, "step:%lld:%d:%15[a-z]:%d", &g_kill.step, &g_kill.rank, how, &attempt) >= 1)
    g_kill.on = 1;
  else if (sscanf(v, "save:%31[a-z_]:%lld:%d:%15[a-z]:%d", g_kill.point, &g_kill.step, &g_kill.rank, how,
                  &attempt) >= 2)
    g_kill.on = 1;
  g_kill.stop = strcmp(how, "stop") == 0;
  if (!g_kill.on || attempt != attempt_now) memset(&g_kill, 0, sizeof g_kill);
  return g_kill.on;
}

/* MESHPLAN_TEST_KILL: specs separated by ';', the first of this attempt's applies (a test
 * fails one rank in the first attempt and another in the restart). */
static void read_kill_hook(void) {
  const char *v = getenv("MESHPLAN_TEST_KILL"), *att = getenv(MP_ELASTIC_ENV_ATTEMPT);
  const int attempt_now = att ? atoi(att) : 0;
  memset(&g_kill, 0, sizeof g_kill);
  mp_ckpt_set_hook(NULL, NULL);
  char spec[128];
  for (const char *p = v; p && *p;) {
    const size_t len = strcspn(p, ";");
    snprintf(spec, sizeof spec, "%.*s", (int)(len < sizeof spec ? len : sizeof spec - 1), p);
    if (kill_spec(spec, attempt_now)) break;
    p += len + (p[len] == ';');
  }
  if (g_kill.point[0]) mp_ckpt_set_hook(kill_hook, NULL);
}

/* ---- options ------------------------------------------------------------------------------ */

void mp_train_threads(train_job *j) {
  if (!j->launch.under_mpi) return;
  mp_threads_choice c;
  mp_threads_configure(&c);
  if (j->rank != 0) return;
  if (c.from_env)
    printf("threads: %d OpenMP thread%s per rank (OMP_NUM_THREADS)\n", c.threads, c.threads == 1 ? "" : "s");
  else
    printf("threads: %d OpenMP thread%s per rank: %d core%s, %d rank%s on this node%s (OMP_NUM_THREADS overrides)\n",
           c.threads, c.threads == 1 ? "" : "s", c.cores_total, c.cores_total == 1 ? "" : "s", c.local_ranks,
           c.local_ranks == 1 ? "" : "s", c.cores_bound && c.cores_bound < c.cores_total ? ", bound to fewer" : "");
}

static mp_status read_decay(train_job *j) {
  const char *rule = mp_args_get(j->spec, "--decay");
  if (!rule || strcmp(rule, "2d") == 0) return MP_OK;
  if (strcmp(rule, "2d-no-embed") == 0) {
    j->ro.decay_embeddings = 0;
    return MP_OK;
  }
  if (strcmp(rule, "all") == 0) {
    j->ro.decay_all = 1;
    return MP_OK;
  }
  return mp_error(j->ctx, MP_ERR_USAGE, "--decay %s: choose 2d, 2d-no-embed or all", rule);
}

mp_status mp_train_read_loop_options(train_job *j) {
  mp_ctx *ctx = j->ctx;
  mp_cmd_spec *sp = j->spec;
  double peak = 1e-3; /* --lr as given: the float the optimizer takes is rounded from lr(s) */
  MP_CHECK(mp_args_double(ctx, sp, "--lr", 0, MP_LIM_LR, MP_RANGE_CLOSED, &peak));
  j->lr = (mp_lr_schedule){MP_LR_CONSTANT, peak, 0.0, 0, j->steps > 0 ? j->steps : 1, 0.2};
  const char *kind = mp_args_get(sp, "--lr-schedule");
  if (kind) MP_CHECK(mp_lr_kind_parse(ctx, kind, &j->lr.kind));
  long long w = 0;
  MP_CHECK(mp_args_int(ctx, sp, "--warmup", 0, MP_LIM_STEPS, &w));
  j->lr.warmup = w;
  MP_CHECK(mp_args_double(ctx, sp, "--min-lr", 0, MP_LIM_LR, MP_RANGE_CLOSED, &j->lr.min_lr));
  MP_CHECK(mp_args_double(ctx, sp, "--decay-frac", 0, 1, MP_RANGE_CLOSED, &j->lr.decay_frac));
  MP_CHECK(mp_lr_validate(ctx, &j->lr));
  MP_CHECK(read_decay(j));
  j->ckpt_dir = mp_args_get(sp, "--checkpoint-dir");
  j->ckpt_keep = 3;
  MP_CHECK(mp_args_int(ctx, sp, "--checkpoint-every", 1, MP_LIM_STEPS, &j->ckpt_every));
  MP_CHECK(mp_args_int(ctx, sp, "--checkpoint-keep", 0, MP_LIM_STEPS, &j->ckpt_keep));
  if (!j->ckpt_dir && (mp_args_has(sp, "--checkpoint-every") || mp_args_has(sp, "--checkpoint-keep")))
    return mp_error(ctx, MP_ERR_USAGE, "--checkpoint-every and --checkpoint-keep need --checkpoint-dir D");
  const char *res = mp_args_get(sp, "--resume");
  if (res && strcmp(res, "latest") == 0 && !j->ckpt_dir)
    return mp_error(ctx, MP_ERR_USAGE, "--resume latest needs --checkpoint-dir D (or give the checkpoint's folder)");
  j->eval_batches = 4;
  MP_CHECK(mp_args_int(ctx, sp, "--eval-every", 1, MP_LIM_STEPS, &j->eval_every));
  MP_CHECK(mp_args_int(ctx, sp, "--eval-batches", 1, MP_LIM_STEPS, &j->eval_batches));
  if (!mp_args_get(sp, "--val-data") && (mp_args_has(sp, "--eval-every") || mp_args_has(sp, "--eval-batches")))
    return mp_error(ctx, MP_ERR_USAGE, "--eval-every and --eval-batches need --val-data GLOB");
  /* the bound simulate, plan and validate take (common/limits.h): a factor beyond the
   * experts' count never drops, and the capacity's arithmetic stays exact in int64 */
  MP_CHECK(mp_args_double(ctx, sp, "--moe-capacity-factor", 0, MP_LIM_MOE_LOAD, MP_RANGE_OPEN_LO,
                          &j->ro.moe_capacity_factor));
  /* a stored plan's factor, which one given must equal (train_plan_id.c) */
  if (mp_args_has(sp, "--plan-id")) j->ro.moe_capacity_factor = j->stored_capacity_factor;
  return mp_runtime_capacity_check(ctx, &j->model, &j->po, j->ro.moe_capacity_factor);
}

/* ---- data ------------------------------------------------------------------------------- */

mp_status mp_train_load_data(train_job *j) {
  mp_ctx *ctx = j->ctx;
  const int shuffle = mp_args_has(j->spec, "--shuffle");
  j->data = mp_args_get(j->spec, "--data");
  if (!j->data || strcmp(j->data, "synthetic") == 0) {
    j->data = NULL;
    /* enough for every step without a wrap, up to MP_TRAIN_MAX_SYNTHETIC_TOKENS (beyond it
     * the data wraps into later epochs): the chain's prefix is the same whatever its
     * length, so a resumed run with the same --steps sees the same tokens */
    int64_t need = 0;
    if (mp_mul_i64(j->steps, j->po.global_batch, &need) || mp_add_i64(need, 1, &need) ||
        mp_mul_i64(need, j->po.seq, &need) || need > MP_TRAIN_MAX_SYNTHETIC_TOKENS)
      need = MP_TRAIN_MAX_SYNTHETIC_TOKENS;
    need += 1;
    if (need < (1 << 16)) need = 1 << 16;
    MP_CHECK(mp_corpus_synthetic(ctx, j->model.vocab, (int)j->fanout, need, (uint64_t)j->seed, &j->corpus));
    MP_CHECK(mp_dataset_from_corpus(ctx, &j->corpus, j->po.seq, shuffle, (uint64_t)j->seed, &j->train_data));
  } else {
    MP_CHECK(mp_dataset_open(ctx, j->data, j->po.seq, j->model.vocab, shuffle, (uint64_t)j->seed, &j->train_data));
  }
  const char *val = mp_args_get(j->spec, "--val-data");
  if (val) MP_CHECK(mp_dataset_open(ctx, val, j->po.seq, j->model.vocab, 0, (uint64_t)j->seed, &j->val_data));
  return MP_OK;
}

/* ---- restore ------------------------------------------------------------------------------ */

/* The LR schedule a checkpoint's "train" state records (train_state); 0 when a field is
 * missing (then it is said to differ). */
static int saved_schedule(const cJSON *t, mp_lr_schedule *out) {
  memset(out, 0, sizeof *out);
  const char *kind = cJSON_GetStringValue(cJSON_GetObjectItem(t, "lr_schedule"));
  mp_ctx c2;
  mp_ctx_init(&c2);
  if (!kind || mp_lr_kind_parse(&c2, kind, &out->kind) != MP_OK) return 0;
  static const char *const keys[] = {"lr", "min_lr", "warmup_steps", "total_steps", "decay_frac"};
  double v[5];
  for (int i = 0; i < 5; i++) {
    const cJSON *x = cJSON_GetObjectItem(t, keys[i]);
    if (!cJSON_IsNumber(x)) return 0;
    v[i] = x->valuedouble;
  }
  *out = (mp_lr_schedule){out->kind, v[0], v[1], (int64_t)v[2], (int64_t)v[3], v[4]};
  return 1;
}

/* The checkpoint's training state against this run's: the seed must match (it orders the
 * data); a different data source is said, and a schedule that gives the steps still to
 * run other learning rates (mp_lr_same_after), not refused. */
static mp_status check_resumed_state(train_job *j, const mp_ckpt_meta *meta) {
  if (meta->seed != (uint64_t)j->seed)
    return mp_error(j->ctx, MP_ERR_USAGE, "%s was trained with --seed %llu (it orders the data); resume with "
                    "--seed %llu", j->resume_man.dir, (unsigned long long)meta->seed,
                    (unsigned long long)meta->seed);
  if (j->rank != 0 || j->eval_only) return MP_OK; /* an evaluation trains on nothing */
  const cJSON *t = meta->train;
  const char *src = cJSON_GetStringValue(cJSON_GetObjectItem(t, "data"));
  const char *now = j->data ? j->data : "synthetic";
  if (src && strcmp(src, now) != 0)
    printf("note: the checkpoint trained on --data %s, this run reads %s from sequence %lld\n", src, now,
           (long long)meta->data_consumed);
  mp_lr_schedule was;
  if (!saved_schedule(t, &was) || !mp_lr_same_after(&was, &j->lr, meta->step))
    printf("note: the checkpoint's schedule was %s, lr %g over %lld steps; this run's (%s, lr %g over %lld) "
           "applies from step %lld\n", mp_lr_kind_name(was.kind), was.lr, (long long)was.total,
           mp_lr_kind_name(j->lr.kind), j->lr.lr, j->steps, (long long)meta->step + 1);
  return MP_OK;
}

/* --resume latest: the newest checkpoint in --checkpoint-dir that loads into dir. A
 * damaged one (MP_ERR_INVALID: a checksum, a truncated or missing file, a malformed
 * manifest) is skipped with a line naming it and why, so an automatic restart goes on from
 * the newest good step; when none loads, the refusal gives the newest one's reason.
 * MP_ERR_NOT_FOUND when the folder holds no checkpoint yet. */
static mp_status load_latest(train_job *j, mp_ckpt_meta *meta, char *dir, size_t cap) {
  mp_ctx *ctx = j->ctx;
  int64_t *steps = NULL;
  int n = 0;
  mp_status st = mp_ckpt_list(ctx, j->ckpt_dir, &steps, &n);
  if (st == MP_OK && n == 0) st = mp_error(ctx, MP_ERR_NOT_FOUND, "%s holds no checkpoint", j->ckpt_dir);
  char newest[MP_ERRMSG_MAX] = "";
  for (int i = n - 1; i >= 0 && st == MP_OK; i--) {
    snprintf(dir, cap, "%s/step_%08lld", j->ckpt_dir, (long long)steps[i]);
    st = mp_ckpt_load(ctx, j->rt, dir, &j->resume_man, meta);
    if (st != MP_ERR_INVALID) break;
    if (!newest[0]) snprintf(newest, sizeof newest, "%s", mp_errmsg(ctx));
    if (j->rank == 0) printf("resume: skipping %s: %s\n", dir, mp_errmsg(ctx));
    mp_ckpt_manifest_free(&j->resume_man);
    st = i > 0 ? MP_OK : mp_error(ctx, MP_ERR_INVALID, "--resume latest: no checkpoint in %s loads; the newest: %s",
                                  j->ckpt_dir, newest);
  }
  free(steps);
  return st;
}

static mp_status resume(train_job *j, int *done) {
  mp_ctx *ctx = j->ctx;
  *done = 0;
  const char *res = mp_args_get(j->spec, "--resume");
  if (!res) return MP_OK;
  char dir[MP_CKPT_PATH_MAX];
  mp_ckpt_meta meta;
  mp_status st = MP_OK;
  if (strcmp(res, "latest") == 0) {
    st = load_latest(j, &meta, dir, sizeof dir);
    if (st == MP_ERR_NOT_FOUND && j->eval_only)
      return mp_error(ctx, MP_ERR_NOT_FOUND, "--eval-only --resume latest: %s holds no checkpoint to evaluate",
                      j->ckpt_dir);
    if (st == MP_ERR_NOT_FOUND) {
      if (j->rank == 0) printf("resume: no checkpoint in %s yet; starting at step 0\n", j->ckpt_dir);
      return MP_OK;
    }
  } else { /* a checkpoint named: it loads, or the run is refused */
    st = mp_ckpt_resolve(ctx, res, dir, sizeof dir);
    if (st == MP_OK) st = mp_ckpt_load(ctx, j->rt, dir, &j->resume_man, &meta);
  }
  MP_CHECK(st);
  MP_CHECK(check_resumed_state(j, &meta));
  j->resumed = 1;
  j->start_step = meta.step;
  j->position = meta.data_consumed;
  snprintf(j->last_ckpt, sizeof j->last_ckpt, "%s", dir);
  *done = 1;
  if (j->rank == 0)
    printf("resumed from %s: step %lld (saved by mesh %s), data position %lld sequences\n", dir,
           (long long)meta.step, cJSON_GetStringValue(cJSON_GetObjectItem(j->resume_man.root, "saved_by_mesh")),
           (long long)meta.data_consumed);
  return MP_OK;
}

/* MFU's figures: the model's FLOPs per token (6N plus attention, mp_model_flops_per_token)
 * and the device's dense peak for the dtype it computes in, times the ranks. */
static void mfu_figures(train_job *j) {
  j->flops_per_token = mp_model_flops_per_token(&j->model, j->po.seq);
  mp_gpu g;
  mp_ctx c2;
  mp_ctx_init(&c2);
  if (mp_gpu_load(&c2, j->dev.gpu, &g) != MP_OK) return;
  const double tf = g.peak_tflops[j->dev.cuda ? MP_DTYPE_BF16 : MP_DTYPE_FP32];
  j->peak_flops = tf * 1e12 * mp_comm_world_size(j->comm);
}

mp_status mp_train_restore(train_job *j) {
  read_kill_hook();
  int resumed = 0;
  MP_CHECK(resume(j, &resumed));
  const char *init = mp_args_get(j->spec, "--init-from");
  if (init && resumed && j->rank == 0) printf("note: resuming, so --init-from %s is not read\n", init);
  if (init && !resumed) {
    MP_CHECK(mp_hf_load(j->ctx, j->rt, init));
    if (j->rank == 0) printf("initialized from %s\n", init);
  }
  /* rank 0's files: every rank agrees, so none trains on while rank 0 has stopped */
  mp_status st = mp_train_metrics_open(j);
  if (st == MP_OK && j->store && j->rank == 0 && j->plan_id) {
    st = mp_train_db_run_of_plan(j);
    if (st == MP_OK) st = mp_store_set_train_status(j->ctx, j->store, j->plan_id, "running");
    j->status_set = st == MP_OK;
  }
  MP_CHECK(mp_runtime_agree(j->ctx, j->rt, st, "opening --metrics or --db"));
  mfu_figures(j);
  return MP_OK;
}

/* ---- the steps ------------------------------------------------------------------------------ */

/* The checkpoint's "train" state: what a resumed run checks and says. */
static cJSON *train_state(const train_job *j, double loss) {
  cJSON *t = cJSON_CreateObject();
  if (!t) return NULL;
  cJSON_AddStringToObject(t, "data", j->data ? j->data : "synthetic");
  cJSON_AddBoolToObject(t, "shuffle", mp_args_has(j->spec, "--shuffle"));
  cJSON_AddNumberToObject(t, "seq", (double)j->po.seq);
  cJSON_AddNumberToObject(t, "global_batch", (double)j->po.global_batch);
  cJSON_AddNumberToObject(t, "sequences_per_epoch", (double)mp_dataset_sequences(j->train_data));
  cJSON_AddStringToObject(t, "lr_schedule", mp_lr_kind_name(j->lr.kind));
  cJSON_AddNumberToObject(t, "lr", j->lr.lr);
  cJSON_AddNumberToObject(t, "min_lr", j->lr.min_lr);
  cJSON_AddNumberToObject(t, "warmup_steps", (double)j->lr.warmup);
  cJSON_AddNumberToObject(t, "total_steps", (double)j->lr.total);
  cJSON_AddNumberToObject(t, "decay_frac", j->lr.decay_frac);
  cJSON_AddNumberToObject(t, "loss", loss);
  if (j->db && j->plan_id) cJSON_AddNumberToObject(t, "db_plan_id", (double)j->plan_id);
  if (j->db && j->run_id) { /* the run a resumed process goes on recording into (train_record.c) */
    cJSON_AddNumberToObject(t, "db_run_id", (double)j->run_id);
    cJSON_AddStringToObject(t, "db_run_created_at", j->run_created);
  }
  return t;
}

static mp_status save(train_job *j, long long step, double loss) {
  mp_ckpt_meta meta = {step, j->position, (uint64_t)j->seed, train_state(j, loss)};
  double t0 = mp_now_s();
  mp_status st = meta.train ? mp_ckpt_save(j->ctx, j->rt, j->ckpt_dir, (int)j->ckpt_keep, &meta, j->last_ckpt,
                                           sizeof j->last_ckpt)
                            : mp_error(j->ctx, MP_ERR_NOMEM, "out of memory for the checkpoint's state");
  cJSON_Delete(meta.train);
  if (st == MP_OK && j->rank == 0) printf("checkpoint: %s (%.1f ms)\n", j->last_ckpt, (mp_now_s() - t0) * 1e3);
  return st;
}

/* The mean cross-entropy of eval_batches global batches of d from its start (the same
 * batches every time): the step's forward and backward without the optimizer. */
static mp_status eval_loss(train_job *j, mp_dataset *d, double *out) {
  const int dp = mp_comm_group_size(j->comm, MP_GROUP_DP), di = mp_comm_group_index(j->comm, MP_GROUP_DP);
  double sum = 0;
  for (long long k = 0; k < j->eval_batches; k++) {
    MP_CHECK(mp_dataset_batch(j->ctx, d, k * j->po.global_batch, j->po.global_batch, di, dp, j->batch));
    mp_step_result r;
    MP_CHECK(mp_runtime_forward_backward(j->ctx, j->rt, j->batch, &r));
    sum += r.ce_loss;
  }
  *out = sum / (double)j->eval_batches;
  return MP_OK;
}

/* Step 1 of the process with --dump-grads: forward and backward, the gradients written
 * (rank 0), then the optimizer; the dump is not part of the step's time (t0 restarts). */
static mp_status step_dumping_grads(train_job *j, const char *dump_g, mp_step_result *r, double *t0) {
  mp_ctx *ctx = j->ctx;
  mp_talloc_reset_peak((mp_talloc *)mp_runtime_allocator(j->rt));
  MP_CHECK(mp_runtime_forward_backward(ctx, j->rt, j->batch, r));
  mp_wfile w;
  mp_wfile_init(&w);
  mp_status st = mp_runtime_dump(ctx, j->rt, 1, &w);
  if (st == MP_OK && j->rank == 0) st = mp_wfile_write(ctx, &w, dump_g);
  mp_wfile_free(&w);
  MP_CHECK(st);
  *t0 = mp_now_s();
  if (j->timer) MP_CHECK(mp_cuda_timer_start(&j->kc, j->timer));
  MP_CHECK(mp_runtime_optimizer_step(ctx, j->rt, r));
  MP_CHECK(mp_runtime_synchronize(ctx, j->rt));
  r->peak_bytes = mp_talloc_peak_total(mp_runtime_allocator(j->rt));
  return MP_OK;
}

static mp_status diverged(train_job *j, const step_rec *sr) {
  j->diverged = 1;
  j->diverged_step = sr->step;
  char where[MP_CKPT_PATH_MAX + 64];
  if (j->last_ckpt[0])
    snprintf(where, sizeof where, "the last good checkpoint is %s", j->last_ckpt);
  else
    snprintf(where, sizeof where, "no checkpoint was written (--checkpoint-dir D keeps one)");
  return mp_error(j->ctx, MP_ERR_INVALID, "step %lld: the loss is %g and the gradient norm %g: training diverged "
                  "and stopped; %s; resume from it with a lower --lr or with --clip", sr->step, sr->r.loss,
                  sr->r.grad_norm, where);
}

/* The step's line on rank 0. */
static void print_step(const train_job *j, const step_rec *sr) {
  if (j->rank != 0) return;
  printf("step %4lld  loss %.6f  (ce %.6f aux %.6f)  grad_norm %.4f  lr %.3g  %.1f ms  %.0f tokens/s  peak %.3f MiB",
         sr->step, sr->r.loss, sr->r.ce_loss, sr->r.aux_loss, sr->r.grad_norm, sr->lr, sr->dt * 1e3, sr->tok_s,
         sr->r.peak_bytes / 1048576.0);
  if (sr->has_eval) printf("  eval %.6f", sr->eval);
  printf("\n");
}

/* The step's routed-expert loads copied for its record (mp_runtime_expert_routed): an eval's
 * forward before the record counts its own. Nothing for a model without MoE. */
static mp_status keep_expert_loads(train_job *j) {
  const int64_t *routed = mp_runtime_expert_routed(j->rt);
  if (!routed) return MP_OK;
  const size_t n = (size_t)j->model.n_layers * (size_t)j->model.n_experts;
  if (!j->expert_routed) {
    j->expert_routed = malloc(n * sizeof *j->expert_routed);
    j->expert_dropped = malloc(n * sizeof *j->expert_dropped);
    if (!j->expert_routed || !j->expert_dropped)
      return mp_error(j->ctx, MP_ERR_NOMEM, "out of memory for the expert loads");
  }
  memcpy(j->expert_routed, routed, n * sizeof *routed);
  memcpy(j->expert_dropped, mp_runtime_expert_dropped(j->rt), n * sizeof *routed);
  return MP_OK;
}

/* Step s + 1: its lr and batch, the step timed (device time on CUDA), its expert loads kept. */
static mp_status run_step(train_job *j, long long s, int first, step_rec *sr) {
  mp_ctx *ctx = j->ctx;
  const int dp = mp_comm_group_size(j->comm, MP_GROUP_DP), di = mp_comm_group_index(j->comm, MP_GROUP_DP);
  const char *dump_g = mp_args_get(j->spec, "--dump-grads");
  sr->step = s + 1;
  sr->lr = mp_lr_at(&j->lr, sr->step);
  mp_runtime_set_lr(j->rt, (float)sr->lr);
  MP_CHECK(mp_dataset_batch(ctx, j->train_data, j->position, j->po.global_batch, di, dp, j->batch));
  if (j->timer) MP_CHECK(mp_cuda_timer_start(&j->kc, j->timer));
  double t0 = mp_now_s();
  if (first && dump_g)
    MP_CHECK(step_dumping_grads(j, dump_g, &sr->r, &t0));
  else
    MP_CHECK(mp_runtime_step(ctx, j->rt, j->batch, &sr->r));
  sr->dt = mp_now_s() - t0;
  if (j->timer) MP_CHECK(mp_cuda_timer_stop(&j->kc, j->timer, &sr->dt));
  sr->tok_s = (double)sr->r.tokens * dp / sr->dt;
  j->position += j->po.global_batch;
  return keep_expert_loads(j);
}

/* --dump-logits: the starting weights' logits on the run's first batch (a forward and
 * backward without the optimizer), as a weight file. */
static mp_status dump_logits(train_job *j, const char *path) {
  mp_ctx *ctx = j->ctx;
  if (mp_comm_world_size(j->comm) != 1)
    return mp_error(ctx, MP_ERR_USAGE, "--dump-logits runs on one rank (the full vocabulary on one device)");
  const int64_t lb = mp_runtime_local_batch(j->rt), T = j->po.seq, V = j->model.vocab;
  float *lg = malloc((size_t)(lb * T * V) * sizeof(float));
  MP_CHECK_ALLOC(ctx, lg);
  mp_step_result r;
  mp_status st = mp_dataset_batch(ctx, j->train_data, j->position, j->po.global_batch, 0, 1, j->batch);
  if (st == MP_OK) st = mp_runtime_capture_logits(ctx, j->rt, lg);
  if (st == MP_OK) st = mp_runtime_forward_backward(ctx, j->rt, j->batch, &r);
  mp_runtime_capture_logits(ctx, j->rt, NULL);
  mp_wfile w;
  mp_wfile_init(&w);
  const int64_t shape[3] = {lb, T, V};
  if (st == MP_OK) st = mp_wfile_add(ctx, &w, "logits", 3, shape, lg);
  if (st == MP_OK) st = mp_wfile_write(ctx, &w, path);
  mp_wfile_free(&w);
  free(lg);
  return st;
}

mp_status mp_train_steps(train_job *j, int quiet) {
  const int dp = mp_comm_group_size(j->comm, MP_GROUP_DP);
  const char *dl = mp_args_get(j->spec, "--dump-logits");
  if (dl) MP_CHECK(dump_logits(j, dl));
  if (j->steps <= j->start_step && j->ckpt_dir && !j->resumed) /* --steps 0: the starting weights */
    MP_CHECK(save(j, j->start_step, NAN));
  for (long long s = j->start_step; s < j->steps; s++) {
    if (g_kill.on && !g_kill.point[0] && s + 1 == g_kill.step && j->rank == g_kill.rank) kill_now();
    const long long i = s - j->start_step; /* this process's index */
    step_rec sr;
    memset(&sr, 0, sizeof sr);
    MP_CHECK(run_step(j, s, i == 0, &sr));
    if (sr.r.skipped || !isfinite(sr.r.loss) || !isfinite(sr.r.grad_norm)) return diverged(j, &sr);
    const int last = s + 1 == j->steps;
    if (j->val_data && ((j->eval_every > 0 && sr.step % j->eval_every == 0) || last)) {
      MP_CHECK(eval_loss(j, j->val_data, &sr.eval));
      sr.has_eval = 1;
    }
    j->losses[i] = sr.r.loss;
    j->step_s[i] = sr.dt;
    if (i > 0) {
      j->total_s += sr.dt;
      j->tokens_all += (double)sr.r.tokens * dp;
    } else {
      j->first_tok_s = sr.tok_s;
      if (j->steps - j->start_step > 1) { /* the profile counts from the second step */
        memset(&j->kprof, 0, sizeof j->kprof);
        memset(&j->cprof, 0, sizeof j->cprof);
      }
    }
    if (sr.r.peak_bytes > j->peak) j->peak = sr.r.peak_bytes;
    if (!quiet) print_step(j, &sr);
    /* rank 0 records; with something to record (the same on every rank) the ranks agree */
    if (j->db || mp_args_has(j->spec, "--metrics"))
      MP_CHECK(mp_runtime_agree(j->ctx, j->rt, mp_train_record(j, &sr), "recording the step (--metrics, --db)"));
    if (i == 0) MP_CHECK(mp_train_record_restart(j)); /* train --elastic: the first step after a restart */
    if (j->ckpt_dir && ((j->ckpt_every > 0 && sr.step % j->ckpt_every == 0) || last)) {
      MP_CHECK(save(j, sr.step, sr.r.loss));
      /* train --elastic: a spare rejoins at this checkpoint (every rank has the variable) */
      if (!last && getenv(MP_ELASTIC_ENV_GROW)) {
        j->regrow = 1;
        j->steps = sr.step;
        break;
      }
    }
  }
  return MP_OK;
}

/* --eval-only: the eval loss of the restored weights (the checkpoint's, --init-from's or
 * the seed's) on --val-data, or on the training data without it, printed and recorded
 * as the evaluation of the step they are at. */
mp_status mp_train_eval_only(train_job *j) {
  mp_dataset *d = j->val_data ? j->val_data : j->train_data;
  const char *init = mp_args_get(j->spec, "--init-from");
  mp_talloc_reset_peak((mp_talloc *)mp_runtime_allocator(j->rt));
  eval_rec er = {j->start_step, 0, 0, j->eval_batches * j->po.global_batch * j->po.seq, 0};
  const double t0 = mp_now_s();
  MP_CHECK(eval_loss(j, d, &er.loss));
  MP_CHECK(mp_runtime_synchronize(j->ctx, j->rt));
  er.dt = mp_now_s() - t0;
  er.peak_bytes = mp_talloc_peak_total(mp_runtime_allocator(j->rt));
  if (j->rank == 0) {
    char what[MP_CKPT_PATH_MAX + 64];
    if (j->resumed)
      snprintf(what, sizeof what, "%s", j->last_ckpt);
    else if (init)
      snprintf(what, sizeof what, "--init-from %s", init);
    else
      snprintf(what, sizeof what, "the initial weights of --seed %lld", j->seed);
    printf("eval: loss %.6f of %s (step %lld) on %lld global batch%s of %s: %lld tokens in %.1f ms\n", er.loss,
           what, j->start_step, j->eval_batches, j->eval_batches == 1 ? "" : "es",
           j->val_data ? mp_args_get(j->spec, "--val-data") : j->data ? j->data : "the synthetic corpus",
           (long long)er.tokens, er.dt * 1e3);
  }
  return mp_runtime_agree(j->ctx, j->rt, mp_train_record_eval(j, &er), "recording the evaluation (--metrics, --db)");
}

/* ---- the end --------------------------------------------------------------------------- */

void mp_train_loop_release(train_job *j) {
  mp_dataset_destroy(j->train_data);
  mp_dataset_destroy(j->val_data);
  mp_ckpt_manifest_free(&j->resume_man);
  free(j->expert_routed);
  free(j->expert_dropped);
  j->train_data = j->val_data = NULL;
  j->expert_routed = j->expert_dropped = NULL;
}
