// Plan IR: the worked example of exec/plan.h, exact cover of every weight by its shards, local
// shapes of llama3.1-8b and qwen3-30b-a3b on several meshes, per-rank totals and FSDP
// units, all against numbers derived by hand in the comments.
#include "tests/plan/plan_testutil.h"

typedef std::vector<int64_t> V;

// ---- the worked example of exec/plan.h -------------------------------------------------

// d_model=8, d_ff=24, dp_shard=4 x tp=2 (rank = dp_shard_index * 2 + tp_index):
//   up   [24, 8] colwise -> [12, 8] after TP -> 12 rows / 4 = [3, 8] at rest
//   down [8, 24] rowwise -> [8, 12] after TP ->  8 rows / 4 = [2, 12] at rest
TEST(PlanSeed, WorkedExampleShapes) {
  mp_model m = SeedModel();
  mp_plan *p = Build(m, "dp_shard=4,tp=2");
  ASSERT_NE(p, nullptr);
  const mp_param &up = Param(p, "layers.0.mlp.up_proj.weight");
  const mp_param &down = Param(p, "layers.0.mlp.down_proj.weight");
  EXPECT_EQ(Shape(up.shape, 2), (V{24, 8}));
  EXPECT_EQ(Shape(up.tp_shape, 2), (V{12, 8}));
  EXPECT_EQ(Shape(down.shape, 2), (V{8, 24}));
  EXPECT_EQ(Shape(down.tp_shape, 2), (V{8, 12}));
  EXPECT_EQ(up.tp_style, MP_TP_COLWISE);
  EXPECT_EQ(down.tp_style, MP_TP_ROWWISE);
  EXPECT_EQ(up.place[MP_AXIS_TP].dim, 0);
  EXPECT_EQ(down.place[MP_AXIS_TP].dim, 1);
  for (int r = 0; r < 8; r++) {
    EXPECT_EQ(RestShape(p, "layers.0.mlp.up_proj.weight", r), (V{3, 8})) << r;
    EXPECT_EQ(RestShape(p, "layers.0.mlp.down_proj.weight", r), (V{2, 12})) << r;
  }
  // Rank 3: tp index 1, dp_shard index 1.
  //   up:   TP rows [12, 24), FSDP chunk 1 of 3 rows -> rows [15, 18), all 8 columns
  //   down: TP cols [12, 24), FSDP chunk 1 of 2 rows -> rows [2, 4)
  int64_t off[3], len[3];
  ASSERT_TRUE(mp_param_tile(p, &up, 3, off, len));
  EXPECT_EQ(Shape(off, 2), (V{15, 0}));
  ASSERT_TRUE(mp_param_tile(p, &down, 3, off, len));
  EXPECT_EQ(Shape(off, 2), (V{2, 12}));
  // The tp-local tile is what the all-gather yields: rank 3's up is rows [12, 24).
  mp_param_tp_tile(p, &up, 3, off, len);
  EXPECT_EQ(Shape(off, 2), (V{12, 0}));
  EXPECT_EQ(Shape(len, 2), (V{12, 8}));
  for (int i = 0; i < p->n_params; i++) EXPECT_TRUE(CoversExactly(p, p->params[i]));
  mp_plan_destroy(p);
}

// Units of the seed model: root + one block = 2.
//   layers.0 tp-local: attention_norm 8 + q,k,v [4,8] = 32 each + o [8,4] 32 + ffn_norm 8
//            + gate, up [12,8] 96 each + down [8,12] 96 = 8+128+8+288 = 432;
//            at rest per rank (ceil chunks over 4): 2 + 4*8 + 2 + 3*24 = 108.
//   root:    tok_embeddings [8,8] 64 + norm 8 + output [8,8] 64 = 136; shard 16+2+16 = 34.
TEST(PlanSeed, Units) {
  mp_model m = SeedModel();
  mp_plan *p = Build(m, "dp_shard=4,tp=2");
  ASSERT_NE(p, nullptr);
  ASSERT_EQ(p->n_units, 2);
  EXPECT_STREQ(p->units[0].name, "root");
  EXPECT_EQ(p->units[0].layer, -1);
  EXPECT_EQ(p->units[0].n_params, 3);
  EXPECT_EQ(p->units[0].numel_tp, 136);
  EXPECT_EQ(p->units[0].numel_shard, 34);
  EXPECT_STREQ(p->units[1].name, "layers.0");
  EXPECT_EQ(p->units[1].n_params, 9);
  EXPECT_EQ(p->units[1].numel_tp, 432);
  EXPECT_EQ(p->units[1].numel_shard, 108);
  mp_plan_totals t;
  mp_plan_rank_totals(p, 0, &t);
  EXPECT_EQ(t.params_numel, 108 + 34);
  EXPECT_EQ(t.param_bytes, (108 + 34) * 4);
  EXPECT_EQ(t.grad_bytes, (108 + 34) * 4);
  EXPECT_EQ(t.optimizer_bytes, 2 * (108 + 34) * 4);
  EXPECT_EQ(t.max_unit_gathered_bytes, 432 * 2); // bf16
  mp_plan_destroy(p);
}

// Uneven FSDP chunks: dp_shard=5, tp=1. down [8, 24]: chunk ceil(8/5) = 2 -> ranks 0..3
// hold 2 rows, rank 4 nothing; up [24, 8]: chunk 5 -> 5,5,5,5,4 rows.
TEST(PlanSeed, UnevenChunks) {
  mp_model m = SeedModel();
  mp_plan *p = Build(m, "dp_shard=5");
  ASSERT_NE(p, nullptr);
  for (int r = 0; r < 4; r++) EXPECT_EQ(RestShape(p, "layers.0.mlp.down_proj.weight", r), (V{2, 24}));
  EXPECT_EQ(RestShape(p, "layers.0.mlp.down_proj.weight", 4), V{});
  EXPECT_EQ(mp_param_local_numel(p, &Param(p, "layers.0.mlp.down_proj.weight"), 4), 0);
  EXPECT_EQ(RestShape(p, "layers.0.mlp.up_proj.weight", 3), (V{5, 8}));
  EXPECT_EQ(RestShape(p, "layers.0.mlp.up_proj.weight", 4), (V{4, 8}));
  for (int i = 0; i < p->n_params; i++) EXPECT_TRUE(CoversExactly(p, p->params[i]));
  mp_plan_destroy(p);
}

// Padded FSDP shards by hand (FSDP2 pads every rank's shard to the chunk, torch.chunk's
// ceil(rows / n) rows; what each rank stores, gathers and reduce-scatters into). tiny-odd:
// vocab 250, d_model 48, 6 heads and 3 KV heads of 8, d_ff 136.
//   dp_shard=3: tok_embeddings ceil(250/3) = 84 rows x 48 = 4032 (floor: 83 -> 3984);
//     gate/up [136, 48]: 46 x 48 = 2208 (floor: 45 -> 2160); down [48, 136]: 16 x 136 = 2176;
//     q, o [48, 48]: 16 x 48 = 768; k, v [24, 48]: 8 x 48 = 384; norms [48]: 16.
//     A block's unit: 2 x 768 + 2 x 384 + 2 x 2208 + 2176 + 2 x 16 = 8928 a rank.
//   dp_shard=4: tok_embeddings 63 x 48 = 3024 (floor: 62 -> 2976); gate/up 34 x 48 = 1632;
//     down 12 x 136 = 1632; q, o 12 x 48 = 576; k, v 6 x 48 = 288; norms 12.
//     A block's unit: 2 x 576 + 2 x 288 + 2 x 1632 + 1632 + 2 x 12 = 6648.
// The tail rank stores the rows left: 250 - 2 x 84 = 82 on dp_shard=3, 250 - 3 x 63 = 61 on 4.
TEST(PlanTinyOdd, PaddedShardsAreCeilChunks) {
  mp_model m = LoadModel("tiny-odd");
  struct Want {
    const char *mesh;
    int g;
    int64_t emb, gate, down, q, k, norm, unit, tail_rows;
  } want[] = {{"dp_shard=3", 3, 4032, 2208, 2176, 768, 384, 16, 8928, 82},
              {"dp_shard=4", 4, 3024, 1632, 1632, 576, 288, 12, 6648, 61}};
  for (const Want &w : want) {
    SCOPED_TRACE(w.mesh);
    mp_plan *p = Build(m, w.mesh);
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(mp_param_padded_shard_numel(&Param(p, "tok_embeddings.weight"), w.g), w.emb);
    EXPECT_EQ(mp_param_padded_shard_numel(&Param(p, "output.weight"), w.g), w.emb);
    EXPECT_EQ(mp_param_padded_shard_numel(&Param(p, "layers.5.mlp.gate_proj.weight"), w.g), w.gate);
    EXPECT_EQ(mp_param_padded_shard_numel(&Param(p, "layers.5.mlp.up_proj.weight"), w.g), w.gate);
    EXPECT_EQ(mp_param_padded_shard_numel(&Param(p, "layers.5.mlp.down_proj.weight"), w.g), w.down);
    EXPECT_EQ(mp_param_padded_shard_numel(&Param(p, "layers.5.attention.q_proj.weight"), w.g), w.q);
    EXPECT_EQ(mp_param_padded_shard_numel(&Param(p, "layers.5.attention.k_proj.weight"), w.g), w.k);
    EXPECT_EQ(mp_param_padded_shard_numel(&Param(p, "layers.5.ffn_norm.weight"), w.g), w.norm);
    const mp_fsdp_unit &u = p->units[Param(p, "layers.5.mlp.down_proj.weight").fsdp_unit];
    EXPECT_STREQ(u.name, "layers.5");
    EXPECT_EQ(u.numel_shard, w.unit);
    EXPECT_EQ(RestShape(p, "tok_embeddings.weight", w.g - 1), (V{w.tail_rows, 48}));
    mp_plan_destroy(p);
  }
}

// The checker itself can fail: a plan whose TP tile is too small leaves a gap; a plan
// that forgets the FSDP split holds rows twice.
TEST(PlanSeed, CoverCheckerDetectsGapsAndOverlaps) {
  mp_model m = SeedModel();
  mp_plan *p = Build(m, "dp_shard=4,tp=2");
  ASSERT_NE(p, nullptr);
  int i = mp_plan_find_param(p, "layers.0.mlp.up_proj.weight");
  p->params[i].tp_shape[0] = 8; // rows 8..11 and 20..23 of up held by no rank
  EXPECT_FALSE(CoversExactly(p, p->params[i]));
  p->params[i].tp_shape[0] = 12;
  EXPECT_TRUE(CoversExactly(p, p->params[i]));
  p->params[i].place[MP_AXIS_FSDP].kind = MP_PLACEMENT_REPLICATE; // every row held 4 times
  EXPECT_FALSE(CoversExactly(p, p->params[i]));
  mp_plan_destroy(p);
}

// ---- exact cover over models and meshes ---------------------------------------------------

struct CoverCase {
  const char *model; // "seed" for SeedModel()
  const char *mesh;
  int pad_vocab;
};

class Cover : public ::testing::TestWithParam<CoverCase> {};

TEST_P(Cover, EveryParameterExactlyCovered) {
  const CoverCase &c = GetParam();
  mp_model m = strcmp(c.model, "seed") == 0 ? SeedModel() : LoadModel(c.model);
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.tp.pad_vocab = c.pad_vocab;
  mp_plan *p = Build(m, c.mesh, &o);
  ASSERT_NE(p, nullptr);
  for (int i = 0; i < p->n_params; i++) ASSERT_TRUE(CoversExactly(p, p->params[i])) << c.mesh;
  mp_plan_destroy(p);
}

INSTANTIATE_TEST_SUITE_P(
    Meshes, Cover,
    ::testing::Values(CoverCase{"seed", "dp_shard=4,tp=2", 0}, CoverCase{"seed", "dp_shard=3,tp=2", 0},
                      CoverCase{"seed", "dp_replicate=2,dp_shard=2,tp=2", 0},
                      CoverCase{"seed", "dp_shard=7", 0}, CoverCase{"seed", "cp=2,dp_shard=3", 0},
                      CoverCase{"tiny-dense", "pp=2,dp_shard=2,tp=2", 0},
                      CoverCase{"tiny-moe", "dp_shard=4,ep=2,tp=2", 0},
                      CoverCase{"tiny-moe", "dp_shard=4,ep=2,cp=2", 0},
                      CoverCase{"tiny-moe", "dp_shard=6,ep=2", 0},
                      CoverCase{"gpt2-124m", "dp_shard=3,tp=2", 1},
                      CoverCase{"llama3.1-8b", "tp=8", 0}, CoverCase{"llama3.1-8b", "dp_shard=8", 0},
                      CoverCase{"llama3.1-8b", "dp_shard=4,tp=2", 0},
                      CoverCase{"llama3.1-8b", "dp_shard=3,tp=4", 0},
                      CoverCase{"llama3.1-8b", "pp=4,dp_shard=2,tp=2", 0},
                      CoverCase{"qwen3-30b-a3b", "dp_shard=8,ep=8", 0},
                      CoverCase{"qwen3-30b-a3b", "dp_shard=16,ep=4", 0},
                      CoverCase{"qwen3-30b-a3b", "dp_shard=4,ep=2,tp=2", 0},
                      CoverCase{"qwen3-30b-a3b", "dp_shard=6,ep=2", 0}));

// The tree holds exactly the parameters the model spec counts (independent formula in
// exec/model.c), and the shapes sum to it.
TEST(PlanTree, ParameterCountMatchesModel) {
  for (const char *name : {"llama3.1-8b", "qwen3-30b-a3b", "gpt2-124m", "tiny-moe", "tiny-dense",
                           "mixtral-8x7b", "qwen3-8b"}) {
    mp_model m = LoadModel(name);
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_mesh me;
    mp_mesh_init(&me);
    mp_plan *p = nullptr;
    ASSERT_EQ(mp_plan_create(&ctx, &m, &me, nullptr, &p), MP_OK) << mp_errmsg(&ctx);
    int64_t n = 0;
    for (int i = 0; i < p->n_params; i++) n += mp_param_numel(&p->params[i]);
    EXPECT_EQ(n, mp_model_param_count(&m)) << name;
    mp_plan_destroy(p);
  }
}

// FQNs as torchtitan names them; gpt biases; qwen3 q/k norms; tied head absent.
TEST(PlanTree, Names) {
  mp_model g = LoadModel("gpt2-124m");
  mp_plan *p = Build(g, "dp_shard=2");
  ASSERT_NE(p, nullptr);
  for (const char *f : {"tok_embeddings.weight", "pos_embeddings.weight",
                        "layers.0.attention_norm.weight", "layers.0.attention_norm.bias",
                        "layers.11.attention.q_proj.bias", "layers.3.attention.o_proj.bias",
                        "layers.3.mlp.up_proj.bias", "layers.3.mlp.down_proj.weight",
                        "norm.bias", "layers.5.ffn_norm.bias"})
    EXPECT_GE(mp_plan_find_param(p, f), 0) << f;
  EXPECT_EQ(mp_plan_find_param(p, "output.weight"), -1); // tied
  EXPECT_EQ(mp_plan_find_param(p, "layers.0.mlp.gate_proj.weight"), -1); // GELU MLP
  EXPECT_EQ(Shape(Param(p, "pos_embeddings.weight").shape, 2), (V{1024, 768}));
  mp_plan_destroy(p);

  mp_model q = LoadModel("qwen3-30b-a3b");
  p = Build(q, "dp_shard=8,ep=8");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(Shape(Param(p, "layers.47.attention.q_norm.weight").shape, 1), (V{128}));
  EXPECT_EQ(Shape(Param(p, "layers.0.moe.router.weight").shape, 2), (V{128, 2048}));
  EXPECT_EQ(Shape(Param(p, "layers.0.moe.experts.down_proj.weight").shape, 3), (V{128, 2048, 768}));
  EXPECT_EQ(mp_plan_find_param(p, "layers.0.mlp.up_proj.weight"), -1);
  EXPECT_EQ(mp_plan_find_param(p, "layers.0.attention.q_proj.bias"), -1);
  mp_plan_destroy(p);
}

// ---- llama3.1-8b: H 4096, q 32x128 = 4096, kv 8x128 = 1024, d_ff 14336, vocab 128256 ----

TEST(PlanLlama8b, Tp8) {
  mp_model m = LoadModel("llama3.1-8b");
  mp_plan *p = Build(m, "tp=8");
  ASSERT_NE(p, nullptr);
  // dp_shard = 1: at rest == after TP.
  EXPECT_EQ(RestShape(p, "layers.0.attention.q_proj.weight", 5), (V{512, 4096}));
  EXPECT_EQ(RestShape(p, "layers.0.attention.k_proj.weight", 5), (V{128, 4096}));
  EXPECT_EQ(RestShape(p, "layers.0.attention.o_proj.weight", 5), (V{4096, 512}));
  EXPECT_EQ(RestShape(p, "layers.0.mlp.gate_proj.weight", 5), (V{1792, 4096}));
  EXPECT_EQ(RestShape(p, "layers.0.mlp.down_proj.weight", 5), (V{4096, 1792}));
  EXPECT_EQ(RestShape(p, "tok_embeddings.weight", 5), (V{16032, 4096}));
  EXPECT_EQ(RestShape(p, "output.weight", 5), (V{16032, 4096}));
  EXPECT_EQ(RestShape(p, "layers.0.ffn_norm.weight", 5), (V{4096}));
  EXPECT_EQ(Param(p, "tok_embeddings.weight").tp_style, MP_TP_VOCAB);
  // Per rank: every Linear and embedding / 8, norms (32*2 + 1) * 4096 = 266240 whole.
  // Total 8030261248: (8030261248 - 266240) / 8 + 266240 = 1004015616.
  mp_plan_totals t;
  mp_plan_rank_totals(p, 7, &t);
  EXPECT_EQ(t.params_numel, 1004015616LL);
  mp_plan_destroy(p);
}

TEST(PlanLlama8b, DpShard8) {
  mp_model m = LoadModel("llama3.1-8b");
  mp_plan *p = Build(m, "dp_shard=8");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(RestShape(p, "layers.31.attention.q_proj.weight", 0), (V{512, 4096}));
  EXPECT_EQ(RestShape(p, "layers.31.attention.k_proj.weight", 0), (V{128, 4096}));
  EXPECT_EQ(RestShape(p, "layers.31.mlp.down_proj.weight", 0), (V{512, 14336}));
  EXPECT_EQ(RestShape(p, "layers.31.mlp.up_proj.weight", 0), (V{1792, 4096}));
  EXPECT_EQ(RestShape(p, "tok_embeddings.weight", 0), (V{16032, 4096}));
  EXPECT_EQ(RestShape(p, "norm.weight", 0), (V{512}));
  // Per block: attention 2*4096*4096 + 2*1024*4096 = 41943040, MLP 3*4096*14336 =
  // 176160768, norms 8192: 218112000; x32 = 6979584000; embeddings + head
  // 2*128256*4096 = 1050673152; final norm 4096: 8030261248. Every dim 0 divides by 8,
  // so each rank holds 8030261248 / 8 = 1003782656 elements, fp32: 4015130624 bytes.
  mp_plan_totals t;
  for (int r : {0, 7}) {
    mp_plan_rank_totals(p, r, &t);
    EXPECT_EQ(t.params_numel, 1003782656LL);
    EXPECT_EQ(t.param_bytes, 4015130624LL);
    EXPECT_EQ(t.optimizer_bytes, 2 * 4015130624LL);
  }
  // Largest unit gathered: a block, 218112000 bf16 elements (root is 1050677248: larger).
  EXPECT_EQ(t.max_unit_gathered_bytes, 2 * (2 * 128256LL * 4096 + 4096));
  EXPECT_EQ(p->n_units, 33);
  EXPECT_EQ(p->units[1].numel_tp, 218112000LL);
  EXPECT_EQ(p->units[1].numel_shard, 218112000LL / 8);
  mp_plan_destroy(p);
}

TEST(PlanLlama8b, DpShard4Tp2) {
  mp_model m = LoadModel("llama3.1-8b");
  mp_plan *p = Build(m, "dp_shard=4,tp=2");
  ASSERT_NE(p, nullptr);
  // q [4096,4096] -> [2048,4096] -> [512,4096]; k [1024,4096] -> [512,4096] -> [128,4096]
  // o [4096,4096] -> [4096,2048] -> [1024,2048]; gate [14336,4096] -> [7168,4096] -> [1792,4096]
  // down [4096,14336] -> [4096,7168] -> [1024,7168]; tok_embeddings -> [64128,4096] -> [16032,4096]
  EXPECT_EQ(Shape(Param(p, "layers.2.attention.q_proj.weight").tp_shape, 2), (V{2048, 4096}));
  EXPECT_EQ(RestShape(p, "layers.2.attention.q_proj.weight", 3), (V{512, 4096}));
  EXPECT_EQ(RestShape(p, "layers.2.attention.k_proj.weight", 3), (V{128, 4096}));
  EXPECT_EQ(RestShape(p, "layers.2.attention.o_proj.weight", 3), (V{1024, 2048}));
  EXPECT_EQ(RestShape(p, "layers.2.mlp.gate_proj.weight", 3), (V{1792, 4096}));
  EXPECT_EQ(RestShape(p, "layers.2.mlp.down_proj.weight", 3), (V{1024, 7168}));
  EXPECT_EQ(RestShape(p, "tok_embeddings.weight", 3), (V{16032, 4096}));
  EXPECT_EQ(RestShape(p, "norm.weight", 3), (V{1024}));
  // Totals: Linear + embeddings split 8 ways, norms 266240 split 4 ways (replicated over
  // tp): (8030261248 - 266240) / 8 + 266240 / 4 = 1003749376 + 66560 = 1003815936.
  mp_plan_totals t;
  mp_plan_rank_totals(p, 0, &t);
  EXPECT_EQ(t.params_numel, 1003815936LL);
  mp_plan_destroy(p);
}

// Uneven: dp_shard=3 x tp=4. q tp-local [1024,4096]: chunk ceil(1024/3) = 342 -> 342,342,340;
// k tp-local [256,4096]: chunk 86 -> 86,86,84. Rank = dp_shard_index * 4 + tp_index.
TEST(PlanLlama8b, UnevenDpShard3Tp4) {
  mp_model m = LoadModel("llama3.1-8b");
  mp_plan *p = Build(m, "dp_shard=3,tp=4");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(RestShape(p, "layers.0.attention.q_proj.weight", 0), (V{342, 4096}));
  EXPECT_EQ(RestShape(p, "layers.0.attention.q_proj.weight", 8), (V{340, 4096}));
  EXPECT_EQ(RestShape(p, "layers.0.attention.k_proj.weight", 11), (V{84, 4096}));
  int64_t off[3], len[3];
  // rank 11: tp 3 -> k rows [768, 1024); FSDP index 2 -> +172 -> 940.
  ASSERT_TRUE(mp_param_tile(p, &Param(p, "layers.0.attention.k_proj.weight"), 11, off, len));
  EXPECT_EQ(off[0], 940);
  mp_plan_destroy(p);
}

// pp=4: 32 layers, 8 per stage; rank = pp_index * (dp_shard*tp) + ...; with dp_shard=2,tp=2
// ranks 0..3 are stage 0 (tok_embeddings, layers 0-7), 12..15 stage 3 (layers 24-31, norm, output).
TEST(PlanLlama8b, Pipeline) {
  mp_model m = LoadModel("llama3.1-8b");
  mp_plan *p = Build(m, "pp=4,dp_shard=2,tp=2");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->layers_per_stage, 8);
  EXPECT_EQ(Param(p, "layers.8.attention.q_proj.weight").pp_stage, 1);
  EXPECT_EQ(Param(p, "output.weight").pp_stage, 3);
  EXPECT_EQ(RestShape(p, "tok_embeddings.weight", 0), (V{32064, 4096}));
  EXPECT_EQ(RestShape(p, "tok_embeddings.weight", 12), V{});
  EXPECT_EQ(RestShape(p, "output.weight", 0), V{});
  EXPECT_EQ(RestShape(p, "output.weight", 13), (V{32064, 4096}));
  EXPECT_EQ(RestShape(p, "layers.8.mlp.up_proj.weight", 2), V{});
  EXPECT_EQ(RestShape(p, "layers.8.mlp.up_proj.weight", 4), (V{3584, 4096}));
  mp_plan_destroy(p);
}

// ---- qwen3-30b-a3b: H 2048, q 32x128 = 4096, kv 4x128 = 512, 128 experts of 768, 48
// MoE layers, vocab 151936 --------------------------------------------------------------

TEST(PlanQwen30b, DpShard8Ep8) {
  mp_model m = LoadModel("qwen3-30b-a3b");
  mp_plan *p = Build(m, "dp_shard=8,ep=8");
  ASSERT_NE(p, nullptr);
  // Experts: 128 / ep 8 = 16 per rank; expert-FSDP group dp_shard/ep = 1: whole.
  const mp_param &eg = Param(p, "layers.0.moe.experts.gate_proj.weight");
  EXPECT_EQ(Shape(eg.tp_shape, 3), (V{16, 768, 2048}));
  EXPECT_EQ(eg.fsdp_group, MP_GROUP_EFSDP);
  EXPECT_EQ(RestShape(p, "layers.0.moe.experts.gate_proj.weight", 5), (V{16, 768, 2048}));
  EXPECT_EQ(RestShape(p, "layers.0.moe.experts.down_proj.weight", 5), (V{16, 2048, 768}));
  int64_t off[3], len[3];
  ASSERT_TRUE(mp_param_tile(p, &eg, 5, off, len));
  EXPECT_EQ(off[0], 80); // rank 5 = ep index 5: experts [80, 96)
  // Dense parameters over dp_shard 8: q [4096,2048] -> [512,2048]; k [512,2048] -> [64,2048];
  // router [128,2048] -> [16,2048]; q_norm [128] -> [16]; tok_embeddings 151936/8 = 18992.
  EXPECT_EQ(RestShape(p, "layers.0.attention.q_proj.weight", 5), (V{512, 2048}));
  EXPECT_EQ(RestShape(p, "layers.0.attention.k_proj.weight", 5), (V{64, 2048}));
  EXPECT_EQ(RestShape(p, "layers.0.moe.router.weight", 5), (V{16, 2048}));
  EXPECT_EQ(RestShape(p, "layers.0.attention.q_norm.weight", 5), (V{16}));
  EXPECT_EQ(RestShape(p, "tok_embeddings.weight", 5), (V{18992, 2048}));
  // Units: root + 3 per MoE block = 1 + 48*3 = 145.
  ASSERT_EQ(p->n_units, 145);
  EXPECT_STREQ(p->units[1].name, "layers.0.attention");
  EXPECT_STREQ(p->units[2].name, "layers.0.moe");
  EXPECT_STREQ(p->units[3].name, "layers.0.moe.experts");
  EXPECT_EQ(p->units[3].group, MP_GROUP_EFSDP);
  EXPECT_EQ(p->units[2].group, MP_GROUP_FSDP);
  // attention unit: attention_norm + q,k,v,o + q_norm,k_norm = 7 params;
  // moe: ffn_norm + router = 2; experts: 3.
  EXPECT_EQ(p->units[1].n_params, 7);
  EXPECT_EQ(p->units[2].n_params, 2);
  EXPECT_EQ(p->units[3].n_params, 3);
  // experts unit tp-local: 3 * 16*768*2048 = 75497472, no further sharding.
  EXPECT_EQ(p->units[3].numel_tp, 75497472LL);
  EXPECT_EQ(p->units[3].numel_shard, 75497472LL);
  // attention unit: 2048 + 4096*2048 + 2*512*2048 + 2048*4096 + 2*128 = 18876672
  // over 8: 256 + 1048576 + 2*131072 + 262144*... computed per param with ceil:
  // 256 + 512*2048 + 2*64*2048 + 256*4096... (o [2048,4096]: 2048/8 = 256 rows) + 2*16
  // = 256 + 1048576 + 262144 + 1048576 + 32 = 2359584 = 18876672 / 8.
  EXPECT_EQ(p->units[1].numel_tp, 18876672LL);
  EXPECT_EQ(p->units[1].numel_shard, 2359584LL);
  mp_plan_destroy(p);
}

TEST(PlanQwen30b, DpShard16Ep4) {
  mp_model m = LoadModel("qwen3-30b-a3b");
  mp_plan *p = Build(m, "dp_shard=16,ep=4");
  ASSERT_NE(p, nullptr);
  // Experts: 128/4 = 32 per EP rank, then expert-FSDP over dp_shard/ep = 4: 8 each.
  // Rank 5: ep index 5 % 4 = 1 -> experts [32, 64); efsdp index 5 / 4 = 1 -> [40, 48).
  EXPECT_EQ(Shape(Param(p, "layers.3.moe.experts.up_proj.weight").tp_shape, 3), (V{32, 768, 2048}));
  EXPECT_EQ(RestShape(p, "layers.3.moe.experts.up_proj.weight", 5), (V{8, 768, 2048}));
  int64_t off[3], len[3];
  ASSERT_TRUE(mp_param_tile(p, &Param(p, "layers.3.moe.experts.up_proj.weight"), 5, off, len));
  EXPECT_EQ(off[0], 40);
  // Dense over 16: q 4096/16 = 256 rows; k 512/16 = 32; router 128/16 = 8; embeddings 9496.
  EXPECT_EQ(RestShape(p, "layers.3.attention.q_proj.weight", 5), (V{256, 2048}));
  EXPECT_EQ(RestShape(p, "layers.3.attention.k_proj.weight", 5), (V{32, 2048}));
  EXPECT_EQ(RestShape(p, "layers.3.moe.router.weight", 5), (V{8, 2048}));
  EXPECT_EQ(RestShape(p, "output.weight", 5), (V{9496, 2048}));
  mp_plan_destroy(p);
}

TEST(PlanQwen30b, DpShard4Ep2Tp2) {
  mp_model m = LoadModel("qwen3-30b-a3b");
  mp_plan *p = Build(m, "dp_shard=4,ep=2,tp=2");
  ASSERT_NE(p, nullptr);
  // q [4096,2048] -> TP [2048,2048] -> FSDP 4 -> [512,2048]; k [512,2048] -> [256,2048] -> [64,2048]
  // experts: TP skips them; EP 2 -> [64,768,2048]; expert-FSDP 2 -> [32,768,2048]
  EXPECT_EQ(RestShape(p, "layers.0.attention.q_proj.weight", 1), (V{512, 2048}));
  EXPECT_EQ(RestShape(p, "layers.0.attention.k_proj.weight", 1), (V{64, 2048}));
  const mp_param &e = Param(p, "layers.0.moe.experts.gate_proj.weight");
  EXPECT_EQ(e.tp_style, MP_TP_NONE);
  EXPECT_EQ(Param(p, "layers.0.moe.router.weight").tp_style, MP_TP_NONE);
  EXPECT_EQ(RestShape(p, "layers.0.moe.experts.gate_proj.weight", 1), (V{32, 768, 2048}));
  mp_plan_destroy(p);
}

// Without EP a MoE block stays one unit (no all-to-all to deadlock against).
TEST(PlanQwen30b, NoEpOneUnitPerBlock) {
  mp_model m = LoadModel("qwen3-30b-a3b");
  mp_plan *p = Build(m, "dp_shard=8");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->n_units, 49);
  EXPECT_EQ(Param(p, "layers.0.moe.experts.gate_proj.weight").fsdp_group, MP_GROUP_FSDP);
  EXPECT_EQ(RestShape(p, "layers.0.moe.experts.gate_proj.weight", 0), (V{16, 768, 2048}));
  mp_plan_destroy(p);
}

// ---- gpt2: vocab padding and TP of biases ----------------------------------------------

TEST(PlanGpt2, PadVocabAndBiases) {
  mp_model m = LoadModel("gpt2-124m");
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.tp.pad_vocab = 1;
  mp_plan *p = Build(m, "tp=2", &o);
  ASSERT_NE(p, nullptr);
  // 50257 rounded up to a multiple of 2: 50258; each rank 25129 rows.
  EXPECT_EQ(p->vocab_padded, 50258);
  EXPECT_EQ(Shape(Param(p, "tok_embeddings.weight").tp_shape, 2), (V{25129, 768}));
  bool noted = false;
  for (int i = 0; i < p->n_notes; i++) noted |= strstr(p->notes[i], "padded to 50258") != nullptr;
  EXPECT_TRUE(noted);
  // colwise bias split, rowwise bias replicated, positions replicated.
  EXPECT_EQ(Shape(Param(p, "layers.0.attention.q_proj.bias").tp_shape, 1), (V{384}));
  EXPECT_EQ(Shape(Param(p, "layers.0.mlp.up_proj.bias").tp_shape, 1), (V{1536}));
  EXPECT_EQ(Shape(Param(p, "layers.0.mlp.down_proj.bias").tp_shape, 1), (V{768}));
  EXPECT_EQ(Param(p, "pos_embeddings.weight").tp_style, MP_TP_NONE);
  mp_plan_destroy(p);
}

// ---- batch ----------------------------------------------------------------------------

TEST(PlanBatch, MicroBatches) {
  mp_model m = SeedModel();
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.global_batch = 32;
  o.micro_batch = 2;
  mp_plan *p = Build(m, "dp_replicate=2,dp_shard=2", &o);
  ASSERT_NE(p, nullptr);
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  int64_t local = 0, n = 0;
  // 32 sequences over 2*2 = 4 data-parallel ranks: 8 each, 4 micro-batches of 2.
  ASSERT_EQ(mp_plan_batch(&ctx, p, &local, &n), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(local, 8);
  EXPECT_EQ(n, 4);
  p->opts.global_batch = 30;
  EXPECT_EQ(mp_plan_batch(&ctx, p, &local, &n), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "global_batch=30"), nullptr);
  p->opts.global_batch = 32;
  p->opts.micro_batch = 3;
  EXPECT_EQ(mp_plan_batch(&ctx, p, &local, &n), MP_ERR_INVALID);
  mp_plan_destroy(p);
}

// Megatron-Core's conditions on --overlap-moe-expert-parallel-comm (TransformerConfig's
// __post_init__, core_v0.14), each refused by name.
TEST(PlanMoeOverlap, MegatronConditions) {
  // tiny-moe's 2 layers; qwen3-30b-a3b's 48 for pp=2 x 2 virtual stages
  const mp_model tiny = LoadModel("tiny-moe"), qwen = LoadModel("qwen3-30b-a3b");
  auto build = [&](const char *mesh_spec, mp_mem_model mm, mp_pp_schedule ps, int v, mp_ac_mode ac,
                   std::string *msg) {
    mp_ctx ctx;
    mp_ctx_init(&ctx);
    mp_mesh mesh = Mesh(mesh_spec);
    mp_plan_options o;
    mp_plan_options_init(&o);
    o.mem_model = mm;
    o.pp_schedule = ps;
    o.pp_virtual = v;
    o.ac = ac;
    o.moe_a2a_overlap = 1;
    mp_plan *p = nullptr;
    const mp_status st = mp_plan_create(&ctx, mesh.size[MP_DIM_PP] > 1 ? &qwen : &tiny, &mesh, &o, &p);
    *msg = mp_errmsg(&ctx);
    mp_plan_destroy(p);
    return st;
  };
  std::string msg;
  EXPECT_EQ(build("dp_replicate=4,ep=2", MP_MEM_MODEL_MEGATRON, MP_PP_1F1B, 1, MP_AC_NONE, &msg), MP_OK) << msg;
  EXPECT_EQ(build("dp_replicate=2,pp=2,ep=2", MP_MEM_MODEL_MEGATRON, MP_PP_INTERLEAVED, 2, MP_AC_NONE, &msg), MP_OK)
      << msg;
  EXPECT_EQ(build("dp_shard=4,ep=2", MP_MEM_MODEL_TORCHTITAN, MP_PP_1F1B, 1, MP_AC_NONE, &msg), MP_ERR_INVALID);
  EXPECT_NE(msg.find("torchtitan memory model does not run it"), std::string::npos) << msg;
  EXPECT_EQ(build("dp_replicate=4", MP_MEM_MODEL_MEGATRON, MP_PP_1F1B, 1, MP_AC_NONE, &msg), MP_ERR_INVALID);
  EXPECT_NE(msg.find("needs expert parallelism"), std::string::npos) << msg;
  EXPECT_EQ(build("dp_replicate=2,pp=2,ep=2", MP_MEM_MODEL_MEGATRON, MP_PP_1F1B, 1, MP_AC_NONE, &msg), MP_ERR_INVALID);
  EXPECT_NE(msg.find("needs the interleaved schedule"), std::string::npos) << msg;
  EXPECT_EQ(build("dp_replicate=4,ep=2", MP_MEM_MODEL_MEGATRON, MP_PP_1F1B, 1, MP_AC_FULL, &msg), MP_ERR_INVALID);
  EXPECT_NE(msg.find("refuses full recompute"), std::string::npos) << msg;
}
