/* Model specification loading and counting (see model.h). */
#include "exec/model.h"

#include <stdio.h>
#include <string.h>

#include "common/checked.h"
#include "common/json.h"
#include "common/log.h"
#include "common/validate.h"
#include "data/load.h"
#include "exec/model_internal.h"

static void set_moe_layers(mp_model *m, int64_t first_dense, int64_t freq) {
  memset(m->moe_layer, 0, sizeof m->moe_layer);
  if (m->n_experts <= 0) return;
  if (freq < 1) freq = 1;
  for (int64_t l = 0; l < m->n_layers && l < MP_MAX_LAYERS; l++)
    m->moe_layer[l] = (l >= first_dense && ((l + 1) % freq == 0 || freq == 1)) ? 1 : 0;
}

/* Parameters in double: the sum over layers of a model at the per-field bounds leaves int64
 * (512 layers x 2^14 experts x 3 x 2^20 x 2^22), so the total is bounded before the int64
 * counters below are trusted. */
static double param_count_f64(const mp_model *m) {
  double H = (double)m->d_model, q = (double)m->n_heads * (double)m->head_dim,
         kv = (double)m->n_kv_heads * (double)m->head_dim;
  double attn = 2 * H * q + 2 * H * kv + q + 2 * kv + H + 2 * (double)m->head_dim;
  if (m->kv_lora_rank > 0) {
    const double ql = (double)m->q_lora_rank, kvl = (double)m->kv_lora_rank,
                 nh = (double)m->n_heads, vd = (double)m->v_head_dim;
    attn = (ql > 0 ? ql * H + ql + nh * (double)m->head_dim * ql : H * q) +
           (kvl + (double)m->qk_rope_head_dim) * H + kvl +
           nh * ((double)m->qk_nope_head_dim + vd) * kvl + H * nh * vd;
  }
  double dense = 3 * H * (double)m->d_ff + (double)m->d_ff + H;
  double moe = (double)m->n_experts * (3 * H * (double)m->d_ff_expert + H) +
               3 * H * (double)m->d_ff_shared;
  double p = 2 * (double)m->vocab * H + (double)m->max_seq * H + 2 * H;
  /* a hybrid model's Mamba-2 mixer, bounded as if every layer had one (model_hybrid.c) */
  const double di = (double)m->mamba_num_heads * (double)m->mamba_head_dim,
               gn = (double)m->n_groups * (double)m->ssm_state_size;
  const double mamba = (2 * di + 2 * gn + (double)m->mamba_num_heads) * H + (di + 2 * gn) * ((double)m->conv_kernel + 1) +
                       3 * (double)m->mamba_num_heads + di + H * di;
  for (int64_t l = 0; l < m->n_layers && l < MP_MAX_LAYERS; l++)
    p += attn + 4 * H + (m->n_experts > 0 && m->moe_layer[l] ? moe : dense) + (m->layer_kind[l] ? mamba : 0);
  /* the MTP modules: a block of the largest kind each, three norms and eh_proj */
  if (m->mtp_layers > 0 && m->mtp_layers <= MP_MAX_LAYERS)
    p += (double)m->mtp_layers * (attn + 7 * H + 2 * H * H + (moe > dense ? moe : dense));
  return p;
}

/* Multi-head latent attention's sizes (model.h): the ranks within the bounds of a hidden
 * size, the head parts within those of a head, head_dim their query/key sum, one decompressed
 * key/value head per query head, an even RoPE part, and none of the attention variants MLA
 * has no place for (q/k/v biases, q/k norms, a sliding window). A model without MLA has no
 * MLA sizes. */
static mp_status validate_mla(mp_ctx *ctx, const mp_model *m, const char *origin) {
  MP_CHECK(mp_model_check_field(ctx, m, origin, MP_MODEL_FIELD_kv_lora_rank, NULL));
  if (m->kv_lora_rank == 0) {
    if (m->q_lora_rank || m->qk_nope_head_dim || m->qk_rope_head_dim || m->v_head_dim)
      return mp_error(ctx, MP_ERR_INVALID,
                      "%s: q_lora_rank, qk_nope_head_dim, qk_rope_head_dim and v_head_dim belong to "
                      "multi-head latent attention, which needs kv_lora_rank > 0; give kv_lora_rank "
                      "or leave them out", origin);
    return MP_OK;
  }
  if (m->family != MP_FAMILY_LLAMA)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: multi-head latent attention is supported on the llama family only", origin);
  MP_CHECK(mp_model_check_fields(ctx, m, origin, MP_MODEL_CHECK_MLA));
  if (m->qk_rope_head_dim % 2)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: qk_rope_head_dim=%lld must be even (RoPE rotates pairs of features)", origin,
                    (long long)m->qk_rope_head_dim);
  if (m->head_dim != m->qk_nope_head_dim + m->qk_rope_head_dim)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: head_dim=%lld must equal qk_nope_head_dim + qk_rope_head_dim = %lld under "
                    "multi-head latent attention (the query/key head); leave head_dim out", origin,
                    (long long)m->head_dim, (long long)(m->qk_nope_head_dim + m->qk_rope_head_dim));
  if (m->n_kv_heads != m->n_heads)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: n_kv_heads=%lld must equal n_heads=%lld under multi-head latent attention "
                    "(kv_b_proj decompresses one key and value head per query head); leave n_kv_heads out",
                    origin, (long long)m->n_kv_heads, (long long)m->n_heads);
  if (m->qkv_bias || m->qk_norm || m->sliding_window > 0)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: multi-head latent attention with %s is not a model meshplan describes; drop it",
                    origin, m->qkv_bias ? "q/k/v biases" : m->qk_norm ? "q/k norms" : "a sliding window");
  const int64_t widest = m->n_heads * (m->qk_nope_head_dim + m->v_head_dim);
  if (widest > MP_LIM_D_MODEL || m->n_heads * m->v_head_dim > MP_LIM_D_MODEL)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: n_heads x (qk_nope_head_dim + v_head_dim) = %lld is out of range; accepted "
                    "1..%lld (the bound of d_model)", origin, (long long)widest,
                    (long long)MP_LIM_D_MODEL);
  return MP_OK;
}

/* The ranges come from MP_MODEL_FIELDS (the check column says where each is checked); the
 * rules between fields are written here, in the order a refusal reports them. */
mp_status mp_model_validate(mp_ctx *ctx, const mp_model *m, const char *origin) {
  MP_CHECK(mp_model_check_fields(ctx, m, origin, MP_MODEL_CHECK_FIRST));
  if (m->n_heads % m->n_kv_heads != 0)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: n_kv_heads=%lld does not divide n_heads=%lld (grouped-query attention "
                    "needs whole groups)",
                    origin, (long long)m->n_kv_heads, (long long)m->n_heads);
  /* the attention's projected width is a hidden size too */
  if (m->n_heads * m->head_dim > MP_LIM_D_MODEL)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: n_heads x head_dim = %lld x %lld = %lld is out of range; accepted "
                    "1..%lld (the bound of d_model)",
                    origin, (long long)m->n_heads, (long long)m->head_dim,
                    (long long)(m->n_heads * m->head_dim), (long long)MP_LIM_D_MODEL);
  MP_CHECK(validate_mla(ctx, m, origin));
  MP_CHECK(mp_model_validate_hybrid(ctx, m, origin));
  MP_CHECK(mp_model_check_field(ctx, m, origin, MP_MODEL_FIELD_d_ff, NULL));
  int all_moe = m->n_experts > 0;
  for (int64_t l = 0; l < m->n_layers && all_moe; l++) all_moe = m->moe_layer[l];
  if (m->d_ff <= 0 && !all_moe)
    return mp_error(ctx, MP_ERR_INVALID, "%s: 'd_ff' must be positive for dense layers", origin);
  MP_CHECK(mp_model_check_field(ctx, m, origin, MP_MODEL_FIELD_norm_eps, NULL));
  if (m->family == MP_FAMILY_LLAMA) /* gpt has learned positions, no RoPE */
    MP_CHECK(mp_model_check_field(ctx, m, origin, MP_MODEL_FIELD_rope_theta, NULL));
  MP_CHECK(mp_model_check_field(ctx, m, origin, MP_MODEL_FIELD_n_experts, NULL));
  if (m->n_experts > 0) {
    if (m->family != MP_FAMILY_LLAMA)
      return mp_error(ctx, MP_ERR_INVALID,
                      "%s: mixture-of-experts is supported on the llama family only", origin);
    if (m->top_k <= 0 || m->top_k > m->n_experts)
      return mp_error(ctx, MP_ERR_INVALID, "%s: top_k=%lld must be in 1..n_experts=%lld", origin,
                      (long long)m->top_k, (long long)m->n_experts);
    if (m->d_ff_expert <= 0)
      return mp_error(ctx, MP_ERR_INVALID, "%s: 'd_ff_expert' must be positive for a MoE model",
                      origin);
    if (!mp_model_mlp_gated(m))
      return mp_error(ctx, MP_ERR_INVALID, "%s: a MoE model's experts are SwiGLU and its dense blocks "
                      "too; leave 'mlp' out", origin);
    MP_CHECK(mp_model_check_fields(ctx, m, origin, MP_MODEL_CHECK_MOE));
    if (m->n_group > 0 && (m->n_experts % m->n_group != 0 || m->topk_group < 1))
      return mp_error(ctx, MP_ERR_INVALID,
                      "%s: n_group=%lld, topk_group=%lld: the groups must split n_experts=%lld evenly "
                      "and a token use at least one; give n_group dividing n_experts and topk_group in "
                      "1..n_group, or n_group 0 for no group limit", origin, (long long)m->n_group,
                      (long long)m->topk_group, (long long)m->n_experts);
    if (m->n_shared_experts > 0 && m->d_ff_shared <= 0)
      return mp_error(ctx, MP_ERR_INVALID,
                      "%s: 'd_ff_shared' must be positive when n_shared_experts > 0", origin);
    MP_CHECK(mp_model_check_field(ctx, m, origin, MP_MODEL_FIELD_aux_loss_coef, NULL));
  }
  const double params = param_count_f64(m);
  if (params > (double)MP_LIM_PARAMS)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: %.3g parameters is out of range; accepted up to %lld (2^50, 500x the "
                    "largest trained model)",
                    origin, params, (long long)MP_LIM_PARAMS);
  return MP_OK;
}

mp_status mp_model_check_step(mp_ctx *ctx, const mp_model *m, int64_t seq, int64_t micro_batch,
                              int64_t global_batch) {
  MP_CHECK(mp_check_i64(ctx, NULL, "seq", seq, 1, MP_LIM_SEQ));
  if (m->attn_chunk > 0 && seq > m->attn_chunk)
    return mp_error(ctx, MP_ERR_UNSUPPORTED,
                    "model %s: seq %lld is longer than its attention chunk (attn_chunk %lld, Llama 4's "
                    "chunked attention), where three of four blocks would attend within chunks: meshplan "
                    "models it within one chunk; give --seq %lld or less", m->name, (long long)seq,
                    (long long)m->attn_chunk, (long long)m->attn_chunk);
  MP_CHECK(mp_check_i64(ctx, NULL, "micro-batch", micro_batch, 1, MP_LIM_GLOBAL_BATCH));
  if (global_batch != 0) {
    MP_CHECK(mp_check_i64(ctx, NULL, "global batch", global_batch, 1, MP_LIM_GLOBAL_BATCH));
    int64_t tokens = 0;
    if (mp_mul_i64_max(global_batch, seq, MP_LIM_STEP_TOKENS, &tokens))
      return mp_error(ctx, MP_ERR_INVALID,
                      "a step of %lld sequences of %lld tokens is more than %lld tokens (256x "
                      "the Llama 3 batch); lower the global batch or seq",
                      (long long)global_batch, (long long)seq, (long long)MP_LIM_STEP_TOKENS);
  }
  /* The widest tensor of one micro-batch: tokens x the widest per-token row (logits,
   * an MLP's hidden, a MoE layer's top_k routed rows, attention's projection). */
  int64_t width = m->vocab, w = m->d_ff;
  const char *what = "vocab";
  if (w > width) width = w, what = "d_ff";
  if (m->n_experts > 0 && (w = m->top_k * m->d_ff_expert) > width) width = w, what = "top_k x d_ff_expert";
  if ((w = m->n_heads * m->head_dim) > width) width = w, what = "n_heads x head_dim";
  if (mp_model_is_hybrid(m) && (w = mp_model_mamba_in_rows(m)) > width) width = w, what = "Mamba in_proj's rows";
  if (m->kv_lora_rank > 0 && (w = m->n_heads * (m->qk_nope_head_dim + m->v_head_dim)) > width)
    width = w, what = "n_heads x (qk_nope_head_dim + v_head_dim)";
  if (m->d_model > width) width = m->d_model, what = "d_model";
  int64_t tokens = 0, elems = 0;
  if (mp_mul_i64(micro_batch, seq, &tokens) ||
      mp_mul_i64_max(tokens, width, MP_LIM_MICRO_ELEMS, &elems))
    return mp_error(ctx, MP_ERR_INVALID,
                    "a micro-batch of %lld sequences of %lld tokens x %lld (%s) is more than "
                    "%lld elements in one tensor; lower the micro-batch or seq",
                    (long long)micro_batch, (long long)seq, (long long)width, what,
                    (long long)MP_LIM_MICRO_ELEMS);
  return MP_OK;
}

/* head_dim when the file does not give it: d_model / n_heads, which must be whole. A
 * remainder is refused rather than rounded: the file then describes no real attention.
 * Non-positive sizes are left for mp_model_validate to report. */
static mp_status default_head_dim(mp_ctx *ctx, const cJSON *j, const char *origin,
                                  const char *key, mp_model *m) {
  if (cJSON_GetObjectItemCaseSensitive(j, key) != NULL) return MP_OK;
  m->head_dim = m->n_heads > 0 ? m->d_model / m->n_heads : 0;
  if (m->n_heads > 0 && m->d_model > 0 && m->d_model % m->n_heads != 0)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: n_heads = %lld does not divide d_model = %lld and '%s' is not given; "
                    "give %s or choose n_heads among the divisors of d_model",
                    origin, (long long)m->n_heads, (long long)m->d_model, key, key);
  return MP_OK;
}

static const char *family_name(mp_family f) { return f == MP_FAMILY_GPT ? "gpt" : "llama"; }

/* meshplan's "mla" object (data/models/README.md): multi-head latent attention's ranks and
 * head parts; head_dim defaults to the query/key head qk_nope + qk_rope. */
/* MLA's five keys, named alike in meshplan's "mla" object and in DeepSeek's config.json
 * (q_lora_rank absent or null: 0), and head_dim as the query/key head they give. */
static mp_status read_mla_keys(mp_ctx *ctx, const cJSON *obj, const char *where, mp_model *m) {
  MP_CHECK(mp_model_read_fields(ctx, obj, where, MP_MODEL_OBJ_MLA, MP_MODEL_FIELD_FIRST,
                                MP_MODEL_FIELD_LAST, m));
  if (m->kv_lora_rank <= 0)
    return mp_error(ctx, MP_ERR_INVALID, "%s: 'kv_lora_rank' must be positive (got %lld)", where,
                    (long long)m->kv_lora_rank);
  m->head_dim = m->qk_nope_head_dim + m->qk_rope_head_dim;
  return MP_OK;
}

/* The object under key in j (meshplan's "mla" or "moe"): *out NULL when the key is absent
 * or null; sub names it in messages ("<origin>: <key>"). */
static mp_status sub_object(mp_ctx *ctx, const cJSON *j, const char *origin, const char *key,
                            const cJSON **out, char *sub, size_t cap) {
  *out = cJSON_GetObjectItemCaseSensitive(j, key);
  if (*out == NULL || cJSON_IsNull(*out)) {
    *out = NULL;
    return MP_OK;
  }
  if (!cJSON_IsObject(*out))
    return mp_error(ctx, MP_ERR_INVALID, "%s: key '%s': expected an object", origin, key);
  snprintf(sub, cap, "%s: %s", origin, key);
  return MP_OK;
}

static mp_status read_mla(mp_ctx *ctx, const cJSON *j, const char *origin, mp_model *m) {
  const cJSON *mla;
  char sub[256];
  MP_CHECK(sub_object(ctx, j, origin, "mla", &mla, sub, sizeof sub));
  return mla ? read_mla_keys(ctx, mla, sub, m) : MP_OK;
}

/* meshplan's "moe" object: the rows of MOE, and between them the MoE layers as
 * first_dense_layers and layer_freq. */
static mp_status read_moe(mp_ctx *ctx, const cJSON *j, const char *origin, mp_model *m) {
  const cJSON *moe;
  char sub[256];
  MP_CHECK(sub_object(ctx, j, origin, "moe", &moe, sub, sizeof sub));
  if (moe == NULL) return MP_OK;
  int64_t first_dense = 0, freq = 1;
  MP_CHECK(mp_model_read_fields(ctx, moe, sub, MP_MODEL_OBJ_MOE, MP_MODEL_FIELD_FIRST,
                                MP_MODEL_FIELD_n_experts, m));
  /* n_experts 0 would make the model dense (model.h) whatever the object's other keys say:
   * a "moe" object always describes experts, a dense model has none */
  if (m->n_experts < 1)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: moe.n_experts = %lld: a MoE block needs at least one expert; drop the moe "
                    "object for a dense model", origin, (long long)m->n_experts);
  MP_CHECK(mp_model_read_fields(ctx, moe, sub, MP_MODEL_OBJ_MOE, MP_MODEL_FIELD_top_k,
                                MP_MODEL_FIELD_d_ff_shared, m));
  MP_CHECK(mp_json_get_i64(ctx, moe, sub, "first_dense_layers", 0, &first_dense));
  MP_CHECK(mp_json_get_i64(ctx, moe, sub, "layer_freq", 0, &freq));
  MP_CHECK(mp_model_read_fields(ctx, moe, sub, MP_MODEL_OBJ_MOE, MP_MODEL_FIELD_aux_loss_coef,
                                MP_MODEL_FIELD_LAST, m));
  if (m->n_layers > MP_MAX_LAYERS) return mp_model_validate(ctx, m, origin);
  const int64_t nl = m->n_layers > 0 ? m->n_layers : 1;
  MP_CHECK(mp_check_i64(ctx, sub, "first_dense_layers", first_dense, 0, nl));
  MP_CHECK(mp_check_i64(ctx, sub, "layer_freq", freq, 1, nl));
  set_moe_layers(m, first_dense, freq);
  return MP_OK;
}

/* meshplan's own format: see data/models/README.md. The rows of the model object are read
 * in table order, "mla" before head_dim (its head parts give head_dim's default). */
static mp_status from_ours(mp_ctx *ctx, const cJSON *j, const char *origin, mp_model *m) {
  char fam[16] = "llama";
  MP_CHECK(mp_json_get_str(ctx, j, origin, "name", 0, m->name, sizeof m->name));
  MP_CHECK(mp_json_get_str(ctx, j, origin, "family", 1, fam, sizeof fam));
  if (strcmp(fam, "gpt") == 0) m->family = MP_FAMILY_GPT;
  else if (strcmp(fam, "llama") == 0) m->family = MP_FAMILY_LLAMA;
  else
    return mp_error(ctx, MP_ERR_INVALID, "%s: key 'family': expected \"gpt\" or \"llama\", got \"%s\"",
                    origin, fam);
  MP_CHECK(mp_model_read_kinds(ctx, j, origin, m));
  MP_CHECK(mp_model_read_fields(ctx, j, origin, MP_MODEL_OBJ_TOP, MP_MODEL_FIELD_FIRST,
                                MP_MODEL_FIELD_n_kv_heads, m));
  MP_CHECK(read_mla(ctx, j, origin, m));
  if (m->kv_lora_rank == 0) MP_CHECK(default_head_dim(ctx, j, origin, "head_dim", m));
  MP_CHECK(mp_model_read_fields(ctx, j, origin, MP_MODEL_OBJ_TOP, MP_MODEL_FIELD_head_dim,
                                MP_MODEL_FIELD_LAST, m));
  MP_CHECK(mp_model_read_hybrid(ctx, j, origin, 0, m));
  return read_moe(ctx, j, origin, m);
}

/* The inverse of from_ours for the rows whose saved column is 1 (model.h). */
cJSON *mp_model_to_json(const mp_model *m) {
  cJSON *o = cJSON_CreateObject();
  if (!o) return NULL;
  cJSON_AddStringToObject(o, "name", m->name);
  cJSON_AddStringToObject(o, "family", family_name(m->family));
  mp_model_write_kinds(o, m);
  mp_model_write_fields(o, m, MP_MODEL_OBJ_TOP, MP_MODEL_FIELD_FIRST, MP_MODEL_FIELD_LAST);
  if (mp_model_is_mla(m))
    mp_model_write_fields(cJSON_AddObjectToObject(o, "mla"), m, MP_MODEL_OBJ_MLA, MP_MODEL_FIELD_FIRST,
                          MP_MODEL_FIELD_LAST);
  if (mp_model_is_hybrid(m)) { /* the pattern and the Mamba object (model_hybrid.c) */
    char pat[MP_MAX_LAYERS + 1];
    mp_model_pattern(m, pat, sizeof pat);
    cJSON_AddStringToObject(o, "hybrid_override_pattern", pat);
    if (m->mamba_num_heads > 0)
      mp_model_write_fields(cJSON_AddObjectToObject(o, "mamba"), m, MP_MODEL_OBJ_MAMBA, MP_MODEL_FIELD_FIRST,
                            MP_MODEL_FIELD_LAST);
  }
  if (!mp_model_is_moe(m)) return o;
  /* the MoE layers as the format states them: the first first_dense_layers dense, then
   * every layer_freq-th */
  int64_t first = -1, second = -1;
  for (int64_t l = 0; l < m->n_layers; l++)
    if (mp_model_layer_is_moe(m, l)) {
      if (first < 0)
        first = l;
      else if (second < 0)
        second = l;
    }
  cJSON *moe = cJSON_AddObjectToObject(o, "moe");
  mp_model_write_fields(moe, m, MP_MODEL_OBJ_MOE, MP_MODEL_FIELD_FIRST, MP_MODEL_FIELD_d_ff_shared);
  cJSON_AddNumberToObject(moe, "first_dense_layers", (double)(first < 0 ? 0 : first));
  cJSON_AddNumberToObject(moe, "layer_freq", (double)(second > first ? second - first : 1));
  mp_model_write_fields(moe, m, MP_MODEL_OBJ_MOE, MP_MODEL_FIELD_aux_loss_coef, MP_MODEL_FIELD_LAST);
  return o;
}

/* Field f from a Hugging Face config under its llama-family key (the hf column of
 * MP_MODEL_FIELDS; only for rows that have one). */
static mp_status hf_get(mp_ctx *ctx, const cJSON *j, const char *where, mp_model_field f,
                        int required, mp_model *m) {
  return mp_model_get_field(ctx, j, where, mp_model_field_hf_key(f), required, f, m);
}

/* Hugging Face config.json. Field names per architecture:
 *   Llama/Qwen2/Qwen3/Mixtral/Qwen*MoE: vocab_size, hidden_size, num_hidden_layers,
 *     num_attention_heads, num_key_value_heads, intermediate_size, head_dim,
 *     max_position_embeddings, tie_word_embeddings, rms_norm_eps, rope_theta
 *   Mixtral: num_local_experts, num_experts_per_tok (intermediate_size is the expert's)
 *   Qwen3MoE/Qwen2MoE: num_experts, num_experts_per_tok, moe_intermediate_size,
 *     decoder_sparse_step, mlp_only_layers, shared_expert_intermediate_size
 *   GPT2: vocab_size, n_embd, n_layer, n_head, n_positions, n_inner, layer_norm_epsilon */
#define HF_SUPPORTED                                                                              \
  "llama, mistral, qwen2, qwen2_moe, qwen3, qwen3_moe, mixtral, deepseek_v2, deepseek_v3, nemotron_h and gpt2"

/* type or arch names a supported llama-family architecture (gpt2 is told apart before). */
static int hf_type_supported(const char *type, const char *arch) {
  static const char *types[] = {"llama", "mistral", "qwen2", "qwen2_moe", "qwen3", "qwen3_moe",
                                "mixtral", "deepseek_v2", "deepseek_v3"};
  static const char *archs[] = {"LlamaFor", "MistralFor", "Qwen2For", "Qwen2MoeFor",
                                "Qwen3For", "Qwen3MoeFor", "MixtralFor", "DeepseekV2For",
                                "DeepseekV3For"};
  if (type[0]) {
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
      if (strcmp(type, types[i]) == 0) return 1;
    return 0;
  }
  for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
    if (strncmp(arch, archs[i], strlen(archs[i])) == 0) return 1;
  return 0;
}

/* The routed experts under an architecture's key (required), within the table's range
 * 0..MP_LIM_EXPERTS; what 0 means is each architecture's (its reader says). */
static mp_status hf_experts(mp_ctx *ctx, const cJSON *j, const char *where, const char *key,
                            mp_model *m) {
  MP_CHECK(mp_json_get_i64(ctx, j, where, key, 1, &m->n_experts));
  return mp_model_check_field(ctx, m, where, MP_MODEL_FIELD_n_experts, key);
}

/* GPT-2's config (model_type gpt2): LayerNorm with biases, tied embeddings, d_ff 4 x d_model
 * unless n_inner says otherwise. */
static mp_status hf_gpt2(mp_ctx *ctx, const cJSON *j, const char *where, mp_model *m) {
  m->family = MP_FAMILY_GPT;
  m->bias = 1;
  m->tied_embeddings = 1;
  MP_CHECK(mp_json_get_i64(ctx, j, where, "vocab_size", 1, &m->vocab));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "n_embd", 1, &m->d_model));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "n_layer", 1, &m->n_layers));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "n_head", 1, &m->n_heads));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "n_positions", 1, &m->max_seq));
  m->d_ff = 4 * m->d_model;
  MP_CHECK(mp_json_get_i64(ctx, j, where, "n_inner", 0, &m->d_ff));
  m->n_kv_heads = m->n_heads;
  MP_CHECK(default_head_dim(ctx, j, where, "head_dim", m));
  m->norm_eps = 1e-5;
  MP_CHECK(mp_json_get_f64(ctx, j, where, "layer_norm_epsilon", 0, &m->norm_eps));
  return mp_json_get_bool(ctx, j, where, "tie_word_embeddings", 0, &m->tied_embeddings);
}

/* Mixtral's experts: every layer MoE, experts as wide as the dense d_ff. */
static mp_status hf_mixtral_moe(mp_ctx *ctx, const cJSON *j, const char *where, mp_model *m) {
  MP_CHECK(hf_experts(ctx, j, where, "num_local_experts", m));
  if (m->n_experts == 0) /* transformers' MixtralSparseMoeBlock routes top-k of none and fails */
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: num_local_experts = 0: a Mixtral block needs at least one expert; give "
                    "num_local_experts >= 1, or model_type \"mistral\" for the dense model", where);
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_top_k, 1, m));
  m->d_ff_expert = m->d_ff;
  m->aux_loss_coef = 0.02;
  MP_CHECK(mp_json_get_f64(ctx, j, where, "router_aux_loss_coef", 0, &m->aux_loss_coef));
  m->norm_topk_prob = 1;
  set_moe_layers(m, 0, 1);
  return MP_OK;
}

/* Qwen2-MoE's and Qwen3-MoE's experts: every decoder_sparse_step-th layer MoE except the
 * mlp_only_layers, an optional shared expert. */
static mp_status hf_qwen_moe(mp_ctx *ctx, const cJSON *j, const char *where, const char *type,
                             mp_model *m) {
  int64_t step = 1;
  MP_CHECK(hf_experts(ctx, j, where, "num_experts", m));
  if (m->n_experts == 0) { /* transformers builds a MoE block only where num_experts > 0 */
    mp_log(MP_LOG_WARN, "%s: num_experts = 0: read as transformers builds it, a dense model (every "
           "block's MLP of intermediate_size)", where);
    return MP_OK;
  }
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_top_k, 1, m));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "moe_intermediate_size", 1, &m->d_ff_expert));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "decoder_sparse_step", 0, &step));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "shared_expert_intermediate_size", 0, &m->d_ff_shared));
  if (m->d_ff_shared > 0) m->n_shared_experts = 1;
  m->aux_loss_coef = 0.001;
  MP_CHECK(mp_json_get_f64(ctx, j, where, "router_aux_loss_coef", 0, &m->aux_loss_coef));
  m->norm_topk_prob = strcmp(type, "qwen3_moe") == 0;
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_norm_topk_prob, 0, m));
  if (m->n_layers > MP_MAX_LAYERS) return mp_model_validate(ctx, m, where);
  const int64_t nl = m->n_layers > 0 ? m->n_layers : 1;
  MP_CHECK(mp_check_i64(ctx, where, "decoder_sparse_step", step, 1, nl));
  set_moe_layers(m, 0, step);
  const cJSON *only = cJSON_GetObjectItemCaseSensitive(j, "mlp_only_layers");
  if (only == NULL || cJSON_IsNull(only)) return MP_OK;
  if (!cJSON_IsArray(only))
    return mp_error(ctx, MP_ERR_INVALID, "%s: key 'mlp_only_layers': expected an array of layer indices",
                    where);
  const cJSON *it;
  cJSON_ArrayForEach(it, only) {
    const double l = cJSON_IsNumber(it) ? it->valuedouble : -1.0;
    if (!(l >= 0 && l < (double)nl && l == (double)(int64_t)l))
      return mp_error(ctx, MP_ERR_INVALID,
                      "%s: key 'mlp_only_layers': every entry must be a layer index in 0..%lld",
                      where, (long long)(nl - 1));
    m->moe_layer[(int64_t)l] = 0;
  }
  return MP_OK;
}

/* sliding_window (Mistral; null or absent: none), off where use_sliding_window is false
 * (Qwen2's configs carry a window they do not use). */
static mp_status hf_sliding_window(mp_ctx *ctx, const cJSON *j, const char *where, mp_model *m) {
  const char *key = mp_model_field_hf_key(MP_MODEL_FIELD_sliding_window);
  const cJSON *w = cJSON_GetObjectItemCaseSensitive(j, key);
  if (w == NULL || cJSON_IsNull(w)) return MP_OK;
  int use = 1;
  MP_CHECK(mp_json_get_bool(ctx, j, where, "use_sliding_window", 0, &use));
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_sliding_window, 0, m));
  if (!use) m->sliding_window = 0;
  return MP_OK;
}

/* Fields that change a model's cost which the llama family's readers do not read: a llama,
 * mistral or qwen config that sets one is refused by name rather than costed as if it were
 * absent (multi-head latent attention's ranks and DeepSeek's expert layout, read from
 * deepseek_v2 and deepseek_v3 configs only; logit soft-capping). */
static mp_status hf_refuse_unread(mp_ctx *ctx, const cJSON *j, const char *where) {
  static const char *const keys[] = {"q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
                                     "v_head_dim", "n_shared_experts", "first_k_dense_replace", "moe_layer_freq",
                                     "n_routed_experts", "attn_logit_softcapping", "final_logit_softcapping"};
  for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, keys[i]);
    if (v == NULL || cJSON_IsNull(v)) continue;
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: key '%s' changes the model's cost and is not read for this architecture "
                    "(multi-head latent attention and DeepSeek's experts are read from deepseek_v2/v3 "
                    "configs; soft-capping is not modelled); write the model in meshplan's JSON format "
                    "where it can be (mla; moe: n_shared_experts, first_dense_layers, layer_freq)",
                    where, keys[i]);
  }
  return MP_OK;
}

/* The llama family's sizes (vocab_size, hidden_size, num_hidden_layers, num_attention_heads,
 * num_key_value_heads defaulting to the heads), as every llama-style config names them. */
static mp_status hf_llama_sizes(mp_ctx *ctx, const cJSON *j, const char *where, mp_model *m) {
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_vocab, 1, m));
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_d_model, 1, m));
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_n_layers, 1, m));
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_n_heads, 1, m));
  m->n_kv_heads = m->n_heads;
  return hf_get(ctx, j, where, MP_MODEL_FIELD_n_kv_heads, 0, m);
}

/* Their context, embeddings and norm/RoPE constants (max_position_embeddings default 4096,
 * tie_word_embeddings, rms_norm_eps default 1e-6, rope_theta default 10000). */
static mp_status hf_llama_context(mp_ctx *ctx, const cJSON *j, const char *where, mp_model *m) {
  m->max_seq = 4096;
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_max_seq, 0, m));
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_tied_embeddings, 0, m));
  m->norm_eps = 1e-6;
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_norm_eps, 0, m));
  m->rope_theta = 10000.0;
  return hf_get(ctx, j, where, MP_MODEL_FIELD_rope_theta, 0, m);
}

/* DeepSeek-V2's and V3's experts (modeling_deepseek): block l is MoE when l >=
 * first_k_dense_replace and l % moe_layer_freq == 0; n_shared_experts shared experts of
 * moe_intermediate_size each, one SwiGLU of their summed width. The router's scoring (V2
 * softmax, V3 sigmoid with a selection bias) and routed_scaling_factor are element-wise
 * work on [tokens, n_routed_experts] that the router op's cost covers; its group-limited
 * top-k (n_group, topk_group) is read, as it bounds the nodes a token's copies travel to
 * (sim/cost.c); V3's selection bias is a buffer moved by the load-balancing rule,
 * not a trained parameter, so it is not counted (nor is it in the published 671B). */
static mp_status hf_deepseek_moe(mp_ctx *ctx, const cJSON *j, const char *where, int v3,
                                 mp_model *m) {
  const cJSON *r = cJSON_GetObjectItemCaseSensitive(j, "n_routed_experts");
  if (r == NULL || cJSON_IsNull(r)) return MP_OK; /* dense */
  int64_t first = 0, freq = 1;
  MP_CHECK(hf_experts(ctx, j, where, "n_routed_experts", m));
  if (m->n_experts == 0) /* modeling_deepseek builds its MoE blocks whenever the key is not null */
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: n_routed_experts = 0: DeepSeek's MoE blocks need at least one routed "
                    "expert; give n_routed_experts >= 1, or null for a dense model", where);
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_top_k, 1, m));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "moe_intermediate_size", 1, &m->d_ff_expert));
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_n_shared_experts, 0, m));
  /* before d_ff_shared's product: the ranges of the table, under DeepSeek's names */
  MP_CHECK(mp_model_check_field(ctx, m, where, MP_MODEL_FIELD_n_shared_experts, NULL));
  MP_CHECK(mp_model_check_field(ctx, m, where, MP_MODEL_FIELD_d_ff_expert, "moe_intermediate_size"));
  m->d_ff_shared = m->n_shared_experts * m->d_ff_expert;
  MP_CHECK(mp_json_get_i64(ctx, j, where, "first_k_dense_replace", 0, &first));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "moe_layer_freq", 0, &freq));
  m->aux_loss_coef = 0.001;
  MP_CHECK(mp_json_get_f64(ctx, j, where, "aux_loss_alpha", 0, &m->aux_loss_coef));
  m->norm_topk_prob = v3;
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_norm_topk_prob, 0, m));
  /* V3 always routes within its best topk_group groups; V2 when topk_method says so
   * (modeling_deepseek's MoEGate: "group_limited_greedy"; V2-Lite's "greedy" does not) */
  const cJSON *tm = cJSON_GetObjectItemCaseSensitive(j, "topk_method");
  if (v3 || (cJSON_IsString(tm) && strcmp(tm->valuestring, "group_limited_greedy") == 0)) {
    MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_n_group, 0, m));
    m->topk_group = m->n_group;
    MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_topk_group, 0, m));
  }
  if (m->n_layers > MP_MAX_LAYERS) return mp_model_validate(ctx, m, where);
  const int64_t nl = m->n_layers > 0 ? m->n_layers : 1;
  MP_CHECK(mp_check_i64(ctx, where, "first_k_dense_replace", first, 0, nl));
  MP_CHECK(mp_check_i64(ctx, where, "moe_layer_freq", freq, 1, nl));
  memset(m->moe_layer, 0, sizeof m->moe_layer);
  for (int64_t l = first; l < m->n_layers; l++) m->moe_layer[l] = l % freq == 0;
  return MP_OK;
}

/* DeepSeek-V2's and V3's configs (deepseek_v2, deepseek_v3): the llama family with
 * multi-head latent attention (q_lora_rank null or 0: q_proj) and DeepSeek's experts. A
 * `head_dim` key is not read: transformers' DeepseekV3Config sets it to qk_rope_head_dim,
 * while meshplan's head_dim is the query/key head. V3's multi-token-prediction modules
 * (num_nextn_predict_layers) are the model's mtp_layers (--mtp-num-layers 0 plans without
 * them, as Hugging Face transformers and torchtitan train it). */
static mp_status hf_deepseek(mp_ctx *ctx, const cJSON *j, const char *where, const char *type,
                             const char *arch, mp_model *m) {
  const int v3 = strcmp(type, "deepseek_v3") == 0 || strncmp(arch, "DeepseekV3", 10) == 0;
  m->family = MP_FAMILY_LLAMA;
  MP_CHECK(hf_llama_sizes(ctx, j, where, m));
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_d_ff, 1, m));
  MP_CHECK(read_mla_keys(ctx, j, where, m));
  MP_CHECK(hf_llama_context(ctx, j, where, m));
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_qkv_bias, 0, m));
  MP_CHECK(mp_json_get_i64(ctx, j, where, "num_nextn_predict_layers", 0, &m->mtp_layers));
  return hf_deepseek_moe(ctx, j, where, v3, m);
}

/* The llama family's configs (llama, mistral, qwen2, qwen3, and their MoE variants):
 * RMSNorm, RoPE, SwiGLU; Qwen2's q/k/v biases and Qwen3's q/k norms by default. */
static mp_status hf_llama(mp_ctx *ctx, const cJSON *j, const char *where, const char *type,
                          const char *arch, mp_model *m) {
  m->family = MP_FAMILY_LLAMA;
  MP_CHECK(hf_refuse_unread(ctx, j, where));
  MP_CHECK(hf_llama_sizes(ctx, j, where, m));
  MP_CHECK(default_head_dim(ctx, j, where, mp_model_field_hf_key(MP_MODEL_FIELD_head_dim), m));
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_head_dim, 0, m));
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_d_ff, 1, m));
  MP_CHECK(hf_llama_context(ctx, j, where, m));
  int is_qwen2 = strncmp(type, "qwen2", 5) == 0 || strncmp(arch, "Qwen2", 5) == 0;
  int is_qwen3 = strncmp(type, "qwen3", 5) == 0 || strncmp(arch, "Qwen3", 5) == 0;
  m->qkv_bias = is_qwen2;
  MP_CHECK(hf_get(ctx, j, where, MP_MODEL_FIELD_qkv_bias, 0, m));
  m->qk_norm = is_qwen3;
  MP_CHECK(hf_sliding_window(ctx, j, where, m));
  int is_mixtral = strcmp(type, "mixtral") == 0 || strncmp(arch, "Mixtral", 7) == 0;
  int is_qwen_moe = strcmp(type, "qwen3_moe") == 0 || strcmp(type, "qwen2_moe") == 0 ||
                    strstr(arch, "Moe") != NULL;
  if (is_mixtral) return hf_mixtral_moe(ctx, j, where, m);
  if (is_qwen_moe) return hf_qwen_moe(ctx, j, where, type, m);
  return MP_OK;
}

/* What known architectures have that the spec cannot describe (Gemma 2: Gemma Team 2024,
 * section 2; Gemma 3: Gemma Team 2025, section 2; the HF configs' keys), or NULL for an
 * unknown one. */
static const char *unmodelled_parts(const char *type) {
  static const struct {
    const char *type, *why;
  } known[] = {
      {"gemma2", "local sliding-window and global attention layers alternating, attention and "
                 "final logit soft-capping (attn_logit_softcapping, final_logit_softcapping) and "
                 "a norm after each sublayer"},
      {"gemma3", "five local sliding-window layers to each global one, a norm after each "
                 "sublayer and per-head q/k norms with two RoPE bases"},
  };
  for (size_t i = 0; i < sizeof known / sizeof known[0]; i++)
    if (strcmp(type, known[i].type) == 0) return known[i].why;
  return NULL;
}

mp_status mp_model_from_hf_text(mp_ctx *ctx, const char *text, const char *origin,
                                mp_model *out) {
  cJSON *j = NULL;
  MP_CHECK(mp_json_parse(ctx, text, origin, &j));
  mp_model m;
  memset(&m, 0, sizeof m);
  mp_status st = MP_OK;
  char arch[96] = "", type[64] = "";
  const cJSON *archs = cJSON_GetObjectItemCaseSensitive(j, "architectures");
  if (cJSON_IsArray(archs) && cJSON_GetArraySize(archs) > 0 &&
      cJSON_IsString(cJSON_GetArrayItem(archs, 0)))
    snprintf(arch, sizeof arch, "%s", cJSON_GetArrayItem(archs, 0)->valuestring);
  MP_CHECK_GOTO(mp_json_get_str(ctx, j, origin, "model_type", 0, type, sizeof type), st, done);
  char where[300];
  snprintf(where, sizeof where, "%s (%s)", origin, arch[0] ? arch : type);
  /* Without either the keys' meaning is unknown: read as llama, a Qwen2 config would lose
   * its q/k/v biases (they are Qwen2's by default, not by a key) without a word. */
  if (!type[0] && !arch[0]) {
    st = mp_error(ctx, MP_ERR_INVALID,
                  "%s: neither 'model_type' nor 'architectures' is given, so the architecture (and "
                  "what its keys mean) is unknown; add model_type, one of " HF_SUPPORTED,
                  origin);
    goto done;
  }
  int is_gpt2 = strcmp(type, "gpt2") == 0 || strncmp(arch, "GPT2", 4) == 0;
  if (strcmp(type, "nemotron_h") == 0 || (!type[0] && strncmp(arch, "NemotronHFor", 12) == 0)) {
    snprintf(m.name, sizeof m.name, "%s", arch[0] ? arch : type);
    MP_CHECK_GOTO(mp_model_hf_nemotron_h(ctx, j, where, &m), st, done);
    MP_CHECK_GOTO(mp_model_validate(ctx, &m, where), st, done);
    *out = m;
    goto done;
  }
  /* Other architectures (Gemma, ...) have parts this spec cannot describe; reading
   * them as llama would give silently wrong counts, so they are refused by name. */
  if (!is_gpt2 && !hf_type_supported(type, arch)) {
    const char *why = unmodelled_parts(type);
    if (why) {
      st = mp_error(ctx, MP_ERR_INVALID,
                    "%s: architecture '%s' is refused: %s, which meshplan's model spec does not "
                    "describe (its cost would come out wrong)",
                    origin, type, why);
      goto done;
    }
    st = mp_error(ctx, MP_ERR_INVALID,
                  "%s: unsupported architecture '%s'; meshplan reads Hugging Face configs of "
                  HF_SUPPORTED " (or write the model in meshplan's JSON format)",
                  origin, type[0] ? type : arch);
    goto done;
  }
  snprintf(m.name, sizeof m.name, "%s", arch[0] ? arch : type);
  const int is_deepseek = strncmp(type, "deepseek_v", 10) == 0 || strncmp(arch, "DeepseekV", 9) == 0;
  if (is_gpt2) MP_CHECK_GOTO(hf_gpt2(ctx, j, where, &m), st, done);
  else if (is_deepseek) MP_CHECK_GOTO(hf_deepseek(ctx, j, where, type, arch, &m), st, done);
  else MP_CHECK_GOTO(hf_llama(ctx, j, where, type, arch, &m), st, done);
  MP_CHECK_GOTO(mp_model_validate(ctx, &m, where), st, done);
  *out = m;
done:
  cJSON_Delete(j);
  return st;
}

static int looks_like_hf(const cJSON *j) {
  return cJSON_GetObjectItemCaseSensitive(j, "hidden_size") != NULL ||
         cJSON_GetObjectItemCaseSensitive(j, "n_embd") != NULL ||
         cJSON_GetObjectItemCaseSensitive(j, "architectures") != NULL ||
         cJSON_GetObjectItemCaseSensitive(j, "model_type") != NULL;
}

mp_status mp_model_from_text(mp_ctx *ctx, const char *text, const char *origin, mp_model *out) {
  cJSON *j = NULL;
  MP_CHECK(mp_json_parse(ctx, text, origin, &j));
  if (looks_like_hf(j)) {
    cJSON_Delete(j);
    return mp_model_from_hf_text(ctx, text, origin, out);
  }
  mp_model m;
  memset(&m, 0, sizeof m);
  mp_status st = from_ours(ctx, j, origin, &m);
  cJSON_Delete(j);
  if (st != MP_OK) return st;
  MP_CHECK(mp_model_validate(ctx, &m, origin));
  *out = m;
  return MP_OK;
}

static mp_status parse_model(mp_ctx *ctx, const char *text, const char *origin, void *out) {
  return mp_model_from_text(ctx, text, origin, (mp_model *)out);
}

/* An embedded model is named by its stem; one read from a path keeps its "name", or takes
 * the file's name when it has none. */
mp_status mp_model_load(mp_ctx *ctx, const char *name_or_path, mp_model *out) {
  static const mp_data_kind models = {"models", "model", "known models", "", NULL, 0};
  const mp_data_entry *entry = NULL;
  MP_CHECK(mp_data_load(ctx, &models, name_or_path, parse_model, out, &entry));
  if (entry) {
    snprintf(out->name, sizeof out->name, "%s", entry->name);
  } else if (out->name[0] == '\0') {
    const char *base = strrchr(name_or_path, '/');
    snprintf(out->name, sizeof out->name, "%s", base ? base + 1 : name_or_path);
  }
  return MP_OK;
}

int mp_model_is_moe(const mp_model *m) { return m->n_experts > 0; }

int mp_model_is_mla(const mp_model *m) { return m->kv_lora_rank > 0; }

int64_t mp_model_v_head_dim(const mp_model *m) {
  return m->kv_lora_rank > 0 ? m->v_head_dim : m->head_dim;
}

int mp_model_layer_is_moe(const mp_model *m, int64_t layer) {
  if (mp_model_layer_is_mtp(m, layer)) layer = m->n_layers - 1; /* the last block's kind */
  return m->n_experts > 0 && layer >= 0 && layer < m->n_layers && m->moe_layer[layer];
}

int64_t mp_model_n_blocks(const mp_model *m) { return m->n_layers + m->mtp_layers; }

int mp_model_layer_is_mtp(const mp_model *m, int64_t layer) {
  return layer >= m->n_layers && layer < mp_model_n_blocks(m);
}

int64_t mp_model_n_moe_layers(const mp_model *m) {
  int64_t n = 0;
  for (int64_t l = 0; l < m->n_layers; l++) n += mp_model_layer_is_moe(m, l);
  return n;
}

static int64_t norm_params(const mp_model *m) {
  return mp_model_norm_has_bias(m) ? 2 * m->d_model : m->d_model;
}

/* MLA (model.h): the query path (q_a_proj, its norm and q_b_proj, or q_proj), the key/value
 * path (kv_a_proj_with_mqa, its norm on the latent, kv_b_proj) and o_proj. */
static int64_t mla_params(const mp_model *m) {
  const int64_t H = m->d_model, nh = m->n_heads, ql = m->q_lora_rank, kvl = m->kv_lora_rank;
  const int64_t q = nh * m->head_dim;
  int64_t p = ql > 0 ? ql * H + ql + q * ql : q * H;
  p += (kvl + m->qk_rope_head_dim) * H + kvl + nh * (m->qk_nope_head_dim + m->v_head_dim) * kvl;
  return p + H * nh * m->v_head_dim;
}

static int64_t attn_params(const mp_model *m) {
  if (m->kv_lora_rank > 0) return mla_params(m);
  int64_t H = m->d_model, q = m->n_heads * m->head_dim, kv = m->n_kv_heads * m->head_dim;
  int64_t p = H * q + 2 * H * kv + q * H;
  if (m->bias) p += q + 2 * kv + H;
  else if (m->qkv_bias) p += q + 2 * kv;
  if (m->qk_norm) p += 2 * m->head_dim;
  return p;
}

/* gate (when gated), up and down; GPT-2's up and down biases */
static int64_t mlp_params(const mp_model *m, int64_t d_ff) {
  const int64_t p = (mp_model_mlp_gated(m) ? 3 : 2) * m->d_model * d_ff;
  return p + (m->family == MP_FAMILY_GPT && m->bias ? d_ff + m->d_model : 0);
}

static int64_t moe_params(const mp_model *m, int active) {
  int64_t n = active ? m->top_k : m->n_experts;
  int64_t p = n * 3 * m->d_model * m->d_ff_expert + m->n_experts * m->d_model; /* + router */
  if (m->n_shared_experts > 0) p += 3 * m->d_model * m->d_ff_shared;
  return p;
}

static int64_t block_params(const mp_model *m, int64_t layer, int active) {
  if (mp_model_is_hybrid(m) && layer < m->n_layers) /* one part behind its norm */
    return norm_params(m) + (mp_model_layer_has_mamba(m, layer)  ? mp_model_mamba_params(m)
                             : mp_model_layer_has_attn(m, layer) ? attn_params(m)
                                                                 : mlp_params(m, m->d_ff));
  int64_t p = attn_params(m) + 2 * norm_params(m);
  p += mp_model_layer_is_moe(m, layer) ? moe_params(m, active) : mlp_params(m, m->d_ff);
  return p;
}

int64_t mp_model_block_params(const mp_model *m, int64_t layer) { return block_params(m, layer, 0); }

/* One MTP module's parameters beside its block's (enorm, hnorm, eh_proj, final norm). */
static int64_t mtp_extra_params(const mp_model *m) {
  return 3 * norm_params(m) + 2 * m->d_model * m->d_model;
}

int64_t mp_model_mtp_params(const mp_model *m) {
  int64_t p = 0;
  for (int64_t l = m->n_layers; l < mp_model_n_blocks(m); l++) p += block_params(m, l, 0) + mtp_extra_params(m);
  return p;
}

int64_t mp_model_embedding_params(const mp_model *m) {
  int64_t p = m->vocab * m->d_model;
  if (m->family == MP_FAMILY_GPT) p += m->max_seq * m->d_model;
  return p;
}

int64_t mp_model_head_params(const mp_model *m) {
  return norm_params(m) + (m->tied_embeddings ? 0 : m->vocab * m->d_model);
}

int64_t mp_model_param_count(const mp_model *m) {
  int64_t p = mp_model_embedding_params(m) + mp_model_head_params(m);
  for (int64_t l = 0; l < m->n_layers; l++) p += block_params(m, l, 0);
  return p;
}

int64_t mp_model_active_param_count(const mp_model *m) {
  int64_t p = mp_model_embedding_params(m) + mp_model_head_params(m);
  for (int64_t l = 0; l < m->n_layers; l++) p += block_params(m, l, 1);
  return p;
}

double mp_model_attended_keys(const mp_model *m, int64_t seq) {
  const double s = (double)seq, w = (double)m->sliding_window;
  if (!mp_model_window_applies(m, seq)) return s / 2.0;
  const double windowed = w - w * w / (2.0 * s);
  if (m->window_attn_skip_freq <= 0) return windowed;
  /* every window_attn_skip_freq-th block attends to the causal half: the mean over the blocks,
   * which every block's attention is priced at */
  const double full = (double)(m->n_layers / m->window_attn_skip_freq), all = (double)m->n_layers;
  return ((all - full) * windowed + full * s / 2.0) / all;
}

int mp_model_window_applies(const mp_model *m, int64_t seq) {
  return m->sliding_window > 0 && seq > m->sliding_window;
}

void mp_model_window_refusal(const mp_model *m, int64_t seq, char *buf, size_t cap) {
  snprintf(buf, cap,
           "%s has sliding-window attention (window %lld) and seq %lld is longer: the runtime's attention "
           "kernels attend to the whole causal prefix, not a window; train with --seq %lld or less",
           m->name, (long long)m->sliding_window, (long long)seq, (long long)m->sliding_window);
}

int64_t mp_model_matmul_param_count(const mp_model *m) {
  int64_t p = m->vocab * m->d_model + norm_params(m);
  for (int64_t l = 0; l < m->n_layers; l++) p += block_params(m, l, 1);
  return p;
}

double mp_model_flops_per_token(const mp_model *m, int64_t seq) {
  if (mp_model_is_hybrid(m)) return mp_model_hybrid_flops_per_token(m, seq);
  double n = (double)mp_model_matmul_param_count(m);
  /* the MTP modules: their blocks, norms and eh_proj, and their head's matmul */
  for (int64_t l = m->n_layers; l < mp_model_n_blocks(m); l++)
    n += (double)(block_params(m, l, 1) + mtp_extra_params(m) + m->vocab * m->d_model);
  const double blocks = (double)mp_model_n_blocks(m);
  if (m->kv_lora_rank > 0) /* QK^T over the query/key head, attention x V over v_head_dim */
    return 6.0 * n + 6.0 * blocks * (double)m->n_heads * (double)(m->head_dim + m->v_head_dim) *
                         (2.0 * mp_model_attended_keys(m, seq));
  return 6.0 * n + 12.0 * blocks * (double)m->n_heads * (double)m->head_dim *
                       (2.0 * mp_model_attended_keys(m, seq));
}
