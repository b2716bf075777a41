// Device mesh: rank <-> coordinates and sub-groups, against hand-derived rank lists.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
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

// A worked example: 8 ranks as [dp_shard=2, tp=4].
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

namespace {

bool Contains(const std::string &s, const std::string &sub) {
  return s.find(sub) != std::string::npos;
}

mp_mesh Parse(const char *spec, int world) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  mp_mesh_init(&m);
  EXPECT_EQ(mp_mesh_parse(&ctx, spec, world, &m), MP_OK) << spec << ": " << mp_errmsg(&ctx);
  return m;
}

// The public row-major rank of [pp, dp_replicate, dp_shard, cp, tp], written out.
int RowMajor(const mp_mesh &m, const int c[MP_MESH_NDIMS]) {
  const int *s = m.size;
  return (((c[0] * s[1] + c[1]) * s[2] + c[2]) * s[3] + c[3]) * s[4] + c[4];
}

}  // namespace

TEST(Mesh, CoordsRoundTripOverEveryRank) {
  mp_mesh m = Parse("pp=2,dp_replicate=3,dp_shard=4,cp=2,tp=2,ep=2", 0);
  ASSERT_EQ(mp_mesh_world(&m), 96);
  std::vector<int> seen(96, 0);
  for (int r = 0; r < 96; r++) {
    int c[MP_MESH_NDIMS];
    mp_mesh_coords(&m, r, c);
    for (int d = 0; d < MP_MESH_NDIMS; d++) {
      ASSERT_GE(c[d], 0);
      ASSERT_LT(c[d], m.size[d]);
    }
    EXPECT_EQ(RowMajor(m, c), r);
    EXPECT_EQ(mp_mesh_rank_of(&m, c), r);
    // dp_shard splits as efsdp * ep + e
    EXPECT_EQ(c[MP_DIM_DP_SHARD], mp_mesh_efsdp_index(&m, r) * m.ep + mp_mesh_ep_index(&m, r));
    seen[r]++;
  }
  // Strides: tp 1, cp 2, dp_shard 4, dp_replicate 16, pp 48. 61 = 1*48 + 0*16 + 3*4 + 0*2 + 1.
  int c[MP_MESH_NDIMS];
  mp_mesh_coords(&m, 61, c);
  const int want61[] = {1, 0, 3, 0, 1};
  for (int d = 0; d < MP_MESH_NDIMS; d++) EXPECT_EQ(c[d], want61[d]) << d;
  EXPECT_EQ(mp_mesh_ep_index(&m, 61), 1);     // dp_shard 3 = 1*2 + 1
  EXPECT_EQ(mp_mesh_efsdp_index(&m, 61), 1);
}

// 32 ranks, every dim 2: rank bits are [pp dpr dps cp tp] from high to low. Rank 13 = 01101.
TEST(Mesh, EveryGroupKindOnAFiveDimMesh) {
  mp_mesh m = Parse("pp=2,dp_replicate=2,dp_shard=2,cp=2,tp=2", 32);
  EXPECT_EQ(Group(m, MP_GROUP_TP, 13), (std::vector<int>{12, 13}));
  EXPECT_EQ(Group(m, MP_GROUP_CP, 13), (std::vector<int>{13, 15}));
  EXPECT_EQ(Group(m, MP_GROUP_DP_SHARD, 13), (std::vector<int>{9, 13}));
  EXPECT_EQ(Group(m, MP_GROUP_DP_REPLICATE, 13), (std::vector<int>{5, 13}));
  EXPECT_EQ(Group(m, MP_GROUP_PP, 13), (std::vector<int>{13, 29}));
  EXPECT_EQ(Group(m, MP_GROUP_DP, 13), (std::vector<int>{1, 5, 9, 13}));     // dpr x dps
  EXPECT_EQ(Group(m, MP_GROUP_FSDP, 13), (std::vector<int>{9, 11, 13, 15}));  // dps x cp
  EXPECT_EQ(Group(m, MP_GROUP_EP, 13), (std::vector<int>{13}));  // ep = 1
  EXPECT_EQ(Group(m, MP_GROUP_EFSDP, 13), (std::vector<int>{9, 13}));
  std::vector<int> all(32);
  for (int i = 0; i < 32; i++) all[i] = i;
  EXPECT_EQ(Group(m, MP_GROUP_WORLD, 13), all);
}

// ep carved out of dp_shard: [dp_shard=8], ep=4. dp_shard = efsdp*4 + e, so the EP groups are
// runs of 4 consecutive ranks and the expert-FSDP groups stride by 4.
TEST(Mesh, EpAndEfsdpCarvedOutOfDpShard) {
  mp_mesh m = Parse("dp_shard=8,ep=4", 8);
  EXPECT_EQ(mp_mesh_group_size(&m, MP_GROUP_EP), 4);
  EXPECT_EQ(mp_mesh_group_size(&m, MP_GROUP_EFSDP), 2);
  EXPECT_EQ(Group(m, MP_GROUP_EP, 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(Group(m, MP_GROUP_EP, 6), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(Group(m, MP_GROUP_EFSDP, 0), (std::vector<int>{0, 4}));
  EXPECT_EQ(Group(m, MP_GROUP_EFSDP, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(Group(m, MP_GROUP_DP_SHARD, 5), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(mp_mesh_ep_index(&m, 6), 2);
  EXPECT_EQ(mp_mesh_efsdp_index(&m, 6), 1);
  EXPECT_EQ(mp_mesh_group_index(&m, MP_GROUP_EP, 6), 2);
  EXPECT_EQ(mp_mesh_group_id(&m, MP_GROUP_EP, 6), 1);
}

// With tp=2 inside: rank = dp_shard*2 + tp and dp_shard = efsdp*2 + e (ep=2).
TEST(Mesh, EpWithTensorParallelInside) {
  mp_mesh m = Parse("dp_shard=4,tp=2,ep=2", 8);
  EXPECT_EQ(Group(m, MP_GROUP_EP, 0), (std::vector<int>{0, 2}));
  EXPECT_EQ(Group(m, MP_GROUP_EP, 5), (std::vector<int>{5, 7}));
  EXPECT_EQ(Group(m, MP_GROUP_EFSDP, 0), (std::vector<int>{0, 4}));
  EXPECT_EQ(Group(m, MP_GROUP_EFSDP, 3), (std::vector<int>{3, 7}));
  EXPECT_EQ(Group(m, MP_GROUP_DP_SHARD, 3), (std::vector<int>{1, 3, 5, 7}));
  EXPECT_EQ(Group(m, MP_GROUP_TP, 3), (std::vector<int>{2, 3}));
}

// For every kind of group on several meshes: groups have equal size, every rank is in exactly
// one group, ids run over 0..world/size-1, the group of each member is the same list, the
// rank's index is its position in the list, and ranks come in increasing order.
TEST(Mesh, GroupsPartitionTheWorld) {
  const char *specs[] = {"dp_shard=2,tp=4", "dp_shard=8,ep=4", "pp=2,dp_replicate=3,dp_shard=4,cp=2,tp=2,ep=2",
                         "dp_replicate=2,dp_shard=6,ep=3,tp=2", "tp=1",
                         // the expert grid
                         "dp_replicate=8,ep=8", "dp_replicate=4,tp=4,ep=8,etp=1",
                         "pp=2,dp_replicate=2,dp_shard=4,tp=2,ep=4,etp=1", "pp=2,dp_replicate=4,ep=4",
                         "dp_shard=2,cp=2,tp=2,ep=8",
                         // expert tensor parallelism
                         "dp_shard=4,tp=4,ep=2,etp=4", "pp=2,dp_replicate=4,tp=2,ep=4,etp=2",
                         "dp_shard=2,cp=2,tp=2,ep=2,etp=2", "dp_replicate=2,tp=4,etp=4",
                         // the experts' distributed-optimizer instances
                         "dp_replicate=8,ep=2,dopt=2", "pp=2,dp_replicate=4,tp=2,ep=2,etp=1,dopt=2",
                         "dp_replicate=4,cp=2,tp=2,ep=4,etp=2,dopt=2"};
  for (const char *spec : specs) {
    SCOPED_TRACE(spec);
    mp_mesh m = Parse(spec, 0);
    int world = mp_mesh_world(&m);
    for (int g = 0; g < MP_GROUP_COUNT; g++) {
      SCOPED_TRACE(mp_group_name((mp_group)g));
      int size = mp_mesh_group_size(&m, (mp_group)g);
      ASSERT_GT(size, 0);
      ASSERT_EQ(world % size, 0);
      int n_groups = world / size;
      std::vector<int> count(world, 0);
      std::vector<std::vector<int>> by_id(n_groups);
      for (int r = 0; r < world; r++) {
        std::vector<int> grp = Group(m, (mp_group)g, r);
        ASSERT_EQ((int)grp.size(), size);
        for (size_t k = 1; k < grp.size(); k++) ASSERT_LT(grp[k - 1], grp[k]);
        int idx = mp_mesh_group_index(&m, (mp_group)g, r);
        ASSERT_GE(idx, 0);
        ASSERT_LT(idx, size);
        ASSERT_EQ(grp[idx], r);
        int id = mp_mesh_group_id(&m, (mp_group)g, r);
        ASSERT_GE(id, 0);
        ASSERT_LT(id, n_groups);
        if (by_id[id].empty()) {
          by_id[id] = grp;
          for (int x : grp) count[x]++;
        } else {
          ASSERT_EQ(by_id[id], grp) << r;
        }
      }
      for (int r = 0; r < world; r++) ASSERT_EQ(count[r], 1) << r;
    }
    EXPECT_EQ(mp_mesh_group_size(&m, MP_GROUP_WORLD), world);
    if (!mp_mesh_expert_grid(&m)) {
      EXPECT_EQ(mp_mesh_group_size(&m, MP_GROUP_EP) * mp_mesh_group_size(&m, MP_GROUP_EFSDP),
                mp_mesh_group_size(&m, MP_GROUP_DP_SHARD));
    }
    // a stage's ranks are EP x expert-DP x expert-TP on the grid, EP x expert-DP x tp inside
    // dp_shard
    EXPECT_EQ(mp_mesh_group_size(&m, MP_GROUP_EP) * mp_mesh_group_size(&m, MP_GROUP_EDP) *
                  (mp_mesh_expert_grid(&m) ? mp_mesh_group_size(&m, MP_GROUP_ETP) : m.size[MP_DIM_TP]),
              world / m.size[MP_DIM_PP]);
  }
}

// Megatron-Core's EP 8 over a data-parallel group of 8 (--expert-model-parallel-size 8, DDP
// over dp_replicate): ep does not divide dp_shard=1, so the experts use their own grid
// [edp, ep, etp] = [1, 8, 1] over the 8 ranks: one EP group of all of them, each rank its own
// expert-DP group (nothing to reduce the experts' gradients over), while the dense weights'
// DP group is all 8.
TEST(Mesh, ExpertGridEpOverDataParallel) {
  mp_mesh m = Parse("dp_replicate=8,ep=8", 8);
  EXPECT_TRUE(mp_mesh_expert_grid(&m));
  EXPECT_EQ(Group(m, MP_GROUP_EP, 5), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(Group(m, MP_GROUP_EDP, 5), (std::vector<int>{5}));
  EXPECT_EQ(Group(m, MP_GROUP_DP_REPLICATE, 5), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(mp_mesh_ep_index(&m, 5), 5);
  char f[64];
  mp_mesh_format(&m, f, sizeof f);
  EXPECT_STREQ(f, "dp_replicate=8,ep=8");
}

// EP spanning the TP ranks (etp=1) while attention runs tp=4: 16 ranks as
// [dp_replicate=4, tp=4], rank = 4 d + t. The expert grid [edp=2, ep=8, etp=1]: EP groups are
// 8 consecutive ranks (two TP groups), the expert-DP group of rank 3 the ranks 8 apart; the
// dense groups are untouched (TP {0..3}, DP {3, 7, 11, 15}).
TEST(Mesh, ExpertGridEpSpansTensorParallel) {
  mp_mesh m = Parse("dp_replicate=4,tp=4,ep=8,etp=1", 16);
  EXPECT_EQ(Group(m, MP_GROUP_EP, 3), (std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7}));
  EXPECT_EQ(Group(m, MP_GROUP_EP, 9), (std::vector<int>{8, 9, 10, 11, 12, 13, 14, 15}));
  EXPECT_EQ(Group(m, MP_GROUP_EDP, 3), (std::vector<int>{3, 11}));
  EXPECT_EQ(Group(m, MP_GROUP_TP, 3), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(Group(m, MP_GROUP_DP_REPLICATE, 3), (std::vector<int>{3, 7, 11, 15}));
  EXPECT_EQ(mp_mesh_ep_index(&m, 9), 1);
  EXPECT_EQ(mp_mesh_group_id(&m, MP_GROUP_EP, 9), 1);
  // ep = 8 is a multiple of tp = 4 (dp_shard x cp x tp): the grid reaches into dp_replicate,
  // the expert-FSDP group is one rank, and an expert's gradient is summed over the expert-DP
  // group {3, 11}, not over dp_replicate's {3, 7, 11, 15} (ranks 7 and 15 hold other experts)
  EXPECT_EQ(mp_mesh_group_size(&m, MP_GROUP_EFSDP), 1);
  EXPECT_EQ(mp_mesh_expert_replica_group(&m), MP_GROUP_EDP);
}

// torchtitan's EP borrowed from dp_shard x tp (etp=1) under HSDP: 16 ranks as
// [dp_replicate=2, dp_shard=4, tp=2], rank = 8 r + 2 s + t. ep=4 takes ranks 4k..4k+3; the
// experts' FSDP group varies the rest of dp_shard x tp (8 / 4 = 2: ranks 4 apart) and
// dp_replicate replicates (expert-DP of rank 0: {0, 4, 8, 12}); the dense FSDP group of
// rank 0 is dp_shard's {0, 2, 4, 6}.
TEST(Mesh, ExpertGridBorrowsDpShardAndTp) {
  mp_mesh m = Parse("dp_replicate=2,dp_shard=4,tp=2,ep=4,etp=1", 16);
  EXPECT_EQ(Group(m, MP_GROUP_EP, 0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(Group(m, MP_GROUP_EFSDP, 0), (std::vector<int>{0, 4}));
  EXPECT_EQ(Group(m, MP_GROUP_EFSDP, 13), (std::vector<int>{9, 13}));
  EXPECT_EQ(Group(m, MP_GROUP_EDP, 0), (std::vector<int>{0, 4, 8, 12}));
  EXPECT_EQ(Group(m, MP_GROUP_DP_SHARD, 0), (std::vector<int>{0, 2, 4, 6}));
  EXPECT_EQ(mp_mesh_efsdp_index(&m, 13), 1);
  // ep = 4 divides dp_shard x tp = 8: the expert-DP group {0, 4, 8, 12} is the expert-FSDP
  // group {0, 4} times dp_replicate {0, 8}; after the reduce-scatter over the former the
  // replicas are dp_replicate's
  EXPECT_EQ(mp_mesh_expert_replica_group(&m), MP_GROUP_DP_REPLICATE);
}

// EP inside each pipeline stage: [pp=2, dp_replicate=4], ep=4 per stage.
TEST(Mesh, ExpertGridStaysInsideAStage) {
  mp_mesh m = Parse("pp=2,dp_replicate=4,ep=4", 8);
  EXPECT_EQ(Group(m, MP_GROUP_EP, 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(Group(m, MP_GROUP_EDP, 5), (std::vector<int>{5}));
  EXPECT_EQ(mp_mesh_expert_replica_group(&m), MP_GROUP_EDP);
  // inside dp_shard (ep divides it, no etp): the replicas are dp_replicate's
  const mp_mesh in = Parse("dp_replicate=2,dp_shard=2,ep=2", 4);
  EXPECT_EQ(mp_mesh_expert_replica_group(&in), MP_GROUP_DP_REPLICATE);
}

TEST(Mesh, ExpertGridRefusals) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  // ep neither divides dp_shard x cp x tp = 2 nor divides the stage's 6 ranks
  EXPECT_EQ(mp_mesh_parse(&ctx, "dp_replicate=3,tp=2,ep=4", 0, &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "ep=4: expert parallelism takes ep consecutive ranks")) << mp_errmsg(&ctx);
  // ep x etp = 3 x 2 = 6 neither divides dp_shard x cp x tp = 4 nor is a multiple of it
  EXPECT_EQ(mp_mesh_parse(&ctx, "dp_replicate=3,tp=4,ep=3,etp=2", 0, &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "ep=3 x etp=2: the experts' grid takes ep x etp = 6 consecutive ranks"))
      << mp_errmsg(&ctx);
  // ep x etp = 16 x 4 = 64 is more than the stage's 32 ranks (Megatron-Core asserts the
  // stage's ranks divide by etp x ep x pp, parallel_state.py core_v0.14.0)
  EXPECT_EQ(mp_mesh_parse(&ctx, "dp_replicate=8,tp=4,ep=16,etp=4", 0, &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "ep=16 x etp=4")) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_mesh_parse(&ctx, "dp_replicate=2,etp=-1", 0, &m), MP_ERR_INVALID);
  mp_mesh_init(&m);
  m.etp = -2;
  EXPECT_EQ(mp_mesh_validate(&ctx, &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "etp=-2 must be at least 1")) << mp_errmsg(&ctx);
}

// Expert tensor parallelism: 16 ranks as [dp_shard=4, tp=4], rank = 4 s + t, with ep=2 and
// etp=4 (mesh.h's example). The expert grid [edp, ep, etp] = [2, 2, 4], etp innermost
// (Megatron-Core's expert RankGenerator order "tp-ep-dp-pp"): a stage rank = (b x 2 + e) x 4
// + t. Rank 5 (b 0, e 1, t 1): ETP group {4, 5, 6, 7} (e 1, every t), EP group {1, 5} (t 1,
// e 0 and 1), expert-DP group {5, 13} (b 0 and 1: the ranks holding the same expert slices,
// 16 / (2 x 4)), expert-FSDP {5, 13} (dp_shard x cp x tp / (ep x etp) = 2); the dense TP
// group is the same four ranks and the dense FSDP group {1, 5, 9, 13}.
TEST(Mesh, ExpertTensorParallelGroups) {
  mp_mesh m = Parse("dp_shard=4,tp=4,ep=2,etp=4", 16);
  EXPECT_TRUE(mp_mesh_expert_grid(&m));
  EXPECT_EQ(Group(m, MP_GROUP_ETP, 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(Group(m, MP_GROUP_EP, 5), (std::vector<int>{1, 5}));
  EXPECT_EQ(Group(m, MP_GROUP_EDP, 5), (std::vector<int>{5, 13}));
  EXPECT_EQ(Group(m, MP_GROUP_EFSDP, 5), (std::vector<int>{5, 13}));
  EXPECT_EQ(Group(m, MP_GROUP_TP, 5), (std::vector<int>{4, 5, 6, 7}));
  EXPECT_EQ(Group(m, MP_GROUP_DP_SHARD, 5), (std::vector<int>{1, 5, 9, 13}));
  EXPECT_EQ(mp_mesh_group_index(&m, MP_GROUP_ETP, 5), 1);
  EXPECT_EQ(mp_mesh_ep_index(&m, 5), 1);
  EXPECT_EQ(mp_mesh_group_index(&m, MP_GROUP_EDP, 13), 1);
  char f[64];
  mp_mesh_format(&m, f, sizeof f);
  EXPECT_STREQ(f, "dp_shard=4,tp=4,ep=2,etp=4");
  // without etp (EP inside dp_shard) the expert-TP group is the rank alone
  mp_mesh d = Parse("dp_shard=4,tp=4,ep=2", 16);
  EXPECT_EQ(Group(d, MP_GROUP_ETP, 5), (std::vector<int>{5}));
}

// NeMo's Llama 4 Scout layout on 256 H100 (scripts/performance/recommended_model_configs/
// model_configs_h100.csv: TP 4, EP 16, ETP 4, no FSDP): dp_replicate=64, tp=4, so a stage of
// 256 ranks, rank = 4 d + t. The expert grid [4, 16, 4] (ep x etp = 64 is a multiple of
// dp_shard x cp x tp = 4 dividing 256): rank 70 = (1 x 16 + 1) x 4 + 2. ETP {68, 69, 70, 71}
// (its TP group); EP the ranks 4 apart within 64..127 with t 2: 66, 70, .., 126; expert-DP
// the ranks 64 apart: {6, 70, 134, 198}.
TEST(Mesh, ExpertTensorParallelNemoLlama4Scout) {
  mp_mesh m = Parse("dp_replicate=64,tp=4,ep=16,etp=4", 256);
  EXPECT_EQ(Group(m, MP_GROUP_ETP, 70), (std::vector<int>{68, 69, 70, 71}));
  std::vector<int> ep;
  for (int k = 0; k < 16; k++) ep.push_back(64 + 4 * k + 2);
  EXPECT_EQ(Group(m, MP_GROUP_EP, 70), ep);
  EXPECT_EQ(Group(m, MP_GROUP_EDP, 70), (std::vector<int>{6, 70, 134, 198}));
  EXPECT_EQ(Group(m, MP_GROUP_DP_REPLICATE, 70).size(), 64u);
}

TEST(Mesh, ParseAliasesInferenceAndFormat) {
  mp_mesh m = Parse("dp_rep=2,tp=2", 4);
  EXPECT_EQ(m.size[MP_DIM_DP_REPLICATE], 2);
  m = Parse("dp_shard=2, tp = 4 ", 8);  // spaces around entries are ignored
  EXPECT_EQ(m.size[MP_DIM_DP_SHARD], 2);
  EXPECT_EQ(m.size[MP_DIM_TP], 4);
  m = Parse("dp_shard=-1,tp=2", 16);
  EXPECT_EQ(m.size[MP_DIM_DP_SHARD], 8);
  m = Parse("tp=2,dp_shard=4,ep=2", 0);  // order of entries does not matter
  char buf[128];
  mp_mesh_format(&m, buf, sizeof buf);
  EXPECT_STREQ(buf, "dp_shard=4,tp=2,ep=2");
  mp_mesh_init(&m);
  mp_mesh_format(&m, buf, sizeof buf);
  EXPECT_STREQ(buf, "single");
  EXPECT_EQ(mp_mesh_world(&m), 1);
  m = Parse("pp=2,dp_replicate=2,dp_shard=2,cp=2,tp=2", 32);
  mp_mesh_format(&m, buf, sizeof buf);
  EXPECT_STREQ(buf, "pp=2,dp_replicate=2,dp_shard=2,cp=2,tp=2");
  char small[8];
  mp_mesh_format(&m, small, sizeof small);  // truncates, stays terminated
  EXPECT_LT(strlen(small), sizeof small);
  EXPECT_STREQ(mp_mesh_dim_name(MP_DIM_TP), "tp");
  EXPECT_STREQ(mp_group_name(MP_GROUP_EFSDP), "efsdp");
}

TEST(Mesh, ParseErrorsNameTheProblem) {
  struct { const char *spec; int world; const char *want; } cases[] = {
      {"foo=2", 0, "unknown mesh dim 'foo'; known dims: pp, dp_replicate, dp_shard, cp, tp, ep, etp"},
      {"tp=2,tp=2", 0, "mesh dim 'tp' given twice"},
      {"dp_rep=2,dp_replicate=2", 0, "given twice"},
      {"tp=0", 0, "mesh dim tp='0': expected an integer in 1..1048576 (or -1 for the rest)"},
      {"tp=-2", 0, "mesh dim tp='-2': expected an integer in 1..1048576"},
      {"tp=2097152", 0, "mesh dim tp='2097152': expected an integer in 1..1048576"},
      {"tp=abc", 0, "mesh dim tp='abc'"},
      {"tp=2x", 0, "mesh dim tp='2x'"},
      {"tp=", 0, "mesh dim tp=''"},
      {"tp", 0, "mesh entry 'tp' has no size"},
      {"", 0, "empty mesh"},
      {"tp=2,dp_shard=2", 8, "mesh dp_shard=2,tp=2 has 4 ranks but the world has 8"},
      {"dp_shard=6,ep=4", 0, "ep=4: expert parallelism takes ep consecutive ranks of a pipeline stage"},
      {"tp=2,ep=4", 0, "choose ep dividing dp_shard x cp x tp = 2, or a multiple of it dividing 2"},
      {"dp_shard=-1,tp=-1", 8, "only one mesh dim may be -1"},
      {"dp_shard=-1,tp=3", 8, "cannot infer dp_shard"},
      {"dp_shard=-1", 0, "needs a known world size"},
      {"dp_shard=4,ep=-1", 0, "ep cannot be -1"},
      {"tp=99999999999", 0, "mesh dim tp='99999999999'"},
      // each dim is allowed, their product is not (and must not overflow computing it)
      {"pp=1048576,dp_replicate=1048576,dp_shard=1048576,cp=1048576,tp=1048576", 0,
       "more than 1048576 ranks"},
  };
  for (auto &c : cases) {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_mesh m;
    mp_mesh_init(&m);
    m.size[MP_DIM_TP] = 7;  // untouched on failure
    EXPECT_EQ(mp_mesh_parse(&ctx, c.spec, c.world, &m), MP_ERR_INVALID) << c.spec;
    EXPECT_TRUE(Contains(mp_errmsg(&ctx), c.want)) << c.spec << " -> " << mp_errmsg(&ctx);
    EXPECT_EQ(m.size[MP_DIM_TP], 7) << c.spec;
  }
}

TEST(Mesh, ValidateCatchesHandBuiltMeshes) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh m;
  mp_mesh_init(&m);
  EXPECT_EQ(mp_mesh_validate(&ctx, &m), MP_OK);
  m.size[MP_DIM_CP] = 0;
  EXPECT_EQ(mp_mesh_validate(&ctx, &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(mp_errmsg(&ctx), "cp=0"));
  EXPECT_EQ(mp_mesh_world(&m), -1);
  mp_mesh_init(&m);
  m.size[MP_DIM_DP_SHARD] = 4;
  m.ep = 0;
  EXPECT_EQ(mp_mesh_validate(&ctx, &m), MP_ERR_INVALID);
  m.ep = 8;
  EXPECT_EQ(mp_mesh_validate(&ctx, &m), MP_ERR_INVALID);
  m.ep = 4;
  EXPECT_EQ(mp_mesh_validate(&ctx, &m), MP_OK);
}
