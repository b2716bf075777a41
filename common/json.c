/* JSON loading with precise messages (see json.h). */
#include "common/json.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *type_name(const cJSON *v) {
  if (cJSON_IsNumber(v)) return "a number";
  if (cJSON_IsString(v)) return "a string";
  if (cJSON_IsBool(v)) return "a boolean";
  if (cJSON_IsNull(v)) return "null";
  if (cJSON_IsArray(v)) return "an array";
  if (cJSON_IsObject(v)) return "an object";
  return "an unknown value";
}

static void line_col(const char *text, const char *at, int *line, int *col) {
  *line = 1;
  *col = 1;
  for (const char *p = text; p < at && *p; p++) {
    if (*p == '\n') {
      (*line)++;
      *col = 1;
    } else {
      (*col)++;
    }
  }
}

mp_status mp_json_parse(mp_ctx *ctx, const char *text, const char *origin, cJSON **out) {
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
  if (root == NULL) {
    const char *at = cJSON_GetErrorPtr();
    int line = 0, col = 0;
    if (at) line_col(text, at, &line, &col);
    return mp_error(ctx, MP_ERR_INVALID, "%s: malformed JSON at line %d, column %d; fix the file",
                    origin, line, col);
  }
  if (!cJSON_IsObject(root)) {
    cJSON_Delete(root);
    return mp_error(ctx, MP_ERR_INVALID, "%s: expected a JSON object at the top level", origin);
  }
  *out = root;
  return MP_OK;
}

mp_status mp_json_parse_file(mp_ctx *ctx, const char *path, cJSON **out) {
  char *text = NULL;
  MP_CHECK(mp_read_file_max(ctx, path, MP_FILE_MAX_CONFIG_BYTES, &text, NULL));
  mp_status st = mp_json_parse(ctx, text, path, out);
  free(text);
  return st;
}

static mp_status missing(mp_ctx *ctx, const char *origin, const char *key) {
  return mp_error(ctx, MP_ERR_INVALID, "%s: missing required key '%s'", origin, key);
}

mp_status mp_json_get_f64(mp_ctx *ctx, const cJSON *obj, const char *origin, const char *key,
                          int required, double *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (v == NULL || cJSON_IsNull(v)) return required ? missing(ctx, origin, key) : MP_OK;
  if (!cJSON_IsNumber(v))
    return mp_error(ctx, MP_ERR_INVALID, "%s: key '%s': expected a number, got %s", origin, key,
                    type_name(v));
  /* cJSON reads 1e999 as infinity: no field of ours means that. */
  if (!isfinite(v->valuedouble))
    return mp_error(ctx, MP_ERR_INVALID, "%s: key '%s': expected a finite number, got %g", origin,
                    key, v->valuedouble);
  *out = v->valuedouble;
  return MP_OK;
}

mp_status mp_json_get_i64(mp_ctx *ctx, const cJSON *obj, const char *origin, const char *key,
                          int required, int64_t *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (v == NULL || cJSON_IsNull(v)) return required ? missing(ctx, origin, key) : MP_OK;
  if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) ||
      fabs(v->valuedouble) > 9.0e15)
    return mp_error(ctx, MP_ERR_INVALID, "%s: key '%s': expected an integer, got %s", origin, key,
                    cJSON_IsNumber(v) ? "a fractional number" : type_name(v));
  *out = (int64_t)v->valuedouble;
  return MP_OK;
}

int mp_json_int_in(const cJSON *v, int64_t lo, int64_t hi, int64_t *out) {
  if (!cJSON_IsNumber(v)) return 0;
  const double d = v->valuedouble; /* NaN fails every comparison */
  if (!(d >= (double)lo && d <= (double)hi) || d != floor(d)) return 0;
  *out = (int64_t)d;
  return 1;
}

mp_status mp_json_get_int(mp_ctx *ctx, const cJSON *obj, const char *origin, const char *key,
                          int required, int *out) {
  int64_t x = *out;
  MP_CHECK(mp_json_get_i64(ctx, obj, origin, key, required, &x));
  if (x < -2147483647LL || x > 2147483647LL)
    return mp_error(ctx, MP_ERR_INVALID, "%s: key '%s': %lld is out of range", origin, key,
                    (long long)x);
  *out = (int)x;
  return MP_OK;
}

mp_status mp_json_get_bool(mp_ctx *ctx, const cJSON *obj, const char *origin, const char *key,
                           int required, int *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (v == NULL || cJSON_IsNull(v)) return required ? missing(ctx, origin, key) : MP_OK;
  if (!cJSON_IsBool(v))
    return mp_error(ctx, MP_ERR_INVALID, "%s: key '%s': expected true or false, got %s", origin,
                    key, type_name(v));
  *out = cJSON_IsTrue(v) ? 1 : 0;
  return MP_OK;
}

mp_status mp_json_get_str(mp_ctx *ctx, const cJSON *obj, const char *origin, const char *key,
                          int required, char *out, size_t cap) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
  if (v == NULL || cJSON_IsNull(v)) return required ? missing(ctx, origin, key) : MP_OK;
  if (!cJSON_IsString(v))
    return mp_error(ctx, MP_ERR_INVALID, "%s: key '%s': expected a string, got %s", origin, key,
                    type_name(v));
  size_t n = strlen(v->valuestring);
  if (n + 1 > cap)
    return mp_error(ctx, MP_ERR_INVALID, "%s: key '%s': string longer than %zu characters",
                    origin, key, cap - 1);
  memcpy(out, v->valuestring, n + 1);
  return MP_OK;
}
