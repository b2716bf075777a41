/* The simulator: predicts one plan's step time and per-rank memory by costing its step
 * schedule (exec/schedule.h). It never re-derives the schedule.
 *
 *   memory   replay of the schedule's ALLOC/FREE events: peak and breakdown at the peak,
 *            plus the GPU profile's runtime overhead and a stated fragmentation factor
 *   compute  per op: FLOPs / (peak of its dtype x efficiency(size)), or bytes / HBM
 *            bandwidth when memory-bound (roofline: the max of the two)
 *   network  alpha-beta per collective: latency per ring step + bytes x ring factor /
 *            bandwidth (all-reduce 2(n-1)/n, all-gather and reduce-scatter (n-1)/n,
 *            all-to-all (n-1)/n, as nccl-tests define bus bandwidth); NVLink inside a node,
 *            the inter-node link when a group spans nodes
 *   overlap  an event simulation per rank: one compute stream and the comm streams,
 *            following the schedule's dependencies
 *   pipeline a timeline of the stages walking their pipeline orders (1F1B, interleaved,
 *            GPipe: mp_pp_order) from each stage's forward and backward time per model
 *            chunk and the transfers between them; a stage's in-flight activations from
 *            its order
 *
 * Efficiency comes from a stack profile (sim/stack.h): how close a software stack gets to
 * the GPU's peaks (eager PyTorch, torch.compile, llm.c, meshplan's own runtime), either
 * stated with its source or measured by `meshplan calibrate`. */
#ifndef MP_SIM_SIM_H
#define MP_SIM_SIM_H

#include <stdint.h>

#include "common/status.h"
#include "sim/cluster.h"
#include "exec/plan.h"
#include "exec/schedule.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The ten GEMMs of a transformer layer that Transformer Engine's userbuffers overlap with a
 * TP collective (Megatron-Core's --tp-comm-overlap; transformer_engine/pytorch/module/base.py
 * initialize_ub, v2.0 e5cc6c2, names them so): the forward's all-gathers into qkv and fc1 and
 * reduce-scatters out of proj and fc2, the backward's all-gathers into proj's and fc2's input
 * gradients, and the bulk overlaps of qkv's and fc1's backward (the re-gather beside the
 * input-gradient GEMM: dgrad; the input gradient's reduce-scatter beside the weight-gradient
 * GEMM: wgrad). */
typedef enum mp_ub_gemm {
  MP_UB_QKV_FPROP = 0,
  MP_UB_FC1_FPROP,
  MP_UB_PROJ_FPROP,
  MP_UB_FC2_FPROP,
  MP_UB_PROJ_DGRAD,
  MP_UB_FC2_DGRAD,
  MP_UB_QKV_DGRAD,
  MP_UB_FC1_DGRAD,
  MP_UB_QKV_WGRAD,
  MP_UB_FC1_WGRAD,
  MP_UB_COUNT
} mp_ub_gemm;

/* A userbuffers overlap's method (TE's add_ub): ring_exchange (point-to-point sends on the
 * copy engines, CommOverlapP2P), pipeline (a chunked collective kernel, CommOverlap) or bulk
 * (one collective kernel beside a whole GEMM); unset: TE's default for that GEMM. */
typedef enum mp_ub_method { MP_UB_UNSET = 0, MP_UB_RING_EXCHANGE, MP_UB_PIPELINE, MP_UB_BULK } mp_ub_method;

typedef struct mp_ub_overlap {
  uint8_t method; /* mp_ub_method */
  uint8_t margin; /* set_sm_margin: the GEMM launched on the SMs the kernel leaves */
  int16_t sms;    /* num_sm: the SMs (CTAs) the communication kernel runs on */
} mp_ub_overlap;

/* The most spans an attention_by_span table states (mp_stack_profile.attn_span). */
#define MP_ATTN_SPAN_MAX 12

/* Efficiency of a software stack on a GPU. */
typedef struct mp_stack_profile {
  char name[64];
  /* GEMM efficiency as a function of size: eff = gemm_eff_max * x / (x + gemm_eff_half),
   * x = m*n*k (FLOP-weighted size), i.e. small GEMMs reach less of the peak. */
  double gemm_eff_max;
  double gemm_eff_half_mnk;
  double fp8_gemm_eff_max;   /* float8 GEMMs relative to the fp8 peak */
  /* Hopper's block-scaled float8 GEMMs (mp_op.fp8_block: the blockwise recipe's 1x128 and
   * 128x128 scales) as a speed over the stack's bf16 GEMMs of the same shape (JSON
   * "fp8_block_gemm_vs_bf16", optional, 0 to 4; 0, the default: at fp8_gemm_eff_max): their
   * curve's ceiling is gemm_eff_max x this x the bf16 peak over the fp8 peak, never above
   * fp8_gemm_eff_max (sim/cost.c) */
  double fp8_block_gemm_vs_bf16;
  /* Blackwell's MXFP8 GEMMs (mp_op.fp8_block MP_FP8_BLOCK_MX: the mxfp8 recipe, and the
   * blockwise one on Blackwell) the same way (JSON "mxfp8_gemm_vs_bf16", optional, 0 to 4;
   * 0, the default: at fp8_gemm_eff_max) */
  double mxfp8_gemm_vs_bf16;
  double attention_eff;      /* flash attention relative to the bf16 peak */
  /* Attention by the span of each call (JSON "attention_by_span", optional): {"span": keys a
   * call attends over, ascending, "fwd" and "bwd": the kernel's measured fraction of the
   * bf16 peak at each span, the backward in the measurement's own FLOP count (2.5 times the
   * forward's at equal q/k and v head dims), "source"}. An attention core (MP_KERNEL_ATTENTION
   * with op.n > 0, the keys the call spans: the sequence, or seq / cp on a context-parallel
   * ring's step) runs at the fraction interpolated linearly in log2 of op.n, held at the end
   * points outside them, times "sustained" (optional, (0, 1], default 1: the share of a
   * short benchmark's speed a kernel holds in a sustained run at the GPU's power limit),
   * carried to other GPUs by the flash ratio as attention_eff is; attention's element-wise
   * ops (n 0) run at attention_eff. attn_span_n 0: attention_eff for every op (sim/stack.c,
   * mp_stack_attention_eff). */
  int attn_span_n;
  double attn_span_sustained;
  double attn_span[MP_ATTN_SPAN_MAX], attn_span_fwd[MP_ATTN_SPAN_MAX], attn_span_bwd[MP_ATTN_SPAN_MAX];
  double hbm_eff;            /* achieved fraction of HBM bandwidth for memory-bound ops */
  double link_eff;           /* achieved fraction of link bandwidth (bus bandwidth) */
  double kernel_overhead_s;  /* launch / framework overhead per compute op */
  double graph_kernel_overhead_s; /* the same for a kernel replayed in a CUDA graph (JSON key
                                     "graph_kernel_overhead_us", optional); < 0: not stated, and
                                     a plan with CUDA graphs is refused (sim/cost.c) */
  double host_launch_s;      /* the host's time to issue one kernel, which a GPU stream waits
                                for after a host synchronisation, and below which no pass
                                runs (JSON key "host_launch_us", optional); < 0: not stated,
                                kernel_overhead_s after a synchronisation, the host taken to
                                run ahead elsewhere (sim/cost.c) */
  double comm_overhead_s;    /* per collective, on top of link latency */
  double frag_factor;        /* allocator fragmentation: reserved = allocated x factor */
  char source[256];
  /* fraction of the schedule's ACTIVATIONS bytes the stack really keeps (1: every
   * tensor the schedule saves; torch.compile's min-cut partitioner recomputes cheap
   * element-wise outputs in backward instead of saving them). JSON key optional. */
  double saved_act_factor;
  /* GEMM efficiency by shape (sim/gemm_table.h), a correction on the curve above
   * from a `meshplan calibrate` measurement; NULL (every loaded profile):
   * the curve alone. Not owned: the table must outlive the profile's use. */
  const struct mp_gemm_table *gemm_table;
  /* the same for float8 GEMMs (E4M3 forward, E5M2 dgrad and wgrad), a correction
   * on the float8 curve (fp8_gemm_eff_max with gemm_eff_half_mnk, against the fp8 peak);
   * NULL: that curve alone. Not owned, as gemm_table. */
  const struct mp_gemm_table *fp8_gemm_table;
  /* the achieved fraction of HBM bandwidth per kernel class (MP_KERNEL_*), where a
   * calibration fitted one from that class's own kernels (meshplan calibrate --device
   * cpu, refitted at a run's sizes: a CPU's norms and SwiGLU run well below its AdamW);
   * 0: hbm_eff. From JSON only MP_KERNEL_COPY's, key "copy_hbm_eff" (optional, 0 absent):
   * a stack whose hbm_eff prices unfused element-wise chains states its one-pass copies'. */
  double hbm_eff_kernel[MP_KERNEL_COUNT];
  /* whose memory layout the stack's runtime has (exec/plan.h, mp_mem_model); JSON key
   * "memory_model", optional: "torchtitan" (the default), "meshplan-cpu" or
   * "meshplan-cuda". The planner and `meshplan simulate` copy it into the plan options
   * (mp_stack_plan_options) so the schedule's memory events describe that runtime. */
  mp_mem_model mem_model;
  /* What the stack runs, copied into the plan options by mp_stack_plan_options. JSON keys,
   * optional: "attention" ("flash", the default, or "materialized": exec/plan.h,
   * mp_attn_impl); "loss" ("eager", "fused" or "inplace": mp_loss_impl; default eager, and
   * inplace under the megatron memory model); "sequence_parallel" (whether it runs TP with
   * SP; default true except under the meshplan runtimes' memory models); "ac_policies" (the
   * AC policies the planner searches for it, an array of names; default none,
   * selective-op and full under torchtitan, none, selective-core and full otherwise). */
  mp_attn_impl attn;
  mp_loss_impl loss;
  int sp;
  unsigned ac_policies; /* bit 1 << mp_ac_mode */
  int dp_overlap;       /* JSON "dp_overlap", optional (default false): the megatron memory
                           model's gradient all-reduces overlap the backward */
  int tp_comm_overlap;  /* JSON "tp_comm_overlap", optional (default false), the megatron
                           memory model only: Megatron-Core's --tp-comm-overlap (Transformer
                           Engine's userbuffers) on by default: the plan's async_tp pairs
                           (exec/schedule.h, mp_fuse) run fused; also sets async_tp */
  int cp_sync;          /* JSON "cp_overlap", optional (default true), the torchtitan memory
                           model only: false where the stack compiles the ring with its
                           blocks, so its collectives wait where issued
                           (mp_plan_options.cp_wait_at_issue) */
  int deepep_sms;       /* JSON "deepep_sms", optional (default 0: none), the megatron memory
                           model only: the SMs DeepEP's kernels take (Megatron-Core's
                           moe_deepep_num_sms), which compute overlapped with them loses
                           (sim/overlap.c) */
  int hybridep_sms;     /* JSON "hybridep_sms", optional (default 0: none), the megatron memory
                           model only: the same for HybridEP's kernels (moe_hybridep_num_sms) */
  int nccl_sm_contention; /* JSON "nccl_sm_contention", optional (default false): an NCCL
                           collective off the compute stream holds an SM per channel of its
                           communicator while it runs (mp_sim_nccl_ring_channels), and the
                           compute stream's kernels beside it run on the SMs it leaves
                           (sim/engine.c, contended_end), where the GPU profile states its
                           SMs */
  int nccl_max_ctas;    /* JSON "nccl_max_ctas", optional (0, the default: unset): NCCL_MAX_CTAS
                           (ncclConfig_t maxCTAs), at most so many channels a communicator */
  /* Per communicator: the max_ctas of Megatron-Core's --nccl-communicator-config-path
   * (parallel_state.py get_nccl_options sets each named group's ncclConfig_t maxCTAs), at most
   * so many channels on that group's communicator; 0: unset. NCCL_MAX_CTAS (nccl_max_ctas),
   * an environment variable, overrides every communicator's config (NCCL src/init.cc,
   * v2.23.4-1: envConfigOverride). Never read from JSON: a run's setting (simulate's
   * --nccl-ctas, validate's nccl_ctas column; mp_sim_nccl_ctas_parse). */
  int nccl_group_ctas[MP_GROUP_COUNT];
  /* The NCCL the run used, major x 10000 + minor x 100 + patch (2.23.4: 22304); 0: unset, the
   * newest NCCL the network model follows (sim/network.c). It decides which algorithms NCCL's
   * tuning model may pick (PAT from 2.23). Never read from JSON: a run's setting (simulate's
   * --nccl-version, validate's nccl_version column; mp_sim_nccl_version_parse). */
  int nccl_version;
  int tp_dgrad_async;   /* JSON "tp_dgrad_async", optional (default false), the megatron memory
                           model only: without tp_comm_overlap's bulk overlaps, a
                           column-parallel region's input-gradient reduce-scatter (all-reduce
                           without SP) runs on NCCL beside its weight-gradient GEMMs, the
                           compute stream waiting for it after them (sim/cost.c,
                           price_async_dgrad) */
  int ub_sms;           /* JSON "ub_sms", optional (default 0: none), with tp_comm_overlap
                           only: the SMs Transformer Engine's userbuffers kernels hold
                           beside the GEMMs they overlap (the pipelined reduce-scatter, the
                           bulk all-gather and reduce-scatter), which run on the rest
                           (sim/cost.c, price_fused, price_bulk) */
  /* Per userbuffers GEMM: the run's own overlap config (Megatron-Core's --tp-comm-overlap-cfg,
   * NeMo's TransformerLayerTPOverlapCfg); unset entries take TE's default with ub_sms
   * (mp_sim_ub_overlap). Never read from JSON: a run's setting (simulate's --ub-cfg,
   * validate's ub_cfg column; mp_sim_ub_cfg_parse). */
  mp_ub_overlap ub_cfg[MP_UB_COUNT];
  int dist_opt;         /* JSON "distributed_optimizer", optional (default false): the
                           megatron memory model's optimizer state sharded over data
                           parallelism (mp_plan_options.ddp.shard_optimizer) */
  /* The stack's own pipeline micro-batching where a run does not set it: JSON
   * "pp_microbatches", optional: "stages" (as many micro-batches as pipeline ranks, the
   * rank's local batch split pp ways: torchtitan's pipeline_parallel_microbatches default)
   * or "unstated" (the default: the stack has no such default, the micro-batch is a
   * required setting, as Megatron-LM's --micro-batch-size). meshplan validate uses it for
   * a row that publishes no micro-batch. */
  int pp_mb_stages;
  /* Whose pipeline schedules the stack runs: JSON "pp_order", optional: "megatron" (the
   * default: Megatron-LM's orders, which the meshplan runtime executes) or "torch"
   * (torch.distributed.pipelining's, torchtitan's); exec/schedule_pp.c says where they
   * differ. */
  mp_pp_flavor pp_flavor;
  /* The allocator whose reserved memory the stack's memory figures count: JSON
   * "allocator", optional: "tracked" (the default: what the schedule allocates, x
   * frag_factor) or "pytorch-expandable" (PyTorch's caching allocator with
   * expandable_segments:True, replayed over the schedule's memory events,
   * sim/caching_alloc.h: the bytes it reserves beyond the allocated peak are added before
   * frag_factor, which then stands for what that replay does not see). */
  int alloc_replay;
  /* How the stack's context-parallel ring moves K and V: JSON "cp_rotate", optional:
   * "allgather" (the default, torchtitan's) or "alltoall" (exec/schedule_cp.c). The meshplan
   * runtimes' profiles may not set it: their ring is their own. */
  mp_cp_rotate cp_rotate;
  /* The float8 recipe a float8 plan runs when it names none: JSON "fp8_recipe", optional
   * ("tensorwise", "current" (the same), "delayed", "rowwise", "mxfp8" or "blockwise"; one
   * the memory model's runtime runs, exec/rules.h); absent: MP_FP8_DEFAULT, the runtime's
   * own (mp_fp8_recipe_of). */
  mp_fp8_recipe fp8_recipe;
  /* Whether the stack can run AsyncTP (JSON "async_tp", optional, default false): torchtitan
   * under torch.compile (experimental.enable_async_tensor_parallel); a plan turns it on
   * (plan option async_tp, --async-tp), exec/schedule.h's mp_fuse says what it changes. Only
   * the torchtitan memory model may set it. */
  int async_tp;
  /* The GPU the efficiencies above were fitted on (JSON "fit_gpu", optional: a data/gpus
   * stem) and that GPU's reference kernel fractions, read from its profile when the stack
   * is loaded. gemm_eff_max, fp8_gemm_eff_max and attention_eff are fractions of peak on
   * that GPU; on another the simulator scales them by the ratio of the two GPUs' kernel
   * fractions (sim/stack.h, mp_stack_kernel_scale). "": stated for every GPU as they are
   * (meshplan's runtimes; a calibration, measured on the GPU it runs on). */
  char fit_gpu[64];
  mp_kernel_eff fit_kernel_eff;
  /* A GPU on which the stack's GEMM efficiency was fitted on that GPU's own published rows
   * instead of carried from fit_gpu (JSON "gemm_fit": {"gpu": a data/gpus stem,
   * "gemm_eff_max": a fraction of that GPU's peak}, optional, with fit_gpu; "" none): there
   * GEMMs run at gemm_fit_eff_max where the kernel_eff ratio would give another figure; the
   * stack's other efficiencies are still carried. */
  char gemm_fit_gpu[64];
  double gemm_fit_eff_max;
  /* The tile of the stack's grouped expert GEMMs (mp_op.grouped): JSON "grouped_gemm_tile_m"
   * and "grouped_gemm_tile_k", optional (0, the default: no padding), the tokens of each
   * expert rounded up to tile_m rows in the forward and input-gradient GEMMs and to tile_k in
   * the weight gradient's reduction, which the kernel computes whole (sim/cost.c). */
  int grouped_tile_m, grouped_tile_k;
  /* How the stack launches a grouped expert GEMM (JSON "grouped_gemm_streams", optional, 0
   * to 64): 0, the default, one kernel over every expert (CUTLASS's grouped GEMM,
   * torch._grouped_mm); s > 0, one GEMM kernel per expert issued round-robin on s streams,
   * as Transformer Engine's GroupedLinear does (sim/cost.c, grouped_launches): each kernel
   * pays the launch overhead, and at most s of them share the GPU at a time. */
  int grouped_streams;
  /* Whether each weight-gradient GEMM adds into an fp32 gradient buffer (JSON
   * "wgrad_accum_fp32", optional, default false; the megatron memory model only): Megatron-LM's
   * gradient_accumulation_fusion, on unless --no-gradient-accumulation-fusion, hands
   * Transformer Engine's Linear and GroupedLinear the fp32 main_grad as the GEMM's output
   * with accumulate (fuse_wgrad_accumulation, megatron/core/extensions/transformer_engine.py
   * of core_v0.14), so every micro-batch's weight gradient reads and writes 4-byte elements
   * where an unfused GEMM writes 2-byte ones; 2-byte ones where the run keeps its main_grad
   * in bf16 (--grad-reduce-in-bf16, the plan's fsdp.reduce_dtype; sim/cost.c,
   * mp_sim_wgrad_accum_bytes). */
  int wgrad_accum_fp32;
  /* JSON "te_layer_spec", optional (default false), the megatron memory model only: the
   * layers are Megatron-Core's Transformer Engine spec with its default fusions (exec/plan.h,
   * mp_plan_options te_spec: fused norms, bias-SwiGLU saving fc1's output alone). */
  int te_layer_spec;
  /* What Megatron-LM's DDP does to each gradient bucket on the compute stream before
   * reducing it (JSON "ddp_scale_grads" and "ddp_check_grads", optional, default false; the
   * megatron memory model only; exec/plan.h, mp_ddp_options): scales it by 1/d, and takes
   * its norm to check for NaN and Inf. */
  int ddp_scale_grads, ddp_check_grads;
} mp_stack_profile;

/* A simulator workspace: the scratch one thread's simulations reuse instead of allocating
 * per call. It holds, grown to the largest request seen and freed only by destroy: per op,
 * the durations, end times, compiled ops and segment programs; per pipeline stage, the
 * stage runs and the grouping of alike stages; the pipeline timeline's end times and
 * orders; an arena for the schedules mp_simulate_plan and mp_simulate_built_plan build when
 * the caller passes none; and the default stack profile once loaded. It holds no result:
 * a simulation's figures are the same to the bit whatever the workspace simulated before,
 * and the same as with a fresh one. Nothing a call returns points into it.
 *
 * Thread safety: one thread at a time (a simulation writes into it); threads that simulate
 * at once each use their own, e.g. the planner one per search worker
 * (planner/evaluate.h). The caller owns it: mp_sim_config.ws names it for a call; a config
 * without one makes the call create a temporary workspace and free it before returning,
 * which is what one-shot callers want (a loop of many simulations passes one). */
typedef struct mp_sim_workspace mp_sim_workspace;
/* An empty workspace: its buffers grow on first use. MP_ERR_NOMEM when out of memory. */
mp_status mp_sim_workspace_create(mp_ctx *ctx, mp_sim_workspace **out);
/* Frees the workspace and every buffer it grew; NULL is a no-op. */
void mp_sim_workspace_destroy(mp_sim_workspace *ws);

typedef struct mp_sim_config {
  const mp_cluster *cluster;
  const mp_stack_profile *stack; /* NULL: the default profile for the cluster's GPU */
  double mem_headroom;           /* fraction of GPU memory kept free (0.0 .. 0.5) */
  int record_trace;              /* keep per-op start/end for mp_sim_trace_write */
  int64_t *stage_peak_bytes;     /* optional, room for pp: under pipeline parallelism each
                                    stage's peak memory, reckoned as peak_mem_bytes (the
                                    result's is the largest); NULL: not wanted */
  mp_sim_workspace *ws;          /* the calling thread's scratch (mp_sim_workspace); NULL: a
                                    temporary one for the call */
  int memory_first;              /* mp_simulate_prepped: 1 stops at the first simulated stage
                                    over capacity (its memory figures, fits 0, time figures
                                    0: what a search ranking the plans that fit needs of it),
                                    stage 0 (without pipeline parallelism the one stage)
                                    and, with MTP modules, then the last judged by their
                                    memory alone before any time run (not under DualPipe,
                                    whose ranks hold two stages); 0: every figure */
  double step_bound_s;           /* mp_simulate_prepped with pp > 1 (not DualPipe): > 0 stops
                                    after the first stage run whose lower bound of the step
                                    (mp_sim_stage_step_lb_s) exceeds it (result: bounded 1,
                                    step_lb_s that bound, no other figure); 0: off */
} mp_sim_config;

typedef struct mp_sim_result {
  double step_time_s;
  double tokens_per_s_per_gpu;
  double mfu;               /* model FLOPs (6N + attention) per second over the bf16 peak */
  double compute_s;         /* busy time of the compute stream per step */
  double exposed_comm_s;    /* time the compute stream waits on communication */
  double bubble_s;          /* pipeline bubble */
  double optimizer_s;
  double comm_s[MP_STREAM_COUNT]; /* busy time per stream */
  double offload_exposed_s; /* CPU offloading: what its host copies add to the step (in
                               exposed_comm_s too; sim/offload.c) */
  int64_t peak_mem_bytes;   /* including runtime overhead and fragmentation */
  int64_t mem_at_peak[MP_MEM_COUNT]; /* breakdown at the peak (allocated bytes) */
  int64_t mem_max[MP_MEM_COUNT];     /* each category's own high-water mark over the
                                        step (allocated bytes; e.g. all gradients once the
                                        last reduce-scatter has allocated its shard) */
  int64_t overhead_bytes;   /* runtime overhead + fragmentation part of the peak */
  int64_t capacity_bytes;   /* GPU memory less headroom */
  int fits;
  int bounded;              /* stopped by cfg->step_bound_s: the step is at least step_lb_s */
  double step_lb_s;         /* with bounded: the stage's lower bound of the step */
} mp_sim_result;

typedef struct mp_sim_trace mp_sim_trace; /* opaque: per-op times of one simulation */

/* Costs the schedule. With cfg->record_trace, *trace receives the timeline (free with
 * mp_sim_trace_destroy); trace may be NULL otherwise. */
mp_status mp_simulate(mp_ctx *ctx, const mp_schedule *s, const mp_sim_config *cfg,
                      mp_sim_result *out, mp_sim_trace **trace);

/* Chrome trace JSON (Perfetto opens it): one track per stream, ops named by FQN. */
mp_status mp_sim_trace_write(mp_ctx *ctx, const mp_sim_trace *t, const char *path);
void mp_sim_trace_destroy(mp_sim_trace *t);

/* Busy time of a traced step by class, the simulator's side of `meshplan train
 * --profile`: the durations (kernel overhead included) of its compute op instances summed
 * by kernel (MP_KERNEL_*), of its collectives by group (MP_GROUP_*), with their counts.
 * Busy, not exposed: overlapped communication counts in full. */
typedef struct mp_sim_busy {
  double kernel_s[MP_KERNEL_COUNT];
  int64_t kernel_n[MP_KERNEL_COUNT];
  double comm_s[MP_GROUP_COUNT];
  int64_t comm_n[MP_GROUP_COUNT];
} mp_sim_busy;
void mp_sim_trace_busy(const mp_sim_trace *t, mp_sim_busy *out);
/* Per op of the traced schedule (index into its ops, n_ops of them): the predicted
 * duration of the op's first timed instance (s); 0 for memory events, -1 for an op that did
 * not run (a micro-batch condition skipped it). For `meshplan explain --schedule`. */
void mp_sim_trace_op_durations(const mp_sim_trace *t, double *dur, int64_t n_ops);

/* The GPU's tensor cores run recipe r's float8 GEMMs: MXFP8 needs Blackwell's block-scaled
 * MMA (compute capability >= 10.0; cuBLASLt's CUBLASLT_MATMUL_MATRIX_SCALE_VEC32_UE8M0),
 * blockwise needs Hopper or later (>= 9.0: DeepGEMM, cuBLASLt's 1x128 and 128x128 block
 * scales), the per-tensor and rowwise recipes any GPU with float8 (mp_gpu_has_float8). A
 * GPU without float8 units runs a plan's float8 Linears as bf16 whatever the recipe (the
 * cost model's rule), so it is not refused here, except under NVFP4, which needs
 * Blackwell's FP4 tensor cores (>= 10.0) and a profile stating their peak and the NVFP4
 * GEMMs' efficiency (peak_tflops.fp4, kernel_eff.fp4_gemm): refused on any other GPU. MP_ERR_INVALID naming the GPU, its
 * capability and the recipe. Every simulation of a float8 plan asks it. */
mp_status mp_sim_fp8_recipe_check(mp_ctx *ctx, const mp_gpu *g, mp_fp8_recipe r);

/* Convenience: build the plan, the compact schedule of rank 0 (or the worst pipeline
 * stage), and simulate. */
mp_status mp_simulate_plan(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                           const mp_plan_options *opts, const mp_sim_config *cfg,
                           mp_sim_result *out);

/* The planner's hot path (sim/sim_plan.c): mp_simulate_plan with the caller's
 * scratch arena for the schedules instead of the workspace's: scratch is only
 * allocated from, never reset here (the caller resets it after the call, e.g. the search
 * after each candidate); NULL uses the workspace's arena. */
mp_status mp_simulate_plan_scratch(mp_ctx *ctx, const mp_model *m, const mp_mesh *mesh,
                                   const mp_plan_options *opts, const mp_sim_config *cfg,
                                   mp_arena *scratch, mp_sim_result *out);
/* The same on a plan already built (e.g. by mp_build_plan_from in scratch). With
 * pp > 1 only the distinct stages are simulated (first, last, the earliest of each class
 * of alike middle stages); the result equals mp_simulate_built_plan_all_stages field for
 * field. */
mp_status mp_simulate_built_plan(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                                 mp_arena *scratch, mp_sim_result *out);
/* The reference (slow: every one of the pp stages is built and simulated); the
 * tests compare mp_simulate_built_plan against it. */
mp_status mp_simulate_built_plan_all_stages(mp_ctx *ctx, const mp_plan *p,
                                            const mp_sim_config *cfg, mp_arena *scratch,
                                            mp_sim_result *out);

/* The planner's hot path: what mp_simulate_built_plan works out from a plan's
 * parameters alone, once per plan family: the stages to simulate and, per stage, the
 * schedule builder's reading of the parameters (exec/schedule.h, mp_schedule_prep). It
 * serves every plan mp_plan_derive makes from p (other micro-batch, AC, reshard) and p
 * itself: mp_simulate_prepped(p', prep) gives exactly mp_simulate_built_plan(p'). Lives
 * in arena, tied to cfg->cluster; p must outlive it: a stage's schedule prep is made from p
 * when the stage is first simulated (a plan's simulation that stops at a stage over
 * capacity, memory_first, makes none for the later stages), which is all that changes it. */
typedef struct mp_sim_plan_prep mp_sim_plan_prep;
mp_status mp_sim_plan_prep_create(mp_ctx *ctx, const mp_plan *p, const mp_sim_config *cfg,
                                  mp_arena *arena, mp_sim_plan_prep **out);
/* scratch as for mp_simulate_built_plan (only allocated from; NULL: the workspace's arena). */
mp_status mp_simulate_prepped(mp_ctx *ctx, const mp_plan *p, mp_sim_plan_prep *prep,
                              const mp_sim_config *cfg, mp_arena *scratch, mp_sim_result *out);

/* Ring-factor time of one collective of `bytes` payload on a group of n ranks whose
 * slowest link has bw_GBps per direction and lat_s per step (exposed for tests). */
double mp_sim_collective_s(mp_coll c, double bytes, int n, double bw_GBps, double lat_s);

/* The link a mesh group runs on, seen from `rank` (the network model of
 * sim/network.c): n members, nodes spanned, members per node, bandwidth per direction
 * before the stack's link efficiency, latency per ring step. */
typedef struct mp_sim_link {
  int n, nodes, per_node;
  double GBps;
  double lat_s;
  double intra_GBps, inter_GBps; /* NVLink per GPU, the NIC per GPU (an all-to-all's two bounds) */
} mp_sim_link;
/* The channels of NCCL's ring communicator for a group on link l of GPU g, as NCCL 2.21
 * (v2.21.5-1) builds them (sim/network.c): its graph search's rings, doubled as
 * ncclTopoDupChannels and ncclTopoPostset double them, at most max_ctas (NCCL_MAX_CTAS;
 * 0: unset). A bulk collective (over channels x 512 threads x 64 bytes, src/enqueue.cc)
 * launches one CTA, on its own SM, per channel. H100 SXM inside a node: 24; across nodes,
 * one NIC a GPU: 16 for 4-8 members a node, 8 for 2, 4 for 1. */
int mp_sim_nccl_ring_channels(const mp_gpu *g, const mp_sim_link *l, int max_ctas);
/* The channel cap a collective on group g runs under: the stack's NCCL_MAX_CTAS where it sets
 * one (it overrides each communicator's config), else the group's max_ctas, else 0 (none). */
int mp_sim_nccl_cap(const mp_stack_profile *p, mp_group g);
/* Parses a per-communicator cap as Megatron-Core names its communicators
 * (parallel_state.py get_nccl_options), `name:max_ctas` items split by spaces: dp, dp_cp, tp,
 * cp, pp, ep, ep_dp (e.g. "dp:8 dp_cp:8 tp:8 pp:2"), each cap 1 to 64, into caps (zeroed
 * first; an unnamed group 0). MP_ERR_USAGE, naming the item, on another name or value. */
mp_status mp_sim_nccl_ctas_parse(mp_ctx *ctx, const char *text, int caps[MP_GROUP_COUNT]);
/* Parses an NCCL version as X.Y or X.Y.Z (NCCL's own "2.21.5"; a trailing "-1" release
 * suffix is not part of it) into major x 10000 + minor x 100 + patch (X.Y: patch 0), minor
 * and patch below 100. MP_ERR_USAGE, naming the text, on anything else. */
mp_status mp_sim_nccl_version_parse(mp_ctx *ctx, const char *text, int *version);
/* The overlap Transformer Engine runs GEMM g's collective with under p (sim/ub_cfg.c): p's
 * ub_cfg entry, else TE's default config (ring_exchange with num_sm 1 and no SM margin for
 * qkv_fprop, fc1_fprop, proj_dgrad and fc2_dgrad; pipeline for proj_fprop and fc2_fprop and
 * bulk for the rest, on p's ub_sms with set_sm_margin). */
mp_ub_overlap mp_sim_ub_overlap(const mp_stack_profile *p, mp_ub_gemm g);
/* Parses a userbuffers config as NeMo's TransformerLayerTPOverlapCfg states it, items split by
 * spaces, `gemm:method:num_sm:set_sm_margin` (gemm a mp_ub_gemm's name: qkv_fprop, fc1_fprop,
 * proj_fprop, fc2_fprop, proj_dgrad, fc2_dgrad, qkv_dgrad, fc1_dgrad, qkv_wgrad, fc1_wgrad;
 * method ring_exchange, pipeline or bulk; set_sm_margin 0 or 1), or `gemm:ring_exchange`
 * (NeMo's RingExchangeOverlapCfg defaults: num_sm 1, no margin), into cfg (cleared first; an
 * unnamed GEMM takes TE's default). MP_ERR_USAGE, naming the item, on anything else. */
mp_status mp_sim_ub_cfg_parse(mp_ctx *ctx, const char *text, mp_ub_overlap cfg[MP_UB_COUNT]);
/* As NCCL runs it on GPU g (sim/network.c): an all-gather, reduce-scatter or all-reduce of
 * n ranks on link l (its nodes and members a node; n below l->n: a pair of the group, on two
 * nodes when the group spans several) priced by NCCL's tuning model (v2.27.7-1), the fastest
 * of the ring, the tree (all-reduce), PAT (all-gather and reduce-scatter of one rank a node)
 * and the LL, LL128 and Simple protocols, Simple's
 * bandwidth bw_GBps; PAT only where nccl_version (mp_stack_profile's; 0 the newest) carries
 * it and, for a reduce-scatter, where avg is 0 (1: its op is ncclAvg or a PreMulSum, which
 * NCCL runs as PreMulSum; sim/network.c, pat_bw_share). The other collectives
 * mp_sim_collective_s's on l->lat_s. */
double mp_sim_nccl_collective_s(mp_coll c, double bytes, int n, const mp_sim_link *l, double bw_GBps,
                                const mp_gpu *g, int nccl_version, int avg);
mp_status mp_sim_group_link(mp_ctx *ctx, const mp_cluster *c, const mp_mesh *mesh, mp_group g,
                            int rank, mp_sim_link *out);
/* An all-to-all of `bytes` sent per rank on link l (efficiency eff on both links) where
 * every rank sends and receives at once: the share for the rank's node-mates over NVLink and
 * the share for other nodes over its NIC run side by side, the slower bounding it, plus
 * (n - 1) steps of the link's latency. nic_share and nvl_share: the fractions of `bytes`
 * that leave the node and that cross NVLink (mp_sim_ep_shares).
 * A group inside one node, or one member per node, is mp_sim_collective_s's. */
double mp_sim_alltoall_s(double bytes, const mp_sim_link *l, double eff, double nic_share, double nvl_share);
/* The shares of an EP all-to-all's bytes (T x top_k copies of a token) a rank puts on its
 * NIC and on NVLink, on EP link l, for a dispatcher (sim/network.c): NCCL's all-to-all
 * (n - per_node)/n and (per_node - 1)/n; DeepEP one network copy per token and remote node
 * the token's experts are on (group-limited routing bounding those nodes), the rest
 * forwarded over NVLink, and inside one node one NVLink copy per token and other GPU its
 * experts are on. */
void mp_sim_ep_shares(const mp_sim_link *l, const mp_model *m, mp_moe_dispatcher d, double *nic_share,
                      double *nvl_share);
/* The same for the flex dispatcher (DeepEP, HybridEP) at expert-TP size etp, its bytes
 * T x top_k x etp copies of a token (each to every expert-TP rank of its expert's group,
 * over the expert-TP x EP group); etp <= 1 is mp_sim_ep_shares, and the all-to-all's shares
 * do not depend on it. */
void mp_sim_ep_shares_etp(const mp_sim_link *l, const mp_model *m, mp_moe_dispatcher d, int etp,
                          double *nic_share, double *nvl_share);
/* DeepEP's dispatch or combine of `bytes` (T x top_k copies of a token) on EP link l with
 * the shares of mp_sim_ep_shares: its NVLink and NIC bytes side by side, the slower
 * bounding it, and one step of the link's latency (its kernels serve every peer at once). */
double mp_sim_deepep_s(double bytes, const mp_sim_link *l, double eff, double nic_share, double nvl_share);

/* The time a combined forward-and-backward step saves by running each direction's EP
 * all-to-alls beside the other's compute (sim/overlap.c): fc[0..nf] the forward's compute
 * between and around its nf all-to-alls fa[] (dispatch, combine, ...), bc[0..nb] and ba[]
 * the backward's (combine's backward, dispatch's backward, ...); layer j's four phases
 * each take the longer of forward attention / backward combine, backward experts / forward
 * dispatch, forward experts / backward dispatch, backward attention / forward combine, the
 * compute taking `slow` (>= 1) times as long beside the communication kernels' SMs. May be
 * negative (the SMs cost more than the overlap hides). */
double mp_sim_a2a_overlap_save_s(const double *fc, const double *fa, int nf, const double *bc,
                                 const double *ba, int nb, double slow);

/* One pipeline stage's part of the timeline (sim/pipeline.c): per model chunk the forward
 * and backward time of one micro-batch, and the transfer of a chunk's activations to the
 * next virtual stage (send_f) and of its input gradient to the previous one (send_b).
 * fb_save[c] != 0: a forward of chunk c followed by a backward of another micro-batch run
 * as one combined step, fb_save[c] shorter than the two (the EP all-to-all overlap,
 * sim/overlap.c; negative: longer); 0: each step alone. Under DualPipe a rank's chunk 0 is its
 * direction-0 model stage s and chunk 1 its direction-1 stage pp - 1 - s, and only the
 * pairs its order names run combined. w[c]: the weight-gradient part of b[c] (its WGRAD
 * GEMMs), which the zero-bubble schedules run as a step of its own (W) after the rest (B). */
typedef struct mp_pp_stage_times {
  double f[MP_PP_MAX_VIRTUAL], b[MP_PP_MAX_VIRTUAL];
  double send_f, send_b;
  double fb_save[MP_PP_MAX_VIRTUAL];
  double w[MP_PP_MAX_VIRTUAL];
} mp_pp_stage_times;

/* The pipeline timeline of a step: every stage (stage[s], pp of them; stages may share
 * one) runs its mp_pp_order under schedule `kind` as `flavor` implements it (the stack's
 * pp_order) with v chunks for n_micro micro-batches,
 * each step when its stage is free and its input has arrived; finish[s] receives when stage
 * s ends its last step (time 0: the first forward starts). MP_ERR_INVALID for orders the
 * schedule refuses. Runs in a temporary workspace (the simulator passes its own). */
mp_status mp_sim_pipeline(mp_ctx *ctx, mp_pp_schedule kind, mp_pp_flavor flavor, int pp, int v,
                          int64_t n_micro, const mp_pp_stage_times *const *stage,
                          double *finish);

/* Duration of one COMPUTE op (exposed for tests): the roofline max of
 * FLOPs / (peak of its dtype x efficiency) and bytes / (HBM x hbm_eff), plus the stack's
 * kernel overhead. GEMM efficiency follows gemm_eff_max x m n k batch / (m n k batch +
 * gemm_eff_half_mnk) (fp8 dtypes: fp8_gemm_eff_max against the fp8 peak; a GPU without
 * an fp8 peak runs them as bf16), times the stack's by-shape factor for GEMMs of batch 1
 * (gemm_table for bf16, fp8_gemm_table for fp8; none for grouped expert GEMMs);
 * attention runs at attention_eff of the bf16 peak, or at the stack's fraction for the call's
 * span (attention_by_span), its softmax exponentials' exposed time added where the GPU states
 * attention_exp (sim/cluster.h); other kernels at the fp32 (CUDA-core) peak. */
double mp_sim_compute_op_s(const mp_op *op, const mp_gpu *g, const mp_stack_profile *p);
/* The same under plan's options where they price the op (NULL: the defaults): a weight
 * gradient accumulated into the main_grad in the plan's gradient dtype. */
double mp_sim_compute_op_in_plan_s(const mp_op *op, const mp_gpu *g, const mp_stack_profile *p,
                                   const mp_plan *plan);
/* The bytes an element a weight-gradient GEMM adds over its bf16 write under stack p's
 * gradient accumulation fusion (wgrad_accum_fp32): a read and a write of the main_grad in
 * plan's gradient dtype (fsdp.reduce_dtype; NULL: fp32), 6 in fp32, 2 in bf16; 0 without the
 * fusion, the stack's or the plan's (ddp.wgrad_unfused: the hook's copy is its own op). */
double mp_sim_wgrad_accum_bytes(const mp_stack_profile *p, const mp_plan *plan);
/* The kernels compute op `op` launches under stack p, each paying the stack's
 * kernel_overhead: a grouped expert GEMM's experts where the stack launches a GEMM per expert
 * (grouped_gemm_streams > 0), else 1. */
double mp_sim_op_launches(const mp_op *op, const mp_stack_profile *p);

#ifdef __cplusplus
}
#endif
#endif
