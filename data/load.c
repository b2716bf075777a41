/* Loading a data file by name or by path (see load.h). */
#include "data/load.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/file.h"

static int is_path(const char *s) {
  size_t n = strlen(s);
  return strchr(s, '/') != NULL || (n > 5 && strcmp(s + n - 5, ".json") == 0);
}

/* The embedded file named name (a stem, else an alias of one), or NULL. */
static const mp_data_entry *lookup(const mp_data_kind *k, const char *name) {
  const mp_data_entry *e = mp_data_lookup(k->kind, name);
  for (size_t i = 0; e == NULL && i < k->n_aliases; i++)
    if (mp_data_name_alike(k->aliases[i][0], name)) e = mp_data_lookup(k->kind, k->aliases[i][1]);
  return e;
}

mp_status mp_data_load(mp_ctx *ctx, const mp_data_kind *kind, const char *name_or_path,
                       mp_data_parse_fn parse, void *out, const mp_data_entry **entry) {
  if (entry) *entry = NULL;
  if (is_path(name_or_path)) {
    char *text = NULL;
    MP_CHECK(mp_read_file_max(ctx, name_or_path, MP_FILE_MAX_CONFIG_BYTES, &text, NULL));
    mp_status st = parse(ctx, text, name_or_path, out);
    free(text);
    return st;
  }
  const mp_data_entry *e = lookup(kind, name_or_path);
  if (e == NULL) {
    char names[1024];
    mp_data_list_names(kind->kind, names, sizeof names);
    return mp_error(ctx, MP_ERR_NOT_FOUND, "unknown %s '%s'; %s: %s%s (or give a path to a .json file)",
                    kind->noun, name_or_path, kind->known, names, kind->hint);
  }
  if (entry) *entry = e;
  char origin[256];
  snprintf(origin, sizeof origin, "%s.json", e->name);
  return parse(ctx, e->text, origin, out);
}
