/* A reader of the TOML subset torchtitan's job configs use (TOML 1.0, toml.io): comments,
 * [tables] and [dotted.tables], bare, quoted and dotted keys, basic and literal strings,
 * integers (with _ separators), floats, booleans, and arrays of those (over several lines,
 * a trailing comma allowed). Everything else TOML has (arrays of tables, inline tables,
 * multi-line strings, dates, nested arrays) is refused with the line it is on, never
 * skipped: a key the reader cannot read is a key meshplan cannot map. A key given twice
 * is refused, as TOML says.
 *
 * The result is flat: one entry per key, named by its full dotted path
 * ("quantize.linear.float8.recipe_name"), in file order. */
#ifndef MP_APP_TOML_H
#define MP_APP_TOML_H

#include <stdint.h>

#include "common/status.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MP_TOML_KEY_MAX 160
#define MP_TOML_STR_MAX 512
#define MP_TOML_ITEMS_MAX 16

typedef enum mp_toml_type {
  MP_TOML_STRING = 0,
  MP_TOML_INT,
  MP_TOML_FLOAT,
  MP_TOML_BOOL,
  MP_TOML_ARRAY
} mp_toml_type;

typedef struct mp_toml_kv {
  char key[MP_TOML_KEY_MAX]; /* the full dotted path */
  mp_toml_type type;
  char str[MP_TOML_STR_MAX]; /* STRING: the value; the others: the value as written */
  int64_t i;                 /* INT; BOOL: 0 or 1 */
  double f;                  /* FLOAT, and INT as a double */
  int n_items;               /* ARRAY: its items, as strings (numbers as written) */
  char items[MP_TOML_ITEMS_MAX][MP_TOML_KEY_MAX];
  int line;                  /* where the key is, from 1 */
} mp_toml_kv;

typedef struct mp_toml {
  mp_toml_kv *kv;
  int n, cap;
} mp_toml;

/* Parses text (origin names it in messages) into *out, which the caller frees with
 * mp_toml_free also on failure. Bad input: MP_ERR_INVALID "ORIGIN:LINE: what". */
mp_status mp_toml_parse(mp_ctx *ctx, const char *text, const char *origin, mp_toml *out);
void mp_toml_free(mp_toml *t);
/* The entry of a full dotted key, or NULL. */
const mp_toml_kv *mp_toml_get(const mp_toml *t, const char *key);

#ifdef __cplusplus
}
#endif
#endif
