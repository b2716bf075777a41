/* "nccl" backend: collectives on CUDA device buffers over NCCL (see comm.h).
 *
 * Creation: rank 0's ncclUniqueId goes to every rank with MPI_Bcast (made locally at world
 * size 1 without a launcher, with no MPI at all), one ncclCommInitRankConfig for the world,
 * then one ncclCommSplit per group kind with color = mp_mesh_group_id and key =
 * mp_mesh_group_index, as comm_mpi.c does with MPI_Comm_split, so a rank's NCCL rank in a
 * group communicator is its mesh group index (checked). Group kinds whose groups hold the
 * same ranks (dp_shard and fsdp when cp = 1, every kind of size 1, ...) share one
 * communicator: the decision compares this rank's group lists, and because mesh groups
 * are cosets of mesh coordinates it comes out the same on every rank, so every rank makes
 * the same sequence of splits. MESHPLAN_NCCL_SPLIT_EVERY_GROUP=1 turns sharing off (tests
 * use it to exercise ncclCommSplit at world size 1).
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
 * Invariants:
 *   - ops[head .. head+n) (mod cap) holds the collectives issued and not yet seen complete,
 *     with consecutive seq numbers done_seq+1 .. issued_seq. Each slot owns its event for
 *     the comm's lifetime; an event is re-recorded only after its op was seen complete.
 *   - A cudaEventQuery that answers cudaErrorNotReady leaves that code as CUDA's last
 *     error; it is cleared at once, so the kernel backend's launch checks
 *     (cudaGetLastError) never see it.
 *   - owned[0] is the world communicator; owned[] lists each communicator once, in
 *     creation order; comm[g] points into it. After an abort none of them is touched. */
#include <cuda_runtime.h>
#include <mpi.h>
#include <nccl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exec/comm/comm_backend.h"
#include "exec/comm/mpi_check.h"

enum { OPS_INIT = 64, SCRATCH_BYTES = 256 };
#define DEFAULT_TIMEOUT_S 600.0

typedef struct nccl_op {
  cudaEvent_t done; /* owned by the slot */
  uint64_t seq;
  const char *what; /* static string: "all_gather" */
  int group;        /* mp_group (point-to-point: MP_GROUP_WORLD) */
  int peer;         /* point-to-point peer (world rank), else -1 */
  size_t count;
  mp_comm_dtype dtype;
  double t_issue;
} nccl_op;

typedef struct nccl_impl {
  int device;
  double timeout_s;
  ncclComm_t comm[MP_GROUP_COUNT];      /* per group kind; shared ones repeat a handle */
  ncclComm_t owned[MP_GROUP_COUNT + 1]; /* each communicator once; owned[0] = world */
  int n_owned;
  ncclComm_t split_out; /* where a non-blocking ncclCommSplit writes its result */
  cudaStream_t stream;  /* the comm stream (ours) */
  cudaStream_t compute; /* the caller's (mp_comm_set_stream) */
  cudaEvent_t ready;    /* recorded on compute before a collective or a batch */
  nccl_op *ops;
  size_t cap, head, n;
  uint64_t issued_seq, done_seq;
  uint64_t batch_first; /* seq of the first collective of the open batch */
  int in_batch;
  void *scratch; /* device memory for barrier's all-reduce */
  int aborted;
  char abort_msg[MP_ERRMSG_MAX];
} nccl_impl;

#define IMPL(c) ((nccl_impl *)(c)->impl)

/* A collective as the error messages name it. */
typedef struct op_desc {
  const char *what;
  int group;
  int peer;
  size_t count;
  mp_comm_dtype dtype;
} op_desc;

/* ---- errors ---- */

static mp_status nccl_error(mp_ctx *ctx, ncclResult_t rc, const char *file, int line,
                            const char *call) {
  const char *last = ncclGetLastError(NULL);
  return mp_error(ctx, MP_ERR_NCCL, "%s:%d: %s failed: %s%s%s", file, line, call,
                  ncclGetErrorString(rc), last && *last ? ": " : "", last ? last : "");
}

static mp_status cuda_error(mp_ctx *ctx, cudaError_t e, int device, const char *file, int line,
                            const char *call) {
  return mp_error(ctx, MP_ERR_CUDA, "%s:%d: %s failed on cuda device %d: %s", file, line, call,
                  device, cudaGetErrorString(e));
}

/* NCCL errors become MP_ERR_NCCL with file:line, the call and NCCL's strings. In
 * non-blocking mode ncclInProgress is not an error: the caller settles the communicator. */
#define MP_NCCL_CHECK(ctx, call)                                                    \
  do {                                                                              \
    ncclResult_t mp_nr_ = (call);                                                   \
    if (mp_nr_ != ncclSuccess && mp_nr_ != ncclInProgress)                          \
      return nccl_error((ctx), mp_nr_, __FILE__, __LINE__, #call);                  \
  } while (0)

#define MP_CUDA_CHECK(ctx, device, call)                                            \
  do {                                                                              \
    cudaError_t mp_ce_ = (call);                                                    \
    if (mp_ce_ != cudaSuccess)                                                      \
      return cuda_error((ctx), mp_ce_, (device), __FILE__, __LINE__, #call);        \
  } while (0)

static int nccl_ok(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

/* ---- time ---- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Polling pace: spin briefly (a collective often finishes within microseconds), then
 * sleep 50 us, then 1 ms, so a long wait costs no core. */
static void backoff(int *spins) {
  int k = (*spins)++;
  if (k < 256) return;
  struct timespec ts = {0, k < 4096 ? 50000 : 1000000};
  nanosleep(&ts, NULL);
}

static mp_status read_timeout(mp_ctx *ctx, double *out) {
  const char *v = getenv("MESHPLAN_COMM_TIMEOUT_S");
  *out = DEFAULT_TIMEOUT_S;
  if (v == NULL || v[0] == '\0') return MP_OK;
  char *end = NULL;
  double t = strtod(v, &end);
  if (end == v || *end != '\0' || !(t > 0) || t > 1e9)
    return mp_error(ctx, MP_ERR_INVALID,
                    "MESHPLAN_COMM_TIMEOUT_S=%s: expected a number of seconds > 0 (default "
                    "%.0f)",
                    v, DEFAULT_TIMEOUT_S);
  *out = t;
  return MP_OK;
}

/* ---- messages ---- */

/* "dp_shard (world ranks 0 1 2 3)"; a long group shows its first and last ranks. */
static void group_words(const mp_comm *c, int g, char *buf, size_t cap) {
  const int n = c->group_size[g];
  int *r = (int *)malloc((size_t)n * sizeof(int));
  int used = snprintf(buf, cap, "%s", mp_group_name((mp_group)g));
  if (r == NULL || used < 0 || (size_t)used >= cap) {
    free(r);
    return;
  }
  mp_mesh_group_ranks(&c->mesh, (mp_group)g, c->world_rank, r);
  used += snprintf(buf + used, cap - (size_t)used, " (world rank%s", n == 1 ? "" : "s");
  for (int i = 0; i < n && (size_t)used < cap; i++) {
    if (n > 16 && i == 8) {
      used += snprintf(buf + used, cap - (size_t)used, " ...");
      i = n - 4;
    }
    used += snprintf(buf + used, cap - (size_t)used, " %d", r[i]);
  }
  if ((size_t)used < cap) snprintf(buf + used, cap - (size_t)used, ")");
  free(r);
}

/* "rank 3: all_gather of 4096 bf16 elements on group dp_shard (world ranks 0 1 2 3)" */
static void describe(const mp_comm *c, const op_desc *d, char *buf, size_t cap) {
  char gw[256];
  if (d->peer >= 0) {
    const char *dir = strcmp(d->what, "send") == 0   ? "to"
                      : strcmp(d->what, "recv") == 0 ? "from"
                                                     : "with";
    snprintf(buf, cap, "rank %d: %s of %zu %s elements %s rank %d", c->world_rank, d->what,
             d->count, mp_comm_dtype_name(d->dtype), dir, d->peer);
    return;
  }
  group_words(c, d->group, gw, sizeof gw);
  snprintf(buf, cap, "rank %d: %s of %zu %s elements on group %s", c->world_rank, d->what,
           d->count, mp_comm_dtype_name(d->dtype), gw);
}

/* waited >= the timeout; the message names the limit, which is what the user set. */
static mp_status timeout_error(mp_ctx *ctx, const mp_comm *c, const op_desc *d, double waited) {
  (void)waited;
  char what[512];
  describe(c, d, what, sizeof what);
  const char *who = d->peer >= 0 ? "the peer rank died, is stuck, or never made the matching "
                                   "call"
                                 : "a peer rank died or is stuck";
  return mp_error(ctx, MP_ERR_NCCL,
                  "%s did not complete within %g s: %s; every rank of a group must make the "
                  "same collective calls in the same order (MESHPLAN_COMM_TIMEOUT_S sets the "
                  "limit in seconds)",
                  what, IMPL(c)->timeout_s, who);
}

static mp_status async_error(mp_ctx *ctx, const mp_comm *c, const op_desc *d,
                             ncclResult_t st) {
  char what[512];
  describe(c, d, what, sizeof what);
  const char *last = ncclGetLastError(NULL);
  return mp_error(ctx, MP_ERR_NCCL, "%s failed: NCCL reports %s%s%s%s", what,
                  ncclGetErrorString(st), last && *last ? " (" : "", last ? last : "",
                  last && *last ? ")" : "");
}

/* An error pending on communicator comm, found while doing `doing`. */
static mp_status comm_error(mp_ctx *ctx, const mp_comm *c, ncclComm_t comm, const char *doing,
                            ncclResult_t st) {
  const nccl_impl *m = IMPL(c);
  char names[160] = "", gw[256] = "";
  size_t used = 0;
  for (int g = 0; g < MP_GROUP_COUNT && used < sizeof names; g++)
    if (m->comm[g] == comm) {
      if (gw[0] == '\0') group_words(c, g, gw, sizeof gw);
      used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", used ? "/" : "",
                               mp_group_name((mp_group)g));
    }
  const char *last = ncclGetLastError(NULL);
  return mp_error(ctx, MP_ERR_NCCL,
                  "rank %d: NCCL reports %s%s%s%s on the communicator of group %s %s, noticed "
                  "during %s: a peer rank may have died or hit an error",
                  c->world_rank, ncclGetErrorString(st), last && *last ? " (" : "",
                  last ? last : "", last && *last ? ")" : "", names,
                  strchr(gw, '(') ? strchr(gw, '(') : "", doing);
}

static void abort_comms(nccl_impl *m) {
  if (m->aborted) return;
  for (int i = m->n_owned - 1; i >= 0; i--)
    if (m->owned[i]) (void)ncclCommAbort(m->owned[i]);
  m->aborted = 1;
}

/* Ends every NCCL communicator of c: kernels waiting on a dead peer return, and every
 * later call on c fails with the message now on ctx. */
static mp_status fail_abort(mp_ctx *ctx, mp_comm *c, mp_status st) {
  nccl_impl *m = IMPL(c);
  if (!m->aborted) {
    abort_comms(m);
    char msg[MP_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", mp_errmsg(ctx));
    mp_error(ctx, st, "%s; the NCCL communicators were aborted, so this communicator is "
             "unusable: destroy it and end the job",
             msg);
    snprintf(m->abort_msg, sizeof m->abort_msg, "%s", mp_errmsg(ctx));
  }
  return st;
}

static mp_status aborted_error(mp_ctx *ctx, const mp_comm *c, const char *what) {
  return mp_error(ctx, MP_ERR_NCCL, "rank %d: %s refused: this communicator was aborted after "
                  "an earlier failure: %s",
                  c->world_rank, what, IMPL(c)->abort_msg);
}

/* ---- polling ---- */

/* Waits until comm has left ncclInProgress (a non-blocking call is enqueued, a
 * communicator made), at most the timeout. Does not abort: the caller decides. */
static mp_status settle(mp_ctx *ctx, const mp_comm *c, ncclComm_t comm, const op_desc *d,
                        double timeout_s) {
  double t0 = now_s();
  int spins = 0;
  for (;;) {
    ncclResult_t st = ncclSuccess;
    MP_NCCL_CHECK(ctx, ncclCommGetAsyncError(comm, &st));
    if (st == ncclSuccess) return MP_OK;
    if (st != ncclInProgress) return async_error(ctx, c, d, st);
    double waited = now_s() - t0;
    if (waited > timeout_s) return timeout_error(ctx, c, d, waited);
    backoff(&spins);
  }
}

/* Any communicator of c with an error pending (a peer's death shows up here). */
static mp_status check_async(mp_ctx *ctx, const mp_comm *c, const char *doing) {
  const nccl_impl *m = IMPL(c);
  for (int i = 0; i < m->n_owned; i++) {
    ncclResult_t st = ncclSuccess;
    MP_NCCL_CHECK(ctx, ncclCommGetAsyncError(m->owned[i], &st));
    if (st != ncclSuccess && st != ncclInProgress)
      return comm_error(ctx, c, m->owned[i], doing, st);
  }
  return MP_OK;
}

static op_desc desc_of(const nccl_op *op) {
  op_desc d = {op->what, op->group, op->peer, op->count, op->dtype};
  return d;
}

/* Retires the collectives that have completed, oldest first. */
static mp_status reap(mp_ctx *ctx, mp_comm *c) {
  nccl_impl *m = IMPL(c);
  while (m->n > 0) {
    nccl_op *op = &m->ops[m->head];
    cudaError_t e = cudaEventQuery(op->done);
    if (e == cudaErrorNotReady) {
      (void)cudaGetLastError(); /* "not ready" is an answer, not an error to leave behind */
      return MP_OK;
    }
    if (e != cudaSuccess) {
      char what[512];
      op_desc d = desc_of(op);
      describe(c, &d, what, sizeof what);
      return mp_error(ctx, MP_ERR_CUDA, "%s failed on cuda device %d: %s", what, m->device,
                      cudaGetErrorString(e));
    }
    m->done_seq = op->seq;
    m->head = (m->head + 1) % m->cap;
    m->n--;
  }
  return MP_OK;
}

/* Without blocking: retire what completed, and fail if the oldest pending collective has
 * been pending longer than the timeout or a communicator reports an error. */
static mp_status health(mp_ctx *ctx, mp_comm *c, const char *doing) {
  nccl_impl *m = IMPL(c);
  MP_CHECK(reap(ctx, c));
  if (m->n > 0) {
    const nccl_op *op = &m->ops[m->head];
    double age = now_s() - op->t_issue;
    op_desc hd = desc_of(op);
    if (age > m->timeout_s) return timeout_error(ctx, c, &hd, age);
  }
  return check_async(ctx, c, doing);
}

/* Waits on the host until every collective up to seq `upto` has completed. The deadline
 * restarts whenever one completes: it bounds a wait without progress. */
static mp_status host_wait(mp_ctx *ctx, mp_comm *c, uint64_t upto) {
  nccl_impl *m = IMPL(c);
  double last = now_s();
  uint64_t seen = m->done_seq;
  int spins = 0;
  for (;;) {
    MP_CHECK(reap(ctx, c));
    if (m->done_seq >= upto) return MP_OK;
    op_desc hd = desc_of(&m->ops[m->head]);
    MP_CHECK(check_async(ctx, c, hd.what));
    double t = now_s();
    if (m->done_seq != seen) {
      seen = m->done_seq;
      last = t;
      spins = 0;
    } else if (t - last > m->timeout_s) {
      return timeout_error(ctx, c, &hd, t - last);
    }
    backoff(&spins);
  }
}

/* ---- the FIFO of issued collectives ---- */

static mp_status ops_grow(mp_ctx *ctx, nccl_impl *m) {
  size_t ncap = m->cap ? 2 * m->cap : OPS_INIT;
  nccl_op *o = (nccl_op *)calloc(ncap, sizeof *o);
  MP_CHECK_ALLOC(ctx, o);
  /* pending ops first, in order, then the idle slots: every old event is kept */
  for (size_t i = 0; i < m->cap; i++) o[i] = m->ops[(m->head + i) % m->cap];
  for (size_t i = m->cap; i < ncap; i++) {
    cudaError_t e = cudaEventCreateWithFlags(&o[i].done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      for (size_t k = m->cap; k < i; k++) cudaEventDestroy(o[k].done);
      free(o);
      return cuda_error(ctx, e, m->device, __FILE__, __LINE__, "cudaEventCreateWithFlags");
    }
  }
  free(m->ops);
  m->ops = o;
  m->head = 0;
  m->cap = ncap;
  return MP_OK;
}

static mp_status ops_push(mp_ctx *ctx, mp_comm *c, const op_desc *d, nccl_op **out) {
  nccl_impl *m = IMPL(c);
  if (m->n == m->cap) MP_CHECK(reap(ctx, c));
  if (m->n == m->cap) MP_CHECK(ops_grow(ctx, m));
  nccl_op *op = &m->ops[(m->head + m->n) % m->cap];
  op->seq = ++m->issued_seq;
  op->what = d->what;
  op->group = d->group;
  op->peer = d->peer;
  op->count = d->count;
  op->dtype = d->dtype;
  op->t_issue = now_s();
  m->n++;
  *out = op;
  return MP_OK;
}

/* ---- issuing a collective ---- */

/* Before the NCCL call: fail fast after an abort, notice a failure already known, and
 * order the comm stream after the compute stream (a batch did that at its begin). */
static mp_status op_begin(mp_ctx *ctx, mp_comm *c, const op_desc *d) {
  nccl_impl *m = IMPL(c);
  if (m->aborted) return aborted_error(ctx, c, d->what);
  mp_status st = health(ctx, c, d->what);
  if (st != MP_OK) return fail_abort(ctx, c, st);
  if (!m->in_batch) {
    cudaError_t e = cudaEventRecord(m->ready, m->compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(m->stream, m->ready, 0);
    if (e != cudaSuccess)
      return fail_abort(ctx, c, cuda_error(ctx, e, m->device, __FILE__, __LINE__,
                                           "ordering the comm stream after the compute stream"));
  }
  return MP_OK;
}

/* After the NCCL call(s) that returned rc on communicator comm: wait until they are
 * enqueued, record their completion, and (outside a batch) make compute wait for it. */
static mp_status op_end(mp_ctx *ctx, mp_comm *c, const op_desc *d, ncclComm_t comm,
                        ncclResult_t rc, const char *call, int line) {
  nccl_impl *m = IMPL(c);
  if (!nccl_ok(rc)) return fail_abort(ctx, c, nccl_error(ctx, rc, __FILE__, line, call));
  mp_status st = settle(ctx, c, comm, d, m->timeout_s);
  if (st != MP_OK) return fail_abort(ctx, c, st);
  nccl_op *op = NULL;
  st = ops_push(ctx, c, d, &op);
  if (st != MP_OK) return fail_abort(ctx, c, st);
  cudaError_t e = cudaEventRecord(op->done, m->stream);
  if (e == cudaSuccess && !m->in_batch) e = cudaStreamWaitEvent(m->compute, op->done, 0);
  if (e != cudaSuccess)
    return fail_abort(ctx, c, cuda_error(ctx, e, m->device, __FILE__, __LINE__,
                                         "recording a collective's completion"));
  return MP_OK;
}

static ncclDataType_t nccl_type(mp_comm_dtype t) {
  switch (t) {
    case MP_COMM_DTYPE_INT64: return ncclInt64;
    case MP_COMM_DTYPE_BF16: return ncclBfloat16;
    case MP_COMM_DTYPE_FP32:
    default: return ncclFloat32;
  }
}

static ncclRedOp_t nccl_op_of(mp_comm_op op) { return op == MP_COMM_OP_MAX ? ncclMax : ncclSum; }

/* ---- collectives ---- */

static mp_status nccl_all_reduce(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                 void *recv, size_t count, mp_comm_dtype t, mp_comm_op op) {
  nccl_impl *m = IMPL(c);
  op_desc d = {"all_reduce", g, -1, count, t};
  MP_CHECK(op_begin(ctx, c, &d));
  ncclResult_t rc =
      ncclAllReduce(send, recv, count, nccl_type(t), nccl_op_of(op), m->comm[g], m->stream);
  return op_end(ctx, c, &d, m->comm[g], rc, "ncclAllReduce", __LINE__);
}

static mp_status nccl_all_gather(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                 void *recv, size_t count, mp_comm_dtype t) {
  nccl_impl *m = IMPL(c);
  op_desc d = {"all_gather", g, -1, count, t};
  MP_CHECK(op_begin(ctx, c, &d));
  ncclResult_t rc = ncclAllGather(send, recv, count, nccl_type(t), m->comm[g], m->stream);
  return op_end(ctx, c, &d, m->comm[g], rc, "ncclAllGather", __LINE__);
}

static mp_status nccl_reduce_scatter(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                     void *recv, size_t recv_count, mp_comm_dtype t,
                                     mp_comm_op op) {
  nccl_impl *m = IMPL(c);
  op_desc d = {"reduce_scatter", g, -1, recv_count, t};
  MP_CHECK(op_begin(ctx, c, &d));
  ncclResult_t rc = ncclReduceScatter(send, recv, recv_count, nccl_type(t), nccl_op_of(op),
                                      m->comm[g], m->stream);
  return op_end(ctx, c, &d, m->comm[g], rc, "ncclReduceScatter", __LINE__);
}

/* One ncclGroupStart/End of ncclSend/ncclRecv per peer with data; this rank's own segment
 * is a device copy on the comm stream (no NCCL self-connection needed). */
static mp_status nccl_all_to_all_v(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                   const int64_t *send_counts, const int64_t *send_displs,
                                   void *recv, const int64_t *recv_counts,
                                   const int64_t *recv_displs, mp_comm_dtype t) {
  nccl_impl *m = IMPL(c);
  const int n = c->group_size[g], me = c->group_index[g];
  const size_t b = mp_comm_dtype_bytes(t);
  if (send_counts[me] != recv_counts[me])
    return mp_error(ctx, MP_ERR_INVALID,
                    "all_to_all_v: this rank sends %lld elements to itself but expects %lld",
                    (long long)send_counts[me], (long long)recv_counts[me]);
  int64_t total = 0;
  for (int j = 0; j < n; j++) total += send_counts[j];
  op_desc d = {"all_to_all_v", g, -1, (size_t)total, t};
  MP_CHECK(op_begin(ctx, c, &d));
  if (send_counts[me] > 0) {
    cudaError_t e = cudaMemcpyAsync((char *)recv + (size_t)recv_displs[me] * b,
                                    (const char *)send + (size_t)send_displs[me] * b,
                                    (size_t)send_counts[me] * b, cudaMemcpyDeviceToDevice,
                                    m->stream);
    if (e != cudaSuccess)
      return fail_abort(ctx, c, cuda_error(ctx, e, m->device, __FILE__, __LINE__,
                                           "all_to_all_v: copying this rank's own segment"));
  }
  ncclResult_t rc = ncclSuccess;
  if (n > 1) {
    rc = ncclGroupStart();
    for (int j = 0; j < n && nccl_ok(rc); j++) {
      if (j == me) continue;
      if (send_counts[j] > 0)
        rc = ncclSend((const char *)send + (size_t)send_displs[j] * b, (size_t)send_counts[j],
                      nccl_type(t), j, m->comm[g], m->stream);
      if (nccl_ok(rc) && recv_counts[j] > 0)
        rc = ncclRecv((char *)recv + (size_t)recv_displs[j] * b, (size_t)recv_counts[j],
                      nccl_type(t), j, m->comm[g], m->stream);
    }
    ncclResult_t end = ncclGroupEnd(); /* always closes the group, even after an error */
    if (nccl_ok(rc)) rc = end;
  }
  return op_end(ctx, c, &d, m->comm[g], rc, "ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd",
                __LINE__);
}

static mp_status nccl_broadcast(mp_ctx *ctx, mp_comm *c, mp_group g, void *buf, size_t count,
                                mp_comm_dtype t, int root) {
  nccl_impl *m = IMPL(c);
  op_desc d = {"broadcast", g, -1, count, t};
  MP_CHECK(op_begin(ctx, c, &d));
  ncclResult_t rc = ncclBroadcast(buf, buf, count, nccl_type(t), root, m->comm[g], m->stream);
  return op_end(ctx, c, &d, m->comm[g], rc, "ncclBroadcast", __LINE__);
}

static mp_status nccl_send(mp_ctx *ctx, mp_comm *c, const void *buf, size_t count,
                           mp_comm_dtype t, int peer) {
  nccl_impl *m = IMPL(c);
  op_desc d = {"send", MP_GROUP_WORLD, peer, count, t};
  MP_CHECK(op_begin(ctx, c, &d));
  ncclComm_t w = m->comm[MP_GROUP_WORLD];
  ncclResult_t rc = ncclSend(buf, count, nccl_type(t), peer, w, m->stream);
  return op_end(ctx, c, &d, w, rc, "ncclSend", __LINE__);
}

static mp_status nccl_recv(mp_ctx *ctx, mp_comm *c, void *buf, size_t count, mp_comm_dtype t,
                           int peer) {
  nccl_impl *m = IMPL(c);
  op_desc d = {"recv", MP_GROUP_WORLD, peer, count, t};
  MP_CHECK(op_begin(ctx, c, &d));
  ncclComm_t w = m->comm[MP_GROUP_WORLD];
  ncclResult_t rc = ncclRecv(buf, count, nccl_type(t), peer, w, m->stream);
  return op_end(ctx, c, &d, w, rc, "ncclRecv", __LINE__);
}

static mp_status nccl_sendrecv(mp_ctx *ctx, mp_comm *c, const void *send, size_t send_count,
                               int dst, void *recv, size_t recv_count, int src,
                               mp_comm_dtype t) {
  nccl_impl *m = IMPL(c);
  const int me = c->world_rank;
  if ((dst == me) != (src == me))
    return mp_error(ctx, MP_ERR_INVALID,
                    "sendrecv: rank %d sends to rank %d but receives from rank %d; with NCCL a "
                    "rank sends to itself only when it also receives from itself",
                    me, dst, src);
  if (dst == me && send_count != recv_count)
    return mp_error(ctx, MP_ERR_INVALID,
                    "sendrecv: this rank sends %zu elements to itself but expects %zu",
                    send_count, recv_count);
  op_desc d = {"sendrecv", MP_GROUP_WORLD, src, recv_count, t};
  MP_CHECK(op_begin(ctx, c, &d));
  ncclComm_t w = m->comm[MP_GROUP_WORLD];
  ncclResult_t rc = ncclSuccess;
  if (dst == me) {
    if (send_count > 0 && send != recv) {
      cudaError_t e = cudaMemcpyAsync(recv, send, send_count * mp_comm_dtype_bytes(t),
                                      cudaMemcpyDeviceToDevice, m->stream);
      if (e != cudaSuccess)
        return fail_abort(ctx, c, cuda_error(ctx, e, m->device, __FILE__, __LINE__,
                                             "sendrecv: copying to itself"));
    }
  } else {
    rc = ncclGroupStart();
    if (nccl_ok(rc)) rc = ncclSend(send, send_count, nccl_type(t), dst, w, m->stream);
    if (nccl_ok(rc)) rc = ncclRecv(recv, recv_count, nccl_type(t), src, w, m->stream);
    ncclResult_t end = ncclGroupEnd();
    if (nccl_ok(rc)) rc = end;
  }
  return op_end(ctx, c, &d, w, rc, "ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd", __LINE__);
}

static mp_status nccl_barrier(mp_ctx *ctx, mp_comm *c, mp_group g) {
  nccl_impl *m = IMPL(c);
  op_desc d = {"barrier", g, -1, 1, MP_COMM_DTYPE_FP32};
  MP_CHECK(op_begin(ctx, c, &d));
  ncclResult_t rc = ncclAllReduce(m->scratch, m->scratch, 1, ncclFloat32, ncclSum, m->comm[g],
                                  m->stream);
  MP_CHECK(op_end(ctx, c, &d, m->comm[g], rc, "ncclAllReduce (barrier)", __LINE__));
  mp_status st = host_wait(ctx, c, m->issued_seq);
  return st == MP_OK ? MP_OK : fail_abort(ctx, c, st);
}

static mp_status nccl_synchronize(mp_ctx *ctx, mp_comm *c) {
  nccl_impl *m = IMPL(c);
  if (m->aborted) return aborted_error(ctx, c, "synchronize");
  mp_status st = host_wait(ctx, c, m->issued_seq);
  return st == MP_OK ? MP_OK : fail_abort(ctx, c, st);
}

/* ---- overlap ---- */

static mp_status nccl_async_begin(mp_ctx *ctx, mp_comm *c) {
  nccl_impl *m = IMPL(c);
  op_desc d = {"async_begin", MP_GROUP_WORLD, -1, 0, MP_COMM_DTYPE_FP32};
  MP_CHECK(op_begin(ctx, c, &d)); /* orders the comm stream after compute, once */
  m->in_batch = 1;
  m->batch_first = m->issued_seq + 1;
  return MP_OK;
}

static mp_status nccl_async_end(mp_ctx *ctx, mp_comm *c, mp_comm_req *req) {
  nccl_impl *m = IMPL(c);
  m->in_batch = 0;
  req->seq = m->issued_seq >= m->batch_first ? m->issued_seq : 0;
  if (m->aborted) {
    req->seq = 0;
    return aborted_error(ctx, c, "async_end");
  }
  return MP_OK;
}

static mp_status nccl_wait(mp_ctx *ctx, mp_comm *c, const mp_comm_req *req) {
  nccl_impl *m = IMPL(c);
  if (m->aborted) return aborted_error(ctx, c, "wait");
  if (req->seq > m->issued_seq)
    return mp_error(ctx, MP_ERR_INVALID,
                    "wait: request %llu was not issued on this communicator (last is %llu)",
                    (unsigned long long)req->seq, (unsigned long long)m->issued_seq);
  mp_status st = reap(ctx, c);
  if (st != MP_OK) return fail_abort(ctx, c, st);
  if (req->seq > m->done_seq) { /* still pending: its slot is in the FIFO */
    const nccl_op *op = &m->ops[(m->head + (size_t)(req->seq - m->ops[m->head].seq)) % m->cap];
    cudaError_t e = cudaStreamWaitEvent(m->compute, op->done, 0);
    if (e != cudaSuccess)
      return fail_abort(ctx, c, cuda_error(ctx, e, m->device, __FILE__, __LINE__,
                                           "making the compute stream wait for a batch"));
  }
  st = health(ctx, c, "wait");
  return st == MP_OK ? MP_OK : fail_abort(ctx, c, st);
}

static void nccl_set_stream(mp_comm *c, void *cuda_stream) {
  IMPL(c)->compute = (cudaStream_t)cuda_stream;
}

/* ---- lifetime ---- */

static void nccl_destroy(mp_comm *c) {
  nccl_impl *m = IMPL(c);
  if (m == NULL) return;
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  cudaSetDevice(m->device);
  if (!m->aborted && m->n_owned > 0) {
    /* Complete what was issued, then finalize each communicator (non-blocking: poll);
     * anything that does not finish within the timeout is aborted instead. */
    mp_status st = m->n > 0 ? host_wait(&ctx, c, m->issued_seq) : MP_OK;
    for (int i = m->n_owned - 1; i >= 0; i--) {
      ncclComm_t comm = m->owned[i];
      op_desc d = {"ncclCommFinalize", MP_GROUP_WORLD, -1, 0, MP_COMM_DTYPE_FP32};
      if (st == MP_OK && nccl_ok(ncclCommFinalize(comm)) &&
          settle(&ctx, c, comm, &d, m->timeout_s) == MP_OK)
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

static const mp_comm_backend k_nccl = {
    .name = "nccl",
    .all_reduce = nccl_all_reduce,
    .all_gather = nccl_all_gather,
    .reduce_scatter = nccl_reduce_scatter,
    .all_to_all_v = nccl_all_to_all_v,
    .broadcast = nccl_broadcast,
    .send = nccl_send,
    .recv = nccl_recv,
    .sendrecv = nccl_sendrecv,
    .barrier = nccl_barrier,
    .synchronize = nccl_synchronize,
    .async_begin = nccl_async_begin,
    .async_end = nccl_async_end,
    .wait = nccl_wait,
    .set_stream = nccl_set_stream,
    .destroy = nccl_destroy,
};

int mp_comm_nccl_built(void) { return 1; }

int mp_comm_nccl_comm_count(const mp_comm *c) {
  return c && c->backend == &k_nccl ? IMPL(c)->n_owned : 0;
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
  MP_MPI_CHECK(ctx, MPI_Comm_rank(MPI_COMM_WORLD, &rank));
  MPI_Comm node = MPI_COMM_NULL;
  MP_MPI_CHECK(ctx, MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL,
                                        &node));
  int lr = 0, ls = 1;
  char *all = NULL;
  int rc = MPI_Comm_rank(node, &lr);
  if (rc == MPI_SUCCESS) rc = MPI_Comm_size(node, &ls);
  if (rc == MPI_SUCCESS) {
    all = (char *)calloc((size_t)ls, BUS_ID_LEN);
    if (all == NULL) {
      MPI_Comm_free(&node);
      return mp_error(ctx, MP_ERR_NOMEM, "out of memory gathering the GPUs of %d ranks", ls);
    }
    rc = MPI_Allgather(bus, BUS_ID_LEN, MPI_CHAR, all, BUS_ID_LEN, MPI_CHAR, node);
  }
  MPI_Comm_free(&node);
  if (rc != MPI_SUCCESS) {
    free(all);
    MP_MPI_CHECK(ctx, rc);
  }
  int distinct = 0;
  for (int i = 0; i < ls; i++) {
    int first = 1;
    for (int k = 0; k < i && first; k++)
      if (strcmp(all + (size_t)k * BUS_ID_LEN, all + (size_t)i * BUS_ID_LEN) == 0) first = 0;
    distinct += first;
  }
  free(all);
  int flags[2] = {bad, distinct < ls}, any[2] = {0, 0};
  MP_MPI_CHECK(ctx, MPI_Allreduce(flags, any, 2, MPI_INT, MPI_MAX, MPI_COMM_WORLD));
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
    if (!nccl_ok(rc)) {
      st = nccl_error(ctx, rc, __FILE__, __LINE__, "ncclCommSplit");
      break;
    }
    /* non-blocking: the parent is busy until the split is done, then split_out is set */
    st = settle(ctx, c, m->owned[0], &d, m->timeout_s);
    if (st == MP_OK && m->split_out == NULL)
      st = mp_error(ctx, MP_ERR_INTERNAL, "ncclCommSplit for group %s returned no communicator",
                    mp_group_name((mp_group)g));
    if (st == MP_OK) {
      m->owned[m->n_owned++] = m->split_out;
      m->comm[g] = m->split_out;
      st = settle(ctx, c, m->split_out, &d, m->timeout_s);
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

/* ncclUniqueId from rank 0 to all, with rank 0's verdict, so all fail together. */
typedef struct boot_msg {
  int ok;
  ncclUniqueId id;
  char err[200];
} boot_msg;

mp_status mp_comm_create_nccl(mp_ctx *ctx, const mp_mesh *mesh, int cuda_device,
                              void *cuda_stream, mp_comm **out) {
  *out = NULL;
  if (mesh == NULL) return mp_error(ctx, MP_ERR_INVALID, "mp_comm_create_nccl: no mesh");
  MP_CHECK(mp_mesh_validate(ctx, mesh));
  double timeout_s = DEFAULT_TIMEOUT_S;
  MP_CHECK(read_timeout(ctx, &timeout_s));
  const int world = mp_mesh_world(mesh), use_mpi = mp_comm_env_launched() || world > 1;
  int rank = 0, local_rank = 0, local_size = 1;
  if (use_mpi) {
    int mw = 0;
    MP_CHECK(mp_comm_mpi_init(ctx, NULL, NULL));
    MP_MPI_CHECK(ctx, MPI_Comm_rank(MPI_COMM_WORLD, &rank));
    MP_MPI_CHECK(ctx, MPI_Comm_size(MPI_COMM_WORLD, &mw));
    MP_CHECK(mp_comm_mpi_agree_on_mesh(ctx, mesh, mw));
    mp_comm_node_gpus ng;
    MP_CHECK(mp_comm_nccl_node_gpus(ctx, cuda_device, &ng)); /* also makes the device current */
    if (ng.shared_anywhere) {
      if (ng.shared_here)
        return mp_error(ctx, MP_ERR_UNSUPPORTED,
                        "rank %d: %d ranks share %d GPU%s on this node; NCCL refuses two ranks "
                        "of one communicator on one GPU: give every rank its own GPU, or let "
                        "mp_comm_create_for_device stage collectives through MPI",
                        rank, ng.local_size, ng.node_gpus, ng.node_gpus == 1 ? "" : "s");
      return mp_error(ctx, MP_ERR_UNSUPPORTED,
                      "rank %d: ranks of another node share a GPU; NCCL refuses two ranks of "
                      "one communicator on one GPU: give every rank its own GPU, or let "
                      "mp_comm_create_for_device stage collectives through MPI",
                      rank);
    }
    local_rank = ng.local_rank;
    local_size = ng.local_size;
  } else {
    MP_CUDA_CHECK(ctx, cuda_device, cudaSetDevice(cuda_device));
  }

  boot_msg boot;
  memset(&boot, 0, sizeof boot);
  if (rank == 0) {
    ncclResult_t rc = ncclGetUniqueId(&boot.id);
    boot.ok = rc == ncclSuccess;
    if (!boot.ok)
      snprintf(boot.err, sizeof boot.err, "%s", ncclGetErrorString(rc));
  }
  if (use_mpi)
    MP_MPI_CHECK(ctx, MPI_Bcast(&boot, (int)sizeof boot, MPI_BYTE, 0, MPI_COMM_WORLD));
  if (!boot.ok)
    return mp_error(ctx, MP_ERR_NCCL,
                    "rank %d: rank 0 could not make the NCCL unique id: %s (NCCL_DEBUG=WARN "
                    "says more; NCCL_SOCKET_IFNAME picks the network interface)",
                    rank, boot.err);

  mp_status st = MP_OK;
  mp_comm *c = (mp_comm *)calloc(1, sizeof *c);
  nccl_impl *m = (nccl_impl *)calloc(1, sizeof *m);
  if (c == NULL || m == NULL) {
    free(c);
    free(m);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory creating an NCCL communicator");
  }
  mp_comm_init_common(c, mesh, rank);
  c->local_rank = local_rank;
  c->local_size = local_size;
  c->backend = &k_nccl;
  c->impl = m;
  m->device = cuda_device;
  m->timeout_s = timeout_s;
  m->compute = (cudaStream_t)cuda_stream;

  {
    /* high priority: a ready collective's kernels go ahead of queued compute kernels */
    int lo = 0, hi = 0;
    cudaError_t e = cudaDeviceGetStreamPriorityRange(&lo, &hi);
    if (e == cudaSuccess) e = cudaStreamCreateWithPriority(&m->stream, cudaStreamNonBlocking, hi);
    if (e == cudaSuccess) e = cudaEventCreateWithFlags(&m->ready, cudaEventDisableTiming);
    if (e == cudaSuccess) e = cudaMalloc(&m->scratch, SCRATCH_BYTES);
    if (e == cudaSuccess) e = cudaMemset(m->scratch, 0, SCRATCH_BYTES);
    if (e != cudaSuccess) {
      st = cuda_error(ctx, e, cuda_device, __FILE__, __LINE__,
                      "creating the comm stream, its event and scratch");
      goto fail;
    }
  }
  MP_CHECK_GOTO(ops_grow(ctx, m), st, fail);

  {
    ncclConfig_t cfg = NCCL_CONFIG_INITIALIZER;
    cfg.blocking = 0; /* never block the host: every wait is ours, with a deadline */
    ncclComm_t w = NULL;
    op_desc d = {"ncclCommInitRankConfig", MP_GROUP_WORLD, -1, 0, MP_COMM_DTYPE_FP32};
    ncclResult_t rc = ncclCommInitRankConfig(&w, world, boot.id, rank, &cfg);
    if (w != NULL) m->owned[m->n_owned++] = w;
    if (!nccl_ok(rc) || w == NULL) {
      st = nccl_error(ctx, nccl_ok(rc) ? ncclInternalError : rc, __FILE__, __LINE__,
                      "ncclCommInitRankConfig");
      goto fail;
    }
    MP_CHECK_GOTO(settle(ctx, c, w, &d, m->timeout_s), st, fail);
  }
  MP_CHECK_GOTO(make_groups(ctx, c), st, fail);
  *out = c;
  return MP_OK;

fail:
  abort_comms(m); /* the other ranks see this one go and fail too */
  mp_comm_destroy(c);
  return st;
}
