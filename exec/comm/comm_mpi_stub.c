/* The MPI entry points of comm.h and comm_backend.h for builds without MPI.
 *
 * exec/comm/BUILD compiles this file instead of comm_mpi.c when @local_mpi found no MPI
 * (no mpicc on the PATH when the build ran, or MESHPLAN_NO_MPI=1): the "single" and
 * "single-staged" backends and the NCCL backend at world size 1 need none of it, and every
 * caller links in every build. Each entry returns MP_ERR_UNSUPPORTED with one message
 * that says what to install, except mp_comm_mpi_finalize and mp_comm_mpi_abort (nothing
 * was started, so there is nothing to finalize or end). */
#include <stddef.h>

#include "exec/comm/comm_backend.h"

static mp_status no_mpi(mp_ctx *ctx, const char *what) {
  return mp_error(ctx, MP_ERR_UNSUPPORTED,
                  "%s needs MPI, but meshplan was built without MPI (mpicc was not found, or "
                  "MESHPLAN_NO_MPI=1, when it was built); install libopenmpi-dev and "
                  "openmpi-bin and rebuild, or run one rank without a launcher",
                  what);
}

int mp_comm_mpi_built(void) { return 0; }

mp_status mp_comm_mpi_init(mp_ctx *ctx, int *argc, char ***argv) {
  (void)argc, (void)argv;
  return no_mpi(ctx, "starting MPI");
}

mp_status mp_comm_mpi_finalize(mp_ctx *ctx) {
  (void)ctx;
  return MP_OK;
}

void mp_comm_mpi_abort(int code, double grace_s) { (void)code, (void)grace_s; }

mp_status mp_comm_mpi_world(mp_ctx *ctx, int *rank, int *size) {
  (void)rank, (void)size;
  return no_mpi(ctx, "asking for the MPI world");
}

mp_status mp_comm_create_mpi(mp_ctx *ctx, const mp_mesh *mesh, mp_comm **out) {
  (void)mesh;
  *out = NULL;
  return no_mpi(ctx, "the \"mpi\" communicator");
}

mp_status mp_comm_mpi_agree_on_mesh(mp_ctx *ctx, const mp_mesh *mesh, int world) {
  (void)mesh, (void)world;
  return no_mpi(ctx, "agreeing on the mesh across ranks");
}

mp_status mp_comm_mpi_node(mp_ctx *ctx, int *local_rank, int *local_size) {
  (void)local_rank, (void)local_size;
  return no_mpi(ctx, "finding the ranks of this node");
}

mp_status mp_comm_mpi_node_allgather(mp_ctx *ctx, const void *mine, size_t bytes, void **all,
                                     int *local_rank, int *local_size) {
  (void)mine, (void)bytes, (void)local_rank, (void)local_size;
  if (all) *all = NULL;
  return no_mpi(ctx, "gathering from the ranks of this node");
}

mp_status mp_comm_mpi_world_max(mp_ctx *ctx, const int *in, int *out, int n) {
  (void)in, (void)out, (void)n;
  return no_mpi(ctx, "a maximum over the ranks");
}

mp_status mp_comm_mpi_world_bcast(mp_ctx *ctx, void *buf, size_t bytes, int root) {
  (void)buf, (void)bytes, (void)root;
  return no_mpi(ctx, "a broadcast over the ranks");
}
