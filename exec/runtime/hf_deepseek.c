/* DeepSeek-V2's Hugging Face checkpoints (deepseek-ai/DeepSeek-V2-Lite, modeling_deepseek.py
 * and its config.json; transformers' DeepseekV2 keeps the same names): the tensor names of
 * multi-head latent attention and of DeepSeek's MoE, the RoPE row order, and config.json.
 *
 * RoPE: DeepSeek's modeling code rotates the rope parts of q and k as interleaved pairs
 * (2i, 2i + 1): apply_rotary_pos_emb first views each rope head as (d/2, 2) and transposes
 * it, then applies rotate_half. The runtime rotates pairs (i, i + d/2) (kernels/ops.h), so
 * the rows of q_proj / q_b_proj and kv_a_proj_with_mqa that produce a rope part are stored
 * de-interleaved: our row i of a rope head is DeepSeek's row 2i for i < d/2 and
 * 2(i - d/2) + 1 above. Scores are sums over the rope features, so the order inside a head
 * changes nothing else; import reads and export writes through this map. */
#include <stdio.h>
#include <string.h>

#include "exec/runtime/hf.h"

/* Our module path inside a block -> DeepSeek's. */
static const mp_hf_pair k_ds_block[] = {
    {"attention_norm", "input_layernorm"},
    {"ffn_norm", "post_attention_layernorm"},
    {"attention.q_proj", "self_attn.q_proj"},
    {"attention.q_a_proj", "self_attn.q_a_proj"},
    {"attention.q_a_layernorm", "self_attn.q_a_layernorm"},
    {"attention.q_b_proj", "self_attn.q_b_proj"},
    {"attention.kv_a_proj_with_mqa", "self_attn.kv_a_proj_with_mqa"},
    {"attention.kv_a_layernorm", "self_attn.kv_a_layernorm"},
    {"attention.kv_b_proj", "self_attn.kv_b_proj"},
    {"attention.o_proj", "self_attn.o_proj"},
    {"mlp.gate_proj", "mlp.gate_proj"},
    {"mlp.up_proj", "mlp.up_proj"},
    {"mlp.down_proj", "mlp.down_proj"},
    {"moe.router", "mlp.gate"},
    {"moe.shared_expert.gate_proj", "mlp.shared_experts.gate_proj"},
    {"moe.shared_expert.up_proj", "mlp.shared_experts.up_proj"},
    {"moe.shared_expert.down_proj", "mlp.shared_experts.down_proj"},
};
static const mp_hf_pair k_ds_experts[] = {
    {"moe.experts.gate_proj", "gate_proj"},
    {"moe.experts.up_proj", "up_proj"},
    {"moe.experts.down_proj", "down_proj"},
};
static const mp_hf_names k_ds_names = {k_ds_block, k_ds_experts, sizeof k_ds_block / sizeof k_ds_block[0],
                                       sizeof k_ds_experts / sizeof k_ds_experts[0], "mlp.experts"};

int mp_hf_model_name(const mp_model *m, const char *fqn, int expert, char *out, size_t cap) {
  return mp_model_is_mla(m) ? mp_hf_name_by(&k_ds_names, fqn, expert, out, cap) : mp_hf_name(fqn, expert, out, cap);
}

/* Where rope feature i of a head of width d sits in DeepSeek's interleaved order. */
static int64_t interleaved(int64_t i, int64_t d) { return i < d / 2 ? 2 * i : 2 * (i - d / 2) + 1; }

int64_t mp_hf_row(const mp_model *m, const char *fqn, int64_t row) {
  int layer;
  const char *path;
  size_t len;
  if (!mp_model_is_mla(m) || !mp_hf_block_path(fqn, &layer, &path, &len)) return row;
  const int64_t dn = m->qk_nope_head_dim, dr = m->qk_rope_head_dim, hd = dn + dr, kl = m->kv_lora_rank;
  if (mp_hf_path_is(path, len, "attention.q_proj") || mp_hf_path_is(path, len, "attention.q_b_proj")) {
    const int64_t h = row / hd, j = row % hd;
    return j < dn ? row : h * hd + dn + interleaved(j - dn, dr);
  }
  if (mp_hf_path_is(path, len, "attention.kv_a_proj_with_mqa")) return row < kl ? row : kl + interleaved(row - kl, dr);
  return row;
}

int mp_hf_rows_moved(const mp_model *m, const char *fqn) {
  int layer;
  const char *path;
  size_t len;
  if (!mp_model_is_mla(m) || !mp_hf_block_path(fqn, &layer, &path, &len)) return 0;
  return mp_hf_path_is(path, len, "attention.q_proj") || mp_hf_path_is(path, len, "attention.q_b_proj") ||
         mp_hf_path_is(path, len, "attention.kv_a_proj_with_mqa");
}

/* DeepSeek's MoE layout: the MoE layers from first_k_dense_replace on, every one of them
 * (moe_layer_freq 1), and its shared experts as n_shared_experts of the routed experts'
 * width. *first gets first_k_dense_replace. */
static mp_status deepseek_moe_layout(mp_ctx *ctx, const mp_model *m, int64_t *first) {
  *first = m->n_layers;
  if (!mp_model_is_moe(m)) return MP_OK;
  for (int64_t l = 0; l < m->n_layers; l++)
    if (m->moe_layer[l] && *first == m->n_layers) *first = l;
  if (mp_model_n_moe_layers(m) != m->n_layers - *first)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: DeepSeek's config makes every layer from "
                    "first_k_dense_replace on MoE; this model's MoE layers are not one run to the last layer",
                    m->name);
  if (m->n_shared_experts > 0 && m->d_ff_shared != m->n_shared_experts * m->d_ff_expert)
    return mp_error(ctx, MP_ERR_UNSUPPORTED, "model %s: DeepSeek's shared experts are n_shared_experts x "
                    "moe_intermediate_size wide (%lld), this model's d_ff_shared is %lld", m->name,
                    (long long)(m->n_shared_experts * m->d_ff_expert), (long long)m->d_ff_shared);
  return MP_OK;
}

mp_status mp_hf_deepseek_config(mp_ctx *ctx, const mp_model *m, cJSON **out) {
  *out = NULL;
  int64_t first;
  MP_CHECK(deepseek_moe_layout(ctx, m, &first));
  cJSON *c = cJSON_CreateObject();
  MP_CHECK_ALLOC(ctx, c);
  cJSON_AddItemToArray(cJSON_AddArrayToObject(c, "architectures"), cJSON_CreateString("DeepseekV2ForCausalLM"));
  cJSON_AddStringToObject(c, "model_type", "deepseek_v2");
  static const mp_model_field dims[] = {
      MP_MODEL_FIELD_vocab,       MP_MODEL_FIELD_d_model,          MP_MODEL_FIELD_d_ff,
      MP_MODEL_FIELD_n_layers,    MP_MODEL_FIELD_n_heads,          MP_MODEL_FIELD_n_kv_heads,
      MP_MODEL_FIELD_kv_lora_rank, MP_MODEL_FIELD_qk_nope_head_dim, MP_MODEL_FIELD_qk_rope_head_dim,
      MP_MODEL_FIELD_v_head_dim,  MP_MODEL_FIELD_max_seq,          MP_MODEL_FIELD_norm_eps,
      MP_MODEL_FIELD_rope_theta,  MP_MODEL_FIELD_tied_embeddings};
  for (size_t i = 0; i < sizeof dims / sizeof dims[0]; i++)
    mp_model_field_to_json(c, mp_model_field_hf_key(dims[i]), m, dims[i]);
  if (m->q_lora_rank > 0) mp_model_field_to_json(c, "q_lora_rank", m, MP_MODEL_FIELD_q_lora_rank);
  else cJSON_AddNullToObject(c, "q_lora_rank");
  if (mp_model_is_moe(m)) { /* V2's router: softmax scores, greedy top-k, no scaling */
    mp_model_field_to_json(c, "n_routed_experts", m, MP_MODEL_FIELD_n_experts);
    mp_model_field_to_json(c, "num_experts_per_tok", m, MP_MODEL_FIELD_top_k);
    mp_model_field_to_json(c, "moe_intermediate_size", m, MP_MODEL_FIELD_d_ff_expert);
    cJSON_AddNumberToObject(c, "n_shared_experts", (double)m->n_shared_experts);
    cJSON_AddNumberToObject(c, "first_k_dense_replace", (double)first);
    cJSON_AddNumberToObject(c, "moe_layer_freq", 1);
    mp_model_field_to_json(c, "aux_loss_alpha", m, MP_MODEL_FIELD_aux_loss_coef);
    mp_model_field_to_json(c, "norm_topk_prob", m, MP_MODEL_FIELD_norm_topk_prob);
    cJSON_AddStringToObject(c, "scoring_func", "softmax");
    cJSON_AddStringToObject(c, "topk_method", "greedy");
    cJSON_AddNumberToObject(c, "routed_scaling_factor", 1.0);
  } else {
    cJSON_AddNullToObject(c, "n_routed_experts");
  }
  cJSON_AddNullToObject(c, "rope_scaling"); /* plain RoPE: no YaRN */
  cJSON_AddStringToObject(c, "hidden_act", "silu");
  cJSON_AddBoolToObject(c, "attention_bias", 0);
  cJSON_AddStringToObject(c, "torch_dtype", "float32");
  *out = c;
  return MP_OK;
}

mp_status mp_hf_check_rope_scaling(mp_ctx *ctx, const char *text, const char *origin) {
  cJSON *j = cJSON_Parse(text);
  if (!j) return MP_OK; /* the model loader reports the JSON's errors */
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(j, "rope_scaling");
  mp_status st = MP_OK;
  if (rs && !cJSON_IsNull(rs)) {
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(rs, "type");
    if (!cJSON_IsString(t)) t = cJSON_GetObjectItemCaseSensitive(rs, "rope_type");
    st = mp_error(ctx, MP_ERR_UNSUPPORTED, "%s: rope_scaling (type %s) is not implemented by the runtime, whose "
                  "RoPE is plain (YaRN's frequencies and its mscale on the softmax scale, DeepSeek-V2 arXiv "
                  "2405.04434 appendix, are not applied); set rope_scaling to null to train without it",
                  origin, cJSON_IsString(t) ? t->valuestring : "unnamed");
  }
  cJSON_Delete(j);
  return st;
}
