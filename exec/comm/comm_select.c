/* Backend selection for the CLI (mp_comm_create_for_device, see comm.h).
 *
 * Two steps, so the decision can be tested without MPI or a GPU: gather the facts (the
 * launcher's environment, whether NCCL is built in, which GPUs the ranks of each node use)
 * and choose from them (mp_comm_choose, a pure function). Every fact that decides between
 * backends is the same on every rank (the GPU sharing flag is agreed over MPI_COMM_WORLD),
 * so all ranks create the same backend and its collective creation cannot deadlock.
 *
 * NCCL 2.28 refuses two ranks of one communicator on one GPU ("Duplicate GPU detected"),
 * which a multi-rank run on a single-GPU machine needs: such runs, and builds without NCCL,
 * use MPI with the device buffers staged through host memory (comm_staged.c). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/comm/comm_backend.h"
#include "kernels/ops.h"

mp_status mp_comm_choose(mp_ctx *ctx, const mp_mesh *mesh, const mp_comm_facts *f,
                         mp_comm_kind *kind, char *notice, size_t notice_len) {
  if (notice && notice_len) notice[0] = '\0';
  const int world = mp_mesh_world(mesh);
  if (!f->launched && world != 1) {
    char m[128];
    mp_mesh_format(mesh, m, sizeof m);
    return mp_error(ctx, MP_ERR_INVALID,
                    "mesh %s has %d ranks but this process runs alone; launch it with mpirun "
                    "-np %d",
                    m, world, world);
  }
  if (!f->device_is_cuda) {
    *kind = f->launched ? MP_COMM_KIND_MPI : MP_COMM_KIND_SINGLE;
    return MP_OK;
  }
  const char *tail = f->launched ? "so collectives go through MPI with host staging"
                                 : "so collectives on device buffers are device-to-device "
                                   "copies (one rank needs no communication)";
  *kind = f->launched ? MP_COMM_KIND_MPI_STAGED : MP_COMM_KIND_SINGLE_STAGED;
  if (!f->nccl_built) {
    if (notice && notice_len)
      snprintf(notice, notice_len,
               "this build has no NCCL (nccl.h and libnccl were not found when it was built), "
               "%s",
               tail);
    return MP_OK;
  }
  if (f->no_nccl_env) {
    if (notice && notice_len) snprintf(notice, notice_len, "MESHPLAN_NO_NCCL=1, %s", tail);
    return MP_OK;
  }
  if (f->shared_anywhere) {
    char why[160];
    if (f->node_ranks > f->node_gpus)
      snprintf(why, sizeof why, "%d rank%s share%s %d GPU%s on this node", f->node_ranks,
               f->node_ranks == 1 ? "" : "s", f->node_ranks == 1 ? "s" : "", f->node_gpus,
               f->node_gpus == 1 ? "" : "s");
    else
      snprintf(why, sizeof why, "ranks of another node share a GPU (this node: %d rank%s on "
               "%d GPU%s)", f->node_ranks, f->node_ranks == 1 ? "" : "s", f->node_gpus,
               f->node_gpus == 1 ? "" : "s");
    if (notice && notice_len)
      snprintf(notice, notice_len,
               "%s; NCCL refuses two ranks of one communicator on one GPU, so collectives go "
               "through MPI with host staging",
               why);
    *kind = MP_COMM_KIND_MPI_STAGED;
    return MP_OK;
  }
  *kind = MP_COMM_KIND_NCCL;
  return MP_OK;
}

mp_status mp_comm_create_for_device(mp_ctx *ctx, const mp_mesh *mesh, int device_is_cuda,
                                    const mp_backend *be, mp_kctx *kc, void *cuda_stream,
                                    mp_comm **out, char *notice, size_t notice_len) {
  *out = NULL;
  if (notice && notice_len) notice[0] = '\0';
  if (mesh == NULL) return mp_error(ctx, MP_ERR_INVALID, "mp_comm_create_for_device: no mesh");
  MP_CHECK(mp_mesh_validate(ctx, mesh));
  if (device_is_cuda && (be == NULL || kc == NULL))
    return mp_error(ctx, MP_ERR_INVALID,
                    "mp_comm_create_for_device: device buffers need the kernel backend and its "
                    "initialized context");
  mp_comm_facts f;
  memset(&f, 0, sizeof f);
  f.device_is_cuda = device_is_cuda != 0;
  f.launched = mp_comm_env_launched();
  f.nccl_built = mp_comm_nccl_built();
  const char *no = getenv("MESHPLAN_NO_NCCL");
  f.no_nccl_env = no != NULL && strcmp(no, "1") == 0;
  f.node_ranks = f.node_gpus = 1;
  if (f.device_is_cuda && f.nccl_built && !f.no_nccl_env && f.launched) {
    /* Collective: every rank of a launched job takes this branch (same environment). */
    mp_comm_node_gpus ng;
    MP_CHECK(mp_comm_mpi_init(ctx, NULL, NULL));
    MP_CHECK(mp_comm_nccl_node_gpus(ctx, kc->device, &ng));
    f.node_ranks = ng.local_size;
    f.node_gpus = ng.node_gpus;
    f.shared_anywhere = ng.shared_anywhere;
  }
  mp_comm_kind kind = MP_COMM_KIND_SINGLE;
  MP_CHECK(mp_comm_choose(ctx, mesh, &f, &kind, notice, notice_len));
  switch (kind) {
    case MP_COMM_KIND_SINGLE: return mp_comm_create_single(ctx, mesh, out);
    case MP_COMM_KIND_MPI: return mp_comm_create_mpi(ctx, mesh, out);
    case MP_COMM_KIND_NCCL: return mp_comm_create_nccl(ctx, mesh, kc->device, cuda_stream, out);
    case MP_COMM_KIND_MPI_STAGED: return mp_comm_create_mpi_staged(ctx, mesh, be, kc, out);
    case MP_COMM_KIND_SINGLE_STAGED: return mp_comm_create_single_staged(ctx, mesh, be, kc, out);
  }
  return mp_error(ctx, MP_ERR_INTERNAL, "mp_comm_create_for_device: unknown backend kind %d",
                  (int)kind);
}
