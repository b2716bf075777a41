/* The meshplan subcommands. Each takes the arguments after its name and returns the
 * process exit code (0 ok, 2 usage or input error, 1 other failure); only these and
 * main() print errors to the user. One file per subcommand: planner/cmd_<name>.c. */
#ifndef MP_PLANNER_CLI_COMMANDS_H
#define MP_PLANNER_CLI_COMMANDS_H

#include "common/status.h"
#include "exec/mesh.h"
#include "exec/plan.h"
#include "planner/cli/args.h"

#ifdef __cplusplus
extern "C" {
#endif

#define MESHPLAN_VERSION "0.1.0"

int mp_cmd_plan(int argc, char **argv);
int mp_cmd_simulate(int argc, char **argv);
int mp_cmd_explain(int argc, char **argv);
int mp_cmd_train(int argc, char **argv);
int mp_cmd_calibrate(int argc, char **argv);
int mp_cmd_report(int argc, char **argv);
int mp_cmd_validate(int argc, char **argv);

/* Parses argv against spec; on --help prints help and returns 0 through *done=1; on a
 * usage error prints the one-line message and returns 2 through *done=1. */
int mp_cmd_parse(mp_cmd_spec *spec, int argc, char **argv, const char **pos, int *n_pos,
                 int *done);
/* Reads the plan options shared by explain, simulate and train into *o, changing only
 * what was given: --ac MODE, --fp8, --seq S, --micro-batch B, --global-batch G. The
 * caller sets its defaults first (mp_plan_options_init, or its own). */
mp_status mp_cmd_plan_options(mp_ctx *ctx, const mp_cmd_spec *spec, mp_plan_options *o);
/* --ep N (explain, train): expert parallelism of degree N carved out of dp_shard, the same
 * as ep=N in --mesh; merged into *mesh (a different ep there is a usage error) and the
 * mesh validated. Nothing when --ep was not given. */
mp_status mp_cmd_mesh_ep(mp_ctx *ctx, const mp_cmd_spec *spec, mp_mesh *mesh);
/* How this process was launched, read before MPI_Init from the launcher's environment
 * (OpenMPI's OMPI_COMM_WORLD_SIZE/RANK, else PMI_SIZE/RANK as Slurm and MPICH set them):
 * under_mpi 0 with world 1, rank 0 when it runs alone. */
typedef struct mp_launch {
  int under_mpi, world, rank;
} mp_launch;
void mp_cmd_launch(mp_launch *out);
/* Prints "meshplan: <message>" and returns the exit code of st. */
int mp_cmd_fail(const mp_ctx *ctx, mp_status st);

#ifdef __cplusplus
}
#endif
#endif
