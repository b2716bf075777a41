/* meshplan simulate: not in this build yet; its issue replaces this file. It answers --help
 * and says plainly that it is missing, with a non-zero exit. */
#include <stdio.h>
#include <string.h>

#include "planner/commands.h"

int mp_cmd_simulate(int argc, char **argv) {
  for (int i = 0; i < argc; i++)
    if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
      printf("usage: meshplan simulate ...\n\nnot available in this build yet\n");
      return 0;
    }
  fprintf(stderr, "meshplan simulate: not available in this build yet\n");
  return 1;
}
