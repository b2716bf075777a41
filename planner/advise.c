/* When no plan fits: verified changes, and the constraints' usage mistakes (see advise.h).
 *
 * Invariant: an mp_advice is written only from a probe that ranked a plan. */
#include "planner/advise.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/limits.h"
#include "data/embedded.h"
#include "exec/rules.h"

/* ---- usage mistakes ------------------------------------------------------------------------ */

/* The product of the fixed mesh dims (1 when none is fixed). */
static int64_t fixed_dims(const mp_search_fix *f) {
  const int d[5] = {f->pp, f->dp_replicate, f->dp_shard, f->cp, f->tp};
  int64_t p = 1;
  for (int i = 0; i < 5; i++)
    if (d[i] > 0) p *= d[i];
  return p;
}

/* "1, 2, 4, 8": the divisors of n (at most cap bytes). */
static void divisors_str(int64_t n, char *buf, size_t cap) {
  size_t used = 0;
  buf[0] = '\0';
  for (int64_t d = 1; d <= n && used + 24 < cap; d++)
    if (n % d == 0) used += (size_t)snprintf(buf + used, cap - used, "%s%lld", used ? ", " : "", (long long)d);
}

mp_status mp_plan_setup_check(mp_ctx *ctx, const mp_plan_setup *s, const mp_cluster *c) {
  const mp_model *m = s->model;
  const mp_search_fix *f = &s->fix;
  const int n = mp_cluster_n_gpus(c);
  if (f->ep > 1 && !mp_model_is_moe(m))
    return mp_error(ctx, MP_ERR_USAGE, "ep=%d: %s is dense (no routed experts), so expert parallelism would "
                    "partition nothing; drop --ep (ep=1)", f->ep, m->name);
  if (f->ep > 1 && !mp_rule_ep_ok(m, f->ep)) {
    char d[256];
    divisors_str(m->n_experts, d, sizeof d);
    return mp_error(ctx, MP_ERR_USAGE, "ep=%d does not divide the %lld experts of %s (each EP rank holds the "
                    "same number of whole experts); choose ep in {%s}", f->ep, (long long)m->n_experts, m->name, d);
  }
  const int64_t prod = fixed_dims(f);
  if (n % prod)
    return mp_error(ctx, MP_ERR_USAGE, "the fixed mesh dims multiply to %lld, which does not divide the %d GPUs; "
                    "fix dims whose product divides %d", (long long)prod, n, n);
  if (f->ep > 1 && f->dp_shard > 0 && f->dp_shard % f->ep)
    return mp_error(ctx, MP_ERR_USAGE, "ep=%d does not divide dp_shard=%d: expert parallelism is carved out of "
                    "dp_shard", f->ep, f->dp_shard);
  if (f->micro_batch > 0 && s->global_batch > 0 && f->micro_batch > s->global_batch)
    return mp_error(ctx, MP_ERR_USAGE, "--micro-batch %lld is larger than --global-batch %lld: a micro-batch is "
                    "part of one data-parallel rank's share of the step; give --micro-batch %lld or less, or a "
                    "--global-batch of at least %lld", (long long)f->micro_batch, (long long)s->global_batch,
                    (long long)s->global_batch, (long long)f->micro_batch);
  return MP_OK;
}

/* ---- how many GPUs -------------------------------------------------------------------------- */

mp_status mp_advise_gpu_count(mp_ctx *ctx, int64_t n0, int64_t node, int64_t max_gpus, int max_probes,
                              mp_gpu_count_fits_fn fits, void *user, int64_t *fit, int64_t *no_fit) {
  int64_t lo = n0, hi = 0;
  int probes = 0, ok = 0;
  for (int64_t k = 2 * n0; k <= max_gpus && probes < max_probes; k *= 2) {
    MP_CHECK(fits(user, ctx, k, &ok));
    probes++;
    if (ok) {
      hi = k;
      break;
    }
    lo = k;
  }
  *fit = hi;
  *no_fit = lo;
  if (hi == 0) return MP_OK;
  /* whole nodes between them, from a node up: halve the interval */
  while (lo >= node && hi - lo > node && probes < max_probes) {
    const int64_t mid = lo + (hi - lo) / node / 2 * node;
    if (mid <= lo) break;
    MP_CHECK(fits(user, ctx, mid, &ok));
    probes++;
    if (ok) hi = mid;
    else lo = mid;
  }
  *fit = hi;
  *no_fit = lo;
  return MP_OK;
}

/* ---- the changes ---------------------------------------------------------------------------- */

/* What the changes are searched from, and the hints found so far. */
typedef struct advisor {
  const mp_plan_setup *s;
  const mp_cluster *c;
  mp_advice *out;
  int n;
  mp_probe_result found; /* the more-GPUs search's last fitting probe */
  mp_cluster found_c;
} advisor;

/* Searches setup s2 on cluster c2; a fit becomes hint `kind` with `change`. A search that
 * cannot run is no fit; out of memory is an error. */
static mp_status try_change(mp_ctx *ctx, advisor *a, const mp_plan_setup *s2, const mp_cluster *c2,
                            mp_advice_kind kind, const char *change, int *fits) {
  *fits = 0;
  mp_ctx local;
  mp_ctx_init(&local);
  mp_probe_result r;
  const mp_status st = mp_plan_probe(&local, s2, c2, &r);
  if (st == MP_ERR_NOMEM) return mp_error(ctx, st, "%s", mp_errmsg(&local));
  if (st != MP_OK || r.n_ranked == 0 || a->n >= MP_ADVICE_MAX) return MP_OK;
  mp_advice *h = &a->out[a->n++];
  memset(h, 0, sizeof *h);
  h->kind = kind;
  snprintf(h->change, sizeof h->change, "%s", change);
  snprintf(h->words, sizeof h->words, "%lld of %lld candidates fit on %d x %s", (long long)r.n_ranked,
           (long long)r.n_candidates, mp_cluster_n_gpus(c2), c2->gpu.name);
  h->cluster = *c2;
  h->probe = r;
  *fits = 1;
  return MP_OK;
}

/* The constraints a user gave beyond the micro-batch and the AC policy, "tp=3 ep=4". */
static void other_fixed(const mp_search_fix *f, char *buf, size_t cap) {
  const struct {
    const char *key;
    int v;
  } k[] = {{"pp", f->pp},   {"dp_replicate", f->dp_replicate}, {"dp_shard", f->dp_shard}, {"cp", f->cp},
           {"tp", f->tp},   {"ep", f->ep},                     {"sp", f->sp},             {"fp8", f->fp8},
           {"reshard", f->reshard}, {"pp_virtual", f->pp_virtual}};
  size_t used = 0;
  buf[0] = '\0';
  for (size_t i = 0; i < sizeof k / sizeof k[0] && used + 32 < cap; i++)
    if (k[i].v >= 0) used += (size_t)snprintf(buf + used, cap - used, "%s%s=%d", used ? "," : "", k[i].key, k[i].v);
}

/* The micro-batch searched, full AC: the constraints whose relaxing changes least. */
static mp_status relax_constraints(mp_ctx *ctx, advisor *a) {
  const mp_search_fix *f = &a->s->fix;
  mp_plan_setup s2 = *a->s;
  int fits = 0;
  if (f->micro_batch > 0) {
    s2.fix.micro_batch = -1;
    MP_CHECK(try_change(ctx, a, &s2, a->c, MP_ADVICE_MICRO_BATCH, "", &fits));
    if (fits)
      snprintf(a->out[a->n - 1].change, sizeof a->out[a->n - 1].change, "--micro-batch %lld (or leave it out: searched)",
               (long long)a->out[a->n - 1].probe.best.micro_batch);
    s2.fix.micro_batch = f->micro_batch;
  }
  if (f->ac >= 0 && !(f->ac == MP_AC_FULL && f->ac_every <= 1)) {
    s2.fix.ac = MP_AC_FULL;
    s2.fix.ac_every = 1;
    MP_CHECK(try_change(ctx, a, &s2, a->c, MP_ADVICE_FULL_AC, "--ac full", &fits));
    s2.fix.ac = f->ac;
    s2.fix.ac_every = f->ac_every;
  }
  return MP_OK;
}

/* The fixed mesh dims and options dropped (the micro-batch and the AC policy kept). */
static mp_status drop_fixed(mp_ctx *ctx, advisor *a) {
  const mp_search_fix *f = &a->s->fix;
  char keys[160], change[256];
  other_fixed(f, keys, sizeof keys);
  if (!keys[0]) return MP_OK;
  mp_plan_setup s2 = *a->s;
  mp_search_fix_init(&s2.fix);
  s2.fix.micro_batch = f->micro_batch;
  s2.fix.ac = f->ac;
  s2.fix.ac_every = f->ac_every;
  snprintf(change, sizeof change, "without %s (drop them from --mesh, --ep, --fix, --fp8, --sp/--no-sp)", keys);
  int fits = 0;
  return try_change(ctx, a, &s2, a->c, MP_ADVICE_UNCONSTRAINED, change, &fits);
}

/* The most global batches the batch hint searches. */
#define ADVICE_BATCH_TRIES 4

/* The global batches nearest the given one that some batch-rejected candidate's dp x
 * micro-batch divides, nearest first (the larger on a tie): at most ADVICE_BATCH_TRIES. */
static int batch_choices(const mp_search *failed, int64_t gb, int64_t out[ADVICE_BATCH_TRIES]) {
  int n = 0;
  for (int64_t i = 0; i < failed->n; i++) {
    const mp_candidate *c = &failed->cands[i];
    if (c->reject != MP_REJECT_BATCH) continue;
    const int64_t step = (int64_t)c->mesh.size[MP_DIM_DP_REPLICATE] * c->mesh.size[MP_DIM_DP_SHARD] * c->micro_batch;
    const int64_t v[2] = {(gb + step - 1) / step * step, gb / step * step};
    for (int k = 0; k < 2; k++) {
      if (v[k] < 1 || v[k] == gb || v[k] > MP_LIM_GLOBAL_BATCH) continue;
      int j = 0;
      while (j < n && out[j] != v[k]) j++;
      if (j < n) continue; /* already there */
      const int64_t d = v[k] > gb ? v[k] - gb : gb - v[k];
      /* insert in order of distance (larger first on a tie), keeping the nearest */
      int at = n;
      while (at > 0) {
        const int64_t e = out[at - 1] > gb ? out[at - 1] - gb : gb - out[at - 1];
        if (e < d || (e == d && out[at - 1] > v[k])) break;
        at--;
      }
      if (at >= ADVICE_BATCH_TRIES) continue;
      if (n < ADVICE_BATCH_TRIES) n++;
      memmove(&out[at + 1], &out[at], (size_t)(n - 1 - at) * sizeof *out);
      out[at] = v[k];
    }
  }
  return n;
}

/* A given global batch the batch rule rejected: the nearest ones that divide, searched. */
static mp_status change_batch(mp_ctx *ctx, advisor *a, const mp_search *failed) {
  int64_t by[MP_REJECT_COUNT];
  mp_search_reject_counts(failed, by);
  if (a->s->global_batch <= 0 || by[MP_REJECT_BATCH] == 0) return MP_OK;
  int64_t gbs[ADVICE_BATCH_TRIES];
  const int n = batch_choices(failed, a->s->global_batch, gbs);
  mp_plan_setup s2 = *a->s;
  for (int k = 0; k < n; k++) {
    char change[64];
    snprintf(change, sizeof change, "--global-batch %lld", (long long)gbs[k]);
    s2.global_batch = gbs[k];
    int fits = 0;
    MP_CHECK(try_change(ctx, a, &s2, a->c, MP_ADVICE_BATCH, change, &fits));
    if (fits) break;
  }
  return MP_OK;
}

/* mp_gpu_count_fits_fn: the setup on its cluster resized to n GPUs. */
static mp_status fits_at(void *user, mp_ctx *ctx, int64_t n, int *fits) {
  advisor *a = user;
  *fits = 0;
  mp_ctx local;
  mp_ctx_init(&local);
  mp_cluster c2;
  if (mp_cluster_resize(&local, a->c, n, a->s->gpus_per_node, &c2) != MP_OK) return MP_OK;
  mp_probe_result r;
  const mp_status st = mp_plan_probe(&local, a->s, &c2, &r);
  if (st == MP_ERR_NOMEM) return mp_error(ctx, st, "%s", mp_errmsg(&local));
  if (st != MP_OK || r.n_ranked == 0) return MP_OK;
  *fits = 1;
  a->found = r;
  a->found_c = c2;
  return MP_OK;
}

/* More GPUs of the same kind: how many (mp_advise_gpu_count). */
static mp_status more_gpus(mp_ctx *ctx, advisor *a) {
  const int64_t n0 = mp_cluster_n_gpus(a->c);
  const int64_t node = a->s->gpus_per_node > 0 ? a->s->gpus_per_node : 8;
  const int64_t max = MP_LIM_GPUS < MP_MESH_MAX_WORLD ? MP_LIM_GPUS : MP_MESH_MAX_WORLD;
  int64_t fit = 0, no_fit = 0;
  MP_CHECK(mp_advise_gpu_count(ctx, n0, node, max, MP_ADVICE_MAX_GPU_PROBES, fits_at, a, &fit, &no_fit));
  if (fit == 0 || a->n >= MP_ADVICE_MAX) return MP_OK;
  mp_advice *h = &a->out[a->n++];
  memset(h, 0, sizeof *h);
  h->kind = MP_ADVICE_MORE_GPUS;
  snprintf(h->change, sizeof h->change, "--gpus %lld", (long long)fit);
  snprintf(h->words, sizeof h->words, "%lld of %lld candidates fit on %lld x %s (%lld GPUs: none)",
           (long long)a->found.n_ranked, (long long)a->found.n_candidates, (long long)fit, a->c->gpu.name,
           (long long)no_fit);
  h->cluster = a->found_c;
  h->probe = a->found;
  return MP_OK;
}

/* The GPU profiles with more memory than c's, that meshplan plans for (not the CPU), by
 * memory then name: at most cap into out, their count returned. */
static int bigger_gpus(const mp_gpu *g0, mp_gpu *out, int cap) {
  size_t n_e = 0;
  const mp_data_entry *e = mp_data_entries(&n_e);
  int n = 0;
  for (size_t i = 0; i < n_e && n < cap; i++) {
    if (strcmp(e[i].kind, "gpus") != 0) continue;
    mp_ctx local;
    mp_ctx_init(&local);
    mp_gpu g;
    if (mp_gpu_load(&local, e[i].name, &g) != MP_OK || mp_gpu_is_cpu(&g) || !(g.mem_gib > g0->mem_gib)) continue;
    int at = n++;
    while (at > 0 && (out[at - 1].mem_gib > g.mem_gib ||
                      (out[at - 1].mem_gib == g.mem_gib && strcmp(out[at - 1].name, g.name) > 0))) {
      out[at] = out[at - 1];
      at--;
    }
    out[at] = g;
  }
  return n;
}

/* A GPU with more memory at the same count: the first that fits, by memory. */
static mp_status bigger_gpu(mp_ctx *ctx, advisor *a) {
  mp_gpu gs[32];
  const int n = bigger_gpus(&a->c->gpu, gs, 32);
  for (int k = 0; k < n; k++) {
    mp_cluster c2;
    mp_cluster_with_gpu(a->c, &gs[k], &c2);
    char change[96];
    snprintf(change, sizeof change, "--gpu %s (%.0f GiB)", gs[k].name, gs[k].mem_gib);
    int fits = 0;
    MP_CHECK(try_change(ctx, a, a->s, &c2, MP_ADVICE_BIGGER_GPU, change, &fits));
    if (fits) break;
  }
  return MP_OK;
}

mp_status mp_advise(mp_ctx *ctx, const mp_plan_setup *s, const mp_cluster *c, const mp_search *failed,
                    mp_advice *out, int *n) {
  advisor a;
  memset(&a, 0, sizeof a);
  a.s = s;
  a.c = c;
  a.out = out;
  *n = 0;
  int64_t by[MP_REJECT_COUNT];
  mp_search_reject_counts(failed, by);
  const int64_t memory = by[MP_REJECT_MEMORY_BOUND] + by[MP_REJECT_MEMORY] + by[MP_REJECT_MEMORY_MB] +
                         by[MP_REJECT_MEMORY_AC];
  MP_CHECK(relax_constraints(ctx, &a));
  MP_CHECK(change_batch(ctx, &a, failed));
  MP_CHECK(drop_fixed(ctx, &a));
  MP_CHECK(more_gpus(ctx, &a));
  if (memory > 0) MP_CHECK(bigger_gpu(ctx, &a));
  *n = a.n;
  return MP_OK;
}
