/* "single" backend: world size 1 with no MPI (see comm.h).
 *
 * Every group has exactly one rank (group index 0), so each collective is the identity:
 * a reduction over one rank is its input, a gather of one chunk is that chunk. Calls copy
 * send to recv (memmove when in place). Point-to-point has no other rank to talk to; only
 * a sendrecv with oneself is meaningful (a copy). */
#include <stdlib.h>
#include <string.h>

#include "exec/comm/comm_backend.h"

static void copy(void *dst, const void *src, size_t count, mp_comm_dtype t) {
  if (count > 0 && dst != src) memmove(dst, src, count * mp_comm_dtype_bytes(t));
}

static mp_status single_all_reduce(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                   void *recv, size_t count, mp_comm_dtype t, mp_comm_op op) {
  (void)ctx, (void)c, (void)g, (void)op;
  copy(recv, send, count, t);
  return MP_OK;
}

static mp_status single_all_gather(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                   void *recv, size_t count, mp_comm_dtype t) {
  (void)ctx, (void)c, (void)g;
  copy(recv, send, count, t);
  return MP_OK;
}

static mp_status single_reduce_scatter(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                       void *recv, size_t recv_count, mp_comm_dtype t,
                                       mp_comm_op op) {
  (void)ctx, (void)c, (void)g, (void)op;
  copy(recv, send, recv_count, t);
  return MP_OK;
}

static mp_status single_all_to_all_v(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                     const int64_t *send_counts, const int64_t *send_displs,
                                     void *recv, const int64_t *recv_counts,
                                     const int64_t *recv_displs, mp_comm_dtype t) {
  (void)c, (void)g;
  if (send_counts[0] != recv_counts[0])
    return mp_error(ctx, MP_ERR_INVALID,
                    "all_to_all_v: this rank sends %lld elements to itself but expects %lld",
                    (long long)send_counts[0], (long long)recv_counts[0]);
  size_t b = mp_comm_dtype_bytes(t);
  copy((char *)recv + (size_t)recv_displs[0] * b, (const char *)send + (size_t)send_displs[0] * b,
       (size_t)send_counts[0], t);
  return MP_OK;
}

static mp_status single_broadcast(mp_ctx *ctx, mp_comm *c, mp_group g, void *buf, size_t count,
                                  mp_comm_dtype t, int root) {
  (void)ctx, (void)c, (void)g, (void)buf, (void)count, (void)t, (void)root;
  return MP_OK;
}

/* The front end rejects every peer for send/recv in a world of one (self is refused). */
static mp_status single_p2p(mp_ctx *ctx, const char *what) {
  return mp_error(ctx, MP_ERR_INTERNAL, "%s: the single backend has no peer", what);
}

static mp_status single_send(mp_ctx *ctx, mp_comm *c, const void *buf, size_t count,
                             mp_comm_dtype t, int peer) {
  (void)c, (void)buf, (void)count, (void)t, (void)peer;
  return single_p2p(ctx, "send");
}

static mp_status single_recv(mp_ctx *ctx, mp_comm *c, void *buf, size_t count, mp_comm_dtype t,
                             int peer) {
  (void)c, (void)buf, (void)count, (void)t, (void)peer;
  return single_p2p(ctx, "recv");
}

static mp_status single_sendrecv(mp_ctx *ctx, mp_comm *c, const void *send, size_t send_count,
                                 int dst, void *recv, size_t recv_count, int src,
                                 mp_comm_dtype t) {
  (void)c, (void)dst, (void)src;
  if (send_count != recv_count)
    return mp_error(ctx, MP_ERR_INVALID,
                    "sendrecv: this rank sends %zu elements to itself but expects %zu",
                    send_count, recv_count);
  copy(recv, send, send_count, t);
  return MP_OK;
}

static mp_status single_barrier(mp_ctx *ctx, mp_comm *c, mp_group g) {
  (void)ctx, (void)c, (void)g;
  return MP_OK;
}

static const mp_comm_backend k_single = {
    .name = "single",
    .all_reduce = single_all_reduce,
    .all_gather = single_all_gather,
    .reduce_scatter = single_reduce_scatter,
    .all_to_all_v = single_all_to_all_v,
    .broadcast = single_broadcast,
    .send = single_send,
    .recv = single_recv,
    .sendrecv = single_sendrecv,
    .barrier = single_barrier,
    .synchronize = NULL,
    .destroy = NULL,
};

mp_status mp_comm_create_single(mp_ctx *ctx, const mp_mesh *mesh, mp_comm **out) {
  *out = NULL;
  MP_CHECK(mp_mesh_validate(ctx, mesh));
  if (mp_mesh_world(mesh) != 1) {
    char f[256];
    mp_mesh_format(mesh, f, sizeof f);
    return mp_error(ctx, MP_ERR_INVALID,
                    "mesh %s has %d ranks but the single-process backend runs 1; launch with "
                    "mpirun -np %d",
                    f, mp_mesh_world(mesh), mp_mesh_world(mesh));
  }
  mp_comm *c = (mp_comm *)malloc(sizeof *c);
  MP_CHECK_ALLOC(ctx, c);
  mp_comm_init_common(c, mesh, 0);
  c->backend = &k_single;
  *out = c;
  return MP_OK;
}
