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

/* ---- keys given twice ---------------------------------------------------------------
 * cJSON keeps every member of an object and its lookups return the first; Python's json
 * (hence transformers, and the scripts that write these files) keeps the last.
 * A file with a key twice would be read one way here and the other way there, so it is
 * refused, naming the key whose second occurrence comes first in the text and its line. */

/* Up to this many members an object's keys are compared pairwise; beyond, sorted (a
 * safetensors header or an index's weight_map holds up to ~10^5). */
#define DUP_PAIRWISE_MAX 32

typedef struct member_key {
  const char *key;
  int index; /* in the object's order */
} member_key;

static const char *key_of(const cJSON *m) { return m->string ? m->string : ""; }

static int by_key_then_index(const void *a, const void *b) {
  const member_key *x = a, *y = b;
  const int c = strcmp(x->key, y->key);
  return c ? c : (x->index > y->index) - (x->index < y->index);
}

/* *out: the index of o's first member whose key an earlier member has, or -1. */
static mp_status repeated_member(mp_ctx *ctx, const cJSON *o, int *out) {
  *out = -1;
  const int n = cJSON_GetArraySize(o);
  if (n <= DUP_PAIRWISE_MAX) {
    int i = 0;
    for (const cJSON *a = o->child; a; a = a->next, i++)
      for (const cJSON *b = o->child; b != a; b = b->next)
        if (strcmp(key_of(a), key_of(b)) == 0) {
          *out = i;
          return MP_OK;
        }
    return MP_OK;
  }
  member_key *v = malloc((size_t)n * sizeof *v);
  if (v == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory checking a JSON object of %d keys", n);
  int i = 0;
  for (const cJSON *a = o->child; a && i < n; a = a->next, i++) v[i] = (member_key){key_of(a), i};
  qsort(v, (size_t)n, sizeof *v, by_key_then_index);
  for (i = 1; i < n; i++) /* within a run of one key, the second entry is its second occurrence */
    if (strcmp(v[i].key, v[i - 1].key) == 0 && (*out < 0 || v[i].index < *out)) *out = v[i].index;
  free(v);
  return MP_OK;
}

/* The repeat under v whose second occurrence comes first in the text, as the member and
 * element indices from the root down to it, in path[0..*depth) (*depth 0: none). A
 * member's subtree precedes the members after it, so an object's own repeat at index r
 * is reported only when its members before r hold none. */
static mp_status find_repeat(mp_ctx *ctx, const cJSON *v, int level, int *path, int *depth) {
  if ((!cJSON_IsObject(v) && !cJSON_IsArray(v)) || level >= CJSON_NESTING_LIMIT) return MP_OK;
  int rep = -1;
  if (cJSON_IsObject(v)) MP_CHECK(repeated_member(ctx, v, &rep));
  int i = 0;
  for (const cJSON *c = v->child; c && (rep < 0 || i < rep); c = c->next, i++) {
    path[level] = i;
    MP_CHECK(find_repeat(ctx, c, level + 1, path, depth));
    if (*depth) return MP_OK;
  }
  if (rep >= 0) {
    path[level] = rep;
    *depth = level + 1;
  }
  return MP_OK;
}

/* The text walked again to where a path points (cJSON keeps no positions). It is valid
 * JSON, cJSON having read it; every step stays within [p, end) all the same. */
typedef struct text_pos {
  const char *p, *end;
} text_pos;

static void step(text_pos *s) {
  if (s->p < s->end) s->p++;
}

static void skip_ws(text_pos *s) { /* cJSON's whitespace: every byte up to ' ' */
  while (s->p < s->end && (unsigned char)*s->p <= 32) s->p++;
}

static void skip_string(text_pos *s) {
  step(s);
  while (s->p < s->end && *s->p != '"') {
    if (*s->p == '\\') step(s);
    step(s);
  }
  step(s);
}

static void skip_value(text_pos *s) {
  if (s->p < s->end && *s->p == '"') {
    skip_string(s);
    return;
  }
  if (s->p < s->end && (*s->p == '{' || *s->p == '[')) {
    for (int depth = 0; s->p < s->end;) {
      const char c = *s->p;
      if (c == '"') {
        skip_string(s);
        continue;
      }
      step(s);
      if (c == '{' || c == '[') depth++;
      else if ((c == '}' || c == ']') && --depth == 0) return;
    }
    return;
  }
  while (s->p < s->end && (unsigned char)*s->p > 32 && !strchr(",}]", *s->p)) s->p++;
}

/* From a container's opening to its member or element i; *key: where a member's key starts. */
static void enter(text_pos *s, int i, const char **key) {
  const int object = s->p < s->end && *s->p == '{';
  step(s);
  for (int k = 0;; k++) {
    skip_ws(s);
    if (object) {
      *key = s->p;
      skip_string(s);
      skip_ws(s);
      step(s); /* ':' */
      skip_ws(s);
    }
    if (k == i) return;
    skip_value(s);
    skip_ws(s);
    step(s); /* ',' */
  }
}

static mp_status refuse_repeats(mp_ctx *ctx, const cJSON *root, const char *text, size_t len,
                                const char *origin) {
  int path[CJSON_NESTING_LIMIT]; /* the deepest path cJSON parses */
  int depth = 0;
  MP_CHECK(find_repeat(ctx, root, 0, path, &depth));
  if (depth == 0) return MP_OK;
  text_pos s = {text, text + len};
  if (len >= 3 && memcmp(text, "\xEF\xBB\xBF", 3) == 0) s.p += 3; /* cJSON skips a UTF-8 BOM */
  const char *key = text;
  const cJSON *v = root;
  for (int l = 0; l < depth; l++) {
    skip_ws(&s);
    enter(&s, path[l], &key);
    v = cJSON_GetArrayItem(v, path[l]);
  }
  int line = 0, col = 0;
  line_col(text, key, &line, &col);
  return mp_error(ctx, MP_ERR_INVALID, "%s: key \"%.80s\" appears twice (line %d); remove one", origin,
                  key_of(v), line);
}

/* root, read from text[0..len): an object at the top level, no key twice in one object. */
static mp_status accept_root(mp_ctx *ctx, cJSON *root, const char *text, size_t len, const char *origin,
                             cJSON **out) {
  mp_status st = MP_OK;
  if (!cJSON_IsObject(root))
    st = mp_error(ctx, MP_ERR_INVALID, "%s: expected a JSON object at the top level", origin);
  else
    st = refuse_repeats(ctx, root, text, len, origin);
  if (st != MP_OK) {
    cJSON_Delete(root);
    return st;
  }
  *out = root;
  return MP_OK;
}

static mp_status malformed(mp_ctx *ctx, const char *text, const char *at, const char *origin) {
  int line = 0, col = 0;
  if (at) line_col(text, at, &line, &col);
  return mp_error(ctx, MP_ERR_INVALID, "%s: malformed JSON at line %d, column %d; fix the file", origin, line,
                  col);
}

mp_status mp_json_parse(mp_ctx *ctx, const char *text, const char *origin, cJSON **out) {
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithOpts(text, &end, 1);
  if (root == NULL) return malformed(ctx, text, cJSON_GetErrorPtr(), origin);
  return accept_root(ctx, root, text, strlen(text), origin, out);
}

mp_status mp_json_parse_len(mp_ctx *ctx, const char *text, size_t len, const char *origin, cJSON **out) {
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &end, 0);
  if (root == NULL) return malformed(ctx, text, cJSON_GetErrorPtr(), origin);
  text_pos rest = {end, text + len};
  skip_ws(&rest);
  if (rest.p < rest.end) {
    cJSON_Delete(root);
    return malformed(ctx, text, rest.p, origin);
  }
  return accept_root(ctx, root, text, len, origin, out);
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
