/* "mpi-staged" and "single-staged" backends: collectives on buffers in a kernel backend's
 * (device) memory, without linking that backend's runtime (see comm.h).
 *
 * "mpi-staged" wraps an "mpi" communicator. Each collective copies its device input into a
 * host staging buffer with be->memcpy_d2h(kc, ...), calls the "mpi" table on host copies
 * that mirror the caller's layout (in place stays in place, out of place stays out of
 * place, so MPI picks the same algorithm and the result is bitwise what "mpi" gives on
 * host buffers), and copies the output back with be->memcpy_h2d. It exists because NCCL
 * 2.28 refuses two ranks of one communicator on one GPU, and for builds without NCCL.
 * "single-staged" is world size 1: every collective is the identity, so it is one
 * be->memcpy_d2d (none in place), staying on the device.
 *
 * Invariants:
 *   - Only be->memcpy_* touch device memory; this file never dereferences a caller's
 *     buffer. The copies are ordered after the work queued on kc (the CUDA backend's
 *     memcpy_d2h/h2d synchronize kc's stream; its d2d is queued on it), so a collective
 *     sees what compute wrote before it and compute queued afterwards sees its result:
 *     every call is blocking in comm.h's sense and the async API is a no-op.
 *   - One host staging buffer per comm, grown to the largest call and kept (pageable
 *     malloc memory; it is not device memory, so the runtime's device tracking is exact).
 *   - all_to_all_v copies only the extent [lo, hi) of the displacements that carry data;
 *     receive segments with gaps between them come back one by one, so the caller's
 *     bytes between segments are never overwritten.
 *   - A failing memcpy leaves its message on kc->err; it is copied to the caller's ctx. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "exec/comm/comm_backend.h"
#include "kernels/ops.h"

typedef struct staged_impl {
  mp_comm *inner; /* the "mpi" communicator ("mpi-staged"); NULL for "single-staged" */
  const mp_backend *be;
  mp_kctx *kc;
  unsigned char *host; /* staging, host_bytes */
  size_t host_bytes;
  int64_t *a2a; /* 2 * world_size: displacements shifted into the staged extents */
} staged_impl;

#define IMPL(c) ((staged_impl *)(c)->impl)

enum { ALIGN = 64 };

static size_t align_up(size_t n) { return (n + ALIGN - 1) & ~(size_t)(ALIGN - 1); }

/* Host staging of at least `bytes`; contents are not kept across calls. */
static mp_status staging(mp_ctx *ctx, staged_impl *s, size_t bytes, unsigned char **out) {
  if (bytes == 0) bytes = ALIGN; /* never a NULL base, even for empty calls */
  if (bytes > s->host_bytes) {
    size_t want = align_up(bytes > 2 * s->host_bytes ? bytes : 2 * s->host_bytes);
    unsigned char *p = (unsigned char *)malloc(want);
    if (p == NULL)
      return mp_error(ctx, MP_ERR_NOMEM, "staging %zu bytes of a device collective on the host: "
                      "out of memory", want);
    free(s->host);
    s->host = p;
    s->host_bytes = want;
  }
  *out = s->host;
  return MP_OK;
}

/* A kernel backend's failure is recorded on kc->err; the caller reads ctx. */
static mp_status mem_fail(mp_ctx *ctx, const staged_impl *s, mp_status st, const char *what) {
  if (s->kc->err != ctx) return mp_error(ctx, st, "%s: %s", what, mp_errmsg(s->kc->err));
  mp_error_prefix(ctx, "%s: ", what);
  return st;
}

static mp_status d2h(mp_ctx *ctx, staged_impl *s, const char *what, void *host, const void *dev,
                     size_t bytes) {
  if (bytes == 0) return MP_OK;
  mp_status st = s->be->memcpy_d2h(s->kc, host, dev, bytes);
  return st == MP_OK ? MP_OK : mem_fail(ctx, s, st, what);
}

static mp_status h2d(mp_ctx *ctx, staged_impl *s, const char *what, void *dev, const void *host,
                     size_t bytes) {
  if (bytes == 0) return MP_OK;
  mp_status st = s->be->memcpy_h2d(s->kc, dev, host, bytes);
  return st == MP_OK ? MP_OK : mem_fail(ctx, s, st, what);
}

static mp_status d2d(mp_ctx *ctx, staged_impl *s, const char *what, void *dst, const void *src,
                     size_t bytes) {
  if (bytes == 0 || dst == src) return MP_OK;
  mp_status st = s->be->memcpy_d2d(s->kc, dst, src, bytes);
  return st == MP_OK ? MP_OK : mem_fail(ctx, s, st, what);
}

/* ---- "mpi-staged" ---- */

static mp_status staged_all_reduce(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                   void *recv, size_t count, mp_comm_dtype t, mp_comm_op op) {
  staged_impl *s = IMPL(c);
  const char *w = "all_reduce";
  size_t b = count * mp_comm_dtype_bytes(t), off = send == recv ? 0 : align_up(b);
  unsigned char *h = NULL;
  MP_CHECK(staging(ctx, s, off + b, &h));
  MP_CHECK(d2h(ctx, s, w, h, send, b));
  MP_CHECK(mp_comm_all_reduce(ctx, s->inner, g, h, h + off, count, t, op));
  return h2d(ctx, s, w, recv, h + off, b);
}

static mp_status staged_all_gather(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                   void *recv, size_t count, mp_comm_dtype t) {
  staged_impl *s = IMPL(c);
  const char *w = "all_gather";
  size_t b = count * mp_comm_dtype_bytes(t), total = b * (size_t)c->group_size[g];
  size_t mine = b * (size_t)c->group_index[g];
  int in_place = send == (const unsigned char *)recv + mine;
  size_t send_off = in_place ? mine : align_up(total);
  unsigned char *h = NULL;
  MP_CHECK(staging(ctx, s, in_place ? total : send_off + b, &h));
  MP_CHECK(d2h(ctx, s, w, h + send_off, send, b));
  MP_CHECK(mp_comm_all_gather(ctx, s->inner, g, h + send_off, h, count, t));
  return h2d(ctx, s, w, recv, h, total);
}

static mp_status staged_reduce_scatter(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                       void *recv, size_t recv_count, mp_comm_dtype t,
                                       mp_comm_op op) {
  staged_impl *s = IMPL(c);
  const char *w = "reduce_scatter";
  size_t b = recv_count * mp_comm_dtype_bytes(t), total = b * (size_t)c->group_size[g];
  size_t off = align_up(total);
  unsigned char *h = NULL;
  MP_CHECK(staging(ctx, s, off + b, &h));
  MP_CHECK(d2h(ctx, s, w, h, send, total));
  MP_CHECK(mp_comm_reduce_scatter(ctx, s->inner, g, h, h + off, recv_count, t, op));
  return h2d(ctx, s, w, recv, h + off, b);
}

/* [lo, hi) in elements: the span of the segments that carry data (lo == hi when none). */
static void extent(int n, const int64_t *counts, const int64_t *displs, int64_t *lo,
                   int64_t *hi) {
  *lo = *hi = 0;
  int any = 0;
  for (int j = 0; j < n; j++) {
    if (counts[j] == 0) continue;
    int64_t a = displs[j], e = displs[j] + counts[j];
    if (!any || a < *lo) *lo = a;
    if (!any || e > *hi) *hi = e;
    any = 1;
  }
}

static mp_status staged_all_to_all_v(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                     const int64_t *send_counts, const int64_t *send_displs,
                                     void *recv, const int64_t *recv_counts,
                                     const int64_t *recv_displs, mp_comm_dtype t) {
  staged_impl *s = IMPL(c);
  const char *w = "all_to_all_v";
  const int n = c->group_size[g];
  const size_t eb = mp_comm_dtype_bytes(t);
  int64_t slo, shi, rlo, rhi, rsum = 0;
  extent(n, send_counts, send_displs, &slo, &shi);
  extent(n, recv_counts, recv_displs, &rlo, &rhi);
  MP_ASSERT(n <= c->world_size, "a group of %d ranks: s->a2a holds 2 x world_size (%d) displacements", n,
            c->world_size);
  int64_t *sd = s->a2a, *rd = s->a2a + n;
  for (int j = 0; j < n; j++) {
    /* segments without data keep displacement 0: MPI reads nothing there */
    sd[j] = send_counts[j] ? send_displs[j] - slo : 0;
    rd[j] = recv_counts[j] ? recv_displs[j] - rlo : 0;
    rsum += recv_counts[j];
    MP_ASSERT(sd[j] >= 0 && sd[j] + send_counts[j] <= shi - slo && rd[j] >= 0 && rd[j] + recv_counts[j] <= rhi - rlo,
              "segment %d lies inside the staged extents", j);
  }
  size_t sbytes = (size_t)(shi - slo) * eb, rbytes = (size_t)(rhi - rlo) * eb;
  size_t roff = align_up(sbytes);
  unsigned char *h = NULL;
  MP_CHECK(staging(ctx, s, roff + rbytes, &h));
  MP_CHECK(d2h(ctx, s, w, h, (const unsigned char *)send + (size_t)slo * eb, sbytes));
  MP_CHECK(mp_comm_all_to_all_v(ctx, s->inner, g, h, send_counts, sd, h + roff, recv_counts, rd,
                                t));
  if (rsum == rhi - rlo) /* the segments tile [rlo, rhi): one copy back */
    return h2d(ctx, s, w, (unsigned char *)recv + (size_t)rlo * eb, h + roff, rbytes);
  for (int j = 0; j < n; j++)
    if (recv_counts[j] > 0)
      MP_CHECK(h2d(ctx, s, w, (unsigned char *)recv + (size_t)recv_displs[j] * eb,
                   h + roff + (size_t)rd[j] * eb, (size_t)recv_counts[j] * eb));
  return MP_OK;
}

static mp_status staged_broadcast(mp_ctx *ctx, mp_comm *c, mp_group g, void *buf, size_t count,
                                  mp_comm_dtype t, int root) {
  staged_impl *s = IMPL(c);
  const char *w = "broadcast";
  size_t b = count * mp_comm_dtype_bytes(t);
  int is_root = c->group_index[g] == root;
  unsigned char *h = NULL;
  MP_CHECK(staging(ctx, s, b, &h));
  if (is_root) MP_CHECK(d2h(ctx, s, w, h, buf, b));
  MP_CHECK(mp_comm_broadcast(ctx, s->inner, g, h, count, t, root));
  return is_root ? MP_OK : h2d(ctx, s, w, buf, h, b);
}

static mp_status staged_send(mp_ctx *ctx, mp_comm *c, const void *buf, size_t count,
                             mp_comm_dtype t, int peer) {
  staged_impl *s = IMPL(c);
  size_t b = count * mp_comm_dtype_bytes(t);
  unsigned char *h = NULL;
  MP_CHECK(staging(ctx, s, b, &h));
  MP_CHECK(d2h(ctx, s, "send", h, buf, b));
  return mp_comm_send(ctx, s->inner, h, count, t, peer);
}

static mp_status staged_recv(mp_ctx *ctx, mp_comm *c, void *buf, size_t count, mp_comm_dtype t,
                             int peer) {
  staged_impl *s = IMPL(c);
  size_t b = count * mp_comm_dtype_bytes(t);
  unsigned char *h = NULL;
  MP_CHECK(staging(ctx, s, b, &h));
  MP_CHECK(mp_comm_recv(ctx, s->inner, h, count, t, peer));
  return h2d(ctx, s, "recv", buf, h, b);
}

static mp_status staged_sendrecv(mp_ctx *ctx, mp_comm *c, const void *send, size_t send_count,
                                 int dst, void *recv, size_t recv_count, int src,
                                 mp_comm_dtype t) {
  staged_impl *s = IMPL(c);
  size_t eb = mp_comm_dtype_bytes(t), sb = send_count * eb, rb = recv_count * eb;
  size_t off = align_up(sb);
  unsigned char *h = NULL;
  MP_CHECK(staging(ctx, s, off + rb, &h));
  MP_CHECK(d2h(ctx, s, "sendrecv", h, send, sb));
  MP_CHECK(mp_comm_sendrecv(ctx, s->inner, h, send_count, dst, h + off, recv_count, src, t));
  return h2d(ctx, s, "sendrecv", recv, h + off, rb);
}

static mp_status staged_barrier(mp_ctx *ctx, mp_comm *c, mp_group g) {
  return mp_comm_barrier(ctx, IMPL(c)->inner, g);
}

static void staged_destroy(mp_comm *c) {
  staged_impl *s = IMPL(c);
  if (s == NULL) return;
  mp_comm_destroy(s->inner);
  free(s->host);
  free(s->a2a);
  free(s);
  c->impl = NULL;
}

static const mp_comm_backend k_mpi_staged = {
    .name = "mpi-staged",
    .all_reduce = staged_all_reduce,
    .all_gather = staged_all_gather,
    .reduce_scatter = staged_reduce_scatter,
    .all_to_all_v = staged_all_to_all_v,
    .broadcast = staged_broadcast,
    .send = staged_send,
    .recv = staged_recv,
    .sendrecv = staged_sendrecv,
    .barrier = staged_barrier,
    .synchronize = NULL, /* every call above has completed when it returns */
    .destroy = staged_destroy,
};

/* ---- "single-staged": world size 1, device copies ---- */

static mp_status sdev_all_reduce(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                 void *recv, size_t count, mp_comm_dtype t, mp_comm_op op) {
  (void)g, (void)op;
  return d2d(ctx, IMPL(c), "all_reduce", recv, send, count * mp_comm_dtype_bytes(t));
}

static mp_status sdev_all_gather(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                 void *recv, size_t count, mp_comm_dtype t) {
  (void)g;
  return d2d(ctx, IMPL(c), "all_gather", recv, send, count * mp_comm_dtype_bytes(t));
}

static mp_status sdev_reduce_scatter(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                     void *recv, size_t recv_count, mp_comm_dtype t,
                                     mp_comm_op op) {
  (void)g, (void)op;
  return d2d(ctx, IMPL(c), "reduce_scatter", recv, send, recv_count * mp_comm_dtype_bytes(t));
}

static mp_status sdev_all_to_all_v(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                   const int64_t *send_counts, const int64_t *send_displs,
                                   void *recv, const int64_t *recv_counts,
                                   const int64_t *recv_displs, mp_comm_dtype t) {
  (void)g;
  if (send_counts[0] != recv_counts[0])
    return mp_error(ctx, MP_ERR_INVALID,
                    "all_to_all_v: this rank sends %lld elements to itself but expects %lld",
                    (long long)send_counts[0], (long long)recv_counts[0]);
  size_t b = mp_comm_dtype_bytes(t);
  return d2d(ctx, IMPL(c), "all_to_all_v", (unsigned char *)recv + (size_t)recv_displs[0] * b,
             (const unsigned char *)send + (size_t)send_displs[0] * b,
             (size_t)send_counts[0] * b);
}

static mp_status sdev_broadcast(mp_ctx *ctx, mp_comm *c, mp_group g, void *buf, size_t count,
                                mp_comm_dtype t, int root) {
  (void)ctx, (void)c, (void)g, (void)buf, (void)count, (void)t, (void)root;
  return MP_OK;
}

/* The front end rejects every peer for send/recv in a world of one (self is refused). */
static mp_status sdev_send(mp_ctx *ctx, mp_comm *c, const void *buf, size_t count,
                           mp_comm_dtype t, int peer) {
  (void)c, (void)buf, (void)count, (void)t, (void)peer;
  return mp_error(ctx, MP_ERR_INTERNAL, "send: the single-staged backend has no peer");
}

static mp_status sdev_recv(mp_ctx *ctx, mp_comm *c, void *buf, size_t count, mp_comm_dtype t,
                           int peer) {
  (void)c, (void)buf, (void)count, (void)t, (void)peer;
  return mp_error(ctx, MP_ERR_INTERNAL, "recv: the single-staged backend has no peer");
}

static mp_status sdev_sendrecv(mp_ctx *ctx, mp_comm *c, const void *send, size_t send_count,
                               int dst, void *recv, size_t recv_count, int src,
                               mp_comm_dtype t) {
  (void)dst, (void)src;
  if (send_count != recv_count)
    return mp_error(ctx, MP_ERR_INVALID,
                    "sendrecv: this rank sends %zu elements to itself but expects %zu",
                    send_count, recv_count);
  return d2d(ctx, IMPL(c), "sendrecv", recv, send, send_count * mp_comm_dtype_bytes(t));
}

static mp_status sdev_barrier(mp_ctx *ctx, mp_comm *c, mp_group g) {
  (void)ctx, (void)c, (void)g;
  return MP_OK;
}

static const mp_comm_backend k_single_staged = {
    .name = "single-staged",
    .all_reduce = sdev_all_reduce,
    .all_gather = sdev_all_gather,
    .reduce_scatter = sdev_reduce_scatter,
    .all_to_all_v = sdev_all_to_all_v,
    .broadcast = sdev_broadcast,
    .send = sdev_send,
    .recv = sdev_recv,
    .sendrecv = sdev_sendrecv,
    .barrier = sdev_barrier,
    .synchronize = NULL,
    .destroy = staged_destroy,
};

/* ---- creation ---- */

static mp_status check_memory(mp_ctx *ctx, const char *who, const mp_backend *be,
                              const mp_kctx *kc) {
  if (be == NULL || kc == NULL)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: needs the kernel backend and its initialized context whose memory "
                    "the buffers live in",
                    who);
  if (be->memcpy_h2d == NULL || be->memcpy_d2h == NULL || be->memcpy_d2d == NULL)
    return mp_error(ctx, MP_ERR_INVALID, "%s: kernel backend \"%s\" has no memcpy entries", who,
                    be->name ? be->name : "?");
  if (kc->err == NULL)
    return mp_error(ctx, MP_ERR_INVALID, "%s: the kernel context has no error context (kc->err)",
                    who);
  return MP_OK;
}

mp_status mp_comm_create_mpi_staged(mp_ctx *ctx, const mp_mesh *mesh, const mp_backend *be,
                                    mp_kctx *kc, mp_comm **out) {
  *out = NULL;
  MP_CHECK(check_memory(ctx, "mp_comm_create_mpi_staged", be, kc));
  mp_comm *inner = NULL;
  MP_CHECK(mp_comm_create_mpi(ctx, mesh, &inner));
  mp_comm *c = (mp_comm *)malloc(sizeof *c);
  staged_impl *s = (staged_impl *)calloc(1, sizeof *s);
  int64_t *a2a = (int64_t *)malloc(2 * (size_t)inner->world_size * sizeof(int64_t));
  if (c == NULL || s == NULL || a2a == NULL) {
    free(c);
    free(s);
    free(a2a);
    mp_comm_destroy(inner);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory creating a staged MPI communicator");
  }
  *c = *inner; /* rank, local rank, groups: as "mpi" found them */
  c->backend = &k_mpi_staged;
  s->inner = inner;
  s->be = be;
  s->kc = kc;
  s->a2a = a2a;
  c->impl = s;
  *out = c;
  return MP_OK;
}

mp_status mp_comm_create_single_staged(mp_ctx *ctx, const mp_mesh *mesh, const mp_backend *be,
                                       mp_kctx *kc, mp_comm **out) {
  *out = NULL;
  MP_CHECK(check_memory(ctx, "mp_comm_create_single_staged", be, kc));
  mp_comm *c = NULL;
  MP_CHECK(mp_comm_create_single(ctx, mesh, &c)); /* checks world size 1 */
  staged_impl *s = (staged_impl *)calloc(1, sizeof *s);
  if (s == NULL) {
    mp_comm_destroy(c);
    return mp_error(ctx, MP_ERR_NOMEM, "out of memory creating a single-staged communicator");
  }
  s->be = be;
  s->kc = kc;
  c->backend = &k_single_staged;
  c->impl = s;
  *out = c;
  return MP_OK;
}
