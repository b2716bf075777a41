/* "mpi" backend: collectives over OpenMPI (see comm.h).
 *
 * One communicator per group kind, made by MPI_Comm_split(MPI_COMM_WORLD, color =
 * mp_mesh_group_id, key = mp_mesh_group_index): the key orders a group's ranks by their
 * mesh group index, and creation verifies that MPI's rank and size in each communicator
 * equal the mesh's group index and size, so "chunk i belongs to group index i" holds.
 * Point-to-point goes over the world-kind communicator (its order is the world order).
 *
 * MPI counts are int: a call whose counts (or, for gathers, count x group size) exceed
 * INT_MAX is MP_ERR_UNSUPPORTED rather than silently truncated.
 *
 * Deadline: every collective and point-to-point call is issued non-blocking (MPI_I*) and
 * tested against MESHPLAN_COMM_TIMEOUT_S (default 600 s, NCCL's in this project); a wait
 * that runs out returns MP_ERR_TIMEOUT naming this rank, the call, its size and the mesh
 * group with its world ranks, and every later call on the comm fails at once. The library
 * does not end the job: the CLI does (mp_comm_mpi_abort), since MPI_Finalize would wait
 * for the stuck rank. The bootstrap's world collectives (agreeing on the mesh, the NCCL id)
 * are bounded the same way; MPI_Comm_split and MPI_Comm_split_type have no non-blocking
 * form and are not.
 *
 * BF16 is carried as MPI_UINT16_T; its SUM and MAX are user ops (fp32 arithmetic, round to
 * nearest even), created per comm and freed with it.
 *
 * Also here: MPI's lifetime for the process (comm.h: mp_comm_mpi_init, _finalize, _world)
 * and the bootstrap calls of comm_backend.h (agree on the mesh, the node's ranks, a world
 * maximum and broadcast) that "mpi-staged" and the NCCL backend's creation use, so that
 * they include no MPI header. exec/comm/BUILD compiles this file only where
 * @local_mpi found MPI; comm_mpi_stub.c stands in for it elsewhere. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exec/comm/comm_backend.h"
#include "exec/comm/mpi_check.h"

typedef struct mpi_impl {
  MPI_Comm comm[MP_GROUP_COUNT];
  MPI_Op bf16_sum, bf16_max;
  /* all_to_all_v scratch: int counts/displacements, world_size entries each */
  int *a2a;
  double timeout_s; /* MESHPLAN_COMM_TIMEOUT_S */
  /* After a timeout the pending request still refers to its buffers and its peers are in
   * an unknown state: every later call fails at once with this message. */
  int timed_out;
  char timeout_msg[MP_ERRMSG_MAX];
} mpi_impl;

/* Every MPI wait is bounded like NCCL's (comm_backend.h). The first second of a wait
 * spins on MPI_Test as a blocking MPI call would (OpenMPI's progress engine busy-polls):
 * a collective that completes within it costs what the blocking call did. Later tests
 * are 1 ms apart, so a long wait on a stuck peer costs no core. */
#define SPIN_S 1.0

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Waits for the n requests rq of `what` (on group g, or with peer >= 0) until all complete
 * or timeout_s passes: MP_ERR_TIMEOUT naming this rank, the operation and the group. The
 * statuses go to sts when it is not NULL. c may be NULL (creation: the world). */
static mp_status wait_all(mp_ctx *ctx, mp_comm *c, int world_rank, double timeout_s, int n, MPI_Request *rq,
                          MPI_Status *sts, const char *what, int g, int peer, size_t count, mp_comm_dtype t) {
  const double t0 = now_s();
  for (;;) {
    int done = 0;
    int rc = MPI_Testall(n, rq, &done, sts ? sts : MPI_STATUSES_IGNORE);
    if (rc != MPI_SUCCESS) return mp_mpi_error(ctx, rc, __FILE__, __LINE__, "MPI_Testall(n, rq, &done, sts)");
    if (done) return MP_OK;
    const double waited = now_s() - t0;
    if (waited > timeout_s) {
      char d[512];
      mp_comm_describe(c, world_rank, what, g, peer, count, t, d, sizeof d);
      return mp_comm_timeout_error(ctx, MP_ERR_TIMEOUT, d, timeout_s, peer >= 0);
    }
    if (waited > SPIN_S) {
      struct timespec ts = {0, 1000000};
      nanosleep(&ts, NULL);
    }
  }
}

#define IMPL(c) ((mpi_impl *)(c)->impl)

/* A collective's wait on c: bounded, and a timeout makes c unusable (see mpi_impl). */
static mp_status wait_op(mp_ctx *ctx, mp_comm *c, int n, MPI_Request *rq, MPI_Status *sts, const char *what,
                         int g, int peer, size_t count, mp_comm_dtype t) {
  mpi_impl *m = IMPL(c);
  mp_status st = wait_all(ctx, c, c->world_rank, m->timeout_s, n, rq, sts, what, g, peer, count, t);
  if (st == MP_ERR_TIMEOUT) {
    m->timed_out = 1;
    snprintf(m->timeout_msg, sizeof m->timeout_msg, "%s", mp_errmsg(ctx));
  }
  return st;
}

/* Before a call: fail at once after a timeout. */
static mp_status usable(mp_ctx *ctx, const mp_comm *c, const char *what) {
  const mpi_impl *m = IMPL(c);
  if (!m->timed_out) return MP_OK;
  return mp_error(ctx, MP_ERR_TIMEOUT, "rank %d: %s refused: an earlier collective timed out: %s", c->world_rank,
                  what, m->timeout_msg);
}

mp_status mp_mpi_error(mp_ctx *ctx, int mpi_rc, const char *file, int line, const char *call) {
  char s[MPI_MAX_ERROR_STRING + 1];
  int len = 0, cls = -1;
  if (MPI_Error_string(mpi_rc, s, &len) != MPI_SUCCESS) len = 0;
  s[len] = '\0';
  if (MPI_Error_class(mpi_rc, &cls) != MPI_SUCCESS) cls = -1;
  return mp_error(ctx, MP_ERR_MPI, "%s:%d: %s failed: %s (MPI error class %d)", file, line, call,
                  len ? s : "unknown MPI error", cls);
}

/* ---- MPI lifetime ---- */

mp_status mp_comm_mpi_init(mp_ctx *ctx, int *argc, char ***argv) {
  int inited = 0, finalized = 0;
  MP_MPI_CHECK(ctx, MPI_Finalized(&finalized));
  if (finalized)
    return mp_error(ctx, MP_ERR_MPI,
                    "MPI was already finalized in this process and cannot start again; create "
                    "every communicator before mp_comm_mpi_finalize");
  MP_MPI_CHECK(ctx, MPI_Initialized(&inited));
  if (!inited) {
    /* FUNNELED: kernels may run threads, but only the main thread calls MPI. */
    int provided = 0;
    MP_MPI_CHECK(ctx, MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided));
  }
  MP_MPI_CHECK(ctx, MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN));
  return MP_OK;
}

int mp_comm_mpi_built(void) { return 1; }

void mp_comm_mpi_abort(int code, double grace_s) {
  int inited = 0, finalized = 0;
  if (MPI_Initialized(&inited) != MPI_SUCCESS || !inited) return;
  if (MPI_Finalized(&finalized) != MPI_SUCCESS || finalized) return;
  if (grace_s > 0) {
    struct timespec ts = {(time_t)grace_s, (long)((grace_s - (double)(time_t)grace_s) * 1e9)};
    nanosleep(&ts, NULL);
  }
  MPI_Abort(MPI_COMM_WORLD, code);
}

mp_status mp_comm_mpi_world(mp_ctx *ctx, int *rank, int *size) {
  int r = 0, n = 0;
  MP_CHECK(mp_comm_mpi_init(ctx, NULL, NULL));
  MP_MPI_CHECK(ctx, MPI_Comm_rank(MPI_COMM_WORLD, &r));
  MP_MPI_CHECK(ctx, MPI_Comm_size(MPI_COMM_WORLD, &n));
  if (rank) *rank = r;
  if (size) *size = n;
  return MP_OK;
}

mp_status mp_comm_mpi_finalize(mp_ctx *ctx) {
  int inited = 0, finalized = 0;
  MP_MPI_CHECK(ctx, MPI_Initialized(&inited));
  MP_MPI_CHECK(ctx, MPI_Finalized(&finalized));
  if (inited && !finalized) MP_MPI_CHECK(ctx, MPI_Finalize());
  return MP_OK;
}

/* ---- types and ops ---- */

static float bf16_to_f32(uint16_t h) {
  uint32_t u = (uint32_t)h << 16;
  float f;
  memcpy(&f, &u, sizeof f);
  return f;
}

static uint16_t f32_to_bf16(float f) {
  uint32_t u;
  memcpy(&u, &f, sizeof u);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x40u); /* quiet NaN */
  u += 0x7fffu + ((u >> 16) & 1u); /* round to nearest, ties to even */
  return (uint16_t)(u >> 16);
}

static void bf16_sum_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  const uint16_t *a = (const uint16_t *)in;
  uint16_t *b = (uint16_t *)inout;
  for (int i = 0; i < *len; i++) b[i] = f32_to_bf16(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
}

static void bf16_max_fn(void *in, void *inout, int *len, MPI_Datatype *dt) {
  (void)dt;
  const uint16_t *a = (const uint16_t *)in;
  uint16_t *b = (uint16_t *)inout;
  for (int i = 0; i < *len; i++)
    if (bf16_to_f32(a[i]) > bf16_to_f32(b[i])) b[i] = a[i];
}

static MPI_Datatype mpi_type(mp_comm_dtype t) {
  switch (t) {
    case MP_COMM_DTYPE_INT64: return MPI_INT64_T;
    case MP_COMM_DTYPE_BF16: return MPI_UINT16_T;
    case MP_COMM_DTYPE_FP32:
    default: return MPI_FLOAT;
  }
}

static MPI_Op mpi_op(const mpi_impl *m, mp_comm_dtype t, mp_comm_op op) {
  if (t == MP_COMM_DTYPE_BF16) return op == MP_COMM_OP_MAX ? m->bf16_max : m->bf16_sum;
  return op == MP_COMM_OP_MAX ? MPI_MAX : MPI_SUM;
}

static mp_status to_int(mp_ctx *ctx, const char *what, size_t n, int *out) {
  if (n > (size_t)INT_MAX)
    return mp_error(ctx, MP_ERR_UNSUPPORTED,
                    "%s: %zu elements exceed MPI's int count limit (%d); split the buffer into "
                    "smaller calls",
                    what, n, INT_MAX);
  *out = (int)n;
  return MP_OK;
}

/* ---- collectives ---- */

static mp_status mpi_all_reduce(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                void *recv, size_t count, mp_comm_dtype t, mp_comm_op op) {
  int n = 0;
  MP_CHECK(usable(ctx, c, "all_reduce"));
  MP_CHECK(to_int(ctx, "all_reduce", count, &n));
  const void *s = send == recv ? MPI_IN_PLACE : send;
  MPI_Request rq;
  MP_MPI_CHECK(ctx, MPI_Iallreduce(s, recv, n, mpi_type(t), mpi_op(IMPL(c), t, op), IMPL(c)->comm[g], &rq));
  return wait_op(ctx, c, 1, &rq, NULL, "all_reduce", g, -1, count, t);
}

static mp_status mpi_all_gather(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                void *recv, size_t count, mp_comm_dtype t) {
  int n = 0, total = 0;
  MP_CHECK(usable(ctx, c, "all_gather"));
  MP_CHECK(to_int(ctx, "all_gather", count, &n));
  MP_CHECK(to_int(ctx, "all_gather (count x group size)", count * (size_t)c->group_size[g],
                  &total));
  size_t off = count * (size_t)c->group_index[g] * mp_comm_dtype_bytes(t);
  const void *s = send == (const char *)recv + off ? MPI_IN_PLACE : send;
  MPI_Request rq;
  MP_MPI_CHECK(ctx, MPI_Iallgather(s, n, mpi_type(t), recv, n, mpi_type(t), IMPL(c)->comm[g], &rq));
  return wait_op(ctx, c, 1, &rq, NULL, "all_gather", g, -1, count, t);
}

/* fp32 sums (the FSDP gradient reduce-scatter) go through an all-to-all of the chunks and
 * a local sum in group-index order: the result is the same bits whatever algorithm MPI
 * would pick for the group size and message size (reproducible runs), and on shared
 * memory it moves each byte once where OpenMPI's default MPI_Reduce_scatter_block was
 * measured at 0.4 GB/s for 8 MiB (meshplan calibrate). Other types and ops use MPI's. */
static mp_status mpi_reduce_scatter(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                    void *recv, size_t recv_count, mp_comm_dtype t,
                                    mp_comm_op op) {
  int n = 0, total = 0;
  const int gs = c->group_size[g];
  MP_CHECK(usable(ctx, c, "reduce_scatter"));
  MP_CHECK(to_int(ctx, "reduce_scatter", recv_count, &n));
  MP_CHECK(to_int(ctx, "reduce_scatter (count x group size)", recv_count * (size_t)gs, &total));
  if (t == MP_COMM_DTYPE_FP32 && op == MP_COMM_OP_SUM && gs > 1) {
    float *tmp = malloc((size_t)total * sizeof(float) + 1);
    if (!tmp)
      return mp_error(ctx, MP_ERR_NOMEM, "reduce_scatter: out of memory staging %zu floats",
                      (size_t)total);
    MPI_Request rq;
    int rc = MPI_Ialltoall(send, n, MPI_FLOAT, tmp, n, MPI_FLOAT, IMPL(c)->comm[g], &rq);
    if (rc != MPI_SUCCESS) {
      free(tmp);
      MP_MPI_CHECK(ctx, rc);
    }
    /* after a timeout MPI may still write into tmp: it is left allocated (the job ends) */
    MP_CHECK(wait_op(ctx, c, 1, &rq, NULL, "reduce_scatter", g, -1, recv_count, t));
    float *out = recv;
    for (int i = 0; i < n; i++) {
      float acc = tmp[i];
      for (int j = 1; j < gs; j++) acc += tmp[(size_t)j * n + i];
      out[i] = acc;
    }
    free(tmp);
    return MP_OK;
  }
  MPI_Request rq;
  MP_MPI_CHECK(ctx, MPI_Ireduce_scatter_block(send, recv, n, mpi_type(t), mpi_op(IMPL(c), t, op),
                                              IMPL(c)->comm[g], &rq));
  return wait_op(ctx, c, 1, &rq, NULL, "reduce_scatter", g, -1, recv_count, t);
}

static mp_status mpi_all_to_all_v(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                  const int64_t *send_counts, const int64_t *send_displs,
                                  void *recv, const int64_t *recv_counts,
                                  const int64_t *recv_displs, mp_comm_dtype t) {
  int n = c->group_size[g];
  MP_CHECK(usable(ctx, c, "all_to_all_v"));
  int *sc = IMPL(c)->a2a, *sd = sc + n, *rc = sd + n, *rd = rc + n;
  size_t total = 0;
  for (int j = 0; j < n; j++) {
    /* the end of each segment must fit too: MPI addresses elements with int offsets */
    MP_CHECK(to_int(ctx, "all_to_all_v send", (size_t)(send_displs[j] + send_counts[j]), &sc[j]));
    MP_CHECK(to_int(ctx, "all_to_all_v recv", (size_t)(recv_displs[j] + recv_counts[j]), &rc[j]));
    sc[j] = (int)send_counts[j];
    sd[j] = (int)send_displs[j];
    rc[j] = (int)recv_counts[j];
    rd[j] = (int)recv_displs[j];
    total += (size_t)recv_counts[j];
  }
  MPI_Request rq;
  MP_MPI_CHECK(ctx, MPI_Ialltoallv(send, sc, sd, mpi_type(t), recv, rc, rd, mpi_type(t), IMPL(c)->comm[g], &rq));
  return wait_op(ctx, c, 1, &rq, NULL, "all_to_all_v", g, -1, total, t);
}

static mp_status mpi_broadcast(mp_ctx *ctx, mp_comm *c, mp_group g, void *buf, size_t count,
                               mp_comm_dtype t, int root) {
  int n = 0;
  MP_CHECK(usable(ctx, c, "broadcast"));
  MP_CHECK(to_int(ctx, "broadcast", count, &n));
  MPI_Request rq;
  MP_MPI_CHECK(ctx, MPI_Ibcast(buf, n, mpi_type(t), root, IMPL(c)->comm[g], &rq));
  return wait_op(ctx, c, 1, &rq, NULL, "broadcast", g, -1, count, t);
}

/* A receive that gets fewer elements than asked is an error: the two sides disagree on
 * the message (more than asked is MPI_ERR_TRUNCATE from MPI itself). */
static mp_status check_received(mp_ctx *ctx, const char *what, MPI_Status *st, int want,
                                mp_comm_dtype t, int peer) {
  int got = 0;
  MP_MPI_CHECK(ctx, MPI_Get_count(st, mpi_type(t), &got));
  if (got != want)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: expected %d %s elements from rank %d but received %d; sender and "
                    "receiver disagree on the message size",
                    what, want, mp_comm_dtype_name(t), peer, got);
  return MP_OK;
}

static mp_status mpi_send(mp_ctx *ctx, mp_comm *c, const void *buf, size_t count,
                          mp_comm_dtype t, int peer) {
  int n = 0;
  MP_CHECK(usable(ctx, c, "send"));
  MP_CHECK(to_int(ctx, "send", count, &n));
  MPI_Request rq;
  MP_MPI_CHECK(ctx, MPI_Isend(buf, n, mpi_type(t), peer, 0, IMPL(c)->comm[MP_GROUP_WORLD], &rq));
  return wait_op(ctx, c, 1, &rq, NULL, "send", MP_GROUP_WORLD, peer, count, t);
}

static mp_status mpi_recv(mp_ctx *ctx, mp_comm *c, void *buf, size_t count, mp_comm_dtype t,
                          int peer) {
  int n = 0;
  MPI_Status st;
  MP_CHECK(usable(ctx, c, "recv"));
  MP_CHECK(to_int(ctx, "recv", count, &n));
  MPI_Request rq;
  MP_MPI_CHECK(ctx, MPI_Irecv(buf, n, mpi_type(t), peer, 0, IMPL(c)->comm[MP_GROUP_WORLD], &rq));
  MP_CHECK(wait_op(ctx, c, 1, &rq, &st, "recv", MP_GROUP_WORLD, peer, count, t));
  return check_received(ctx, "recv", &st, n, t, peer);
}

static mp_status mpi_sendrecv(mp_ctx *ctx, mp_comm *c, const void *send, size_t send_count,
                              int dst, void *recv, size_t recv_count, int src, mp_comm_dtype t) {
  int ns = 0, nr = 0;
  MPI_Status st[2];
  MP_CHECK(usable(ctx, c, "sendrecv"));
  MP_CHECK(to_int(ctx, "sendrecv", send_count, &ns));
  MP_CHECK(to_int(ctx, "sendrecv", recv_count, &nr));
  MPI_Request rq[2];
  MP_MPI_CHECK(ctx, MPI_Irecv(recv, nr, mpi_type(t), src, 0, IMPL(c)->comm[MP_GROUP_WORLD], &rq[0]));
  int rc = MPI_Isend(send, ns, mpi_type(t), dst, 0, IMPL(c)->comm[MP_GROUP_WORLD], &rq[1]);
  if (rc != MPI_SUCCESS) {
    MPI_Cancel(&rq[0]);
    MPI_Request_free(&rq[0]);
    MP_MPI_CHECK(ctx, rc);
  }
  MP_CHECK(wait_op(ctx, c, 2, rq, st, "sendrecv", MP_GROUP_WORLD, src, recv_count, t));
  return check_received(ctx, "sendrecv", &st[0], nr, t, src);
}

static mp_status mpi_barrier(mp_ctx *ctx, mp_comm *c, mp_group g) {
  MP_CHECK(usable(ctx, c, "barrier"));
  MPI_Request rq;
  MP_MPI_CHECK(ctx, MPI_Ibarrier(IMPL(c)->comm[g], &rq));
  return wait_op(ctx, c, 1, &rq, NULL, "barrier", g, -1, 0, MP_COMM_DTYPE_FP32);
}

static void mpi_destroy(mp_comm *c) {
  mpi_impl *m = IMPL(c);
  if (m == NULL) return;
  int finalized = 1;
  MPI_Finalized(&finalized);
  if (!finalized) { /* after MPI_Finalize the handles are gone with MPI itself */
    for (int g = 0; g < MP_GROUP_COUNT; g++)
      if (m->comm[g] != MPI_COMM_NULL) MPI_Comm_free(&m->comm[g]);
    if (m->bf16_sum != MPI_OP_NULL) MPI_Op_free(&m->bf16_sum);
    if (m->bf16_max != MPI_OP_NULL) MPI_Op_free(&m->bf16_max);
  }
  free(m->a2a);
  free(m);
  c->impl = NULL;
}

static const mp_comm_backend k_mpi = {
    .name = "mpi",
    .all_reduce = mpi_all_reduce,
    .all_gather = mpi_all_gather,
    .reduce_scatter = mpi_reduce_scatter,
    .all_to_all_v = mpi_all_to_all_v,
    .broadcast = mpi_broadcast,
    .send = mpi_send,
    .recv = mpi_recv,
    .sendrecv = mpi_sendrecv,
    .barrier = mpi_barrier,
    .synchronize = NULL, /* every call above is blocking */
    .destroy = mpi_destroy,
};

/* ---- creation ---- */

/* Set by mpirun (OpenMPI), mpiexec (MPICH's hydra) and srun. Not PMIX_*: an OpenMPI
 * singleton sets those itself inside MPI_Init. */
static int launched_by_mpirun(int world) {
  return world > 1 || getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") ||
         getenv("SLURM_NTASKS");
}

/* Waits for rq, a collective `what` of count elements over MPI_COMM_WORLD while the
 * communicators are made, bounded by the deadline. */
static mp_status world_wait(mp_ctx *ctx, MPI_Request *rq, const char *what, size_t count) {
  double timeout_s = 0;
  int rank = 0;
  MP_CHECK(mp_comm_read_timeout(ctx, &timeout_s));
  MP_MPI_CHECK(ctx, MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  return wait_all(ctx, NULL, rank, timeout_s, 1, rq, NULL, what, -1, -1, count, MP_COMM_DTYPE_INT64);
}

/* An all-reduce (max) over MPI_COMM_WORLD of n values of type t, bounded by the deadline. */
static mp_status world_all_reduce_max(mp_ctx *ctx, const void *send, void *recv, int n, MPI_Datatype t) {
  MPI_Request rq;
  MP_MPI_CHECK(ctx, MPI_Iallreduce(send, recv, n, t, MPI_MAX, MPI_COMM_WORLD, &rq));
  return world_wait(ctx, &rq, "all_reduce", (size_t)n);
}

/* Every rank learns whether all ranks were given the same mesh and whether the mesh fits
 * the MPI world, from one all-reduce: each decision below is then the same on every rank,
 * so either all ranks go on to split or all return the same error. */
mp_status mp_comm_mpi_agree_on_mesh(mp_ctx *ctx, const mp_mesh *mesh, int world) {
  enum { N = MP_MESH_NDIMS + 2 }; /* the dims, ep, etp */
  long long v[2 * N]; /* max of each dim, then max of its negation (= -min) */
  for (int i = 0; i < N; i++) {
    long long x = i < MP_MESH_NDIMS ? mesh->size[i] : i == MP_MESH_NDIMS ? mesh->ep : mesh->etp;
    v[i] = x;
    v[N + i] = -x;
  }
  MP_CHECK(world_all_reduce_max(ctx, MPI_IN_PLACE, v, 2 * N, MPI_LONG_LONG));
  for (int i = 0; i < N; i++)
    if (v[i] != -v[N + i])
      return mp_error(ctx, MP_ERR_INVALID,
                      "the ranks were given different meshes (%s ranges from %lld to %lld "
                      "across ranks); pass the same --mesh to every rank",
                      i < MP_MESH_NDIMS ? mp_mesh_dim_name((mp_mesh_dim)i) : i == MP_MESH_NDIMS ? "ep" : "etp", -v[N + i],
                      v[i]);
  MP_CHECK(mp_mesh_validate(ctx, mesh));
  int mw = mp_mesh_world(mesh);
  if (mw != world) {
    char f[256];
    mp_mesh_format(mesh, f, sizeof f);
    if (launched_by_mpirun(world))
      return mp_error(ctx, MP_ERR_INVALID,
                      "mesh %s has %d ranks but mpirun started %d; launch with mpirun -np %d "
                      "or choose a mesh whose dims multiply to %d",
                      f, mw, world, mw, world);
    return mp_error(ctx, MP_ERR_INVALID,
                    "mesh %s has %d ranks but this process was started without mpirun (world "
                    "size %d); launch with mpirun -np %d",
                    f, mw, world, mw);
  }
  return MP_OK;
}

mp_status mp_comm_mpi_node_allgather(mp_ctx *ctx, const void *mine, size_t bytes, void **all,
                                     int *local_rank, int *local_size) {
  int rank = 0, n = 0;
  if (all) *all = NULL;
  MP_CHECK(to_int(ctx, "node allgather", bytes, &n));
  MPI_Comm node = MPI_COMM_NULL;
  MP_MPI_CHECK(ctx, MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MP_MPI_CHECK(ctx, MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank,
                                        MPI_INFO_NULL, &node));
  int lr = 0, ls = 1, rc = MPI_Comm_rank(node, &lr);
  const char *call = "MPI_Comm_rank(node, &lr)";
  if (rc == MPI_SUCCESS) {
    rc = MPI_Comm_size(node, &ls);
    call = "MPI_Comm_size(node, &ls)";
  }
  char *buf = NULL;
  if (rc == MPI_SUCCESS && n > 0) {
    buf = (char *)calloc((size_t)ls, bytes);
    if (buf == NULL) {
      MPI_Comm_free(&node);
      return mp_error(ctx, MP_ERR_NOMEM, "out of memory gathering %zu bytes from each of %d ranks",
                      bytes, ls);
    }
    MPI_Request rq;
    rc = MPI_Iallgather(mine, n, MPI_BYTE, buf, n, MPI_BYTE, node, &rq);
    call = "MPI_Iallgather(mine, n, MPI_BYTE, buf, n, MPI_BYTE, node, &rq)";
    mp_status ws = rc == MPI_SUCCESS ? world_wait(ctx, &rq, "all_gather", bytes) : MP_OK;
    if (ws != MP_OK) return ws; /* the job ends: buf and node stay as the request left them */
  }
  MPI_Comm_free(&node);
  if (rc != MPI_SUCCESS) {
    free(buf);
    return mp_mpi_error(ctx, rc, __FILE__, __LINE__, call);
  }
  *local_rank = lr;
  *local_size = ls;
  if (all) *all = buf;
  else free(buf);
  return MP_OK;
}

mp_status mp_comm_mpi_node(mp_ctx *ctx, int *local_rank, int *local_size) {
  return mp_comm_mpi_node_allgather(ctx, NULL, 0, NULL, local_rank, local_size);
}

mp_status mp_comm_mpi_world_max(mp_ctx *ctx, const int *in, int *out, int n) {
  return world_all_reduce_max(ctx, in == out ? MPI_IN_PLACE : (const void *)in, out, n, MPI_INT);
}

mp_status mp_comm_mpi_world_bcast(mp_ctx *ctx, void *buf, size_t bytes, int root) {
  int n = 0;
  MP_CHECK(to_int(ctx, "broadcast", bytes, &n));
  MPI_Request rq;
  MP_MPI_CHECK(ctx, MPI_Ibcast(buf, n, MPI_BYTE, root, MPI_COMM_WORLD, &rq));
  return world_wait(ctx, &rq, "broadcast", (size_t)n);
}

mp_status mp_comm_create_mpi(mp_ctx *ctx, const mp_mesh *mesh, mp_comm **out) {
  mp_status st = MP_OK;
  int rank = 0, world = 0;
  double timeout_s = 0;
  *out = NULL;
  if (mesh == NULL) return mp_error(ctx, MP_ERR_INVALID, "mp_comm_create_mpi: no mesh");
  MP_CHECK(mp_comm_read_timeout(ctx, &timeout_s));
  MP_CHECK(mp_comm_mpi_world(ctx, &rank, &world));
  MP_CHECK(mp_comm_mpi_agree_on_mesh(ctx, mesh, world));

  mp_comm *c = (mp_comm *)calloc(1, sizeof *c);
  MP_CHECK_ALLOC(ctx, c);
  mp_comm_init_common(c, mesh, rank);
  c->backend = &k_mpi;
  mpi_impl *m = (mpi_impl *)calloc(1, sizeof *m);
  if (m == NULL) {
    free(c);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory creating an MPI communicator");
  }
  c->impl = m;
  m->timeout_s = timeout_s;
  for (int g = 0; g < MP_GROUP_COUNT; g++) m->comm[g] = MPI_COMM_NULL;
  m->bf16_sum = m->bf16_max = MPI_OP_NULL;
  m->a2a = (int *)malloc(4 * (size_t)world * sizeof(int));
  if (m->a2a == NULL) {
    st = mp_error(ctx, MP_ERR_NOMEM, "out of memory for all-to-all scratch of %d ranks", world);
    goto fail;
  }

  for (int g = 0; g < MP_GROUP_COUNT; g++) {
    int color = mp_mesh_group_id(mesh, (mp_group)g, rank);
    int key = mp_mesh_group_index(mesh, (mp_group)g, rank);
    int r = -1, n = -1;
    MP_MPI_CHECK_GOTO(ctx, MPI_Comm_split(MPI_COMM_WORLD, color, key, &m->comm[g]), st, fail);
    MP_MPI_CHECK_GOTO(ctx, MPI_Comm_set_errhandler(m->comm[g], MPI_ERRORS_RETURN), st, fail);
    MP_MPI_CHECK_GOTO(ctx, MPI_Comm_rank(m->comm[g], &r), st, fail);
    MP_MPI_CHECK_GOTO(ctx, MPI_Comm_size(m->comm[g], &n), st, fail);
    if (r != c->group_index[g] || n != c->group_size[g]) {
      st = mp_error(ctx, MP_ERR_INTERNAL,
                    "%s group of rank %d: MPI gives rank %d of %d, the mesh index %d of %d",
                    mp_group_name((mp_group)g), rank, r, n, c->group_index[g], c->group_size[g]);
      goto fail;
    }
  }

  MP_CHECK_GOTO(mp_comm_mpi_node(ctx, &c->local_rank, &c->local_size), st, fail);

  MP_MPI_CHECK_GOTO(ctx, MPI_Op_create(bf16_sum_fn, 1, &m->bf16_sum), st, fail);
  MP_MPI_CHECK_GOTO(ctx, MPI_Op_create(bf16_max_fn, 1, &m->bf16_max), st, fail);
  *out = c;
  return MP_OK;

fail:
  mp_comm_destroy(c);
  return st;
}
