// The five passes one by one: what each changes, and every refusal of a wrong order or
// combination (code and the words of the rule in the message).
#include <cmath>

#include "exec/rules.h"
#include "exec/runtime/check.h"
#include "tests/plan/plan_testutil.h"

typedef std::vector<int64_t> V;

namespace {

struct Fixture {
  mp_ctx ctx;
  mp_model model;
  mp_mesh mesh;
  mp_plan *p = nullptr;
  Fixture(const mp_model &m, const char *mesh_spec) : model(m) {
    mp_ctx_init(&ctx);
    mesh = Mesh(mesh_spec);
    mp_status st = mp_plan_create(&ctx, &model, &mesh, nullptr, &p);
    EXPECT_EQ(st, MP_OK) << mp_errmsg(&ctx);
  }
  ~Fixture() { mp_plan_destroy(p); }
  mp_status Tp(int shard_logits = 1, int pad = 0) {
    mp_tp_options o = {shard_logits, pad};
    return mp_apply_tensor_parallel(&ctx, p, &o);
  }
  mp_status Ep() { return mp_apply_expert_parallel(&ctx, p); }
  mp_status F8(int all_gather = 0) {
    mp_float8_options o = {all_gather};
    return mp_apply_float8(&ctx, p, &o);
  }
  mp_status Ac(mp_ac_mode m = MP_AC_SELECTIVE) { return mp_apply_ac(&ctx, p, m); }
  mp_status Fsdp(int per_block = 0) {
    mp_fsdp_options o = {1, per_block, MP_DTYPE_BF16, MP_DTYPE_FP32, 0};
    return mp_apply_fsdp(&ctx, p, &o);
  }
  bool Says(const char *words) const { return strstr(mp_errmsg(&ctx), words) != nullptr; }
};

} // namespace

#define EXPECT_REFUSED(f, call, code, words)                          \
  do {                                                                \
    EXPECT_EQ((call), (code)) << mp_errmsg(&(f).ctx);                 \
    EXPECT_TRUE((f).Says(words)) << "message: " << mp_errmsg(&(f).ctx); \
  } while (0)

// ---- the correct order ----------------------------------------------------------------

TEST(Passes, CanonicalOrderSucceeds) {
  Fixture f(LoadModel("tiny-moe"), "dp_shard=4,ep=2,tp=2");
  ASSERT_EQ(f.Tp(), MP_OK) << mp_errmsg(&f.ctx);
  ASSERT_EQ(f.Ep(), MP_OK) << mp_errmsg(&f.ctx);
  ASSERT_EQ(f.F8(), MP_OK) << mp_errmsg(&f.ctx);
  ASSERT_EQ(f.Ac(MP_AC_FULL), MP_OK) << mp_errmsg(&f.ctx);
  ASSERT_EQ(f.Fsdp(), MP_OK) << mp_errmsg(&f.ctx);
  EXPECT_EQ(f.p->applied, (unsigned)(MP_PASS_TP | MP_PASS_EP | MP_PASS_FLOAT8 | MP_PASS_AC | MP_PASS_FSDP));
  ASSERT_EQ(f.p->n_passes, 5);
  const int order[5] = {MP_PASS_TP, MP_PASS_EP, MP_PASS_FLOAT8, MP_PASS_AC, MP_PASS_FSDP};
  for (int i = 0; i < 5; i++) EXPECT_EQ(f.p->pass_order[i], order[i]);
  EXPECT_EQ(f.p->ac, MP_AC_FULL);
  // tiny-moe: 2 MoE layers -> root + 2 * 3 units.
  EXPECT_EQ(f.p->n_units, 7);
}

// Skipping optional passes is fine as long as the order holds.
TEST(Passes, SubsetInOrderSucceeds) {
  Fixture f(LoadModel("tiny-dense"), "dp_shard=2");
  ASSERT_EQ(f.Ac(MP_AC_NONE), MP_OK);
  ASSERT_EQ(f.Fsdp(), MP_OK) << mp_errmsg(&f.ctx);
  EXPECT_EQ(f.p->n_units, 3); // dense: n_layers + 1
}

// ---- the refusals: one case per wrong order or combination ---------------------------

TEST(Passes, FsdpBeforeTpRefused) {
  Fixture f(SeedModel(), "dp_shard=4,tp=2");
  EXPECT_REFUSED(f, f.Fsdp(), MP_ERR_ORDER,
                 "TP would match no Linear; the run would be data-parallel only with wrong gradients");
  EXPECT_EQ(f.p->applied, 0u);
}

TEST(Passes, TpAfterFsdpRefused) {
  Fixture f(SeedModel(), "dp_shard=4"); // tp=1 lets FSDP through; TP then comes too late
  ASSERT_EQ(f.Fsdp(), MP_OK);
  EXPECT_REFUSED(f, f.Tp(), MP_ERR_ORDER, "TP would match no Linear");
}

TEST(Passes, EpAfterFsdpRefused) {
  Fixture f(LoadModel("tiny-moe"), "dp_shard=4"); // ep=1 lets FSDP through
  ASSERT_EQ(f.Fsdp(), MP_OK);
  EXPECT_REFUSED(f, f.Ep(), MP_ERR_ORDER, "EP after FSDP");
}

TEST(Passes, AcAfterFsdpRefused) {
  Fixture f(SeedModel(), "dp_shard=4");
  ASSERT_EQ(f.Fsdp(), MP_OK);
  EXPECT_REFUSED(f, f.Ac(), MP_ERR_ORDER, "AC after FSDP");
}

TEST(Passes, Float8AfterFsdpRefused) {
  Fixture f(LoadModel("tiny-dense"), "dp_shard=4");
  ASSERT_EQ(f.Fsdp(), MP_OK);
  EXPECT_REFUSED(f, f.F8(), MP_ERR_ORDER, "Float8 after FSDP");
}

// torchao gathers the float8 casts of TP-sharded weights with per-tensor scales (its FSDP2 x
// TP test, test/float8/test_fsdp2_tp.py), so float8 all-gather beside TP is a plan.
TEST(Passes, Float8AllGatherWithTpAllowed) {
  Fixture f(LoadModel("tiny-dense"), "dp_shard=2,tp=2");
  ASSERT_EQ(f.Tp(), MP_OK);
  EXPECT_EQ(f.F8(1), MP_OK) << mp_errmsg(&f.ctx);
  EXPECT_EQ(f.p->opts.fp8_opts.all_gather, 1);
}

TEST(Passes, Float8AllGatherWithoutTpAllowed) {
  Fixture f(LoadModel("tiny-dense"), "dp_shard=4");
  EXPECT_EQ(f.F8(1), MP_OK) << mp_errmsg(&f.ctx);
  EXPECT_EQ(f.p->opts.fp8_opts.all_gather, 1);
}

TEST(Passes, EpWithPerBlockFsdpRefused) {
  Fixture f(LoadModel("tiny-moe"), "dp_shard=4,ep=2");
  ASSERT_EQ(f.Ep(), MP_OK);
  EXPECT_REFUSED(f, f.Fsdp(1), MP_ERR_ORDER,
                 "EP with per-block FSDP deadlocks between EP's two all-to-alls");
  EXPECT_EQ(f.Fsdp(0), MP_OK) << mp_errmsg(&f.ctx);
}

TEST(Passes, PerBlockWithoutEpAllowed) {
  Fixture f(LoadModel("tiny-moe"), "dp_shard=4");
  EXPECT_EQ(f.Fsdp(1), MP_OK) << mp_errmsg(&f.ctx);
  EXPECT_EQ(f.p->n_units, 3);
}

// A plan of m on mesh under the CPU backend's memory model: built, more checks by `also`
// (may be null), executed by the runtime (mp_runtime_plan_check); the same plan under the
// CUDA backend's refused with a message naming cuda_why.
static void ExpectCpuRunsCudaRefuses(const mp_model &m, const char *mesh, void (*also)(const mp_plan *),
                                     const char *cuda_why) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_mesh me = Mesh(mesh);
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.seq = 32;
  o.mem_model = MP_MEM_MODEL_MESHPLAN_CPU;
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_build_plan(&ctx, &m, &me, &o, &p), MP_OK) << mesh << ": " << mp_errmsg(&ctx);
  if (also) also(p);
  EXPECT_EQ(mp_runtime_plan_check(&ctx, p), MP_OK) << mesh << ": " << mp_errmsg(&ctx);
  o.mem_model = MP_MEM_MODEL_MESHPLAN_CUDA;
  EXPECT_EQ(mp_runtime_check(&ctx, &p->model, &p->mesh, &o, p->applied), MP_ERR_UNSUPPORTED) << mesh;
  EXPECT_NE(strstr(mp_errmsg(&ctx), cuda_why), nullptr) << mp_errmsg(&ctx);
  mp_plan_destroy(p);
}

// MoE with pipeline parallelism is planned (the all-to-alls stay inside a stage) and the
// runtime's check takes it, expert tensor parallelism included (tests/runtime/parity_matrix.py trains it against one rank);
// float8 inside a pipeline stays refused by name, MoE or not.
TEST(Passes, MoeWithPipelinePlannedAndExecuted) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m = LoadModel("tiny-moe");
  mp_mesh me = Mesh("pp=2,dp_shard=2,ep=2");
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_build_plan(&ctx, &m, &me, nullptr, &p), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_runtime_plan_check(&ctx, p), MP_OK) << mp_errmsg(&ctx);
  mp_plan_options o = p->opts;
  o.fp8 = 1;
  EXPECT_EQ(mp_runtime_check(&ctx, &p->model, &p->mesh, &o, p->applied), MP_ERR_UNSUPPORTED);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "float8 with pipeline parallelism is not executed"), nullptr) << mp_errmsg(&ctx);
  mp_plan_destroy(p);
  // expert tensor parallelism (etp = tp = 2) inside the stages: executed on the CPU backend
  // (the matrix's tiny-moe-pp rows), refused by name on CUDA
  ExpectCpuRunsCudaRefuses(m, "pp=2,dp_shard=2,tp=2,ep=2,etp=2", nullptr, "executed by the runtime's CPU backend only");
}

// etp other than tp (Megatron-Core's --expert-tensor-parallel-size apart from tp): below tp
// (tp=4 x ep=2 x etp=2), with tp=1 (dp_shard=4 x ep=2 x etp=2) and above tp (dp_shard=4 x
// tp=2 x ep=2 x etp=4) executed on the CPU backend (tests/runtime/parity_matrix.py trains
// each against one rank), refused by name on CUDA
TEST(Passes, EtpOtherThanTpExecutedOnCpu) {
  mp_model m = LoadModel("tiny-moe");
  for (const char *mesh : {"tp=4,ep=2,etp=2", "dp_shard=4,ep=2,etp=2", "dp_shard=4,tp=2,ep=2,etp=4"})
    ExpectCpuRunsCudaRefuses(m, mesh, nullptr, "executed by the runtime's CPU backend only");
}

// EP reaching into dp_replicate (dp_replicate=2 x tp=2 with ep=4: ep x etp = 4 a multiple of
// dp_shard x cp x tp = 2): torchtitan's FSDP borrows EP from dp_shard x cp x tp alone, so its
// plan is refused; the meshplan runtimes' plans keep the experts whole on a rank (expert-FSDP
// group of one) and sum their gradients over the expert-DP group, executed on the CPU backend
// (tests/runtime/parity_matrix.py trains it against one rank) and refused by name on CUDA.
TEST(Passes, EpReachingIntoDpReplicateUnderTheRuntime) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m = LoadModel("tiny-moe");
  mp_mesh me = Mesh("dp_replicate=2,tp=2,ep=4,etp=1");
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.seq = 32;
  mp_plan *p = nullptr;
  EXPECT_EQ(mp_build_plan(&ctx, &m, &me, &o, &p), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "reaches into dp_replicate: FSDP (torchtitan)"), nullptr) << mp_errmsg(&ctx);
  ExpectCpuRunsCudaRefuses(m, "dp_replicate=2,tp=2,ep=4,etp=1", [](const mp_plan *q) {
    EXPECT_EQ(mp_mesh_group_size(&q->mesh, MP_GROUP_EFSDP), 1);
    EXPECT_EQ(mp_mesh_expert_replica_group(&q->mesh), MP_GROUP_EDP);
    bool noted = false;  // explain says where the experts' gradients are summed: a group of one
    for (int i = 0; i < q->n_notes; i++)
      noted |= strstr(q->notes[i], "EP reaches into dp_replicate: their gradients summed over expert-DP = 1") !=
               nullptr;
    EXPECT_TRUE(noted);
  }, "EP reaching into dp_replicate");
}

// The experts' capacity (train --moe-capacity-factor): a positive factor on an MoE model on
// the CPU backend's layout; each other case refused by name.
TEST(Passes, CapacityFactorRules) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model moe = LoadModel("tiny-moe"), dense = LoadModel("tiny-dense");
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.mem_model = MP_MEM_MODEL_MESHPLAN_CPU;
  EXPECT_EQ(mp_runtime_capacity_check(&ctx, &moe, &o, 0), MP_OK);  // dropless
  EXPECT_EQ(mp_runtime_capacity_check(&ctx, &moe, &o, 1.25), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_runtime_capacity_check(&ctx, &moe, &o, -1), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "give a positive number"), nullptr) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_runtime_capacity_check(&ctx, &moe, &o, NAN), MP_ERR_INVALID);
  EXPECT_EQ(mp_runtime_capacity_check(&ctx, &dense, &o, 1.0), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "has no routed experts"), nullptr) << mp_errmsg(&ctx);
  o.mem_model = MP_MEM_MODEL_MESHPLAN_CUDA;
  EXPECT_EQ(mp_runtime_capacity_check(&ctx, &moe, &o, 1.0), MP_ERR_UNSUPPORTED);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "on the CPU backend only"), nullptr) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_runtime_capacity_check(&ctx, &moe, &o, 0), MP_OK);  // CUDA runs dropless
}

TEST(Passes, FsdpBeforeEpRefused) {
  Fixture f(LoadModel("tiny-moe"), "dp_shard=4,ep=2");
  EXPECT_REFUSED(f, f.Fsdp(), MP_ERR_ORDER, "FSDP before EP");
}

// ---- twice, and the generic order rule -------------------------------------------------

TEST(Passes, AppliedTwiceRefused) {
  Fixture f(LoadModel("tiny-moe"), "dp_shard=4,ep=2,tp=2");
  ASSERT_EQ(f.Tp(), MP_OK);
  EXPECT_REFUSED(f, f.Tp(), MP_ERR_ORDER, "TP pass applied twice");
  ASSERT_EQ(f.Ep(), MP_OK);
  EXPECT_REFUSED(f, f.Ep(), MP_ERR_ORDER, "EP pass applied twice");
  ASSERT_EQ(f.F8(), MP_OK);
  EXPECT_REFUSED(f, f.F8(), MP_ERR_ORDER, "Float8 pass applied twice");
  ASSERT_EQ(f.Ac(), MP_OK);
  EXPECT_REFUSED(f, f.Ac(), MP_ERR_ORDER, "AC pass applied twice");
  ASSERT_EQ(f.Fsdp(), MP_OK);
  EXPECT_REFUSED(f, f.Fsdp(), MP_ERR_ORDER, "FSDP pass applied twice");
  // Shapes were not sharded a second time: q [64,64] / tp 2 = [32,64].
  EXPECT_EQ(Shape(Param(f.p, "layers.0.attention.q_proj.weight").tp_shape, 2), (V{32, 64}));
}

TEST(Passes, LaterPassBeforeEarlierRefused) {
  {
    Fixture f(LoadModel("tiny-moe"), "dp_shard=4,ep=2,tp=2");
    ASSERT_EQ(f.Ep(), MP_OK);
    EXPECT_REFUSED(f, f.Tp(), MP_ERR_ORDER, "TP applied after EP");
  }
  {
    Fixture f(LoadModel("tiny-moe"), "dp_shard=4,ep=2");
    ASSERT_EQ(f.F8(), MP_OK);
    EXPECT_REFUSED(f, f.Ep(), MP_ERR_ORDER, "EP applied after Float8");
  }
  {
    Fixture f(LoadModel("tiny-dense"), "dp_shard=2");
    ASSERT_EQ(f.Ac(), MP_OK);
    EXPECT_REFUSED(f, f.F8(), MP_ERR_ORDER, "Float8 applied after AC");
  }
}

// ---- TP --------------------------------------------------------------------------------

TEST(PassTp, DivisibilityRefusalsListValidChoices) {
  // n_heads 24, n_kv_heads 8, d_model 3072, d_ff 8192, vocab 32000: tp=3 divides n_heads but
  // not n_kv_heads; the common divisors are those of gcd(24, 8, 3072, 8192, 32000) = 8.
  mp_model m = SeedModel();
  m.n_heads = 24;
  m.n_kv_heads = 8;
  m.head_dim = 128;
  m.d_model = 3072;
  m.d_ff = 8192;
  m.vocab = 32000;
  Fixture f(m, "tp=3");
  EXPECT_REFUSED(f, f.Tp(), MP_ERR_INVALID, "tp=3 does not divide n_kv_heads=8; choose tp in {1,2,4,8}");
  EXPECT_EQ(f.p->applied, 0u);

  Fixture q(LoadModel("qwen3-30b-a3b"), "tp=8");
  // gcd(32, 4, 2048, 151936) = 4 (151936 = 2^7 * 1187); d_ff is not checked (no dense MLP).
  EXPECT_REFUSED(q, q.Tp(), MP_ERR_INVALID, "tp=8 does not divide n_kv_heads=4; choose tp in {1,2,4}");

  Fixture g(LoadModel("gpt2-124m"), "tp=2");
  EXPECT_REFUSED(g, g.Tp(), MP_ERR_INVALID, "tp=2 does not divide vocab=50257; choose tp in {1} or pad the vocabulary");
  EXPECT_EQ(g.Tp(1, 1), MP_OK) << mp_errmsg(&g.ctx);
  EXPECT_EQ(g.p->vocab_padded, 50258);
}

TEST(PassTp, DFfSharedChecked) {
  // tiny-moe: n_heads 8, n_kv_heads 4, d_model 64, vocab 256, every layer MoE (d_ff not
  // checked). d_ff_shared 68 divides by 4: tp=4 passes. d_ff_shared 66 does not:
  // refused; the common divisors are those of gcd(8, 4, 64, 66, 256) = 2.
  mp_model m = LoadModel("tiny-moe");
  m.d_ff_shared = 68;
  Fixture g(m, "tp=4");
  EXPECT_EQ(g.Tp(), MP_OK) << mp_errmsg(&g.ctx);
  EXPECT_EQ(Shape(Param(g.p, "layers.0.moe.shared_expert.down_proj.weight").tp_shape, 2), (V{64, 17}));
  m.d_ff_shared = 66;
  Fixture h(m, "tp=4");
  EXPECT_REFUSED(h, h.Tp(), MP_ERR_INVALID, "tp=4 does not divide d_ff_shared=66; choose tp in {1,2}");
}

TEST(PassTp, StylesAndLogits) {
  Fixture f(LoadModel("tiny-moe"), "tp=2");
  ASSERT_EQ(f.Tp(0), MP_OK);
  struct {
    const char *fqn;
    mp_tp_style style;
    int dim;
  } want[] = {
      {"tok_embeddings.weight", MP_TP_VOCAB, 0},
      {"layers.0.attention.q_proj.weight", MP_TP_COLWISE, 0},
      {"layers.0.attention.k_proj.weight", MP_TP_COLWISE, 0},
      {"layers.0.attention.v_proj.weight", MP_TP_COLWISE, 0},
      {"layers.0.attention.o_proj.weight", MP_TP_ROWWISE, 1},
      {"layers.0.moe.shared_expert.gate_proj.weight", MP_TP_COLWISE, 0},
      {"layers.0.moe.shared_expert.up_proj.weight", MP_TP_COLWISE, 0},
      {"layers.0.moe.shared_expert.down_proj.weight", MP_TP_ROWWISE, 1},
      {"layers.0.moe.router.weight", MP_TP_NONE, -1},
      {"layers.0.moe.experts.gate_proj.weight", MP_TP_NONE, -1},
      {"layers.0.attention_norm.weight", MP_TP_NONE, -1},
      {"output.weight", MP_TP_COLWISE, 0},
  };
  for (auto &w : want) {
    const mp_param &p = Param(f.p, w.fqn);
    EXPECT_EQ(p.tp_style, w.style) << w.fqn;
    EXPECT_EQ(p.place[MP_AXIS_TP].dim, w.dim) << w.fqn;
  }
  // shard_logits=0 is recorded and said.
  EXPECT_EQ(f.p->opts.tp.shard_logits, 0);
  bool said = false;
  for (int i = 0; i < f.p->n_notes; i++) said |= strstr(f.p->notes[i], "logits all-gathered") != nullptr;
  EXPECT_TRUE(said);
}

// ---- EP --------------------------------------------------------------------------------

TEST(PassEp, DenseModelRefused) {
  Fixture f(LoadModel("tiny-dense"), "dp_shard=4,ep=2");
  EXPECT_REFUSED(f, f.Ep(), MP_ERR_INVALID, "EP on a dense model");
}

TEST(PassEp, EpMustDivideExperts) {
  // tiny-moe has 8 experts; dp_shard=3, ep=3 is a valid mesh but 3 does not divide 8.
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m = LoadModel("tiny-moe");
  mp_mesh me = Mesh("dp_shard=3,ep=3");
  mp_plan *p = nullptr;
  EXPECT_EQ(mp_plan_create(&ctx, &m, &me, nullptr, &p), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "ep=3 does not divide n_experts=8"), nullptr) << mp_errmsg(&ctx);
}

TEST(PassEp, ExpertsSplit) {
  Fixture f(LoadModel("tiny-moe"), "dp_shard=8,ep=4");
  ASSERT_EQ(f.Ep(), MP_OK);
  // 8 experts / 4 = 2 per rank: experts.gate_proj [8, 32, 64] -> [2, 32, 64].
  const mp_param &e = Param(f.p, "layers.1.moe.experts.gate_proj.weight");
  EXPECT_EQ(Shape(e.tp_shape, 3), (V{2, 32, 64}));
  EXPECT_EQ(e.place[MP_AXIS_EP].kind, MP_PLACEMENT_SHARD);
  EXPECT_EQ(Shape(Param(f.p, "layers.1.moe.router.weight").tp_shape, 2), (V{8, 64}));
}

// ---- Float8 ------------------------------------------------------------------------------

TEST(PassFloat8, MarksEligibleLinears) {
  // tiny-dense, tp=1: q [64,64], k,v [32,64], o [64,64], gate, up [192,64], down [64,192]:
  // all multiples of 16 -> 7 per layer x 2 layers = 14 float8; output and embeddings excluded.
  Fixture f(LoadModel("tiny-dense"), "dp_shard=2");
  ASSERT_EQ(f.F8(), MP_OK);
  int n = 0;
  for (int i = 0; i < f.p->n_params; i++) n += f.p->params[i].float8;
  EXPECT_EQ(n, 14);
  EXPECT_EQ(Param(f.p, "output.weight").float8, 0);
  EXPECT_EQ(Param(f.p, "tok_embeddings.weight").float8, 0);
  EXPECT_EQ(Param(f.p, "layers.0.attention_norm.weight").float8, 0);
}

TEST(PassFloat8, ExcludesMoeNamesAndSmallDims) {
  // tiny-moe, tp=4: q [64,64] -> [16,64] ok; k,v [32,64] -> [8,64]: not multiples of 16,
  // left in bf16 and noted; o [64,64] -> [64,16] ok. Router, experts, shared expert excluded.
  Fixture f(LoadModel("tiny-moe"), "tp=4");
  ASSERT_EQ(f.Tp(), MP_OK);
  ASSERT_EQ(f.F8(), MP_OK);
  EXPECT_EQ(Param(f.p, "layers.0.attention.q_proj.weight").float8, 1);
  EXPECT_EQ(Param(f.p, "layers.0.attention.o_proj.weight").float8, 1);
  EXPECT_EQ(Param(f.p, "layers.0.attention.k_proj.weight").float8, 0);
  EXPECT_EQ(Param(f.p, "layers.0.attention.v_proj.weight").float8, 0);
  EXPECT_EQ(Param(f.p, "layers.0.moe.router.weight").float8, 0);
  EXPECT_EQ(Param(f.p, "layers.0.moe.experts.up_proj.weight").float8, 0);
  EXPECT_EQ(Param(f.p, "layers.0.moe.shared_expert.up_proj.weight").float8, 0);
  bool noted = false;
  for (int i = 0; i < f.p->n_notes; i++)
    noted |= strstr(f.p->notes[i], "4 Linear layers left in bf16") != nullptr;
  EXPECT_TRUE(noted);
}

TEST(PassFloat8, MegatronRunsExpertsInFloat8) {
  // Megatron-Core: TEGroupedMLP's and SharedExpertMLP's Linears are Transformer Engine
  // modules under fp8_autocast, so the routed experts [8, 32, 64] / [8, 64, 32] (dims 32 and
  // 64, multiples of 16 behind the expert dim) and the shared expert run in float8; the
  // router (a plain gating GEMM) and the output layer (ColumnParallelLinear) do not.
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m = LoadModel("tiny-moe");
  mp_mesh mesh = Mesh("dp_replicate=2");
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_plan_create(&ctx, &m, &mesh, &o, &p), MP_OK) << mp_errmsg(&ctx);
  mp_float8_options f8 = {0};
  ASSERT_EQ(mp_apply_float8(&ctx, p, &f8), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(Param(p, "layers.1.moe.experts.gate_proj.weight").float8, 1);
  EXPECT_EQ(Param(p, "layers.1.moe.experts.down_proj.weight").float8, 1);
  EXPECT_EQ(Param(p, "layers.1.moe.router.weight").float8, 0);
  EXPECT_EQ(Param(p, "output.weight").float8, 0);
  EXPECT_EQ(Param(p, "layers.1.moe.shared_expert.up_proj.weight").float8, 1);
  mp_plan_destroy(p);
  // torchtitan's filter keeps them out
  Fixture t(LoadModel("tiny-moe"), "dp_shard=2");
  ASSERT_EQ(t.F8(), MP_OK);
  EXPECT_EQ(Param(t.p, "layers.1.moe.experts.gate_proj.weight").float8, 0);
}

// ---- AC ------------------------------------------------------------------------------------

TEST(PassAc, RecordsMode) {
  for (mp_ac_mode m : {MP_AC_NONE, MP_AC_SELECTIVE, MP_AC_FULL}) {
    Fixture f(SeedModel(), "dp_shard=2");
    ASSERT_EQ(f.Ac(m), MP_OK);
    EXPECT_EQ(f.p->ac, m);
    EXPECT_EQ(f.p->opts.ac, m);
  }
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_ac_mode m;
  EXPECT_EQ(mp_ac_mode_parse(&ctx, "selective", &m), MP_OK);
  EXPECT_EQ(m, MP_AC_SELECTIVE);
  EXPECT_EQ(mp_ac_mode_parse(&ctx, "some", &m), MP_ERR_INVALID);
}

// ---- FSDP options, create-time checks ---------------------------------------------------

TEST(PassFsdp, OptionsRecorded) {
  Fixture f(SeedModel(), "dp_shard=2");
  mp_fsdp_options o = {0, 0, MP_DTYPE_FP32, MP_DTYPE_BF16, 0};
  ASSERT_EQ(mp_apply_fsdp(&f.ctx, f.p, &o), MP_OK);
  EXPECT_EQ(f.p->opts.fsdp.reshard_after_forward, 0);
  EXPECT_EQ(f.p->opts.fsdp.param_dtype, MP_DTYPE_FP32);
  EXPECT_EQ(f.p->opts.fsdp.reduce_dtype, MP_DTYPE_BF16);
  EXPECT_EQ(Param(f.p, "norm.weight").fsdp_unit, 0);
  EXPECT_EQ(Param(f.p, "layers.0.mlp.up_proj.weight").fsdp_unit, 1);
}

// DDP, the other fifth pass: parameters replicated, one bucket per block and the root's.
TEST(PassDdp, BucketsHoldWholeTiles) {
  Fixture f(SeedModel(), "dp_replicate=2,tp=2");
  ASSERT_EQ(f.Tp(), MP_OK);
  mp_ddp_options o = {1, 1, 0, 0};
  ASSERT_EQ(mp_apply_ddp(&f.ctx, f.p, &o), MP_OK) << mp_errmsg(&f.ctx);
  EXPECT_EQ(f.p->opts.ddp.shard_optimizer, 1);
  ASSERT_EQ(f.p->n_units, 2);  // root + layers.0
  EXPECT_STREQ(f.p->units[1].name, "layers.0");
  EXPECT_EQ(f.p->units[1].group, MP_GROUP_DP_REPLICATE);
  // up [24, 8] -> [12, 8] after TP, whole at rest: DDP cuts nothing
  const mp_param &up = Param(f.p, "layers.0.mlp.up_proj.weight");
  EXPECT_EQ(up.fsdp_unit, 1);
  EXPECT_EQ(up.place[MP_AXIS_FSDP].kind, MP_PLACEMENT_REPLICATE);
  EXPECT_EQ(RestShape(f.p, "layers.0.mlp.up_proj.weight", 0), (V{12, 8}));
  EXPECT_EQ(f.p->units[1].numel_shard, f.p->units[1].numel_tp);
}

// With cp the DDP group is dp_replicate x cp and every cp rank holds the whole tile, where
// the FSDP pass would have cut it over dp_shard x cp.
TEST(PassDdp, ContextParallelRanksHoldWholeTiles) {
  mp_model m = SeedModel();
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.seq = 16;
  o.cp_rotate = MP_CP_ROTATE_ALLTOALL;
  mp_plan *p = Build(m, "dp_replicate=2,cp=2", &o);
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->opts.dp, MP_DP_DDP);
  EXPECT_TRUE(p->applied & MP_PASS_DDP);
  EXPECT_FALSE(p->applied & MP_PASS_FSDP);
  EXPECT_EQ(p->units[1].group, MP_GROUP_DP_CP);
  for (int r = 0; r < 4; r++) EXPECT_EQ(RestShape(p, "layers.0.mlp.up_proj.weight", r), (V{24, 8})) << r;
  mp_plan_destroy(p);
}

TEST(PassDdp, Refusals) {
  {
    Fixture f(SeedModel(), "dp_shard=2");
    EXPECT_REFUSED(f, mp_apply_ddp(&f.ctx, f.p, nullptr), MP_ERR_INVALID, "use dp_replicate=2 instead of dp_shard=2");
  }
  {
    Fixture f(SeedModel(), "tp=2");
    EXPECT_REFUSED(f, mp_apply_ddp(&f.ctx, f.p, nullptr), MP_ERR_ORDER, "DDP before TP");
  }
  {
    Fixture f(SeedModel(), "dp_replicate=2");
    ASSERT_EQ(f.Fsdp(), MP_OK);
    EXPECT_REFUSED(f, mp_apply_ddp(&f.ctx, f.p, nullptr), MP_ERR_ORDER, "FSDP (sharded) or DDP (replicated), not both");
  }
  {
    Fixture f(SeedModel(), "dp_replicate=2");
    ASSERT_EQ(mp_apply_ddp(&f.ctx, f.p, nullptr), MP_OK);
    EXPECT_REFUSED(f, f.Fsdp(), MP_ERR_ORDER, "not both");
    EXPECT_REFUSED(f, f.Ac(), MP_ERR_ORDER, "AC applied after DDP");
  }
  // the options: DDP's own under FSDP, and a memory model whose data parallelism is the other
  mp_model m = SeedModel();
  mp_mesh mesh = Mesh("dp_replicate=2");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.dp = MP_DP_DDP;
  mp_plan *p = nullptr;
  EXPECT_EQ(mp_build_plan(&ctx, &m, &mesh, &o, &p), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "the torchtitan memory model's data parallelism is FSDP"), nullptr) << mp_errmsg(&ctx);
}

TEST(PlanCreate, Refusals) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_plan *p = nullptr;
  mp_plan_options o;
  mp_plan_options_init(&o);
  // cp=4 does not divide seq=30.
  mp_model m = LoadModel("tiny-dense");
  mp_mesh me = Mesh("cp=4");
  o.seq = 30;
  EXPECT_EQ(mp_plan_create(&ctx, &m, &me, &o, &p), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "cp=4 does not divide seq=30"), nullptr) << mp_errmsg(&ctx);
  o.seq = 32;
  EXPECT_EQ(mp_plan_create(&ctx, &m, &me, &o, &p), MP_OK) << mp_errmsg(&ctx);
  mp_plan_destroy(p);
  // pp=3 over 2 layers: a stage would be empty.
  me = Mesh("pp=3");
  EXPECT_EQ(mp_plan_create(&ctx, &m, &me, nullptr, &p), MP_ERR_INVALID);
  // several model chunks per stage outside the interleaved schedule
  me = Mesh("pp=2");
  o.seq = 32;
  o.pp_virtual = 2;
  EXPECT_EQ(mp_plan_create(&ctx, &m, &me, &o, &p), MP_ERR_INVALID);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "interleaved"), nullptr) << mp_errmsg(&ctx);
  // tied embeddings with pp: the last stage holds a copy as its head (Megatron-LM's shared
  // embedding), noted
  mp_model g = LoadModel("gpt2-124m");
  ASSERT_EQ(mp_plan_create(&ctx, &g, &me, nullptr, &p), MP_OK) << mp_errmsg(&ctx);
  const int i = mp_plan_find_param(p, "output.weight");
  ASSERT_GE(i, 0);
  EXPECT_TRUE(p->params[i].tied_copy);
  EXPECT_EQ(p->params[i].pp_stage, 1);
  EXPECT_EQ(p->params[mp_plan_find_param(p, "tok_embeddings.weight")].pp_stage, 0);
  EXPECT_NE(strstr(p->notes[p->n_notes - 1], "tied embeddings"), nullptr);
  mp_plan_destroy(p);
}

TEST(PlanBuild, RunsPassesInOrder) {
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.fp8 = 1;
  o.ac = MP_AC_SELECTIVE;
  mp_plan *p = Build(LoadModel("tiny-moe"), "dp_shard=4,ep=2,tp=2", &o);
  ASSERT_NE(p, nullptr);
  const int order[5] = {MP_PASS_TP, MP_PASS_EP, MP_PASS_FLOAT8, MP_PASS_AC, MP_PASS_FSDP};
  ASSERT_EQ(p->n_passes, 5);
  for (int i = 0; i < 5; i++) EXPECT_EQ(p->pass_order[i], order[i]);
  mp_plan_destroy(p);
  // No TP, EP, Float8 asked: AC and FSDP only.
  p = Build(SeedModel(), "dp_shard=2");
  ASSERT_NE(p, nullptr);
  EXPECT_EQ(p->n_passes, 2);
  EXPECT_EQ(p->applied, (unsigned)(MP_PASS_AC | MP_PASS_FSDP));
  mp_plan_destroy(p);
}

// ---- float8 recipes --------------------------------------------------------------------

TEST(PassFloat8, RecipesTheirFrameworksRun) {
  // torchao (torchtitan): tensorwise, rowwise, MXFP8; Transformer Engine (Megatron-Core):
  // delayed, current (tensorwise), MXFP8 and blockwise (Float8BlockScaling); meshplan's
  // runtimes scale tensorwise only.
  EXPECT_TRUE(mp_rule_fp8_recipe_ok(MP_MEM_MODEL_TORCHTITAN, MP_FP8_ROWWISE));
  EXPECT_FALSE(mp_rule_fp8_recipe_ok(MP_MEM_MODEL_TORCHTITAN, MP_FP8_DELAYED));
  EXPECT_FALSE(mp_rule_fp8_recipe_ok(MP_MEM_MODEL_TORCHTITAN, MP_FP8_BLOCKWISE));
  EXPECT_TRUE(mp_rule_fp8_recipe_ok(MP_MEM_MODEL_MEGATRON, MP_FP8_DELAYED));
  EXPECT_TRUE(mp_rule_fp8_recipe_ok(MP_MEM_MODEL_MEGATRON, MP_FP8_BLOCKWISE));
  EXPECT_FALSE(mp_rule_fp8_recipe_ok(MP_MEM_MODEL_MEGATRON, MP_FP8_ROWWISE));
  EXPECT_TRUE(mp_rule_fp8_recipe_ok(MP_MEM_MODEL_MESHPLAN_CPU, MP_FP8_TENSORWISE));
  EXPECT_FALSE(mp_rule_fp8_recipe_ok(MP_MEM_MODEL_MESHPLAN_CPU, MP_FP8_MXFP8));
  // the stack's own when none is named
  EXPECT_EQ(mp_fp8_recipe_of(MP_FP8_DEFAULT, MP_MEM_MODEL_MEGATRON), MP_FP8_DELAYED);
  EXPECT_EQ(mp_fp8_recipe_of(MP_FP8_DEFAULT, MP_MEM_MODEL_TORCHTITAN), MP_FP8_TENSORWISE);
  mp_fp8_recipe r = MP_FP8_DEFAULT;
  EXPECT_TRUE(mp_fp8_recipe_parse("current", &r));
  EXPECT_EQ(r, MP_FP8_TENSORWISE);
  EXPECT_FALSE(mp_fp8_recipe_parse("hybrid", &r));
  // a refusal names the framework, what it runs and what to do
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  ASSERT_NE(mp_rule_fp8_recipe_check(&ctx, MP_MEM_MODEL_TORCHTITAN, MP_FP8_DELAYED, 0), MP_OK);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "torchtitan's float8 (torchao)"), nullptr) << mp_errmsg(&ctx);
  EXPECT_NE(strstr(mp_errmsg(&ctx), "tensorwise, rowwise, mxfp8"), nullptr) << mp_errmsg(&ctx);
  // float8 all-gather casts shards with one per-tensor scale
  mp_ctx_init(&ctx);
  EXPECT_NE(mp_rule_fp8_recipe_check(&ctx, MP_MEM_MODEL_TORCHTITAN, MP_FP8_ROWWISE, 1), MP_OK);
  EXPECT_EQ(mp_rule_fp8_recipe_check(&ctx, MP_MEM_MODEL_TORCHTITAN, MP_FP8_TENSORWISE, 1), MP_OK);
}

TEST(PassFloat8, TileMultipleOfTheRecipe) {
  // a Linear runs float8 when both dims are multiples of the recipe's tile: 16 (cuBLASLt's
  // float8 GEMM), 32 for MXFP8's 1x32 blocks, 128 for blockwise's 128x128 weight tiles
  EXPECT_EQ(mp_rule_fp8_multiple(MP_FP8_TENSORWISE), 16);
  EXPECT_EQ(mp_rule_fp8_multiple(MP_FP8_MXFP8), 32);
  EXPECT_EQ(mp_rule_fp8_multiple(MP_FP8_BLOCKWISE), 128);
  EXPECT_TRUE(mp_rule_fp8_linear_ok(48, 64, MP_FP8_TENSORWISE));
  EXPECT_FALSE(mp_rule_fp8_linear_ok(48, 64, MP_FP8_MXFP8));
  EXPECT_TRUE(mp_rule_fp8_linear_ok(4096, 14336, MP_FP8_BLOCKWISE));  // 14336 = 112 x 128
  EXPECT_FALSE(mp_rule_fp8_linear_ok(4096, 1000, MP_FP8_BLOCKWISE));
  // tiny-dense under Megatron-Core blockwise: k and v [32, 64] are not 128-multiples, nor
  // any of its Linears (d_model 64): none runs float8
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.fp8 = 1;
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.fp8_opts.recipe = MP_FP8_BLOCKWISE;
  mp_plan *p = Build(LoadModel("tiny-dense"), "dp_replicate=2", &o);
  ASSERT_NE(p, nullptr);
  int n = 0;
  for (int i = 0; i < p->n_params; i++) n += p->params[i].float8;
  EXPECT_EQ(n, 0);
  mp_plan_destroy(p);
}

TEST(PassFloat8, DerivedPlanKeepsTheResolvedRecipe) {
  // the search derives each candidate's plan from its mesh's base with the options the
  // user gave (recipe unnamed): the derived plan runs the recipe the base's float8 pass
  // resolved, and a different named recipe is refused (it changes which Linears cast)
  mp_plan_options o;
  mp_plan_options_init(&o);
  o.fp8 = 1;
  mp_model m = LoadModel("tiny-dense");
  mp_plan *base = Build(m, "dp_shard=2", &o);
  ASSERT_NE(base, nullptr);
  EXPECT_EQ(base->opts.fp8_opts.recipe, MP_FP8_TENSORWISE);
  mp_arena *a = mp_arena_create();
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_plan *d = nullptr;
  o.micro_batch = 2;
  ASSERT_EQ(mp_plan_derive(&ctx, base, &o, a, &d), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(d->opts.fp8_opts.recipe, MP_FP8_TENSORWISE);
  o.fp8_opts.recipe = MP_FP8_ROWWISE;
  EXPECT_NE(mp_plan_derive(&ctx, base, &o, a, &d), MP_OK);
  mp_arena_destroy(a);
  mp_plan_destroy(base);
}
