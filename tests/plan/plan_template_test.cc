// mp_build_plan_from (a plan built from a per-model template) against mp_build_plan: the
// same parameters (FQNs, shapes, placements, stages, float8, units), the same units, notes
// and per-rank totals, for dense, MoE (EP), pipelined, padded-vocab and float8 plans; the
// refusals stay the same; a plan in a borrowed arena is left to the arena's owner.
#include <string>

#include "tests/plan/plan_testutil.h"

namespace {

void ExpectSamePlan(const mp_plan *a, const mp_plan *b) {
  ASSERT_EQ(a->n_params, b->n_params);
  for (int i = 0; i < a->n_params; i++) {
    const mp_param &x = a->params[i], &y = b->params[i];
    SCOPED_TRACE(x.fqn);
    EXPECT_STREQ(x.fqn, y.fqn);
    EXPECT_STREQ(x.module_fqn, y.module_fqn);
    EXPECT_EQ(x.module, y.module);
    EXPECT_EQ(x.role, y.role);
    EXPECT_EQ(x.layer, y.layer);
    EXPECT_EQ(x.ndim, y.ndim);
    for (int d = 0; d < MP_MAX_NDIM; d++) {
      EXPECT_EQ(x.shape[d], y.shape[d]);
      EXPECT_EQ(x.tp_shape[d], y.tp_shape[d]);
    }
    for (int ax = 0; ax < MP_AXIS_COUNT; ax++) {
      EXPECT_EQ(x.place[ax].kind, y.place[ax].kind);
      EXPECT_EQ(x.place[ax].dim, y.place[ax].dim);
    }
    EXPECT_EQ(x.tp_style, y.tp_style);
    EXPECT_EQ(x.is_linear, y.is_linear);
    EXPECT_EQ(x.is_expert, y.is_expert);
    EXPECT_EQ(x.float8, y.float8);
    EXPECT_EQ(x.fsdp_unit, y.fsdp_unit);
    EXPECT_EQ(x.fsdp_group, y.fsdp_group);
    EXPECT_EQ(x.pp_stage, y.pp_stage);
  }
  ASSERT_EQ(a->n_units, b->n_units);
  for (int u = 0; u < a->n_units; u++) {
    const mp_fsdp_unit &x = a->units[u], &y = b->units[u];
    EXPECT_STREQ(x.name, y.name);
    EXPECT_EQ(x.layer, y.layer);
    EXPECT_EQ(x.group, y.group);
    EXPECT_EQ(x.numel_tp, y.numel_tp);
    EXPECT_EQ(x.numel_shard, y.numel_shard);
    ASSERT_EQ(x.n_params, y.n_params);
    for (int k = 0; k < x.n_params; k++) EXPECT_EQ(x.params[k], y.params[k]);
  }
  ASSERT_EQ(a->n_notes, b->n_notes);
  for (int i = 0; i < a->n_notes; i++) EXPECT_STREQ(a->notes[i], b->notes[i]);
  EXPECT_EQ(a->applied, b->applied);
  EXPECT_EQ(a->vocab_padded, b->vocab_padded);
  EXPECT_EQ(a->layers_per_stage, b->layers_per_stage);
  EXPECT_EQ(a->opts.seq, b->opts.seq);
  EXPECT_EQ(a->opts.global_batch, b->opts.global_batch);
  const int world = mp_mesh_world(&a->mesh);
  for (int rank : {0, 1, world / 2, world - 1}) {
    if (rank < 0 || rank >= world) continue;
    mp_plan_totals ta, tb;
    mp_plan_rank_totals(a, rank, &ta);
    mp_plan_rank_totals(b, rank, &tb);
    EXPECT_EQ(ta.params_numel, tb.params_numel) << "rank " << rank;
    EXPECT_EQ(ta.max_unit_gathered_bytes, tb.max_unit_gathered_bytes) << "rank " << rank;
  }
}

struct Case {
  const char *model, *mesh;
  int fp8, pad_vocab;
  mp_ac_mode ac;
};

TEST(PlanTemplate, SameAsBuildPlan) {
  const Case cases[] = {
      {"tiny-dense", "dp_shard=4,tp=2", 0, 0, MP_AC_NONE},
      {"tiny-dense", "pp=2,dp_shard=2", 1, 0, MP_AC_FULL},
      {"tiny-moe", "dp_shard=4,ep=2", 0, 0, MP_AC_SELECTIVE},
      {"tiny-moe", "dp_shard=4,ep=4,tp=2", 1, 0, MP_AC_NONE},
      {"gpt2-124m", "dp_shard=4", 0, 0, MP_AC_NONE},
      {"gpt2-124m", "dp_shard=2,tp=4", 0, 1, MP_AC_NONE}, /* vocab 50257 padded */
      {"llama3.1-405b", "pp=2,dp_shard=8,tp=8", 1, 0, MP_AC_FULL},
      {"qwen3-30b-a3b", "dp_shard=16,ep=8,cp=2", 1, 0, MP_AC_FULL},
  };
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  for (const Case &c : cases) {
    SCOPED_TRACE(std::string(c.model) + " " + c.mesh);
    mp_model m = LoadModel(c.model);
    mp_mesh mesh = Mesh(c.mesh);
    mp_plan_options o;
    mp_plan_options_init(&o);
    o.fp8 = c.fp8;
    o.ac = c.ac;
    o.tp.pad_vocab = c.pad_vocab;
    mp_plan_template *t = nullptr;
    ASSERT_EQ(mp_plan_template_create(&ctx, &m, &t), MP_OK) << mp_errmsg(&ctx);
    mp_plan *ref = nullptr, *own = nullptr, *borrowed = nullptr;
    ASSERT_EQ(mp_build_plan(&ctx, &m, &mesh, &o, &ref), MP_OK) << mp_errmsg(&ctx);
    ASSERT_EQ(mp_build_plan_from(&ctx, t, &mesh, &o, nullptr, &own), MP_OK) << mp_errmsg(&ctx);
    mp_arena *a = mp_arena_create();
    ASSERT_EQ(mp_build_plan_from(&ctx, t, &mesh, &o, a, &borrowed), MP_OK) << mp_errmsg(&ctx);
    EXPECT_EQ(own->arena_borrowed, 0);
    EXPECT_EQ(borrowed->arena_borrowed, 1);
    EXPECT_EQ(borrowed->arena, a);
    EXPECT_EQ(own->tmpl, t);
    EXPECT_EQ(ref->tmpl, nullptr);
    ExpectSamePlan(ref, own);
    ExpectSamePlan(ref, borrowed);
    mp_plan_destroy(borrowed); /* no-op: the arena is ours */
    EXPECT_STREQ(borrowed->params[0].fqn, "tok_embeddings.weight");
    mp_arena_destroy(a);
    mp_plan_destroy(own);
    mp_plan_destroy(ref);
    mp_plan_template_destroy(t);
  }
}

TEST(PlanTemplate, RefusalsMatchBuildPlan) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model moe = LoadModel("tiny-moe");
  mp_plan_template *t = nullptr;
  ASSERT_EQ(mp_plan_template_create(&ctx, &moe, &t), MP_OK) << mp_errmsg(&ctx);
  mp_mesh pp = Mesh("dp_shard=3,ep=3"); /* ep does not divide the 8 experts: refused */
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_build_plan(&ctx, &moe, &pp, nullptr, &p), MP_ERR_INVALID);
  std::string want = mp_errmsg(&ctx);
  EXPECT_EQ(mp_build_plan_from(&ctx, t, &pp, nullptr, nullptr, &p), MP_ERR_INVALID);
  EXPECT_EQ(p, nullptr);
  EXPECT_EQ(want, mp_errmsg(&ctx));
  mp_arena *a = mp_arena_create();
  mp_mesh tp = Mesh("tp=3"); /* tp does not divide the heads: refused by the TP pass */
  ASSERT_NE(mp_build_plan(&ctx, &moe, &tp, nullptr, &p), MP_OK);
  want = mp_errmsg(&ctx);
  EXPECT_NE(mp_build_plan_from(&ctx, t, &tp, nullptr, a, &p), MP_OK);
  EXPECT_EQ(want, mp_errmsg(&ctx));
  mp_arena_destroy(a);
  mp_plan_template_destroy(t);
  mp_plan_template_destroy(nullptr);
}

}  // namespace

// mp_plan_derive: a plan with another micro-batch, AC mode, reshard setting or global
// batch derived from a built one equals the plan built from scratch with those options
// (parameters, units, notes, options), shares the base's tables, and refuses any other
// option change.
namespace {
void ExpectSameOptions(const mp_plan_options &a, const mp_plan_options &b) {
  EXPECT_EQ(a.micro_batch, b.micro_batch);
  EXPECT_EQ(a.global_batch, b.global_batch);
  EXPECT_EQ(a.seq, b.seq);
  EXPECT_EQ(a.ac, b.ac);
  EXPECT_EQ(a.fp8, b.fp8);
  EXPECT_EQ(a.fp8_opts.all_gather, b.fp8_opts.all_gather);
  EXPECT_EQ(a.fsdp.reshard_after_forward, b.fsdp.reshard_after_forward);
  EXPECT_EQ(a.fsdp.per_block, b.fsdp.per_block);
  EXPECT_EQ(a.fsdp.param_dtype, b.fsdp.param_dtype);
  EXPECT_EQ(a.fsdp.reduce_dtype, b.fsdp.reduce_dtype);
  EXPECT_EQ(a.tp.shard_logits, b.tp.shard_logits);
  EXPECT_EQ(a.tp.pad_vocab, b.tp.pad_vocab);
  EXPECT_EQ(a.pp_schedule, b.pp_schedule);
  EXPECT_EQ(a.pp_virtual, b.pp_virtual);
  EXPECT_EQ(a.master_dtype, b.master_dtype);
}
}  // namespace

TEST(PlanDerive, SameAsBuildingWithTheOptions) {
  struct Case {
    const char *model, *mesh;
    int fp8;
  } cases[] = {
      {"tiny-dense", "dp_shard=4,tp=2", 0},
      {"tiny-dense", "pp=2,dp_shard=2", 1},
      {"tiny-moe", "dp_shard=4,ep=2", 1},
      {"llama3.1-405b", "pp=2,dp_replicate=2,dp_shard=4,tp=8", 1},
  };
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  for (const Case &c : cases) {
    mp_model m = LoadModel(c.model);
    mp_mesh mesh = Mesh(c.mesh);
    mp_plan_template *t = nullptr;
    ASSERT_EQ(mp_plan_template_create(&ctx, &m, &t), MP_OK) << mp_errmsg(&ctx);
    mp_plan_options base_o;
    mp_plan_options_init(&base_o);
    base_o.fp8 = c.fp8;
    base_o.seq = 256;
    base_o.global_batch = 64;
    base_o.micro_batch = 2;
    base_o.ac = MP_AC_NONE;
    base_o.fsdp.reshard_after_forward = 1;
    mp_arena *a = mp_arena_create();
    mp_plan *base = nullptr;
    ASSERT_EQ(mp_build_plan_from(&ctx, t, &mesh, &base_o, a, &base), MP_OK) << mp_errmsg(&ctx);
    for (int mb : {1, 2, 4})
      for (mp_ac_mode ac : {MP_AC_NONE, MP_AC_SELECTIVE, MP_AC_FULL})
        for (int rs : {0, 1})
          for (int64_t gb : {int64_t(64), int64_t(0)}) {
            SCOPED_TRACE(std::string(c.model) + " " + c.mesh + " mb=" + std::to_string(mb) +
                         " ac=" + mp_ac_mode_name(ac) + " rs=" + std::to_string(rs) +
                         " gb=" + std::to_string(gb));
            mp_plan_options o = base_o;
            o.micro_batch = mb;
            o.ac = ac;
            o.fsdp.reshard_after_forward = rs;
            o.global_batch = gb;
            mp_plan *ref = nullptr, *d = nullptr;
            ASSERT_EQ(mp_build_plan_from(&ctx, t, &mesh, &o, nullptr, &ref), MP_OK)
                << mp_errmsg(&ctx);
            ASSERT_EQ(mp_plan_derive(&ctx, base, &o, a, &d), MP_OK) << mp_errmsg(&ctx);
            ExpectSamePlan(ref, d);
            ExpectSameOptions(ref->opts, d->opts);
            EXPECT_EQ(d->ac, ref->ac);
            // the tables are the base's, not copies
            EXPECT_EQ(d->params, base->params);
            EXPECT_EQ(d->units, base->units);
            EXPECT_EQ(d->arena_borrowed, 1);
            mp_plan_destroy(d); /* frees nothing: the arena and tables are not its own */
            mp_plan_destroy(ref);
          }
    // Anything that shapes the parameters or units is refused.
    mp_plan *d = nullptr;
    mp_plan_options o = base_o;
    o.fp8 = !c.fp8;
    EXPECT_EQ(mp_plan_derive(&ctx, base, &o, a, &d), MP_ERR_INVALID);
    EXPECT_NE(std::string(mp_errmsg(&ctx)).find("build the plan instead"), std::string::npos);
    o = base_o;
    o.tp.pad_vocab = 1;
    EXPECT_EQ(mp_plan_derive(&ctx, base, &o, a, &d), MP_ERR_INVALID);
    o = base_o;
    o.seq = 512;
    EXPECT_EQ(mp_plan_derive(&ctx, base, &o, a, &d), MP_ERR_INVALID);
    o = base_o;
    o.fsdp.param_dtype = MP_DTYPE_FP32;
    EXPECT_EQ(mp_plan_derive(&ctx, base, &o, a, &d), MP_ERR_INVALID);
    // and the mesh rules still apply to the new options
    o = base_o;
    o.micro_batch = 0;
    EXPECT_EQ(mp_plan_derive(&ctx, base, &o, a, &d), MP_ERR_INVALID);
    EXPECT_EQ(d, nullptr);
    mp_arena_destroy(a);
    mp_plan_template_destroy(t);
  }
}
