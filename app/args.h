/* Table-driven command-line parsing for the meshplan subcommands.
 *
 * Each subcommand declares its options; the parser fills the values, rejects unknown
 * flags and missing values with one line naming the flag and what it takes, and prints
 * --help from the same table, so the help shown and the flags accepted never differ. */
#ifndef MP_APP_ARGS_H
#define MP_APP_ARGS_H

#include <stdio.h>

#include "common/status.h"
#include "common/validate.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_opt {
  const char *name;   /* "--model" */
  const char *metavar; /* "M": takes a value; NULL: a switch; "[a|b]": a switch that may
                          take one of the words a, b as its value (the next argument when
                          it is one of them, or =word); given bare, its value is "1";
                          "'ARGS'" (in quotes): a value that is a command line of its own,
                          the next argument even when it opens with "--" */
  const char *help;
  /* filled by the parser */
  const char *value; /* the value, or "1" for a given switch, NULL when absent */
} mp_opt;

typedef struct mp_cmd_spec {
  const char *name;    /* "plan" */
  const char *summary; /* one line */
  const char *usage;   /* after "meshplan plan " */
  mp_opt *opts;        /* terminated by {NULL} */
  int max_positional;
} mp_cmd_spec;

/* Parses argv (after the subcommand name). Positional arguments go to pos (up to
 * max_positional). Returns MP_ERR_USAGE with a one-line message on ctx for an unknown
 * flag, a missing value or too many positionals. Sets *help when --help/-h was given.
 * Messages carry no "meshplan <command>:" prefix: the command's failure path adds it, once. */
mp_status mp_args_parse(mp_ctx *ctx, mp_cmd_spec *spec, int argc, char **argv, const char **pos,
                        int *n_pos, int *help);
void mp_args_print_help(const mp_cmd_spec *spec, FILE *f);
const char *mp_args_get(const mp_cmd_spec *spec, const char *name);
int mp_args_has(const mp_cmd_spec *spec, const char *name);
/* Integer value of an option in min..max (the ranges of common/limits.h); absent: *out
 * unchanged. Not an integer, or outside the range: a usage error naming the flag, the value
 * and the range ("--seq '0': expected an integer in 1..16777216"). */
mp_status mp_args_int(mp_ctx *ctx, const mp_cmd_spec *spec, const char *name, long long min,
                      long long max, long long *out);
/* A finite number in the range (ends: which ends are excluded); nan and inf are refused. */
mp_status mp_args_double(mp_ctx *ctx, const mp_cmd_spec *spec, const char *name, double lo,
                         double hi, mp_range_ends ends, double *out);

#ifdef __cplusplus
}
#endif
#endif
