/* JSON loading through cJSON, with errors that name the file, the key and what was
 * expected: "llama3.1-8b.json: key 'n_heads': expected an integer, got a string". */
#ifndef MP_COMMON_JSON_H
#define MP_COMMON_JSON_H

#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/file.h" /* mp_read_file, mp_write_file_atomic */
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Parses text; origin names it in messages (a file name). *out is freed by cJSON_Delete. */
mp_status mp_json_parse(mp_ctx *ctx, const char *text, const char *origin, cJSON **out);
mp_status mp_json_parse_file(mp_ctx *ctx, const char *path, cJSON **out);

/* Getters. With required=0 a missing key leaves *out untouched and returns MP_OK;
 * a key of the wrong type is always an error. `what` describes the key for messages. */
mp_status mp_json_get_i64(mp_ctx *ctx, const cJSON *obj, const char *origin, const char *key,
                          int required, int64_t *out);
mp_status mp_json_get_int(mp_ctx *ctx, const cJSON *obj, const char *origin, const char *key,
                          int required, int *out);
mp_status mp_json_get_f64(mp_ctx *ctx, const cJSON *obj, const char *origin, const char *key,
                          int required, double *out);
mp_status mp_json_get_bool(mp_ctx *ctx, const cJSON *obj, const char *origin, const char *key,
                           int required, int *out);
/* Copies at most cap-1 bytes; a longer string is an error. */
mp_status mp_json_get_str(mp_ctx *ctx, const cJSON *obj, const char *origin, const char *key,
                          int required, char *out, size_t cap);


#ifdef __cplusplus
}
#endif
#endif
