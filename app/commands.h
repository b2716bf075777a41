/* The meshplan subcommands and the plumbing they share.
 *
 * A subcommand is an mp_command: its option table (args.h, shared rows from options.h)
 * and the function that runs it. mp_command_main is the one prologue every command goes
 * through: it parses the command line against the table, prints --help (exit 0) or a
 * usage error (one line, exit 2), and otherwise runs the command with a fresh context.
 * A command returns the process exit code (0 ok, 2 usage or input error, 1 other
 * failure); only the commands and main() print errors to the user. One file per
 * subcommand: app/cmd_<name>.c. */
#ifndef MP_APP_COMMANDS_H
#define MP_APP_COMMANDS_H

#include "common/status.h"
#include "sim/cluster.h"
#include "exec/mesh.h"
#include "exec/model.h"
#include "exec/plan.h"
#include "app/args.h"
#include "app/options.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MESHPLAN_VERSION "0.1.0"
/* The exit status of accepted work that found nothing: `plan` where no plan fits (its output
 * says what would). Usage and input errors exit 2, other failures 1 as well. */
#define MP_CMD_EXIT_NO_PLAN 1
#define MP_CMD_MAX_POSITIONAL 4 /* the most any spec's max_positional may be */

/* A parsed command line, as the command's run function receives it. */
typedef struct mp_cmd_call {
  int argc;    /* the arguments after the command's name */
  char **argv;
  const char *pos[MP_CMD_MAX_POSITIONAL]; /* the positional ones, in order */
  int n_pos;
} mp_cmd_call;

typedef struct mp_command {
  mp_cmd_spec *spec; /* name, usage, summary and options; the parse fills their values */
  const char *brief; /* the command's line in `meshplan --help` */
  /* Runs the command once spec holds the values given; ctx is fresh. Returns the exit
   * code, having printed any error. */
  int (*run)(mp_ctx *ctx, const mp_cmd_call *call);
} mp_command;

extern const mp_command mp_command_plan, mp_command_simulate, mp_command_explain, mp_command_train,
    mp_command_export, mp_command_calibrate, mp_command_report, mp_command_validate;

/* The prologue of every command: parses argv (after the command's name) against
 * cmd->spec; --help or -h prints the help to stdout and returns 0; a usage error prints
 * its one line to stderr (mp_cmd_fail) and returns 2; otherwise returns cmd->run's exit
 * code. */
int mp_command_main(const mp_command *cmd, int argc, char **argv);

/* Reads the plan options shared by explain, simulate and train into *o, changing only
 * what was given: --ac MODE, --fp8, --sp or --no-sp (both: a usage error), --no-reshard, --seq S,
 * --micro-batch B, --global-batch G. The caller sets its defaults first
 * (mp_plan_options_init, or its own). */
mp_status mp_cmd_plan_options(mp_ctx *ctx, const mp_cmd_spec *spec, mp_plan_options *o);
/* --pp-schedule S (1f1b, interleaved or gpipe; default 1f1b) and --pp-virtual N (model
 * chunks per stage under the interleaved schedule, default 2; 1 under the others) into *o
 * (explain, simulate). An unknown schedule is a usage error naming the three. */
mp_status mp_cmd_pp_schedule(mp_ctx *ctx, const mp_cmd_spec *spec, mp_plan_options *o);
/* A megatron stack's plan with more model chunks (pp x pp_virtual) than layers and no stated
 * layout: a Megatron-Core chunk holds at least one of what it splits, so such a run counted
 * the embedding and the loss as a layer each (--account-for-embedding-in-pipeline-split and
 * --account-for-loss-in-pipeline-split). Writes that split into o (mp_pp_layout_embedding_loss)
 * and returns 1; 0 (o untouched) otherwise or where the chunks do not divide layers + 2. */
int mp_cmd_megatron_pp_split(const mp_model *m, const mp_mesh *mesh, mp_plan_options *o);
/* --pp-layers A,B,... (s; NULL: the default split) into o's stage layout. */
mp_status mp_cmd_pp_layers(mp_ctx *ctx, const char *s, mp_plan_options *o);
/* --cp-rotate into o->cp_rotate and --cp-comm-type into o->cp_comm (each untouched without
 * it): --cp-rotate refused under a meshplan runtime's stack (prof, or NULL where the command
 * has none yet), whose ring is its own, and under a megatron one, whose form --cp-comm-type
 * names; --cp-comm-type refused under every stack but a megatron one. */
struct mp_stack_profile;
mp_status mp_cmd_cp_rotate(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                           mp_plan_options *o);
/* --async-tp (1) or --no-async-tp (0) into o->tp_comm_fused (untouched without either);
 * both together refused, and --async-tp under a stack that does not run AsyncTP (its
 * "async_tp" key) and without SP (--no-sp, or o->sp 0), which leaves nothing to fuse. */
mp_status mp_cmd_async_tp(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                          mp_plan_options *o);
/* --moe-dispatcher alltoall|deepep|hybridep into *out where given (plan: every candidate's;
 * the stack is checked where it is known); MP_ERR_USAGE naming a value it is not. */
mp_status mp_cmd_moe_dispatcher(mp_ctx *ctx, const mp_cmd_spec *spec, mp_moe_dispatcher *out);
/* --moe-dispatcher alltoall|deepep, --overlap-moe-comm and --moe-fp8-dispatch (simulate,
 * explain): set o->moe_dispatcher, o->moe_a2a_overlap and o->moe_fp8_dispatch; MP_ERR_USAGE naming the stack where it is not
 * Megatron-Core's (the plan checks the rest). */
mp_status mp_cmd_moe_comm(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                             mp_plan_options *o);
/* --fp8-act-cache, --optimizer-moments fp32|bf16, --fsdp-reduce-dtype fp32|bf16,
 * --fsdp-flat-params and --loss-chunks N (simulate, explain) into o->fp8_act_cache,
 * o->moment_dtype, o->fsdp.reduce_dtype, o->fsdp.flat_params and o->loss_chunks; MP_ERR_USAGE
 * for another dtype, a count below 1, and for
 * --fsdp-flat-params under a memory model other than torchtitan's (the plan checks the recipe
 * and the memory model). */
mp_status mp_cmd_storage(mp_ctx *ctx, const mp_cmd_spec *spec, mp_plan_options *o);
/* --loss-chunks N (simulate, explain, plan) into *out where given; MP_ERR_USAGE below 1. */
mp_status mp_cmd_loss_chunks(mp_ctx *ctx, const mp_cmd_spec *spec, int *out);
/* fp32 or bf16 by name into *out; 0 (out untouched) for another name. AdamW's moments' and
 * FSDP's gradient reduction's dtype: mp_cmd_storage and validate's optimizer_moments and
 * fsdp_reduce_dtype columns read it. */
int mp_cmd_fp32_bf16_parse(const char *name, mp_dtype *out);
/* Megatron-Core's options for how data parallelism holds and gathers the weights (simulate,
 * explain, plan), on a megatron stack only (prof NULL: not checked): Megatron FSDP's
 * --data-parallel-sharding-strategy S and --fsdp-double-buffer into o->mfsdp_strategy and
 * o->fsdp_double_buffer, and --fp8-param-gather (with --fp8) into o->fp8_opts.param_gather.
 * MP_ERR_USAGE naming the choices otherwise. */
/* --fp8-all-gather (with --fp8 on a torchtitan stack) into o->fp8_opts.all_gather: torchtitan's
 * enable_fsdp_float8_all_gather with precompute_float8_dynamic_scale_for_fsdp, FSDP2 gathering
 * each float8 Linear's weight as torchao's tensorwise float8 cast of its shard
 * (torchao/float8/fsdp_utils.py, WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather); the
 * recipe and the tp = 1 rule are the Float8 pass's (exec/pass_float8.c). */
mp_status mp_cmd_fp8_all_gather(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                                mp_plan_options *o);

mp_status mp_cmd_megatron_weights(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                                  mp_plan_options *o);
/* What plan's header names beside the stack where it is not torchtitan's default, in words
 * (" with cp comm type p2p and TP comm overlap on its TP plans and the distributed optimizer"):
 * Megatron-Core's cp comm type or the ring's rotation, the TP overlap, the distributed
 * optimizer; "" when none. */
void mp_cmd_stack_runs_str(const mp_plan_options *b, char *buf, size_t cap);
/* Megatron-Core's --cross-entropy-loss-fusion: o->loss from the stack's INPLACE to
 * INPLACE_FUSED (exec/plan.h); MP_ERR_USAGE naming the stack where its loss is not Megatron's.
 * Megatron-LM's --ddp-average-in-collective (average_in_collective 1) and
 * --no-check-for-nan-in-loss-and-grad (no_check 1) turn off o->ddp.scale_grads and
 * o->ddp.check_grads, --align-param-gather (align 1) turns on o->ddp.align_param_gather,
 * --ddp-bucket-size (bucket_size > 0; 0: none) sets o->ddp.bucket_size (mp_cmd_ddp_bucket_size);
 * MP_ERR_USAGE under a stack without Megatron's DDP. mp_cmd_ce_fusion does all of them where
 * simulate's or explain's command line gives the options. */
mp_status mp_cmd_fuse_loss(mp_ctx *ctx, const struct mp_stack_profile *prof, mp_plan_options *o);
mp_status mp_cmd_ddp_bucket_prep(mp_ctx *ctx, const struct mp_stack_profile *prof, int average_in_collective,
                                 int no_check, int align, int64_t bucket_size, mp_plan_options *o);
/* Megatron-LM's --no-gradient-accumulation-fusion: o->ddp.wgrad_unfused on (exec/plan.h);
 * MP_ERR_USAGE naming the stack where it does not run Megatron-LM's memory model.
 * mp_cmd_ce_fusion applies it where the command line gives it. */
mp_status mp_cmd_wgrad_unfused(mp_ctx *ctx, const struct mp_stack_profile *prof, mp_plan_options *o);
/* Megatron-LM's --ddp-bucket-size (size elements, > 0) into o->ddp.bucket_size; 0 leaves one
 * bucket a block. Usage error under a stack that does not run Megatron-LM's DDP. */
mp_status mp_cmd_ddp_bucket_size(mp_ctx *ctx, const struct mp_stack_profile *prof, int64_t size,
                                 mp_plan_options *o);
mp_status mp_cmd_ce_fusion(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                           mp_plan_options *o);
/* Megatron-Core's --cross-entropy-fusion-impl (after mp_cmd_fuse_loss): native leaves
 * INPLACE_FUSED, te sets MP_LOSS_TE (exec/plan.h); MP_ERR_USAGE for another name.
 * mp_cmd_ce_fusion applies it where the command line gives it, refusing it without
 * --cross-entropy-loss-fusion. */
mp_status mp_cmd_ce_impl(mp_ctx *ctx, const char *impl, mp_plan_options *o);
/* Megatron-Core's CUDA graphs named `scope` (none, attn, layers, iteration: exec/plan.h,
 * mp_cuda_graphs) into o->cuda_graphs; MP_ERR_USAGE for another name or a stack that states no
 * in-graph kernel cost (graph_kernel_overhead_us: only megatron-core). The plan checks the
 * rest (exec/rules.h, mp_rule_cuda_graphs_check). mp_cmd_cuda_graphs_opt does it for the
 * command line's --cuda-graphs, nothing where it is absent. */
mp_status mp_cmd_cuda_graphs(mp_ctx *ctx, const struct mp_stack_profile *prof, const char *scope, mp_plan_options *o);
/* The command line's --cpu-offload-layers N into o->cpu_offload_layers (Megatron-Core's CPU
 * offloading; the plan checks the rest, mp_rule_cpu_offload_check); MP_ERR_USAGE under a stack
 * that is not a megatron one. Nothing where it is absent. */
mp_status mp_cmd_cpu_offload(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                             mp_plan_options *o);
/* The command line's NCCL settings: --nccl-version (mp_sim_nccl_version_parse) into
 * prof->nccl_version and --nccl-ctas (mp_sim_nccl_ctas_parse) into prof->nccl_group_ctas;
 * nothing where they are absent. MP_ERR_USAGE, naming the text, for a malformed one. */
mp_status mp_cmd_nccl(mp_ctx *ctx, const mp_cmd_spec *spec, struct mp_stack_profile *prof);
/* A userbuffers config (mp_sim_ub_cfg_parse) into prof->ub_cfg, for a stack that runs
 * Transformer Engine's userbuffers (tp_comm_overlap); mp_cmd_ub_cfg does it for the command
 * line's --ub-cfg, nothing where it is absent. MP_ERR_USAGE otherwise. */
mp_status mp_cmd_ub_cfg_text(mp_ctx *ctx, struct mp_stack_profile *prof, const char *text);
mp_status mp_cmd_ub_cfg(mp_ctx *ctx, const mp_cmd_spec *spec, struct mp_stack_profile *prof);
mp_status mp_cmd_cuda_graphs_opt(mp_ctx *ctx, const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                                 mp_plan_options *o);
/* --moe-imbalance F (>= 1), --moe-capacity-factor C (> 0),
 * --moe-pad-expert-input-to-capacity (with C) and --moe-expert-rank-capacity-factor into *r (simulate, explain, plan); each absent
 * option leaves its field. MP_ERR_USAGE for a value out of range; the plan checks the rest
 * against the model and mesh (exec/plan.h, mp_moe_routing). */
mp_status mp_cmd_moe_routing(mp_ctx *ctx, const mp_cmd_spec *spec, mp_moe_routing *r);
/* --ep N (explain, train): expert parallelism of degree N carved out of dp_shard, the same
 * as ep=N in --mesh; merged into *mesh (a different ep there is a usage error) and the
 * mesh validated. Nothing when --ep was not given. */
mp_status mp_cmd_mesh_ep(mp_ctx *ctx, const mp_cmd_spec *spec, mp_mesh *mesh);
/* --model M or --hf-config PATH (not both; a spec without --hf-config takes --model alone),
 * default dflt; --mtp-num-layers N sets its MTP modules (0..MP_MAX_LAYERS - n_layers). */
mp_status mp_cmd_load_model(mp_ctx *ctx, const mp_cmd_spec *spec, const char *dflt, mp_model *m);
/* --cluster C (default h100-8), or --gpus N of --gpu TYPE (default h100-sxm) with
 * --gpus-per-node K (default min(8, N)) and --inter-gbps X (default 400); --gpu,
 * --gpus-per-node or --inter-gbps without --gpus, or with --cluster, is a usage error. */
mp_status mp_cmd_load_cluster(mp_ctx *ctx, const mp_cmd_spec *spec, mp_cluster *c);
/* The same for a given number of GPUs n (plan's --gpus A..B sweep): --gpu, --gpus-per-node
 * and --inter-gbps as mp_cmd_load_cluster reads them with --gpus n. */
mp_status mp_cmd_load_cluster_n(mp_ctx *ctx, const mp_cmd_spec *spec, int64_t n, mp_cluster *c);
/* The most tokens --tokens takes: 1e18, a million times the 15T of Llama 3's pre-training
 * (a count past it is a typo, and days and dollars stay finite). */
#define MP_CMD_MAX_TOKENS 1e18
/* The value of flag as a count: a number with an optional suffix K, M, B (or G) or T for
 * 1e3, 1e6, 1e9 or 1e12 ("15T", "300B", "1.5e12"), finite, in (0, max]; else a usage error
 * naming the flag, the value and what it takes. Nothing when the flag was not given. */
mp_status mp_cmd_count(mp_ctx *ctx, const mp_cmd_spec *spec, const char *flag, double max, double *out);
/* seq beyond the model's max_seq is a usage error unless --allow-long-seq was given. */
mp_status mp_cmd_check_seq(mp_ctx *ctx, const mp_cmd_spec *spec, const mp_model *m, int64_t seq);
/* --global-batch-tokens T: *global_batch = T / seq (T a multiple of seq; with
 * --global-batch, a usage error). Nothing when it was not given. */
mp_status mp_cmd_batch_tokens(mp_ctx *ctx, const mp_cmd_spec *spec, int64_t seq, int64_t *global_batch);
/* The default global batch of one plan (simulate, explain): plan's rule (planner/batch.h)
 * for a mesh of mp_mesh_world GPUs, the nearest multiple of its dp x micro_batch to the
 * target; micro_batch x dp when that is larger than the target. The rule in words into
 * rule (with the batch it gave). */
void mp_cmd_default_batch(const mp_model *m, const mp_mesh *mesh, int64_t seq, int64_t micro_batch,
                          int64_t *global_batch, char *rule, size_t cap);
/* Without --micro-batch, a pipelined plan under a stack that states its own pipeline
 * micro-batching (the profile's pp_microbatches "stages": torchtitan runs the local batch as
 * pp micro-batches unless told otherwise) takes that split, as the stack would run it:
 * o->micro_batch = local batch / pp where pp divides the local batch (global_batch over the
 * data-parallel ranks), and a line saying so into note; otherwise nothing changes and note
 * is "" (simulate, explain). */
/* "15, 16 x 6, 15": the n values each printed with fmt (one double, e.g. "%.0f"), runs of
 * equal values collapsed into "value x count"; truncated at cap. */
void mp_cmd_fmt_runs(const double *v, int n, const char *fmt, char *buf, size_t cap);
struct mp_stack_profile;
void mp_cmd_stack_micro_batch(const mp_cmd_spec *spec, const struct mp_stack_profile *prof,
                              const mp_mesh *mesh, mp_plan_options *o, char *note, size_t cap);
/* A user-given name (a model's, a cluster's, a CSV case's) for a table cell or a line on
 * the terminal: control characters (C0, DEL and UTF-8's C1) are written as escapes (\n,
 * \r, \t, \xHH, \u00HH) and a backslash as \\, so a name cannot move the cursor,
 * ring, recolour the terminal or split a row. Into buf (cap bytes, never cut inside an
 * escape); returns buf. */
const char *mp_cmd_escape(const char *s, char *buf, size_t cap);
/* mp_cmd_escape into a char array buf (4 bytes a byte of s holds the longest escape). */
#define MP_CMD_CELL(s, buf) mp_cmd_escape((s), (buf), sizeof(buf))
/* --db's value, or "meshplan.db" when it was not given (plan, report, calibrate). */
const char *mp_cmd_db_path(const mp_cmd_spec *spec);
/* Prints root as formatted JSON and a newline on stdout, then deletes it. Returns 0, or
 * 1 when root is NULL or cannot be printed (out of memory). */
struct cJSON;
int mp_cmd_print_json(struct cJSON *root);
/* Stack p's kernel efficiencies as carried to GPU g (sim/stack.h, mp_stack_kernel_scale_of),
 * for --json: {"stack", "fit_gpu" (null: stated for every GPU), "gpu", "scaled", the
 * multipliers "gemm", "fp8_gemm", "flash_attention", and "line", what the text output
 * prints}. NULL when out of memory. */
struct mp_stack_profile;
struct cJSON *mp_cmd_kernel_scale_json(const struct mp_stack_profile *p, const mp_gpu *g);
/* The model's size for a header: "70.55B parameters", for a MoE model "46.70B parameters,
 * 12.88B active per token" (mp_model_param_count, mp_model_matmul_param_count: the
 * published activated counts are the matmuls' parameters). */
void mp_cmd_params_str(const mp_model *m, char *buf, size_t cap);
/* The same into JSON object o: "params", and for a MoE model "active_params". */
void mp_cmd_params_json(const mp_model *m, struct cJSON *o);
/* One line where meshplan's runtime cannot drive g (a GPU without CUDA), "" where it can:
 * "mi300x has no CUDA (rocm): planned and simulated only; meshplan train cannot run on it". */
/* The cluster's size, GPU, node and (where it spans nodes) NVLink domain, for headers and
 * --json. */
void mp_cmd_cluster_shape_str(const mp_cluster *c, char *buf, size_t cap);
void mp_cmd_cluster_shape_json(const mp_cluster *c, struct cJSON *o);
/* Dollars in the unit that keeps them short: "$69.46M", "$85.4K", "$950". */
void mp_cmd_fmt_usd(double d, char *buf, size_t cap);
/* The legend under a table of plans (plan's ranking, report's): what "ep 8g"/"8g4" mean where
 * grid, "pp 16x8E" where split, "dp_rep 8/2" (mp_mesh_dp_rep_str) where dopt. */
void mp_cmd_plan_table_notes(int grid, int split, int dopt);
void mp_cmd_gpu_note(const mp_gpu *g, char *buf, size_t cap);
/* How this process was launched, read before MPI_Init from the launcher's environment
 * (OpenMPI's OMPI_COMM_WORLD_SIZE/RANK, else PMI_SIZE/RANK as Slurm and MPICH set them):
 * under_mpi 0 with world 1, rank 0 when it runs alone. */
typedef struct mp_launch {
  int under_mpi, world, rank;
} mp_launch;
void mp_cmd_launch(mp_launch *out);
/* Prints "meshplan <command>: <message>" on one line of stderr (any newline in the
 * message becomes a space; a prefix the message already carries is not repeated) and
 * returns the exit code of st (mp_status_exit_code: 2 for usage and input errors, 1 for
 * failures of accepted work). The one way a command reports a failure. */
int mp_cmd_fail(const mp_ctx *ctx, mp_status st);
/* How long a rank that gives up on a collective waits before it ends the job, seconds: the
 * other live ranks, blocked within about a step of it, reach their own deadlines and print
 * what they waited on meanwhile. */
#define MP_CMD_ABORT_GRACE_S 3.0
/* mp_cmd_fail for a process that may be one rank of an MPI job (under_mpi: launched by
 * mpirun or srun). A failure that leaves MPI unusable (a collective's timeout: a peer is
 * stuck; an MPI or NCCL error: a peer died) cannot end in MPI_Finalize, which would wait for
 * that peer: the message is printed, and after MP_CMD_ABORT_GRACE_S the whole job is ended
 * with MPI_Abort (mp_comm_mpi_abort; this does not return). Otherwise as mp_cmd_fail. */
int mp_cmd_fail_job(const mp_ctx *ctx, mp_status st, int under_mpi);

#ifdef __cplusplus
}
#endif
#endif
