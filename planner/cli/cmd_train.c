/* meshplan train: builds the plan for --model on --mesh and trains it with the runtime
 * (exec/runtime/) on the CPU backend or, with --device cuda, on one GPU per rank (the
 * CUDA backend: bf16 compute, fp32 master weights; step time from CUDA events), printing per step loss, step time, tokens/s and
 * peak memory; optionally writes the initial weights, the step-1 gradients, the losses
 * and the data used (for tests/reference/model_ref.py), and records measurements in the
 * planner's database.
 *
 * World size 1 runs without mpirun (the MPI-free "single" communicator). Under mpirun the
 * MPI communicator checks that the mesh matches the world on every rank, so a mismatch is
 * one clear error on every rank and none hangs. --auto runs the planner (executable plans,
 * CPU profile) on every rank for the world size and trains its best plan; with --db the
 * planner run and then every step's measurement are recorded, so `meshplan report` shows
 * predicted beside measured. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/json.h"
#include "common/timeutil.h"
#include "common/stats.h"
#include "exec/comm/comm.h"
#include "exec/mesh.h"
#include "exec/model.h"
#include "exec/plan.h"
#include "exec/runtime/data.h"
#include "exec/runtime/kprof.h"
#include "exec/runtime/runtime.h"
#include "exec/runtime/weights.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda.h"
#include "calib/store.h"
#include "calib/calibrate.h"
#include "planner/cli/commands.h"
#include "planner/evaluate.h"
#include "planner/planner.h"
#include "planner/search.h"
#include "planner/store.h"

static mp_opt k_opts[] = {
    {"--model", "M", "model name (data/models stem) or JSON path (default tiny-dense)", NULL},
    {"--ep", "N", "expert-parallel degree, carved out of dp_shard (the same as ep=N in --mesh; with --auto, "
     "the planner keeps it)", NULL},
    {"--mesh", "MESH", "device mesh, e.g. dp_shard=2,tp=2 (default: every dim 1)", NULL},
    {"--ac", "MODE", "activation checkpointing: none, selective or full (default none; bare --ac=full)", NULL},
    {"--fp8", NULL, "float8 Linear layers (E4M3 forward, E5M2 gradients, tensorwise scales; emulated exactly on the CPU)", NULL},
    {"--steps", "K", "training steps (default 20)", NULL},
    {"--seq", "S", "tokens per sequence (default: the model's max_seq)", NULL},
    {"--micro-batch", "B", "sequences per micro-batch per data-parallel rank (default 4)", NULL},
    {"--global-batch", "G", "sequences per step over all data-parallel ranks (default: micro-batch x dp)", NULL},
    {"--lr", "LR", "AdamW learning rate (default 1e-3)", NULL},
    {"--weight-decay", "WD", "AdamW weight decay on >= 2-D weights (default 0.1)", NULL},
    {"--clip", "NORM", "clip the global gradient norm to NORM; 0 disables (default 1.0)", NULL},
    {"--data", "SRC", "synthetic (Markov chain of known entropy) or an llm.c token shard path (default synthetic)", NULL},
    {"--fanout", "K", "successors per state of the synthetic chain (default 4)", NULL},
    {"--device", "D", "cpu or cuda (default cpu); cuda: one GPU per rank (the node-local rank's), bf16 "
     "compute with fp32 master weights and optimizer state", NULL},
    {"--gpu", "PROFILE", "cuda: the GPU profile (data/gpus stem or JSON) for the prediction, when the device's "
     "name does not identify one", NULL},
    {"--db", "PATH", "record per-step measurements in this planner database, next to the plan's prediction "
     "(without --plan-id the mesh is predicted and recorded as a one-plan run first)", NULL},
    {"--plan-id", "ID", "the plan (from meshplan plan --db) the measurements belong to", NULL},
    {"--auto", NULL, "plan for the current world size on this device's profile (CPU, or the GPU's) and train "
     "the best executable plan (--ac, --fp8, --micro-batch given constrain it)", NULL},
    {"--seed", "N", "initialization and data seed (default 1234)", NULL},
    {"--dump-weights", "PATH", "write the initial full weights (weight file, exec/runtime/weights.h)", NULL},
    {"--dump-grads", "PATH", "write the full gradients of step 1 (before clipping)", NULL},
    {"--dump-losses", "PATH", "write per-step losses as JSON", NULL},
    {"--dump-data", "PATH", "write the token corpus used, as an llm.c shard", NULL},
    {"--quiet", NULL, "print only the summary line", NULL},
    {"--profile", NULL, "time each kernel and collective of rank 0 (the device synchronized around every "
     "kernel, so the steps run slower) and print them per step by class beside the simulator's prediction "
     "of the same plan", NULL},
    {NULL, NULL, NULL, NULL},
};

static mp_cmd_spec k_spec = {
    "train", "Train a model with a plan on CPUs or GPUs (world size 1 without mpirun; mpirun for more ranks).",
    "--model M [--mesh MESH] [--ep N] [--ac MODE] [--steps K] [--seq S] [--micro-batch B] [--global-batch G] "
    "[--fp8] [--lr LR] [--data synthetic|PATH] [--device cpu|cuda] [--db PATH [--plan-id ID]] [--auto] "
    "[--seed N] [--profile] [--dump-weights PATH]",
    k_opts, 0};

/* What the planner chose (or predicted) for this training run. */
typedef struct train_pick {
  int found;
  mp_mesh mesh;
  int64_t plan_id;          /* 0 without a database */
  double step_time_s;       /* predicted */
  int64_t peak_mem_bytes;   /* predicted, with the stack's runtime overhead and fragmentation */
  int64_t alloc_peak_bytes; /* predicted peak of the allocations alone: what the tracked
                               allocator measures */
  int64_t n_candidates, n_feasible;
  int calibrated;           /* the profile carries a `meshplan calibrate` measurement */
  int calib_threads, calib_world; /* a cpu calibration's OpenMP threads and ranks */
  int have_busy;            /* --profile: the plan's rank 0 simulated with its trace */
  mp_sim_busy busy;         /* its busy time per kernel class and collective group */
  mp_sim_result busy_res;
} train_pick;

/* Where train runs: the CPU, or a GPU of the profile named gpu (data/gpus). */
typedef struct train_device {
  int cuda;
  int index;         /* CUDA device of this rank */
  char name[128];    /* the device's own name (CUDA) */
  const char *gpu;   /* GPU profile: "cpu", "h100-sxm", ... */
  const char *stack; /* stack profile of the runtime on it */
} train_device;



/* A planner run on the device's profile for `world` ranks on one node (the CPU: cluster
 * "cpu", stack meshplan-cpu, fp32 parameters as the CPU runtime keeps them; a GPU: its
 * profile, stack meshplan-cuda, fp32 masters gathered in bf16), constrained by fix and to
 * what the runtime executes. best = 1: the best feasible plan (--auto), whose options are
 * written into po; best = 0: the one candidate fix pins, feasible or not (a prediction
 * for the given mesh). db: its newest calibration of the device is applied, and with record
 * the run is recorded there (NULL: neither). want_busy: also simulate the pick with its
 * trace (out->busy, for --profile). */
static mp_status plan_for_train(mp_ctx *ctx, const mp_model *m, int world, const train_device *dev,
                                mp_plan_options *po, const mp_search_fix *fix, int best, const char *db,
                                int record, int want_busy, train_pick *out) {
  memset(out, 0, sizeof *out);
  mp_cluster c;
  MP_CHECK(mp_cluster_make(ctx, dev->gpu, world, world, &c));
  /* the newest `meshplan calibrate --device D` in the database, when there is one, read
   * once: its rates go into the profile here and its kernel fit into the stack below,
   * both from the same calibration */
  mp_calib *cal = NULL;
  if (db) {
    cal = malloc(sizeof *cal);
    MP_CHECK_ALLOC(ctx, cal);
    mp_ctx c2;
    mp_ctx_init(&c2);
    mp_status cs = mp_calib_store_load(&c2, db, dev->cuda ? "cuda" : "cpu", cal);
    if (cs == MP_OK) cs = mp_calib_apply_checked(&c2, cal, &c.gpu, &c);
    if (cs == MP_OK) {
      out->calibrated = 1;
      out->calib_threads = cal->threads;
      out->calib_world = cal->world;
    } else if (cs != MP_ERR_NOT_FOUND) {
      free(cal);
      return mp_error(ctx, cs, "%s", mp_errmsg(&c2));
    }
  }
  mp_sim_evaluator *ev = calloc(1, sizeof *ev);
  if (ev == NULL) free(cal);
  MP_CHECK_ALLOC(ctx, ev);
  mp_store *store = NULL;
  mp_planner_result res;
  memset(&res, 0, sizeof res);
  /* the stack sets the plans' memory model and dtypes (mp_stack_plan_options): meshplan-cpu
   * is the CPU runtime's fp32 layout, so the predicted peak is what its tracked allocator
   * measures; on CUDA the runtime keeps fp32 masters and gathers bf16 */
  mp_status st = mp_sim_evaluator_init(ctx, ev, m, &c, po->seq, po->global_batch, 0.05, dev->stack);
  if (st == MP_OK && dev->cuda) {
    ev->base.master_dtype = MP_DTYPE_FP32;
    ev->base.fsdp.param_dtype = MP_DTYPE_BF16;
  }
  /* the calibration's kernel fit lives in the stack (meshplan-cuda or meshplan-cpu; a cpu
   * calibration without one leaves the stated figures), relative to the peaks
   * mp_calib_load_apply wrote into the profile above (the by-shape GEMM tables, bf16 and
   * float8, must outlive the evaluator: static, one per process) */
  static mp_calib_tables gemm_tables;
  if (st == MP_OK && out->calibrated) { /* a cpu one's kernel figures at this run's sizes */
    mp_calib_run run;
    mp_calib_run_init(&run, m, fix->micro_batch > 0 ? fix->micro_batch : po->micro_batch, po->seq, fix->tp);
    st = mp_calib_apply_stack_run(ctx, cal, &run, &ev->stack, &gemm_tables);
  }
  free(cal);
  mp_planner_request req;
  memset(&req, 0, sizeof req);
  mp_search_config_init(&req.search);
  req.search.model = m;
  req.search.cluster = &c;
  req.search.seq = po->seq;
  req.search.global_batch = po->global_batch;
  req.search.executable_only = 1;
  req.search.fix = *fix;
  req.search.n_threads = 1;
  req.search.mem_capacity_bytes = (int64_t)(c.gpu.mem_gib * 0.95 * 1073741824.0);
  req.search.eval = mp_sim_evaluate;
  req.search.eval_user = ev;
  req.search.eval_thread_done = mp_sim_evaluator_thread_done;
  req.objective = MP_OBJECTIVE_TIME;
  req.info.model = m->name;
  req.info.cluster = c.name;
  req.info.gpu = c.gpu.name;
  req.info.n_gpus = world;
  req.info.gpus_per_node = world;
  req.info.seq = po->seq;
  req.info.global_batch = po->global_batch;
  req.info.objective = mp_objective_name(MP_OBJECTIVE_TIME);
  req.info.options_json = best ? "{\"source\": \"meshplan train --auto\"}" : "{\"source\": \"meshplan train --db\"}";
  req.info.command = best ? "meshplan train --auto" : "meshplan train --db";
  req.info.tool_version = MESHPLAN_VERSION;
  if (st == MP_OK && db && record) st = mp_store_open(ctx, db, &store);
  if (st == MP_OK) st = mp_planner_run(ctx, &req, store, &res);
  if (st == MP_OK) {
    const mp_candidate *pickc = NULL;
    if (best && res.n_order > 0) pickc = &res.search->cands[res.order[0]];
    if (!best)
      for (int64_t i = 0; i < res.search->n && !pickc; i++)
        if (res.search->cands[i].evaluated) pickc = &res.search->cands[i];
    out->n_candidates = res.search->n;
    out->n_feasible = res.search->n_feasible;
    if (!pickc) {
      st = best ? mp_error(ctx, MP_ERR_INVALID, "--auto: none of the %lld executable plans for %s on %d %s "
                           "rank%s fits (global batch %lld, seq %lld); lower --global-batch or --seq, or add ranks",
                           (long long)res.search->n, m->name, world, dev->cuda ? "GPU" : "CPU", world == 1 ? "" : "s",
                           (long long)po->global_batch, (long long)po->seq)
                : mp_error(ctx, MP_ERR_INVALID, "the planner could not evaluate this mesh for %s (global batch "
                           "%lld, micro-batch %lld): see `meshplan simulate` for why", m->name,
                           (long long)po->global_batch, (long long)po->micro_batch);
    } else {
      out->found = 1;
      out->mesh = pickc->mesh;
      out->plan_id = pickc->plan_id;
      out->step_time_s = pickc->res.step_time_s;
      out->peak_mem_bytes = pickc->res.peak_mem_bytes;
      out->alloc_peak_bytes = pickc->res.peak_mem_bytes - pickc->res.overhead_bytes;
      if (want_busy) {
        st = mp_sim_evaluator_busy(ctx, ev, pickc, &out->busy, &out->busy_res);
        out->have_busy = st == MP_OK;
      }
      if (best) {
        po->micro_batch = pickc->micro_batch;
        po->ac = (mp_ac_mode)pickc->ac;
        po->fp8 = pickc->fp8;
        po->fsdp.reshard_after_forward = pickc->reshard;
      }
    }
  }
  mp_planner_result_free(&res);
  mp_store_close(store);
  mp_sim_evaluator_free(ev);
  free(ev);
  return st;
}

/* One row of --profile's table: measured and predicted per step, the error where both
 * are there. */
static void profile_row(const char *name, double m_s, double m_calls, double p_s, double p_calls, int has_pred) {
  char mc[16] = "", pc[16] = ""; /* calls, left blank on the total rows (< 0) */
  if (m_calls >= 0) snprintf(mc, sizeof mc, "%.1f", m_calls);
  if (p_calls >= 0) snprintf(pc, sizeof pc, "%.1f", p_calls);
  printf("  %-24s %9s %12.3f", name, mc, m_s * 1e3);
  if (has_pred)
    printf(" %9s %12.3f", pc, p_s * 1e3);
  else
    printf(" %9s %12s", "-", "-");
  if (has_pred && m_s > 0 && p_s > 0)
    printf(" %+7.1f%%", 100.0 * (p_s - m_s) / m_s);
  printf("\n");
}

/* --profile's table: rank 0's time per step by kernel class and collective group, beside
 * the simulator's busy time of the same plan's rank 0 (both per step, kernel launch
 * overhead included). Collectives are busy time, overlapped or not. */
static void print_profile(const mp_kprof *kp, const mp_comm_prof *cp, long long steps, const train_pick *pick,
                          int cuda) {
  const int pred = pick->have_busy;
  const double n = (double)steps;
  printf("profile of rank 0, per step (mean of %lld step%s%s): each kernel timed alone%s; collectives timed on the "
         "host%s; predicted: the simulator's busy time for the same plan%s\n",
         steps, steps == 1 ? "" : "s", steps > 1 ? " after the first" : "",
         cuda ? " with the device synchronized around it (the profiled steps run slower)" : "",
         cuda ? " (NCCL: the time to enqueue them)" : "", pred ? "" : " (none: no prediction for this run)");
  printf("  %-24s %9s %12s %9s %12s %8s\n", "class", "calls", "measured ms", "calls", "predicted ms", "error");
  double mk = 0, pk = 0;
  for (int k = 0; k < MP_KPROF_COUNT; k++) {
    const int costed = k < MP_KERNEL_COUNT;
    const double ms = kp->seconds[k] / n, mc = (double)kp->calls[k] / n;
    const double ps = costed && pred ? pick->busy.kernel_s[k] : 0.0;
    const double pc = costed && pred ? (double)pick->busy.kernel_n[k] : 0.0;
    if (mc == 0 && pc == 0) continue;
    char name[48];
    snprintf(name, sizeof name, "%s%s", mp_kprof_class_name(k), costed ? "" : " (not costed)");
    profile_row(name, ms, mc, ps, pc, pred && costed);
    mk += ms;
    pk += ps;
  }
  profile_row("kernels", mk, -1, pk, -1, pred);
  double mc_all = 0, pc_all = 0;
  for (int g = 0; g < MP_GROUP_COUNT; g++) {
    const double ms = cp->seconds[g] / n, mc = (double)cp->calls[g] / n;
    const double ps = pred ? pick->busy.comm_s[g] : 0.0, pc = pred ? (double)pick->busy.comm_n[g] : 0.0;
    if (mc == 0 && pc == 0) continue;
    char name[48];
    snprintf(name, sizeof name, "collectives %s", mp_group_name((mp_group)g));
    profile_row(name, ms, mc, ps, pc, pred);
    mc_all += ms;
    pc_all += ps;
  }
  if (mc_all > 0 || pc_all > 0) profile_row("collectives", mc_all, -1, pc_all, -1, pred);
  if (pred)
    printf("  (predicted step %.3f ms: compute %.3f, optimizer %.3f, exposed communication %.3f)\n",
           pick->busy_res.step_time_s * 1e3, pick->busy_res.compute_s * 1e3, pick->busy_res.optimizer_s * 1e3,
           pick->busy_res.exposed_comm_s * 1e3);
}

int mp_cmd_train(int argc, char **argv) {
  const char *pos[1];
  int n_pos, done;
  int rc = mp_cmd_parse(&k_spec, argc, argv, pos, &n_pos, &done);
  if (done) return rc;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_status st = MP_OK;
  mp_model model;
  mp_mesh mesh;
  mp_plan *plan = NULL;
  mp_comm *comm = NULL;
  mp_runtime *rt = NULL;
  mp_store *store = NULL;
  mp_corpus corpus = {0};
  int32_t *batch = NULL;
  double *losses = NULL;
  int mpi = 0, rank = 0;
  double *step_s = NULL;
  train_pick pick;
  memset(&pick, 0, sizeof pick);
  mp_kprof kprof; /* --profile */
  mp_comm_prof cprof;
  mp_backend be_prof;
  int kprof_on = 0;
  memset(&kprof, 0, sizeof kprof);
  memset(&cprof, 0, sizeof cprof);
  mp_kctx kc = {&ctx, NULL, 0};
  const mp_backend *be = mp_backend_cpu();
  int be_up = 0;
  mp_cuda_timer *timer = NULL;
  train_device dev = {0, 0, "cpu", "cpu", "meshplan-cpu"};

  const char *device = mp_args_get(&k_spec, "--device");
  if (device && strcmp(device, "cpu") != 0) {
    if (strcmp(device, "cuda") != 0)
      return mp_cmd_fail(&ctx, mp_error(&ctx, MP_ERR_USAGE, "--device %s: choose cpu or cuda", device));
    const int n_gpus = mp_cuda_device_count();
    if (!mp_cuda_built() || n_gpus == 0)
      return mp_cmd_fail(&ctx, mp_error(&ctx, MP_ERR_UNSUPPORTED, "--device cuda: %s; use --device cpu",
                                        mp_cuda_built() ? "no CUDA device is visible (check the driver and "
                                                          "CUDA_VISIBLE_DEVICES)"
                                                        : "this meshplan was built without CUDA"));
    /* one GPU per rank: the node-local rank's, shared round-robin when ranks outnumber GPUs
     * (the comm then stages through host memory; see exec/comm) */
    const int lr = mp_comm_local_rank_from_env();
    dev.cuda = 1;
    dev.index = (lr < 0 ? 0 : lr) % n_gpus;
    dev.stack = "meshplan-cuda";
    be = mp_cuda_backend();
    mp_calib_device cd;
    mp_status ds = mp_calib_cuda_probe(&ctx, dev.index, &cd);
    if (ds != MP_OK) return mp_cmd_fail(&ctx, ds);
    snprintf(dev.name, sizeof dev.name, "%s", cd.name);
    dev.gpu = mp_args_get(&k_spec, "--gpu");
    if (!dev.gpu) dev.gpu = mp_calib_gpu_profile_for(cd.name, cd.compute_capability, cd.mem_bytes);
    if (!dev.gpu)
      return mp_cmd_fail(&ctx, mp_error(&ctx, MP_ERR_USAGE, "--device cuda: no GPU profile in data/gpus is "
                                        "known to describe \"%s\"; name one with --gpu (peak FLOP/s, memory "
                                        "and bandwidth for the prediction)", cd.name));
  }
  const char *db = mp_args_get(&k_spec, "--db");
  const int profile = mp_args_has(&k_spec, "--profile");
  long long plan_id = 0;
  MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--plan-id", 1, &plan_id), st, out);
  if (plan_id && !db) {
    st = mp_error(&ctx, MP_ERR_USAGE, "--plan-id needs --db: the database the plan lives in");
    goto out;
  }
  const int want_auto = mp_args_has(&k_spec, "--auto");
  const char *mspec = mp_args_get(&k_spec, "--mesh");
  if (want_auto && (mspec || plan_id)) {
    st = mp_error(&ctx, MP_ERR_USAGE, "--auto chooses the mesh itself: drop --mesh / --plan-id, or drop --auto");
    goto out;
  }

  const char *mname = mp_args_get(&k_spec, "--model");
  MP_CHECK_GOTO(mp_model_load(&ctx, mname ? mname : "tiny-dense", &model), st, out);
  mp_launch launch;
  mp_cmd_launch(&launch);
  const int world = launch.world, env_rank = launch.rank;

  mp_plan_options po;
  mp_plan_options_init(&po);
  /* train's defaults: the model's whole context, 4 sequences per micro-batch, one
   * micro-batch per data-parallel rank */
  po.seq = model.max_seq;
  po.micro_batch = 4;
  MP_CHECK_GOTO(mp_cmd_plan_options(&ctx, &k_spec, &po), st, out);
  const int user_mb = mp_args_has(&k_spec, "--micro-batch"), user_ac = mp_args_has(&k_spec, "--ac");
  if (want_auto) {
    /* The planner's best executable plan for this world on the CPU profile: every rank
     * plans the same (the search is deterministic), rank 0 records the run. */
    if (!po.global_batch) po.global_batch = po.micro_batch * world;
    mp_search_fix fix;
    mp_search_fix_init(&fix);
    if (user_ac) fix.ac = po.ac;
    if (po.fp8) fix.fp8 = 1;
    if (user_mb) fix.micro_batch = po.micro_batch;
    long long ep = 0;
    MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--ep", 1, &ep), st, out);
    if (ep > 0) fix.ep = (int)ep;
    MP_CHECK_GOTO(plan_for_train(&ctx, &model, world, &dev, &po, &fix, 1, env_rank == 0 ? db : NULL, 1,
                                 profile && env_rank == 0, &pick),
                  st, out);
    mesh = pick.mesh;
    plan_id = pick.plan_id;
  } else {
    if (mspec) {
      MP_CHECK_GOTO(mp_mesh_parse(&ctx, mspec, 0, &mesh), st, out);
    } else {
      mp_mesh_init(&mesh);
    }
    MP_CHECK_GOTO(mp_cmd_mesh_ep(&ctx, &k_spec, &mesh), st, out);
    MP_CHECK_GOTO(mp_mesh_validate(&ctx, &mesh), st, out);
    if (!po.global_batch) po.global_batch = po.micro_batch * mp_mesh_group_size(&mesh, MP_GROUP_DP);
    if (((db && !plan_id) || profile) && mp_mesh_world(&mesh) == world) {
      /* No plan given: predict this one (a planner run pinned to it) so the measurements
       * land next to a prediction; --profile predicts it too (recorded only when the
       * measurements have no plan of their own). */
      const int record = db && !plan_id;
      mp_search_fix fix;
      mp_search_fix_init(&fix);
      fix.pp = mesh.size[MP_DIM_PP];
      fix.dp_replicate = mesh.size[MP_DIM_DP_REPLICATE];
      fix.dp_shard = mesh.size[MP_DIM_DP_SHARD];
      fix.cp = mesh.size[MP_DIM_CP];
      fix.tp = mesh.size[MP_DIM_TP];
      fix.ep = mesh.ep;
      fix.ac = po.ac;
      fix.fp8 = po.fp8;
      /* the planner enumerates reshard only where there is an FSDP group to reshard over */
      fix.reshard = mesh.size[MP_DIM_DP_SHARD] > 1 ? po.fsdp.reshard_after_forward : 0;
      fix.micro_batch = po.micro_batch;
      MP_CHECK_GOTO(plan_for_train(&ctx, &model, world, &dev, &po, &fix, 0, env_rank == 0 ? db : NULL, record,
                                   profile && env_rank == 0, &pick),
                    st, out);
      if (record) plan_id = pick.plan_id;
    }
  }

  /* The device, then the communicator: a mesh that does not match the world fails on
   * every rank. */
  MP_CHECK_GOTO(be->init(&kc, dev.index), st, out);
  be_up = 1;
  mpi = launch.under_mpi;
  char notice[256] = "";
  /* CPU: mpi or single; CUDA: NCCL, or MPI with host staging where ranks share a GPU */
  MP_CHECK_GOTO(mp_comm_create_for_device(&ctx, &mesh, dev.cuda, be, &kc, dev.cuda ? mp_cuda_stream(&kc) : NULL,
                                          &comm, notice, sizeof notice),
                st, out);
  rank = mp_comm_world_rank(comm);
  if (rank == 0 && notice[0]) printf("note: %s\n", notice);
  const int dp = mp_comm_group_size(comm, MP_GROUP_DP), dp_index = mp_comm_group_index(comm, MP_GROUP_DP);

  long long steps = 20, seed = 1234, fanout = 4;
  MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--steps", 1, &steps), st, out);
  MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--seed", 0, &seed), st, out);
  MP_CHECK_GOTO(mp_args_int(&ctx, &k_spec, "--fanout", 1, &fanout), st, out);
  const long long seq = po.seq, mb = po.micro_batch, gb = po.global_batch;
  po.master_dtype = MP_DTYPE_FP32;
  /* the CPU runtime computes and gathers in fp32; the CUDA one gathers bf16 */
  po.fsdp.param_dtype = dev.cuda ? MP_DTYPE_BF16 : MP_DTYPE_FP32;
  MP_CHECK_GOTO(mp_build_plan(&ctx, &model, &mesh, &po, &plan), st, out);

  mp_runtime_options ro;
  mp_runtime_options_init(&ro);
  ro.seed = (uint64_t)seed;
  double d;
  d = ro.lr;
  MP_CHECK_GOTO(mp_args_double(&ctx, &k_spec, "--lr", 0, &d), st, out);
  ro.lr = (float)d;
  d = ro.weight_decay;
  MP_CHECK_GOTO(mp_args_double(&ctx, &k_spec, "--weight-decay", 0, &d), st, out);
  ro.weight_decay = (float)d;
  d = ro.max_grad_norm;
  MP_CHECK_GOTO(mp_args_double(&ctx, &k_spec, "--clip", 0, &d), st, out);
  ro.max_grad_norm = (float)d;

  /* Data: every rank builds or reads the same corpus and takes its slice per step. */
  const char *data = mp_args_get(&k_spec, "--data");
  if (!data || strcmp(data, "synthetic") == 0) {
    int64_t need = (steps * gb + 1) * seq + 1;
    if (need < (1 << 16)) need = 1 << 16;
    MP_CHECK_GOTO(mp_corpus_synthetic(&ctx, model.vocab, (int)fanout, need, (uint64_t)seed, &corpus), st, out);
  } else {
    MP_CHECK_GOTO(mp_corpus_read_shard(&ctx, data, &corpus), st, out);
    if (corpus.vocab > model.vocab) {
      st = mp_error(&ctx, MP_ERR_INVALID, "%s holds token ids up to %lld but model %s has a vocabulary of %lld",
                    data, (long long)corpus.vocab - 1, model.name, (long long)model.vocab);
      goto out;
    }
  }
  const char *dump_data = mp_args_get(&k_spec, "--dump-data");
  if (dump_data && rank == 0) MP_CHECK_GOTO(mp_corpus_write_shard(&ctx, &corpus, dump_data), st, out);
  const char *dump_w = mp_args_get(&k_spec, "--dump-weights");
  if (dump_w && rank == 0) {
    mp_wfile w;
    mp_wfile_init(&w);
    st = mp_runtime_dump_init(&ctx, plan, (uint64_t)seed, &w);
    if (st == MP_OK) st = mp_wfile_write(&ctx, &w, dump_w);
    mp_wfile_free(&w);
    if (st != MP_OK) goto out;
  }

  /* --profile: rank 0's kernels through the timing table, its collectives timed by the
   * front end; both counted from step 2 on */
  const mp_backend *be_run = be;
  if (profile && rank == 0) {
    MP_CHECK_GOTO(mp_kprof_backend(&ctx, be, &kprof, dev.cuda, &be_prof), st, out);
    kprof_on = 1;
    be_run = &be_prof;
    mp_comm_profile(comm, &cprof);
  }
  MP_CHECK_GOTO(mp_runtime_create(&ctx, plan, comm, be_run, &kc, &ro, &rt), st, out);
  if (dev.cuda) MP_CHECK_GOTO(mp_cuda_timer_create(&kc, &timer), st, out);
  if (db) MP_CHECK_GOTO(mp_store_open(&ctx, db, &store), st, out);

  const int quiet = mp_args_has(&k_spec, "--quiet");
  const int64_t lb = mp_runtime_local_batch(rt);
  batch = malloc((size_t)lb * (seq + 1) * sizeof *batch);
  losses = calloc((size_t)steps, sizeof *losses);
  if (!batch || !losses) {
    st = mp_error(&ctx, MP_ERR_NOMEM, "train: out of memory for the batch");
    goto out;
  }
  char mesh_s[128];
  mp_mesh_format(&mesh, mesh_s, sizeof mesh_s);
  if (rank == 0 && !quiet) {
    printf("train %s on mesh %s (%d rank%s), ac %s, seq %lld, micro-batch %lld, global batch %lld (%lld "
           "micro-batches), lr %g, data %s",
           model.name, mesh_s, mp_comm_world_size(comm), mp_comm_world_size(comm) == 1 ? "" : "s",
           mp_ac_mode_name(plan->ac), seq, mb, gb, (long long)mp_runtime_n_micro(rt), ro.lr,
           data ? data : "synthetic");
    if (corpus.entropy_nats >= 0) printf(" (entropy floor %.4f nats)", corpus.entropy_nats);
    printf(", float8 %s\n", plan->opts.fp8 ? "on" : "off");
    if (dev.cuda) printf("device: cuda %d (%s, profile %s), bf16 compute\n", dev.index, dev.name, dev.gpu);
  }
  if (rank == 0 && pick.found) {
    char rec[48] = " (not recorded)";
    if (pick.plan_id) snprintf(rec, sizeof rec, " (plan id %lld)", (long long)pick.plan_id);
    printf("%s%s profile) from %lld candidate%s for %d %s rank%s, %lld feasible; predicted step %.2f ms, peak "
           "%.3f MiB per rank%s\n",
           want_auto ? "auto: best executable plan (" : "prediction (", dev.stack,
           (long long)pick.n_candidates, pick.n_candidates == 1 ? "" : "s", world, dev.cuda ? "GPU" : "CPU",
           world == 1 ? "" : "s", (long long)pick.n_feasible, pick.step_time_s * 1e3,
           pick.peak_mem_bytes / 1048576.0, rec);
  }
  if (rank == 0 && pick.found && pick.calibrated && !dev.cuda &&
      (pick.calib_threads != mp_calib_threads_now() || pick.calib_world != mp_comm_world_size(comm)))
    printf("note: the calibration in %s ran %d rank%s x %d thread%s, this run %d x %d: its kernel rates and "
           "collective figures are per thread count and per ranks sharing the machine; calibrate with the "
           "same mpirun -np and OMP_NUM_THREADS for a prediction of this run\n",
           db, pick.calib_world, pick.calib_world == 1 ? "" : "s", pick.calib_threads,
           pick.calib_threads == 1 ? "" : "s", mp_comm_world_size(comm), mp_calib_threads_now());
  if (rank == 0 && pick.found && !pick.calibrated)
    printf("note: the %s profile is uncalibrated (data/gpus/%s.json, data/stacks/%s.json); run `meshplan "
           "calibrate --device %s --db %s` first for predictions of this machine\n",
           dev.cuda ? "GPU" : "CPU", dev.gpu, dev.stack, dev.cuda ? "cuda" : "cpu", db ? db : "DB");
  const char *dump_g = mp_args_get(&k_spec, "--dump-grads");
  double total_s = 0, tokens_all = 0;
  step_s = calloc((size_t)steps, sizeof *step_s);
  if (!step_s) {
    st = mp_error(&ctx, MP_ERR_NOMEM, "train: out of memory");
    goto out;
  }
  int64_t peak = 0;
  for (long long s = 0; s < steps; s++) {
    MP_CHECK_GOTO(mp_corpus_batch(&ctx, &corpus, s, gb, seq, dp_index, dp, batch), st, out);
    mp_step_result r;
    if (timer) MP_CHECK_GOTO(mp_cuda_timer_start(&kc, timer), st, out);
    double t0 = mp_now_s();
    if (s == 0 && dump_g) {
      mp_talloc_reset_peak((mp_talloc *)mp_runtime_allocator(rt));
      MP_CHECK_GOTO(mp_runtime_forward_backward(&ctx, rt, batch, &r), st, out);
      mp_wfile w;
      mp_wfile_init(&w);
      st = mp_runtime_dump(&ctx, rt, 1, &w);
      if (st == MP_OK && rank == 0) st = mp_wfile_write(&ctx, &w, dump_g);
      mp_wfile_free(&w);
      if (st != MP_OK) goto out;
      t0 = mp_now_s(); /* the dump is not part of the step's time */
      if (timer) MP_CHECK_GOTO(mp_cuda_timer_start(&kc, timer), st, out);
      MP_CHECK_GOTO(mp_runtime_optimizer_step(&ctx, rt, &r), st, out);
      MP_CHECK_GOTO(mp_runtime_synchronize(&ctx, rt), st, out);
      r.peak_bytes = mp_talloc_peak_total(mp_runtime_allocator(rt));
    } else {
      MP_CHECK_GOTO(mp_runtime_step(&ctx, rt, batch, &r), st, out);
    }
    double dt = mp_now_s() - t0;
    if (timer) MP_CHECK_GOTO(mp_cuda_timer_stop(&kc, timer, &dt), st, out); /* device time of the step */
    double tok_s = (double)r.tokens * dp / dt;
    losses[s] = r.loss;
    if (s > 0) { /* step 1 carries first-touch page faults */
      total_s += dt;
      tokens_all += (double)r.tokens * dp;
    } else if (steps > 1) { /* the profile, likewise */
      memset(&kprof, 0, sizeof kprof);
      memset(&cprof, 0, sizeof cprof);
    }
    if (r.peak_bytes > peak) peak = r.peak_bytes;
    if (rank == 0 && !quiet)
      printf("step %4lld  loss %.6f  (ce %.6f aux %.6f)  grad_norm %.4f  %.1f ms  %.0f tokens/s  peak %.3f MiB\n",
             s + 1, r.loss, r.ce_loss, r.aux_loss, r.grad_norm, dt * 1e3, tok_s, r.peak_bytes / 1048576.0);
    step_s[s] = dt;
    if (store && rank == 0 && plan_id) {
      mp_measurement me = {plan_id, s + 1, dt, r.peak_bytes, r.loss, tok_s, dev.cuda ? "cuda" : "cpu"};
      MP_CHECK_GOTO(mp_store_add_measurement(&ctx, store, &me), st, out);
    }
  }
  /* Under EP the expert-side buffers follow routing: the most rows any rank received in one
   * layer, beside the balanced count the prediction assumes (N x top_k per rank). */
  int64_t ep_rows = mp_runtime_ep_rows_max(rt);
  if (mp_comm_world_size(comm) > 1) { /* the largest rank's peak is what must fit */
    int64_t pk[2] = {peak, ep_rows};
    MP_CHECK_GOTO(mp_runtime_host_all_reduce(&ctx, rt, MP_GROUP_WORLD, pk, 2, MP_COMM_DTYPE_INT64, MP_COMM_OP_MAX),
                  st, out);
    peak = pk[0];
    ep_rows = pk[1];
  }
  if (rank == 0) {
    printf("done: %lld steps, final loss %.6f, %.0f tokens/s (steps 2..%lld), peak memory %lld bytes per rank\n",
           steps, losses[steps - 1], total_s > 0 ? tokens_all / total_s : 0.0, steps, (long long)peak);
    if (ep_rows > 0)
      printf("expert rows: at most %lld received by one rank in one MoE layer (balanced routing: %lld)\n",
             (long long)ep_rows, (long long)(mb * seq * model.top_k));
    if (pick.found) {
      /* median step time over steps 2..K (step 1 carries first-touch page faults) */
      const double med = mp_median(step_s + (steps > 1 ? 1 : 0), (size_t)(steps > 1 ? steps - 1 : 1));
      /* memory: the simulator's allocation peak against the tracked allocator's (the
       * stack's runtime overhead and fragmentation, which only the fit check adds, are
       * not allocations the runtime makes) */
      printf("predicted vs measured: step time %.2f ms vs %.2f ms (median, %+.1f%%), peak memory %.3f MiB vs "
             "%.3f MiB (%+.1f%%; %.3f MiB with the stack's runtime overhead)\n",
             pick.step_time_s * 1e3, med * 1e3, 100.0 * (pick.step_time_s - med) / med,
             pick.alloc_peak_bytes / 1048576.0, peak / 1048576.0,
             100.0 * (double)(pick.alloc_peak_bytes - peak) / (double)peak, pick.peak_mem_bytes / 1048576.0);
    }
    if (kprof_on) print_profile(&kprof, &cprof, steps > 1 ? steps - 1 : 1, &pick, dev.cuda);
  }
  const char *dump_l = mp_args_get(&k_spec, "--dump-losses");
  if (dump_l && rank == 0) {
    size_t cap = 64 + (size_t)steps * 32, n = 0;
    char *js = malloc(cap);
    if (!js) {
      st = mp_error(&ctx, MP_ERR_NOMEM, "train: out of memory");
      goto out;
    }
    n += (size_t)snprintf(js + n, cap - n, "{\"losses\": [");
    for (long long s = 0; s < steps; s++)
      n += (size_t)snprintf(js + n, cap - n, "%s%.9g", s ? ", " : "", losses[s]);
    n += (size_t)snprintf(js + n, cap - n, "]}\n");
    st = mp_write_file_atomic(&ctx, dump_l, js, n);
    free(js);
    if (st != MP_OK) goto out;
  }
out:
  free(step_s);
  mp_store_close(store);
  mp_cuda_timer_destroy(timer);
  mp_runtime_destroy(rt);
  if (kprof_on) mp_kprof_stop();
  mp_comm_destroy(comm); /* before the kernel context whose stream it orders against */
  if (be_up) be->shutdown(&kc);
  if (mpi) {
    mp_ctx c2;
    mp_ctx_init(&c2);
    mp_comm_mpi_finalize(&c2);
  }
  mp_plan_destroy(plan);
  mp_corpus_free(&corpus);
  free(batch);
  free(losses);
  if (st != MP_OK) {
    if (rank == 0 || st != MP_ERR_UNSUPPORTED) return mp_cmd_fail(&ctx, st);
    return mp_status_exit_code(st);
  }
  return 0;
}
