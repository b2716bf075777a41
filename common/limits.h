/* The accepted range of every size meshplan reads from a user: model and cluster files,
 * GPU and stack profiles, validate's CSV rows and the command line. One table, so that a
 * field means the same wherever it is read and every refusal can state its range.
 *
 * Upper bounds are set well above what real hardware and published models reach (the
 * margin is given with each), and low enough that every product meshplan forms from them
 * fits in int64 with room to spare: a model within these bounds has fewer than 2^50
 * parameters, so parameter bytes (16 per parameter for fp32 weights, gradients and AdamW
 * state) stay below 2^54, and a step within them has at most 2^32 tokens. Products that
 * could still leave int64 (per-micro-batch activation sizes, say) are formed with the
 * checked helpers of common/checked.h. Floating-point fields must be finite: JSON accepts
 * 1e999 (infinity) and strtod accepts "nan" and "inf". */
#ifndef MP_COMMON_LIMITS_H
#define MP_COMMON_LIMITS_H

/* ---- models (data/models, Hugging Face config.json) ---------------------------------- */

/* Vocabulary: the largest published is Gemma 3's 262,144 (2^18); 2^22 is 16x that. */
#define MP_LIM_VOCAB (1LL << 22)
/* Hidden size: the widest published is Megatron-LM's 1T configuration, 25,600; 2^20 is
 * 40x that. */
#define MP_LIM_D_MODEL (1LL << 20)
/* Query heads: published models use up to 160 (Megatron 1T); 2^16 leaves 400x. */
#define MP_LIM_HEADS (1LL << 16)
/* Width of one head: published models use 64..256; 2^12 is 16x. */
#define MP_LIM_HEAD_DIM (1LL << 12)
/* MLP hidden sizes (dense, routed expert, shared expert): the widest published dense MLP
 * is Megatron 1T's 102,400; 2^22 is 40x. */
#define MP_LIM_D_FF (1LL << 22)
/* Context length: the longest published is Llama 4 Scout's 10M tokens; 2^24 = 16.8M. */
#define MP_LIM_SEQ (1LL << 24)
/* Routed experts per MoE layer: the most published is Kimi K2's 384; 2^14 is 40x. */
#define MP_LIM_EXPERTS (1LL << 14)
/* Shared experts: published MoE models use 0..2. */
#define MP_LIM_SHARED_EXPERTS 256
/* Parameters of the whole model: 2^50 = 1.1e15, 500x the largest trained dense or MoE
 * model (about 2e12). */
#define MP_LIM_PARAMS (1LL << 50)
/* RoPE base: published values run 1e4 .. 5e6. */
#define MP_LIM_ROPE_THETA 1e12

/* ---- clusters and GPUs (data/clusters, data/gpus) ------------------------------------ */

/* GPUs in one job: the largest clusters built hold about 2e5 GPUs; 2^20 = 1,048,576. */
#define MP_LIM_GPUS (1LL << 20)
/* GPUs in one node (one NVLink domain): NVL72 racks hold 72, proposed NVL576 576. */
#define MP_LIM_GPUS_PER_NODE 4096
/* Dense peak per dtype, TFLOP/s: B200's bf16 is 2,250; 1e5 is 40x. */
#define MP_LIM_TFLOPS 1e5
/* Device memory, GiB: B200 has 180, a CPU host a few TiB; 2^16 GiB = 64 TiB. */
#define MP_LIM_MEM_GIB 65536.0
/* Memory bandwidth, GB/s: B200's HBM3e is 8,000; 1e6 is 100x. */
#define MP_LIM_MEM_GBPS 1e6
/* Link bandwidth per direction, GB/s (NVLink 5: 900) and NIC rate, Gbit/s (800 per GPU
 * today): 1e5 is 100x either. */
#define MP_LIM_LINK_GBPS 1e5
/* Link latency, microseconds: NVLink and InfiniBand are 1..10; one second bounds it. */
#define MP_LIM_LATENCY_US 1e6
/* Compute capability x 10 (sm_90 is 90, sm_100 100); 0 is the CPU profile. */
#define MP_LIM_COMPUTE_CAPABILITY 200
/* Price per GPU-hour, USD. */
#define MP_LIM_PRICE 1e4

/* ---- stack profiles (data/stacks) ------------------------------------------------------ */

/* Per-kernel and per-collective launch overheads, microseconds (published: 2..50). */
#define MP_LIM_OVERHEAD_US 1e6
/* Allocator fragmentation factor (published caching allocators: 1.0 .. 1.3). */
#define MP_LIM_FRAG 16.0
/* The GEMM size (M x N x K) at which efficiency is half its maximum (fits: ~1e9). */
#define MP_LIM_HALF_MNK 1e18

/* ---- the step and the run ---------------------------------------------------------------- */

/* Sequences per step: Llama 3 405B trained with 2,048 of 8,192 tokens (16M tokens);
 * 2^24 sequences is 8,192x that. */
#define MP_LIM_GLOBAL_BATCH (1LL << 24)
/* Tokens per step (sequences x seq): 2^32 = 4.3e9, 256x the Llama 3 batch. */
#define MP_LIM_STEP_TOKENS (1LL << 32)
/* Elements of one tensor of one micro-batch (tokens x the widest per-token row): 2^40 fp32
 * elements are 4 TiB, 20x the memory of the largest GPU; with 512 layers and the dozen
 * tensors a layer saves, activation bytes stay below 2^56. */
#define MP_LIM_MICRO_ELEMS (1LL << 40)
/* A MoE imbalance or capacity factor (exec/plan.h, mp_moe_routing): published capacity
 * factors are 1.0 .. 2.0 (Switch Transformer, GShard, Megatron-Core's examples); an
 * imbalance is at most ep (every token on one rank), which the plan checks against the
 * model. 2^14 = MP_LIM_EXPERTS bounds both far above any meaningful value. */
#define MP_LIM_MOE_LOAD 16384.0
/* Model chunks per pipeline stage (interleaved 1F1B): up to one layer a chunk, which
 * published NeMo layouts come close to (virtual pipeline 20 and more on 80 layers); the
 * plan's rule keeps pp x chunks within the layers (exec/rules.h), so with pp >= 2 and at most
 * MP_MAX_LAYERS = 512 layers, 256. */
#define MP_LIM_PP_VIRTUAL 256
/* Training steps of one run: Llama 3 pre-training took about 1.2M steps; 2^24 = 16.8M. */
#define MP_LIM_STEPS (1LL << 24)
/* AdamW learning rate and weight decay: published recipes use lr <= 1e-2 and decay
 * <= 0.1. The learning rate is bounded far above any useful value (1e4): a rate that
 * makes training diverge is the training loop's to detect and report (a NaN or Inf loss
 * stops the run naming the step), not a malformed input; decay is bounded at 1 (10x). */
#define MP_LIM_LR 1e4
#define MP_LIM_WEIGHT_DECAY 1.0
/* Gradient-norm clip (published: 1.0). */
#define MP_LIM_CLIP 1e9
/* Worker threads of the planner. */
#define MP_LIM_THREADS 4096

#endif
