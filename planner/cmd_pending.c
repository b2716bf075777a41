/* Subcommands whose issues have not landed yet: they answer --help and say plainly that
 * this build does not have them, with a non-zero exit. Each moves to its own
 * cmd_<name>.c when it lands. */
#include <stdio.h>
#include <string.h>

#include "planner/commands.h"

static int pending(const char *name, int argc, char **argv) {
  for (int i = 0; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf("usage: meshplan %s ...\n\nnot available in this build yet\n", name);
      return 0;
    }
  fprintf(stderr, "meshplan %s: not available in this build yet\n", name);
  return 1;
}

int mp_cmd_simulate(int argc, char **argv) { return pending("simulate", argc, argv); }
int mp_cmd_explain(int argc, char **argv) { return pending("explain", argc, argv); }
int mp_cmd_train(int argc, char **argv) { return pending("train", argc, argv); }
int mp_cmd_calibrate(int argc, char **argv) { return pending("calibrate", argc, argv); }
int mp_cmd_report(int argc, char **argv) { return pending("report", argc, argv); }
int mp_cmd_validate(int argc, char **argv) { return pending("validate", argc, argv); }
