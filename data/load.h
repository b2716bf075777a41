/* Loading a data file by name or by path: the one rule behind --model, --gpu, --cluster and
 * --stack (exec/model.c, sim/cluster.c, sim/stack.c).
 *
 * A path is anything that contains '/' or ends in ".json": it is read as a regular file of
 * at most MP_FILE_MAX_CONFIG_BYTES (common/file.h), and its messages name it by the path.
 * Anything else is a name, looked up among the files embedded in the binary
 * (data/embedded.h: a file's stem, matched ignoring case and the separators - _ . and
 * space), then among the kind's aliases; its messages name it "<stem>.json". An unknown
 * name is MP_ERR_NOT_FOUND with one line listing the kind's names:
 *
 *   unknown <noun> '<name>'; <known>: <names><hint> (or give a path to a .json file) */
#ifndef MP_DATA_LOAD_H
#define MP_DATA_LOAD_H

#include <stddef.h>

#include "common/status.h"
#include "data/embedded.h"

#ifdef __cplusplus
extern "C" {
#endif

/* A kind of data file and the words of its refusal. */
typedef struct mp_data_kind {
  const char *kind;  /* the folder under data/: "models", "gpus", "clusters", "stacks" */
  const char *noun;  /* "model", "GPU", "cluster", "stack profile" */
  const char *known; /* what the list of names is called: "known models", "known" */
  const char *hint;  /* said after the list ("" for nothing) */
  const char *const (*aliases)[2]; /* {other name, stem} pairs, tried when no stem matches */
  size_t n_aliases;
} mp_data_kind;

/* Turns a file's text into out; origin names the file in messages. */
typedef mp_status (*mp_data_parse_fn)(mp_ctx *ctx, const char *text, const char *origin, void *out);

/* Finds name_or_path as above and parses its text with parse into out. *entry (when entry
 * is not NULL) is the embedded file read, or NULL for a path. Any failure of the read or of
 * parse is returned with its message. */
mp_status mp_data_load(mp_ctx *ctx, const mp_data_kind *kind, const char *name_or_path,
                       mp_data_parse_fn parse, void *out, const mp_data_entry **entry);

#ifdef __cplusplus
}
#endif
#endif
