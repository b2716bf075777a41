/* Model specification: the architecture of a transformer, loaded from meshplan's JSON
 * (data/models/<name>.json) or from a Hugging Face config.json.
 *
 * Families:
 *   gpt   : LayerNorm (with bias), learned positions, GELU MLP (up, down), multi-head
 *           attention, biases on every Linear (GPT-2).
 *   llama : RMSNorm, RoPE, SwiGLU MLP (gate, up, down), grouped-query attention, no biases
 *           (Qwen2: q/k/v biases; Qwen3: per-head RMSNorm on q and k).
 * Mixture-of-experts is built on the llama family: routed experts of size d_ff_expert,
 * optional shared experts, a router Linear [n_experts, d_model], top-k softmax routing.
 * Multi-head latent attention (MLA; DeepSeek-V2, arXiv 2405.04434 section 2.1, and V3,
 * arXiv 2412.19437) replaces q/k/v on the llama family when kv_lora_rank > 0:
 *   q   q_lora_rank > 0: q_a_proj [q_lora_rank, H] -> q_a_layernorm [q_lora_rank] ->
 *       q_b_proj [n_heads x (qk_nope + qk_rope), q_lora_rank]; q_lora_rank == 0: q_proj
 *       [n_heads x (qk_nope + qk_rope), H]
 *   kv  kv_a_proj_with_mqa [kv_lora_rank + qk_rope, H] -> kv_a_layernorm [kv_lora_rank] on
 *       the latent -> kv_b_proj [n_heads x (qk_nope + v_head_dim), kv_lora_rank]; the rope
 *       part is one key head shared by every head
 *   o   o_proj [H, n_heads x v_head_dim]
 * head_dim is then the query/key head, qk_nope + qk_rope, and n_kv_heads == n_heads (the
 * decompressed keys and values are per head).
 *
 * Invariant after a successful load: every size is positive and within the bounds of
 * common/limits.h, n_kv_heads divides n_heads, and moe_layer[l] is set exactly for the
 * layers whose MLP is a MoE. */
#ifndef MP_EXEC_MODEL_H
#define MP_EXEC_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MP_MAX_LAYERS 512
#define MP_NAME_MAX 96

typedef enum mp_family { MP_FAMILY_GPT = 0, MP_FAMILY_LLAMA = 1 } mp_family;

typedef struct mp_model {
  char name[MP_NAME_MAX];
  mp_family family;
  int64_t vocab;       /* tokens in the vocabulary */
  int64_t d_model;     /* hidden size H */
  int64_t n_layers;    /* transformer blocks L */
  int64_t n_heads;     /* query heads */
  int64_t n_kv_heads;  /* key/value heads (== n_heads for MHA) */
  int64_t head_dim;    /* per head; usually d_model / n_heads */
  int64_t d_ff;        /* dense MLP hidden size */
  int64_t max_seq;     /* learned positions (gpt) or context length */
  int tied_embeddings; /* output head shares tok_embeddings */
  int bias;            /* gpt: biases on Linear layers and LayerNorm */
  int qkv_bias;        /* Qwen2: biases on q/k/v only */
  int qk_norm;         /* Qwen3: RMSNorm over head_dim on q and k */
  int64_t sliding_window; /* > 0: each query attends to the last sliding_window positions
                             (itself included; Mistral 7B, Jiang et al. 2023); 0: the whole
                             causal prefix */
  double norm_eps;
  double rope_theta;
  /* mixture of experts (n_experts == 0: dense) */
  int64_t n_experts;       /* routed experts per MoE layer */
  int64_t top_k;           /* experts per token */
  int64_t n_shared_experts;
  int64_t d_ff_expert;     /* routed expert hidden size */
  int64_t d_ff_shared;     /* hidden size of the shared expert block (all shared experts) */
  double aux_loss_coef;    /* load-balancing loss weight */
  int norm_topk_prob;      /* renormalise the top-k probabilities */
  /* multi-head latent attention (kv_lora_rank == 0: none) */
  int64_t q_lora_rank;      /* query latent; 0: q_proj straight from the hidden state */
  int64_t kv_lora_rank;     /* key/value latent */
  int64_t qk_nope_head_dim; /* per head: the query/key features without RoPE */
  int64_t qk_rope_head_dim; /* per head: the query/key features with RoPE (the key's shared) */
  int64_t v_head_dim;       /* per head: value and attention output features */
  unsigned char moe_layer[MP_MAX_LAYERS];
} mp_model;

/* Loads by name (a file stem under data/models, embedded in the binary, e.g.
 * "llama3.1-8b") or by path (anything containing '/' or ending in .json). The file may
 * be meshplan's format or a Hugging Face config.json (detected by its keys). */
mp_status mp_model_load(mp_ctx *ctx, const char *name_or_path, mp_model *out);
/* Parses JSON text; origin names it in messages. */
mp_status mp_model_from_text(mp_ctx *ctx, const char *text, const char *origin, mp_model *out);
/* Parses a Hugging Face config.json text explicitly (LlamaForCausalLM, Qwen2, Qwen3,
 * Qwen3MoE, Qwen2MoE, Mixtral, GPT2). */
mp_status mp_model_from_hf_text(mp_ctx *ctx, const char *text, const char *origin, mp_model *out);
/* Checks the invariants above and every field's range (common/limits.h: d_model <= 2^20,
 * vocab <= 2^22, max_seq <= 2^24, fewer than 2^50 parameters, finite positive norm_eps and
 * rope_theta, ...); a failure names the field, its value and the accepted range. Used by
 * the loaders and by code that builds specs. A head_dim the file leaves out must come out
 * whole: n_heads that do not divide d_model are refused by the loaders, not rounded. */
mp_status mp_model_validate(mp_ctx *ctx, const mp_model *m, const char *origin);
/* The step's sizes for m: seq in 1..2^24, micro_batch >= 1, global_batch in 1..2^24 (0: not
 * resolved yet, not checked), at most 2^32 tokens per step, and at most 2^40 elements in
 * one tensor of a micro-batch (micro_batch x seq x the widest per-token row: vocab, d_ff,
 * top_k x d_ff_expert, n_heads x head_dim, d_model). Within these, every size the plan,
 * the schedule and the simulator form fits in int64. MP_ERR_INVALID naming the limit. */
mp_status mp_model_check_step(mp_ctx *ctx, const mp_model *m, int64_t seq, int64_t micro_batch,
                              int64_t global_batch);

int mp_model_is_moe(const mp_model *m);
/* 1 when m has multi-head latent attention (kv_lora_rank > 0). */
int mp_model_is_mla(const mp_model *m);
/* Features per head of the values and of the attention output: v_head_dim under MLA, else
 * head_dim. */
int64_t mp_model_v_head_dim(const mp_model *m);
int mp_model_layer_is_moe(const mp_model *m, int64_t layer);
int64_t mp_model_n_moe_layers(const mp_model *m);

/* Parameters of one block (attention, norms, MLP or MoE incl. router). */
int64_t mp_model_block_params(const mp_model *m, int64_t layer);
/* Embedding (+ positions for gpt). */
int64_t mp_model_embedding_params(const mp_model *m);
/* Output head (0 when tied) plus the final norm. */
int64_t mp_model_head_params(const mp_model *m);
/* Every parameter, counted once (tied weights once). */
int64_t mp_model_param_count(const mp_model *m);
/* Parameters a token touches: routed experts count top_k of n_experts; both embeddings
 * count (the input lookup's row and the output head; mp_model_matmul_param_count leaves
 * the input embedding out). */
int64_t mp_model_active_param_count(const mp_model *m);
/* The parameters a token's matmuls use: the active blocks and the output head (a tied
 * head's matrix too: its matmul runs), not the input embedding's row lookup nor learned
 * positions. DeepSeek's published activated counts are this one. */
int64_t mp_model_matmul_param_count(const mp_model *m);
/* Keys a query attends to on average in a causal sequence of seq tokens: seq / 2 (to
 * within a token: (seq + 1) / 2 exactly, the convention's seq / 2), or under a sliding
 * window W < seq, W - W^2 / (2 seq) (the first W queries see a growing prefix, the rest W
 * keys each). */
double mp_model_attended_keys(const mp_model *m, int64_t seq);
/* 1 when the sliding window limits attention at this sequence length (seq > window): the
 * attention is then not the plain causal one. */
int mp_model_window_applies(const mp_model *m, int64_t seq);
/* Why meshplan's runtime does not train m at seq (its attention kernels, CPU and CUDA,
 * attend to the whole causal prefix; a window that applies would train a different model),
 * as one line for train's refusal and plan's runs column. */
void mp_model_window_refusal(const mp_model *m, int64_t seq, char *buf, size_t cap);
/* Training FLOPs per token (forward + backward), the torchtitan/PaLM convention:
 * 6 * (active params excluding the input embedding lookup) + 12 * L * n_heads * head_dim * seq,
 * where seq stands for twice the keys a query attends to (mp_model_attended_keys: seq
 * without a window, 2 W - W^2 / seq under a window W < seq). Under MLA QK^T runs over the
 * query/key head (head_dim = qk_nope + qk_rope) and attention x V over v_head_dim: the
 * attention term is 6 * L * n_heads * (head_dim + v_head_dim) * seq.
 * A tied head's matmul is counted (it runs), its embedding lookup is not. */
double mp_model_flops_per_token(const mp_model *m, int64_t seq);

#ifdef __cplusplus
}
#endif
#endif
