/* The training runtime: expert tensor parallelism (etp > 1; runtime_internal.h lists the
 * runtime's files). Each local expert is split over the etp ranks of the rank's expert-TP
 * group (exec/mesh.h, MP_GROUP_ETP): gate and up column-parallel, down row-parallel, the
 * rank holding its 1/etp slice of every local expert's width (exec/pass_ep.c; the plan's
 * tiles place it, exec/plan_tiles.c).
 *
 * The exchange is Megatron-Core's all-to-all dispatcher with tp_size = etp
 * (megatron/core/transformer/moe/token_dispatcher.py, MoEAlltoAllTokenDispatcher,
 * core_v0.14.0): after the EP all-to-all, the received rows are all-gathered over the
 * expert-TP group (gather_from_sequence_parallel_region with the group's per-rank row
 * counts, themselves gathered first), so every rank of the group runs its slice on the
 * group's rows; the slices' outputs, partial sums of the row-parallel down projection, are
 * reduce-scattered back to the rank that received each row
 * (reduce_scatter_to_sequence_parallel_region) before the combine. Backward is the same
 * reversed: the output gradient of the scattered rows is all-gathered, the input gradient
 * of the gathered rows (partial over the group: gate and up are column-parallel) is
 * reduce-scattered. A slice's weight gradient then covers every row its experts got, so it
 * is reduced over expert-DP only (runtime_fsdp.c, runtime_step.c).
 *
 * The expert side is laid out [expert-TP rank t][EP source s][local expert e] (ep_rc): rank
 * t's block holds the rows it received, and the rank's own block is where its dispatch
 * lands and its combine reads. Both collectives are rings over the group by
 * point-to-point sendrecv, one block a step: the all-gather in place (the blocks are
 * disjoint), the reduce-scatter receiving each block into the space after ep_out's rows
 * (or the dead output gradient in backward) and adding it to the rank's own partial. */
#include "exec/runtime/runtime_internal.h"

/* Rows of rank t's block of layer l. */
int64_t mp_rt_etp_block_rows(const mp_runtime *rt, int l, int t) {
  const size_t n = (size_t)rt->ep * rt->El;
  const int64_t *rc = rt->ep_rc + ((size_t)l * rt->etp + t) * n;
  int64_t r = 0;
  for (size_t i = 0; i < n; i++) r += rc[i];
  return r;
}

/* First row of rank t's block. */
int64_t mp_rt_etp_block_start(const mp_runtime *rt, int l, int t) {
  int64_t r = 0;
  for (int u = 0; u < t; u++) r += mp_rt_etp_block_rows(rt, l, u);
  return r;
}

int64_t mp_rt_etp_block_max(const mp_runtime *rt, int l) {
  int64_t m = 0;
  for (int t = 0; t < rt->etp && rt->etp > 1; t++) {
    const int64_t r = mp_rt_etp_block_rows(rt, l, t);
    if (r > m) m = r;
  }
  return m;
}

/* The per-(source, local expert) counts of every rank of the group: the rank's own part
 * (written by the EP count exchange) all-gathered into the others' parts. */
mp_status mp_rt_etp_counts(mp_ctx *ctx, mp_runtime *rt, int l) {
  if (rt->etp == 1) return MP_OK;
  const size_t n = (size_t)rt->ep * rt->El;
  int64_t *all = rt->ep_rc + (size_t)l * rt->etp * n;
  int64_t *send = malloc((size_t)rt->etp * n * sizeof *send);
  if (!send) return mp_error(ctx, MP_ERR_NOMEM, "runtime: out of memory for the expert-TP counts");
  for (int t = 0; t < rt->etp; t++) memcpy(send + (size_t)t * n, all + (size_t)rt->etp_idx * n, n * sizeof *send);
  mp_status st = mp_rt_host_coll(ctx, rt, MP_GROUP_ETP, send, all, n, MP_COMM_DTYPE_INT64, -1, NULL);
  free(send);
  return st;
}

/* The ring's neighbours in the group (world ranks): the next and the previous index. */
static void ring_peers(const mp_runtime *rt, int *next, int *prev) {
  int ranks[MP_MESH_MAX_WORLD];
  const int n = mp_mesh_group_ranks(&rt->plan->mesh, MP_GROUP_ETP, rt->rank, ranks);
  *next = ranks[(rt->etp_idx + 1) % n];
  *prev = ranks[(rt->etp_idx + n - 1) % n];
}

/* buf (the expert side's rows of width w, blocks by rank) holds the rank's own block; every
 * rank's block is gathered into it. Step k sends block idx - k on, receives idx - k - 1. */
mp_status mp_rt_etp_gather(mp_ctx *ctx, mp_runtime *rt, int l, void *buf, int64_t w) {
  if (rt->etp == 1) return MP_OK;
  const int n = rt->etp, i = rt->etp_idx;
  int next, prev;
  ring_peers(rt, &next, &prev);
  for (int k = 0; k < n - 1; k++) {
    const int bs = (i - k + n) % n, br = (i - k - 1 + 2 * n) % n;
    MP_CHECK(mp_comm_sendrecv(ctx, rt->comm, xoff(rt, buf, (size_t)(mp_rt_etp_block_start(rt, l, bs) * w)),
                              (size_t)(mp_rt_etp_block_rows(rt, l, bs) * w), next,
                              xoff(rt, buf, (size_t)(mp_rt_etp_block_start(rt, l, br) * w)),
                              (size_t)(mp_rt_etp_block_rows(rt, l, br) * w), prev, rt->xdt));
  }
  return MP_OK;
}

/* buf holds the rank's partial sums of every block; its own block is left holding the
 * group's sum. Step k sends the running sum of block idx - k - 1 on, receives that of
 * block idx - k - 2 into tmp (the largest block's rows) and adds it to the rank's own. */
mp_status mp_rt_etp_scatter(mp_ctx *ctx, mp_runtime *rt, int l, void *buf, void *tmp, int64_t w) {
  if (rt->etp == 1) return MP_OK;
  const int n = rt->etp, i = rt->etp_idx;
  int next, prev;
  ring_peers(rt, &next, &prev);
  for (int k = 0; k < n - 1; k++) {
    const int bs = (i - k - 1 + 2 * n) % n, br = (i - k - 2 + 3 * n) % n;
    const size_t nr = (size_t)(mp_rt_etp_block_rows(rt, l, br) * w);
    MP_CHECK(mp_comm_sendrecv(ctx, rt->comm, xoff(rt, buf, (size_t)(mp_rt_etp_block_start(rt, l, bs) * w)),
                              (size_t)(mp_rt_etp_block_rows(rt, l, bs) * w), next, tmp, nr, prev, rt->xdt));
    if (nr) BE(accumulate(rt->kc, xoff(rt, buf, (size_t)(mp_rt_etp_block_start(rt, l, br) * w)), tmp, nr));
  }
  return MP_OK;
}
