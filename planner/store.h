/* The planner's SQLite store: every run, every candidate with its reason, every
 * prediction, and the executor's measurements, in one database file (default meshplan.db).
 *
 * Tables (schema version 11, created and altered by the migrations of store/db.c;
 * `schema_version` holds the version, and opening a file of a lower version migrates it in
 * order inside one transaction; the plans(run_id, rank)
 * index is partial, WHERE rank IS NOT NULL: only ranked plans are looked up by rank, so a
 * run's hundreds of thousands of unranked rows pay no index insert):
 *   runs          what was asked (model, cluster, GPUs, seq, batch, objective, options as
 *                 JSON, command line), when, tool version, and the run's counts
 *   plans         one row per candidate logged (the ranked ones: `plan`'s default; every
 *                 one: `plan --log-all`, train's runs, runs before version 6): every mesh
 *                 dim, ep, etp, dopt, ac, fp8, micro_batch,
 *                 reshard, evaluated, feasible, rank (objective order, NULL when not
 *                 ranked), reject_rule (mp_reject_name) and reject_reason (the sentence);
 *                 a training run resumed by another process adds that process's plan,
 *                 unranked (mp_store_add_plan): the run's segments
 *   predictions   one row per evaluated candidate (plan_id = plans.id): step time,
 *                 tokens/s/GPU, MFU, peak memory, capacity and the breakdown at the peak,
 *                 compute / exposed communication / bubble / optimizer seconds
 *   measurements  filled by the executor (mp_store_add_measurement): per plan and step,
 *                 with the step's learning rate, gradient norm and eval loss (version 3);
 *                 an evaluation (`train --eval-only`) is a row whose loss is NULL
 *   rejections    per run and rule (mp_reject_name) the candidates it rejected (version 6)
 *   restarts      per training run, each restart of `meshplan train --elastic` (version 7):
 *                 the attempt (1, 2, ...), the plan and mesh that failed (old_plan_id NULL
 *                 when the failed process recorded none) and the plan and mesh resumed on,
 *                 why (reason), the last step the failed attempt completed
 *                 (failed_after_step), the checkpoint's step it resumed from (step_resumed),
 *                 the steps lost between them, and the seconds from the failure to the first
 *                 step completed after it (recover_s); written by the resumed process's
 *                 rank 0 after that step (mp_store_add_restart)
 *   expert_loads  per training step, MoE layer and routed expert (version 9): the
 *                 (token, expert) assignments the router made to the expert (routed, before
 *                 any drop) and those dropped over its capacity (train
 *                 --moe-capacity-factor; 0 without), summed over the step's micro-batches
 *                 and the ranks that route distinct tokens (mp_store_add_expert_loads)
 * Version 3 adds runs.train_status: NULL for a planner run (complete once committed: a run
 * is one transaction); for a run that `meshplan train --db` measures, 'running' from its
 * start, then 'complete' or 'diverged' (a NaN or Inf loss or gradient norm stopped it) or
 * 'failed'; a process killed on the way leaves 'running', which reads as incomplete.
 * Version 4 adds plans.sp (sequence parallelism with tp) and plans.pp_virtual (model
 * chunks per pipeline stage); plans.ac holds the AC policy as the CLI names it (full:N
 * included). Version 5 adds plans.global_batch: the plan's own sequences per step, the
 * batch rule's target (runs.global_batch) rounded to a multiple of its data-parallel size
 * (planner/batch.h), which plans.micro_batch divides into micro-batches per rank; NULL on
 * rows written before version 5. Version 6 adds the rejections table and runs.logged: 'ranked'
 * (`plan`'s default, mp_planner_request.ranked_only: the ranked plans' rows, every candidate counted
 * in rejections and the runs row) or 'all' (`plan --log-all`, and train's small searches:
 * every candidate's row with its reason); NULL on the runs written before, which logged every
 * candidate (their counts are read from their plans rows). A 405B search on 16,384 GPUs
 * enumerates 178,590 candidates and ranks about 3,000: logging them all made a database of
 * 30 MB per run. Version 8 adds plans.pp_split: 1 where the embedding and the loss count as
 * a layer each in the pipeline's split (Megatron-LM's --account-for-embedding-in-pipeline-split
 * and --account-for-loss-in-pipeline-split, exec/plan.h mp_pp_layout_embedding_loss), 0
 * otherwise and on the rows written before. Version 10 adds plans.etp and plans.dopt, the
 * rest of the mesh (exec/mesh.h's mp_mesh.etp and .dopt, same encoding): etp 0 where etp was
 * not given (ep inside dp_shard when ep divides it, else the expert grid with experts whole on
 * a rank), N >= 1 the experts' own grid with each local expert split over N ranks (etp=1 on
 * the grid: whole on a rank); dopt 1 one distributed-optimizer instance, N > 1 dp_replicate
 * cut into N instances (Megatron-Core's --num-distributed-optimizer-instances). The rows
 * written before read etp 0 and dopt 1: the layouts those versions could record.
 * mp_plan_row_mesh and mp_run_segment_mesh turn a row back into the mesh it was written
 * from (mp_mesh_format of the two equal). Version 11 adds the settings a plan was predicted
 * under that are not the candidate's own fields (mp_plan_settings): plans.stack (the stack
 * profile's name), plans.loss_chunks (torchtitan's chunked loss, --loss-chunks; 1: off),
 * plans.nccl_version (--nccl-version as major x 10000 + minor x 100 + patch; 0: the newest
 * NCCL the build models, sim/sim.h), plans.moe_imbalance (--moe-imbalance; 1: balanced) and
 * plans.moe_capacity_factor (--moe-capacity-factor; 0: dropless) and, on a float8 plan,
 * plans.fp8_recipe (the recipe its float8 Linears run, the stack's default resolved; NULL on
 * a bf16 plan), and plans.mtp_layers (the model's multi-token-prediction modules, which
 * --mtp-num-layers sets beside the model's name). The rows written before take them from their
 * run's options where the run gave them (store/db.c's migration); otherwise 1, 0, 1, 0, NULL
 * (stack not recorded, read as ""), NULL (recipe not recorded) and NULL (MTP not recorded,
 * read as -1).
 * Not stored as columns (runs.options keeps them as given, as JSON; no reader re-applies
 * them): --headroom (the capacity is stored with the prediction),
 * --nvlink-domain and --inter-gbps, --hf-config (the model is stored by name), and the
 * stack's switches --cp-rotate/--cp-comm-type,
 * --data-parallel-sharding-strategy, --fsdp-double-buffer, --fp8-param-gather,
 * --nvfp4-no-rht, --fp8-dpa, --fp8-amax-tp-only, --fp8-all-gather, --fp8-scope,
 * --async-tp/--no-async-tp, --moe-pad-expert-input-to-capacity,
 * --moe-expert-rank-capacity-factor, --moe-dispatcher and --nccl-ctas.
 *
 * The file itself (opening, the identity check and its refusals, the migrations that
 * create these tables, WAL, the busy timeout and the write lock) is store/db.h's;
 * mp_store_open refuses what mp_db_open refuses, with the same messages.
 *
 * Concurrency: every write transaction starts with BEGIN IMMEDIATE (mp_db_begin_write),
 * repeated while other writers hold the lock for up to MP_STORE_WRITE_WAIT_S, so a second
 * planner waits for the first instead of failing. Writers hold the lock briefly: the
 * planner computes a whole search before it opens the run's transaction (planner.h), so
 * the lock covers the writing, not the search.
 * Atomicity: a run (its runs row, plans, predictions) is one transaction;
 * mp_store_run_abort or any failure rolls it back, leaving earlier runs intact and no
 * partial run. */
#ifndef MP_PLANNER_STORE_H
#define MP_PLANNER_STORE_H

#include <stdint.h>

#include "common/arena.h"
#include "common/status.h"
#include "planner/search.h"
#include "store/db.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_store mp_store;

/* Opens (creating when absent) and migrates the database: mp_db_open (store/db.h), its
 * refusals included, then prepares this module's statements. */
mp_status mp_store_open(mp_ctx *ctx, const char *path, mp_store **out);
void mp_store_close(mp_store *st); /* NULL is a no-op; rolls back an open run */
const char *mp_store_path(const mp_store *st);

/* The settings a plan's prediction was made under beyond its candidate's fields (version
 * 11): the same for every candidate of one search, written on each plans row. */
typedef struct mp_plan_settings {
  const char *stack; /* the stack profile's name (mp_stack_profile.name) */
  int loss_chunks;   /* torchtitan's ChunkedLossWrapper num_chunks (exec/plan.h); <= 1: off */
  int nccl_version;  /* mp_stack_profile.nccl_version: 0 the newest NCCL the build models */
  double moe_imbalance;       /* mp_moe_routing.imbalance (--moe-imbalance); <= 1: balanced */
  double moe_capacity_factor; /* mp_moe_routing.capacity_factor (--moe-capacity-factor); <= 0:
                                 dropless */
  const char *fp8_recipe;     /* the float8 candidates' recipe (mp_fp8_recipe_name of
                                 mp_fp8_recipe_of: the stack's default resolved); NULL: none.
                                 Written on the rows with float8 only */
  int mtp_layers;             /* the model's multi-token-prediction modules (mp_model.mtp_layers,
                                 --mtp-num-layers): the model is stored by name only */
} mp_plan_settings;

/* What a run asked for. */
typedef struct mp_run_info {
  const char *model, *cluster, *gpu;
  int n_gpus, gpus_per_node;
  int64_t seq, global_batch;
  const char *objective;
  const char *options_json; /* every option as given, JSON text */
  const char *command;      /* the command line */
  const char *tool_version; /* MESHPLAN_VERSION */
  mp_plan_settings settings; /* every candidate's (mp_sim_evaluator_settings) */
} mp_run_info;

typedef struct mp_run_summary {
  int64_t n_candidates, n_pruned, n_evaluated, n_feasible;
  int64_t best_plan_id; /* 0: none */
  double wall_s;
} mp_run_summary;

/* BEGIN IMMEDIATE and insert the runs row; info->settings go on every plans row the run
 * writes (mp_store_add_candidate). */
mp_status mp_store_run_begin(mp_ctx *ctx, mp_store *st, const mp_run_info *info,
                             int64_t *run_id);
/* Inserts the candidate's plans row (and predictions row when evaluated); sets
 * c->plan_id. reason is the reject sentence ("" when none). */
mp_status mp_store_add_candidate(mp_ctx *ctx, mp_store *st, int64_t run_id, int64_t index,
                                 mp_candidate *c, const char *reason);
mp_status mp_store_set_rank(mp_ctx *ctx, mp_store *st, int64_t plan_id, int64_t rank);
/* Records in the open run which candidates it logged: ranked_only 1 "ranked", 0 "all" (a run
 * that never says reads as "all"). */
mp_status mp_store_set_logged(mp_ctx *ctx, mp_store *st, int64_t run_id, int ranked_only);
/* The run's rejection counts by rule (by[r] candidates rejected by rule r; the rules with a
 * count of 0, and by[MP_REJECT_NONE], are not written). In the open run. */
mp_status mp_store_add_rejections(mp_ctx *ctx, mp_store *st, int64_t run_id, const int64_t by[MP_REJECT_COUNT]);
/* Updates the runs row with the summary and commits. */
mp_status mp_store_run_commit(mp_ctx *ctx, mp_store *st, int64_t run_id,
                              const mp_run_summary *sum);
/* Rolls the open run back (no-op when none is open). */
void mp_store_run_abort(mp_store *st);

/* Adds c (evaluated or not) to the existing run run_id as an unranked plan with its
 * prediction, in its own transaction; sets c->plan_id. A training run resumed by another
 * process (on any mesh) records that process's plan so: one run keeps one history, each
 * segment under its own plan. MP_ERR_NOT_FOUND when the run does not exist. */
mp_status mp_store_add_plan(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_candidate *c,
                            const mp_plan_settings *settings);

/* Fault injection for tests: the (n+1)-th mp_store_add_candidate after this call fails
 * with MP_ERR_DB ("injected fault"); n < 0 turns it off. */
void mp_store_inject_fault_after(mp_store *st, int64_t n);

/* One measured step of a plan, from the executor. */
typedef struct mp_measurement {
  int64_t plan_id;
  int64_t step;
  double step_time_s;
  int64_t peak_mem_bytes;
  double loss;
  double tokens_per_s;
  const char *device; /* "NVIDIA H100 80GB HBM3", "cpu" */
  int has_eval;       /* eval_loss holds this step's validation loss */
  double eval_loss;
  double lr;          /* the step's learning rate */
  double grad_norm;   /* its global gradient norm before clipping */
  int eval_only;      /* `train --eval-only`: eval_loss of the weights at `step`, no step
                         run (loss, lr and grad_norm are stored NULL; step_time_s and
                         tokens_per_s are the eval's) */
} mp_measurement;
/* Inserts a measurement (its own transaction); the plan must exist. */
mp_status mp_store_add_measurement(mp_ctx *ctx, mp_store *st, const mp_measurement *m);

/* A training run's state (see the tables above): 'running', 'complete', 'diverged' or
 * 'failed', set on the run that holds plan_id (its own transaction). */
mp_status mp_store_set_train_status(mp_ctx *ctx, mp_store *st, int64_t plan_id, const char *status);

/* One restart of an elastic training run (the restarts table). */
typedef struct mp_restart_row {
  int64_t run_id, attempt;
  int64_t old_plan_id; /* 0: unknown (stored NULL) */
  int64_t new_plan_id;
  char old_mesh[64], new_mesh[64], reason[128];
  int64_t failed_after_step, step_resumed, steps_lost;
  double recover_s;
} mp_restart_row;
/* Inserts r (its own transaction); the run and new_plan_id must exist. */
mp_status mp_store_add_restart(mp_ctx *ctx, mp_store *st, const mp_restart_row *r);
/* The run's restarts in the order recorded (arena-owned array; *n 0 when none). */
mp_status mp_store_run_restarts(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_arena *a, mp_restart_row **rows,
                                int64_t *n);

/* One training step's routed-expert loads (the expert_loads table): routed[l * n_experts
 * + e] and dropped[...] for each layer l with moe_layer[l] set. */
typedef struct mp_expert_loads {
  int64_t plan_id, step;
  int n_layers, n_experts;
  const int *moe_layer;          /* [n_layers] */
  const int64_t *routed, *dropped; /* [n_layers * n_experts] */
} mp_expert_loads;
/* Inserts the step's rows (one transaction; a step recorded again by the same plan replaces
 * its rows); the plan must exist. */
mp_status mp_store_add_expert_loads(mp_ctx *ctx, mp_store *st, const mp_expert_loads *x);
/* One row of expert_loads. */
typedef struct mp_expert_load_row {
  int64_t step;
  int layer, expert;
  int64_t routed, dropped;
} mp_expert_load_row;
/* The run's expert loads (arena-owned array) by layer, step and expert; a step recorded by
 * several of the run's plans (a resumed run) is its newest plan's. *n 0 when none. */
mp_status mp_store_run_expert_loads(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_arena *a,
                                    mp_expert_load_row **rows, int64_t *n);

/* ---- reading (for `meshplan report` and tests) ---- */
typedef struct mp_run_row {
  int64_t id;
  char created_at[32], model[96], cluster[64], gpu[64], objective[32], tool_version[32];
  int n_gpus;
  int64_t seq, global_batch;
  int64_t n_candidates, n_pruned, n_evaluated, n_feasible, best_plan_id;
  double wall_s;
  double best_step_time_s; /* 0 when no feasible plan */
  char status[16];         /* complete, diverged, incomplete (killed or still running), failed */
  char logged[8];          /* the candidates with a plans row: "ranked" or "all" (before v6) */
} mp_run_row;

typedef struct mp_plan_row {
  int64_t id, run_id, index, rank;
  int pp, dp_replicate, dp_shard, cp, tp, ep, ac, fp8, reshard, evaluated, feasible;
  int ac_every, sp, pp_virtual, pp_split;
  int etp, dopt; /* mp_mesh.etp and .dopt (version 10; rows written before: 0 and 1) */
  int loss_chunks, nccl_version; /* mp_plan_settings's (version 11; before: see above) */
  double moe_imbalance, moe_capacity_factor;
  char stack[64];                /* the stack profile's name; "": not recorded */
  char fp8_recipe[16];           /* a float8 plan's recipe (mp_fp8_recipe_name); "": bf16, or
                                    not recorded */
  int mtp_layers;                /* the model's MTP modules; -1: not recorded */
  int64_t micro_batch;
  int64_t global_batch; /* the plan's own sequences per step; 0: not recorded (before v5) */
  char reject_rule[32], reject_reason[256];
  double step_time_s, tokens_per_s_per_gpu, mfu, compute_s, exposed_comm_s, bubble_s;
  int64_t peak_mem_bytes, capacity_bytes;
  int64_t alloc_peak_bytes; /* peak_mem_bytes less the stack's runtime overhead and
                               fragmentation: what a run's tracked allocator measures */
  /* measurements (n_measured == 0: none): median step time over the steps, largest peak */
  int64_t n_measured;
  double measured_step_time_s;
  int64_t measured_peak_mem_bytes;
  double measured_tokens_per_s;
} mp_plan_row;

/* All runs, newest first (arena-owned array). */
mp_status mp_store_list_runs(mp_ctx *ctx, mp_store *st, mp_arena *a, mp_run_row **rows,
                             int64_t *n);
/* MP_ERR_NOT_FOUND when the run does not exist. */
mp_status mp_store_get_run(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_run_row *out);
/* Plan plan_id's row and its prediction (0s when it has none), measured figures 0; rank 0
 * when unranked. MP_ERR_NOT_FOUND naming the database when the plan does not exist. */
mp_status mp_store_get_plan(mp_ctx *ctx, mp_store *st, int64_t plan_id, mp_plan_row *out);
/* A run's ranked plans, rank order, at most k (k <= 0: all). */
mp_status mp_store_top_plans(mp_ctx *ctx, mp_store *st, int64_t run_id, int64_t k, mp_arena *a,
                             mp_plan_row **rows, int64_t *n);
/* One measured step of a run, in the order recorded. */
typedef struct mp_step_row {
  int64_t plan_id, step;
  double loss, tokens_per_s, step_time_s, lr, grad_norm;
  int has_eval;
  double eval_loss;
  int has_loss; /* 0: an evaluation's record (mp_measurement.eval_only) */
} mp_step_row;
/* The run's measured steps (arena-owned array) by step, whichever of the run's plans
 * recorded them; a step measured twice (a resumed training run repeats the steps after its
 * checkpoint, on the same mesh or another) is its last record. */
mp_status mp_store_run_steps(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_arena *a, mp_step_row **rows,
                             int64_t *n);
/* One segment of a training run: the steps one plan of the run recorded (the run's first
 * process, then each resumed one, in the order they recorded). */
typedef struct mp_run_segment {
  int64_t plan_id;
  int pp, dp_replicate, dp_shard, cp, tp, ep;
  int etp, dopt; /* as mp_plan_row's */
  int64_t micro_batch;
  int64_t first_step, last_step, n_steps;
} mp_run_segment;
/* The run's segments (arena-owned array), in the order of their first record. */
mp_status mp_store_run_segments(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_arena *a, mp_run_segment **rows,
                                int64_t *n);
/* The mesh a plans row was written from: every dim, ep, etp and dopt (mp_mesh_format of it
 * equals that of the candidate's mesh). */
void mp_plan_row_mesh(const mp_plan_row *r, mp_mesh *m);
void mp_run_segment_mesh(const mp_run_segment *r, mp_mesh *m);

/* A run's rejection counts by rule into by (by[MP_REJECT_NONE]: its ranked plans): from the
 * rejections table, or for a run written before version 6 from its plans rows. A rule name
 * this build does not know is not counted. MP_ERR_NOT_FOUND when the run does not exist. */
mp_status mp_store_run_rejections(mp_ctx *ctx, mp_store *st, int64_t run_id, int64_t by[MP_REJECT_COUNT]);

/* What a training run's curves are drawn against: the predicted tokens/s per GPU of the plan
 * it measured (*pred, 0 without a prediction), and the steps where it resumed from a
 * checkpoint (into an arena array *resumed, *n_resumed): a resumed run measures again the
 * steps after its checkpoint, so a step recorded after a later one (by the order of the
 * records) is where one resumed. A resume that redoes no step (killed right after its
 * checkpoint) leaves no trace in the records and is not found. */
mp_status mp_store_run_marks(mp_ctx *ctx, mp_store *st, int64_t run_id, mp_arena *a, double *pred,
                             int64_t **resumed, int64_t *n_resumed);

/* The integer result of a one-value query ("SELECT count(*) FROM plans WHERE run_id=2");
 * for tests and counts. */
mp_status mp_store_query_i64(mp_ctx *ctx, mp_store *st, const char *sql, int64_t *out);

#ifdef __cplusplus
}
#endif
#endif
