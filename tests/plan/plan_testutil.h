// Helpers shared by the plan tests: building plans and the exact-cover checker.
#ifndef MP_TESTS_PLAN_TESTUTIL_H
#define MP_TESTS_PLAN_TESTUTIL_H

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "exec/plan.h"

// The worked example's model (exec/plan.h): llama family, d_model 8, d_ff 24, 2 heads of 4,
// 2 KV heads, vocab 16, one layer.
inline mp_model SeedModel() {
  mp_model m;
  memset(&m, 0, sizeof m);
  snprintf(m.name, sizeof m.name, "seed-example");
  m.family = MP_FAMILY_LLAMA;
  m.vocab = 16;
  m.d_model = 8;
  m.n_layers = 1;
  m.n_heads = 2;
  m.n_kv_heads = 2;
  m.head_dim = 4;
  m.d_ff = 24;
  m.max_seq = 32;
  m.norm_eps = 1e-5;
  m.rope_theta = 10000.0;
  return m;
}

inline mp_model LoadModel(const char *name) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  EXPECT_EQ(mp_model_load(&ctx, name, &m), MP_OK) << mp_errmsg(&ctx);
  return m;
}

inline mp_mesh Mesh(const char *spec) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  EXPECT_EQ(mp_mesh_parse(&ctx, spec, 0, &m), MP_OK) << spec << ": " << mp_errmsg(&ctx);
  return m;
}

// Builds with mp_build_plan; fails the test (returns NULL) on error.
inline mp_plan *Build(const mp_model &m, const char *mesh, const mp_plan_options *o = nullptr) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh me = Mesh(mesh);
  mp_plan *p = nullptr;
  EXPECT_EQ(mp_build_plan(&ctx, &m, &me, o, &p), MP_OK) << m.name << " " << mesh << ": "
                                                         << mp_errmsg(&ctx);
  return p;
}

inline const mp_param &Param(const mp_plan *p, const char *fqn) {
  int i = mp_plan_find_param(p, fqn);
  EXPECT_GE(i, 0) << "no parameter " << fqn;
  return p->params[i < 0 ? 0 : i];
}

inline std::vector<int64_t> Shape(const int64_t *s, int ndim) { return std::vector<int64_t>(s, s + ndim); }

// At-rest shape on rank (the tile's lengths); empty when the rank stores nothing.
inline std::vector<int64_t> RestShape(const mp_plan *p, const char *fqn, int rank) {
  const mp_param &prm = Param(p, fqn);
  int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM];
  if (!mp_param_tile(p, &prm, rank, off, len)) return {};
  return Shape(len, prm.ndim);
}

// How many ranks must hold each element, derived from the placement rules independently
// of the tile code: every dp_replicate replica holds the whole model; a parameter TP
// leaves replicated is held by each tp rank; routed experts under EP shard over
// dp_shard / ep only, so each cp rank holds them too. Everything else is held once.
inline int ExpectedCopies(const mp_plan *p, const mp_param &prm) {
  const mp_mesh &m = p->mesh;
  int n = m.size[MP_DIM_DP_REPLICATE];
  if (prm.tp_style == MP_TP_NONE) n *= m.size[MP_DIM_TP];
  if (prm.is_expert && m.ep > 1) n *= m.size[MP_DIM_CP];
  return n;
}

// Exact cover by coordinate compression: the tiles' boundaries cut the tensor into
// cells; every cell must lie inside exactly ExpectedCopies() tiles, and tiles must stay
// inside the tensor. Exact for tensors of any size (the cells, not the elements, are
// enumerated).
inline ::testing::AssertionResult CoversExactly(const mp_plan *p, const mp_param &prm) {
  const int world = mp_mesh_world(&p->mesh);
  struct Tile {
    int64_t off[MP_MAX_NDIM], len[MP_MAX_NDIM];
    int rank;
  };
  std::vector<Tile> tiles;
  std::vector<int64_t> cuts[MP_MAX_NDIM];
  for (int d = 0; d < prm.ndim; d++) cuts[d] = {0, prm.shape[d]};
  for (int r = 0; r < world; r++) {
    Tile t;
    t.rank = r;
    if (!mp_param_tile(p, &prm, r, t.off, t.len)) continue;
    for (int d = 0; d < prm.ndim; d++) {
      if (t.off[d] < 0 || t.len[d] <= 0 || t.off[d] + t.len[d] > prm.shape[d])
        return ::testing::AssertionFailure()
               << prm.fqn << ": rank " << r << " tile out of bounds on dim " << d << ": off "
               << t.off[d] << " len " << t.len[d] << " of " << prm.shape[d];
      cuts[d].push_back(t.off[d]);
      cuts[d].push_back(t.off[d] + t.len[d]);
    }
    tiles.push_back(t);
  }
  for (int d = 0; d < prm.ndim; d++) {
    std::sort(cuts[d].begin(), cuts[d].end());
    cuts[d].erase(std::unique(cuts[d].begin(), cuts[d].end()), cuts[d].end());
  }
  const int want = ExpectedCopies(p, prm);
  size_t n0 = cuts[0].size() - 1, n1 = prm.ndim > 1 ? cuts[1].size() - 1 : 1,
         n2 = prm.ndim > 2 ? cuts[2].size() - 1 : 1;
  for (size_t a = 0; a < n0; a++)
    for (size_t b = 0; b < n1; b++)
      for (size_t c = 0; c < n2; c++) {
        int64_t cell[3] = {cuts[0][a], prm.ndim > 1 ? cuts[1][b] : 0,
                           prm.ndim > 2 ? cuts[2][c] : 0};
        int n = 0;
        for (const Tile &t : tiles) {
          bool in = true;
          for (int d = 0; d < prm.ndim && in; d++)
            in = cell[d] >= t.off[d] && cell[d] < t.off[d] + t.len[d];
          n += in;
        }
        if (n != want)
          return ::testing::AssertionFailure()
                 << prm.fqn << ": element (" << cell[0] << "," << cell[1] << "," << cell[2]
                 << ") held by " << n << " ranks, expected " << want;
      }
  return ::testing::AssertionSuccess();
}

#endif
