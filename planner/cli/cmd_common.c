/* Shared plumbing of the subcommands (commands.h): the prologue that parses, prints help
 * and usage errors, the readers of shared options, failure output. */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "planner/cli/commands.h"

int mp_command_main(const mp_command *cmd, int argc, char **argv) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_cmd_call call;
  memset(&call, 0, sizeof call);
  call.argc = argc;
  call.argv = argv;
  int help = 0;
  if (cmd->spec->max_positional > MP_CMD_MAX_POSITIONAL) {
    fprintf(stderr, "meshplan %s: internal error: %d positional arguments, at most %d\n", cmd->spec->name,
            cmd->spec->max_positional, MP_CMD_MAX_POSITIONAL);
    return 1;
  }
  if (mp_args_parse(&ctx, cmd->spec, argc, argv, call.pos, &call.n_pos, &help) != MP_OK) {
    fprintf(stderr, "%s\n", mp_errmsg(&ctx));
    return 2;
  }
  if (help) {
    mp_args_print_help(cmd->spec, stdout);
    return 0;
  }
  return cmd->run(&ctx, &call);
}

mp_status mp_cmd_plan_options(mp_ctx *ctx, const mp_cmd_spec *spec, mp_plan_options *o) {
  const char *ac = mp_args_get(spec, "--ac");
  if (ac) MP_CHECK(mp_ac_parse(ctx, ac, &o->ac, &o->ac_every));
  if (mp_args_has(spec, "--fp8")) o->fp8 = 1;
  if (mp_args_has(spec, "--sp") && mp_args_has(spec, "--no-sp"))
    return mp_error(ctx, MP_ERR_USAGE, "meshplan %s: --sp and --no-sp contradict each other; give one",
                    spec->name);
  if (mp_args_has(spec, "--sp")) o->sp = 1;
  if (mp_args_has(spec, "--no-sp")) o->sp = 0;
  long long v = 0;
  MP_CHECK(mp_args_int(ctx, spec, "--seq", 1, &v));
  if (v > 0) o->seq = v;
  v = 0;
  MP_CHECK(mp_args_int(ctx, spec, "--micro-batch", 1, &v));
  if (v > 0) o->micro_batch = v;
  v = 0;
  MP_CHECK(mp_args_int(ctx, spec, "--global-batch", 1, &v));
  if (v > 0) o->global_batch = v;
  return MP_OK;
}

int mp_cmd_print_json(cJSON *root) {
  char *text = root ? cJSON_Print(root) : NULL;
  cJSON_Delete(root);
  if (text == NULL) return 1;
  printf("%s\n", text);
  free(text);
  return 0;
}

const char *mp_cmd_db_path(const mp_cmd_spec *spec) {
  const char *db = mp_args_get(spec, "--db");
  return db ? db : "meshplan.db";
}

int mp_cmd_fail(const mp_ctx *ctx, mp_status st) {
  const char *msg = mp_errmsg(ctx);
  /* Usage errors from the argument parser already name "meshplan <command>". */
  if (strncmp(msg, "meshplan ", 9) == 0) fprintf(stderr, "%s\n", msg);
  else fprintf(stderr, "meshplan: %s\n", msg);
  return mp_status_exit_code(st);
}

int mp_cmd_db_exit_code(mp_status st) {
  return st == MP_ERR_DB || st == MP_ERR_UNSUPPORTED ? 2 : mp_status_exit_code(st);
}

int mp_cmd_fail_named(const mp_ctx *ctx, mp_status st, const char *name) {
  fprintf(stderr, "meshplan %s: %s\n", name, mp_errmsg(ctx));
  return mp_cmd_db_exit_code(st);
}

static const char *launch_env(const char *ompi, const char *pmi) {
  const char *v = getenv(ompi);
  return v && *v ? v : getenv(pmi);
}

void mp_cmd_launch(mp_launch *out) {
  const char *size = launch_env("OMPI_COMM_WORLD_SIZE", "PMI_SIZE");
  const char *rank = launch_env("OMPI_COMM_WORLD_RANK", "PMI_RANK");
  out->under_mpi = size != NULL;
  out->world = size && *size ? atoi(size) : 1;
  out->rank = rank && *rank ? atoi(rank) : 0;
}

mp_status mp_cmd_mesh_ep(mp_ctx *ctx, const mp_cmd_spec *spec, mp_mesh *mesh) {
  long long ep = 0;
  MP_CHECK(mp_args_int(ctx, spec, "--ep", 1, &ep));
  if (ep == 0) return MP_OK;
  if (mesh->ep > 1 && mesh->ep != ep)
    return mp_error(ctx, MP_ERR_USAGE, "--ep %lld contradicts ep=%d in --mesh; give it once", ep, mesh->ep);
  mesh->ep = (int)ep;
  return mp_mesh_validate(ctx, mesh);
}
