/* meshplan train's run state, shared by its files:
 *   cmd_train.c    the options, the device, the plan (given or the planner's), the
 *                  runtime, the start and summary lines, --profile
 *   train_plan_id.c --plan-id: the stored plan's mesh and settings
 *   train_elastic.c --elastic: the supervisor that launches the ranks and restarts them on
 *                  fewer after a failure (docs/runtime.md, "Elastic training")
 *   train_loop.c   what a run reads and writes around the steps: the data (training and
 *                  validation), --init-from and --resume, checkpoints, the LR schedule,
 *                  the steps with eval, divergence, the OpenMP threads of a rank
 *   train_record.c what it records: --metrics, the database's steps and run status, and
 *                  the removal of the empty files of a run that failed before its first
 *                  record */
#ifndef MP_APP_TRAIN_JOB_H
#define MP_APP_TRAIN_JOB_H

#include <stdio.h>

#include "exec/comm/comm.h"
#include "exec/mesh.h"
#include "exec/model.h"
#include "exec/plan.h"
#include "exec/runtime/ckpt.h"
#include "exec/runtime/data.h"
#include "exec/runtime/dataset.h"
#include "exec/runtime/kprof.h"
#include "exec/runtime/lr.h"
#include "exec/runtime/runtime.h"
#include "kernels/cuda/cuda.h"
#include "app/commands.h"
#include "planner/store.h"
#include "sim/sim.h"

/* The synthetic corpus's largest size, tokens (uint16: 256 MiB); a longer run wraps into
 * later epochs of it. */
#define MP_TRAIN_MAX_SYNTHETIC_TOKENS (1LL << 27)

/* What the planner chose (or predicted) for this training run. */
typedef struct train_pick {
  int found;
  mp_mesh mesh;
  int64_t plan_id;          /* 0 without a database */
  double step_time_s;       /* predicted */
  mp_candidate cand;        /* the candidate itself (its error message not kept) */
  mp_plan_settings settings; /* what it was predicted under; .stack NULL: stack[] holds it */
  char stack[64];
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

/* One training run: what the command line asks for and everything it holds until the end. */
typedef struct train_job {
  mp_ctx *ctx;
  mp_cmd_spec *spec; /* train's options, parsed */
  train_device dev;
  const mp_backend *be; /* the device's backend */
  mp_kctx kc;
  int be_up;
  mp_launch launch; /* from the environment, before MPI starts */
  const char *db;   /* --db, or NULL */
  long long plan_id;
  long long continue_run; /* the database run a resumed process goes on recording into (rank 0) */
  long long run_id;       /* the database run of plan_id, and when it was created (rank 0) */
  char run_created[32];
  mp_mesh stored_mesh;     /* --plan-id: the plan's mesh (train_plan_id.c) */
  char stored_line[512];   /* --plan-id: what the plan is, rank 0's line before the steps */
  double stored_capacity_factor; /* --plan-id: the plan's --moe-capacity-factor (0: dropless) */
  int profile, want_auto;
  int eval_only;    /* --eval-only: the restored weights' eval loss, no step */
  mp_model model;
  mp_mesh mesh;
  mp_plan_options po;
  train_pick pick; /* the planner's plan or prediction; found 0 without one */
  int mpi, rank;   /* MPI was started (it is finalized at the end); this rank */
  mp_comm *comm;
  long long steps, seed, fanout; /* steps: the run's last step (a resumed run continues to it) */
  mp_plan *plan;
  mp_runtime_options ro;
  mp_lr_schedule lr;
  mp_corpus corpus;     /* synthetic data */
  mp_dataset *train_data, *val_data;
  const char *data;     /* --data, or NULL for synthetic */
  long long eval_every, eval_batches;
  int64_t position;     /* training sequences consumed */
  long long start_step; /* steps already taken (a resumed checkpoint's) */
  int resumed;
  mp_ckpt_manifest resume_man; /* the checkpoint resumed from (its "train" state) */
  const char *ckpt_dir;
  long long ckpt_every, ckpt_keep;
  char last_ckpt[MP_CKPT_PATH_MAX]; /* the newest good checkpoint ("" none) */
  FILE *metrics;        /* --metrics, rank 0 */
  int metrics_created;  /* this run created the --metrics file */
  int db_created;       /* the --db file did not exist when the run started (rank 0) */
  int plan_recorded;    /* this process recorded the database's run of plan_id (rank 0) */
  long long n_recorded; /* steps recorded (--metrics, --db) by this process */
  double flops_per_token, peak_flops; /* MFU: model FLOPs per token, the device's peak */
  int diverged;         /* a NaN or Inf loss or gradient norm stopped the run */
  int regrow;           /* train --elastic: stopped at a checkpoint for a spare to rejoin */
  long long diverged_step;
  mp_kprof kprof;   /* --profile, rank 0: kernels and collectives */
  mp_comm_prof cprof;
  mp_backend be_prof;
  int kprof_on;
  mp_runtime *rt;
  mp_cuda_timer *timer;
  mp_store *store;
  int status_set;       /* the database's run status was set to 'running' */
  int32_t *batch;
  double *losses, *step_s; /* per step of this process (index: step - start_step - 1) */
  /* the last training step's routed-expert loads ([n_layers * n_experts], copies of
   * mp_runtime_expert_routed/_dropped taken before an eval's forward replaces them;
   * train_loop.c); NULL for a model without MoE */
  int64_t *expert_routed, *expert_dropped;
  int64_t peak, ep_rows; /* the largest rank's peak memory and expert rows received */
  double total_s, tokens_all; /* steps 2.. */
  double first_tok_s;   /* the first step's tokens/s (a one-step run's only figure) */
} train_job;

/* An evaluation's record (--eval-only): the eval loss of the weights at step. */
typedef struct eval_rec {
  long long step;
  double loss, dt;
  int64_t tokens, peak_bytes;
} eval_rec;

/* One step's record: --metrics (rank 0, one JSON line) and the database. */
typedef struct step_rec {
  long long step;
  mp_step_result r;
  double lr, dt, tok_s, eval;
  int has_eval;
} step_rec;

/* cmd_train.c, for the supervisor */
/* The request: the device, the model and plan options, and (without --auto) --mesh read and
 * checked as the ranks would. */
mp_status mp_train_read(train_job *j);
/* The plan the runtime executes on `world` ranks into j->mesh and j->pick (its predicted
 * step time): pin 1, j->mesh's own prediction; pin 0, the planner's best executable plan
 * under the options given, its micro-batch, AC and pipeline options written into j->po.
 * The global batch j->po.global_batch is kept; no plan keeping it is MP_ERR_INVALID. */
mp_status mp_train_plan_world(train_job *j, int world, int pin);

/* train_plan_id.c */
/* --plan-id: plan j->plan_id's row and run read from j->db; the model and world size checked
 * against them, the options given beside it checked against the plan, and its settings (seq,
 * batch, micro-batch, AC, float8, reshard, SP, pipeline schedule and split) written into
 * j->po, its mesh into j->stored_mesh. One-line errors naming what is wrong (exit 2). */
mp_status mp_train_stored_plan(train_job *j);
/* j->mesh = the plan's mesh; a --mesh given (mspec, with --ep) that formats otherwise is
 * refused naming both, and so is an --ep alone other than the plan's ep. */
mp_status mp_train_stored_mesh(train_job *j, const char *mspec);
/* A planner candidate's (or a stored plan's) settings the runtime trains with, into po:
 * micro-batch, AC, float8, reshard_after_forward, the pipeline's chunks (1F1B or
 * interleaved, the schedules the search enumerates) and, with pp_split, the stages' split
 * counting the embedding and the loss (0: that split does not divide the layers). */
int mp_train_take_settings(const mp_candidate *c, int64_t n_layers, mp_plan_options *po);

/* train_elastic.c */
/* train --elastic: launches, watches and restarts the ranks; returns the exit code. */
int mp_train_elastic(train_job *j, const mp_cmd_call *call);

/* train_loop.c */
/* --threads under MPI (threads.h), before the runtime; a line on rank 0. */
void mp_train_threads(train_job *j);
/* The LR schedule, weight-decay rule, checkpoint options, eval options and the experts'
 * capacity factor (into j->ro, checked against the model and device). */
mp_status mp_train_read_loop_options(train_job *j);
/* The training data (synthetic, or shards by glob) and --val-data. */
mp_status mp_train_load_data(train_job *j);
/* After the runtime exists: --resume (a checkpoint, any mesh) or else --init-from, and
 * --metrics opened. */
mp_status mp_train_restore(train_job *j);
/* The steps from start_step + 1 to steps, with eval, checkpoints, metrics, divergence. */
mp_status mp_train_steps(train_job *j, int quiet);
/* --eval-only instead of the steps: the restored weights' eval loss on --val-data (or the
 * training data), printed on rank 0 and recorded. */
mp_status mp_train_eval_only(train_job *j);
/* Frees what train_loop.c made. */
void mp_train_loop_release(train_job *j);

/* train_record.c */
/* The database run a --resume'd checkpoint recorded its steps in (its "train" state's
 * db_run_id, db_run_created_at and db_plan_id name it), when --db holds that run of this
 * model: the resumed process goes on recording into it, on any mesh. 0 otherwise (rank 0). */
long long mp_train_resumed_run(train_job *j);
/* The planner's prediction for this process (j->pick.cand) added to run continue_run as
 * this segment's plan (mp_store_add_plan); j->plan_id becomes its id. */
mp_status mp_train_db_segment(train_job *j);
/* j->run_id and j->run_created from the database's run of j->plan_id (rank 0, store open),
 * for the checkpoints' train state. */
mp_status mp_train_db_run_of_plan(train_job *j);
/* --metrics opened on rank 0: a resumed run keeps the lines up to its checkpoint's step and
 * appends; an evaluation appends its line to what is there; otherwise the file is written
 * anew. */
mp_status mp_train_metrics_open(train_job *j);
/* The step's record on rank 0: its --metrics line and its database measurement. */
mp_status mp_train_record(train_job *j, const step_rec *sr);
/* An evaluation's record on rank 0: its --metrics line ("eval_only": true) and its
 * database measurement (mp_measurement.eval_only). */
mp_status mp_train_record_eval(train_job *j, const eval_rec *er);
/* Under train --elastic, after the resumed attempt's first step (every rank calls it; rank
 * 0 acts): the restart the supervisor describes (MESHPLAN_ELASTIC_RESTART) printed, with
 * the step resumed, the steps lost and the seconds from the failure, and with --db recorded
 * in the run's restarts (mp_store_add_restart). Nothing without that variable. */
mp_status mp_train_record_restart(train_job *j);
/* The end (rank 0): the metrics file closed, and removed when this run created it and
 * failed before its first record; the database's run status ('failed' also for a run that
 * failed before it was marked running). */
void mp_train_finish(train_job *j, mp_status st);
/* After every store handle is closed: a --db file this run created is removed, with
 * SQLite's side files, when the run failed before recording a step (rank 0). */
void mp_train_remove_unused_db(const train_job *j, mp_status st);
/* --profile's table: rank 0's measured time per step by kernel class and collective group
 * beside the simulator's busy time for the same plan (pick), over `steps` steps. */
void mp_train_print_profile(const mp_kprof *kp, const mp_comm_prof *cp, long long steps, const train_pick *pick,
                            int cuda);

#endif
