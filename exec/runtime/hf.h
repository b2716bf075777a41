/* Weights in and out with Hugging Face names: initializing a runtime of any mesh from a
 * safetensors checkpoint, and exporting a meshplan checkpoint as a folder that
 * transformers loads (model.safetensors + config.json).
 *
 * Names (transformers' modeling_llama.py and modeling_mixtral.py state dicts):
 *   tok_embeddings.weight                 model.embed_tokens.weight
 *   layers.N.attention_norm.weight        model.layers.N.input_layernorm.weight
 *   layers.N.attention.{q,k,v,o}_proj.weight  model.layers.N.self_attn.{q,k,v,o}_proj.weight
 *   layers.N.attention.{q,k}_norm.weight  model.layers.N.self_attn.{q,k}_norm.weight (Qwen3)
 *   layers.N.ffn_norm.weight              model.layers.N.post_attention_layernorm.weight
 *   layers.N.mlp.{gate,up,down}_proj.weight   model.layers.N.mlp.{gate,up,down}_proj.weight
 *   layers.N.moe.router.weight            model.layers.N.block_sparse_moe.gate.weight
 *   layers.N.moe.experts.gate_proj [E, F, C]  model.layers.N.block_sparse_moe.experts.e.w1.weight [F, C]
 *   layers.N.moe.experts.up_proj   [E, F, C]  ... .experts.e.w3.weight [F, C]
 *   layers.N.moe.experts.down_proj [E, C, F]  ... .experts.e.w2.weight [C, F]
 *   norm.weight                           model.norm.weight
 *   output.weight                         lm_head.weight (absent when tied)
 * Shared experts have no name here: no transformers architecture has a shared expert
 * without Qwen2-MoE's sigmoid gate, which this model does not have.
 *
 * RoPE: the runtime rotates dim i with dim i + head_dim/2 (kernels/ops.h, "rotate_half"),
 * which is transformers' convention for Llama's q_proj and k_proj weights (their
 * conversion script permutes Meta's interleaved checkpoints into it), so the weights are
 * copied as they are, with no permutation (tests/reference/hf_ref.py checks the logits). */
#ifndef MP_EXEC_RUNTIME_HF_H
#define MP_EXEC_RUNTIME_HF_H

#include <stddef.h>

#include <cjson/cJSON.h>

#include "common/status.h"
#include "exec/model.h"
#include "exec/runtime/ckpt.h"
#include "exec/runtime/runtime.h"
#include "exec/runtime/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The Hugging Face name of our FQN; for routed experts (is_experts) the name of expert e.
 * Returns 0 when the FQN has none (shared experts). */
int mp_hf_name(const char *fqn, int expert, char *out, size_t cap);
int mp_hf_is_experts(const char *fqn);
/* A checkpoint's names: our module path inside a block -> its own, for the block's modules
 * and for the routed experts' (named "model.layers.N.<experts_path>.E.<hf>.weight"). */
typedef struct mp_hf_pair {
  const char *ours, *hf;
} mp_hf_pair;
typedef struct mp_hf_names {
  const mp_hf_pair *block, *experts;
  size_t n_block, n_experts;
  const char *experts_path;
} mp_hf_names;
/* The name of our FQN under names t (the embedding, final norm and head as transformers
 * names them); 0 when it has none. */
int mp_hf_name_by(const mp_hf_names *t, const char *fqn, int expert, char *out, size_t cap);
/* A block FQN "layers.N.<path>.weight": N into *layer, <path> and its length; 0 otherwise. */
int mp_hf_block_path(const char *fqn, int *layer, const char **path, size_t *len);
/* Whether that <path> (len characters) is name. */
int mp_hf_path_is(const char *path, size_t len, const char *name);
/* hf_deepseek.c: the name of our FQN in m's Hugging Face checkpoint: DeepSeek-V2's for a
 * model with multi-head latent attention (self_attn.q_a_proj ..., mlp.gate,
 * mlp.experts.E.*, mlp.shared_experts.*), else mp_hf_name's. 0 when it has none. */
int mp_hf_model_name(const mp_model *m, const char *fqn, int expert, char *out, size_t cap);
/* Whether the rows of FQN are stored in another order in m's checkpoint (DeepSeek's
 * interleaved RoPE: the rope rows of q_proj / q_b_proj and kv_a_proj_with_mqa), and the
 * checkpoint's row that holds our row `row` (row itself for every other tensor). */
int mp_hf_rows_moved(const mp_model *m, const char *fqn);
int64_t mp_hf_row(const mp_model *m, const char *fqn, int64_t row);
/* m as DeepSeek-V2's config.json (DeepseekV2ForCausalLM: softmax router, greedy top-k, no
 * rope_scaling); MP_ERR_UNSUPPORTED when its MoE layers or shared experts do not fit
 * DeepSeek's keys. */
mp_status mp_hf_deepseek_config(mp_ctx *ctx, const mp_model *m, cJSON **out);
/* MP_ERR_UNSUPPORTED naming it when the config.json text has a rope_scaling the runtime
 * does not apply (YaRN, DeepSeek's; any other); origin names the file. */
mp_status mp_hf_check_rope_scaling(mp_ctx *ctx, const char *text, const char *origin);

/* The model as a transformers config.json (LlamaForCausalLM; MixtralForCausalLM for an
 * MoE whose every layer is MoE, with renormalised top-k and no shared experts);
 * MP_ERR_UNSUPPORTED saying why for any other. */
mp_status mp_hf_config(mp_ctx *ctx, const mp_model *m, cJSON **out);
/* A config.json's model (hf) against the one the run trains: every dim that shapes or
 * changes the forward must agree; the message names the first that does not. */
mp_status mp_hf_check_config(mp_ctx *ctx, const mp_model *hf, const mp_model *m, const char *origin);

/* Every parameter's tile of rt from the safetensors file or folder at path (collective:
 * the ranks agree on failure). Moments stay zero and the step count 0. Every parameter
 * must be there with its shape; a tensor the model lacks is refused (rotary inv_freq
 * buffers excepted). */
mp_status mp_hf_load(mp_ctx *ctx, mp_runtime *rt, const char *path);
/* mp_hf_load's reading on this rank from an open set (origin names it in messages), without
 * agreeing with the other ranks. */
mp_status mp_hf_load_set(mp_ctx *ctx, mp_runtime *rt, const mp_st_set *s, const char *origin);

/* A tokenizer's special tokens (hf_tokenizer.c): the end-of-sequence token is the first of
 * <|endoftext|>, <|end_of_text|>, </s> it has (scripts/tokenize's end-of-text token, which
 * precedes every document), the beginning one <|begin_of_text|> or <s>, else the same
 * end-of-text token (GPT-2's convention); an id of -1: none. */
typedef struct mp_hf_special {
  char bos[64], eos[64];
  int64_t bos_id, eos_id;
} mp_hf_special;

/* What meshplan export writes beside the weights. */
typedef struct mp_hf_export_options {
  mp_st_dtype dtype;     /* MP_ST_F32 (the masters as they are) or MP_ST_BF16 (rounded to nearest even) */
  const char *tokenizer; /* a tokenizer.json to copy, or NULL for none */
} mp_hf_export_options;

/* The tokenizer.json beside the shards the checkpoint trained on (its train state's
 * "data" glob: the folder scripts/tokenize wrote them and the tokenizer into) into out;
 * 0 when there is none (synthetic data, a glob in the folder part, no such readable file). */
int mp_hf_tokenizer_beside_data(const mp_ckpt_manifest *man, char *out, size_t cap);
/* The special tokens of the tokenizer.json at path; refused (MP_ERR_INVALID) when it has
 * no vocabulary or ids of vocab or more (another model's tokenizer). */
mp_status mp_hf_tokenizer_read(mp_ctx *ctx, const char *path, int64_t vocab, mp_hf_special *out);
/* out_dir/tokenizer.json (path copied byte for byte), tokenizer_config.json
 * (PreTrainedTokenizerFast, the special tokens, model_max_length max_seq) and
 * special_tokens_map.json: what AutoTokenizer.from_pretrained(out_dir) reads. */
mp_status mp_hf_tokenizer_write(mp_ctx *ctx, const char *path, const mp_hf_special *sp, int64_t max_seq,
                                const char *out_dir);

/* out_dir/model.safetensors (the masters as o->dtype, Hugging Face names), config.json
 * (with the tokenizer's bos_token_id and eos_token_id, null without one, so transformers'
 * Llama defaults 1 and 2 are never taken for this vocabulary) and, with o->tokenizer, the
 * tokenizer's files, from a checkpoint whose manifest is checked first (mp_ckpt_check_plan).
 * *sp (may be NULL) gets the special tokens written. */
mp_status mp_hf_export(mp_ctx *ctx, const mp_ckpt_manifest *man, const char *out_dir,
                       const mp_hf_export_options *o, mp_hf_special *sp);

#ifdef __cplusplus
}
#endif
#endif
