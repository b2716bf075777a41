/* The "nccl" backend's errors, clock, messages and polling (see comm_nccl.c for the
 * design): how a failure is worded (this rank, the collective, its group and world ranks),
 * how a wait is paced and bounded by the timeout, and how the communicators are aborted
 * once, after which every call on the comm fails with the same message.
 *
 * Nothing here blocks inside NCCL: waits poll ncclCommGetAsyncError and the completion
 * events, backing off from spinning to sleeping (see backoff). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "exec/comm/comm_nccl_internal.h"

/* ---- errors ---- */

mp_status mp_nccl_error(mp_ctx *ctx, ncclResult_t rc, const char *file, int line,
                        const char *call) {
  const char *last = ncclGetLastError(NULL);
  return mp_error(ctx, MP_ERR_NCCL, "%s:%d: %s failed: %s%s%s", file, line, call,
                  ncclGetErrorString(rc), last && *last ? ": " : "", last ? last : "");
}

/* ---- time ---- */

double mp_nccl_now_s(void) {
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

/* ---- messages ---- */

/* "rank 3: all_gather of 4096 bf16 elements on group dp_shard (world ranks 0 1 2 3)" */
static void describe(const mp_comm *c, const op_desc *d, char *buf, size_t cap) {
  mp_comm_describe(c, c->world_rank, d->what, d->group, d->peer, d->count, d->dtype, buf, cap);
}

/* waited >= the timeout; the message names the limit, which is what the user set. */
static mp_status timeout_error(mp_ctx *ctx, const mp_comm *c, const op_desc *d, double waited) {
  (void)waited;
  char what[512];
  describe(c, d, what, sizeof what);
  return mp_comm_timeout_error(ctx, MP_ERR_NCCL, what, IMPL(c)->timeout_s, d->peer >= 0);
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
  char names[160] = "", gw[512] = "";
  size_t used = 0;
  for (int g = 0; g < MP_GROUP_COUNT && used < sizeof names; g++)
    if (m->comm[g] == comm) {
      if (gw[0] == '\0') mp_comm_describe(c, c->world_rank, "", g, -1, 0, MP_COMM_DTYPE_FP32, gw, sizeof gw);
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

void mp_nccl_abort_comms(nccl_impl *m) {
  if (m->aborted) return;
  for (int i = m->n_owned - 1; i >= 0; i--)
    if (m->owned[i]) (void)ncclCommAbort(m->owned[i]);
  m->aborted = 1;
}

/* Ends every NCCL communicator of c: kernels waiting on a dead peer return, and every
 * later call on c fails with the message now on ctx. */
mp_status mp_nccl_fail_abort(mp_ctx *ctx, mp_comm *c, mp_status st) {
  nccl_impl *m = IMPL(c);
  if (!m->aborted) {
    mp_nccl_abort_comms(m);
    char msg[MP_ERRMSG_MAX];
    snprintf(msg, sizeof msg, "%s", mp_errmsg(ctx));
    mp_error(ctx, st, "%s; the NCCL communicators were aborted, so this communicator is "
             "unusable: destroy it and end the job",
             msg);
    snprintf(m->abort_msg, sizeof m->abort_msg, "%s", mp_errmsg(ctx));
  }
  return st;
}

mp_status mp_nccl_aborted_error(mp_ctx *ctx, const mp_comm *c, const char *what) {
  return mp_error(ctx, MP_ERR_NCCL, "rank %d: %s refused: this communicator was aborted after "
                  "an earlier failure: %s",
                  c->world_rank, what, IMPL(c)->abort_msg);
}

/* ---- polling ---- */

/* Waits until comm has left ncclInProgress (a non-blocking call is enqueued, a
 * communicator made), at most the timeout. Does not abort: the caller decides. */
mp_status mp_nccl_settle(mp_ctx *ctx, const mp_comm *c, ncclComm_t comm, const op_desc *d,
                         double timeout_s) {
  double t0 = mp_nccl_now_s();
  int spins = 0;
  for (;;) {
    ncclResult_t st = ncclSuccess;
    MP_NCCL_CHECK(ctx, ncclCommGetAsyncError(comm, &st));
    if (st == ncclSuccess) return MP_OK;
    if (st != ncclInProgress) return async_error(ctx, c, d, st);
    double waited = mp_nccl_now_s() - t0;
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
mp_status mp_nccl_reap(mp_ctx *ctx, mp_comm *c) {
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
mp_status mp_nccl_health(mp_ctx *ctx, mp_comm *c, const char *doing) {
  nccl_impl *m = IMPL(c);
  MP_CHECK(mp_nccl_reap(ctx, c));
  if (m->n > 0) {
    const nccl_op *op = &m->ops[m->head];
    double age = mp_nccl_now_s() - op->t_issue;
    op_desc hd = desc_of(op);
    if (age > m->timeout_s) return timeout_error(ctx, c, &hd, age);
  }
  return check_async(ctx, c, doing);
}

/* Waits on the host until every collective up to seq `upto` has completed. The deadline
 * restarts whenever one completes: it bounds a wait without progress. */
mp_status mp_nccl_host_wait(mp_ctx *ctx, mp_comm *c, uint64_t upto) {
  nccl_impl *m = IMPL(c);
  double last = mp_nccl_now_s();
  uint64_t seen = m->done_seq;
  int spins = 0;
  for (;;) {
    MP_CHECK(mp_nccl_reap(ctx, c));
    if (m->done_seq >= upto) return MP_OK;
    op_desc hd = desc_of(&m->ops[m->head]);
    MP_CHECK(check_async(ctx, c, hd.what));
    double t = mp_nccl_now_s();
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
