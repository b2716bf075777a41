/* The backend table behind comm.h: what a collectives implementation provides.
 *
 * For implementers only (comm_mpi.c, comm_single.c, and the NCCL backend of the GPU issue);
 * the runtime includes comm.h. The front end (comm.c) has already checked every argument
 * a backend receives: the group kind is valid, buffers are non-NULL where count > 0,
 * counts and displacements are >= 0, the op/dtype pair is supported, peers are in range.
 * A backend checks only its own limits (MPI's int counts) and reports its library's errors.
 *
 * Plan for NCCL (GPU issue, same table): create bootstraps one ncclUniqueId over MPI
 * (MPI_Bcast on the world from rank 0), ncclCommInitRank for the world, ncclCommSplit per
 * group kind with the same color (mp_mesh_group_id) and key (mp_mesh_group_index) as MPI;
 * collectives are enqueued on the comm's own streams ordered against compute with CUDA
 * events; `synchronize` waits for them. NCCL 2.28 refuses two ranks of one communicator
 * on one GPU, so a multi-rank run on a single GPU uses the "mpi" backend with device
 * buffers staged through host memory (a wrapper backend that copies in, calls the MPI
 * table, copies out). */
#ifndef MP_EXEC_COMM_COMM_BACKEND_H
#define MP_EXEC_COMM_COMM_BACKEND_H

#include "exec/comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_comm_backend {
  const char *name;
  mp_status (*all_reduce)(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send, void *recv,
                          size_t count, mp_comm_dtype t, mp_comm_op op);
  mp_status (*all_gather)(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send, void *recv,
                          size_t count, mp_comm_dtype t);
  mp_status (*reduce_scatter)(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                              void *recv, size_t recv_count, mp_comm_dtype t, mp_comm_op op);
  mp_status (*all_to_all_v)(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                            const int64_t *send_counts, const int64_t *send_displs, void *recv,
                            const int64_t *recv_counts, const int64_t *recv_displs,
                            mp_comm_dtype t);
  mp_status (*broadcast)(mp_ctx *ctx, mp_comm *c, mp_group g, void *buf, size_t count,
                         mp_comm_dtype t, int root);
  mp_status (*send)(mp_ctx *ctx, mp_comm *c, const void *buf, size_t count, mp_comm_dtype t,
                    int peer);
  mp_status (*recv)(mp_ctx *ctx, mp_comm *c, void *buf, size_t count, mp_comm_dtype t,
                    int peer);
  mp_status (*sendrecv)(mp_ctx *ctx, mp_comm *c, const void *send, size_t send_count, int dst,
                        void *recv, size_t recv_count, int src, mp_comm_dtype t);
  mp_status (*barrier)(mp_ctx *ctx, mp_comm *c, mp_group g);
  mp_status (*synchronize)(mp_ctx *ctx, mp_comm *c);
  /* Frees impl (not the mp_comm itself). */
  void (*destroy)(mp_comm *c);
} mp_comm_backend;

/* The state every backend shares; impl is the backend's own. */
struct mp_comm {
  const mp_comm_backend *backend;
  mp_mesh mesh;
  int world_rank, world_size;
  int local_rank, local_size;
  int group_size[MP_GROUP_COUNT];
  int group_index[MP_GROUP_COUNT];
  void *impl;
};

/* Fills the shared fields from the mesh for world rank `rank` (backend and impl left NULL). */
void mp_comm_init_common(mp_comm *c, const mp_mesh *mesh, int rank);

#ifdef __cplusplus
}
#endif
#endif
