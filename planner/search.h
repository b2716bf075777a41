/* The planner's search: enumerate every plan for a model on a cluster, prune what cannot
 * run (keeping the reason), evaluate the rest with a callback (the simulator by default),
 * and rank the feasible ones.
 *
 * Candidates. Every ordered factorization of the GPU count into
 * pp x dp_replicate x dp_shard x cp x tp (loops in that order, tp innermost), every ep
 * dividing dp_shard (MoE models; ep = 1 for dense ones), with pp > 1 the model chunks per
 * stage 1 (1F1B), 2, 4 (interleaved; up to pp_virtual_max), crossed with micro-batch sizes
 * (powers of two up to the per-rank batch, the mesh's global batch / (dp_replicate x dp_shard), or 1
 * when that is below 1), the AC policies the stack runs (mp_search_config.ac_mask), float8 {off, on} (off alone unless search_fp8
 * or fix.fp8) and reshard_after_forward {off, on}, in that nesting order. A mesh the mesh rules
 * below reject (the model x mesh rules, dp_shard without FSDP, cp over the sequence) is one
 * candidate, the first of that crossing, standing for every option of the mesh: those rules
 * read the mesh alone, so no option of it could be ranked (crossed, they were most of the
 * candidates of a large cluster, only written and counted). Candidates
 * are numbered in enumeration order and that order is stable (tests and the database rely
 * on it).
 *
 * Pruning (cheap, before any simulation), first failing rule wins, in this order (the model
 * x mesh rules are exec/rules.h's, which the plan builder and the runtime ask too):
 *   pp x its model chunks over the layers (each chunk must hold one: the plan's split);
 *   MoE with pp > 1; tp must divide n_heads, n_kv_heads, d_ff (models with dense MLP layers),
 *   d_model and d_ff_shared; tp must divide the NVLink domain (mp_cluster_nvlink_domain: the
 *   node, or a GB200 NVL72 rack's trays; a TP group stays on NVLink) unless allow_cross_node_tp; ep must divide n_experts; with DDP (dp) dp_shard
 *   must be 1 (dp_replicate is the same mesh); cp must cut seq into 2 cp load-balanced
 *   chunks of at least 128 tokens; the candidate's global batch (the config's, or the rule's
 *   nearest multiple of dp to its target, none when dp is over twice the target) must be
 *   divisible by dp x micro_batch; interleaving needs micro-batches in groups of pp; SP
 *   needs tp dividing seq / cp; float8 needs an fp8 peak and compute capability >= 89, and
 *   at least one Linear whose GEMM dims are multiples of 16 on the rank (the Float8 pass
 *   leaves the others in bf16; with none, float8 changes nothing); reshard_after_forward
 *   with dp_shard x cp == 1, with DDP, or with pp > 1 on a stack that keeps a stage's
 *   parameters gathered (pp_keeps_params) is a duplicate of reshard off; and a memory lower
 *   bound (when mem_capacity_bytes > 0): the data-parallel state a rank keeps at rest per
 *   parameter (mp_plan_dp_state_bytes: FSDP's fp32 master and AdamW m and v, 12 bytes, on
 *   n_params / (dp_shard x cp x tp x pp) of them, replicated norms, FSDP padding and uneven
 *   stages only adding; DDP's 18 bytes on n_params / (tp x pp), or with its optimizer
 *   sharded 6 + 12 / (dp_replicate x cp); on DDP's expert grid the routed experts'
 *   parameters cut over ep x etp x pp ranks, their sharded optimizer bytes over the larger of
 *   DDP's ways and stage / (ep x etp); a float8 candidate under fp8_param_gather a byte
 *   less where its float8 weights and Transformer Engine's copies of them take 1 byte an
 *   element: Blackwell's per-tensor recipes), plus the GPU's runtime overhead; a plan whose
 *   bound exceeds the capacity cannot fit, so it is not simulated.
 * A vocab that tp does not divide is padded (the candidate says so), not rejected.
 * After evaluation, a plan whose peak memory exceeds the capacity (GPU memory less the
 * headroom; the evaluator's `fits`) is infeasible with the figures as its reason. Siblings
 * (candidates differing only in micro-batch, AC, float8 and reshard) decide some
 * candidates without a simulation, looking only at siblings before it in the same chunk
 * of work (so the outcome does not depend on the threads): a candidate whose half
 * micro-batch is over capacity is over capacity too (activations, their in-flight count
 * times the micro-batch, and every per-micro-batch buffer grow with it), as is one
 * whose policy saves more than full AC while full AC is over capacity; and with
 * prune_dominated a candidate whose AC policy recomputes a superset of what a fitting
 * sibling's recomputes (none < selective-core < selective < full, none < selective-op <
 * full) is skipped: the same schedule with more recompute ops is never faster. The AC
 * policies are enumerated none, full, then the ones between (selective-core, selective,
 * selective-op), so that both ends decide the middle. Unless the last full-AC candidate of
 * its chunk fit, a worker decides the full-AC sibling before the none-AC one
 * (full_ac_ahead), so that a full AC over capacity decides none too (its sibling after it,
 * in its chunk), and a none that fits still makes its full sibling dominated: the outcomes
 * enumeration order gives, but for none-AC candidates over capacity found so without a
 * simulation.
 *
 * Constraints (`--fix`, `--executable-only`) shrink the space before enumeration: a
 * candidate they exclude is not enumerated, so counts are those of the constrained space.
 *
 * Threads. mp_search_run splits the candidates into chunks that worker threads claim in
 * order; each worker has its own mp_ctx and arenas, so the evaluator needs no locking as
 * long as it only reads the user data it shares. The calling thread receives candidates
 * in enumeration order through the sink, a consumer of candidates as they complete
 * (the planner writes its store after the search instead: planner.h). */
#ifndef MP_PLANNER_SEARCH_H
#define MP_PLANNER_SEARCH_H

#include <stddef.h>
#include <stdint.h>

#include "common/arena.h"
#include "common/status.h"
#include "sim/cluster.h"
#include "exec/mesh.h"
#include "exec/model.h"
#include "sim/sim.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Why a candidate was not ranked (the first failing rule is kept): one row per reason,
 *   X(ENUM, name, words)
 * ENUM the mp_reject value MP_REJECT_<ENUM>; name its short stable name (the database's
 * plans.reject_rule and rejections.rule, --json's "rule"); words what `plan` prints in its
 * counts and --why. What to change when nothing fits is not a rule's to say: it is searched
 * (planner/advise.h). The model x mesh rules are exec/rules.h's predicates. */
/* clang-format off */
#define MP_REJECTS(X)                                                                       \
  X(NONE, "", "ranked")                                                                     \
  /* pp x chunks over the layers (mp_rule_pp_chunks_ok) */                                  \
  X(PP_LAYERS, "pp_layers", "pp over the layers")                                           \
  /* tp does not divide a size the TP pass shards (mp_rule_tp_dim) */                       \
  X(TP_HEADS, "tp_heads", "tp does not divide the attention heads")                         \
  X(TP_KV_HEADS, "tp_kv_heads", "tp does not divide the key/value heads")                   \
  X(TP_D_FF, "tp_d_ff", "tp does not divide the MLP width")                                 \
  X(TP_D_MODEL, "tp_d_model", "tp does not divide the model width")                         \
  X(TP_CROSS_NODE, "tp_cross_node",                                                         \
    "tp larger than a node (--allow-cross-node-tp to allow)")                               \
  X(EP_EXPERTS, "ep_experts", "ep does not divide the experts")                             \
  /* ring attention's 2 cp chunks (mp_rule_cp_ring_ok), each at least one flash tile */     \
  X(CP_SEQ, "cp_seq", "cp does not cut seq into 2 cp chunks of 128+ tokens")                \
  X(BATCH, "batch",                                                                         \
    "the global batch does not divide over dp x micro-batch (or dp is over the batch rule's)") \
  X(FP8_GPU, "fp8_gpu", "float8 on a GPU without float8")                                   \
  X(FP8_DIMS, "fp8_dims",                                                                   \
    "float8 with no Linear whose GEMM dims are multiples of 16")                            \
  X(RESHARD_NOOP, "reshard_noop", "reshard_after_forward changes nothing (duplicate)")      \
  X(MEMORY_BOUND, "memory_bound",                                                           \
    "resident parameters and optimizer state alone over capacity")                          \
  X(MEMORY, "memory", "simulated peak memory over capacity")                                \
  X(EVAL_ERROR, "eval_error", "the simulator refused the plan")                             \
  /* interleaving: chunks over the layers, micro-batches in groups of pp */                 \
  X(PP_VIRTUAL, "pp_virtual",                                                               \
    "interleaved pipeline chunks empty or micro-batches not a multiple of pp")              \
  X(SP_SEQ, "sp_seq", "sequence parallelism: tp does not divide seq / cp")                  \
  /* an AC policy recomputing a subset of this one's ops fits with every other option the   \
     same: never slower (time objectives), so not simulated */                              \
  X(DOMINATED, "dominated", "an AC policy with less recompute fits (never slower)")         \
  /* half this micro-batch, every other option the same, is over capacity: not simulated */ \
  X(MEMORY_MB, "memory_mb", "half the micro-batch is already over capacity")                \
  /* full AC, every other option the same, is over capacity: not simulated */               \
  X(MEMORY_AC, "memory_ac", "full AC is already over capacity")                             \
  /* dp_shard > 1 on a stack without FSDP (or a megatron one, whose Megatron FSDP is searched \
     only where --fix names dp_shard): the same mesh on dp_replicate is searched */         \
  X(NO_FSDP, "no_fsdp",                                                                     \
    "dp_shard on a stack without FSDP (dp_replicate searched instead)")                     \
  /* a stage's run gave a lower bound of the step past what the shown plans can be       \
     (bound_top_k): its simulation stopped there */                                         \
  X(BOUNDED, "bounded", "a lower bound of its step is slower than every shown plan")  \
  /* Megatron FSDP (--fix dp_shard on a megatron stack) over dp_replicate x dp_shard with  \
     ep > 1, which exec/plan.c refuses (mp_rule_mfsdp_experts_ok): not simulated */         \
  X(MFSDP_EXPERTS, "mfsdp_experts",                                                         \
    "Megatron FSDP's hybrid sharding with routed experts (ep > 1) is not modelled")
/* clang-format on */

typedef enum mp_reject {
#define MP_REJECT_ENUM_(e, name, words) MP_REJECT_##e,
  MP_REJECTS(MP_REJECT_ENUM_)
#undef MP_REJECT_ENUM_
  MP_REJECT_COUNT
} mp_reject;

/* Short stable name of a rule ("tp_heads", "memory", ...), for the database and tests. */
const char *mp_reject_name(mp_reject r);
/* The rule in words, as `plan` prints its counts. */
const char *mp_reject_words(mp_reject r);
/* The rules in the order the search applies them (the mesh's, the options', the
 * siblings', then the simulation's): every rule but NONE and NO_FSDP (a mesh searched under
 * another name). What --why walks. */
extern const mp_reject mp_search_rule_order[];
extern const int mp_search_n_rule_order;

typedef struct mp_candidate {
  mp_mesh mesh;         /* pp, dp_replicate, dp_shard, cp, tp sizes and ep */
  int64_t micro_batch;  /* sequences per micro-batch per data-parallel rank */
  uint8_t ac;           /* mp_ac_mode */
  uint16_t ac_every;    /* full AC on every ac_every-th block (1: every block) */
  uint8_t sp;           /* sequence parallelism (tp > 1) */
  uint16_t pp_virtual;  /* model chunks per pipeline stage: 1 (1F1B), more: interleaved */
  uint8_t pp_split;     /* 1: the embedding and the loss each count as a layer in the pipeline
                           split (Megatron-LM's --account-for-embedding/loss-in-pipeline-split,
                           mp_pp_layout_embedding_loss); 0: the default split */
  uint8_t fp8;          /* 1: float8 Linear layers */
  uint8_t reshard;      /* 1: reshard_after_forward */
  uint8_t reject;       /* mp_reject */
  uint8_t evaluated;    /* 1: the evaluator ran and res is valid */
  uint8_t pads_vocab;   /* 1: tp does not divide vocab; the plan pads it */
  int64_t global_batch; /* sequences per step of this candidate: the config's global_batch,
                           or under the default rule (target_batch) the nearest multiple of
                           its dp to the target; 0 when the rule gives none */
  const char *error;    /* evaluator's message when reject == MP_REJECT_EVAL_ERROR */
  int64_t plan_id;      /* database row id once stored (0 when not stored) */
  double step_bound_s;  /* what the search hands the evaluator with it: > 0, a step no
                           shown plan can be slower than (bound_top_k); the evaluator may
                           stop once a lower bound of the step exceeds it (res.bounded) */
  mp_sim_result res;    /* valid when evaluated */
} mp_candidate;

/* Constraints: -1 leaves a dimension free. */
typedef struct mp_search_fix {
  int pp, dp_replicate, dp_shard, cp, tp, ep;
  int etp;           /* N >= 1: the expert grid with etp N only (exec/mesh.h), 0: EP inside
                        dp_shard only, -1 */
  int dopt;          /* N > 1: Megatron-LM's distributed optimizer in N instances (the mesh's
                        dopt, exec/mesh.h) on every candidate, the meshes that cannot carry
                        it (dp_shard > 1, ep > 1, N not dividing dp_replicate) left out;
                        -1 or 1: one instance */
  int ac;            /* mp_ac_mode or -1 */
  int ac_every;      /* with ac: its block frequency (full:N); -1: 1 */
  int sp;            /* 0/1 or -1 (the search's default) */
  int pp_virtual;    /* model chunks per stage or -1 */
  int fp8, reshard;  /* 0/1 or -1 */
  int64_t micro_batch;
} mp_search_fix;

void mp_search_fix_init(mp_search_fix *f);
/* Parses "tp=8,pp=1,ac=full,fp8=0,mb=2" (keys: pp, dp_replicate|dp_rep, dp_shard, cp, tp,
 * ep, etp, dopt, ac (a policy name or full:N), fp8, micro_batch|mb, reshard, sp, pp_virtual|v). Adds
 * to what f holds; a repeated or unknown key or a bad value is MP_ERR_USAGE naming it. */
mp_status mp_search_fix_parse(mp_ctx *ctx, const char *spec, mp_search_fix *f);

/* Evaluates one candidate (never a pruned one). user is the config's eval_user, or on a
 * worker that eval_thread_init set up, the pointer it gave that worker; scratch is the
 * worker's arena, reset after each call; ctx is the worker's. A failure marks the candidate
 * MP_REJECT_EVAL_ERROR with ctx's message and the search goes on. */
typedef mp_status (*mp_search_eval_fn)(void *user, mp_ctx *ctx, mp_arena *scratch,
                                       const mp_candidate *c, mp_sim_result *out);

typedef struct mp_search_config {
  const mp_model *model;
  const mp_cluster *cluster;
  int64_t seq;          /* tokens per sequence */
  int64_t global_batch; /* sequences per step (when target_batch is 0) */
  int64_t target_batch; /* > 0: the default rule's target in sequences (planner/batch.h):
                           each mesh runs the nearest multiple of its dp, global_batch is
                           not used; 0: every mesh runs global_batch */
  int search_fp8;       /* 1: float8 searched beside bf16 where not fixed; 0: bf16 unless
                           fix.fp8 asks for float8 (mp_search_config_init: 1) */
  mp_fp8_recipe fp8_recipe; /* the float8 recipe of float8 candidates (its Linears' tile
                               rule: exec/rules.h); MP_FP8_DEFAULT: the runtime's */
  int allow_cross_node_tp;
  int executable_only;  /* only what exec/runtime executes (mp_runtime_plan_check) */
  unsigned ac_mask;     /* the AC policies enumerated, bit 1 << mp_ac_mode (the stack's
                           ac_policies); 0: none, selective-core and full */
  int sp;               /* with tp > 1: 1 sequence parallelism (the stacks that run it), 0
                           the all-reduce form; never both: SP saves memory and moves the
                           same bytes, so the all-reduce form is searched only when asked */
  int pp_virtual_max;   /* model chunks per stage searched with pp > 1: 1, 2, 4 up to this
                           (1: 1F1B only, the meshplan runtime's) */
  int pp_split;         /* 1: the stack can count the embedding and the loss as layers in the
                           pipeline split (Megatron-LM): with pp > 1 every chunking whose pp x v
                           divides the layers + 2 is searched that way too, v up to
                           MP_PP_MAX_VIRTUAL */
  int pp_keeps_params;  /* the stack keeps a pipeline stage's FSDP parameters gathered
                           through the step (torchtitan): reshard with pp > 1 is a duplicate
                           of reshard off (MP_REJECT_RESHARD_NOOP) */
  mp_dp_kind dp;        /* the stack's data parallelism: FSDP (0, the default) or DDP, which
                           replicates parameters: dp_shard is searched as dp_replicate
                           (MP_REJECT_NO_FSDP) and reshard_after_forward is always a duplicate
                           (MP_REJECT_RESHARD_NOOP) */
  int ddp_shard_optimizer; /* DDP with its optimizer state sharded (ZeRO-1): the memory bound */
  int ep_only;          /* 1: every candidate has ep > 1, as meshplan runs Megatron-Core's flex
                           dispatcher (DeepEP, HybridEP) with expert parallelism only
                           (exec/plan.c); ep x etp grids of any etp the search takes */
  int fp8_param_gather; /* Megatron-Core's --fp8-param-gather (exec/plan.h): the float8
                           candidates' float8 model weights at 1 byte in the memory bound */
  int full_ac_ahead;    /* 1 (mp_search_config_init): unless the last full-AC candidate of
                           its chunk fit, a worker decides a none-AC candidate's full-AC
                           sibling first, and when that is over capacity the none-AC one is
                           too without a simulation (MP_REJECT_MEMORY_AC); 0: every candidate
                           in enumeration order. The ranked plans are the same either way */
  int prune_dominated;  /* time objectives: an AC policy whose recompute is a superset of a
                           fitting sibling's (same mesh, chunks, micro-batch, float8,
                           reshard, SP) is not simulated (MP_REJECT_DOMINATED) */
  int bound_top_k;      /* K > 0 (time objectives, only the K best plans shown and only the
                           plans that fit logged): each chunk's candidates go to the evaluator
                           with a step bound (mp_candidate.step_bound_s), the K-th best step
                           per sequence of the chunks at least BOUND_LAG before it (search_run.c)
                           with the tie tolerance, times the candidate's batch; one whose
                           lower bound passes it is MP_REJECT_BOUNDED, as is a sibling
                           recomputing more (prune_dominated's premise) and, before its
                           schedule is built, a sibling with an r-times-larger micro-batch
                           (and no less recompute) whose bound / r passes it (every op on r
                           times the rows no faster, 1/r as many micro-batches). The K best
                           plans and their order are those of the search without it. 0: off */
  mp_search_fix fix;
  int n_threads;        /* workers; <= 0: the number of online CPUs */
  int64_t mem_capacity_bytes; /* GPU memory less headroom, for the lower-bound prune; 0: off */
  mp_search_eval_fn eval;
  void *eval_user;
  /* Per-worker state for the evaluator, e.g. its caches and the simulator's workspace, so
   * that workers share nothing they write. eval_thread_init (may be NULL) runs on each
   * worker thread before its first candidate: from eval_user it makes the worker's state
   * and stores in *worker_user what eval then receives on that worker; an error stops the
   * search with its message (the hook frees what it made). eval_thread_done (may be NULL)
   * runs on the worker before it exits with the same pointer (eval_user without an init
   * hook) and frees what eval_thread_init made. */
  mp_status (*eval_thread_init)(void *eval_user, mp_ctx *ctx, void **worker_user);
  void (*eval_thread_done)(void *worker_user);
} mp_search_config;

/* Defaults: no constraints, threads = CPUs. Caller sets model, cluster, seq, batch, eval. */
void mp_search_config_init(mp_search_config *cfg);

typedef struct mp_search {
  mp_arena *arena;      /* owns cands and messages */
  mp_candidate *cands;
  int64_t n;            /* enumerated (after constraints) */
  int64_t n_pruned;     /* rejected by the cheap rules */
  int64_t n_evaluated;  /* handed to the evaluator */
  int64_t n_feasible;   /* evaluated, fits */
  int64_t n_failed;     /* evaluator errors */
  int64_t n_dominated;  /* not simulated: an AC policy recomputing less fits */
  int64_t n_implied;    /* not simulated: over capacity as a sibling needing no more
                           memory is (MP_REJECT_MEMORY_MB, MP_REJECT_MEMORY_AC) */
  int64_t n_set_aside;  /* handed to the evaluator besides n_evaluated, the result set aside:
                           full AC decided ahead (full_ac_ahead), then dominated by its none */
  double enumerate_s, run_s;
} mp_search;

/* Enumerates and prunes. Checks cfg (positive seq and batch, known model and cluster). */
mp_status mp_search_enumerate(mp_ctx *ctx, const mp_search_config *cfg, mp_search **out);

/* The memory lower bound of candidate c (bytes, the runtime overhead included): what the prune
 * compares with mem_capacity_bytes (see above); at most the peak the simulator finds for it. */
double mp_search_mem_lower_bound(const mp_search_config *cfg, const mp_candidate *c);
void mp_search_destroy(mp_search *s);

/* Receives each candidate, in enumeration order, on the calling thread, once its
 * evaluation (if any) is done. Returning an error stops the search with that error. */
typedef mp_status (*mp_search_sink_fn)(void *user, mp_ctx *ctx, int64_t index,
                                       mp_candidate *c);
/* Called on the calling thread after each chunk with the candidates delivered so far. */
typedef void (*mp_search_progress_fn)(void *user, int64_t done, int64_t total);

/* Evaluates every unpruned candidate on cfg->n_threads workers and delivers all
 * candidates to sink (may be NULL) in order. */
mp_status mp_search_run(mp_ctx *ctx, const mp_search_config *cfg, mp_search *s,
                        mp_search_sink_fn sink, void *sink_user,
                        mp_search_progress_fn progress, void *progress_user);

/* The counts of candidates by reject reason, by[0] the ranked ones. */
void mp_search_reject_counts(const mp_search *s, int64_t by[MP_REJECT_COUNT]);
/* Whether r is one of the rules of the mesh alone (prune_mesh's: pp over the layers, tp's,
 * ep over the experts, cp over the sequence, dp_shard without FSDP): a candidate so
 * rejected is its mesh's only one and stands for every option of it. */
int mp_search_reject_is_mesh_rule(mp_reject r);
/* Whether c's mesh and options match `fix` on every field it sets (its mesh alone when a
 * mesh rule rejected it: it stands for every option). */
int mp_search_fix_matches(const mp_search_fix *fix, const mp_candidate *c);
/* The index of the candidate whose mesh and options match `fix` on every field it sets
 * (the first in enumeration order when several do), or -1. */
int64_t mp_search_find(const mp_search *s, const mp_search_fix *fix);

/* Writes the reason a candidate was rejected ("tp=3 does not divide n_kv_heads=8"), or ""
 * when it was not. */
void mp_candidate_reason(const mp_search_config *cfg, const mp_candidate *c, char *buf,
                         size_t cap);
/* "dp_shard=4,tp=2,ep=2" style description of the candidate's mesh. */
void mp_candidate_mesh_str(const mp_candidate *c, char *buf, size_t cap);
/* The pipeline as plan's table shows it: "16", pp x chunks per stage under the interleaved
 * schedule "16x4", and an E where the embedding and the loss count as layers ("16x8E"). */
void mp_candidate_pp_str(const mp_candidate *c, char *buf, size_t cap);
/* c's ep as plan's table shows it: "8", "8g" on the expert grid (exec/mesh.h, etp=1), or
 * "8g4" on it with etp 4. */
void mp_candidate_ep_str(const mp_candidate *c, char *buf, size_t cap);
/* The same for a mesh (a stored plan's, planner/store.h mp_plan_row_mesh). */
void mp_mesh_ep_str(const mp_mesh *m, char *buf, size_t cap);
/* m's dp_replicate as the plans' tables show it: "8", or "8/2" where dopt=2 distributed-
 * optimizer instances cut it (exec/mesh.h); returns 1 for the latter, else 0. */
int mp_mesh_dp_rep_str(const mp_mesh *m, char *buf, size_t cap);
/* "none", "selective", "selective-op", "selective-core", "full" (mp_ac_mode_name's names). */
const char *mp_search_ac_name(int ac);
/* The candidate's AC policy as the CLI takes it: the name, or "full:N". */
void mp_candidate_ac_str(const mp_candidate *c, char *buf, size_t cap);

/* Ranking. The time objective ranks by step time per sequence (the step's time over its
 * global batch, i.e. throughput: candidates under the default batch rule run different
 * batches), tokens-per-dollar by tokens per dollar, memory by peak memory. For time and
 * tokens-per-dollar, plans within MP_RANK_TIE_TOL of the best plan not yet ranked are ties,
 * decided toward the simpler plan (mp_candidate_simplicity): rank k is the simplest of the
 * unranked plans within the tolerance of the fastest unranked one. A prediction is not
 * exact to 1 % (docs/calibration.md: 5-10 % against measurements), so a plan that is
 * simpler to run (fewer parallel dims to debug, no ring attention or float8 numerics) is the
 * better choice among plans the model cannot tell apart. */
#define MP_RANK_TIE_TOL 0.01
/* The simplicity key, lower is simpler, compared in this order: context parallelism
 * (cp > 1), float8, the number of mesh dims above 1 (pp, dp_replicate, dp_shard, cp, tp,
 * ep), interleaved pipeline chunks, the AC policy's recompute (none, selective-core,
 * selective, selective-op, full), packed into one integer; the ranking then prefers lower
 * peak memory. */
int64_t mp_candidate_simplicity(const mp_candidate *c);

typedef enum mp_objective {
  MP_OBJECTIVE_TIME = 0,      /* lowest step time per sequence; ties: the simpler plan */
  MP_OBJECTIVE_MEMORY,        /* lowest peak memory; ties: lower step time */
  MP_OBJECTIVE_TOKENS_PER_DOLLAR, /* most tokens per dollar (needs a price) */
  /* Fewest days to train a number of tokens (planner/report.h): on one search's GPUs the
   * order of time (days are the tokens over the throughput, which is the batch over the step
   * time); across GPU counts (plan's sweep) the fastest count. */
  MP_OBJECTIVE_DAYS,
  /* Least cost to train them (needs a price): on one search's GPUs the order of
   * tokens-per-dollar; across GPU counts the cheapest count. */
  MP_OBJECTIVE_COST
} mp_objective;
mp_status mp_objective_parse(mp_ctx *ctx, const char *s, mp_objective *out);
const char *mp_objective_name(mp_objective o);
/* tokens-per-dollar and cost: ranked with a price per GPU-hour. */
int mp_objective_needs_price(mp_objective o);
/* 1 for the objectives that rank by step time per sequence (time, days). */
int mp_objective_is_time(mp_objective o);

/* Tokens trained per dollar: tokens/s/GPU x 3600 / price per GPU-hour. */
double mp_tokens_per_dollar(const mp_candidate *c, double price_per_gpu_hour);

/* Indices of the feasible candidates, best first, into a buffer from s->arena.
 * MP_OBJECTIVE_TOKENS_PER_DOLLAR with price <= 0 is MP_ERR_USAGE (pass --price or use a
 * cluster with price_per_gpu_hour). Ties within MP_RANK_TIE_TOL go to the simpler plan,
 * remaining ones to the lower index. */
mp_status mp_search_rank(mp_ctx *ctx, const mp_search *s, mp_objective obj,
                         double price_per_gpu_hour, int64_t **order, int64_t *n_order);

#ifdef __cplusplus
}
#endif
#endif
