/* The model's kinds of MLP and norm (model.h: mp_mlp, mp_norm): the family's defaults
 * resolved, and meshplan's "mlp" and "norm" keys read and written. A model built in code
 * leaves them 0 (MP_MLP_FAMILY, MP_NORM_FAMILY) and has its family's. */
#include <stdio.h>
#include <string.h>

#include "common/json.h"
#include "exec/model_internal.h"

mp_mlp mp_model_mlp(const mp_model *m) {
  if (m->mlp != MP_MLP_FAMILY) return m->mlp;
  return m->family == MP_FAMILY_GPT ? MP_MLP_GELU : MP_MLP_SWIGLU;
}

int mp_model_mlp_gated(const mp_model *m) { return mp_model_mlp(m) == MP_MLP_SWIGLU; }

mp_norm mp_model_norm(const mp_model *m) {
  if (m->norm != MP_NORM_FAMILY) return m->norm;
  return m->family == MP_FAMILY_GPT ? MP_NORM_LAYER : MP_NORM_RMS;
}

int mp_model_norm_has_bias(const mp_model *m) {
  return mp_model_norm(m) == MP_NORM_LAYER && (m->family != MP_FAMILY_GPT || m->bias);
}

/* meshplan's words for mp_mlp and mp_norm (model.h); index 0, the family's, has none. */
static const char *const mlp_names[] = {[MP_MLP_SWIGLU] = "swiglu", [MP_MLP_GELU] = "gelu",
                                        [MP_MLP_SQUARED_RELU] = "squared_relu"};
static const char *const norm_names[] = {[MP_NORM_RMS] = "rmsnorm", [MP_NORM_LAYER] = "layernorm"};

/* The string under key as the index of one of names[1..n) in *out; absent or null: *out
 * untouched (the family's). */
static mp_status read_choice(mp_ctx *ctx, const cJSON *j, const char *origin, const char *key,
                             const char *const *names, int n, int *out) {
  char v[32] = "", want[96] = "";
  const cJSON *item = cJSON_GetObjectItemCaseSensitive(j, key);
  if (item == NULL || cJSON_IsNull(item)) return MP_OK;
  MP_CHECK(mp_json_get_str(ctx, j, origin, key, 0, v, sizeof v));
  for (int i = 1; i < n; i++) {
    if (strcmp(v, names[i]) == 0) {
      *out = i;
      return MP_OK;
    }
    snprintf(want + strlen(want), sizeof want - strlen(want), "%s\"%s\"", i > 1 ? ", " : "", names[i]);
  }
  return mp_error(ctx, MP_ERR_INVALID, "%s: key '%s': expected one of %s, got \"%s\"", origin, key, want, v);
}

/* "mlp" and "norm" (model.h): the llama family takes any; gpt's are its own (GELU,
 * LayerNorm), and a MoE model's dense blocks keep SwiGLU, as its experts are. */
mp_status mp_model_read_kinds(mp_ctx *ctx, const cJSON *j, const char *origin, mp_model *m) {
  int mlp = MP_MLP_FAMILY, norm = MP_NORM_FAMILY;
  MP_CHECK(read_choice(ctx, j, origin, "mlp", mlp_names, MP_MLP_SQUARED_RELU + 1, &mlp));
  MP_CHECK(read_choice(ctx, j, origin, "norm", norm_names, MP_NORM_LAYER + 1, &norm));
  m->mlp = (mp_mlp)mlp;
  m->norm = (mp_norm)norm;
  if (m->family == MP_FAMILY_GPT && (mp_model_mlp(m) != MP_MLP_GELU || mp_model_norm(m) != MP_NORM_LAYER))
    return mp_error(ctx, MP_ERR_INVALID, "%s: a gpt model has a GELU MLP and LayerNorms; leave 'mlp' and "
                    "'norm' out, or give family \"llama\"", origin);
  return MP_OK;
}

void mp_model_write_kinds(cJSON *o, const mp_model *m) {
  if (m->mlp != MP_MLP_FAMILY) cJSON_AddStringToObject(o, "mlp", mlp_names[m->mlp]);
  if (m->norm != MP_NORM_FAMILY) cJSON_AddStringToObject(o, "norm", norm_names[m->norm]);
}
