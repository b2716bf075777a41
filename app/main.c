/* meshplan: plans, predicts and runs parallel training of transformers.
 * The only place that decides the process's exit code: it picks the subcommand and
 * returns what mp_command_main returns for it. */
#include <signal.h>
#include <stdio.h>
#include <string.h>

#include "app/commands.h"

/* In the order `meshplan --help` lists them. */
static const mp_command *const k_commands[] = {
    &mp_command_plan,      &mp_command_simulate, &mp_command_explain,  &mp_command_train,
    &mp_command_export,    &mp_command_calibrate, &mp_command_report,  &mp_command_validate,
};
enum { N_COMMANDS = sizeof k_commands / sizeof k_commands[0] };

static void usage(FILE *f) {
  fprintf(f, "usage: meshplan <command> [options]   (meshplan <command> --help for its options)\n\n"
             "commands:\n");
  for (int i = 0; i < N_COMMANDS; i++) fprintf(f, "  %-10s %s\n", k_commands[i]->spec->name, k_commands[i]->brief);
  fprintf(f, "\n  --version  print the version\n");
}

static void on_file_size_limit(int sig) { (void)sig; }

/* A write past the file size limit (ulimit -f) raises SIGXFSZ, whose default action kills
 * the process without a word. Caught, the write fails with EFBIG instead and the writer
 * reports it (common/file.h, mp_error_write). Caught rather than ignored: exec resets a
 * caught signal to its default but keeps an ignored one, and gnuplot (planner/plot.c's
 * child) with SIGXFSZ ignored truncates its PNG and exits 0; killed, its failure is
 * reported. */
static void catch_file_size_limit(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_file_size_limit;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGXFSZ, &sa, NULL);
}

int main(int argc, char **argv) {
  catch_file_size_limit();
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
  for (int i = 0; i < N_COMMANDS; i++)
    if (strcmp(argv[1], k_commands[i]->spec->name) == 0) return mp_command_main(k_commands[i], argc - 2, argv + 2);
  fprintf(stderr, "meshplan: unknown command '%s'; commands:", argv[1]);
  for (int i = 0; i < N_COMMANDS; i++) fprintf(stderr, "%s %s", i ? "," : "", k_commands[i]->spec->name);
  fprintf(stderr, "\n");
  return 2;
}
