/* Collectives over the groups of a device mesh: the one interface the runtime calls.
 *
 * An mp_comm is a process's handle on the job: its world rank, its node-local rank (GPU
 * selection) and one communicator per group kind of exec/mesh.h (mp_group: tp, dp_shard,
 * ep, efsdp, dp_replicate, dp, fsdp, cp, pp, world). Every collective names the group kind
 * it runs on; the group is the caller's own group of that kind.
 *
 * Backends (ggml style: a table of function pointers, exec/comm/comm_backend.h):
 *   "mpi"     OpenMPI; one MPI_Comm_split per group kind (comm_mpi.c). Host buffers.
 *   "single"  world size 1 with no MPI at all (comm_single.c): every group has one rank.
 *   "nccl"    (GPU issue) ncclCommSplit per group kind, device buffers, own streams.
 * This header does not change between them; the calls below validate their arguments
 * once (comm.c) and dispatch to the backend.
 *
 * Invariants a caller may rely on:
 *   - A rank's position in a group communicator is its mesh group index
 *     (mp_mesh_group_index), so chunk i of an all-gather or reduce-scatter belongs to the
 *     group's i-th rank in increasing world-rank order (mp_mesh_group_ranks).
 *   - The mesh's rank numbering is the MPI world numbering (checked at creation, which
 *     also checks that the mesh's world size equals the MPI world size on every rank).
 *   - An all-reduce leaves bitwise identical results on every rank of the group.
 *   - Collectives are blocking for "mpi" and "single": when a call returns, the output is
 *     complete. A backend that queues work (NCCL) completes it by mp_comm_synchronize, so
 *     portable callers synchronize before reading outputs on the host.
 *   - All ranks of a group must make the same calls in the same order with the same
 *     counts (as with MPI and NCCL). Argument errors that every rank detects identically
 *     (bad group, counts that do not add up) come back on every rank, so all exit together.
 *   - One thread uses an mp_comm (MPI is initialized with MPI_THREAD_FUNNELED).
 *
 * Errors: every call returns mp_status; MPI failures are MP_ERR_MPI with the call, its
 * file:line and MPI_Error_string on ctx (MPI_ERRORS_RETURN is set on every communicator
 * so MPI does not abort the process). */
#ifndef MP_EXEC_COMM_COMM_H
#define MP_EXEC_COMM_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "common/status.h"
#include "exec/mesh.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mp_comm mp_comm;

/* Element types that travel. BF16 is raw 16-bit storage (GPU staging); its reductions
 * convert to fp32, combine, and round to nearest even. INT64 is for all-to-all metadata
 * (token counts per expert) and for agreeing on integers across ranks. */
typedef enum mp_comm_dtype {
  MP_COMM_DTYPE_FP32 = 0,
  MP_COMM_DTYPE_INT64,
  MP_COMM_DTYPE_BF16,
  MP_COMM_DTYPE_COUNT
} mp_comm_dtype;

typedef enum mp_comm_op {
  MP_COMM_OP_SUM = 0,
  MP_COMM_OP_MAX, /* loss-parallel max of logits; agreeing on flags across ranks */
  MP_COMM_OP_COUNT
} mp_comm_op;

size_t mp_comm_dtype_bytes(mp_comm_dtype t); /* 0 for an unknown dtype */
const char *mp_comm_dtype_name(mp_comm_dtype t);
const char *mp_comm_op_name(mp_comm_op op);

/* ---- MPI lifetime (the CLI's main calls these around everything else) ----
 * mp_comm_mpi_init: MPI_Init_thread(FUNNELED) unless MPI is already initialized (then a
 * no-op); sets MPI_ERRORS_RETURN on MPI_COMM_WORLD. argc/argv may be NULL. Works without
 * mpirun (OpenMPI 4.1 singleton: world size 1; ~0.3 s on a 2-core box; it forks a helper
 * daemon that listens on 127.0.0.1, which works in Bazel's sandbox). Where even that is
 * unwanted (no MPI installed at run time, tools, unit tests), use mp_comm_create_single.
 * mp_comm_mpi_finalize: MPI_Finalize if initialized and not yet finalized. Destroy every
 * "mpi" mp_comm first. */
mp_status mp_comm_mpi_init(mp_ctx *ctx, int *argc, char ***argv);
mp_status mp_comm_mpi_finalize(mp_ctx *ctx);

/* The node-local rank from the launcher's environment (OMPI_COMM_WORLD_LOCAL_RANK,
 * MPI_LOCALRANKID, SLURM_LOCALID), usable before MPI_Init (to pick a GPU first); -1 when
 * none is set. mp_comm_local_rank is the authoritative value once a comm exists. */
int mp_comm_local_rank_from_env(void);

/* ---- creation ----
 * mp_comm_create_mpi: collective over MPI_COMM_WORLD (initializes MPI if needed). Every
 * rank first agrees with every other on the mesh (one all-reduce), then checks that the
 * mesh is valid and that its world equals the MPI world; a failure is MP_ERR_INVALID on
 * every rank with the same message ("mesh dp_shard=2,tp=2 has 4 ranks but mpirun started
 * 3; ..."), so all ranks exit together and none hangs. Then one MPI_Comm_split per group
 * kind: color = mp_mesh_group_id, key = mp_mesh_group_index.
 * mp_comm_create_single: no MPI calls at all; the mesh must have world size 1. For tools
 * and tests that must not depend on MPI start-up. */
mp_status mp_comm_create_mpi(mp_ctx *ctx, const mp_mesh *mesh, mp_comm **out);
mp_status mp_comm_create_single(mp_ctx *ctx, const mp_mesh *mesh, mp_comm **out);
/* Frees the communicators (not MPI itself). NULL is a no-op. Not collective for "single";
 * for "mpi" it calls MPI_Comm_free, which every rank of each group must call. */
void mp_comm_destroy(mp_comm *c);

/* ---- queries (no communication) ---- */
const char *mp_comm_backend_name(const mp_comm *c); /* "mpi", "single", ... */
const mp_mesh *mp_comm_mesh(const mp_comm *c);
int mp_comm_world_rank(const mp_comm *c);
int mp_comm_world_size(const mp_comm *c);
/* Rank among the processes on this node (MPI_Comm_split_type SHARED) and their count: the
 * GPU index for a rank is local_rank when there is one GPU per rank. */
int mp_comm_local_rank(const mp_comm *c);
int mp_comm_local_size(const mp_comm *c);
/* Equal to mp_mesh_group_size / mp_mesh_group_index for this rank. */
int mp_comm_group_size(const mp_comm *c, mp_group g);
int mp_comm_group_index(const mp_comm *c, mp_group g);

/* ---- collectives on the caller's group of kind g ----
 * Counts are in elements. Buffers are host memory for "mpi"/"single" and device memory
 * for "nccl". Unless stated, send and recv must not overlap. */

/* recv[i] = op over the group of send[i], i < count. send == recv is in place. */
mp_status mp_comm_all_reduce(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send, void *recv,
                             size_t count, mp_comm_dtype t, mp_comm_op op);
/* recv (count * group_size) = concatenation of every rank's send (count) in group-index
 * order. send == recv + index * count is in place. */
mp_status mp_comm_all_gather(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send, void *recv,
                             size_t count, mp_comm_dtype t);
/* send holds group_size chunks of recv_count; recv = op over the group of chunk
 * group_index. (FSDP gradient reduce-scatter: op SUM.) */
mp_status mp_comm_reduce_scatter(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                 void *recv, size_t recv_count, mp_comm_dtype t, mp_comm_op op);
/* Variable all-to-all (MoE dispatch and combine). Arrays have group_size entries, in
 * elements: this rank sends send_counts[j] elements from send + send_displs[j] to group
 * index j, and receives recv_counts[j] elements from j at recv + recv_displs[j].
 * send_counts[j] on rank i must equal recv_counts[i] on rank j (exchange the counts first
 * with an equal all-to-all of INT64: every count 1). All entries >= 0. */
mp_status mp_comm_all_to_all_v(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                               const int64_t *send_counts, const int64_t *send_displs,
                               void *recv, const int64_t *recv_counts,
                               const int64_t *recv_displs, mp_comm_dtype t);
/* buf (count) on every rank of the group = buf on the rank with group index root. */
mp_status mp_comm_broadcast(mp_ctx *ctx, mp_comm *c, mp_group g, void *buf, size_t count,
                            mp_comm_dtype t, int root);
/* Point-to-point by world rank (pipeline stages: the peer comes from mp_mesh_rank_of).
 * Blocking; messages between one pair are matched in the order sent (no tags, as NCCL).
 * The peer must be another rank: two ranks that send to each other at once must use
 * mp_comm_sendrecv, which cannot deadlock (dst and src may be the caller itself). */
mp_status mp_comm_send(mp_ctx *ctx, mp_comm *c, const void *buf, size_t count, mp_comm_dtype t,
                       int peer);
mp_status mp_comm_recv(mp_ctx *ctx, mp_comm *c, void *buf, size_t count, mp_comm_dtype t,
                       int peer);
mp_status mp_comm_sendrecv(mp_ctx *ctx, mp_comm *c, const void *send, size_t send_count, int dst,
                           void *recv, size_t recv_count, int src, mp_comm_dtype t);
mp_status mp_comm_barrier(mp_ctx *ctx, mp_comm *c, mp_group g);
/* Waits until every collective issued on c has completed (no-op for blocking backends). */
mp_status mp_comm_synchronize(mp_ctx *ctx, mp_comm *c);

#ifdef __cplusplus
}
#endif
#endif
