/* meshplan: plans, predicts and runs parallel training of transformers.
 * The only place that decides the process's exit code. */
#include <stdio.h>
#include <string.h>

#include "planner/cli/commands.h"

typedef struct {
  const char *name;
  int (*fn)(int, char **);
  const char *summary;
} command;

static const command k_commands[] = {
    {"plan", mp_cmd_plan, "enumerate device meshes, predict each, rank them (default: llama3.1-8b on 8xH100)"},
    {"simulate", mp_cmd_simulate, "predict step time and memory of one plan"},
    {"explain", mp_cmd_explain, "show the sharding passes, parameter shapes and schedule of one plan"},
    {"train", mp_cmd_train, "train with a plan on CPUs (MPI) or GPUs (NCCL)"},
    {"calibrate", mp_cmd_calibrate, "measure GEMM rates and collective bandwidths for the simulator"},
    {"report", mp_cmd_report, "list planner runs and predicted vs measured figures from the database"},
    {"validate", mp_cmd_validate, "compare predictions with published measurements (CSV)"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: meshplan <command> [options]   (meshplan <command> --help for its options)\n\n"
             "commands:\n");
  for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
    fprintf(f, "  %-10s %s\n", k_commands[i].name, k_commands[i].summary);
  fprintf(f, "\n  --version  print the version\n");
}

int main(int argc, char **argv) {
  if (argc < 2) {
    usage(stderr);
    return 2;
  }
  if (strcmp(argv[1], "--help") == 0 || strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "help") == 0) {
    usage(stdout);
    return 0;
  }
  if (strcmp(argv[1], "--version") == 0) {
    printf("meshplan %s\n", MESHPLAN_VERSION);
    return 0;
  }
  for (size_t i = 0; i < sizeof k_commands / sizeof k_commands[0]; i++)
    if (strcmp(argv[1], k_commands[i].name) == 0) return k_commands[i].fn(argc - 2, argv + 2);
  fprintf(stderr, "meshplan: unknown command '%s'; commands: plan, simulate, explain, train, "
                  "calibrate, report, validate\n", argv[1]);
  return 2;
}
