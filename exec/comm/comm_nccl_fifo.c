/* The "nccl" backend's FIFO of issued collectives and the two halves around every NCCL
 * call (see comm_nccl.c for the design and comm_nccl_internal.h for the FIFO's
 * invariants). The comm stream runs in order, so collectives complete in issue order and
 * the FIFO retires them from its head; each slot keeps its CUDA event for the comm's
 * lifetime, so issuing a collective creates nothing. */
#include <stdlib.h>

#include "exec/comm/comm_nccl_internal.h"

enum { OPS_INIT = 64 };

/* ---- the FIFO of issued collectives ---- */

mp_status mp_nccl_ops_grow(mp_ctx *ctx, nccl_impl *m) {
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
      return mp_cuda_error(ctx, e, m->device, __FILE__, __LINE__, "cudaEventCreateWithFlags");
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
  if (m->n == m->cap) MP_CHECK(mp_nccl_reap(ctx, c));
  if (m->n == m->cap) MP_CHECK(mp_nccl_ops_grow(ctx, m));
  nccl_op *op = &m->ops[(m->head + m->n) % m->cap];
  op->seq = ++m->issued_seq;
  op->what = d->what;
  op->group = d->group;
  op->peer = d->peer;
  op->count = d->count;
  op->dtype = d->dtype;
  op->t_issue = mp_nccl_now_s();
  m->n++;
  *out = op;
  return MP_OK;
}

/* ---- issuing a collective ---- */

/* Before the NCCL call: fail fast after an abort, notice a failure already known, and
 * order the comm stream after the compute stream (a batch did that at its begin). */
mp_status mp_nccl_op_begin(mp_ctx *ctx, mp_comm *c, const op_desc *d) {
  nccl_impl *m = IMPL(c);
  if (m->aborted) return mp_nccl_aborted_error(ctx, c, d->what);
  mp_status st = mp_nccl_health(ctx, c, d->what);
  if (st != MP_OK) return mp_nccl_fail_abort(ctx, c, st);
  if (!m->in_batch) {
    cudaError_t e = cudaEventRecord(m->ready, m->compute);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(m->stream, m->ready, 0);
    if (e != cudaSuccess)
      return mp_nccl_fail_abort(ctx, c,
                                mp_cuda_error(ctx, e, m->device, __FILE__, __LINE__,
                                              "ordering the comm stream after the compute stream"));
  }
  return MP_OK;
}

/* After the NCCL call(s) that returned rc on communicator comm: wait until they are
 * enqueued, record their completion, and (outside a batch) make compute wait for it. */
mp_status mp_nccl_op_end(mp_ctx *ctx, mp_comm *c, const op_desc *d, ncclComm_t comm,
                         ncclResult_t rc, const char *call, const char *file, int line) {
  nccl_impl *m = IMPL(c);
  if (!mp_nccl_ok(rc)) return mp_nccl_fail_abort(ctx, c, mp_nccl_error(ctx, rc, file, line, call));
  mp_status st = mp_nccl_settle(ctx, c, comm, d, m->timeout_s);
  if (st != MP_OK) return mp_nccl_fail_abort(ctx, c, st);
  nccl_op *op = NULL;
  st = ops_push(ctx, c, d, &op);
  if (st != MP_OK) return mp_nccl_fail_abort(ctx, c, st);
  cudaError_t e = cudaEventRecord(op->done, m->stream);
  if (e == cudaSuccess && !m->in_batch) e = cudaStreamWaitEvent(m->compute, op->done, 0);
  if (e != cudaSuccess)
    return mp_nccl_fail_abort(ctx, c,
                              mp_cuda_error(ctx, e, m->device, __FILE__, __LINE__,
                                            "recording a collective's completion"));
  return MP_OK;
}
