/* Device mesh (see mesh.h).
 *
 * Internally a rank has seven sub-coordinates, outermost first:
 *   [pp, inst, dpr, efsdp, e, cp, tp]   with dp_replicate = inst * (dp_replicate / dopt) + dpr
 *   and dp_shard = efsdp * ep + e (inst is 0 with one distributed-optimizer instance).
 * Rank order is row-major over these (which equals row-major over the five public dims),
 * and a group is the set of ranks that differ only in the group's varying sub-coordinates.
 * Enumerating those in row-major order yields the ranks in increasing order.
 *
 * Under the expert grid the experts' groups (EP, EFSDP, EDP, EDOPT, ETP) read the same six
 * slots as [pp, a, b, e, 1, t]   with a stage's rank index = ((a * b_size + b) * ep + e) * etp + t,
 * t the expert-TP coordinate (etp innermost, Megatron-Core's expert RankGenerator order
 * "tp-ep-dp-pp"), a = dp_replicate and b = dp_shard x cp x tp / (ep x etp) when ep x etp
 * divides dp_shard x cp x tp, else a = stage / (ep x etp) and b = 1; the dense groups read
 * [pp, dp_replicate, dp_shard, 1, cp, tp]. With instances a = inst * (a_size / dopt) + dpr
 * in both cases, so an instance's expert-DP members are consecutive (EDOPT) and the instance
 * coordinate strides a stage / dopt ranks, the dense one's stride (DOPT_INTER).
 * Both are row-major decompositions of the same rank, so groups still come out increasing. */
#include "exec/mesh.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { X_PP, X_INST, X_DPR, X_EFSDP, X_EP, X_CP, X_TP, X_N };

static const char *k_dim_names[MP_MESH_NDIMS] = {"pp", "dp_replicate", "dp_shard", "cp", "tp"};

const char *mp_mesh_dim_name(mp_mesh_dim d) { return d < MP_MESH_NDIMS ? k_dim_names[d] : "?"; }

const char *mp_group_name(mp_group g) {
  static const char *n[MP_GROUP_COUNT] = {"pp", "dp_replicate", "dp_shard", "cp",    "tp",   "ep",
                                          "efsdp", "dp",        "fsdp",     "dp_cp", "world", "edp",
                                          "etp", "dopt", "dopt_inter", "edopt"};
  return g < MP_GROUP_COUNT ? n[g] : "?";
}

void mp_mesh_init(mp_mesh *m) {
  for (int i = 0; i < MP_MESH_NDIMS; i++) m->size[i] = 1;
  m->ep = 1;
  m->etp = 0;
  m->dopt = 1;
}

int mp_mesh_dopt(const mp_mesh *m) { return m->dopt > 1 ? m->dopt : 1; }

int mp_mesh_grid_etp(const mp_mesh *m) { return mp_mesh_expert_grid(m) ? (m->etp > 1 ? m->etp : 1) : 0; }

int mp_mesh_expert_grid(const mp_mesh *m) {
  return m->etp > 0 || (m->ep > 1 && m->size[MP_DIM_DP_SHARD] % m->ep != 0);
}

/* The expert-TP size: etp, or 1 where it is not given. */
static int etp_of(const mp_mesh *m) { return m->etp > 1 ? m->etp : 1; }

/* A stage's ranks, and the part of them EP may take without reaching dp_replicate. */
static int stage_ranks(const mp_mesh *m) { return mp_mesh_world(m) / m->size[MP_DIM_PP]; }
static int inner_ranks(const mp_mesh *m) {
  return m->size[MP_DIM_DP_SHARD] * m->size[MP_DIM_CP] * m->size[MP_DIM_TP];
}

mp_group mp_mesh_expert_replica_group(const mp_mesh *m) {
  const int reaches = mp_mesh_expert_grid(m) && m->ep > 1 && inner_ranks(m) % (m->ep * etp_of(m)) != 0;
  return reaches ? MP_GROUP_EDP : MP_GROUP_DP_REPLICATE;
}

/* Stops as soon as the product passes the limit: five dims of up to 2^24 each would
 * overflow even a long long. */
int mp_mesh_world(const mp_mesh *m) {
  long long w = 1;
  for (int i = 0; i < MP_MESH_NDIMS; i++) {
    if (m->size[i] < 1) return -1;
    w *= m->size[i];
    if (w > MP_MESH_MAX_WORLD) return -1;
  }
  return (int)w;
}

mp_status mp_mesh_validate(mp_ctx *ctx, const mp_mesh *m) {
  for (int i = 0; i < MP_MESH_NDIMS; i++)
    if (m->size[i] < 1)
      return mp_error(ctx, MP_ERR_INVALID, "mesh dim %s=%d must be at least 1", k_dim_names[i],
                      m->size[i]);
  if (mp_mesh_world(m) < 0)
    return mp_error(ctx, MP_ERR_INVALID, "mesh has more than %d ranks; choose smaller dims",
                    MP_MESH_MAX_WORLD);
  if (m->ep < 1) return mp_error(ctx, MP_ERR_INVALID, "ep=%d must be at least 1", m->ep);
  if (m->etp < 0) return mp_error(ctx, MP_ERR_INVALID, "etp=%d must be at least 1", m->etp);
  if (m->dopt < 0) return mp_error(ctx, MP_ERR_INVALID, "dopt=%d must be at least 1", m->dopt);
  if (mp_mesh_dopt(m) > 1) {
    /* Megatron-Core cuts the data-parallel-with-cp ranks into dopt consecutive slices
     * (parallel_state.py, core_v0.14.0); a slice that splits a cp group and Megatron FSDP's
     * instances (dp_replicate over dp_shard already) are not modelled */
    if (m->size[MP_DIM_DP_REPLICATE] % m->dopt)
      return mp_error(ctx, MP_ERR_INVALID, "dopt=%d does not divide dp_replicate=%d: a distributed-optimizer "
                      "instance is dp_replicate / dopt consecutive data-parallel ranks (x cp)", m->dopt,
                      m->size[MP_DIM_DP_REPLICATE]);
    if (m->size[MP_DIM_DP_SHARD] > 1)
      return mp_error(ctx, MP_ERR_INVALID, "dopt=%d with dp_shard=%d: Megatron FSDP's instances are dp_replicate "
                      "over dp_shard already; drop dopt", m->dopt, m->size[MP_DIM_DP_SHARD]);
  }
  if (!mp_mesh_expert_grid(m)) return MP_OK;
  /* the EP x ETP block: ep x etp consecutive ranks of the stage (etp innermost) */
  const int in = inner_ranks(m), st = stage_ranks(m), blk = m->ep * etp_of(m);
  if (in % blk != 0 && (blk % in != 0 || st % blk != 0)) {
    if (etp_of(m) > 1)
      return mp_error(ctx, MP_ERR_INVALID,
                      "ep=%d x etp=%d: the experts' grid takes ep x etp = %d consecutive ranks of a "
                      "pipeline stage (%d ranks, etp innermost); choose ep x etp dividing dp_shard x cp x "
                      "tp = %d, or a multiple of it dividing %d",
                      m->ep, m->etp, blk, st, in, st);
    return mp_error(ctx, MP_ERR_INVALID,
                    "ep=%d: expert parallelism takes ep consecutive ranks of a pipeline stage "
                    "(dp_replicate x dp_shard x cp x tp = %d, tp innermost); choose ep dividing "
                    "dp_shard x cp x tp = %d, or a multiple of it dividing %d",
                    m->ep, st, in, st);
  }
  /* the experts' instances cut their expert-DP group (st / (ep x etp) ranks) the same way;
   * Megatron-Core asserts "Expert data parallel size should be divisible by partial DistOpt
   * shard factor" (parallel_state.py, core_v0.14.0) */
  if (mp_mesh_dopt(m) > 1 && (st / blk) % m->dopt)
    return mp_error(ctx, MP_ERR_INVALID, "dopt=%d does not divide the expert-DP size %d (a stage's %d ranks / ep=%d "
                    "x etp=%d): Megatron-Core asserts the distributed-optimizer instances divide it; choose "
                    "dopt dividing %d, or a smaller ep x etp", m->dopt, st / blk, st, m->ep, etp_of(m), st / blk);
  return MP_OK;
}

static char *trim(char *s) {
  while (*s == ' ' || *s == '\t') s++;
  size_t n = strlen(s);
  while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t')) s[--n] = '\0';
  return s;
}

mp_status mp_mesh_parse(mp_ctx *ctx, const char *spec, int world_size, mp_mesh *out) {
  mp_mesh m;
  mp_mesh_init(&m);
  int seen[MP_MESH_NDIMS + 3] = {0};
  int infer = -1; /* dim index with -1, MP_MESH_NDIMS for ep, MP_MESH_NDIMS + 1 for etp, + 2 for dopt */
  char buf[512];
  if (spec == NULL || spec[0] == '\0')
    return mp_error(ctx, MP_ERR_INVALID, "empty mesh; write it as dp_shard=4,tp=2");
  if (strlen(spec) >= sizeof buf) return mp_error(ctx, MP_ERR_INVALID, "mesh spec too long");
  strcpy(buf, spec);
  char *save = NULL;
  for (char *tok = strtok_r(buf, ",", &save); tok; tok = strtok_r(NULL, ",", &save)) {
    char *eq = strchr(tok, '=');
    if (eq == NULL)
      return mp_error(ctx, MP_ERR_INVALID, "mesh entry '%s' has no size; write it as %s=N", tok,
                      tok);
    *eq = '\0';
    /* "dp_shard=2, tp=4" is what people type: spaces around entries are not part of names. */
    const char *key = trim(tok), *val = trim(eq + 1);
    int d = -1;
    for (int i = 0; i < MP_MESH_NDIMS; i++)
      if (strcmp(key, k_dim_names[i]) == 0) d = i;
    if (strcmp(key, "dp_rep") == 0) d = MP_DIM_DP_REPLICATE;
    if (strcmp(key, "ep") == 0) d = MP_MESH_NDIMS;
    if (strcmp(key, "etp") == 0) d = MP_MESH_NDIMS + 1;
    if (strcmp(key, "dopt") == 0) d = MP_MESH_NDIMS + 2;
    if (d < 0)
      return mp_error(ctx, MP_ERR_INVALID,
                      "unknown mesh dim '%s'; known dims: pp, dp_replicate, dp_shard, cp, tp, ep, etp, dopt",
                      key);
    if (seen[d]) return mp_error(ctx, MP_ERR_INVALID, "mesh dim '%s' given twice", key);
    seen[d] = 1;
    char *end = NULL;
    long v = strtol(val, &end, 10);
    if (end == val || *end != '\0' || (v < 1 && v != -1) || v > MP_MESH_MAX_WORLD)
      return mp_error(ctx, MP_ERR_INVALID,
                      "mesh dim %s='%s': expected an integer in 1..%d (or -1 for the rest)", key,
                      val, MP_MESH_MAX_WORLD);
    if (v == -1) {
      if (infer >= 0)
        return mp_error(ctx, MP_ERR_INVALID, "only one mesh dim may be -1 (the rest of the world)");
      infer = d;
      v = 1;
    }
    if (d == MP_MESH_NDIMS) m.ep = (int)v;
    else if (d == MP_MESH_NDIMS + 1) m.etp = (int)v;
    else if (d == MP_MESH_NDIMS + 2) m.dopt = (int)v;
    else m.size[d] = (int)v;
  }
  if (infer >= 0) {
    if (infer >= MP_MESH_NDIMS)
      return mp_error(ctx, MP_ERR_INVALID, "%s cannot be -1; name its size",
                      infer == MP_MESH_NDIMS ? "ep" : infer == MP_MESH_NDIMS + 1 ? "etp" : "dopt");
    if (world_size <= 0)
      return mp_error(ctx, MP_ERR_INVALID, "a mesh dim of -1 needs a known world size");
    int rest = mp_mesh_world(&m);
    if (rest <= 0 || world_size % rest != 0)
      return mp_error(ctx, MP_ERR_INVALID,
                      "cannot infer %s: the other dims (product %d) do not divide world size %d",
                      k_dim_names[infer], rest, world_size);
    m.size[infer] = world_size / rest;
  }
  MP_CHECK(mp_mesh_validate(ctx, &m));
  if (world_size > 0 && mp_mesh_world(&m) != world_size) {
    char f[256];
    mp_mesh_format(&m, f, sizeof f);
    return mp_error(ctx, MP_ERR_INVALID,
                    "mesh %s has %d ranks but the world has %d; make the dims multiply to %d", f,
                    mp_mesh_world(&m), world_size, world_size);
  }
  *out = m;
  return MP_OK;
}

void mp_mesh_format(const mp_mesh *m, char *buf, size_t cap) {
  size_t used = 0;
  if (cap == 0) return;
  buf[0] = '\0';
  for (int i = 0; i < MP_MESH_NDIMS; i++) {
    if (m->size[i] == 1) continue;
    int w = snprintf(buf + used, cap - used, "%s%s=%d", used ? "," : "", k_dim_names[i],
                     m->size[i]);
    if (w < 0 || (size_t)w >= cap - used) return;
    used += (size_t)w;
  }
  if (m->ep > 1) {
    int w = snprintf(buf + used, cap - used, "%sep=%d", used ? "," : "", m->ep);
    if (w < 0 || (size_t)w >= cap - used) return;
    used += (size_t)w;
  }
  if (m->etp > 0) {
    int w = snprintf(buf + used, cap - used, "%setp=%d", used ? "," : "", m->etp);
    if (w < 0 || (size_t)w >= cap - used) return;
    used += (size_t)w;
  }
  if (mp_mesh_dopt(m) > 1) {
    int w = snprintf(buf + used, cap - used, "%sdopt=%d", used ? "," : "", m->dopt);
    if (w < 0 || (size_t)w >= cap - used) return;
    used += (size_t)w;
  }
  if (used == 0) snprintf(buf, cap, "single");
}

static int is_expert_group(mp_group g) {
  return g == MP_GROUP_EP || g == MP_GROUP_EFSDP || g == MP_GROUP_EDP || g == MP_GROUP_ETP || g == MP_GROUP_EDOPT;
}

/* The sub-coordinates' sizes group g reads (see the file's comment). */
static void ext_sizes_for(const mp_mesh *m, mp_group g, int s[X_N]) {
  const int grid = mp_mesh_expert_grid(m), ep = grid ? 1 : m->ep;
  s[X_PP] = m->size[MP_DIM_PP];
  s[X_INST] = mp_mesh_dopt(m);
  s[X_DPR] = m->size[MP_DIM_DP_REPLICATE] / s[X_INST];
  s[X_EFSDP] = m->size[MP_DIM_DP_SHARD] / ep;
  s[X_EP] = ep;
  s[X_CP] = m->size[MP_DIM_CP];
  s[X_TP] = m->size[MP_DIM_TP];
  if (!grid || !is_expert_group(g)) return;
  const int in = inner_ranks(m), blk = m->ep * etp_of(m);
  s[X_EP] = m->ep;
  s[X_CP] = 1;
  s[X_TP] = etp_of(m);
  if (in % blk == 0) {
    s[X_EFSDP] = in / blk;
  } else {
    /* the expert-DP coordinate a (stage / blk of them) cut into the instances' dopt slices,
     * as dp_replicate's is above (mp_mesh_validate asserts dopt divides it) */
    const int edp = stage_ranks(m) / blk;
    s[X_INST] = edp % s[X_INST] == 0 ? s[X_INST] : 1;
    s[X_DPR] = edp / s[X_INST];
    s[X_EFSDP] = 1;
  }
}


static void ext_coords_for(const mp_mesh *m, mp_group g, int rank, int x[X_N]) {
  int s[X_N];
  ext_sizes_for(m, g, s);
  for (int i = X_N - 1; i >= 0; i--) {
    x[i] = rank % s[i];
    rank /= s[i];
  }
}

static void ext_coords(const mp_mesh *m, int rank, int x[X_N]) { ext_coords_for(m, MP_GROUP_WORLD, rank, x); }

void mp_mesh_coords(const mp_mesh *m, int rank, int c[MP_MESH_NDIMS]) {
  int x[X_N];
  ext_coords(m, rank, x);
  c[MP_DIM_PP] = x[X_PP];
  c[MP_DIM_DP_REPLICATE] = x[X_INST] * (m->size[MP_DIM_DP_REPLICATE] / mp_mesh_dopt(m)) + x[X_DPR];
  c[MP_DIM_DP_SHARD] = x[X_EFSDP] * (mp_mesh_expert_grid(m) ? 1 : m->ep) + x[X_EP];
  c[MP_DIM_CP] = x[X_CP];
  c[MP_DIM_TP] = x[X_TP];
}

int mp_mesh_rank_of(const mp_mesh *m, const int c[MP_MESH_NDIMS]) {
  int r = 0;
  for (int i = 0; i < MP_MESH_NDIMS; i++) r = r * m->size[i] + c[i];
  return r;
}

int mp_mesh_ep_index(const mp_mesh *m, int rank) {
  int x[X_N];
  ext_coords_for(m, MP_GROUP_EP, rank, x);
  return x[X_EP];
}

int mp_mesh_efsdp_index(const mp_mesh *m, int rank) {
  int x[X_N];
  ext_coords_for(m, MP_GROUP_EFSDP, rank, x);
  return x[X_EFSDP];
}

/* Which sub-coordinates vary within a group of kind g. */
static unsigned varying(const mp_mesh *m, mp_group g) {
  switch (g) {
    case MP_GROUP_PP: return 1u << X_PP;
    case MP_GROUP_DP_REPLICATE: return (1u << X_INST) | (1u << X_DPR);
    case MP_GROUP_DP_SHARD: return (1u << X_EFSDP) | (1u << X_EP);
    case MP_GROUP_CP: return 1u << X_CP;
    case MP_GROUP_TP: return 1u << X_TP;
    case MP_GROUP_EP: return 1u << X_EP;
    case MP_GROUP_EFSDP: return 1u << X_EFSDP;
    case MP_GROUP_DP: return (1u << X_INST) | (1u << X_DPR) | (1u << X_EFSDP) | (1u << X_EP);
    case MP_GROUP_FSDP: return (1u << X_EFSDP) | (1u << X_EP) | (1u << X_CP);
    case MP_GROUP_DP_CP: return (1u << X_INST) | (1u << X_DPR) | (1u << X_EFSDP) | (1u << X_EP) | (1u << X_CP);
    case MP_GROUP_WORLD: return (1u << X_N) - 1;
    /* inside dp_shard the experts are replicated over dp_replicate, efsdp and cp */
    case MP_GROUP_EDP: return (1u << X_INST) | (1u << X_DPR) | (1u << X_EFSDP) | (1u << X_CP);
    /* a distributed-optimizer instance: consecutive dp_replicate coordinates x dp_shard x cp;
     * across instances the instance coordinate alone */
    case MP_GROUP_DOPT: return (1u << X_DPR) | (1u << X_EFSDP) | (1u << X_EP) | (1u << X_CP);
    case MP_GROUP_DOPT_INTER: return 1u << X_INST;
    /* the experts' part of an instance: expert-DP less the instance coordinate */
    case MP_GROUP_EDOPT: return (1u << X_DPR) | (1u << X_EFSDP) | (1u << X_CP);
    /* expert TP: the expert grid's innermost etp ranks; one rank inside dp_shard */
    case MP_GROUP_ETP: return mp_mesh_expert_grid(m) ? 1u << X_TP : 0;
    default: return 0;
  }
}

int mp_mesh_group_size(const mp_mesh *m, mp_group g) {
  int s[X_N], n = 1;
  unsigned v = varying(m, g);
  ext_sizes_for(m, g, s);
  for (int i = 0; i < X_N; i++)
    if (v & (1u << i)) n *= s[i];
  return n;
}

int mp_mesh_group_ranks(const mp_mesh *m, mp_group g, int rank, int *ranks) {
  /* Walks the group as an odometer over its varying sub-coordinates, innermost first,
   * moving the rank by strides instead of recomputing it per member (the simulator asks
   * for groups of thousands of ranks). Row-major layout: the ranks come out increasing. */
  int s[X_N], x[X_N], stride[X_N], dims[X_N], count[X_N] = {0};
  unsigned v = varying(m, g);
  ext_sizes_for(m, g, s);
  ext_coords_for(m, g, rank, x);
  int r = 0, step = 1, nd = 0;
  for (int i = X_N - 1; i >= 0; i--) {
    stride[i] = step;
    step *= s[i];
    if (!(v & (1u << i))) r += x[i] * stride[i];
    else if (s[i] > 1) dims[nd++] = i;
  }
  int n = mp_mesh_group_size(m, g);
  for (int k = 0; k < n; k++) {
    ranks[k] = r;
    for (int j = 0; j < nd; j++) {
      const int i = dims[j];
      if (++count[j] < s[i]) {
        r += stride[i];
        break;
      }
      count[j] = 0;
      r -= (s[i] - 1) * stride[i];
    }
  }
  return n;
}

int mp_mesh_group_index(const mp_mesh *m, mp_group g, int rank) {
  int s[X_N], x[X_N], idx = 0;
  unsigned v = varying(m, g);
  ext_sizes_for(m, g, s);
  ext_coords_for(m, g, rank, x);
  for (int i = 0; i < X_N; i++)
    if (v & (1u << i)) idx = idx * s[i] + x[i];
  return idx;
}

int mp_mesh_group_id(const mp_mesh *m, mp_group g, int rank) {
  int s[X_N], x[X_N], id = 0;
  unsigned v = varying(m, g);
  ext_sizes_for(m, g, s);
  ext_coords_for(m, g, rank, x);
  for (int i = 0; i < X_N; i++)
    if (!(v & (1u << i))) id = id * s[i] + x[i];
  return id;
}
