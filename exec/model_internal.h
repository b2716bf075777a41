/* The model spec's internals shared by its files (model.h is the interface):
 *   model_fields.c  the rows of MP_MODEL_FIELDS read, checked and written field by field
 *   model.c         meshplan's format, the Hugging Face configs, validation and counts */
#ifndef MP_EXEC_MODEL_INTERNAL_H
#define MP_EXEC_MODEL_INTERNAL_H

#include <cjson/cJSON.h>

#include "exec/model.h"

/* The whole table, for mp_model_read_fields and mp_model_write_fields. */
#define MP_MODEL_FIELD_FIRST ((mp_model_field)0)
#define MP_MODEL_FIELD_LAST ((mp_model_field)(MP_MODEL_FIELD_COUNT - 1))

/* Where meshplan's format has a row's key (the obj column). */
typedef enum mp_model_obj {
  MP_MODEL_OBJ_TOP = 0, /* the model object */
  MP_MODEL_OBJ_MLA,     /* its "mla" object */
  MP_MODEL_OBJ_MOE,     /* its "moe" object */
  MP_MODEL_OBJ_MAMBA    /* its "mamba" object (a hybrid model's Mamba-2 mixer) */
} mp_model_obj;

/* Reads field f of m from obj under key (NULL: the field's meshplan key) with required as
 * given; a missing or null key leaves the field as it is (mp_json_get_*). where names obj in
 * messages. */
mp_status mp_model_get_field(mp_ctx *ctx, const cJSON *obj, const char *where, const char *key,
                             int required, mp_model_field f, mp_model *m);
/* Reads from json the rows of object obj among first..last, in table order, as meshplan's
 * format has them: an optional field takes its default, then the key's value if given. */
mp_status mp_model_read_fields(mp_ctx *ctx, const cJSON *json, const char *where, mp_model_obj obj,
                               mp_model_field first, mp_model_field last, mp_model *m);
/* Adds to json the rows of object obj among first..last whose saved column is 1, in table
 * order (mp_model_field_to_json). */
void mp_model_write_fields(cJSON *json, const mp_model *m, mp_model_obj obj, mp_model_field first,
                           mp_model_field last);

/* meshplan's "mlp" and "norm" keys of j into m->mlp and m->norm (absent or null: the
 * family's; model_kinds.c), after m->family is read; a gpt model that names another MLP or
 * norm than its own is refused. */
mp_status mp_model_read_kinds(mp_ctx *ctx, const cJSON *j, const char *origin, mp_model *m);
/* Adds "mlp" and "norm" to o where m names them (not the family's default). */
void mp_model_write_kinds(cJSON *o, const mp_model *m);

/* Where mp_model_validate checks a row's range (the check column). */
typedef enum mp_model_check {
  MP_MODEL_CHECK_NONE = 0,
  MP_MODEL_CHECK_FIRST,
  MP_MODEL_CHECK_MLA,
  MP_MODEL_CHECK_MOE,
  MP_MODEL_CHECK_MAMBA,
  MP_MODEL_CHECK_RULE
} mp_model_check;

/* Field f of m within its row's range (lo, hi, ends), named label in the message (NULL: its
 * meshplan key); always MP_OK for a flag. */
mp_status mp_model_check_field(mp_ctx *ctx, const mp_model *m, const char *origin, mp_model_field f,
                               const char *label);
/* Every row whose check column is `check`, in table order; the first out of range fails. */
mp_status mp_model_check_fields(mp_ctx *ctx, const mp_model *m, const char *origin, mp_model_check check);

/* Reads meshplan's "hybrid_override_pattern" and "mamba" keys of j (both absent: a
 * transformer), or a Hugging Face nemotron_h config's pattern and Mamba keys (hf 1), after
 * n_layers is read (model_hybrid.c). */
mp_status mp_model_read_hybrid(mp_ctx *ctx, const cJSON *j, const char *origin, int hf, mp_model *m);
/* Hugging Face's nemotron_h config.json into m (model_hybrid.c). */
mp_status mp_model_hf_nemotron_h(mp_ctx *ctx, const cJSON *j, const char *where, mp_model *m);
/* The rules of a hybrid model, and of a transformer that none of its keys are set (called by
 * mp_model_validate). */
mp_status mp_model_validate_hybrid(mp_ctx *ctx, const mp_model *m, const char *origin);

#endif
