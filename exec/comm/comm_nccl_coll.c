/* The "nccl" backend's collectives, its overlap API and its table (see comm_nccl.c for
 * the design). Each collective is mp_nccl_op_begin, the NCCL call(s) on the comm stream,
 * MP_NCCL_OP_END; all-to-all and sendrecv copy a rank's own segment on the device instead
 * of sending it to itself. barrier and synchronize wait on the host; the rest do not. */
#include <string.h>

#include "exec/comm/comm_nccl_internal.h"

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
  MP_CHECK(mp_nccl_op_begin(ctx, c, &d));
  ncclResult_t rc =
      ncclAllReduce(send, recv, count, nccl_type(t), nccl_op_of(op), m->comm[g], m->stream);
  return MP_NCCL_OP_END(ctx, c, &d, m->comm[g], rc, "ncclAllReduce");
}

static mp_status nccl_all_gather(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                 void *recv, size_t count, mp_comm_dtype t) {
  nccl_impl *m = IMPL(c);
  op_desc d = {"all_gather", g, -1, count, t};
  MP_CHECK(mp_nccl_op_begin(ctx, c, &d));
  ncclResult_t rc = ncclAllGather(send, recv, count, nccl_type(t), m->comm[g], m->stream);
  return MP_NCCL_OP_END(ctx, c, &d, m->comm[g], rc, "ncclAllGather");
}

static mp_status nccl_reduce_scatter(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                     void *recv, size_t recv_count, mp_comm_dtype t,
                                     mp_comm_op op) {
  nccl_impl *m = IMPL(c);
  op_desc d = {"reduce_scatter", g, -1, recv_count, t};
  MP_CHECK(mp_nccl_op_begin(ctx, c, &d));
  ncclResult_t rc = ncclReduceScatter(send, recv, recv_count, nccl_type(t), nccl_op_of(op),
                                      m->comm[g], m->stream);
  return MP_NCCL_OP_END(ctx, c, &d, m->comm[g], rc, "ncclReduceScatter");
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
  MP_CHECK(mp_nccl_op_begin(ctx, c, &d));
  if (send_counts[me] > 0) {
    cudaError_t e = cudaMemcpyAsync((char *)recv + (size_t)recv_displs[me] * b,
                                    (const char *)send + (size_t)send_displs[me] * b,
                                    (size_t)send_counts[me] * b, cudaMemcpyDeviceToDevice,
                                    m->stream);
    if (e != cudaSuccess)
      return mp_nccl_fail_abort(ctx, c,
                                mp_cuda_error(ctx, e, m->device, __FILE__, __LINE__,
                                              "all_to_all_v: copying this rank's own segment"));
  }
  ncclResult_t rc = ncclSuccess;
  if (n > 1) {
    rc = ncclGroupStart();
    for (int j = 0; j < n && mp_nccl_ok(rc); j++) {
      if (j == me) continue;
      if (send_counts[j] > 0)
        rc = ncclSend((const char *)send + (size_t)send_displs[j] * b, (size_t)send_counts[j],
                      nccl_type(t), j, m->comm[g], m->stream);
      if (mp_nccl_ok(rc) && recv_counts[j] > 0)
        rc = ncclRecv((char *)recv + (size_t)recv_displs[j] * b, (size_t)recv_counts[j],
                      nccl_type(t), j, m->comm[g], m->stream);
    }
    ncclResult_t end = ncclGroupEnd(); /* always closes the group, even after an error */
    if (mp_nccl_ok(rc)) rc = end;
  }
  return MP_NCCL_OP_END(ctx, c, &d, m->comm[g], rc,
                        "ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd");
}

static mp_status nccl_broadcast(mp_ctx *ctx, mp_comm *c, mp_group g, void *buf, size_t count,
                                mp_comm_dtype t, int root) {
  nccl_impl *m = IMPL(c);
  op_desc d = {"broadcast", g, -1, count, t};
  MP_CHECK(mp_nccl_op_begin(ctx, c, &d));
  ncclResult_t rc = ncclBroadcast(buf, buf, count, nccl_type(t), root, m->comm[g], m->stream);
  return MP_NCCL_OP_END(ctx, c, &d, m->comm[g], rc, "ncclBroadcast");
}

/* Point-to-point over the world communicator: ncclSend (send 1) or ncclRecv (send 0). */
static mp_status nccl_p2p(mp_ctx *ctx, mp_comm *c, void *buf, size_t count, mp_comm_dtype t,
                          int peer, int send) {
  nccl_impl *m = IMPL(c);
  op_desc d = {send ? "send" : "recv", MP_GROUP_WORLD, peer, count, t};
  MP_CHECK(mp_nccl_op_begin(ctx, c, &d));
  ncclComm_t w = m->comm[MP_GROUP_WORLD];
  ncclResult_t rc = send ? ncclSend(buf, count, nccl_type(t), peer, w, m->stream)
                         : ncclRecv(buf, count, nccl_type(t), peer, w, m->stream);
  return MP_NCCL_OP_END(ctx, c, &d, w, rc, send ? "ncclSend" : "ncclRecv");
}

static mp_status nccl_send(mp_ctx *ctx, mp_comm *c, const void *buf, size_t count,
                           mp_comm_dtype t, int peer) {
  return nccl_p2p(ctx, c, (void *)buf, count, t, peer, 1); /* ncclSend only reads it */
}

static mp_status nccl_recv(mp_ctx *ctx, mp_comm *c, void *buf, size_t count, mp_comm_dtype t,
                           int peer) {
  return nccl_p2p(ctx, c, buf, count, t, peer, 0);
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
  MP_CHECK(mp_nccl_op_begin(ctx, c, &d));
  ncclComm_t w = m->comm[MP_GROUP_WORLD];
  ncclResult_t rc = ncclSuccess;
  if (dst == me) {
    if (send_count > 0 && send != recv) {
      cudaError_t e = cudaMemcpyAsync(recv, send, send_count * mp_comm_dtype_bytes(t),
                                      cudaMemcpyDeviceToDevice, m->stream);
      if (e != cudaSuccess)
        return mp_nccl_fail_abort(ctx, c,
                                  mp_cuda_error(ctx, e, m->device, __FILE__, __LINE__,
                                                "sendrecv: copying to itself"));
    }
  } else {
    rc = ncclGroupStart();
    if (mp_nccl_ok(rc)) rc = ncclSend(send, send_count, nccl_type(t), dst, w, m->stream);
    if (mp_nccl_ok(rc)) rc = ncclRecv(recv, recv_count, nccl_type(t), src, w, m->stream);
    ncclResult_t end = ncclGroupEnd();
    if (mp_nccl_ok(rc)) rc = end;
  }
  return MP_NCCL_OP_END(ctx, c, &d, w, rc, "ncclGroupStart/ncclSend/ncclRecv/ncclGroupEnd");
}

static mp_status nccl_barrier(mp_ctx *ctx, mp_comm *c, mp_group g) {
  nccl_impl *m = IMPL(c);
  op_desc d = {"barrier", g, -1, 1, MP_COMM_DTYPE_FP32};
  MP_CHECK(mp_nccl_op_begin(ctx, c, &d));
  ncclResult_t rc = ncclAllReduce(m->scratch, m->scratch, 1, ncclFloat32, ncclSum, m->comm[g],
                                  m->stream);
  MP_CHECK(MP_NCCL_OP_END(ctx, c, &d, m->comm[g], rc, "ncclAllReduce (barrier)"));
  mp_status st = mp_nccl_host_wait(ctx, c, m->issued_seq);
  return st == MP_OK ? MP_OK : mp_nccl_fail_abort(ctx, c, st);
}

static mp_status nccl_synchronize(mp_ctx *ctx, mp_comm *c) {
  nccl_impl *m = IMPL(c);
  if (m->aborted) return mp_nccl_aborted_error(ctx, c, "synchronize");
  mp_status st = mp_nccl_host_wait(ctx, c, m->issued_seq);
  return st == MP_OK ? MP_OK : mp_nccl_fail_abort(ctx, c, st);
}

/* ---- overlap ---- */

static mp_status nccl_async_begin(mp_ctx *ctx, mp_comm *c) {
  nccl_impl *m = IMPL(c);
  op_desc d = {"async_begin", MP_GROUP_WORLD, -1, 0, MP_COMM_DTYPE_FP32};
  MP_CHECK(mp_nccl_op_begin(ctx, c, &d)); /* orders the comm stream after compute, once */
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
    return mp_nccl_aborted_error(ctx, c, "async_end");
  }
  return MP_OK;
}

static mp_status nccl_wait(mp_ctx *ctx, mp_comm *c, const mp_comm_req *req) {
  nccl_impl *m = IMPL(c);
  if (m->aborted) return mp_nccl_aborted_error(ctx, c, "wait");
  if (req->seq > m->issued_seq)
    return mp_error(ctx, MP_ERR_INVALID,
                    "wait: request %llu was not issued on this communicator (last is %llu)",
                    (unsigned long long)req->seq, (unsigned long long)m->issued_seq);
  mp_status st = mp_nccl_reap(ctx, c);
  if (st != MP_OK) return mp_nccl_fail_abort(ctx, c, st);
  if (req->seq > m->done_seq) { /* still pending: its slot is in the FIFO */
    const nccl_op *op = &m->ops[(m->head + (size_t)(req->seq - m->ops[m->head].seq)) % m->cap];
    cudaError_t e = cudaStreamWaitEvent(m->compute, op->done, 0);
    if (e != cudaSuccess)
      return mp_nccl_fail_abort(ctx, c,
                                mp_cuda_error(ctx, e, m->device, __FILE__, __LINE__,
                                              "making the compute stream wait for a batch"));
  }
  st = mp_nccl_health(ctx, c, "wait");
  return st == MP_OK ? MP_OK : mp_nccl_fail_abort(ctx, c, st);
}

static void nccl_set_stream(mp_comm *c, void *cuda_stream) {
  IMPL(c)->compute = (cudaStream_t)cuda_stream;
}

/* ---- the table ---- */

const mp_comm_backend mp_nccl_backend = {
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
    .destroy = mp_nccl_destroy,
};
