/* Collectives front end (see comm.h): argument checks shared by every backend, then one
 * call through the backend table.
 *
 * Checks here depend only on arguments that every rank of a group passes identically
 * (group kind, dtype, op, root, array lengths), or on this rank's own buffers, so a
 * rejected call is rejected on every rank before any communication starts. */
#include "exec/comm/comm_backend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/assert.h"
#include "common/progress.h"

size_t mp_comm_dtype_bytes(mp_comm_dtype t) {
  switch (t) {
    case MP_COMM_DTYPE_FP32: return 4;
    case MP_COMM_DTYPE_INT64: return 8;
    case MP_COMM_DTYPE_BF16: return 2;
    default: return 0;
  }
}

const char *mp_comm_dtype_name(mp_comm_dtype t) {
  switch (t) {
    case MP_COMM_DTYPE_FP32: return "fp32";
    case MP_COMM_DTYPE_INT64: return "int64";
    case MP_COMM_DTYPE_BF16: return "bf16";
    default: return "?";
  }
}

const char *mp_comm_op_name(mp_comm_op op) {
  switch (op) {
    case MP_COMM_OP_SUM: return "sum";
    case MP_COMM_OP_MAX: return "max";
    default: return "?";
  }
}

int mp_comm_local_rank_from_env(void) {
  static const char *vars[] = {"OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "SLURM_LOCALID"};
  for (size_t i = 0; i < sizeof vars / sizeof vars[0]; i++) {
    const char *v = getenv(vars[i]);
    if (v == NULL || v[0] == '\0') continue;
    char *end = NULL;
    long r = strtol(v, &end, 10);
    if (*end == '\0' && r >= 0 && r < (1L << 30)) return (int)r;
  }
  return -1;
}

int mp_comm_env_launched(void) {
  const char *v = getenv("OMPI_COMM_WORLD_SIZE");
  if (v == NULL || v[0] == '\0') v = getenv("PMI_SIZE");
  return v != NULL && v[0] != '\0';
}

mp_status mp_comm_read_timeout(mp_ctx *ctx, double *out) {
  const char *v = getenv("MESHPLAN_COMM_TIMEOUT_S");
  *out = MP_COMM_DEFAULT_TIMEOUT_S;
  if (v == NULL || v[0] == '\0') return MP_OK;
  char *end = NULL;
  double t = strtod(v, &end);
  if (end == v || *end != '\0' || !(t > 0) || t > 1e9)
    return mp_error(ctx, MP_ERR_INVALID,
                    "MESHPLAN_COMM_TIMEOUT_S=%s: expected a number of seconds > 0 (default "
                    "%.0f)",
                    v, MP_COMM_DEFAULT_TIMEOUT_S);
  *out = t;
  return MP_OK;
}

/* "dp_shard (world ranks 0 1 2 3)"; a long group shows its first and last ranks. */
static void group_words(const mp_comm *c, int world_rank, int g, char *buf, size_t cap) {
  if (c == NULL || g < 0) {
    snprintf(buf, cap, "the world, creating the communicators");
    return;
  }
  const int n = c->group_size[g];
  int *r = (int *)malloc((size_t)n * sizeof(int));
  int used = snprintf(buf, cap, "%s", mp_group_name((mp_group)g));
  if (r == NULL || used < 0 || (size_t)used >= cap) {
    free(r);
    return;
  }
  mp_mesh_group_ranks(&c->mesh, (mp_group)g, world_rank, r);
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

void mp_comm_describe(const mp_comm *c, int world_rank, const char *what, int group, int peer,
                      size_t count, mp_comm_dtype t, char *buf, size_t cap) {
  if (peer >= 0) {
    const char *dir = strcmp(what, "send") == 0 ? "to" : strcmp(what, "recv") == 0 ? "from" : "with";
    snprintf(buf, cap, "rank %d: %s of %zu %s elements %s rank %d", world_rank, what, count,
             mp_comm_dtype_name(t), dir, peer);
    return;
  }
  char gw[256];
  group_words(c, world_rank, group, gw, sizeof gw);
  snprintf(buf, cap, "rank %d: %s of %zu %s elements on group %s", world_rank, what, count,
           mp_comm_dtype_name(t), gw);
}

mp_status mp_comm_timeout_error(mp_ctx *ctx, mp_status code, const char *description, double timeout_s,
                                int point_to_point) {
  const char *who = point_to_point ? "the peer rank died, is stuck, or never made the matching call"
                                   : "a peer rank died or is stuck";
  return mp_error(ctx, code,
                  "%s did not complete within %g s: %s; every rank of a group must make the "
                  "same collective calls in the same order (MESHPLAN_COMM_TIMEOUT_S sets the "
                  "limit in seconds)",
                  description, timeout_s, who);
}

void mp_comm_init_common(mp_comm *c, const mp_mesh *mesh, int rank) {
  memset(c, 0, sizeof *c);
  c->mesh = *mesh;
  c->world_rank = rank;
  c->world_size = mp_mesh_world(mesh);
  c->local_rank = 0;
  c->local_size = 1;
  MP_ASSERT(rank >= 0 && rank < c->world_size,
            "rank %d of %d: every backend creates its comm after checking the mesh against its world", rank,
            c->world_size);
  for (int g = 0; g < MP_GROUP_COUNT; g++) {
    c->group_size[g] = mp_mesh_group_size(mesh, (mp_group)g);
    c->group_index[g] = mp_mesh_group_index(mesh, (mp_group)g, rank);
    /* a group kind partitions the world into groups of one size; the rank's index is its
     * place in its own group (chunk offsets of all-gather and reduce-scatter rely on it) */
    MP_ASSERT(c->group_size[g] >= 1 && c->world_size % c->group_size[g] == 0 && c->group_index[g] >= 0 &&
                      c->group_index[g] < c->group_size[g],
              "group %s: size %d, index %d, world %d", mp_group_name((mp_group)g), c->group_size[g],
              c->group_index[g], c->world_size);
  }
}

void mp_comm_destroy(mp_comm *c) {
  if (c == NULL) return;
  if (c->backend && c->backend->destroy) c->backend->destroy(c);
  free(c);
}

const char *mp_comm_backend_name(const mp_comm *c) { return c->backend->name; }
const mp_mesh *mp_comm_mesh(const mp_comm *c) { return &c->mesh; }
int mp_comm_world_rank(const mp_comm *c) { return c->world_rank; }
int mp_comm_world_size(const mp_comm *c) { return c->world_size; }
int mp_comm_local_rank(const mp_comm *c) { return c->local_rank; }
int mp_comm_local_size(const mp_comm *c) { return c->local_size; }
int mp_comm_group_size(const mp_comm *c, mp_group g) {
  return g >= 0 && g < MP_GROUP_COUNT ? c->group_size[g] : 0;
}
int mp_comm_group_index(const mp_comm *c, mp_group g) {
  return g >= 0 && g < MP_GROUP_COUNT ? c->group_index[g] : -1;
}

/* ---- argument checks ---- */

static mp_status check_common(mp_ctx *ctx, const mp_comm *c, const char *what, mp_group g,
                              mp_comm_dtype t) {
  if (c == NULL || c->backend == NULL)
    return mp_error(ctx, MP_ERR_INVALID, "%s: no communicator (create one first)", what);
  if ((int)g < 0 || g >= MP_GROUP_COUNT)
    return mp_error(ctx, MP_ERR_INVALID, "%s: group kind %d is not an mp_group", what, (int)g);
  if ((int)t < 0 || t >= MP_COMM_DTYPE_COUNT)
    return mp_error(ctx, MP_ERR_INVALID, "%s: dtype %d is not an mp_comm_dtype", what, (int)t);
  return MP_OK;
}

static mp_status check_op(mp_ctx *ctx, const char *what, mp_comm_op op) {
  if ((int)op < 0 || op >= MP_COMM_OP_COUNT)
    return mp_error(ctx, MP_ERR_INVALID, "%s: op %d is not an mp_comm_op", what, (int)op);
  return MP_OK;
}

static mp_status check_buf(mp_ctx *ctx, const char *what, const char *name, const void *p,
                           size_t count) {
  if (count > 0 && p == NULL)
    return mp_error(ctx, MP_ERR_INVALID, "%s: %s is NULL with %zu elements", what, name, count);
  return MP_OK;
}

/* count * k elements of t must fit in a size_t of bytes. */
static mp_status check_size(mp_ctx *ctx, const char *what, size_t count, size_t k,
                            mp_comm_dtype t) {
  size_t b = mp_comm_dtype_bytes(t);
  if (k != 0 && count > SIZE_MAX / k / b)
    return mp_error(ctx, MP_ERR_INVALID, "%s: %zu x %zu elements overflow the address space",
                    what, count, k);
  return MP_OK;
}

static mp_status check_peer(mp_ctx *ctx, const mp_comm *c, const char *what, int peer,
                            int allow_self) {
  if (peer < 0 || peer >= c->world_size)
    return mp_error(ctx, MP_ERR_INVALID, "%s: peer rank %d is outside the world of %d ranks",
                    what, peer, c->world_size);
  if (!allow_self && peer == c->world_rank)
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: rank %d names itself as peer; a blocking send to oneself deadlocks "
                    "(use mp_comm_sendrecv)",
                    what, peer);
  return MP_OK;
}

/* ---- collectives ---- */

void mp_comm_profile(mp_comm *c, mp_comm_prof *p) {
  if (c) c->prof = p;
}

void mp_comm_profile_unit_op(mp_comm *c, mp_group g) {
  if (c && c->prof && g < MP_GROUP_COUNT) c->prof->unit_ops[g]++;
}

/* Returns the backend call's status, its host time added to c->prof when profiling. */
#define PROFILED(c, g, call)                              \
  do {                                                    \
    if ((c)->prof == NULL) return (call);                 \
    const double t0_ = mp_now_s();                        \
    const mp_status s_ = (call);                          \
    (c)->prof->seconds[(g)] += mp_now_s() - t0_;          \
    (c)->prof->calls[(g)]++;                              \
    return s_;                                            \
  } while (0)

mp_status mp_comm_all_reduce(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send, void *recv,
                             size_t count, mp_comm_dtype t, mp_comm_op op) {
  const char *w = "all_reduce";
  MP_CHECK(check_common(ctx, c, w, g, t));
  MP_CHECK(check_op(ctx, w, op));
  MP_CHECK(check_buf(ctx, w, "send", send, count));
  MP_CHECK(check_buf(ctx, w, "recv", recv, count));
  PROFILED(c, g, c->backend->all_reduce(ctx, c, g, send, recv, count, t, op));
}

mp_status mp_comm_all_gather(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send, void *recv,
                             size_t count, mp_comm_dtype t) {
  const char *w = "all_gather";
  MP_CHECK(check_common(ctx, c, w, g, t));
  MP_CHECK(check_size(ctx, w, count, (size_t)c->group_size[g], t));
  MP_CHECK(check_buf(ctx, w, "send", send, count));
  MP_CHECK(check_buf(ctx, w, "recv", recv, count));
  PROFILED(c, g, c->backend->all_gather(ctx, c, g, send, recv, count, t));
}

mp_status mp_comm_reduce_scatter(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                                 void *recv, size_t recv_count, mp_comm_dtype t, mp_comm_op op) {
  const char *w = "reduce_scatter";
  MP_CHECK(check_common(ctx, c, w, g, t));
  MP_CHECK(check_op(ctx, w, op));
  MP_CHECK(check_size(ctx, w, recv_count, (size_t)c->group_size[g], t));
  MP_CHECK(check_buf(ctx, w, "send", send, recv_count));
  MP_CHECK(check_buf(ctx, w, "recv", recv, recv_count));
  PROFILED(c, g, c->backend->reduce_scatter(ctx, c, g, send, recv, recv_count, t, op));
}

mp_status mp_comm_all_to_all_v(mp_ctx *ctx, mp_comm *c, mp_group g, const void *send,
                               const int64_t *send_counts, const int64_t *send_displs,
                               void *recv, const int64_t *recv_counts,
                               const int64_t *recv_displs, mp_comm_dtype t) {
  const char *w = "all_to_all_v";
  MP_CHECK(check_common(ctx, c, w, g, t));
  if (!send_counts || !send_displs || !recv_counts || !recv_displs)
    return mp_error(ctx, MP_ERR_INVALID, "%s: counts and displacements are required", w);
  int n = c->group_size[g];
  int64_t send_total = 0, recv_total = 0;
  for (int j = 0; j < n; j++) {
    if (send_counts[j] < 0 || send_displs[j] < 0 || recv_counts[j] < 0 || recv_displs[j] < 0)
      return mp_error(ctx, MP_ERR_INVALID,
                      "%s: negative count or displacement for group index %d (send %lld at "
                      "%lld, recv %lld at %lld)",
                      w, j, (long long)send_counts[j], (long long)send_displs[j],
                      (long long)recv_counts[j], (long long)recv_displs[j]);
    send_total += send_counts[j];
    recv_total += recv_counts[j];
  }
  MP_CHECK(check_buf(ctx, w, "send", send, (size_t)send_total));
  MP_CHECK(check_buf(ctx, w, "recv", recv, (size_t)recv_total));
  PROFILED(c, g, c->backend->all_to_all_v(ctx, c, g, send, send_counts, send_displs, recv,
                                          recv_counts, recv_displs, t));
}

mp_status mp_comm_broadcast(mp_ctx *ctx, mp_comm *c, mp_group g, void *buf, size_t count,
                            mp_comm_dtype t, int root) {
  const char *w = "broadcast";
  MP_CHECK(check_common(ctx, c, w, g, t));
  if (root < 0 || root >= c->group_size[g])
    return mp_error(ctx, MP_ERR_INVALID,
                    "%s: root %d is not a group index of the %s group (size %d)", w, root,
                    mp_group_name(g), c->group_size[g]);
  MP_CHECK(check_buf(ctx, w, "buf", buf, count));
  PROFILED(c, g, c->backend->broadcast(ctx, c, g, buf, count, t, root));
}

/* The mesh group a point-to-point op with `peer` serves, for profiling: the dimension in
 * which the two ranks' coordinates differ (a pipeline's neighbouring stage: pp; a ring
 * member: cp or tp), the world when they differ in more than one. */
/* The mesh group a point-to-point exchange with dst and src runs in, for the profile: the
 * group of the one mesh dimension in which both peers differ from this rank (pp for
 * neighbouring pipeline stages, cp for context parallelism's ring), else the world. */
static mp_group p2p_group(const mp_comm *c, int dst, int src) {
  static const mp_group of_dim[MP_MESH_NDIMS] = {MP_GROUP_PP, MP_GROUP_DP_REPLICATE, MP_GROUP_DP_SHARD,
                                                 MP_GROUP_CP, MP_GROUP_TP};
  int me[MP_MESH_NDIMS], a[MP_MESH_NDIMS], b[MP_MESH_NDIMS];
  mp_mesh_coords(&c->mesh, c->world_rank, me);
  mp_mesh_coords(&c->mesh, dst, a);
  mp_mesh_coords(&c->mesh, src, b);
  int differ = 0, dim = 0;
  for (int d = 0; d < MP_MESH_NDIMS; d++)
    if (a[d] != me[d] || b[d] != me[d]) differ++, dim = d;
  return differ == 1 ? of_dim[dim] : MP_GROUP_WORLD;
}

mp_status mp_comm_send(mp_ctx *ctx, mp_comm *c, const void *buf, size_t count, mp_comm_dtype t,
                       int peer) {
  const char *w = "send";
  MP_CHECK(check_common(ctx, c, w, MP_GROUP_WORLD, t));
  MP_CHECK(check_peer(ctx, c, w, peer, 0));
  MP_CHECK(check_buf(ctx, w, "buf", buf, count));
  PROFILED(c, p2p_group(c, peer, peer), c->backend->send(ctx, c, buf, count, t, peer));
}

mp_status mp_comm_recv(mp_ctx *ctx, mp_comm *c, void *buf, size_t count, mp_comm_dtype t,
                       int peer) {
  const char *w = "recv";
  MP_CHECK(check_common(ctx, c, w, MP_GROUP_WORLD, t));
  MP_CHECK(check_peer(ctx, c, w, peer, 0));
  MP_CHECK(check_buf(ctx, w, "buf", buf, count));
  PROFILED(c, p2p_group(c, peer, peer), c->backend->recv(ctx, c, buf, count, t, peer));
}

mp_status mp_comm_sendrecv(mp_ctx *ctx, mp_comm *c, const void *send, size_t send_count, int dst,
                           void *recv, size_t recv_count, int src, mp_comm_dtype t) {
  const char *w = "sendrecv";
  MP_CHECK(check_common(ctx, c, w, MP_GROUP_WORLD, t));
  MP_CHECK(check_peer(ctx, c, w, dst, 1));
  MP_CHECK(check_peer(ctx, c, w, src, 1));
  MP_CHECK(check_buf(ctx, w, "send", send, send_count));
  MP_CHECK(check_buf(ctx, w, "recv", recv, recv_count));
  PROFILED(c, p2p_group(c, dst, src), c->backend->sendrecv(ctx, c, send, send_count, dst, recv, recv_count, src, t));
}

mp_status mp_comm_barrier(mp_ctx *ctx, mp_comm *c, mp_group g) {
  MP_CHECK(check_common(ctx, c, "barrier", g, MP_COMM_DTYPE_FP32));
  return c->backend->barrier(ctx, c, g);
}

mp_status mp_comm_synchronize(mp_ctx *ctx, mp_comm *c) {
  MP_CHECK(check_common(ctx, c, "synchronize", MP_GROUP_WORLD, MP_COMM_DTYPE_FP32));
  return c->backend->synchronize ? c->backend->synchronize(ctx, c) : MP_OK;
}

/* ---- overlap ---- */

mp_status mp_comm_async_begin(mp_ctx *ctx, mp_comm *c) {
  MP_CHECK(check_common(ctx, c, "async_begin", MP_GROUP_WORLD, MP_COMM_DTYPE_FP32));
  if (c->async_open)
    return mp_error(ctx, MP_ERR_INVALID,
                    "async_begin: a batch is already open on this communicator; batches do not "
                    "nest (call mp_comm_async_end first)");
  if (c->backend->async_begin) MP_CHECK(c->backend->async_begin(ctx, c));
  c->async_open = 1;
  return MP_OK;
}

mp_status mp_comm_async_end(mp_ctx *ctx, mp_comm *c, mp_comm_req *req) {
  if (req) req->seq = 0;
  MP_CHECK(check_common(ctx, c, "async_end", MP_GROUP_WORLD, MP_COMM_DTYPE_FP32));
  if (req == NULL)
    return mp_error(ctx, MP_ERR_INVALID, "async_end: no request to fill (pass &req)");
  if (!c->async_open)
    return mp_error(ctx, MP_ERR_INVALID,
                    "async_end: no batch is open on this communicator (call "
                    "mp_comm_async_begin first)");
  c->async_open = 0; /* closed even if the backend fails: the caller may go on to destroy */
  return c->backend->async_end ? c->backend->async_end(ctx, c, req) : MP_OK;
}

mp_status mp_comm_wait(mp_ctx *ctx, mp_comm *c, mp_comm_req *req) {
  MP_CHECK(check_common(ctx, c, "wait", MP_GROUP_WORLD, MP_COMM_DTYPE_FP32));
  if (req == NULL) return mp_error(ctx, MP_ERR_INVALID, "wait: no request (pass &req)");
  if (req->seq == 0 || c->backend->wait == NULL) {
    req->seq = 0;
    return MP_OK;
  }
  /* req stays set: waiting again is harmless, and the backend knows when it is complete */
  return c->backend->wait(ctx, c, req);
}

void mp_comm_set_stream(mp_comm *c, void *cuda_stream) {
  if (c && c->backend && c->backend->set_stream) c->backend->set_stream(c, cuda_stream);
}
