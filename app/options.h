/* The option rows the meshplan subcommands share, each declared once.
 *
 * A row expands to one mp_opt initializer (args.h); a subcommand lists the rows it takes
 * in its option table, in the order its --help shows them, beside rows of its own. The
 * flag, its metavar and its help text are the same in every command that takes it. Where
 * a default (or a word of the help) differs between commands, the row takes that text as
 * an argument, so each command's --help states its own default; the command's code, not
 * the row, applies it.
 *
 * Invariant: what to plan for is read by one reader in every command that takes it
 * (mp_cmd_load_model for --model and --hf-config, mp_cmd_load_cluster for --cluster,
 * --gpus, --gpu, --gpus-per-node, --nvlink-domain and --inter-gbps, mp_cmd_check_seq for --allow-long-seq).
 * A command reads a shared option with the same parser wherever it is read
 * (mp_cmd_plan_options for --ac, --fp8, --sp, --no-sp, --seq, --micro-batch and --global-batch;
 * mp_cmd_mesh_ep for --ep), so the same flag means the same everywhere. */
#ifndef MP_APP_OPTIONS_H
#define MP_APP_OPTIONS_H

#include "app/args.h"

/* ---- what to plan for -------------------------------------------------------------------- */

#define MP_OPT_MODEL(dflt)                                                                         \
  { "--model", "M", "model name (data/models stem) or path to a JSON file (default " dflt ")", NULL }
/* the model's source, and its multi-token-prediction depth (mp_cmd_load_model) */
#define MP_OPT_HF_CONFIG                                                                           \
  { "--hf-config", "PATH", "a Hugging Face config.json instead of --model", NULL },                \
  { "--mtp-num-layers", "N", "multi-token-prediction modules after the last block (DeepSeek-V3's "  \
    "MTP, Megatron-Core's --mtp-num-layers), on the last pipeline stage; 0: none (default: the "    \
    "model's mtp_layers, HF num_nextn_predict_layers)", NULL }
#define MP_OPT_CLUSTER(dflt)                                                                       \
  { "--cluster", "C", "cluster name (data/clusters stem) or path to a JSON file (default " dflt ")", NULL }
#define MP_OPT_GPUS                                                                                \
  { "--gpus", "N", "instead of --cluster: N GPUs of --gpu TYPE, --gpus-per-node K per node", NULL }
/* plan's --gpus: one count, or a sweep of counts (cmd_plan.c) */
#define MP_OPT_GPUS_OR_SWEEP                                                                       \
  { "--gpus", "N", "instead of --cluster: N GPUs of --gpu TYPE, --gpus-per-node K per node; or A..B, a "   \
    "sweep of the powers of two from A to B (A..B:S: steps of S), each size searched and its best "   \
    "plan shown", NULL }
/* --gpu with --gpus; `dflt`: "default h100-sxm", or "required" */
#define MP_OPT_GPU_OF_GPUS(dflt)                                                                   \
  { "--gpu", "TYPE", "GPU profile of --gpus (data/gpus stem or path to a JSON file; " dflt ")", NULL }
#define MP_OPT_GPUS_PER_NODE(dflt)                                                                 \
  { "--gpus-per-node", "K", "GPUs per node for --gpus (default " dflt ")", NULL }
/* --gpu with --device cuda; `role`: what the profile is for */
#define MP_OPT_GPU_OF_DEVICE(role)                                                                 \
  { "--gpu", "TYPE", "--device cuda: the GPU profile (data/gpus stem or path to a JSON file) " role \
    " (default: the one matching the device's name)", NULL }
/* the cluster's NVLink domain (mp_cmd_load_cluster), with --cluster or --gpus */
#define MP_OPT_NVLINK_DOMAIN                                                                       \
  { "--nvlink-domain", "D", "GPUs one NVLink switch fabric joins across nodes (GB200 NVL72: 72, "     \
    "NVL36x2: 36); groups inside one run on NVLink, others on the NICs (default: the cluster's, "   \
    "else the GPU profile's, else the node)", NULL }
#define MP_OPT_INTER_GBPS                                                                          \
  { "--inter-gbps", "X", "inter-node Gbit/s per GPU for --gpus (default 400)", NULL }
#define MP_OPT_STACK(dflt)                                                                         \
  { "--stack", "PROFILE", "software stack profile (data/stacks stem or path to a JSON file; default " dflt ")", \
    NULL }
#define MP_OPT_HEADROOM(dflt)                                                                      \
  { "--headroom", "F", "fraction of GPU memory kept free (default " dflt ")", NULL }

/* ---- the plan ---------------------------------------------------------------------------- */

/* `more`: what else the command's --mesh takes or defaults to */
#define MP_OPT_MESH(more)                                                                          \
  { "--mesh", "SPEC", "device mesh, e.g. dp_shard=4,tp=2 (dims pp, dp_replicate, dp_shard, cp, tp, ep, etp: each routed " \
    "expert split over etp ranks on the experts' own grid; dopt: Megatron-LM's distributed optimizer in that many " \
    "instances of consecutive dp_replicate ranks, --num-distributed-optimizer-instances; " more ")", \
    NULL }
#define MP_OPT_EP(more)                                                                            \
  { "--ep", "N", "expert-parallel degree, carved out of dp_shard (the same as ep=N in --mesh" more ")", NULL }
#define MP_OPT_AC(more)                                                                           \
  { "--ac", "POLICY",                                                                              \
    "activation checkpointing: none, selective (the attention module), selective-op (torchtitan's " \
    "op-level), selective-core (Megatron's core attention), full, or full:N (every N-th block) "   \
    "(default none" more ")", NULL }
/* simulate and explain: Megatron-Core's recompute modules (mp_cmd_plan_options) */
#define MP_OPT_RECOMPUTE_MODULES                                                                   \
  { "--recompute-modules", "LIST", "Megatron-Core's --recompute-modules under selective granularity, " \
    "names split by commas or slashes: layernorm (input_layernorm and pre_mlp_layernorm), mla_up_proj (MLA's "   \
    "latent norms, up projections and RoPE), moe_act (the routed experts' SwiGLU), each output freed " \
    "after its consumer ran and recomputed in backward; mlp (a dense layer's MLP), moe (a MoE layer whole, " \
    "its all-to-alls included) and shared_experts, each checkpointed from its kept input and re-run " \
    "before its backward; core_attn is --ac selective-core. Beside --ac none or selective-core; e.g. " \
    "DeepSeek-V3's layernorm,mla_up_proj,moe_act", NULL }
/* simulate and explain: Megatron-Core's recompute method under full AC (mp_cmd_plan_options) */
#define MP_OPT_RECOMPUTE_METHOD                                                                    \
  { "--recompute-method", "block|uniform", "Megatron-Core's --recompute-method under --ac full, per " \
    "model chunk: block checkpoints the chunk's first --recompute-num-layers layers, uniform its "   \
    "layers in groups of that many (one input saved a group); megatron stacks only", NULL },         \
  { "--recompute-num-layers", "N", "with --recompute-method: its layer count (Megatron-Core's "       \
    "--recompute-num-layers)", NULL }
#define MP_OPT_FP8(more)                                                                           \
  { "--fp8", "[on|off|tensorwise|current|delayed|rowwise|mxfp8|blockwise|nvfp4]",                \
    "float8 Linear layers (E4M3 forward, E5M2 gradients) under a recipe of scales: tensorwise "    \
    "(each tensor's own amax; current is Transformer Engine's name for it), delayed (TE's amax "   \
    "history), rowwise (torchao), mxfp8 (1x32 blocks, Blackwell), blockwise (1x128 and 128x128 " \
    "tiles), nvfp4 (E2M1 with 1x16 E4M3 scales, Blackwell, megatron-core); bare or on: the stack's recipe (tensorwise, delayed under megatron-core) (default "  \
    "off" more ")", NULL }
/* explain and simulate: one plan's sequence parallelism (plan's --no-sp is the search's) */
#define MP_OPT_SP                                                                                  \
  { "--sp", NULL,                                                                                  \
    "sequence parallelism with tp > 1: norms and residuals on [T/tp, H], an all-gather into and "  \
    "a reduce-scatter out of each TP region (default: on where the stack runs it)", NULL }
#define MP_OPT_NO_SP                                                                               \
  { "--no-sp", NULL, "tensor parallelism without sequence parallelism (the all-reduce form)", NULL }
/* explain and simulate: one plan's pipeline schedule (mp_cmd_pp_schedule) */
#define MP_OPT_PP_SCHEDULE                                                                         \
  { "--pp-schedule", "S", "1f1b | interleaved | gpipe | dualpipe (DeepSeek-V3's bidirectional "     \
    "schedule: even pp, an even number of micro-batches, at least 2 pp; parameters twice a rank) "   \
    "| zbv | interleaved_zb (torch.distributed.pipelining's zero-bubble ZBVZeroBubble, 2 chunks a " \
    "rank in a V, and InterleavedZeroBubble; torch's names are accepted too) (default 1f1b)", NULL }
#define MP_OPT_PP_VIRTUAL                                                                          \
  { "--pp-virtual", "N", "virtual stages per rank for interleaved and interleaved_zb (default 2)", NULL }
#define MP_OPT_PP_LAYERS                                                                           \
  { "--pp-layers", "A,B,...", "each pipeline stage's layer count, summing to the model's layers "  \
    "(Megatron-LM's --decoder-first/last-pipeline-num-layers), e.g. 7,8,...,8,7 for 126 layers on "  \
    "pp=16; interleaved: one count per model chunk, pp x pp_virtual in model order, the first and " \
    "last may be 0 (default: torchtitan's split, the remainder on the middle stages; simulate "    \
    "on a megatron stack with more chunks than layers: Megatron's split, the embedding and the "   \
    "loss counted as a layer each)", NULL },                                                       \
  { "--pp-layout", "STR", "the same in Megatron-LM's --pipeline-model-parallel-layout notation: "  \
    "virtual stages in model order split by |, E the embedding, t a layer, L the loss, X*N and "   \
    "(...)*N repeats; e.g. \"E|(t|)*126L\" for 126 layers on pp=16 x pp_virtual 8 (Llama 3 405B)", \
    NULL }
/* simulate, explain and plan: PyTorch's context-parallel ring and Megatron-Core's forms
 * (mp_cmd_cp_rotate) */
#define MP_OPT_CP_ROTATE                                                                           \
  { "--cp-rotate", "M", "with cp > 1, how PyTorch's ring moves K and V (torchtitan's "              \
    "context_parallel_rotate_method): allgather, every rank's once per pass, or alltoall, one "      \
    "rank's to the next before each step (default: the stack's, allgather)", NULL },                 \
  { "--cp-comm-type", "T", "with cp > 1 on a megatron stack, Megatron-Core's --cp-comm-type: p2p, "  \
    "the ring of K, V (default); all_gather, K, V all-gathered and dK, dV reduce-scattered, exposed " \
    "(Llama 3's); a2a, all-to-alls of Q, K, V and the output over the heads (cp dividing them)", NULL }
/* simulate, explain and plan: Megatron FSDP, what dp_shard > 1 runs on a megatron stack
 * (mp_cmd_megatron_weights) */
#define MP_OPT_MEGATRON_FSDP                                                                       \
  { "--data-parallel-sharding-strategy", "S", "with dp_shard > 1 on a megatron stack (Megatron "     \
    "FSDP, --use-megatron-fsdp), Megatron-Core's option of that name: optim_grads_params (default) " \
    "shards the bf16 weights, fp32 main weights, fp32 gradients and Adam state; no_shard and optim " \
    "are Megatron's DDP and distributed optimizer on dp_replicate; optim_grads is refused", NULL },   \
  { "--fsdp-double-buffer", NULL, "Megatron FSDP's option of that name: the gathered weights in two " \
    "fixed unit buffers, so only the next layer is prefetched (default: up to 500M elements ahead)", \
    NULL }
/* simulate, explain and plan: Megatron-Core's float8 model weights (mp_cmd_megatron_weights) */
#define MP_OPT_FP8_PARAM_GATHER                                                                    \
  { "--fp8-param-gather", NULL, "Megatron-Core's option of that name (with --fp8 on a megatron "     \
    "stack, the distributed optimizer or Megatron FSDP): the float8 Linears' weights kept in "      \
    "float8 (1 byte at rest, in the parameter all-gather; no per-step weight cast), refreshed from " \
    "the fp32 masters after each step; delayed, tensorwise or blockwise; with mxfp8 (distributed " \
    "optimizer) the weights kept as MXFP8, gathered in bf16 through the gradient buffer and "       \
    "quantized after the gather", NULL },                   \
  { "--nvfp4-no-rht", NULL, "with --fp8 nvfp4: Transformer Engine's NVTE_NVFP4_DISABLE_RHT=1, no "   \
    "random Hadamard transform on the weight-gradient GEMM's operands (each cast writes both "      \
    "copies in one kernel), as the MLPerf v5.1 NVFP4 configs run", NULL },                          \
  { "--fp8-dpa", NULL, "with --fp8 on a megatron stack: Transformer Engine's float8 attention "        \
    "(Megatron-Core's --fp8-dot-product-attention): cuDNN's FP8 fused attention and the casts of "   \
    "q, k, v and the output gradient; Blackwell, CP 1", NULL },                                     \
  { "--fp8-amax-tp-only", NULL, "with --fp8 delayed on a megatron stack: the amaxes all-reduced "   \
    "over the TP group only, as Transformer Engine v0.13 to v1.5 do under "                          \
    "NVTE_DP_AMAX_REDUCE_INTERVAL=0 and Megatron-Core core_v0.8 (its amax group TP x CP) or "        \
    "tp_only_amax_red from core_v0.9 (default: over the data-parallel group)", NULL }
/* simulate, explain and plan: torchtitan's float8 FSDP all-gather and float8 scope
 * (mp_cmd_fp8_all_gather) */
#define MP_OPT_FP8_ALL_GATHER                                                                      \
  { "--fp8-all-gather", NULL, "torchtitan's enable_fsdp_float8_all_gather (with --fp8 tensorwise "  \
    "on a torchtitan stack): FSDP gathers each float8 Linear's weight (its TP shard under tp > 1) "\
    "as the float8 cast of its shard, 1 byte an element, with the tensors' scales precomputed "   \
    "once a step; no cast after the gather", NULL },                                               \
  { "--fp8-scope", "linears|experts|all", "with --fp8 rowwise or mxfp8 on a torchtitan stack: the "   \
    "GEMMs in float8: the Linears (quantize.linear.*, the default), the routed experts' grouped "   \
    "GEMMs (quantize.grouped_mm.* fqns [\"experts\"], torchao's _scaled_grouped_mm), or both", NULL }
/* simulate, explain and plan: torchtitan's AsyncTP and Megatron-Core's TP comm overlap, on or
 * off (mp_cmd_async_tp) */
#define MP_OPT_ASYNC_TP                                                                            \
  { "--async-tp", NULL, "torchtitan's AsyncTP (with tp > 1 and SP): the all-gathers into and the " \
    "reduce-scatters out of the TP regions run in tp chunks beside their GEMMs; stacks that run " \
    "it only (torchtitan-compile; megatron-core runs its TP comm overlap so by default)", NULL }, \
  { "--no-async-tp", NULL, "Megatron-Core's TP comm overlap (--tp-comm-overlap) / torchtitan's "   \
    "AsyncTP off, where the stack runs it by default (megatron-core): the SP all-gathers and "      \
    "reduce-scatters run on NCCL apart from their GEMMs, as Megatron-LM runs without the flag", NULL }
/* simulate, explain and plan: the EP dispatcher (mp_cmd_moe_dispatcher); simulate and explain:
 * Megatron-Core's all-to-all overlap (mp_cmd_moe_comm) */
#define MP_OPT_MOE_DISPATCHER                                                                      \
  { "--moe-dispatcher", "D", "how EP dispatch and combine move tokens: alltoall (NCCL's, a copy per " \
    "token and expert), deepep (Megatron-Core's flex dispatcher with DeepEP: a copy per token and " \
    "remote node, forwarded over NVLink; megatron-core, ep > 1; with etp > 1 a copy to each " \
    "expert-TP rank of the expert, no etp all-gather) or hybridep (the flex dispatcher's HybridEP " \
    "backend: the same movement on the stack's hybridep_sms); in plan: every candidate's, ep > 1 " \
    "(default alltoall)", NULL }
#define MP_OPT_OVERLAP_MOE_COMM                                                                    \
  { "--overlap-moe-comm", NULL, "Megatron-Core's --overlap-moe-expert-parallel-comm: the forward of " \
    "one micro-batch and the backward of another run as one step, each one's EP all-to-alls beside " \
    "the other's compute (megatron-core; ep > 1, interleaved stages when pp > 1, no full AC)", NULL } \
  , { "--moe-fp8-dispatch", NULL, "DeepSeek-V3's float8 dispatch (sec. 3.3.3): the tokens sent to " \
    "the experts, and the gradients sent into their down projections, travel as E4M3 with an fp32 " \
    "scale per 128 elements; the combines stay bf16 (ep > 1, --fp8)", NULL }
/* simulate, explain and plan: torchtitan's chunked loss (mp_cmd_loss_chunks; exec/plan.h
 * loss_chunks) */
#define MP_OPT_LOSS_CHUNKS                                                                         \
  { "--loss-chunks", "N", "torchtitan's ChunkedLossWrapper (num_chunks, 8 in its llama3 configs "    \
    "since 786e26f8e): the head and the cross-entropy run in N sequence chunks, forward and "      \
    "backward each, so one chunk's logits are live at a time; N divides the rank's sequence "      \
    "(torchtitan stacks) (default 1: the micro-batch at once, as torchtitan v0.2.x runs it)", NULL }
/* simulate and explain: DeepSeek-V3's low-precision storage, FSDP's reduction dtype, FSDP1's
 * flat parameters and torchtitan's chunked loss (mp_cmd_storage; exec/plan.h, fp8_act_cache,
 * moment_dtype, fsdp.reduce_dtype, fsdp.flat_params and loss_chunks) */
#define MP_OPT_STORAGE                                                                             \
  { "--fp8-act-cache", NULL, "DeepSeek-V3's activation cache (sec. 3.3.3): the tensors saved for " \
    "the float8 Linears' backward and the MoE's SwiGLU inputs kept as E4M3 with an fp32 scale per " \
    "128, the attention output in E5M6 (--fp8 blockwise, stack megatron-core)", NULL },           \
  { "--optimizer-moments", "DTYPE", "AdamW's first and second moments: fp32 or bf16 (DeepSeek-V3 " \
    "sec. 3.3.3; Megatron-Core's --exp-avg-dtype/--exp-avg-sq-dtype) (default fp32)", NULL },    \
  { "--fsdp-reduce-dtype", "DTYPE", "the dtype FSDP reduce-scatters gradients in (and all-reduces " \
    "them in across dp_replicate): fp32, as torchtitan runs it, or bf16, as FSDP1's "               \
    "MixedPrecision(reduce_dtype=torch.bfloat16) does in IBM's fms-fsdp; the reduced shard is "     \
    "cast back to the fp32 gradient (torchtitan stacks); under a megatron stack the main_grad "     \
    "buffers' dtype, bf16 being Megatron-LM's --grad-reduce-in-bf16 (default fp32)", NULL },     \
  { "--fsdp-flat-params", NULL, "PyTorch FSDP1's flat parameters (FullyShardedDataParallel, as "  \
    "IBM's fms-fsdp runs it): each unit gathered into and reduce-scattered from one flat tensor, "  \
    "without FSDP2's copy-out and copy-in on the compute stream (torchtitan stacks)", NULL },      \
  MP_OPT_LOSS_CHUNKS
/* simulate and explain: Megatron-Core's fused cross-entropy (mp_cmd_ce_fusion) */
#define MP_OPT_CE_FUSION                                                                           \
  { "--cross-entropy-loss-fusion", NULL, "Megatron-Core's option of that name: the vocab-parallel " \
    "cross-entropy's steps compiled into one kernel a function (fewer passes over the fp32 "        \
    "logits) where Megatron's default runs one eager kernel a step (megatron-core, megatron-lm)", NULL }, \
  { "--cross-entropy-fusion-impl", "IMPL", "Megatron-Core's option of that name, with "            \
    "--cross-entropy-loss-fusion: native (its compiled kernels) or te (Transformer Engine's, which "  \
    "write the gradient over the bf16 logits in place: no fp32 copy of them) (default native)", NULL }, \
  { "--ddp-average-in-collective", NULL, "Megatron-LM's option of that name: each gradient bucket "  \
    "averaged by the reduction itself, not scaled by 1/dp before it (megatron-core, megatron-lm)", NULL }, \
  { "--no-check-for-nan-in-loss-and-grad", NULL, "Megatron-LM's option of that name: no norm of each " \
    "gradient bucket taken before its reduction (megatron-core, which checks by default)", NULL },   \
  { "--align-param-gather", NULL, "Megatron-LM's option of that name (with the distributed optimizer " \
    "and overlapped gathers): without interleaving no schedule dispatches the gathers ahead, so each " \
    "block's starts after the compute before it and the block waits for it (megatron-core, megatron-lm)", NULL }, \
  { "--ddp-bucket-size", "N", "Megatron-LM's option of that name, in elements (with overlapped " \
    "reduction): each block's parameters grouped into buckets in reverse order, one closing once it " \
    "holds N, each gathered and reduced by its own collective (default: one bucket a block; " \
    "megatron-core, megatron-lm)", NULL },                                                         \
  { "--no-gradient-accumulation-fusion", NULL, "Megatron-LM's option of that name: each weight " \
    "gradient written in bf16 and moved into the main_grad by a kernel of its own (a copy under "   \
    "Megatron FSDP, an add under its DDP), where the stack's fusion accumulates it in the GEMM "     \
    "(megatron-core, megatron-lm)", NULL }
/* simulate, explain and plan: the channels of Megatron-Core's NCCL communicators (mp_cmd_nccl) */
#define MP_OPT_NCCL_CTAS                                                                           \
  { "--nccl-ctas", "LIST", "each NCCL communicator's max_ctas as Megatron-Core's "                \
    "--nccl-communicator-config-path sets it, name:N items split by spaces (dp, dp_cp, tp, cp, pp, " \
    "ep, ep_dp): at most N channels, so N SMs, on that group's collectives, e.g. \"dp_cp:8 tp:8\" " \
    "(default: NCCL's channel count)", NULL }
/* simulate, explain and plan: the NCCL the run used (mp_cmd_nccl) */
#define MP_OPT_NCCL_VERSION                                                                        \
  { "--nccl-version", "X.Y[.Z]", "the NCCL the run used, e.g. 2.21.5: which algorithms NCCL's "   \
    "tuning model may pick (PAT, for an all-gather or reduce-scatter of one rank a node, from "   \
    "2.23) (default: the newest NCCL meshplan models)", NULL }
/* simulate and explain: Transformer Engine's userbuffers config (mp_cmd_ub_cfg) */
#define MP_OPT_UB_CFG                                                                              \
  { "--ub-cfg", "LIST", "Transformer Engine's userbuffers config as Megatron-Core's "             \
    "--tp-comm-overlap-cfg states it, gemm:method:num_sm:set_sm_margin items split by spaces "     \
    "(gemms qkv_fprop fc1_fprop proj_fprop fc2_fprop proj_dgrad fc2_dgrad qkv_dgrad fc1_dgrad "     \
    "qkv_wgrad fc1_wgrad; methods ring_exchange pipeline bulk), e.g. \"qkv_wgrad:bulk:8:0\" "      \
    "(megatron-core; default: TE's own config)", NULL }
/* simulate and explain: Megatron-Core's CUDA graphs (mp_cmd_cuda_graphs; exec/plan.h, mp_cuda_graphs) */
#define MP_OPT_CUDA_GRAPHS                                                                         \
  { "--cuda-graphs", "S", "what Megatron-Core captures in CUDA graphs (megatron-core): none; attn, "   \
    "each layer's attention (--external-cuda-graph --cuda-graph-scope attn); layers, each "        \
    "TransformerLayer (--enable-cuda-graph); iteration, every micro-batch's forward and backward "  \
    "(--cuda-graph-scope full_iteration, with --no-check-for-nan-in-loss-and-grad); "               \
    "attn+moe_router, the attention on through a MoE layer's router, and "                         \
    "attn+moe_router+moe_preprocess, also its dispatcher's preprocess (--cuda-graph-impl "           \
    "transformer_engine --cuda-graph-scope attn moe_router [moe_preprocess]: the dispatch, experts " \
    "and combine eager) (default none)", NULL }
/* simulate and explain: Megatron-Core's CPU offloading (mp_cmd_cpu_offload; exec/plan.h) */
#define MP_OPT_CPU_OFFLOAD                                                                         \
  { "--cpu-offload-layers", "N", "Megatron-Core's --cpu-offloading --cpu-offloading-num-layers N "  \
    "(megatron-core): the saved tensors Transformer Engine marks in the first N layers copied to "   \
    "the host after their forward and back before their backward over the GPU's host link, "       \
    "exposed where a copy outlasts the layers it runs beside; pp 1, no recompute (default 0: off)", \
    NULL }
/* simulate, explain and plan: the experts' load (mp_cmd_moe_routing; exec/plan.h, mp_moe_routing).
 * train states its own --moe-capacity-factor, the runtime's drop rule (app/cmd_train.c). */
#define MP_OPT_MOE_ROUTING                                                                         \
  { "--moe-imbalance", "F", "the busiest EP rank's routed tokens over the mean (F >= 1): its expert " \
    "GEMMs and all-to-all bytes scale by F, within the capacity, and every rank waits for it (default " \
    "1: balanced, as benchmark recipes force it)", NULL },                                          \
  { "--moe-capacity-factor", "C", "Megatron-Core's --moe-expert-capacity-factor: each expert takes at " \
    "most C x tokens x top_k / experts of a rank's routed tokens, the excess dropped (C > 0; default: " \
    "dropless)", NULL },                                                                           \
  { "--moe-pad-expert-input-to-capacity", NULL, "with --moe-capacity-factor: every expert computes " \
    "exactly its capacity (Megatron-Core's option of that name)", NULL },                            \
  { "--moe-expert-rank-capacity-factor", "C", "HybridEP only: each EP rank's static budget of C x " \
    "tokens x top_k routed rows (Megatron-Core's option of that name, core_v0.18.0): the host reads no " \
    "count, so whole-layer and full-iteration graphs capture the MoE layer", NULL }
#define MP_OPT_SEQ(dflt) { "--seq", "S", "tokens per sequence (default " dflt ")", NULL }
#define MP_OPT_ALLOW_LONG_SEQ                                                                      \
  { "--allow-long-seq", NULL, "accept --seq beyond the model's max_seq (positions it was not trained on)", NULL }
#define MP_OPT_MICRO_BATCH(dflt)                                                                   \
  { "--micro-batch", "B", "sequences per micro-batch per data-parallel rank (default " dflt ")", NULL }
#define MP_OPT_GLOBAL_BATCH(dflt)                                                                  \
  { "--global-batch", "G", "sequences per step over all data-parallel ranks (default " dflt ")", NULL }
#define MP_OPT_GLOBAL_BATCH_TOKENS                                                                 \
  { "--global-batch-tokens", "T", "tokens per step instead of --global-batch (a multiple of --seq)", NULL }
/* The default of simulate and explain: plan's batch rule (planner/batch.h) for the mesh. */
#define MP_OPT_GLOBAL_BATCH_RULE                                                                   \
  MP_OPT_GLOBAL_BATCH("meshplan plan's rule: the larger of 0.5M/1M/4M tokens by model size and 1,024 "   \
                      "tokens per GPU of the mesh, the nearest multiple of its dp; one sequence per rank " \
                      "when dp is larger")
/* The default of train: one micro-batch per data-parallel rank (a run, not a prediction at
 * scale: the smallest step the mesh runs). */
#define MP_OPT_GLOBAL_BATCH_ONE_MICRO MP_OPT_GLOBAL_BATCH("micro-batch x data-parallel ranks")

/* ---- the run and its output -------------------------------------------------------------- */

#define MP_OPT_THREADS { "--threads", "N", "worker threads (default: every CPU)", NULL }
/* `role`: what the command does with the database */
#define MP_OPT_DB(role) { "--db", "PATH", "planner database (SQLite) " role, NULL }
/* `more`: when the command shows them */
/* the ranked plans plan and report show, and plan's step bound counts (bound_top_k), without
 * --top; spelled as a literal so the help text can quote it (MP_OPT_TOP_STR_) */
#define MP_OPT_TOP_DEFAULT 10
#define MP_OPT_TOP_STR_(v) #v
#define MP_OPT_TOP_STR(v) MP_OPT_TOP_STR_(v)
#define MP_OPT_TOP(more)                                                                                      \
  { "--top", "K", "ranked plans to show" more " (default " MP_OPT_TOP_STR(MP_OPT_TOP_DEFAULT) "; 0: all)", NULL }
/* `what`: what the JSON holds */
#define MP_OPT_JSON(what) { "--json", NULL, "print " what " as JSON", NULL }
/* plan and simulate: the chosen plan(s) as a framework's job configuration (app/emit.h) */
#define MP_OPT_EMIT(what)                                                                          \
  { "--emit", "TARGET", "write " what " as a torchtitan v0.2.0 job-config TOML (torchtitan) or as "  \
    "Megatron-LM core_v0.14.0 pretrain_gpt.py arguments (megatron), headed by the prediction and " \
    "the launch line; a plan feature the framework cannot express is refused by name", NULL }
#define MP_OPT_EMIT_OUT { "--out", "DIR", "with --emit: the folder the files are written to (default .)", NULL }
/* simulate, explain and plan: a plan read from a framework's configuration (app/from_config.h) */
#define MP_OPT_FROM                                                                                \
  { "--from", "FILE", "take the model, mesh and options from a torchtitan v0.2.0 TOML or a file of " \
    "Megatron-LM core_v0.14.0 pretrain_gpt.py arguments; a key that changes cost and that meshplan " \
    "cannot model is refused by name, keys that change no cost are listed in a note", NULL }
#define MP_OPT_FROM_ARGS                                                                           \
  { "--from-args", "'ARGS'", "the same as --from with Megatron-LM's arguments given in one string (--from-args '--tensor-model-parallel-size 2 ...')", NULL }
/* simulate and explain: FSDP without resharding (plan's reshard=0 in --fix) */
#define MP_OPT_NO_RESHARD                                                                          \
  { "--no-reshard", NULL, "FSDP keeps each unit's gathered parameters from its forward to its "      \
    "backward (torchtitan's fsdp_reshard_after_forward \"never\"; default: freed and gathered again)", NULL }
#define MP_OPT_END { NULL, NULL, NULL, NULL }

#endif
