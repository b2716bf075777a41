/* Hybrid Mamba-Transformer models (model.h): the layer pattern, the Mamba-2 mixer's sizes,
 * their rules, parameter counts and Megatron's FLOP count.
 *
 * The pattern is Megatron-LM's hybrid_override_pattern (megatron/core/ssm/mamba_hybrid_layer_allocation.py
 * at core_v0.14.0), which Hugging Face's NemotronHConfig carries under the same key: one
 * character a layer, M a Mamba-2 mixer, * self-attention, - an MLP, each behind its own
 * pre-norm with a residual add around it. Megatron's E (a MoE layer) is refused by name. */
#include <stdio.h>
#include <string.h>

#include "common/json.h"
#include "common/validate.h"
#include "exec/model_internal.h"

int mp_model_is_hybrid(const mp_model *m) { return m->n_layers > 0 && m->layer_kind[0] != MP_LAYER_BLOCK; }

mp_layer_kind mp_model_layer_kind(const mp_model *m, int64_t layer) {
  if (layer < 0 || layer >= m->n_layers || layer >= MP_MAX_LAYERS) return MP_LAYER_BLOCK;
  return (mp_layer_kind)m->layer_kind[layer];
}

int mp_model_layer_has_attn(const mp_model *m, int64_t layer) {
  const mp_layer_kind k = mp_model_layer_kind(m, layer);
  return k == MP_LAYER_BLOCK || k == MP_LAYER_ATTN;
}

int mp_model_layer_has_mlp(const mp_model *m, int64_t layer) {
  const mp_layer_kind k = mp_model_layer_kind(m, layer);
  return k == MP_LAYER_BLOCK || k == MP_LAYER_MLP;
}

int mp_model_layer_has_mamba(const mp_model *m, int64_t layer) {
  return mp_model_layer_kind(m, layer) == MP_LAYER_MAMBA;
}

int64_t mp_model_n_layers_of(const mp_model *m, mp_layer_kind k) {
  int64_t n = 0;
  for (int64_t l = 0; l < m->n_layers && l < MP_MAX_LAYERS; l++) n += m->layer_kind[l] == (unsigned char)k;
  return n;
}

int64_t mp_model_mamba_d_inner(const mp_model *m) { return m->mamba_num_heads * m->mamba_head_dim; }

int64_t mp_model_mamba_conv_dim(const mp_model *m) {
  return mp_model_mamba_d_inner(m) + 2 * m->n_groups * m->ssm_state_size;
}

int64_t mp_model_mamba_in_rows(const mp_model *m) {
  return mp_model_mamba_d_inner(m) + mp_model_mamba_conv_dim(m) + m->mamba_num_heads;
}

/* in_proj [in_rows, H] and out_proj [H, d_inner] without biases (Nemotron-H's
 * mamba_proj_bias false); conv1d [conv_dim, 1, conv_kernel] with a bias (use_conv_bias true);
 * dt_bias, A_log and D, one each a head; the gated RMSNorm's weight over d_inner
 * (Megatron-Core's MambaMixer, mamba_mixer.py at core_v0.14.0: in_proj, conv1d, dt_bias,
 * A_log, D, norm, out_proj). */
int64_t mp_model_mamba_params(const mp_model *m) {
  const int64_t H = m->d_model, di = mp_model_mamba_d_inner(m), cd = mp_model_mamba_conv_dim(m);
  return mp_model_mamba_in_rows(m) * H + cd * m->conv_kernel + cd + 3 * m->mamba_num_heads + di + H * di;
}

void mp_model_pattern(const mp_model *m, char *buf, size_t cap) {
  size_t n = 0;
  for (int64_t l = 0; l < m->n_layers && l < MP_MAX_LAYERS && n + 1 < cap; l++)
    buf[n++] = m->layer_kind[l] ? (char)m->layer_kind[l] : 'B';
  if (cap) buf[n] = '\0';
}

/* The pattern string into layer_kind: one of M * - a layer, as many as n_layers. */
static mp_status set_pattern(mp_ctx *ctx, const char *origin, const char *key, const char *pat, mp_model *m) {
  const size_t n = strlen(pat);
  if ((int64_t)n != m->n_layers)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: key '%s' has %zu layers and n_layers is %lld; give one character a layer", origin, key, n,
                    (long long)m->n_layers);
  for (size_t l = 0; l < n; l++) {
    const char c = pat[l];
    if (c == 'E')
      return mp_error(ctx, MP_ERR_UNSUPPORTED,
                      "%s: key '%s': layer %zu is a MoE layer (E), which meshplan's hybrid models do not have; "
                      "M (Mamba-2), * (attention) and - (MLP) are modelled", origin, key, l);
    if (c != MP_LAYER_MAMBA && c != MP_LAYER_ATTN && c != MP_LAYER_MLP)
      return mp_error(ctx, MP_ERR_INVALID,
                      "%s: key '%s': layer %zu is '%c'; each layer is M (Mamba-2), * (attention) or - (MLP)",
                      origin, key, l, c);
    m->layer_kind[l] = (unsigned char)c;
  }
  return MP_OK;
}

mp_status mp_model_read_hybrid(mp_ctx *ctx, const cJSON *j, const char *origin, int hf, mp_model *m) {
  memset(m->layer_kind, 0, sizeof m->layer_kind);
  const char *key = "hybrid_override_pattern";
  const cJSON *pat = cJSON_GetObjectItemCaseSensitive(j, key);
  const cJSON *mamba = hf ? j : cJSON_GetObjectItemCaseSensitive(j, "mamba");
  if (pat == NULL || cJSON_IsNull(pat)) {
    if (!hf && mamba != NULL && !cJSON_IsNull(mamba))
      return mp_error(ctx, MP_ERR_INVALID,
                      "%s: key 'mamba' without 'hybrid_override_pattern': give the pattern that places its layers",
                      origin);
    if (hf) return mp_error(ctx, MP_ERR_INVALID, "%s: key '%s' is required for nemotron_h", origin, key);
    return MP_OK;
  }
  if (!cJSON_IsString(pat))
    return mp_error(ctx, MP_ERR_INVALID, "%s: key '%s': expected a string", origin, key);
  if (m->n_layers < 1 || m->n_layers > MP_MAX_LAYERS) return mp_model_validate(ctx, m, origin);
  MP_CHECK(set_pattern(ctx, origin, key, pat->valuestring, m));
  char sub[256];
  snprintf(sub, sizeof sub, "%s%s", origin, hf ? "" : ": mamba");
  if (mp_model_n_layers_of(m, MP_LAYER_MAMBA) == 0 && (mamba == NULL || cJSON_IsNull(mamba))) return MP_OK;
  if (!hf && (mamba == NULL || !cJSON_IsObject(mamba)))
    return mp_error(ctx, MP_ERR_INVALID, "%s: key 'mamba': expected an object (the pattern has M layers)", origin);
  return mp_model_read_fields(ctx, mamba, sub, MP_MODEL_OBJ_MAMBA, MP_MODEL_FIELD_FIRST, MP_MODEL_FIELD_LAST, m);
}

/* A hybrid model is the llama family with RMSNorm and no MoE, MLA, MTP, window or chunk
 * (Nemotron-H's); its Mamba sizes within range, d_inner = expand x d_model (NemotronHConfig's
 * mamba_num_heads x mamba_head_dim, Megatron's expand x hidden), the groups whole in the heads. */
mp_status mp_model_validate_hybrid(mp_ctx *ctx, const mp_model *m, const char *origin) {
  if (!mp_model_is_hybrid(m)) {
    if (m->ssm_state_size || m->mamba_num_heads || m->mamba_head_dim)
      return mp_error(ctx, MP_ERR_INVALID, "%s: Mamba sizes without a hybrid_override_pattern", origin);
    return MP_OK;
  }
  if (m->family != MP_FAMILY_LLAMA || mp_model_is_moe(m) || mp_model_is_mla(m) || m->mtp_layers > 0 ||
      m->sliding_window > 0 || m->attn_chunk > 0 || m->qk_norm || m->qkv_bias)
    return mp_error(ctx, MP_ERR_UNSUPPORTED,
                    "%s: a hybrid model with %s is not modelled; meshplan's hybrid layers are Nemotron-H's "
                    "(llama family, dense MLP, plain attention)", origin,
                    m->family != MP_FAMILY_LLAMA ? "the gpt family" : mp_model_is_moe(m) ? "a moe object"
                    : mp_model_is_mla(m) ? "multi-head latent attention" : m->mtp_layers > 0 ? "MTP modules"
                    : m->sliding_window > 0 || m->attn_chunk > 0 ? "a window or chunk" : "q/k norms or biases");
  if (mp_model_n_layers_of(m, MP_LAYER_MAMBA) == 0) return MP_OK;
  MP_CHECK(mp_model_check_fields(ctx, m, origin, MP_MODEL_CHECK_MAMBA));
  if (m->mamba_num_heads % m->n_groups != 0)
    return mp_error(ctx, MP_ERR_INVALID, "%s: n_groups=%lld does not divide mamba_num_heads=%lld", origin,
                    (long long)m->n_groups, (long long)m->mamba_num_heads);
  if (mp_model_mamba_d_inner(m) != m->expand * m->d_model || mp_model_mamba_in_rows(m) > MP_LIM_D_FF)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: mamba_num_heads x mamba_head_dim = %lld must equal expand x d_model = %lld (the mixer's "
                    "inner width) and in_proj's rows stay within %lld", origin,
                    (long long)mp_model_mamba_d_inner(m), (long long)(m->expand * m->d_model),
                    (long long)MP_LIM_D_FF);
  return MP_OK;
}

/* num_floating_point_operations' hybrid branch (megatron/training/training.py at
 * core_v0.14.0), forward x 3, per token (batch x seq divided out):
 *   attention  4 H p (H + H g / a + s / 2), p = kv_channels a / H, g the query groups
 *   MLP        4 f H (mlp_layer_flops: 4 x expansion x H^2, expansion f / H, no SwiGLU)
 *   Mamba      2 H (2 d_in + 2 G N + heads) + 7 d_in N + 2 d_in H, d_in = 2 H as Megatron
 *              writes it (Nemotron-H's expand is 2)
 *   logits     2 H V (Megatron's padded vocabulary, a multiple of 128 x tp, which Nemotron-H's
 *              131,072 is; the model's own here)
 * The layers counted by the pattern's characters. */
double mp_model_hybrid_flops_per_token(const mp_model *m, int64_t seq) {
  const double H = (double)m->d_model, s = (double)seq, a = (double)m->n_heads;
  const double p = (double)m->head_dim * a / H, g = (double)m->n_kv_heads;
  const double attn = 4.0 * H * p * (H + H * g / a + s / 2.0);
  const double mlp = 4.0 * (double)m->d_ff * H * (mp_model_mlp_gated(m) ? 1.5 : 1.0);
  const double din = 2.0 * H, N = (double)m->ssm_state_size;
  const double mamba = 2.0 * H * (2.0 * din + 2.0 * (double)m->n_groups * N + (double)m->mamba_num_heads) +
                       7.0 * din * N + 2.0 * din * H;
  const double fwd = (double)mp_model_n_layers_of(m, MP_LAYER_ATTN) * attn +
                     (double)mp_model_n_layers_of(m, MP_LAYER_MLP) * mlp +
                     (double)mp_model_n_layers_of(m, MP_LAYER_MAMBA) * mamba + 2.0 * H * (double)m->vocab;
  return 3.0 * fwd;
}

/* Hugging Face's NemotronHConfig (model_type nemotron_h, NemotronHForCausalLM; the
 * nvidia/Nemotron-H-*-Base-8K config.json files): vocab_size, hidden_size, num_hidden_layers,
 * num_attention_heads, num_key_value_heads, head_dim (older files: attention_head_dim),
 * intermediate_size, max_position_embeddings (default 4096), tie_word_embeddings (default
 * false), layer_norm_epsilon (default 1e-5), the MLP's mlp_hidden_act (relu2, squared ReLU;
 * another is refused), the pattern and the Mamba keys under their own names. RMSNorm, no
 * biases (use_bias, mamba_proj_bias true are refused), a conv bias (use_conv_bias). */
mp_status mp_model_hf_nemotron_h(mp_ctx *ctx, const cJSON *j, const char *where, mp_model *m) {
  m->family = MP_FAMILY_LLAMA;
  m->mlp = MP_MLP_SQUARED_RELU;
  m->norm = MP_NORM_RMS;
  MP_CHECK(mp_json_get_i64(ctx, j, where, "vocab_size", 1, &m->vocab));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "hidden_size", 1, &m->d_model));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "num_hidden_layers", 1, &m->n_layers));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "num_attention_heads", 1, &m->n_heads));
  m->n_kv_heads = m->n_heads;
  MP_CHECK(mp_json_get_i64(ctx, j, where, "num_key_value_heads", 0, &m->n_kv_heads));
  m->head_dim = m->n_heads > 0 ? m->d_model / m->n_heads : 0;
  MP_CHECK(mp_json_get_i64(ctx, j, where, "attention_head_dim", 0, &m->head_dim));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "head_dim", 0, &m->head_dim));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "intermediate_size", 1, &m->d_ff));
  m->max_seq = 4096;
  MP_CHECK(mp_json_get_i64(ctx, j, where, "max_position_embeddings", 0, &m->max_seq));
  MP_CHECK(mp_json_get_bool(ctx, j, where, "tie_word_embeddings", 0, &m->tied_embeddings));
  m->norm_eps = 1e-5;
  MP_CHECK(mp_json_get_f64(ctx, j, where, "layer_norm_epsilon", 0, &m->norm_eps));
  m->rope_theta = 10000.0;
  char act[32] = "relu2";
  MP_CHECK(mp_json_get_str(ctx, j, where, "mlp_hidden_act", 0, act, sizeof act));
  int use_bias = 0, proj_bias = 0;
  MP_CHECK(mp_json_get_bool(ctx, j, where, "use_bias", 0, &use_bias));
  MP_CHECK(mp_json_get_bool(ctx, j, where, "mamba_proj_bias", 0, &proj_bias));
  if (strcmp(act, "relu2") != 0 || use_bias || proj_bias)
    return mp_error(ctx, MP_ERR_UNSUPPORTED,
                    "%s: %s is not modelled; meshplan reads Nemotron-H's squared-ReLU MLP (relu2) without "
                    "Linear biases", where, strcmp(act, "relu2") != 0 ? "mlp_hidden_act other than relu2"
                                                                      : "use_bias or mamba_proj_bias true");
  return mp_model_read_hybrid(ctx, j, where, 1, m);
}
