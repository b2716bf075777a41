/* The TOML subset reader (app/toml.h): one pass over the text with a cursor; each key's
 * value parsed where it stands. */
#include "app/toml.h"

#include <errno.h>
#include <stdarg.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct cursor {
  const char *p;
  int line;
  const char *origin;
} cursor;

#define BAD(ctx, c, ...) bad((ctx), (c), __VA_ARGS__)

#if defined(__GNUC__)
__attribute__((format(printf, 3, 4)))
#endif
static mp_status bad(mp_ctx *ctx, const cursor *c, const char *fmt, ...) {
  char msg[512];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof msg, fmt, ap);
  va_end(ap);
  return mp_error(ctx, MP_ERR_INVALID, "%s:%d: %s", c->origin, c->line, msg);
}

/* Spaces and tabs; with lines, newlines and comments as well. */
static void skip(cursor *c, int lines) {
  for (;;) {
    if (*c->p == ' ' || *c->p == '\t' || *c->p == '\r') c->p++;
    else if (*c->p == '#') while (*c->p && *c->p != '\n') c->p++;
    else if (lines && *c->p == '\n') c->p++, c->line++;
    else return;
  }
}

static int is_bare(char ch) {
  return (ch >= 'A' && ch <= 'Z') || (ch >= 'a' && ch <= 'z') || (ch >= '0' && ch <= '9') || ch == '_' || ch == '-';
}

/* A basic ("...") or literal ('...') string on one line into out. */
static mp_status string(mp_ctx *ctx, cursor *c, char *out, size_t cap) {
  const char q = *c->p++;
  if (c->p[0] == q && c->p[1] == q) return BAD(ctx, c, "multi-line strings are not read");
  size_t n = 0;
  for (; *c->p != q; c->p++) {
    char ch = *c->p;
    if (ch == '\0' || ch == '\n') return BAD(ctx, c, "unterminated string");
    if (q == '"' && ch == '\\') {
      const char e = *++c->p;
      ch = e == 'n' ? '\n' : e == 't' ? '\t' : e == '"' ? '"' : e == '\\' ? '\\' : 0;
      if (ch == 0) return BAD(ctx, c, "string escape \\%c is not read", e ? e : ' ');
    }
    if (n + 1 >= cap) return BAD(ctx, c, "string longer than %zu bytes", cap - 1);
    out[n++] = ch;
  }
  c->p++;
  out[n] = '\0';
  return MP_OK;
}

/* A dotted key (bare or quoted parts) into out, joined by '.' onto prefix. */
static mp_status key(mp_ctx *ctx, cursor *c, const char *prefix, char *out) {
  size_t n = (size_t)snprintf(out, MP_TOML_KEY_MAX, "%s", prefix);
  for (;;) {
    char part[MP_TOML_KEY_MAX];
    size_t k = 0;
    skip(c, 0);
    if (*c->p == '"' || *c->p == '\'') MP_CHECK(string(ctx, c, part, sizeof part));
    else {
      while (is_bare(*c->p) && k + 1 < sizeof part) part[k++] = *c->p++;
      part[k] = '\0';
      if (k == 0) return BAD(ctx, c, "expected a key");
    }
    const int w = snprintf(out + n, MP_TOML_KEY_MAX - n, "%s%s", n ? "." : "", part);
    if (w < 0 || n + (size_t)w >= MP_TOML_KEY_MAX) return BAD(ctx, c, "key longer than %d bytes", MP_TOML_KEY_MAX - 1);
    n += (size_t)w;
    skip(c, 0);
    if (*c->p != '.') return MP_OK;
    c->p++;
  }
}

/* An integer, float or boolean as written up to the next delimiter, into kv. */
static mp_status scalar(mp_ctx *ctx, cursor *c, mp_toml_kv *kv) {
  char word[64];
  size_t n = 0;
  while (*c->p && !strchr(" \t\r\n#,]", *c->p)) {
    if (n + 1 >= sizeof word) return BAD(ctx, c, "value too long");
    if (*c->p != '_') word[n++] = *c->p;
    c->p++;
  }
  word[n] = '\0';
  snprintf(kv->str, sizeof kv->str, "%s", word);
  if (strcmp(word, "true") == 0 || strcmp(word, "false") == 0) {
    kv->type = MP_TOML_BOOL;
    kv->i = word[0] == 't';
    return MP_OK;
  }
  char *end = NULL;
  errno = 0;
  const long long i = strtoll(word, &end, 10);
  if (n && *end == '\0' && errno == 0) {
    kv->type = MP_TOML_INT;
    kv->i = i;
    kv->f = (double)i;
    return MP_OK;
  }
  const double f = strtod(word, &end);
  if (n && *end == '\0' && isfinite(f) && strpbrk(word, "0123456789")) {
    kv->type = MP_TOML_FLOAT;
    kv->f = f;
    return MP_OK;
  }
  return BAD(ctx, c, "value '%s' is not a string, number, boolean or array (dates, inf and nan are not read)", word);
}

/* An array of strings, numbers or booleans, over any lines. */
static mp_status array(mp_ctx *ctx, cursor *c, mp_toml_kv *kv) {
  c->p++;
  kv->type = MP_TOML_ARRAY;
  kv->n_items = 0;
  for (;;) {
    skip(c, 1);
    if (*c->p == ']') break;
    if (*c->p == '[' || *c->p == '{') return BAD(ctx, c, "%s: nested arrays and inline tables are not read", kv->key);
    if (kv->n_items >= MP_TOML_ITEMS_MAX) return BAD(ctx, c, "%s: more than %d items", kv->key, MP_TOML_ITEMS_MAX);
    char *item = kv->items[kv->n_items++];
    if (*c->p == '"' || *c->p == '\'') {
      MP_CHECK(string(ctx, c, item, MP_TOML_KEY_MAX));
    } else {
      mp_toml_kv tmp;
      MP_CHECK(scalar(ctx, c, &tmp));
      snprintf(item, MP_TOML_KEY_MAX, "%s", tmp.str);
    }
    skip(c, 1);
    if (*c->p == ',') c->p++;
    else if (*c->p != ']') return BAD(ctx, c, "%s: expected ',' or ']' in an array", kv->key);
  }
  c->p++;
  return MP_OK;
}

static mp_status value(mp_ctx *ctx, cursor *c, mp_toml_kv *kv) {
  if (*c->p == '"' || *c->p == '\'') {
    kv->type = MP_TOML_STRING;
    return string(ctx, c, kv->str, sizeof kv->str);
  }
  if (*c->p == '[') return array(ctx, c, kv);
  if (*c->p == '{') return BAD(ctx, c, "%s: inline tables are not read", kv->key);
  return scalar(ctx, c, kv);
}

/* key = value, after the table's prefix; appended to t (a repeated key refused). */
static mp_status pair(mp_ctx *ctx, cursor *c, const char *prefix, mp_toml *t) {
  if (t->n == t->cap) {
    const int cap = t->cap ? 2 * t->cap : 64;
    mp_toml_kv *kv = realloc(t->kv, (size_t)cap * sizeof *kv);
    if (kv == NULL) return mp_error(ctx, MP_ERR_NOMEM, "out of memory reading %s", c->origin);
    t->kv = kv;
    t->cap = cap;
  }
  mp_toml_kv *kv = &t->kv[t->n];
  memset(kv, 0, sizeof *kv);
  kv->line = c->line;
  MP_CHECK(key(ctx, c, prefix, kv->key));
  if (*c->p != '=') return BAD(ctx, c, "%s: expected '=' after the key", kv->key);
  c->p++;
  skip(c, 0);
  MP_CHECK(value(ctx, c, kv));
  skip(c, 0);
  if (*c->p && *c->p != '\n') return BAD(ctx, c, "%s: unexpected text after the value", kv->key);
  if (mp_toml_get(t, kv->key)) return BAD(ctx, c, "%s is given twice", kv->key);
  t->n++;
  return MP_OK;
}

mp_status mp_toml_parse(mp_ctx *ctx, const char *text, const char *origin, mp_toml *out) {
  memset(out, 0, sizeof *out);
  cursor c = {text, 1, origin};
  char prefix[MP_TOML_KEY_MAX] = "";
  for (;;) {
    skip(&c, 1);
    if (*c.p == '\0') return MP_OK;
    if (*c.p != '[') {
      MP_CHECK(pair(ctx, &c, prefix, out));
      continue;
    }
    if (c.p[1] == '[') return BAD(ctx, &c, "arrays of tables ([[...]]) are not read");
    c.p++;
    MP_CHECK(key(ctx, &c, "", prefix));
    if (*c.p != ']') return BAD(ctx, &c, "expected ']' after the table's name");
    c.p++;
    skip(&c, 0);
    if (*c.p && *c.p != '\n') return BAD(ctx, &c, "unexpected text after [%s]", prefix);
  }
}

void mp_toml_free(mp_toml *t) {
  if (t == NULL) return;
  free(t->kv);
  t->kv = NULL;
  t->n = t->cap = 0;
}

const mp_toml_kv *mp_toml_get(const mp_toml *t, const char *k) {
  for (int i = 0; i < t->n; i++)
    if (strcmp(t->kv[i].key, k) == 0) return &t->kv[i];
  return NULL;
}
