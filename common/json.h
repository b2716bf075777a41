/* JSON loading through cJSON, with errors that name the file, the key and what was
 * expected: "llama3.1-8b.json: key 'n_heads': expected an integer, got a string". */
#ifndef MP_COMMON_JSON_H
#define MP_COMMON_JSON_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "common/file.h" /* mp_read_file, mp_write_file_atomic */
#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The one way JSON input is read. Parses text (NUL-terminated) into an object; origin
 * names it in messages (a file name). *out is freed by cJSON_Delete. Refused, each as one
 * MP_ERR_INVALID line: malformed JSON (its line and column), anything but an object at
 * the top level, and a key given twice in one object, at any depth ("<origin>: key \"k\"
 * appears twice (line N); remove one", N the line of its second occurrence): cJSON's
 * lookups would take the first where Python's json and transformers take the last. */
mp_status mp_json_parse(mp_ctx *ctx, const char *text, const char *origin, cJSON **out);
/* The same for the len bytes at text, which need no NUL (a safetensors header within its
 * file): after the value only whitespace (bytes up to ' ') may follow. */
mp_status mp_json_parse_len(mp_ctx *ctx, const char *text, size_t len, const char *origin, cJSON **out);
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
/* v as a whole number in lo..hi (both within +-2^53, where a double holds every integer):
 * 1 and *out when it is one; 0 for anything else (not a number, fractional, infinite,
 * out of range), leaving the message to the caller, which knows what the value is. For
 * the numbers inside arrays and nested objects of the binary formats' headers. */
int mp_json_int_in(const cJSON *v, int64_t lo, int64_t hi, int64_t *out);
/* Copies at most cap-1 bytes; a longer string is an error. */
mp_status mp_json_get_str(mp_ctx *ctx, const cJSON *obj, const char *origin, const char *key,
                          int required, char *out, size_t cap);


#ifdef __cplusplus
}
#endif
#endif
