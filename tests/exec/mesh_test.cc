// Device mesh: rank <-> coordinates and sub-groups, against hand-derived rank lists.
#include <gtest/gtest.h>

#include <vector>

extern "C" {
#include "exec/mesh.h"
}

static std::vector<int> Group(const mp_mesh &m, mp_group g, int rank) {
  std::vector<int> r(mp_mesh_group_size(&m, g));
  int n = mp_mesh_group_ranks(&m, g, rank, r.data());
  r.resize(n);
  return r;
}

// The seeds' example: 8 ranks as [dp_shard=2, tp=4].
TEST(Mesh, SeedExampleTpAndFsdpGroups) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  ASSERT_EQ(mp_mesh_parse(&ctx, "dp_shard=2,tp=4", 8, &m), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(Group(m, MP_GROUP_TP, 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(Group(m, MP_GROUP_TP, 6), (std::vector<int>{4, 5, 6, 7}));
  const std::vector<std::vector<int>> fsdp = {{0, 4}, {1, 5}, {2, 6}, {3, 7}};
  for (int r = 0; r < 8; r++) EXPECT_EQ(Group(m, MP_GROUP_DP_SHARD, r), fsdp[r % 4]) << r;
  EXPECT_EQ(mp_mesh_group_id(&m, MP_GROUP_TP, 5), 1);
  EXPECT_EQ(mp_mesh_group_index(&m, MP_GROUP_TP, 5), 1);
  EXPECT_EQ(mp_mesh_group_index(&m, MP_GROUP_DP_SHARD, 5), 1);
}
