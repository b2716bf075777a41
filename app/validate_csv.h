/* The rows `meshplan validate` reads: published measurements as CSV, in the format of
 * shared/validation/published_dev.csv. '#' lines are comments, the first other line is the
 * header, columns are found by name (their order is free, unknown columns are ignored), a
 * field may be double-quoted to hold commas.
 *
 * Each row is read into an mp_vrow with every value checked against its range (common/
 * limits.h): counts are integers within their bounds, the measured value and the
 * inter-node rate are finite and positive ("nan", "inf" and "1e999" are refused), the
 * metric is one of three names, global_batch = local_batch x dp_replicate x dp_shard. The
 * first bad row is one MP_ERR_INVALID line naming the file, the line, the row's case and
 * the column (or the numbers a rule between columns ties). Nothing here loads a model or
 * simulates: the command does that with the rows (and the fuzz harness reads rows without
 * it). */
#ifndef MP_APP_VALIDATE_CSV_H
#define MP_APP_VALIDATE_CSV_H

#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MP_VCSV_MAX_ROWS 4096
#define MP_VCSV_MAX_COLS 64

typedef struct mp_vrow {
  int line;         /* in the file, from 1 */
  char name[96];    /* the case column ("?" when absent or empty) */
  char model[256];  /* data/models stem or path */
  char gpu[256];    /* data/gpus stem or path */
  char stack[256];  /* data/stacks stem or path */
  char metric[32];  /* tokens_per_s_per_gpu | peak_mem_gib | step_time_s */
  char ac[128];     /* as written; the command parses it (exec/plan.h) */
  char pp_schedule[32]; /* "" (1f1b), 1f1b, interleaved, gpipe, dualpipe, zbv or interleaved_zb
                           (mp_pp_schedule_parse: torch's class names too) */
  int64_t gpus;          /* 1..2^20 */
  int64_t gpus_per_node; /* 1..4096 */
  int64_t dp_replicate, dp_shard, tp, pp, cp, ep; /* each 1..2^20 */
  int64_t etp;          /* optional column: 0 absent or empty, else 1 (exec/mesh.h's expert grid) */
  int64_t dist_opt_instances; /* optional column: 0 absent or empty, else the distributed
                                 optimizer's instances (the mesh's dopt, exec/mesh.h) */
  int64_t seq;          /* 1..2^24 */
  int64_t local_batch;  /* sequences per data-parallel rank per step, 1..2^24: global_batch /
                           (dp_replicate x dp_shard) exactly */
  int64_t global_batch; /* 1..2^24 */
  int64_t micro_batch;  /* 1..local_batch dividing it; 0 when the column is absent or empty
                           (not published: the command picks the fastest that fits) */
  int64_t pp_virtual;   /* model chunks per pipeline rank, 1..MP_LIM_PP_VIRTUAL; 0 when absent
                           or empty (the schedule's default) */
  char pp_layout[256];  /* optional column: the stages' layers in Megatron-LM's
                           --pipeline-model-parallel-layout notation (the command parses it:
                           mp_pp_layout_parse); "" when absent or empty: the default split */
  int fp8;              /* 0 or 1 */
  char fp8_recipe[16];  /* as written (the command parses it: exec/plan.h, mp_fp8_recipe);
                           "" when the column is absent or empty: the stack's recipe */
  char fp8_scope[16];   /* optional column: linears, experts or all (--fp8-scope: exec/plan_fp8.h,
                           mp_fp8_scope, the routed experts' grouped GEMMs under torchtitan); ""
                           when absent or empty: the stack's own (torchtitan: the Linears) */
  char cuda_graphs[32];    /* optional column: Megatron-Core's CUDA graphs as written (none, attn,
                             layers, iteration, attn+moe_router, attn+moe_router+moe_preprocess:
                             exec/plan.h, mp_cuda_graphs); "" when absent or empty: none */
  char nccl_ctas[96];      /* optional column: each NCCL communicator's max_ctas as written
                             (name:N items split by spaces; sim.h, mp_sim_nccl_ctas_parse); ""
                             when absent or empty: NCCL's channel count */
  char nccl_version[16];   /* optional column: the NCCL the run used, X.Y or X.Y.Z as written
                             (sim.h, mp_sim_nccl_version_parse); "" when absent or empty: the
                             newest NCCL meshplan models */
  char ub_cfg[512];        /* optional column: Transformer Engine's userbuffers config, GEMM by
                             GEMM (gemm:method:num_sm:set_sm_margin items split by spaces; sim.h,
                             mp_sim_ub_cfg_parse); "" when absent or empty: TE's default */
  char moe_dispatcher[16]; /* as written (alltoall or deepep: exec/plan.h, mp_moe_dispatcher);
                             "" when the column is absent or empty: alltoall */
  char cp_comm_type[16];   /* as written (p2p, all_gather, a2a: exec/plan.h, mp_cp_comm), a
                             megatron stack's; "" when the column is absent or empty: p2p */
  char cp_rotate[16];      /* as written (allgather, alltoall: PyTorch's ring as torchtitan's
                              context_parallel_rotate_method sets it, exec/plan.h mp_cp_rotate), on
                              a torchtitan row; "" when absent or empty: the stack's */
  double moe_imbalance;       /* optional column: the busiest EP rank's routed tokens over the
                                 mean, in [1, MP_LIM_MOE_LOAD]; 0 when absent or empty (1) */
  double moe_capacity_factor; /* optional column: Megatron-Core's expert capacity factor, in
                                 (0, MP_LIM_MOE_LOAD]; 0 when absent or empty (dropless) */
  int moe_pad_to_capacity;    /* optional column, 0 or 1: --moe-pad-expert-input-to-capacity with
                                 the capacity factor; -1 when absent or empty (off) */
  double moe_rank_capacity_factor; /* optional column: --moe-expert-rank-capacity-factor (HybridEP's
                                      static budget); 0 when absent or empty */
  int sp;               /* 0 or 1; -1 when absent or empty (the stack's default) */
  char recompute_modules[96]; /* optional column: Megatron-Core's recompute modules, split by
                                 spaces (the command parses them: mp_recompute_modules_parse);
                                 "" when absent or empty: none */
  char recompute_method[16]; /* optional column: Megatron-Core's --recompute-method under ac full,
                                block or uniform; "" when absent or empty: none */
  int64_t recompute_num_layers; /* optional column: its --recompute-num-layers, >= 1; 0 when absent
                                   or empty */
  int moe_fp8_dispatch; /* 0 or 1: DeepSeek-V3's float8 dispatch (exec/plan.h); -1 when the
                           column is absent or empty: off */
  int64_t mtp_layers;   /* optional column: the model's multi-token-prediction modules
                           (exec/model.h mtp_layers), 0 or more; -1 when absent or empty (the
                           model's) */
  int fp8_act_cache;    /* 0 or 1: DeepSeek-V3's float8 activation cache (exec/plan.h); -1
                           when the column is absent or empty: off */
  char optimizer_moments[8]; /* fp32 or bf16 as written (exec/plan.h, moment_dtype); "" when
                                absent or empty: fp32 */
  char mfsdp_strategy[24]; /* Megatron FSDP's --data-parallel-sharding-strategy as written, on a
                              megatron row with dp_shard > 1 (exec/plan.h, mp_mfsdp_strategy);
                              "" when absent or empty: optim_grads_params */
  int64_t cpu_offload_layers; /* optional column: Megatron-Core's --cpu-offloading-num-layers
                                 (exec/plan.h cpu_offload_layers), 0 or more; 0 when absent or
                                 empty (off) */
  int fsdp_double_buffer; /* 0 or 1: Megatron FSDP's --fsdp-double-buffer; -1 when absent or
                             empty: off */
  int fsdp_flat_params;   /* 0 or 1: PyTorch FSDP1's flat parameters on a torchtitan stack
                             (exec/plan.h, fsdp.flat_params); -1 when absent or empty: FSDP2 */
  int64_t loss_chunks;    /* torchtitan's ChunkedLossWrapper num_chunks on a torchtitan stack
                             (exec/plan.h loss_chunks), 1 or more; 0 when absent or empty (1) */
  int fp8_all_gather;   /* 0 or 1: torchtitan's enable_fsdp_float8_all_gather (--fp8-all-gather); -1
                           when the column is absent or empty */
  int nvfp4_rht;        /* 0 or 1 with fp8_recipe nvfp4: 0 Transformer Engine's NVTE_NVFP4_DISABLE_RHT=1
                           (--nvfp4-no-rht); -1 absent or empty: the recipe's default, on */
  int fp8_dpa;          /* 0 or 1: Transformer Engine's float8 attention (--fp8-dpa, Megatron-Core's
                           --fp8-dot-product-attention); -1 absent or empty: bf16 attention */
  int fp8_amax_tp;      /* 0 or 1: delayed scaling's amaxes reduced over TP only (--fp8-amax-tp-only,
                           Transformer Engine v0.13 to v1.5 under NVTE_DP_AMAX_REDUCE_INTERVAL=0,
                           Megatron-Core core_v0.8's TP x CP amax group, tp_only_amax_red);
                           -1 absent or empty: over the data-parallel group */
  int fp8_param_gather; /* 0 or 1: Megatron-Core's --fp8-param-gather (exec/plan.h); -1 when
                           absent or empty: off */
  char fsdp_reduce_dtype[8]; /* fp32 or bf16 as written (exec/plan.h, fsdp.reduce_dtype); "" when
                                absent or empty: the stack's, fp32 */
  int ce_fusion;        /* 0 or 1: Megatron-Core's --cross-entropy-loss-fusion (exec/plan.h,
                           MP_LOSS_INPLACE_FUSED); -1 when the column is absent or empty: off */
  char ce_fusion_impl[8]; /* native or te as written: Megatron-Core's --cross-entropy-fusion-impl
                             with ce_fusion 1 (exec/plan.h, MP_LOSS_TE); "" when absent or
                             empty: native */
  int ddp_average_in_collective, ddp_check_grads; /* 0 or 1: Megatron-LM's
                           --ddp-average-in-collective, and whether its DDP checks each bucket's
                           norm; -1 when absent or empty: the stack's (exec/plan.h,
                           mp_ddp_options) */
  int ddp_align_param_gather; /* 1: Megatron-LM's --align-param-gather (exec/plan.h,
                           mp_ddp_options.align_param_gather); 0, or -1 when absent or empty: off */
  int grad_accum_fusion; /* 0: Megatron-LM's --no-gradient-accumulation-fusion (exec/plan.h,
                           mp_ddp_options.wgrad_unfused); 1, or -1 when absent or empty: the
                           stack's fusion */
  int overlap_moe_comm;  /* 0 or 1: Megatron-Core's --overlap-moe-expert-parallel-comm (exec/plan.h,
                           moe_a2a_overlap; simulate's --overlap-moe-comm); -1 when absent or
                           empty: off */
  int64_t ddp_bucket_size; /* Megatron-LM's --ddp-bucket-size in elements (exec/plan.h,
                           mp_ddp_options.bucket_size); 0 when absent or empty: one bucket a block */
  int async_tp;         /* 0 or 1: the TP collectives fused with their GEMMs (torchtitan's
                           AsyncTP, Megatron-Core's --tp-comm-overlap); -1 when the column is
                           absent or empty: the stack's default (on under megatron-core) */
  int64_t nvlink_domain;  /* GPUs of one NVLink domain across nodes (mp_cluster's nvlink_domain,
                             a multiple of gpus_per_node, 1..2^20); 0 when the column is absent
                             or empty: the node, whatever the GPU profile's */
  double inter_node_gbps; /* Gbit/s per GPU in (0, 1e5]; 0 when the field is empty */
  double value;           /* the published figure, finite and > 0 */
} mp_vrow;

/* Reads every row of the CSV text (modified in place: fields are split there) into *rows
 * (malloc'd, the caller frees; at most MP_VCSV_MAX_ROWS) and their count into *n (>= 1).
 * origin names the text in messages (the file's path). */
mp_status mp_vcsv_read(mp_ctx *ctx, char *text, const char *origin, mp_vrow **rows, int *n);

#ifdef __cplusplus
}
#endif
#endif
