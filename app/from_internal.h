/* What the readers of app/from_config.h share: the plan a configuration states, before it
 * becomes flags (app/from_config.c), and the readers (app/from_torchtitan.c,
 * app/from_megatron.c). */
#ifndef MP_APP_FROM_INTERNAL_H
#define MP_APP_FROM_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include "app/args.h"
#include "exec/model.h"
#include "exec/plan.h"

typedef struct mp_from_plan {
  const char *framework;  /* "torchtitan v0.2.0" or "Megatron-LM core_v0.14.0" */
  char model[MP_NAME_MAX]; /* a data/models stem; "" when the user's --model stands */
  char stack[32];
  int pp, dp_replicate, dp_shard, cp, tp, ep; /* resolved: no -1 */
  int dopt;               /* Megatron's distributed-optimizer instances without FSDP (dopt=N in
                             --mesh, exec/mesh.h; --num-distributed-optimizer-instances); 0: one */
  int etp;                /* the experts on their own grid with etp=N in --mesh (N > 0; N > 1 each
                             expert split over N ranks), 0: ep inside dp_shard */
  char ac[24];            /* meshplan's name: none, selective-op, selective-core, full, full:N */
  char recompute_modules[64]; /* --recompute-modules' list, ","-separated; "": none */
  char recompute_method[16]; /* --recompute-method under full granularity but uniform 1 (meshplan's
                                full): block or uniform; "": none */
  int recompute_num_layers;   /* its --recompute-num-layers; 0 without a method */
  char capacity_factor[32];   /* --moe-capacity-factor's value; "": dropless */
  int pad_to_capacity;        /* 1: --moe-pad-expert-input-to-capacity */
  char fp8[16];           /* the recipe, "" without float8 */
  char fp8_scope[16];     /* --fp8-scope: "experts" or "all" (torchtitan's grouped GEMMs); "": the Linears */
  int sp;                 /* -1: the stack's default, 0, 1 */
  int reshard;            /* 1: FSDP reshards after forward, 0: not, -1: no FSDP (DDP) */
  int64_t seq, micro_batch, global_batch;
  mp_pp_schedule pp_schedule;
  int pp_virtual;
  char pp_layers[512];    /* each stage's (interleaved: model chunk's) layer count, "A,B,..."; "": the default split */
  char cp_rotate[16];     /* "" where the stack's stands */
  char cp_comm_type[16];  /* Megatron-Core's --cp-comm-type; "" where the stack's (p2p) stands */
  char mfsdp_strategy[24]; /* Megatron FSDP's --data-parallel-sharding-strategy (with
                              --use-megatron-fsdp; the mesh then shards over dp_shard); "": none */
  int fsdp_double_buffer;  /* 1: Megatron FSDP's --fsdp-double-buffer */
  int async_tp;           /* 1: AsyncTP on (--async-tp); -1: the stack's TP comm overlap off
                             (--no-async-tp); 0: the stack's default */
  int moe_deepep;         /* 1: the EP dispatch by DeepEP's kernels (simulate's --moe-dispatcher deepep) */
  int moe_a2a_overlap;    /* 1: Megatron-Core's EP all-to-all overlap (simulate's --overlap-moe-comm) */
  int ce_fusion;          /* 1: Megatron-Core's --cross-entropy-loss-fusion (simulate's option of that name);
                             2: with --cross-entropy-fusion-impl te */
  char cuda_graphs[32];   /* simulate's --cuda-graphs scope (attn, layers, iteration); "": none */
  int fp8_all_gather;     /* 1: torchtitan's enable_fsdp_float8_all_gather (--fp8-all-gather) */
  int fp8_dpa;            /* 1: Megatron-Core's --fp8-dot-product-attention (simulate's --fp8-dpa) */
  int fp8_param_gather;   /* 1: Megatron-Core's --fp8-param-gather (simulate's, explain's and plan's) */
  int64_t mtp_layers;     /* multi-token-prediction modules (Megatron-Core's --mtp-num-layers; torchtitan: 0) */
  int64_t cpu_offload_layers; /* Megatron-Core's --cpu-offloading-num-layers (simulate's
                                 --cpu-offload-layers); 0: off */
  int ddp_average, ddp_no_check; /* 1: Megatron-LM's --ddp-average-in-collective,
                                    --no-check-for-nan-in-loss-and-grad (simulate's too) */
  int ddp_align;          /* 1: Megatron-LM's --align-param-gather (simulate's too) */
  int wgrad_unfused;      /* 1: Megatron-LM's --no-gradient-accumulation-fusion (simulate's too) */
  int64_t ddp_bucket;     /* Megatron-LM's --ddp-bucket-size in elements (simulate's too); 0: not given */
  int grad_bf16;          /* 1: Megatron-LM's --grad-reduce-in-bf16 (simulate's --fsdp-reduce-dtype bf16) */
  char ignored[2048];     /* keys read that change no cost, ", "-separated */
} mp_from_plan;

/* Appends key to p->ignored (truncated with "..." when full). */
void mp_from_ignore(mp_from_plan *p, const char *key);

/* The readers. world: the cluster's GPUs, 0 where the command line does not fix one (plan's
 * --gpus A..B); a configuration that needs it then is a usage error. The model where the
 * command line names one (--model or --hf-config), else NULL. */
mp_status mp_from_torchtitan(mp_ctx *ctx, const char *text, const char *origin, int world, mp_from_plan *p);
mp_status mp_from_megatron(mp_ctx *ctx, const char *text, const char *origin, int world, const mp_model *given,
                           mp_from_plan *p);

#endif
