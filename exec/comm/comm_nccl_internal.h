/* The "nccl" backend's shared state and internal calls, for its four files only:
 *   comm_nccl_poll.c   errors, time, messages, polling (completion, async errors, abort)
 *   comm_nccl_fifo.c   the FIFO of issued collectives and issuing one
 *   comm_nccl_coll.c   the collectives, the overlap API and the backend table
 *   comm_nccl.c        creation (bootstrap, communicators per group), node GPUs, destroy
 * The design (streams, non-blocking NCCL, the timeout, the abort) is described at the top
 * of comm_nccl.c.
 *
 * Invariants:
 *   - ops[head .. head+n) (mod cap) holds the collectives issued and not yet seen complete,
 *     with consecutive seq numbers done_seq+1 .. issued_seq. Each slot owns its event for
 *     the comm's lifetime; an event is re-recorded only after its op was seen complete.
 *   - A cudaEventQuery that answers cudaErrorNotReady leaves that code as CUDA's last
 *     error; it is cleared at once, so the kernel backend's launch checks
 *     (cudaGetLastError) never see it.
 *   - owned[0] is the world communicator; owned[] lists each communicator once, in
 *     creation order; comm[g] points into it. After an abort none of them is touched.
 * Built only where NCCL is (exec/comm/BUILD: NCCL_AVAILABLE). */
#ifndef MP_EXEC_COMM_COMM_NCCL_INTERNAL_H
#define MP_EXEC_COMM_COMM_NCCL_INTERNAL_H

#include <cuda_runtime.h>
#include <nccl.h>
#include <stddef.h>
#include <stdint.h>

#include "exec/comm/comm_backend.h"
#include "kernels/cuda/cuda_check.h"

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

/* The backend table (comm_nccl_coll.c). */
extern const mp_comm_backend mp_nccl_backend;

/* ---- errors (comm_nccl_poll.c) ---- */

/* Records "file:line: call failed: <NCCL's string>: <ncclGetLastError>" and returns
 * MP_ERR_NCCL. */
mp_status mp_nccl_error(mp_ctx *ctx, ncclResult_t rc, const char *file, int line,
                        const char *call);

/* NCCL errors become MP_ERR_NCCL with file:line, the call and NCCL's strings. In
 * non-blocking mode ncclInProgress is not an error: the caller settles the communicator. */
#define MP_NCCL_CHECK(ctx, call)                                                    \
  do {                                                                              \
    ncclResult_t mp_nr_ = (call);                                                   \
    if (mp_nr_ != ncclSuccess && mp_nr_ != ncclInProgress)                          \
      return mp_nccl_error((ctx), mp_nr_, __FILE__, __LINE__, #call);               \
  } while (0)

static inline int mp_nccl_ok(ncclResult_t r) { return r == ncclSuccess || r == ncclInProgress; }

/* Seconds on the monotonic clock. */
double mp_nccl_now_s(void);

/* Aborts every communicator of m once (ncclCommAbort makes kernels stuck on a dead peer
 * return); afterwards none is touched. */
void mp_nccl_abort_comms(nccl_impl *m);
/* Aborts c's communicators, appends to the message on ctx that c is unusable, keeps that
 * message for later calls, and returns st. */
mp_status mp_nccl_fail_abort(mp_ctx *ctx, mp_comm *c, mp_status st);
/* MP_ERR_NCCL: `what` refused because c was aborted (with the abort's message). */
mp_status mp_nccl_aborted_error(mp_ctx *ctx, const mp_comm *c, const char *what);

/* ---- polling (comm_nccl_poll.c) ---- */

/* Waits until comm has left ncclInProgress (a non-blocking call is enqueued, a
 * communicator made), at most timeout_s. Does not abort: the caller decides. */
mp_status mp_nccl_settle(mp_ctx *ctx, const mp_comm *c, ncclComm_t comm, const op_desc *d,
                         double timeout_s);
/* Retires the collectives that have completed, oldest first. */
mp_status mp_nccl_reap(mp_ctx *ctx, mp_comm *c);
/* Without blocking: retires what completed, and fails if the oldest pending collective has
 * been pending longer than the timeout or a communicator reports an error. */
mp_status mp_nccl_health(mp_ctx *ctx, mp_comm *c, const char *doing);
/* Waits on the host until every collective up to seq `upto` has completed. The deadline
 * restarts whenever one completes: it bounds a wait without progress. */
mp_status mp_nccl_host_wait(mp_ctx *ctx, mp_comm *c, uint64_t upto);

/* ---- the FIFO and issuing (comm_nccl_fifo.c) ---- */

/* Doubles the FIFO (OPS_INIT slots the first time), keeping the pending ops in order and
 * every event; the new slots get their events. */
mp_status mp_nccl_ops_grow(mp_ctx *ctx, nccl_impl *m);
/* Before the NCCL call: fail fast after an abort, notice a failure already known, and
 * order the comm stream after the compute stream (a batch did that at its begin). */
mp_status mp_nccl_op_begin(mp_ctx *ctx, mp_comm *c, const op_desc *d);
/* After the NCCL call(s) that returned rc on communicator comm: wait until they are
 * enqueued, record their completion, and (outside a batch) make compute wait for it.
 * call, file and line name the NCCL call in a failure's message (MP_NCCL_OP_END passes the
 * caller's place). */
mp_status mp_nccl_op_end(mp_ctx *ctx, mp_comm *c, const op_desc *d, ncclComm_t comm,
                         ncclResult_t rc, const char *call, const char *file, int line);
#define MP_NCCL_OP_END(ctx, c, d, comm, rc, call) \
  mp_nccl_op_end((ctx), (c), (d), (comm), (rc), (call), __FILE__, __LINE__)

/* ---- lifetime (comm_nccl.c) ---- */

/* The table's destroy: completes what was issued, finalizes (or, past the timeout, aborts)
 * each communicator, frees the events, stream and scratch. */
void mp_nccl_destroy(mp_comm *c);

#endif
