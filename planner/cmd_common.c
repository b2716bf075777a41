/* Shared plumbing of the subcommands: parsing with help and usage errors, failure output. */
#include <stdio.h>
#include <string.h>

#include "planner/commands.h"

int mp_cmd_parse(mp_cmd_spec *spec, int argc, char **argv, const char **pos, int *n_pos,
                 int *done) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  int help = 0;
  *done = 0;
  mp_status st = mp_args_parse(&ctx, spec, argc, argv, pos, n_pos, &help);
  if (st != MP_OK) {
    *done = 1;
    fprintf(stderr, "%s\n", mp_errmsg(&ctx));
    return 2;
  }
  if (help) {
    *done = 1;
    mp_args_print_help(spec, stdout);
    return 0;
  }
  return 0;
}

int mp_cmd_fail(const mp_ctx *ctx, mp_status st) {
  const char *msg = mp_errmsg(ctx);
  /* Usage errors from the argument parser already name "meshplan <command>". */
  if (strncmp(msg, "meshplan ", 9) == 0) fprintf(stderr, "%s\n", msg);
  else fprintf(stderr, "meshplan: %s\n", msg);
  return mp_status_exit_code(st);
}
