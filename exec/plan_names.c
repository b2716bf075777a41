/* Names of the plan's enums and the activation-checkpointing policy syntax ("none",
 * "selective", "selective-op", "selective-core", "full", "full:N"): parsing and printing
 * with no dependency beyond exec/plan.h, so that readers of stack and option files link
 * them alone. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "exec/plan.h"

static const char *const k_module_names[MP_MOD_COUNT] = {
    [MP_MOD_TOK_EMBEDDINGS] = "tok_embeddings",
    [MP_MOD_POS_EMBEDDINGS] = "pos_embeddings",
    [MP_MOD_ATTN_NORM] = "attention_norm",
    [MP_MOD_Q] = "attention.q_proj",
    [MP_MOD_K] = "attention.k_proj",
    [MP_MOD_V] = "attention.v_proj",
    [MP_MOD_Q_NORM] = "attention.q_norm",
    [MP_MOD_K_NORM] = "attention.k_norm",
    [MP_MOD_O] = "attention.o_proj",
    [MP_MOD_FFN_NORM] = "ffn_norm",
    [MP_MOD_GATE] = "mlp.gate_proj",
    [MP_MOD_UP] = "mlp.up_proj",
    [MP_MOD_DOWN] = "mlp.down_proj",
    [MP_MOD_ROUTER] = "moe.router",
    [MP_MOD_EXPERTS_GATE] = "moe.experts.gate_proj",
    [MP_MOD_EXPERTS_UP] = "moe.experts.up_proj",
    [MP_MOD_EXPERTS_DOWN] = "moe.experts.down_proj",
    [MP_MOD_SHARED_GATE] = "moe.shared_expert.gate_proj",
    [MP_MOD_SHARED_UP] = "moe.shared_expert.up_proj",
    [MP_MOD_SHARED_DOWN] = "moe.shared_expert.down_proj",
    [MP_MOD_FINAL_NORM] = "norm",
    [MP_MOD_OUTPUT] = "output",
    [MP_MOD_Q_A] = "attention.q_a_proj",
    [MP_MOD_Q_A_NORM] = "attention.q_a_layernorm",
    [MP_MOD_Q_B] = "attention.q_b_proj",
    [MP_MOD_KV_A] = "attention.kv_a_proj_with_mqa",
    [MP_MOD_KV_A_NORM] = "attention.kv_a_layernorm",
    [MP_MOD_KV_B] = "attention.kv_b_proj",
    [MP_MOD_MTP_ENORM] = "enorm",
    [MP_MOD_MTP_HNORM] = "hnorm",
    [MP_MOD_MTP_EH_PROJ] = "eh_proj",
    [MP_MOD_MTP_NORM] = "shared_head.norm",
    [MP_MOD_MAMBA_IN] = "mixer.in_proj",
    [MP_MOD_MAMBA_CONV] = "mixer.conv1d",
    [MP_MOD_MAMBA_DT_BIAS] = "mixer.dt_bias",
    [MP_MOD_MAMBA_A_LOG] = "mixer.A_log",
    [MP_MOD_MAMBA_D] = "mixer.D",
    [MP_MOD_MAMBA_NORM] = "mixer.norm",
    [MP_MOD_MAMBA_OUT] = "mixer.out_proj",
};

int mp_module_f8_source(mp_module m) {
  switch (m) {
    case MP_MOD_Q:
    case MP_MOD_K:
    case MP_MOD_V: return 0;
    case MP_MOD_O: return 1;
    case MP_MOD_GATE:
    case MP_MOD_UP: return 2;
    case MP_MOD_DOWN: return 3;
    default: return -1;
  }
}

const char *mp_module_name(mp_module m) {
  return (unsigned)m < MP_MOD_COUNT ? k_module_names[m] : "?";
}

void mp_ac_format(mp_ac_mode m, int every, char *buf, size_t cap) {
  if (m == MP_AC_FULL && every > 1) snprintf(buf, cap, "full:%d", every);
  else snprintf(buf, cap, "%s", mp_ac_mode_name(m));
}

int mp_pp_schedule_parse(const char *s, mp_pp_schedule *out) {
  /* torch.distributed.pipelining's names (schedules.py get_schedule_class), in the enum's
   * order; DualPipe has none (torch's DualPipeV is another schedule) */
  static const char *const torch_names[] = {"1F1B", "Interleaved1F1B", "GPipe", "", "ZBVZeroBubble",
                                            "InterleavedZeroBubble"};
  for (int k = MP_PP_1F1B; k <= MP_PP_INTERLEAVED_ZB && s; k++)
    if (strcmp(s, mp_pp_schedule_name((mp_pp_schedule)k)) == 0 || (torch_names[k][0] && strcasecmp(s, torch_names[k]) == 0)) {
      *out = (mp_pp_schedule)k;
      return 1;
    }
  return 0;
}

static const char *const k_fp8_recipe_names[MP_FP8_RECIPE_COUNT] = {
    "default", "tensorwise", "delayed", "rowwise", "mxfp8", "blockwise", "nvfp4"};

static const char *const k_fp8_recipe_words[MP_FP8_RECIPE_COUNT] = {
    "the runtime's own scales",
    "tensorwise scales, each from its tensor's own amax",
    "tensorwise scales from the amax history of earlier iterations (delayed scaling)",
    "a scale per row along each GEMM's reduction dim (rowwise)",
    "a power-of-two scale per 32 elements along the reduction dim (MXFP8)",
    "a scale per 1x128 tile of activations and gradients, per 128x128 tile of weights (blockwise)",
    ("four-bit E2M1 codes with an E4M3 scale per 16 elements (16x16 for weights) and a per-tensor "
     "fp32 scale (NVFP4)")};

const char *mp_fp8_recipe_name(mp_fp8_recipe r) {
  return (unsigned)r < MP_FP8_RECIPE_COUNT ? k_fp8_recipe_names[r] : "?";
}

const char *mp_fp8_recipe_words(mp_fp8_recipe r) {
  return (unsigned)r < MP_FP8_RECIPE_COUNT ? k_fp8_recipe_words[r] : "?";
}

/* Other names of the recipes: Transformer Engine's current scaling; Megatron-Bridge's
 * performance scripts' compute dtypes (scripts/performance/utils/precision.py at c8327cfc2^,
 * get_precision_config: fp8_cs bf16_with_fp8_current_scaling_mixed, fp8_mx
 * bf16_with_mxfp8_mixed, fp8_sc bf16_with_fp8_subchannel_scaling_mixed) and its name for
 * TE's Float8BlockScaling, subchannel scaling. */
static const struct {
  const char *name;
  mp_fp8_recipe recipe;
} k_fp8_recipe_aliases[] = {{"current", MP_FP8_TENSORWISE},  {"fp8_cs", MP_FP8_TENSORWISE},
                            {"fp8_mx", MP_FP8_MXFP8},        {"fp8_sc", MP_FP8_BLOCKWISE},
                            {"subchannel", MP_FP8_BLOCKWISE}};

int mp_fp8_recipe_parse(const char *s, mp_fp8_recipe *out) {
  if (s == NULL) return 0;
  for (size_t k = 0; k < sizeof k_fp8_recipe_aliases / sizeof k_fp8_recipe_aliases[0]; k++)
    if (strcmp(s, k_fp8_recipe_aliases[k].name) == 0) {
      *out = k_fp8_recipe_aliases[k].recipe;
      return 1;
    }
  for (int k = MP_FP8_TENSORWISE; k < MP_FP8_RECIPE_COUNT; k++)
    if (strcmp(s, k_fp8_recipe_names[k]) == 0) {
      *out = (mp_fp8_recipe)k;
      return 1;
    }
  return 0;
}

int mp_fp8_scope_parse(const char *name, mp_fp8_scope *out) {
  static const char *const names[] = {"linears", "experts", "all"};
  for (int k = 0; name != NULL && k < 3; k++)
    if (strcmp(name, names[k]) == 0) {
      *out = (mp_fp8_scope)k;
      return 1;
    }
  return 0;
}

int mp_moe_dispatcher_parse(const char *s, mp_moe_dispatcher *out) {
  static const char *const names[] = {"alltoall", "deepep", "hybridep"};
  for (int k = MP_MOE_DISPATCH_ALLTOALL; k <= MP_MOE_DISPATCH_HYBRIDEP; k++)
    if (s && strcmp(s, names[k]) == 0) {
      *out = (mp_moe_dispatcher)k;
      return 1;
    }
  return 0;
}

int mp_cp_rotate_parse(const char *s, mp_cp_rotate *out) {
  for (int k = MP_CP_ROTATE_ALLGATHER; k <= MP_CP_ROTATE_ALLTOALL; k++)
    if (s && strcmp(s, mp_cp_rotate_name((mp_cp_rotate)k)) == 0) {
      *out = (mp_cp_rotate)k;
      return 1;
    }
  return 0;
}

static const char *const k_cp_comm_names[MP_CP_COMM_COUNT] = {"p2p", "all_gather", "a2a", "a2a+p2p"};

const char *mp_cp_comm_name(mp_cp_comm c) { return (unsigned)c < MP_CP_COMM_COUNT ? k_cp_comm_names[c] : "?"; }

int mp_cp_comm_parse(const char *s, mp_cp_comm *out) {
  for (int k = 0; k < MP_CP_COMM_COUNT; k++)
    if (s && strcmp(s, k_cp_comm_names[k]) == 0) {
      *out = (mp_cp_comm)k;
      return 1;
    }
  return 0;
}

static const char *const k_cuda_graphs_names[MP_CUDA_GRAPHS_COUNT] = {
    "none", "attn", "layers", "iteration", "attn+moe_router", "attn+moe_router+moe_preprocess"};

const char *mp_cuda_graphs_name(mp_cuda_graphs g) {
  return (unsigned)g < MP_CUDA_GRAPHS_COUNT ? k_cuda_graphs_names[g] : "?";
}

int mp_cuda_graphs_parse(const char *s, mp_cuda_graphs *out) {
  for (int k = 0; k < MP_CUDA_GRAPHS_COUNT; k++)
    if (s && strcmp(s, k_cuda_graphs_names[k]) == 0) {
      *out = (mp_cuda_graphs)k;
      return 1;
    }
  return 0;
}

static const char *const k_mfsdp_names[MP_MFSDP_COUNT] = {"optim_grads_params", "optim_grads", "optim",
                                                            "no_shard"};

const char *mp_mfsdp_strategy_name(mp_mfsdp_strategy s) {
  return (unsigned)s < MP_MFSDP_COUNT ? k_mfsdp_names[s] : "?";
}

int mp_mfsdp_strategy_parse(const char *s, mp_mfsdp_strategy *out) {
  for (int k = 0; k < MP_MFSDP_COUNT; k++)
    if (s && strcmp(s, k_mfsdp_names[k]) == 0) {
      *out = (mp_mfsdp_strategy)k;
      return 1;
    }
  return 0;
}

mp_status mp_ac_parse(mp_ctx *ctx, const char *s, mp_ac_mode *out, int *every) {
  *every = 1;
  for (int m = 0; s && m < MP_AC_COUNT; m++)
    if (strcmp(s, mp_ac_mode_name((mp_ac_mode)m)) == 0) {
      *out = (mp_ac_mode)m;
      return MP_OK;
    }
  if (s && strncmp(s, "full:", 5) == 0) {
    char *end = NULL;
    long n = strtol(s + 5, &end, 10);
    if (end != s + 5 && *end == '\0' && n >= 1 && n <= MP_MAX_LAYERS) {
      *out = MP_AC_FULL;
      *every = (int)n;
      return MP_OK;
    }
  }
  return mp_error(ctx, MP_ERR_INVALID,
                  "unknown activation checkpointing policy '%s'; choose none, selective (the "
                  "attention module), selective-op (torchtitan's op-level), selective-core "
                  "(Megatron's core attention), full, or full:N (every N-th block)",
                  s ? s : "(null)");
}

static const char *const k_rc_names[MP_RC_COUNT] = {"layernorm", "mla_up_proj", "moe_act",
                                                    "mlp",       "moe",         "shared_experts"};

/* One name of a --recompute-modules list into o. */
static mp_status rc_module(mp_ctx *ctx, const char *w, mp_plan_options *o) {
  for (int k = 0; k < MP_RC_COUNT; k++)
    if (strcmp(w, k_rc_names[k]) == 0) {
      o->recompute_modules |= 1u << k;
      return MP_OK;
    }
  if (strcmp(w, "core_attn") == 0) {
    if (o->ac != MP_AC_NONE && o->ac != MP_AC_SELECTIVE_CORE)
      return mp_error(ctx, MP_ERR_INVALID, "recompute module core_attn is the AC policy selective-core; "
                      "it cannot join AC %s", mp_ac_mode_name(o->ac));
    o->ac = MP_AC_SELECTIVE_CORE;
    return MP_OK;
  }
  return mp_error(ctx, MP_ERR_INVALID, "unknown recompute module '%s'; choose among core_attn, layernorm, "
                  "mla_up_proj, moe_act, mlp, moe and shared_experts (Megatron-Core's names)", w);
}

mp_status mp_recompute_modules_parse(mp_ctx *ctx, const char *list, mp_plan_options *o) {
  char w[32];
  size_t n = 0;
  /* a slash as NeMo 2.0 writes the list in its recommended model configs (scripts/performance/
   * recommended_model_configs/model_configs_h100.csv, "mla_up_proj/mlp/moe", split on it by helpers.py) */
  for (const char *c = list;; c++) {
    if (*c == ',' || *c == ' ' || *c == '/' || *c == '\0') {
      w[n] = '\0';
      if (n > 0) MP_CHECK(rc_module(ctx, w, o));
      n = 0;
      if (*c == '\0') return MP_OK;
    } else if (n + 1 < sizeof w) {
      w[n++] = *c;
    } else {
      return mp_error(ctx, MP_ERR_INVALID, "recompute modules '%s': a name longer than %zu characters",
                      list, sizeof w - 1);
    }
  }
}

void mp_recompute_modules_format(uint32_t modules, char *buf, size_t cap) {
  size_t u = 0;
  if (cap) buf[0] = '\0';
  for (int k = 0; k < MP_RC_COUNT && u < cap; k++)
    if (modules & (1u << k)) u += (size_t)snprintf(buf + u, cap - u, "%s%s", u ? " " : "", k_rc_names[k]);
}

mp_status mp_ac_mode_parse(mp_ctx *ctx, const char *s, mp_ac_mode *out) {
  int every = 1;
  MP_CHECK(mp_ac_parse(ctx, s, out, &every));
  if (every > 1)
    return mp_error(ctx, MP_ERR_INVALID,
                    "'%s': full AC on every N-th block is not taken here; give the policy alone",
                    s);
  return MP_OK;
}

const char *mp_recompute_method_name(mp_recompute_method m) {
  return m == MP_RECOMPUTE_BLOCK ? "block" : m == MP_RECOMPUTE_UNIFORM ? "uniform" : "";
}

int mp_recompute_method_parse(const char *s, mp_recompute_method *out) {
  if (strcmp(s, "block") == 0) *out = MP_RECOMPUTE_BLOCK;
  else if (strcmp(s, "uniform") == 0) *out = MP_RECOMPUTE_UNIFORM;
  else return 0;
  return 1;
}

const char *mp_mem_model_name(mp_mem_model m) {
  switch (m) {
    case MP_MEM_MODEL_TORCHTITAN: return "torchtitan";
    case MP_MEM_MODEL_MESHPLAN_CPU: return "meshplan-cpu";
    case MP_MEM_MODEL_MESHPLAN_CUDA: return "meshplan-cuda";
    case MP_MEM_MODEL_MEGATRON: return "megatron";
    case MP_MEM_MODEL_COUNT: break;
  }
  return "?";
}

const char *mp_tp_style_name(mp_tp_style s) {
  switch (s) {
    case MP_TP_NONE: return "replicate";
    case MP_TP_COLWISE: return "colwise";
    case MP_TP_ROWWISE: return "rowwise";
    case MP_TP_VOCAB: return "vocab";
  }
  return "?";
}

const char *mp_pass_name(unsigned bit) {
  switch (bit) {
    case MP_PASS_TP: return "TP";
    case MP_PASS_EP: return "EP";
    case MP_PASS_FLOAT8: return "Float8";
    case MP_PASS_AC: return "AC";
    case MP_PASS_FSDP: return "FSDP";
    case MP_PASS_DDP: return "DDP";
  }
  return "?";
}

