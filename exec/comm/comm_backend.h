/* The backend table behind comm.h: what a collectives implementation provides.
 *
 * For implementers only (comm_mpi.c, comm_single.c, comm_staged.c, comm_nccl*.c) and for
 * the tests of their internals; the runtime includes comm.h. The front end (comm.c) has
 * already checked every argument a backend receives: the group kind is valid, buffers are
 * non-NULL where count > 0, counts and displacements are >= 0, the op/dtype pair is
 * supported, peers are in range, async regions are not nested. A backend checks only its
 * own limits (MPI's int counts) and reports its library's errors.
 *
 * Backends:
 *   "mpi"            comm_mpi.c: MPI_Comm_split per group kind, host buffers, blocking.
 *   "single"         comm_single.c: world size 1, no MPI, host buffers (memmove).
 *   "mpi-staged"     comm_staged.c: device buffers copied to host staging with the kernel
 *                    backend's memcpy_d2h, the "mpi" table on the host copies, memcpy_h2d
 *                    back. For several ranks on one GPU (NCCL 2.28 refuses two ranks of one
 *                    communicator on one GPU) and for builds without NCCL.
 *   "single-staged"  comm_staged.c: world size 1, device buffers, memcpy_d2d.
 *   "nccl"           comm_nccl*.c: ncclCommSplit per group kind (kinds with the same ranks
 *                    share one communicator), non-blocking NCCL on the comm's own stream,
 *                    ordered against the caller's compute stream with CUDA events, every
 *                    wait bounded by MESHPLAN_COMM_TIMEOUT_S.
 * Blocking backends leave async_begin/async_end/wait/set_stream NULL: the front end then
 * treats a request as complete at once. */
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
  /* Overlap (comm.h): NULL for blocking backends. async_end sets req (seq 0: nothing to
   * wait for); wait is called only with a non-zero req->seq. */
  mp_status (*async_begin)(mp_ctx *ctx, mp_comm *c);
  mp_status (*async_end)(mp_ctx *ctx, mp_comm *c, mp_comm_req *req);
  mp_status (*wait)(mp_ctx *ctx, mp_comm *c, const mp_comm_req *req);
  void (*set_stream)(mp_comm *c, void *cuda_stream);
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
  int async_open; /* between mp_comm_async_begin and mp_comm_async_end (front end's) */
  mp_comm_prof *prof; /* mp_comm_profile's accumulator, or NULL */
  void *impl;
};

/* Fills the shared fields from the mesh for world rank `rank` (backend and impl left NULL). */
void mp_comm_init_common(mp_comm *c, const mp_mesh *mesh, int rank);

/* ---- deadlines and their messages (comm.c), shared by the "mpi" and "nccl" backends ----
 *
 * Every wait of a backend that talks to other processes is bounded: MESHPLAN_COMM_TIMEOUT_S
 * seconds (default MP_COMM_DEFAULT_TIMEOUT_S, NCCL's watchdog default in this project)
 * without completion is a failure that names this rank, the collective, its element count
 * and type, and the mesh group with its world ranks (or the peer of a point-to-point op). */

#define MP_COMM_DEFAULT_TIMEOUT_S 600.0

/* MESHPLAN_COMM_TIMEOUT_S in seconds (> 0, finite, at most 1e9); unset or empty: the
 * default. Anything else is MP_ERR_INVALID naming the variable. */
mp_status mp_comm_read_timeout(mp_ctx *ctx, double *out);
/* "rank 3: all_gather of 4096 bf16 elements on group dp_shard (world ranks 0 1 2 3)", or
 * for a point-to-point op (peer >= 0) "rank 3: send of 8 fp32 elements to rank 2"; a long
 * group shows its first and last ranks. group is an mp_group, or -1 for MPI_COMM_WORLD
 * before the mesh groups exist ("on the world, creating the communicators"). */
void mp_comm_describe(const mp_comm *c, int world_rank, const char *what, int group, int peer,
                      size_t count, mp_comm_dtype t, char *buf, size_t cap);
/* Records "<description> did not complete within T s: a peer rank died or is stuck; ..."
 * with code and returns it. */
mp_status mp_comm_timeout_error(mp_ctx *ctx, mp_status code, const char *description, double timeout_s,
                                int point_to_point);

/* ---- the launcher (comm.c; no MPI) ---- */

/* 1 when a launcher's environment names this process one rank of a job
 * (OMPI_COMM_WORLD_SIZE, PMI_SIZE, as app/cmd_common.c's mp_cmd_launch reads them). */
int mp_comm_env_launched(void);

/* ---- MPI bootstrap, shared by the MPI-based backends ("mpi", "mpi-staged") and the NCCL
 * backend's creation ----
 * comm_mpi.c defines these; in a build without MPI comm_mpi_stub.c does, and every one
 * returns MP_ERR_UNSUPPORTED ("built without MPI ..."). All are collective over
 * MPI_COMM_WORLD and need MPI initialized (mp_comm_mpi_init or mp_comm_mpi_world). */

/* Every rank agrees that all were given the same mesh and that it has `world` ranks, or
 * all return the same MP_ERR_INVALID. */
mp_status mp_comm_mpi_agree_on_mesh(mp_ctx *ctx, const mp_mesh *mesh, int world);
/* This rank's position among the ranks of its node and their count. */
mp_status mp_comm_mpi_node(mp_ctx *ctx, int *local_rank, int *local_size);
/* As mp_comm_mpi_node, and gathers `bytes` bytes from `mine` on every rank of the node, in
 * node-rank order, into *all (malloc'd, local_size * bytes; the caller frees it). bytes 0:
 * nothing is gathered and *all is NULL. */
mp_status mp_comm_mpi_node_allgather(mp_ctx *ctx, const void *mine, size_t bytes, void **all,
                                     int *local_rank, int *local_size);
/* out[i] = the maximum over the world of in[i], i < n (in and out may be the same). */
mp_status mp_comm_mpi_world_max(mp_ctx *ctx, const int *in, int *out, int n);
/* The `bytes` bytes at buf on every rank become those of world rank root. */
mp_status mp_comm_mpi_world_bcast(mp_ctx *ctx, void *buf, size_t bytes, int root);

/* ---- backend selection (comm_select.c), exposed for its unit test ---- */

typedef enum mp_comm_kind {
  MP_COMM_KIND_SINGLE = 0,
  MP_COMM_KIND_MPI,
  MP_COMM_KIND_NCCL,
  MP_COMM_KIND_MPI_STAGED,
  MP_COMM_KIND_SINGLE_STAGED
} mp_comm_kind;

/* What mp_comm_create_for_device knows when it chooses. */
typedef struct mp_comm_facts {
  int device_is_cuda;
  int launched;        /* mp_comm_env_launched() */
  int nccl_built;      /* mp_comm_nccl_built() */
  int no_nccl_env;     /* MESHPLAN_NO_NCCL=1 */
  int node_ranks;      /* ranks on this node (1 without a launcher) */
  int node_gpus;       /* distinct GPUs they use */
  int shared_anywhere; /* on some node two ranks use one GPU (same on every rank) */
} mp_comm_facts;

/* The backend for these facts and a one-line notice when the choice is a fallback ("" for
 * the expected ones: mpi/single on the CPU, nccl on CUDA). MP_ERR_INVALID when the mesh
 * needs more ranks than a process started without a launcher has. Pure: no MPI, no CUDA. */
mp_status mp_comm_choose(mp_ctx *ctx, const mp_mesh *mesh, const mp_comm_facts *f,
                         mp_comm_kind *kind, char *notice, size_t notice_len);

/* ---- NCCL internals (comm_nccl.c; comm_nccl_stub.c without NCCL) ---- */

/* Collective over MPI_COMM_WORLD (MPI initialized; the caller's CUDA device `device`):
 * which GPUs the ranks of this node use, by PCI bus id. Every rank returns the same status:
 * a rank whose device cannot be queried fails them all. */
typedef struct mp_comm_node_gpus {
  int local_rank, local_size; /* this rank among the node's ranks */
  int node_gpus;              /* distinct GPUs the node's ranks use */
  int shared_here;            /* two ranks of this node use one GPU */
  int shared_anywhere;        /* the same on some node */
} mp_comm_node_gpus;
mp_status mp_comm_nccl_node_gpus(mp_ctx *ctx, int device, mp_comm_node_gpus *out);
/* Number of distinct NCCL communicators behind c (group kinds with the same ranks share
 * one); 0 for another backend. For tests. */
int mp_comm_nccl_comm_count(const mp_comm *c);

#ifdef __cplusplus
}
#endif
#endif
