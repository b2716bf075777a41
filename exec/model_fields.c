/* The rows of MP_MODEL_FIELDS (model.h) as functions of a field: its keys, reading,
 * checking and writing one field, and the loops over rows that meshplan's format and
 * mp_model_validate use (model_internal.h). Each per-field function is one switch generated
 * from the table, so a row added there is read, checked, compared and written everywhere. */
#include <stddef.h>

#include "common/json.h"
#include "common/validate.h"
#include "exec/model_internal.h"

/* The columns that are constants (default, lo and hi are expressions of the model). */
typedef struct field_row {
  const char *key, *hf_key;
  mp_model_obj obj;
  int required, saved;
  mp_model_check check;
} field_row;

static const field_row k_rows[MP_MODEL_FIELD_COUNT] = {
#define ROW_(field, type, obj, req, dflt, lo, hi, ends, check, saved, hf) \
  {#field, hf, MP_MODEL_OBJ_##obj, req, saved, MP_MODEL_CHECK_##check},
    MP_MODEL_FIELDS(ROW_)
#undef ROW_
};

const char *mp_model_field_key(mp_model_field f) { return k_rows[f].key; }

const char *mp_model_field_hf_key(mp_model_field f) { return k_rows[f].hf_key; }

/* Per type: the JSON getter, the range check and the JSON writer. */
#define GET_I64 mp_json_get_i64
#define GET_BOOL mp_json_get_bool
#define GET_F64 mp_json_get_f64
#define CHECK_I64(ctx, origin, name, v, lo, hi, ends) mp_check_i64(ctx, origin, name, v, lo, hi)
#define CHECK_F64(ctx, origin, name, v, lo, hi, ends) mp_check_f64(ctx, origin, name, v, lo, hi, ends)
#define CHECK_BOOL(ctx, origin, name, v, lo, hi, ends) MP_OK
#define ADD_I64(o, key, v) cJSON_AddNumberToObject(o, key, (double)(v))
#define ADD_BOOL(o, key, v) cJSON_AddBoolToObject(o, key, v)
#define ADD_F64(o, key, v) cJSON_AddNumberToObject(o, key, v)

mp_status mp_model_get_field(mp_ctx *ctx, const cJSON *obj, const char *where, const char *key,
                             int required, mp_model_field f, mp_model *m) {
  if (key == NULL) key = k_rows[f].key;
  switch (f) {
#define GET_FIELD_(field, type, ...) \
  case MP_MODEL_FIELD_##field:       \
    return GET_##type(ctx, obj, where, key, required, &m->field);
    MP_MODEL_FIELDS(GET_FIELD_)
#undef GET_FIELD_
    case MP_MODEL_FIELD_COUNT:
      break;
  }
  return MP_OK;
}

/* The row's default, for an optional field (the default column; the copy through d keeps
 * a default that is the field itself, head_dim's, from reading as a self-assignment). */
static void set_default(mp_model *m, mp_model_field f) {
  switch (f) {
#define SET_DEFAULT_(field, type, obj, req, dflt, ...) \
  case MP_MODEL_FIELD_##field: {                       \
    const MP_MODEL_CTYPE_##type d = (dflt);            \
    m->field = d;                                      \
    break;                                             \
  }
    MP_MODEL_FIELDS(SET_DEFAULT_)
#undef SET_DEFAULT_
    case MP_MODEL_FIELD_COUNT:
      break;
  }
}

mp_status mp_model_read_fields(mp_ctx *ctx, const cJSON *json, const char *where, mp_model_obj obj,
                               mp_model_field first, mp_model_field last, mp_model *m) {
  for (int f = first; f <= (int)last; f++) {
    const field_row *r = &k_rows[f];
    if (r->obj != obj) continue;
    if (!r->required) set_default(m, (mp_model_field)f);
    MP_CHECK(mp_model_get_field(ctx, json, where, r->key, r->required, (mp_model_field)f, m));
  }
  return MP_OK;
}

double mp_model_field_value(const mp_model *m, mp_model_field f) {
  switch (f) {
#define VALUE_(field, ...)       \
  case MP_MODEL_FIELD_##field: \
    return (double)m->field;
    MP_MODEL_FIELDS(VALUE_)
#undef VALUE_
    case MP_MODEL_FIELD_COUNT:
      break;
  }
  return 0.0;
}

int mp_model_first_difference(const mp_model *a, const mp_model *b, const mp_model_field *fields,
                              int n) {
  for (int i = 0; i < n; i++)
    if (mp_model_field_value(a, fields[i]) != mp_model_field_value(b, fields[i])) return i;
  return -1;
}

void mp_model_field_to_json(cJSON *o, const char *key, const mp_model *m, mp_model_field f) {
  switch (f) {
#define TO_JSON_(field, type, ...) \
  case MP_MODEL_FIELD_##field:     \
    ADD_##type(o, key, m->field);  \
    break;
    MP_MODEL_FIELDS(TO_JSON_)
#undef TO_JSON_
    case MP_MODEL_FIELD_COUNT:
      break;
  }
}

void mp_model_write_fields(cJSON *json, const mp_model *m, mp_model_obj obj, mp_model_field first,
                           mp_model_field last) {
  for (int f = first; f <= (int)last; f++)
    if (k_rows[f].obj == obj && k_rows[f].saved)
      mp_model_field_to_json(json, k_rows[f].key, m, (mp_model_field)f);
}

mp_status mp_model_check_field(mp_ctx *ctx, const mp_model *m, const char *origin, mp_model_field f,
                               const char *label) {
  const char *name = label ? label : k_rows[f].key;
  switch (f) {
#define CHECK_FIELD_(field, type, obj, req, dflt, lo, hi, ends, ...) \
  case MP_MODEL_FIELD_##field:                                        \
    return CHECK_##type(ctx, origin, name, m->field, lo, hi, MP_RANGE_##ends);
    MP_MODEL_FIELDS(CHECK_FIELD_)
#undef CHECK_FIELD_
    case MP_MODEL_FIELD_COUNT:
      break;
  }
  return MP_OK;
}

mp_status mp_model_check_fields(mp_ctx *ctx, const mp_model *m, const char *origin, mp_model_check check) {
  for (int f = 0; f < MP_MODEL_FIELD_COUNT; f++)
    if (k_rows[f].check == check) MP_CHECK(mp_model_check_field(ctx, m, origin, (mp_model_field)f, NULL));
  return MP_OK;
}
