/* meshplan train: builds the plan for --model on --mesh and trains it with the runtime
 * (exec/runtime/) on the CPU backend or, with --device cuda, on one GPU per rank (the
 * CUDA backend: bf16 compute, fp32 master weights; step time from CUDA events), printing
 * per step loss, step time, tokens/s and peak memory; optionally writes the initial
 * weights, the step-1 gradients, the losses and the data used (for
 * tests/reference/model_ref.py), and records measurements in the planner's database.
 *
 * World size 1 runs without mpirun (the MPI-free "single" communicator). Under mpirun the
 * MPI communicator checks that the mesh matches the world on every rank, so a mismatch is
 * one clear error on every rank and none hangs. --auto runs the planner (executable plans,
 * the device's profile) on every rank for the world size and trains its best plan; with
 * --db the planner run and then every step's measurement are recorded, so `meshplan
 * report` shows predicted beside measured. --db with --plan-id trains a plan stored there
 * (its mesh and settings, train_plan_id.c), every rank reading it.
 *
 * The command runs as a sequence of steps over one train_job (run_train, train_job.h): the
 * device, the plan (given, or the planner's), the device and communicator, the runtime
 * and its data, the restore (--resume, --init-from), the steps (train_loop.c: LR
 * schedule, eval, checkpoints, metrics, divergence), the summary. Every step leaves what
 * it made in the job, and one cleanup frees it all whichever step failed. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "calib/calibrate.h"
#include "calib/store.h"
#include "common/checked.h"
#include "common/file.h"
#include "common/json.h"
#include "common/limits.h"
#include "common/stats.h"
#include "common/timeutil.h"
#include "exec/comm/comm.h"
#include "exec/mesh.h"
#include "exec/model.h"
#include "exec/plan.h"
#include "exec/runtime/check.h"
#include "exec/runtime/data.h"
#include "exec/runtime/hf.h"
#include "exec/runtime/kprof.h"
#include "exec/runtime/runtime.h"
#include "exec/runtime/weights.h"
#include "kernels/cpu/cpu.h"
#include "kernels/cuda/cuda.h"
#include "app/commands.h"
#include "planner/evaluate.h"
#include "planner/planner.h"
#include "planner/search.h"
#include "app/elastic.h"
#include "app/train_job.h"
#include "planner/store.h"

static mp_opt k_opts[] = {
    MP_OPT_MODEL("tiny-dense"),
    MP_OPT_HF_CONFIG,
    MP_OPT_EP("; with --auto, the planner keeps it"),
    MP_OPT_MESH("default: every dim 1"),
    {"--pp-schedule", "S", "pipeline schedule with pp > 1: 1f1b, interleaved (--pp-virtual chunks per stage) or "
     "gpipe (default 1f1b)", NULL},
    {"--pp-virtual", "V", "model chunks per stage under the interleaved schedule (default 2)", NULL},
    MP_OPT_PP_LAYERS,
    MP_OPT_AC(""),
    MP_OPT_FP8("; emulated exactly on the CPU"),
    {"--moe-capacity-factor", "C", "MoE: each routed expert takes at most ceil(C x tokens x top_k / experts) of "
     "a micro-batch's (token, expert) assignments on a rank and drops the rest, lowest router weight first, "
     "the dropped ones adding nothing to their token (Megatron-Core's --moe-expert-capacity-factor, drop "
     "policy probs); CPU backend (default: no capacity, dropless)", NULL},
    {"--steps", "K", "the run's last step: training steps from 0, or up to K from a resumed checkpoint; 0 runs "
     "none (with --checkpoint-dir: a checkpoint of the starting weights) (default 20)", NULL},
    MP_OPT_SEQ("the model's max_seq"),
    MP_OPT_ALLOW_LONG_SEQ,
    MP_OPT_MICRO_BATCH("4"),
    MP_OPT_GLOBAL_BATCH_ONE_MICRO,
    MP_OPT_GLOBAL_BATCH_TOKENS,
    {"--lr", "LR", "AdamW peak learning rate (default 1e-3)", NULL},
    {"--lr-schedule", "S", "constant, cosine, linear or wsd (warmup-stable-decay; formulas in docs/runtime.md; "
     "default constant)", NULL},
    {"--warmup", "N", "linear warmup over the first N steps (default 0)", NULL},
    {"--min-lr", "LR", "the learning rate cosine, linear and wsd decay to (default 0)", NULL},
    {"--decay-frac", "F", "wsd: the share of the post-warmup steps spent decaying (default 0.2)", NULL},
    {"--weight-decay", "WD", "AdamW weight decay (default 0.1) on the parameters --decay names", NULL},
    {"--decay", "RULE", "which parameters decay: 2d (every >= 2-D weight: nanoGPT, llm.c, Megatron-LM), "
     "2d-no-embed (not the embedding and head: OLMo 2) or all (torchtitan) (default 2d)", NULL},
    {"--clip", "NORM", "clip the global gradient norm to NORM; 0 disables (default 1.0)", NULL},
    {"--data", "SRC", "synthetic (Markov chain of known entropy), or token shards: a path or a glob of llm.c "
     "uint16 / uint32 .bin files (default synthetic)", NULL},
    {"--shuffle", NULL, "visit the training sequences in an order shuffled by --seed, a new order each epoch", NULL},
    {"--fanout", "K", "successors per state of the synthetic chain (default 4)", NULL},
    {"--val-data", "GLOB", "validation token shards: an eval loss every --eval-every steps and at the end", NULL},
    {"--eval-every", "N", "steps between eval losses (default 0: at the last step only)", NULL},
    {"--eval-batches", "K", "global batches of --val-data averaged per eval (default 4)", NULL},
    {"--checkpoint-dir", "D", "write checkpoints to D/step_N (sharded, mesh-independent, atomic)", NULL},
    {"--checkpoint-every", "N", "steps between checkpoints; the last step is always saved (default 0: the last "
     "step only)", NULL},
    {"--checkpoint-keep", "K", "keep the newest K checkpoints (default 3; 0: all)", NULL},
    {"--resume", "WHAT", "latest (the newest checkpoint in --checkpoint-dir; none: start at step 0), a "
     "checkpoint folder or a step folder; any mesh loads any checkpoint", NULL},
    {"--init-from", "PATH", "initial weights: a .safetensors file or a Hugging Face folder (config.json checked "
     "against --model, or the model when --model is not given)", NULL},
    {"--metrics", "PATH", "one JSON object per step (step, loss, eval_loss, lr, grad_norm, tokens_per_s, mfu, "
     "peak_mem_bytes, predicted_step_s); a resumed run keeps the lines up to its checkpoint", NULL},
    {"--device", "D", "cpu or cuda (default cpu); cuda: one GPU per rank (the node-local rank's), bf16 "
     "compute with fp32 master weights and optimizer state", NULL},
    MP_OPT_GPU_OF_DEVICE("the prediction is made for"),
    MP_OPT_DB("that records every step's measurement beside the plan's prediction (without --plan-id the "
              "mesh is predicted and recorded as a one-plan run first)"),
    {"--plan-id", "ID", "train plan ID of --db (from meshplan plan --db; meshplan report lists them): its mesh, "
     "micro-batch, AC, float8, SP, pipeline schedule, seq and global batch, for its model and world size; "
     "options given must agree with it; the measurements are recorded under it", NULL},
    {"--auto", NULL, "plan for the current world size on this device's profile (CPU, or the GPU's) and train "
     "the best executable plan (--ac, --fp8, --micro-batch given constrain it)", NULL},
    MP_OPT_SP,
    MP_OPT_NO_SP,
    {"--seed", "N", "initialization and data seed (default 1234)", NULL},
    {"--dump-weights", "PATH", "write the initial full weights (weight file, exec/runtime/weights.h)", NULL},
    {"--dump-grads", "PATH", "write the full gradients of the run's first step (before clipping)", NULL},
    {"--dump-losses", "PATH", "write per-step losses as JSON", NULL},
    {"--dump-data", "PATH", "write the token corpus used, as an llm.c shard", NULL},
    {"--dump-logits", "PATH", "write the logits of the starting weights on the run's first batch (weight file, "
     "tensor \"logits\" [sequences, seq, vocab]; one rank, CPU)", NULL},
    {"--eval-only", NULL, "run no step: print and record (--metrics, --db) the eval loss of the weights --resume "
     "or --init-from gives (else the initial ones) on --eval-batches global batches of --val-data, or of the "
     "training data without it (synthetic by default), under any --mesh", NULL},
    {"--quiet", NULL, "leave out the per-step lines (the summary, checkpoints and notes stay)", NULL},
    {"--profile", NULL, "time each kernel and collective of rank 0 (the device synchronized around every "
     "kernel, so the steps run slower) and print them per step by class beside the simulator's prediction "
     "of the same plan", NULL},
    {"--elastic", NULL, "supervise the run: launch the ranks (mpirun; srun under Slurm), and when a rank dies or "
     "stops re-plan for the ranks left, keeping the global batch, and resume from the newest checkpoint "
     "(docs/runtime.md; needs --checkpoint-dir)", NULL},
    {"--ranks", "N", "--elastic: ranks to launch first (default: the --mesh's world)", NULL},
    {"--min-ranks", "N", "--elastic: stop (exit 1) rather than go on with fewer ranks (default 1)", NULL},
    {"--max-restarts", "N", "--elastic: restarts allowed before giving up (default 3)", NULL},
    {"--spares", "N", "--elastic: ranks held in reserve: after a failure the job goes on at once with fewer, and a "
     "spare rejoins at the next checkpoint, growing it back to the best plan for the larger world (default 0)",
     NULL},
    {"--mtbf-hours", "H", "--elastic: mean time between failures of one rank, for the checkpoint interval when "
     "--checkpoint-every is not given (default 50677: Llama 3 405B's 419 interruptions in 54 days on 16,384 "
     "GPUs)", NULL},
    MP_OPT_END,
};

static mp_cmd_spec k_spec = {
    "train", "Train a model with a plan on CPUs or GPUs (world size 1 without mpirun; mpirun for more ranks).",
    "--model M [--mesh MESH [--pp-schedule 1f1b|interleaved|gpipe [--pp-virtual V]] [--pp-layers A,B,...]] [--ep N] [--ac MODE] [--steps K] [--seq S] [--micro-batch B] [--global-batch G] "
    "[--fp8] [--moe-capacity-factor C] [--sp|--no-sp] [--lr LR [--lr-schedule S --warmup N --min-lr LR]] [--data synthetic|GLOB [--val-data GLOB]] "
    "[--checkpoint-dir D [--checkpoint-every N] [--resume latest]] [--init-from PATH] [--metrics PATH] "
    "[--device cpu|cuda] [--db PATH [--plan-id ID]] [--auto] [--seed N] [--profile] [--dump-weights PATH] "
    "[--eval-only] [--elastic --ranks N [--min-ranks N] [--max-restarts N] [--spares N] [--mtbf-hours H]]",
    k_opts, 0};

/* ---- the planner's pick or prediction ---------------------------------------------------- */

#define TRAIN_HEADROOM 0.05 /* of the GPU's memory kept free: meshplan plan's default */

/* The newest `meshplan calibrate --device D` in db, read once and applied to the cluster's
 * profile (its rates); *out the calibration (malloc'd; the caller frees it) for the
 * stack's kernel fit, NULL when db holds none of the device. */
static mp_status load_calibration(mp_ctx *ctx, const char *db, const train_device *dev, mp_cluster *c,
                                  train_pick *pick, mp_calib **out) {
  *out = NULL;
  mp_calib *cal = malloc(sizeof *cal);
  MP_CHECK_ALLOC(ctx, cal);
  mp_ctx c2;
  mp_ctx_init(&c2);
  mp_status cs = mp_calib_store_load(&c2, db, dev->cuda ? "cuda" : "cpu", cal);
  if (cs == MP_OK) cs = mp_calib_apply_checked(&c2, cal, &c->gpu, c);
  if (cs == MP_OK) {
    pick->calibrated = 1;
    pick->calib_threads = cal->threads;
    pick->calib_world = cal->world;
    *out = cal;
    return MP_OK;
  }
  free(cal);
  return cs == MP_ERR_NOT_FOUND ? MP_OK : mp_error(ctx, cs, "%s", mp_errmsg(&c2));
}

/* The search for train: executable plans of m on c, one thread, constrained by fix, ev
 * as the evaluator; recorded as a run of `meshplan train --auto` (best) or `--db`. */
static void make_request(const mp_model *m, const mp_cluster *c, int world, const mp_plan_options *po,
                         const mp_search_fix *fix, int best, mp_sim_evaluator *ev, mp_planner_request *req) {
  memset(req, 0, sizeof *req);
  mp_sim_search_config(&req->search, ev, c, TRAIN_HEADROOM);
  req->search.executable_only = 1;
  req->search.fix = *fix;
  req->search.n_threads = 1;
  req->objective = MP_OBJECTIVE_TIME;
  req->info.model = m->name;
  req->info.cluster = c->name;
  req->info.gpu = c->gpu.name;
  req->info.n_gpus = world;
  req->info.gpus_per_node = world;
  req->info.seq = po->seq;
  req->info.global_batch = po->global_batch;
  req->info.objective = mp_objective_name(MP_OBJECTIVE_TIME);
  req->info.options_json = best ? "{\"source\": \"meshplan train --auto\"}" : "{\"source\": \"meshplan train --db\"}";
  req->info.command = best ? "meshplan train --auto" : "meshplan train --db";
  req->info.tool_version = MESHPLAN_VERSION;
  mp_sim_evaluator_settings(ev, &req->info.settings);
}

/* The candidate of res that train takes into *out: the best feasible one (best), or the
 * one candidate the fix pins, feasible or not. want_busy: its busy time too (--profile).
 * With best, its options go into po. */
static mp_status take_pick(mp_ctx *ctx, const mp_planner_result *res, mp_sim_evaluator *ev, const mp_model *m,
                           int world, const train_device *dev, int best, int want_busy, mp_plan_options *po,
                           train_pick *out) {
  const mp_candidate *pickc = NULL;
  if (best && res->n_order > 0) pickc = &res->search->cands[res->order[0]];
  if (!best)
    for (int64_t i = 0; i < res->search->n && !pickc; i++)
      if (res->search->cands[i].evaluated) pickc = &res->search->cands[i];
  out->n_candidates = res->search->n;
  out->n_feasible = res->search->n_feasible;
  if (!pickc)
    return best ? mp_error(ctx, MP_ERR_INVALID, "--auto: none of the %lld executable plans for %s on %d %s "
                           "rank%s fits (global batch %lld, seq %lld); lower --global-batch or --seq, or add ranks",
                           (long long)res->search->n, m->name, world, dev->cuda ? "GPU" : "CPU", world == 1 ? "" : "s",
                           (long long)po->global_batch, (long long)po->seq)
                : mp_error(ctx, MP_ERR_INVALID, "the planner could not evaluate this mesh for %s (global batch "
                           "%lld, micro-batch %lld): see `meshplan simulate` for why", m->name,
                           (long long)po->global_batch, (long long)po->micro_batch);
  out->found = 1;
  out->cand = *pickc;
  out->cand.error = NULL; /* the search's arena goes with res */
  mp_sim_evaluator_settings(ev, &out->settings);
  snprintf(out->stack, sizeof out->stack, "%s", out->settings.stack);
  out->settings.stack = NULL; /* ev's name goes with ev */
  out->mesh = pickc->mesh;
  out->plan_id = pickc->plan_id;
  out->step_time_s = pickc->res.step_time_s;
  out->peak_mem_bytes = pickc->res.peak_mem_bytes;
  out->alloc_peak_bytes = pickc->res.peak_mem_bytes - pickc->res.overhead_bytes;
  mp_status st = MP_OK;
  if (want_busy) {
    st = mp_sim_evaluator_busy(ctx, ev, pickc, &out->busy, &out->busy_res);
    out->have_busy = st == MP_OK;
  }
  if (best) mp_train_take_settings(pickc, m->n_layers, po); /* the search's split divides */
  return st;
}

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
  mp_calib *cal = NULL;
  if (db) MP_CHECK(load_calibration(ctx, db, dev, &c, out, &cal));
  mp_sim_evaluator *ev = calloc(1, sizeof *ev);
  if (ev == NULL) free(cal);
  MP_CHECK_ALLOC(ctx, ev);
  mp_store *store = NULL;
  mp_planner_result res;
  memset(&res, 0, sizeof res);
  /* the stack sets the plans' memory model and dtypes (mp_stack_plan_options): meshplan-cpu
   * is the CPU runtime's fp32 layout, so the predicted peak is what its tracked allocator
   * measures; on CUDA the runtime keeps fp32 masters and gathers bf16 */
  mp_status st = mp_sim_evaluator_init(ctx, ev, m, &c, po->seq, po->global_batch, TRAIN_HEADROOM, dev->stack);
  if (st == MP_OK) { /* GPipe: the search enumerates 1F1B and interleaved; a stated stage layout */
    ev->base.pp_schedule = po->pp_schedule;
    ev->base.n_pp_layers = po->n_pp_layers;
    memcpy(ev->base.pp_layers, po->pp_layers, sizeof po->pp_layers);
  }
  if (st == MP_OK && dev->cuda) {
    ev->base.master_dtype = MP_DTYPE_FP32;
    ev->base.fsdp.param_dtype = MP_DTYPE_BF16;
  }
  /* the calibration's kernel fit lives in the stack (meshplan-cuda or meshplan-cpu; a cpu
   * calibration without one leaves the stated figures), relative to the peaks
   * load_calibration wrote into the profile; a cpu one's kernel figures at this run's
   * sizes. The by-shape GEMM tables (bf16 and float8) must outlive the evaluator: static,
   * one per process. */
  static mp_calib_tables gemm_tables;
  if (st == MP_OK && cal) {
    mp_calib_run run;
    mp_calib_run_init(&run, m, fix->micro_batch > 0 ? fix->micro_batch : po->micro_batch, po->seq, fix->tp);
    st = mp_calib_apply_stack_run(ctx, cal, &run, &ev->stack, &gemm_tables);
  }
  free(cal);
  mp_planner_request req;
  make_request(m, &c, world, po, fix, best, ev, &req);
  if (st == MP_OK && db && record) st = mp_store_open(ctx, db, &store);
  if (st == MP_OK) st = mp_planner_run(ctx, &req, store, &res);
  if (st == MP_OK) st = take_pick(ctx, &res, ev, m, world, dev, best, want_busy, po, out);
  mp_planner_result_free(&res);
  mp_store_close(store);
  mp_sim_evaluator_free(ev);
  free(ev);
  return st;
}

/* ---- the run ------------------------------------------------------------------------------ */

/* --device: the CPU, or the node-local rank's GPU and the GPU profile of the prediction
 * (--gpu, else the one its name identifies). */
static mp_status pick_device(train_job *j) {
  mp_ctx *ctx = j->ctx;
  const char *device = mp_args_get(&k_spec, "--device");
  if (!device || strcmp(device, "cpu") == 0) return MP_OK;
  if (strcmp(device, "cuda") != 0) return mp_error(ctx, MP_ERR_USAGE, "--device %s: choose cpu or cuda", device);
  const int n_gpus = mp_cuda_device_count();
  if (!mp_cuda_built() || n_gpus == 0)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "--device cuda: %s; use --device cpu",
                    mp_cuda_built() ? "no CUDA device is visible (check the driver and CUDA_VISIBLE_DEVICES)"
                                    : "this meshplan was built without CUDA");
  /* one GPU per rank: the node-local rank's, shared round-robin when ranks outnumber GPUs
   * (the comm then stages through host memory; see exec/comm) */
  const int lr = mp_comm_local_rank_from_env();
  j->dev.cuda = 1;
  j->dev.index = (lr < 0 ? 0 : lr) % n_gpus;
  j->dev.stack = "meshplan-cuda";
  j->be = mp_cuda_backend();
  mp_calib_device cd;
  MP_CHECK(mp_calib_cuda_probe(ctx, j->dev.index, &cd));
  snprintf(j->dev.name, sizeof j->dev.name, "%s", cd.name);
  j->dev.gpu = mp_args_get(&k_spec, "--gpu");
  if (!j->dev.gpu) j->dev.gpu = mp_calib_gpu_profile_for(cd.name, cd.compute_capability, cd.mem_bytes);
  if (!j->dev.gpu)
    return mp_error(ctx, MP_ERR_USAGE, "--device cuda: no GPU profile in data/gpus is known to describe \"%s\"; "
                    "name one with --gpu (peak FLOP/s, memory and bandwidth for the prediction)", cd.name);
  return MP_OK;
}

/* --init-from a Hugging Face folder: its config.json is the model when --model is not
 * given, else it must agree with --model. */
static mp_status init_from_config(train_job *j, int model_given) {
  const char *init = mp_args_get(&k_spec, "--init-from");
  char cfg[4096];
  if (!init) return MP_OK;
  snprintf(cfg, sizeof cfg, "%s/config.json", init);
  if (access(cfg, R_OK) != 0) return MP_OK; /* a .safetensors file, or a folder without one */
  mp_model hf;
  MP_CHECK(mp_model_load(j->ctx, cfg, &hf));
  char *text = NULL;
  size_t n = 0;
  MP_CHECK(mp_read_file(j->ctx, cfg, &text, &n));
  mp_status st = mp_hf_check_rope_scaling(j->ctx, text, cfg); /* the runtime's RoPE is plain */
  free(text);
  MP_CHECK(st);
  if (!model_given) {
    j->model = hf;
    return MP_OK;
  }
  return mp_hf_check_config(j->ctx, &hf, &j->model, cfg);
}

/* --pp-schedule, --pp-virtual and --pp-layers into the plan options. */
static mp_status read_pp_schedule(train_job *j) {
  const char *ps = mp_args_get(&k_spec, "--pp-schedule");
  long long v = 0;
  MP_CHECK(mp_args_int(j->ctx, &k_spec, "--pp-virtual", 2, MP_PP_MAX_VIRTUAL, &v));
  if (ps && !mp_pp_schedule_parse(ps, &j->po.pp_schedule))
    return mp_error(j->ctx, MP_ERR_USAGE, "--pp-schedule '%s': choose 1f1b, interleaved or gpipe", ps);
  if (j->po.pp_schedule == MP_PP_DUALPIPE || mp_pp_schedule_splits_w(j->po.pp_schedule))
    /* the rule book's (exec/runtime/check.c), before a search */
    return mp_error(j->ctx, MP_ERR_USAGE, "--pp-schedule %s: the runtime does not execute it (simulate and "
                    "explain price it); choose 1f1b, interleaved or gpipe", mp_pp_schedule_name(j->po.pp_schedule));
  if (v && j->po.pp_schedule != MP_PP_INTERLEAVED)
    return mp_error(j->ctx, MP_ERR_USAGE, "--pp-virtual %lld needs --pp-schedule interleaved", v);
  j->po.pp_virtual = j->po.pp_schedule == MP_PP_INTERLEAVED ? (int)(v ? v : 2) : 1;
  const char *layers = mp_args_get(&k_spec, "--pp-layers");
  /* a stated layout belongs to the mesh it names: the search and the supervisor pick meshes */
  if (layers && (mp_args_has(&k_spec, "--auto") || mp_args_has(&k_spec, "--elastic")))
    return mp_error(j->ctx, MP_ERR_USAGE, "--pp-layers gives the stages of the mesh --mesh names; --auto and "
                    "--elastic choose the mesh themselves: drop --pp-layers or give --mesh without them");
  return mp_cmd_pp_layers(j->ctx, layers, &j->po);
}

/* The run's request: --db and --plan-id, --profile, --auto (which excludes --mesh and
 * --plan-id), the model, and the plan options over train's defaults (the model's whole
 * context, 4 sequences per micro-batch, one micro-batch per data-parallel rank), or the
 * stored plan's settings with --plan-id. */
static mp_status read_request(train_job *j) {
  mp_ctx *ctx = j->ctx;
  j->db = mp_args_get(&k_spec, "--db");
  j->profile = mp_args_has(&k_spec, "--profile");
  j->eval_only = mp_args_has(&k_spec, "--eval-only");
  MP_CHECK(mp_args_int(ctx, &k_spec, "--plan-id", 1, INT64_MAX, &j->plan_id));
  if (j->plan_id && !j->db) return mp_error(ctx, MP_ERR_USAGE, "--plan-id needs --db: the database the plan lives in");
  j->want_auto = mp_args_has(&k_spec, "--auto");
  if (j->want_auto && (mp_args_has(&k_spec, "--mesh") || j->plan_id))
    return mp_error(ctx, MP_ERR_USAGE, "--auto chooses the mesh itself: drop --mesh / --plan-id, or drop --auto");
  const int model_given = mp_args_has(&k_spec, "--model") || mp_args_has(&k_spec, "--hf-config");
  MP_CHECK(mp_cmd_load_model(ctx, &k_spec, "tiny-dense", &j->model));
  MP_CHECK(init_from_config(j, model_given));
  mp_cmd_launch(&j->launch);
  j->rank = j->launch.rank; /* the launcher's until the comm says (an early refusal is said once) */
  j->db_created = j->db && j->rank == 0 && access(j->db, F_OK) != 0;
  mp_plan_options_init(&j->po);
  j->po.seq = j->model.max_seq;
  j->po.micro_batch = 4;
  MP_CHECK(mp_cmd_plan_options(ctx, &k_spec, &j->po));
  MP_CHECK(mp_cmd_check_seq(ctx, &k_spec, &j->model, j->po.seq));
  MP_CHECK(mp_runtime_model_check(ctx, &j->model, j->po.seq));
  MP_CHECK(mp_cmd_batch_tokens(ctx, &k_spec, j->po.seq, &j->po.global_batch));
  MP_CHECK(read_pp_schedule(j));
  if (j->plan_id) MP_CHECK(mp_train_stored_plan(j)); /* the plan's settings over the defaults */
  return mp_model_check_step(ctx, &j->model, j->po.seq, j->po.micro_batch, j->po.global_batch);
}

/* --auto: the planner's best executable plan for this world on the device's profile,
 * constrained by the options given. Every rank plans the same (the search is
 * deterministic); rank 0 records the run. */
/* The search constrained by the options given (--ac, --fp8, --sp/--no-sp, --micro-batch,
 * --ep), every mesh dim free. */
static mp_status fix_of_options(train_job *j, mp_search_fix *fix) {
  mp_search_fix_init(fix);
  if (mp_args_has(&k_spec, "--ac")) fix->ac = j->po.ac, fix->ac_every = j->po.ac_every;
  if (j->po.fp8) fix->fp8 = 1;
  if (j->po.sp >= 0) fix->sp = j->po.sp;
  else if (j->po.fp8) fix->sp = 0; /* the runtime's float8 runs without SP (exec/runtime/check.c) */
  if (mp_args_has(&k_spec, "--micro-batch")) fix->micro_batch = j->po.micro_batch;
  long long ep = 0;
  MP_CHECK(mp_args_int(j->ctx, &k_spec, "--ep", 1, MP_MESH_MAX_WORLD, &ep));
  if (ep > 0) fix->ep = (int)ep;
  return MP_OK;
}

static mp_status plan_auto(train_job *j) {
  const int world = j->launch.world;
  if (!j->po.global_batch) j->po.global_batch = j->po.micro_batch * world;
  mp_search_fix fix;
  MP_CHECK(fix_of_options(j, &fix));
  const int rank0 = j->launch.rank == 0;
  if (j->db && rank0) j->continue_run = mp_train_resumed_run(j); /* see plan_given */
  MP_CHECK(plan_for_train(j->ctx, &j->model, world, &j->dev, &j->po, &fix, 1, rank0 ? j->db : NULL,
                          !j->continue_run, j->profile && rank0, &j->pick));
  j->mesh = j->pick.mesh;
  j->plan_id = j->pick.plan_id;
  j->plan_recorded = j->plan_id != 0;
  return j->continue_run ? mp_train_db_segment(j) : MP_OK;
}

/* The plan options in the runtime's dtypes (the CPU runtime computes and gathers in fp32,
 * the CUDA one gathers bf16) and memory model: the plan refuses what the runtime does not
 * run (SP, AC policies other than none, selective-core and full). */
static void runtime_options(const train_job *j, mp_plan_options *po) {
  po->master_dtype = MP_DTYPE_FP32;
  po->fsdp.param_dtype = j->dev.cuda ? MP_DTYPE_BF16 : MP_DTYPE_FP32;
  po->mem_model = j->dev.cuda ? MP_MEM_MODEL_MESHPLAN_CUDA : MP_MEM_MODEL_MESHPLAN_CPU;
}

/* A mesh given that the runtime does not execute is refused before anything is planned or
 * launched, with the runtime's own reason (exec/runtime/check.h; exit 2 from main). */
static mp_status check_executable(train_job *j) {
  mp_plan_options po = j->po;
  runtime_options(j, &po);
  mp_plan *p = NULL;
  MP_CHECK(mp_build_plan(j->ctx, &j->model, &j->mesh, &po, &p));
  mp_status st = mp_runtime_plan_check(j->ctx, p);
  mp_plan_destroy(p);
  return st;
}

/* The mesh given (--mesh, --ep). Without a plan id, --db predicts it (a planner run pinned
 * to it) so the measurements land next to a prediction; --profile predicts it too
 * (recorded only when the measurements have no plan of their own). */
/* --mesh and --ep read (with --plan-id: the plan's mesh, which a mesh given must equal),
 * checked, and refused when the runtime does not execute them; the global batch defaults to
 * one micro-batch per data-parallel rank. */
static mp_status read_mesh(train_job *j) {
  mp_ctx *ctx = j->ctx;
  const char *mspec = mp_args_get(&k_spec, "--mesh");
  if (j->plan_id) {
    MP_CHECK(mp_train_stored_mesh(j, mspec));
  } else {
    if (mspec)
      MP_CHECK(mp_mesh_parse(ctx, mspec, 0, &j->mesh));
    else
      mp_mesh_init(&j->mesh);
    MP_CHECK(mp_cmd_mesh_ep(ctx, &k_spec, &j->mesh));
  }
  MP_CHECK(mp_mesh_validate(ctx, &j->mesh));
  if (!j->po.global_batch) j->po.global_batch = j->po.micro_batch * mp_mesh_group_size(&j->mesh, MP_GROUP_DP);
  const mp_status st = check_executable(j);
  if (st != MP_OK && j->plan_id) mp_error_prefix(ctx, "plan %lld of %s", j->plan_id, j->db);
  return st;
}

/* The search pinned to j->mesh and the options given. */
static void fix_of_mesh(const train_job *j, mp_search_fix *fix) {
  const mp_plan_options *po = &j->po;
  mp_search_fix_init(fix);
  fix->pp = j->mesh.size[MP_DIM_PP];
  fix->dp_replicate = j->mesh.size[MP_DIM_DP_REPLICATE];
  fix->dp_shard = j->mesh.size[MP_DIM_DP_SHARD];
  fix->cp = j->mesh.size[MP_DIM_CP];
  fix->tp = j->mesh.size[MP_DIM_TP];
  fix->ep = j->mesh.ep;
  if (j->mesh.etp || j->mesh.ep > 1) /* the layout named */
    fix->etp = mp_mesh_grid_etp(&j->mesh);
  fix->ac = po->ac;
  fix->ac_every = po->ac_every;
  fix->fp8 = po->fp8;
  /* the planner enumerates reshard only where there is an FSDP group (dp_shard x cp) to
   * reshard over */
  fix->reshard = j->mesh.size[MP_DIM_DP_SHARD] * j->mesh.size[MP_DIM_CP] > 1 ? po->fsdp.reshard_after_forward : 0;
  fix->micro_batch = po->micro_batch;
  /* SP as mp_plan_create resolves it for the runtime's memory models (on, but off for
   * float8), or as --sp / --no-sp says */
  fix->sp = po->sp >= 0 ? po->sp : !po->fp8;
  fix->pp_virtual = po->pp_virtual;
}

static mp_status plan_given(train_job *j) {
  mp_ctx *ctx = j->ctx;
  mp_plan_options *po = &j->po;
  MP_CHECK(read_mesh(j));
  const int world = j->launch.world, rank0 = j->launch.rank == 0;
  /* a resumed run goes on recording into its checkpoint's run, on any mesh: this process's
   * plan is predicted and added to that run as the next segment's */
  if (j->db && !j->plan_id && rank0 && !j->eval_only) j->continue_run = mp_train_resumed_run(j);
  if (!((j->db && !j->plan_id) || j->profile) || mp_mesh_world(&j->mesh) != world) return MP_OK;
  const int record = j->db && !j->plan_id && !j->continue_run;
  mp_search_fix fix;
  fix_of_mesh(j, &fix);
  MP_CHECK(plan_for_train(ctx, &j->model, world, &j->dev, po, &fix, 0, rank0 ? j->db : NULL, record,
                          j->profile && rank0, &j->pick));
  if (record) j->plan_id = j->pick.plan_id;
  j->plan_recorded = record && j->plan_id;
  return j->continue_run ? mp_train_db_segment(j) : MP_OK;
}

mp_status mp_train_read(train_job *j) {
  MP_CHECK(pick_device(j));
  MP_CHECK(read_request(j));
  return j->want_auto ? MP_OK : read_mesh(j);
}

mp_status mp_train_plan_world(train_job *j, int world, int pin) {
  mp_search_fix fix;
  if (pin)
    fix_of_mesh(j, &fix);
  else
    MP_CHECK(fix_of_options(j, &fix));
  if (!j->po.global_batch) j->po.global_batch = j->po.micro_batch * world;
  /* the newest calibration in --db, when the file exists, as the ranks' own search applies */
  const char *db = j->db && access(j->db, F_OK) == 0 ? j->db : NULL;
  MP_CHECK(plan_for_train(j->ctx, &j->model, world, &j->dev, &j->po, &fix, !pin, db, 0, 0, &j->pick));
  j->mesh = j->pick.mesh;
  return MP_OK;
}

/* The device, then the communicator (CPU: mpi or single; CUDA: NCCL, or MPI with host
 * staging where ranks share a GPU): a mesh that does not match the world fails on every
 * rank. */
static mp_status open_device(train_job *j) {
  MP_CHECK(j->be->init(&j->kc, j->dev.index));
  j->be_up = 1;
  j->mpi = j->launch.under_mpi;
  char notice[256] = "";
  MP_CHECK(mp_comm_create_for_device(j->ctx, &j->mesh, j->dev.cuda, j->be, &j->kc,
                                     j->dev.cuda ? mp_cuda_stream(&j->kc) : NULL, &j->comm, notice, sizeof notice));
  j->rank = mp_comm_world_rank(j->comm);
  if (j->rank == 0 && notice[0]) printf("note: %s\n", notice);
  return MP_OK;
}

/* --steps, --seed, --fanout; the plan in the runtime's dtypes (the CPU runtime computes
 * and gathers in fp32, the CUDA one gathers bf16); the optimizer's options. */
static mp_status build_plan(train_job *j) {
  mp_ctx *ctx = j->ctx;
  j->steps = 20;
  j->seed = 1234;
  j->fanout = 4;
  MP_CHECK(mp_args_int(ctx, &k_spec, "--steps", 0, MP_LIM_STEPS, &j->steps));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--seed", 0, INT64_MAX, &j->seed));
  MP_CHECK(mp_args_int(ctx, &k_spec, "--fanout", 1, 65536, &j->fanout)); /* successors <= vocab <= 2^16 */
  runtime_options(j, &j->po);
  MP_CHECK(mp_build_plan(ctx, &j->model, &j->mesh, &j->po, &j->plan));
  mp_runtime_options_init(&j->ro);
  j->ro.seed = (uint64_t)j->seed;
  double d = j->ro.lr;
  MP_CHECK(mp_args_double(ctx, &k_spec, "--lr", 0, MP_LIM_LR, MP_RANGE_CLOSED, &d));
  j->ro.lr = (float)d;
  d = j->ro.weight_decay;
  MP_CHECK(mp_args_double(ctx, &k_spec, "--weight-decay", 0, MP_LIM_WEIGHT_DECAY, MP_RANGE_CLOSED, &d));
  j->ro.weight_decay = (float)d;
  d = j->ro.max_grad_norm;
  MP_CHECK(mp_args_double(ctx, &k_spec, "--clip", 0, MP_LIM_CLIP, MP_RANGE_CLOSED, &d));
  j->ro.max_grad_norm = (float)d;
  return mp_train_read_loop_options(j);
}

/* The data (train_loop.c), and on rank 0 --dump-data (the synthetic corpus as a shard) and
 * --dump-weights. */
static mp_status load_data(train_job *j) {
  mp_ctx *ctx = j->ctx;
  MP_CHECK(mp_train_load_data(j));
  if (j->rank != 0) return MP_OK;
  const char *dump_data = mp_args_get(&k_spec, "--dump-data");
  if (dump_data && j->train_data && !j->corpus.tokens)
    return mp_error(ctx, MP_ERR_USAGE, "--dump-data writes the synthetic corpus; the data of --data %s is already in "
                    "shards", j->data);
  if (dump_data) MP_CHECK(mp_corpus_write_shard(ctx, &j->corpus, dump_data));
  const char *dump_w = mp_args_get(&k_spec, "--dump-weights");
  if (!dump_w) return MP_OK;
  mp_wfile w;
  mp_wfile_init(&w);
  mp_status st = mp_runtime_dump_init(ctx, j->plan, (uint64_t)j->seed, &w);
  if (st == MP_OK) st = mp_wfile_write(ctx, &w, dump_w);
  mp_wfile_free(&w);
  return st;
}

/* The runtime (with --profile on rank 0: its kernels through the timing table, its
 * collectives timed by the front end; both counted from step 2 on), the step timer on
 * CUDA, the database, and the buffers of the steps. */
static mp_status create_runtime(train_job *j) {
  mp_ctx *ctx = j->ctx;
  const mp_backend *be_run = j->be;
  if (j->profile && j->rank == 0) {
    MP_CHECK(mp_kprof_backend(ctx, j->be, &j->kprof, j->dev.cuda, &j->be_prof));
    j->kprof_on = 1;
    be_run = &j->be_prof;
    mp_comm_profile(j->comm, &j->cprof);
  }
  MP_CHECK(mp_runtime_create(ctx, j->plan, j->comm, be_run, &j->kc, &j->ro, &j->rt));
  if (j->dev.cuda) MP_CHECK(mp_cuda_timer_create(&j->kc, &j->timer));
  if (j->db) MP_CHECK(mp_store_open(ctx, j->db, &j->store));
  const int64_t lb = mp_runtime_local_batch(j->rt);
  int64_t batch_elems = 0;
  if (mp_mul_i64(lb, j->po.seq + 1, &batch_elems) || batch_elems > MP_LIM_STEP_TOKENS * 2)
    return mp_error(ctx, MP_ERR_INVALID, "a local batch of %lld sequences of %lld tokens is too large to hold",
                    (long long)lb, (long long)j->po.seq);
  j->batch = malloc((size_t)batch_elems * sizeof *j->batch);
  j->losses = calloc((size_t)j->steps + 1, sizeof *j->losses);
  j->step_s = calloc((size_t)j->steps + 1, sizeof *j->step_s);
  if (!j->batch || !j->losses || !j->step_s) return mp_error(ctx, MP_ERR_NOMEM, "out of memory for the batch");
  return MP_OK;
}

/* Rank 0's lines before the steps: the run, the device, the planner's pick or prediction,
 * and what the prediction's calibration does not cover. */
static void print_start(const train_job *j, int quiet) {
  if (j->rank != 0) return;
  const train_pick *pick = &j->pick;
  const train_device *dev = &j->dev;
  const int world = j->launch.world, ranks = mp_comm_world_size(j->comm);
  if (!quiet) {
    char mesh_s[128];
    mp_mesh_format(&j->mesh, mesh_s, sizeof mesh_s);
    const long long n_micro = (long long)mp_runtime_n_micro(j->rt);
    printf("train %s on mesh %s (%d rank%s), ac %s, seq %lld, micro-batch %lld, global batch %lld (%lld "
           "micro-batch%s), lr %g, data %s",
           j->model.name, mesh_s, ranks, ranks == 1 ? "" : "s", mp_ac_mode_name(j->plan->ac),
           (long long)j->po.seq, (long long)j->po.micro_batch, (long long)j->po.global_batch, n_micro,
           n_micro == 1 ? "" : "es", j->ro.lr, j->data ? j->data : "synthetic");
    if (j->corpus.tokens && j->corpus.entropy_nats >= 0) printf(" (entropy floor %.4f nats)", j->corpus.entropy_nats);
    printf(", float8 %s", j->plan->opts.fp8 ? "on" : "off");
    if (j->ro.moe_capacity_factor > 0) printf(", expert capacity factor %g", j->ro.moe_capacity_factor);
    printf("\n");
    if (dev->cuda) printf("device: cuda %d (%s, profile %s), bf16 compute\n", dev->index, dev->name, dev->gpu);
  }
  if (j->stored_line[0]) printf("%s\n", j->stored_line);
  if (!pick->found) return;
  char rec[48] = " (not recorded)";
  if (pick->plan_id) snprintf(rec, sizeof rec, " (plan id %lld)", (long long)pick->plan_id);
  printf("%s%s profile) from %lld candidate%s for %d %s rank%s, %lld feasible; predicted step %.2f ms, peak "
         "%.3f MiB per rank%s\n",
         j->want_auto ? "auto: best executable plan (" : "prediction (", dev->stack, (long long)pick->n_candidates,
         pick->n_candidates == 1 ? "" : "s", world, dev->cuda ? "GPU" : "CPU", world == 1 ? "" : "s",
         (long long)pick->n_feasible, pick->step_time_s * 1e3, pick->peak_mem_bytes / 1048576.0, rec);
  if (pick->calibrated && !dev->cuda &&
      (pick->calib_threads != mp_calib_threads_now() || pick->calib_world != ranks))
    printf("note: the calibration in %s ran %d rank%s x %d thread%s, this run %d x %d: its kernel rates and "
           "collective figures are per thread count and per ranks sharing the machine; calibrate with the "
           "same mpirun -np and OMP_NUM_THREADS for a prediction of this run\n",
           j->db, pick->calib_world, pick->calib_world == 1 ? "" : "s", pick->calib_threads,
           pick->calib_threads == 1 ? "" : "s", ranks, mp_calib_threads_now());
  if (!pick->calibrated)
    printf("note: the %s profile is uncalibrated (data/gpus/%s.json, data/stacks/%s.json); run `meshplan "
           "calibrate --device %s --db %s` first for predictions of this machine\n",
           dev->cuda ? "GPU" : "CPU", dev->gpu, dev->stack, dev->cuda ? "cuda" : "cpu", j->db ? j->db : "DB");
}

/* The summary: the largest rank's peak (what must fit) and, under EP, the most expert rows
 * any rank received in one layer beside the balanced count the prediction assumes (N x
 * top_k per rank); on rank 0 the done line, predicted beside measured, --profile's table. */
static mp_status print_summary(train_job *j) {
  j->ep_rows = mp_runtime_ep_rows_max(j->rt);
  if (mp_comm_world_size(j->comm) > 1) {
    int64_t pk[2] = {j->peak, j->ep_rows};
    MP_CHECK(mp_runtime_host_all_reduce(j->ctx, j->rt, MP_GROUP_WORLD, pk, 2, MP_COMM_DTYPE_INT64, MP_COMM_OP_MAX));
    j->peak = pk[0];
    j->ep_rows = pk[1];
  }
  if (j->rank != 0) return MP_OK;
  const long long steps = j->steps - j->start_step; /* run by this process */
  const int64_t peak = j->peak;
  if (steps <= 0 && j->resumed) {
    printf("done: %s is at step %lld and --steps is %lld: no step to run (train --eval-only evaluates it)\n",
           j->last_ckpt, j->start_step, j->steps);
    return MP_OK;
  }
  if (steps <= 0) {
    printf("done: --steps 0: no step run%s%s\n", j->last_ckpt[0] ? "; the starting weights are " : "", j->last_ckpt);
    return MP_OK;
  }
  /* tokens/s from the second step on (the first carries first-touch page faults); a run of
   * one step has only that one */
  char rate[96];
  if (j->total_s > 0)
    snprintf(rate, sizeof rate, "%.0f tokens/s (from the second)", j->tokens_all / j->total_s);
  else
    snprintf(rate, sizeof rate, "%.0f tokens/s (its one step, first-touch costs included)", j->first_tok_s);
  printf("done: %lld step%s (%lld..%lld), final loss %.6f, %s, peak memory %lld bytes per rank\n", steps,
         steps == 1 ? "" : "s", j->start_step + 1, j->steps, j->losses[steps - 1], rate, (long long)peak);
  if (j->ep_rows > 0) { /* balanced: the tokens a rank routes (its sequence shard under the expert grid) x top_k */
    const int64_t routed = j->po.micro_batch * j->po.seq / (mp_mesh_expert_grid(&j->mesh) ? j->mesh.size[MP_DIM_TP] : 1);
    printf("expert rows: at most %lld received by one rank in one MoE layer (balanced routing: %lld)\n",
           (long long)j->ep_rows, (long long)(routed * j->model.top_k));
  }
  const train_pick *pick = &j->pick;
  if (pick->found) {
    /* median step time over steps 2..K (step 1 carries first-touch page faults) */
    const double med = mp_median(j->step_s + (steps > 1 ? 1 : 0), (size_t)(steps > 1 ? steps - 1 : 1));
    /* memory: the simulator's allocation peak against the tracked allocator's (the
     * stack's runtime overhead and fragmentation, which only the fit check adds, are
     * not allocations the runtime makes) */
    printf("predicted vs measured: step time %.2f ms vs %.2f ms (median, %+.1f%%), peak memory %.3f MiB vs "
           "%.3f MiB (%+.1f%%; %.3f MiB with the stack's runtime overhead)\n",
           pick->step_time_s * 1e3, med * 1e3, 100.0 * (pick->step_time_s - med) / med,
           pick->alloc_peak_bytes / 1048576.0, peak / 1048576.0,
           100.0 * (double)(pick->alloc_peak_bytes - peak) / (double)peak, pick->peak_mem_bytes / 1048576.0);
  }
  if (j->kprof_on) mp_train_print_profile(&j->kprof, &j->cprof, steps > 1 ? steps - 1 : 1, pick, j->dev.cuda);
  return MP_OK;
}

/* --dump-losses (rank 0): {"losses": [...]} */
static mp_status dump_losses(train_job *j) {
  const char *dump_l = mp_args_get(&k_spec, "--dump-losses");
  if (!dump_l || j->rank != 0) return MP_OK;
  const long long steps = j->steps > j->start_step ? j->steps - j->start_step : 0;
  size_t cap = 64 + (size_t)steps * 32, n = 0;
  char *js = malloc(cap);
  if (!js) return mp_error(j->ctx, MP_ERR_NOMEM, "out of memory");
  n += (size_t)snprintf(js + n, cap - n, "{\"losses\": [");
  for (long long s = 0; s < steps; s++) n += (size_t)snprintf(js + n, cap - n, "%s%.9g", s ? ", " : "", j->losses[s]);
  n += (size_t)snprintf(js + n, cap - n, "]}\n");
  mp_status st = mp_write_file_atomic(j->ctx, dump_l, js, n);
  free(js);
  return st;
}

/* Everything the steps of run_train made, in reverse. */
static void release(train_job *j) {
  free(j->step_s);
  mp_train_loop_release(j);
  mp_store_close(j->store);
  mp_cuda_timer_destroy(j->timer);
  mp_runtime_destroy(j->rt);
  if (j->kprof_on) mp_kprof_stop();
  mp_comm_destroy(j->comm); /* before the kernel context whose stream it orders against */
  if (j->be_up) j->be->shutdown(&j->kc);
  if (j->mpi) {
    mp_ctx c2;
    mp_ctx_init(&c2);
    mp_comm_mpi_finalize(&c2);
  }
  mp_plan_destroy(j->plan);
  mp_corpus_free(&j->corpus);
  free(j->batch);
  free(j->losses);
}

static mp_status train(train_job *j) {
  MP_CHECK(pick_device(j));
  MP_CHECK(read_request(j));
  MP_CHECK(j->want_auto ? plan_auto(j) : plan_given(j));
  MP_CHECK(open_device(j));
  MP_CHECK(build_plan(j));
  MP_CHECK(load_data(j));
  if (!j->dev.cuda) mp_train_threads(j);
  MP_CHECK(create_runtime(j));
  const int quiet = mp_args_has(&k_spec, "--quiet");
  print_start(j, quiet);
  MP_CHECK(mp_train_restore(j));
  if (j->eval_only) return mp_train_eval_only(j); /* an evaluation is its own database run */
  MP_CHECK(mp_train_steps(j, quiet));
  MP_CHECK(print_summary(j));
  return dump_losses(j);
}

static int run_train(mp_ctx *ctx, const mp_cmd_call *call) {
  train_job *j = calloc(1, sizeof *j);
  if (j == NULL) return mp_cmd_fail(ctx, mp_error(ctx, MP_ERR_NOMEM, "out of memory"));
  j->ctx = ctx;
  j->spec = &k_spec;
  j->kc = (mp_kctx){ctx, NULL, 0};
  j->be = mp_backend_cpu();
  j->dev = (train_device){0, 0, "cpu", "cpu", "meshplan-cpu"};
  if (mp_args_has(&k_spec, "--elastic")) { /* the supervisor: it launches the ranks (train_elastic.c) */
    const int code = mp_train_elastic(j, call);
    free(j);
    return code;
  }
  /* a supervised rank: its lines reach the supervisor as they are printed */
  if (getenv(MP_ELASTIC_ENV_ATTEMPT)) setvbuf(stdout, NULL, _IOLBF, 0);
  mp_status st = train(j);
  mp_train_finish(j, st);
  /* a stuck or dead peer: the job ends here (MPI_Finalize in release would wait for it) */
  if (j->launch.under_mpi && (st == MP_ERR_TIMEOUT || st == MP_ERR_MPI || st == MP_ERR_NCCL)) {
    const int code = mp_cmd_fail_job(ctx, st, 1);
    release(j);
    free(j);
    return code;
  }
  /* The reason is printed before release: its MPI_Finalize synchronizes the ranks (Open
   * MPI fences in it), so a rank that exits non-zero without a word, which makes mpirun
   * abort the job, does so only once rank 0 has said why. */
  const int rank = j->rank;
  int code = 0;
  if (st != MP_OK && j->diverged) { /* every rank saw the same loss: rank 0 says it, exit 1 */
    if (rank == 0) mp_cmd_fail(ctx, st);
    code = 1;
  } else if (st != MP_OK) { /* an unsupported request is every rank's: rank 0 says it once */
    code = rank == 0 || st != MP_ERR_UNSUPPORTED ? mp_cmd_fail(ctx, st) : mp_status_exit_code(st);
  } else if (j->regrow) { /* the supervisor relaunches on more ranks from this checkpoint */
    if (rank == 0) printf("elastic: stopped at step %lld's checkpoint for a spare to rejoin\n", j->steps);
    code = MP_ELASTIC_EXIT_REGROW;
  }
  release(j);
  mp_train_remove_unused_db(j, st);
  free(j);
  return code;
}

const mp_command mp_command_train = {&k_spec, "train with a plan on CPUs (MPI) or GPUs (NCCL)", run_train};
