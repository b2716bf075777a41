/* Collectives over the groups of a device mesh: the one interface the runtime calls.
 *
 * An mp_comm is a process's handle on the job: its world rank, its node-local rank (GPU
 * selection) and one communicator per group kind of exec/mesh.h (mp_group: tp, dp_shard,
 * ep, efsdp, dp_replicate, dp, fsdp, cp, pp, world). Every collective names the group kind
 * it runs on; the group is the caller's own group of that kind.
 *
 * Backends (ggml style: a table of function pointers, exec/comm/comm_backend.h):
 *   "mpi"            OpenMPI; one MPI_Comm_split per group kind (comm_mpi.c). Host buffers.
 *   "single"         world size 1 with no MPI at all (comm_single.c): every group has one
 *                    rank. Host buffers.
 *   "nccl"           ncclCommSplit per group kind (comm_nccl*.c). Device buffers; the
 *                    collectives run on the comm's own CUDA stream.
 *   "mpi-staged"     device buffers through host staging and the "mpi" backend
 *                    (comm_staged.c): several ranks on one GPU, or no NCCL in the build.
 *   "single-staged"  world size 1 with device buffers: device-to-device copies.
 * mp_comm_create_for_device picks one for the CLI. This header does not change between
 * them; the calls below validate their arguments once (comm.c) and dispatch to the backend.
 *
 * Invariants a caller may rely on:
 *   - A rank's position in a group communicator is its mesh group index
 *     (mp_mesh_group_index), so chunk i of an all-gather or reduce-scatter belongs to the
 *     group's i-th rank in increasing world-rank order (mp_mesh_group_ranks).
 *   - The mesh's rank numbering is the MPI world numbering (checked at creation, which
 *     also checks that the mesh's world size equals the MPI world size on every rank).
 *   - An all-reduce leaves bitwise identical results on every rank of the group.
 *   - Ordering. For "mpi", "single" and the staged backends a collective is complete when
 *     the call returns (the staged ones copy with the kernel backend's memcpy, which is
 *     ordered after the work already queued on its context). For "nccl" a collective is
 *     ordered on the device: it starts after the work queued so far on the compute stream
 *     (mp_comm_set_stream) and work queued on that stream after the call sees its result;
 *     the host does not wait. Host code that reads a result (a memcpy_d2h, a stream
 *     synchronize) calls mp_comm_synchronize first: that is where a dead peer is noticed
 *     and reported instead of hanging.
 *   - All ranks of a group must make the same calls in the same order with the same
 *     counts (as with MPI and NCCL). Argument errors that every rank detects identically
 *     (bad group, counts that do not add up) come back on every rank, so all exit together.
 *   - One thread uses an mp_comm (MPI is initialized with MPI_THREAD_FUNNELED).
 *
 * Builds without MPI (no mpicc when it was built, or MESHPLAN_NO_MPI=1: see
 * third_party/mpi): "single", "single-staged" and "nccl" at world size 1 without a
 * launcher work unchanged; "mpi", "mpi-staged" and every MPI entry point below return
 * MP_ERR_UNSUPPORTED saying the build has no MPI (mp_comm_mpi_finalize is a no-op), so a
 * launched multi-rank run fails at creation with that message.
 *
 * Errors: every call returns mp_status; MPI failures are MP_ERR_MPI with the call, its
 * file:line and MPI_Error_string on ctx (MPI_ERRORS_RETURN is set on every communicator
 * so MPI does not abort the process). "mpi" bounds every wait by MESHPLAN_COMM_TIMEOUT_S
 * (seconds > 0, default 600, as "nccl"): a collective or point-to-point call that does not
 * complete in time returns MP_ERR_TIMEOUT naming this rank, the call, its size and the
 * mesh group with its world ranks ("rank 3: all_reduce of 4096 fp32 elements on group dp
 * (world ranks 0 1 2 3) did not complete within 600 s: a peer rank died or is stuck; ..."),
 * and every later call on that comm fails at once; end the job then (mp_comm_mpi_abort). NCCL failures are MP_ERR_NCCL with NCCL's own
 * message; after an NCCL failure or timeout the communicators are aborted and every later
 * call on that mp_comm fails at once with the same message (destroy it and exit). */
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
/* kernels/ops.h: the kernel backend whose memory device buffers live in (staged backends
 * copy with its memcpy entries) and its per-context state. Declared here so that comm.h
 * does not pull in the op table. */
struct mp_backend;
struct mp_kctx;

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
 * "mpi" mp_comm first.
 * mp_comm_mpi_world: initializes MPI as mp_comm_mpi_init (argc, argv NULL) and gives this
 * process's rank in MPI_COMM_WORLD and the world's size (either pointer may be NULL).
 * mp_comm_mpi_built: 1 when this build has MPI; 0 when every call above but finalize
 * returns MP_ERR_UNSUPPORTED. */
mp_status mp_comm_mpi_init(mp_ctx *ctx, int *argc, char ***argv);
/* Ends the whole job after a failure that leaves MPI unusable (MP_ERR_TIMEOUT: a peer is
 * stuck; MP_ERR_MPI, MP_ERR_NCCL: a peer died): waits grace_s seconds, so that the other
 * live ranks, whose deadlines fall within about a step of this one's, print what they
 * waited on too, then MPI_Abort(MPI_COMM_WORLD, code), which under mpirun ends every
 * process of the job (a stopped one included). For the CLI's main only: library code
 * returns a status and never ends the process. Returns only when MPI is not initialized
 * (or already finalized) or the build has no MPI; the caller then exits as usual. */
void mp_comm_mpi_abort(int code, double grace_s);
mp_status mp_comm_mpi_finalize(mp_ctx *ctx);
mp_status mp_comm_mpi_world(mp_ctx *ctx, int *rank, int *size);
int mp_comm_mpi_built(void);

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

/* ---- creation for device buffers ----
 * mp_comm_create_nccl: collectives on CUDA device memory of `cuda_device` (made current),
 * ordered against `cuda_stream` (a cudaStream_t; NULL is the legacy default stream; see
 * mp_comm_set_stream). With a launcher (mpirun, srun) or a mesh of more than one rank it
 * is collective over MPI_COMM_WORLD like mp_comm_create_mpi (initializes MPI, agrees on the
 * mesh, then rank 0's ncclUniqueId goes out with MPI_Bcast); at world size 1 without a
 * launcher it makes the id locally and never starts MPI. Every rank must use its own GPU:
 * two ranks of a node on one GPU are refused on every rank (MP_ERR_UNSUPPORTED) before
 * NCCL is called. Then one ncclCommInitRankConfig for the world (non-blocking mode) and one
 * ncclCommSplit per group kind (color = mp_mesh_group_id, key = mp_mesh_group_index);
 * kinds whose groups hold the same ranks share one communicator. Reads
 * MESHPLAN_COMM_TIMEOUT_S (seconds > 0, default 600): the bound on every wait. Without
 * NCCL in the build: MP_ERR_UNSUPPORTED "built without NCCL".
 * mp_comm_nccl_built: 1 when this build has the NCCL backend. */
mp_status mp_comm_create_nccl(mp_ctx *ctx, const mp_mesh *mesh, int cuda_device, void *cuda_stream,
                              mp_comm **out);
int mp_comm_nccl_built(void);
/* mp_comm_create_mpi_staged: as mp_comm_create_mpi (collective, same checks), for buffers
 * in the memory of kernel backend `be`: each collective copies its device input to a host
 * staging buffer with be->memcpy_d2h(kc, ...), runs the "mpi" collective on the host copy,
 * and copies the output back with be->memcpy_h2d: bitwise the results of "mpi". exec/comm
 * links no CUDA for it; be and kc (initialized, kept alive until destroy) do the copies.
 * mp_comm_create_single_staged: as mp_comm_create_single (world size 1, no MPI), for
 * buffers in be's memory: each collective is be->memcpy_d2d(kc, ...) (or nothing in place). */
mp_status mp_comm_create_mpi_staged(mp_ctx *ctx, const mp_mesh *mesh,
                                    const struct mp_backend *be, struct mp_kctx *kc,
                                    mp_comm **out);
mp_status mp_comm_create_single_staged(mp_ctx *ctx, const mp_mesh *mesh,
                                       const struct mp_backend *be, struct mp_kctx *kc,
                                       mp_comm **out);
/* The one call the CLI makes: the backend for where the buffers live.
 *   CPU (device_is_cuda 0): "mpi" under a launcher, else "single" (mesh of world size 1;
 *     a bigger mesh is MP_ERR_INVALID "launch it with mpirun -np N"). be, kc may be NULL.
 *   CUDA: "nccl" on kc->device, ordered against cuda_stream (mp_cuda_stream(kc)), when NCCL
 *     is built in and every rank has its own GPU (checked by PCI bus id over MPI on each
 *     node, and agreed over the world); else "mpi-staged" under a launcher or
 *     "single-staged" without one, through be and kc. MESHPLAN_NO_NCCL=1 forces the staged
 *     backends.
 * notice (may be NULL) gets "" for the expected choices and one line saying why for a
 * fallback ("4 ranks share 1 GPU on this node; NCCL refuses two ranks of one communicator
 * on one GPU, so collectives go through MPI with host staging"); the caller prints it
 * (rank 0 is enough: every rank makes the same choice). Collective over MPI_COMM_WORLD
 * under a launcher. */
mp_status mp_comm_create_for_device(mp_ctx *ctx, const mp_mesh *mesh, int device_is_cuda,
                                    const struct mp_backend *be, struct mp_kctx *kc,
                                    void *cuda_stream, mp_comm **out, char *notice,
                                    size_t notice_len);
/* Frees the communicators (not MPI itself). NULL is a no-op. Not collective for "single";
 * for "mpi" it calls MPI_Comm_free, which every rank of each group must call. For "nccl" it
 * first completes the issued collectives, then finalizes each NCCL communicator (which
 * the other ranks must do too); a wait longer than the timeout aborts instead. Destroy a
 * comm before the kernel backend context (kc) and the CUDA stream it uses. */
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
 * for "nccl" and the staged backends. Unless stated, send and recv must not overlap. */

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
/* Every rank of the group has reached the barrier when it returns. "nccl": an all-reduce of
 * one element on the group, waited for on the host (bounded by the timeout), so it also
 * waits for this rank's queued collectives and the compute queued before it. */
mp_status mp_comm_barrier(mp_ctx *ctx, mp_comm *c, mp_group g);
/* Waits on the host until every collective issued on c has completed (no-op for blocking
 * backends). "nccl": polls the completion events and ncclCommGetAsyncError; a collective
 * that makes no progress for MESHPLAN_COMM_TIMEOUT_S seconds (default 600) aborts the
 * communicators and returns MP_ERR_NCCL naming this rank, the collective, the group and
 * its world ranks ("rank 3: all_gather of 4096 bf16 elements on group dp_shard (world
 * ranks 0 1 2 3) did not complete within 600 s: a peer rank died or is stuck; ..."). An
 * NCCL error reported by any of c's communicators does the same at once. */
mp_status mp_comm_synchronize(mp_ctx *ctx, mp_comm *c);

/* ---- overlap: issue now, wait later (every backend) ----
 * The runtime prefetches the next FSDP unit's all-gather while the current unit computes,
 * and lets gradient reduce-scatters run under the backward:
 *
 *   mp_comm_req req = {0};
 *   mp_comm_async_begin(ctx, c);                 // inputs are ready on the compute stream
 *   mp_comm_all_gather(ctx, c, MP_GROUP_FSDP, shard, full, n, MP_COMM_DTYPE_BF16);
 *   mp_comm_async_end(ctx, c, &req);             // one completion for the batch
 *   ... queue compute that does not touch shard or full ...
 *   mp_comm_wait(ctx, c, &req);                  // compute queued after this sees full
 *
 * Contract:
 *   - mp_comm_async_begin opens a batch: the collectives called until mp_comm_async_end
 *     start after the work queued on the compute stream before async_begin and run in call
 *     order on the comm's stream, but the compute stream does not wait for them. So issue
 *     a prefetch before queuing the compute it should hide behind (unit i+1's all-gather,
 *     then unit i's forward), and a reduce-scatter after the backward that produced its
 *     input. Collectives inside a batch may use each other's outputs. Batches do not nest.
 *     All collectives of a comm share its one stream, in call order on every rank.
 *   - mp_comm_async_end closes it and sets *req; mp_comm_wait(req) makes work queued on the
 *     compute stream afterwards wait for every collective of the batch (on the device: the
 *     host does not block for "nccl"). Until then the batch's buffers must not be written
 *     (inputs) or read (outputs) by compute. A request may be waited once or more, or never
 *     (mp_comm_synchronize and mp_comm_destroy complete everything); a zero-initialized
 *     request is complete.
 *   - Blocking backends ("mpi", "single", staged): the collectives complete inside their
 *     calls, begin/end/wait only check their use, and every request is complete at once.
 *   - "nccl": wait also reports an NCCL error already known and a collective pending for
 *     longer than the timeout (see mp_comm_synchronize), without blocking.
 *   - Collectives outside a batch are ordered as described above (compute waits for each
 *     at once).
 * Errors: async_begin while a batch is open and async_end without one are MP_ERR_INVALID;
 * after an error inside a batch, async_end still closes it (and reports the error again
 * for "nccl", whose communicators are then aborted). */
typedef struct mp_comm_req {
  uint64_t seq; /* backend's completion ticket; 0: complete */
} mp_comm_req;
mp_status mp_comm_async_begin(mp_ctx *ctx, mp_comm *c);
mp_status mp_comm_async_end(mp_ctx *ctx, mp_comm *c, mp_comm_req *req);
mp_status mp_comm_wait(mp_ctx *ctx, mp_comm *c, mp_comm_req *req);
/* Names the compute stream (a cudaStream_t) that collectives are ordered against; host
 * backends ignore it. Call it between collectives, not inside a batch. NULL c: no-op. */
void mp_comm_set_stream(mp_comm *c, void *cuda_stream);

/* Profiling (meshplan train --profile): with p set, every all-reduce, all-gather,
 * reduce-scatter, all-to-all and broadcast through the front end adds its host time to
 * p->seconds[group] and one to p->calls[group]; a send, receive or sendrecv counts under
 * the mesh group in which this rank and its peer (the receive's, for sendrecv) differ
 * (pp for a pipeline's neighbouring stage), the world when they differ in more. The host time is the whole collective on
 * the blocking backends ("mpi", "single", the staged ones); on "nccl" it is the time to
 * enqueue it (the collectives run on their own stream, overlapping compute by design).
 * p NULL stops it; p is the caller's and must outlive its use. */
typedef struct mp_comm_prof {
  double seconds[MP_GROUP_COUNT];
  int64_t calls[MP_GROUP_COUNT];
  int64_t unit_ops[MP_GROUP_COUNT]; /* mp_comm_profile_unit_op's count (FSDP units) */
} mp_comm_prof;
void mp_comm_profile(mp_comm *c, mp_comm_prof *p);
/* One op of the schedule carried out as several calls (an FSDP unit's all-gather or
 * reduce-scatter, which the runtime issues one parameter tensor at a time): counted in
 * p->unit_ops[group], so the profile can set the calls beside the schedule's ops. */
void mp_comm_profile_unit_op(mp_comm *c, mp_group g);

#ifdef __cplusplus
}
#endif
#endif
