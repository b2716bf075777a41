/* "nccl" backend: collectives on CUDA device buffers over NCCL (see comm.h).
 *
 * Creation: rank 0's ncclUniqueId goes to every rank over MPI (made locally at world size 1
 * without a launcher, with no MPI at all: all that a build without MPI can do), then one
 * ncclCommInitRankConfig for the world, then one ncclCommSplit per group kind with color =
 * mp_mesh_group_id and key = mp_mesh_group_index, as comm_mpi.c does with MPI_Comm_split,
 * so a rank's NCCL rank in a group communicator is its mesh group index (checked). The MPI
 * steps go through comm_backend.h's bootstrap calls, so the NCCL files include no MPI
 * header. Group kinds whose groups hold the same ranks (dp_shard and fsdp when cp = 1,
 * every kind of size 1, ...) share one communicator: the decision compares this rank's
 * group lists, and because mesh groups are cosets of mesh coordinates it comes out the
 * same on every rank, so every rank makes the same sequence of splits.
 * MESHPLAN_NCCL_SPLIT_EVERY_GROUP=1 turns sharing off (tests use it to exercise
 * ncclCommSplit at world size 1).
 *
 * Streams: every collective runs on the comm's own stream (high priority, non-blocking).
 * Outside a batch, a collective first makes that stream wait for an event recorded on the
 * caller's compute stream, and afterwards makes the compute stream wait for the
 * collective's completion event; inside an mp_comm_async_begin/end batch the first wait
 * happens once at begin and the second is deferred to mp_comm_wait. One stream for all
 * group kinds keeps the collectives in call order on every rank, which cannot deadlock.
 *
 * Failure detection (NCCL's non-blocking mode, ncclConfig_t.blocking = 0): no NCCL call
 * blocks the host. A call may return ncclInProgress; the backend then polls
 * ncclCommGetAsyncError until the operation is enqueued. Every issued collective gets a
 * slot in a FIFO with its own completion event (the comm stream runs in order, so they
 * complete in order), its name, group and issue time. mp_comm_synchronize and barrier wait
 * on the host, polling the events and the communicators' async errors; the collectives,
 * async_begin and wait look without waiting. Any wait that makes no progress for
 * MESHPLAN_COMM_TIMEOUT_S seconds (default 600), a collective pending longer than that,
 * or an NCCL error, aborts every communicator (ncclCommAbort makes kernels stuck on a dead
 * peer return) and fails with MP_ERR_NCCL naming this rank, the collective, the group and
 * its world ranks; every later call fails at once with the same message.
 *
 * This file: creation (the bootstrap, one world communicator, one split per group kind),
 * which GPUs the ranks of a node use, and destroy. The rest is split by job (see
 * comm_nccl_internal.h, which also states the invariants of the shared state). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "exec/comm/comm_nccl_internal.h"

enum { SCRATCH_BYTES = 256 };

/* ---- lifetime ---- */

void mp_nccl_destroy(mp_comm *c) {
  nccl_impl *m = IMPL(c);
  if (m == NULL) return;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  cudaSetDevice(m->device);
  if (!m->aborted && m->n_owned > 0) {
    /* Complete what was issued, then finalize each communicator (non-blocking: poll);
     * anything that does not finish within the timeout is aborted instead. */
    mp_status st = m->n > 0 ? mp_nccl_host_wait(&ctx, c, m->issued_seq) : MP_OK;
    for (int i = m->n_owned - 1; i >= 0; i--) {
      ncclComm_t comm = m->owned[i];
      op_desc d = {"ncclCommFinalize", MP_GROUP_WORLD, -1, 0, MP_COMM_DTYPE_FP32};
      if (st == MP_OK && mp_nccl_ok(ncclCommFinalize(comm)) &&
          mp_nccl_settle(&ctx, c, comm, &d, m->timeout_s) == MP_OK)
        (void)ncclCommDestroy(comm);
      else
        (void)ncclCommAbort(comm);
    }
  }
  for (size_t i = 0; i < m->cap; i++)
    if (m->ops[i].done) cudaEventDestroy(m->ops[i].done);
  if (m->ready) cudaEventDestroy(m->ready);
  if (m->stream) cudaStreamDestroy(m->stream);
  if (m->scratch) cudaFree(m->scratch);
  (void)cudaGetLastError(); /* leave no error behind for the kernel backend */
  free(m->ops);
  free(m);
  c->impl = NULL;
}

int mp_comm_nccl_built(void) { return 1; }

int mp_comm_nccl_comm_count(const mp_comm *c) {
  return c && c->backend == &mp_nccl_backend ? IMPL(c)->n_owned : 0;
}

/* ---- which GPUs the ranks of a node use ---- */

enum { BUS_ID_LEN = 32 };

mp_status mp_comm_nccl_node_gpus(mp_ctx *ctx, int device, mp_comm_node_gpus *out) {
  memset(out, 0, sizeof *out);
  char bus[BUS_ID_LEN];
  memset(bus, 0, sizeof bus);
  mp_ctx mine;
  mp_ctx_init(&mine);
  int rank = 0, bad = 0;
  cudaError_t e = cudaSetDevice(device);
  if (e == cudaSuccess) e = cudaDeviceGetPCIBusId(bus, BUS_ID_LEN - 1, device);
  if (e != cudaSuccess) {
    bad = 1;
    mp_error(&mine, MP_ERR_CUDA,
             "cuda device %d: %s; check CUDA_VISIBLE_DEVICES, the driver, and that the "
             "device index is below the number of visible GPUs",
             device, cudaGetErrorString(e));
    (void)cudaGetLastError();
    bus[0] = '\0';
  }
  MP_CHECK(mp_comm_mpi_world(ctx, &rank, NULL));
  int lr = 0, ls = 1;
  char *all = NULL;
  MP_CHECK(mp_comm_mpi_node_allgather(ctx, bus, BUS_ID_LEN, (void **)&all, &lr, &ls));
  int distinct = 0;
  for (int i = 0; i < ls; i++) {
    int first = 1;
    for (int k = 0; k < i && first; k++)
      if (strcmp(all + (size_t)k * BUS_ID_LEN, all + (size_t)i * BUS_ID_LEN) == 0) first = 0;
    distinct += first;
  }
  free(all);
  int flags[2] = {bad, distinct < ls}, any[2] = {0, 0};
  MP_CHECK(mp_comm_mpi_world_max(ctx, flags, any, 2));
  if (bad) return mp_error(ctx, MP_ERR_CUDA, "rank %d: %s", rank, mp_errmsg(&mine));
  if (any[0])
    return mp_error(ctx, MP_ERR_CUDA,
                    "rank %d: another rank could not query its CUDA device (its own message "
                    "says why), so no rank goes on",
                    rank);
  out->local_rank = lr;
  out->local_size = ls;
  out->node_gpus = distinct;
  out->shared_here = distinct < ls;
  out->shared_anywhere = any[1];
  return MP_OK;
}

/* ---- creation ---- */

/* Group kinds whose groups hold the same ranks share a communicator; lists[g] holds this
 * rank's group of kind g. */
static int same_group(const mp_comm *c, int *const lists[], int g, int h) {
  return c->group_size[g] == c->group_size[h] &&
         memcmp(lists[g], lists[h], (size_t)c->group_size[g] * sizeof(int)) == 0;
}

static mp_status make_groups(mp_ctx *ctx, mp_comm *c) {
  nccl_impl *m = IMPL(c);
  const char *every = getenv("MESHPLAN_NCCL_SPLIT_EVERY_GROUP");
  const int share = !(every && strcmp(every, "1") == 0);
  int *lists[MP_GROUP_COUNT];
  mp_status st = MP_OK;
  memset(lists, 0, sizeof lists);
  for (int g = 0; g < MP_GROUP_COUNT; g++) {
    lists[g] = (int *)malloc((size_t)c->group_size[g] * sizeof(int));
    if (lists[g] == NULL) {
      st = mp_error(ctx, MP_ERR_NOMEM, "out of memory listing the groups of rank %d",
                    c->world_rank);
      goto out;
    }
    mp_mesh_group_ranks(&c->mesh, (mp_group)g, c->world_rank, lists[g]);
  }
  for (int g = 0; g < MP_GROUP_COUNT && st == MP_OK; g++) {
    if (share) {
      if (c->group_size[g] == c->world_size) { /* the whole world, in world order */
        m->comm[g] = m->owned[0];
        continue;
      }
      int h = 0;
      while (h < g && !same_group(c, lists, g, h)) h++;
      if (h < g) {
        m->comm[g] = m->comm[h];
        continue;
      }
    }
    int color = mp_mesh_group_id(&c->mesh, (mp_group)g, c->world_rank);
    int key = c->group_index[g];
    op_desc d = {"ncclCommSplit", g, -1, 0, MP_COMM_DTYPE_FP32};
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0;
    m->split_out = NULL;
    ncclResult_t rc = ncclCommSplit(m->owned[0], color, key, &m->split_out, &cfg);
    if (!mp_nccl_ok(rc)) {
      st = mp_nccl_error(ctx, rc, __FILE__, __LINE__, "ncclCommSplit");
      break;
    }
    /* non-blocking: the parent is busy until the split is done, then split_out is set */
    st = mp_nccl_settle(ctx, c, m->owned[0], &d, m->timeout_s);
    if (st == MP_OK && m->split_out == NULL)
      st = mp_error(ctx, MP_ERR_INTERNAL, "ncclCommSplit for group %s returned no communicator",
                    mp_group_name((mp_group)g));
    if (st == MP_OK) {
      m->owned[m->n_owned++] = m->split_out;
      m->comm[g] = m->split_out;
      st = mp_nccl_settle(ctx, c, m->split_out, &d, m->timeout_s);
    }
    int r = -1, n = -1;
    if (st == MP_OK && (ncclCommUserRank(m->comm[g], &r) != ncclSuccess ||
                        ncclCommCount(m->comm[g], &n) != ncclSuccess || r != c->group_index[g] ||
                        n != c->group_size[g]))
      st = mp_error(ctx, MP_ERR_INTERNAL,
                    "%s group of rank %d: NCCL gives rank %d of %d, the mesh index %d of %d",
                    mp_group_name((mp_group)g), c->world_rank, r, n, c->group_index[g],
                    c->group_size[g]);
  }
out:
  for (int g = 0; g < MP_GROUP_COUNT; g++) free(lists[g]);
  return st;
}

/* Where this rank stands before NCCL: its world rank and its node's ranks. With MPI
 * (a launcher, or a mesh of more than one rank) the ranks agree on the mesh and refuse,
 * all together, a node where two ranks share a GPU; alone, the device is made current. */
typedef struct boot_place {
  int use_mpi;
  int rank, local_rank, local_size;
} boot_place;

static mp_status boot_locate(mp_ctx *ctx, const mp_mesh *mesh, int cuda_device,
                             boot_place *p) {
  const int world = mp_mesh_world(mesh);
  p->use_mpi = mp_comm_env_launched() || world > 1;
  p->rank = p->local_rank = 0;
  p->local_size = 1;
  if (!p->use_mpi) {
    MP_CUDA_CHECK_CTX(ctx, cuda_device, cudaSetDevice(cuda_device));
    return MP_OK;
  }
  int mw = 0;
  MP_CHECK(mp_comm_mpi_world(ctx, &p->rank, &mw));
  MP_CHECK(mp_comm_mpi_agree_on_mesh(ctx, mesh, mw));
  mp_comm_node_gpus ng;
  MP_CHECK(mp_comm_nccl_node_gpus(ctx, cuda_device, &ng)); /* also makes the device current */
  if (ng.shared_anywhere) {
    if (ng.shared_here)
      return mp_error(ctx, MP_ERR_UNSUPPORTED,
                      "rank %d: %d ranks share %d GPU%s on this node; NCCL refuses two ranks "
                      "of one communicator on one GPU: give every rank its own GPU, or let "
                      "mp_comm_create_for_device stage collectives through MPI",
                      p->rank, ng.local_size, ng.node_gpus, ng.node_gpus == 1 ? "" : "s");
    return mp_error(ctx, MP_ERR_UNSUPPORTED,
                    "rank %d: ranks of another node share a GPU; NCCL refuses two ranks of "
                    "one communicator on one GPU: give every rank its own GPU, or let "
                    "mp_comm_create_for_device stage collectives through MPI",
                    p->rank);
  }
  p->local_rank = ng.local_rank;
  p->local_size = ng.local_size;
  return MP_OK;
}

/* ncclUniqueId from rank 0 to all, with rank 0's verdict, so all fail together. */
typedef struct boot_msg {
  int ok;
  ncclUniqueId id;
  char err[200];
} boot_msg;

static mp_status boot_unique_id(mp_ctx *ctx, const boot_place *p, boot_msg *boot) {
  memset(boot, 0, sizeof *boot);
  if (p->rank == 0) {
    ncclResult_t rc = ncclGetUniqueId(&boot->id);
    boot->ok = rc == ncclSuccess;
    if (!boot->ok) snprintf(boot->err, sizeof boot->err, "%s", ncclGetErrorString(rc));
  }
  if (p->use_mpi) MP_CHECK(mp_comm_mpi_world_bcast(ctx, boot, sizeof *boot, 0));
  if (!boot->ok)
    return mp_error(ctx, MP_ERR_NCCL,
                    "rank %d: rank 0 could not make the NCCL unique id: %s (NCCL_DEBUG=WARN "
                    "says more; NCCL_SOCKET_IFNAME picks the network interface)",
                    p->rank, boot->err);
  return MP_OK;
}

/* The comm stream (high priority: a ready collective's kernels go ahead of queued compute
 * kernels), the event that orders it after compute, barrier's scratch, the FIFO. */
static mp_status make_stream(mp_ctx *ctx, nccl_impl *m) {
  int lo = 0, hi = 0;
  cudaError_t e = cudaDeviceGetStreamPriorityRange(&lo, &hi);
  if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&m->stream, cudaStreamNonBlocking, hi);
  if (e == cudaSuccess) e = cudaEventCreateWithFlags(&m->ready, cudaEventDisableTiming);
  if (e == cudaSuccess) e = cudaMalloc(&m->scratch, SCRATCH_BYTES);
  if (e == cudaSuccess) e = cudaMemset(m->scratch, 0, SCRATCH_BYTES);
  if (e != cudaSuccess)
    return mp_cuda_error(ctx, e, m->device, __FILE__, __LINE__,
                         "creating the comm stream, its event and scratch");
  return mp_nccl_ops_grow(ctx, m);
}

/* The world communicator (owned[0]), non-blocking: the host never blocks in NCCL, every
 * wait is ours, with a deadline. */
static mp_status make_world(mp_ctx *ctx, mp_comm *c, const ncclUniqueId *id) {
  nccl_impl *m = IMPL(c);
  ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
  cfg.blocking = 0;
  ncclComm_t w = NULL;
  op_desc d = {"ncclCommInitRankConfig", MP_GROUP_WORLD, -1, 0, MP_COMM_DTYPE_FP32};
  ncclResult_t rc = ncclCommInitRankConfig(&w, c->world_size, *id, c->world_rank, &cfg);
  if (w != NULL) m->owned[m->n_owned++] = w;
  if (!mp_nccl_ok(rc) || w == NULL)
    return mp_nccl_error(ctx, mp_nccl_ok(rc) ? ncclInternalError : rc, __FILE__, __LINE__,
                         "ncclCommInitRankConfig");
  return mp_nccl_settle(ctx, c, w, &d, m->timeout_s);
}

mp_status mp_comm_create_nccl(mp_ctx *ctx, const mp_mesh *mesh, int cuda_device,
                              void *cuda_stream, mp_comm **out) {
  *out = NULL;
  if (mesh == NULL) return mp_error(ctx, MP_ERR_INVALID, "mp_comm_create_nccl: no mesh");
  MP_CHECK(mp_mesh_validate(ctx, mesh));
  double timeout_s = MP_COMM_DEFAULT_TIMEOUT_S;
  MP_CHECK(mp_comm_read_timeout(ctx, &timeout_s));
  boot_place place;
  MP_CHECK(boot_locate(ctx, mesh, cuda_device, &place));
  boot_msg boot;
  MP_CHECK(boot_unique_id(ctx, &place, &boot));

  mp_status st = MP_OK;
  mp_comm *c = (mp_comm *)calloc(1, sizeof *c);
  nccl_impl *m = (nccl_impl *)calloc(1, sizeof *m);
  if (c == NULL || m == NULL) {
    free(c);
    free(m);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory creating an NCCL communicator");
  }
  mp_comm_init_common(c, mesh, place.rank);
  c->local_rank = place.local_rank;
  c->local_size = place.local_size;
  c->backend = &mp_nccl_backend;
  c->impl = m;
  m->device = cuda_device;
  m->timeout_s = timeout_s;
  m->compute = (cudaStream_t)cuda_stream;
  MP_CHECK_GOTO(make_stream(ctx, m), st, fail);
  MP_CHECK_GOTO(make_world(ctx, c, &boot.id), st, fail);
  MP_CHECK_GOTO(make_groups(ctx, c), st, fail);
  *out = c;
  return MP_OK;

fail:
  mp_nccl_abort_comms(m); /* the other ranks see this one go and fail too */
  mp_comm_destroy(c);
  return st;
}
