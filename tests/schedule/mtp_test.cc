// Multi-token prediction (DeepSeek-V3, arXiv 2412.19437 sec. 2.2; Megatron-Core's
// MultiTokenPredictionLayer, multi_token_prediction.py at core_v0.14.0) through the model, the
// plan and the schedule: its parameters counted by hand (DeepSeek-V3's module and a tiny
// model's), where they live under a pipeline, the FLOPs of its ops and what the last stage
// holds with and without it.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "exec/plan.h"
#include "exec/schedule.h"
#include "tests/schedule/built.h"

namespace {

using namespace sched_test;

// DeepSeek-V3's module, H = 7168 (data/models/deepseek-v3.json):
//   MLA: q_a 1536 x 7168 = 11,010,048, q_a_layernorm 1536, q_b 128 x 192 x 1536 =
//        37,748,736, kv_a (512 + 64) x 7168 = 4,128,768, kv_a_layernorm 512, kv_b
//        128 x 256 x 512 = 16,777,216, o 7168 x 128 x 128 = 117,440,512   187,107,328
//   attention and ffn norms 2 x 7168                                           14,336
//   router 256 x 7168                                                       1,835,008
//   routed experts 256 x 3 x 2048 x 7168                               11,274,289,152
//   shared expert 3 x 2048 x 7168                                          44,040,192
//   enorm, hnorm, final norm 3 x 7168                                          21,504
//   eh_proj 7168 x 2 x 7168                                               102,760,448
//                                                                      11,610,067,968
TEST(Mtp, DeepSeekV3ModuleParameters) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  ASSERT_EQ(mp_model_load(&ctx, "deepseek-v3", &m), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(m.mtp_layers, 1);
  EXPECT_EQ(mp_model_mtp_params(&m), 11610067968LL);
  EXPECT_TRUE(mp_model_layer_is_moe(&m, 61)); // of the last block's kind
  EXPECT_TRUE(mp_model_layer_is_mtp(&m, 61));
  EXPECT_FALSE(mp_model_layer_is_mtp(&m, 60));
  m.mtp_layers = 0;
  EXPECT_EQ(mp_model_mtp_params(&m), 0);
  EXPECT_FALSE(mp_model_layer_is_moe(&m, 61));
}

// A tiny llama model, H = 16, 2 heads of 8, d_ff 32, two MTP modules. Each module:
//   q, k, v, o 4 x 16 x 16 = 1024; 2 block norms 32; gate, up, down 3 x 16 x 32 = 1536;
//   enorm, hnorm, final norm 48; eh_proj 16 x 32 = 512: 3,152; two: 6,304.
// The plan holds them as layers 2 and 3, on the last of pp=2 stages, with the FQNs of
// DeepSeek-V3's checkpoint.
TEST(Mtp, TinyModelByHand) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  const char *js = "{\"name\": \"tiny-mtp\", \"family\": \"llama\", \"vocab\": 100, \"d_model\": 16, "
                   "\"n_layers\": 2, \"n_heads\": 2, \"d_ff\": 32, \"mtp_layers\": 2}";
  ASSERT_EQ(mp_model_from_text(&ctx, js, "tiny-mtp.json", &m), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_model_mtp_params(&m), 6304);
  mp_mesh mesh;
  ASSERT_EQ(mp_mesh_parse(&ctx, "pp=2", 0, &mesh), MP_OK) << mp_errmsg(&ctx);
  mp_plan_options po;
  mp_plan_options_init(&po);
  po.seq = 64;
  mp_plan *p = nullptr;
  ASSERT_EQ(mp_build_plan(&ctx, &m, &mesh, &po, &p), MP_OK) << mp_errmsg(&ctx);
  int64_t mtp = 0, copy = 0;
  int eh = 0;
  for (int i = 0; i < p->n_params; i++) {
    const mp_param *prm = &p->params[i];
    if (prm->layer >= 2) {
      mtp += mp_param_numel(prm);
      EXPECT_EQ(prm->pp_stage, 1) << prm->fqn;
    }
    if (prm->tied_copy) {
      copy += mp_param_numel(prm);
      EXPECT_EQ(prm->pp_stage, 1);
    }
    if (prm->module == MP_MOD_MTP_EH_PROJ && prm->layer == 2) {
      EXPECT_STREQ(prm->fqn, "layers.2.eh_proj.weight");
      EXPECT_EQ(prm->shape[0], 16);
      EXPECT_EQ(prm->shape[1], 32);
      eh++;
    }
  }
  EXPECT_EQ(mtp, 6304);
  EXPECT_EQ(eh, 1);
  EXPECT_EQ(copy, 100 * 16); // the last stage's embedding copy for the shifted tokens
  mp_plan_destroy(p);
}

// The GEMM FLOPs of an op set over the whole step of rank's schedule.
double GemmFlops(const mp_schedule *s, int layer, int module) {
  double f = 0;
  mp_schedule_iter it;
  mp_schedule_iter_begin(s, &it);
  while (mp_schedule_iter_next(&it)) {
    const mp_op *op = it.op;
    if (op->type != MP_OP_COMPUTE || op->kernel != MP_KERNEL_GEMM || it.layer != layer) continue;
    if (module == -2 ? (op->module == MP_MOD_MTP_EH_PROJ || op->module == MP_MOD_OUTPUT) : op->module != module)
      continue;
    f += op->flops;
  }
  return f;
}

// DeepSeek-V3's last stage (rank 1920 + 77 of pp=16 x dp_shard=128, ep 64), seq 4096, under ac.
Opts LastStage(mp_ac_mode ac) {
  Opts o;
  o.model = "deepseek-v3";
  o.mesh = "pp=16,dp_shard=128,ep=64";
  o.seq = 4096;
  o.rank = 1920 + 77;
  o.ac = ac;
  return o;
}

// DeepSeek-V3 on pp=16 x dp_replicate=128 x ep=64, seq 4096, the last stage (rank 1920 + 77).
// By hand, a 4,096-token micro-batch, forward + input gradient + weight gradient = 3 x 2 x:
//   eh_proj   4096 x 7168 x 14336        = 3 x 0.842 TFLOP = 2,526,202,740,736 (over 3)
//   MTP head  4096 x 129280 x 7168       = 3 x 7.591 TFLOP
// and the MTP block's own GEMMs those of block 60 (the same MoE block) on the same rank.
TEST(Mtp, DeepSeekV3FlopsOfTheModuleOps) {
  Built b;
  Opts o = LastStage(MP_AC_NONE);
  o.mesh = "pp=16,dp_replicate=128,ep=64";
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  o.dist_opt = 1;
  Build(&b, o);
  const double T = 4096, H = 7168, V = 129280;
  EXPECT_DOUBLE_EQ(GemmFlops(b.s, 61, MP_MOD_MTP_EH_PROJ), 3 * 2 * T * H * 2 * H);
  EXPECT_DOUBLE_EQ(GemmFlops(b.s, 61, MP_MOD_OUTPUT), 3 * 2 * T * V * H);
  EXPECT_DOUBLE_EQ(GemmFlops(b.s, -1, MP_MOD_OUTPUT), 3 * 2 * T * V * H); // the main head's
  for (int mod : {MP_MOD_Q_A, MP_MOD_Q_B, MP_MOD_KV_A, MP_MOD_KV_B, MP_MOD_O, MP_MOD_ROUTER, MP_MOD_EXPERTS_GATE,
                  MP_MOD_EXPERTS_UP, MP_MOD_EXPERTS_DOWN, MP_MOD_SHARED_GATE, MP_MOD_SHARED_UP, MP_MOD_SHARED_DOWN}) {
    SCOPED_TRACE(mp_module_name((mp_module)mod));
    EXPECT_GT(GemmFlops(b.s, 60, mod), 0.0);
    EXPECT_DOUBLE_EQ(GemmFlops(b.s, 61, mod), GemmFlops(b.s, 60, mod));
  }
  // a stage before the last runs no MTP op
  Built f;
  o.rank = 77;
  Build(&f, o);
  EXPECT_EQ(GemmFlops(f.s, 61, MP_MOD_MTP_EH_PROJ), 0.0);
}

// Peak-free totals of a memory category: the bytes its prologue holds (resident) and the net
// bytes the forward of `layer` leaves allocated.
int64_t Resident(const mp_schedule *s, mp_mem_cat cat) {
  int64_t n = 0;
  for (const Inst &x : Expand(s))
    if (x.op->phase == MP_PHASE_PROLOGUE && x.op->type == MP_OP_ALLOC && x.op->mem_cat == cat) n += x.op->mem_bytes;
  return n;
}

int64_t ForwardNet(const mp_schedule *s, int layer, mp_mem_cat cat) {
  int64_t net = 0;
  for (const Inst &x : Expand(s)) {
    if (x.layer != layer || x.op->phase != MP_PHASE_FORWARD || x.op->mem_cat != cat) continue;
    if (x.op->type == MP_OP_ALLOC) net += x.op->mem_bytes;
    if (x.op->type == MP_OP_FREE) net -= x.op->mem_bytes;
  }
  return net;
}

// The last stage with and without MTP (torchtitan's memory model, DDP-free: FSDP over 128,
// experts over ep 64 x 2, seq 4096, AC none, sharded logits):
//   parameters at rest grow by the module's (sharded as the rest of its block) and the
//   embedding copy; the forward leaves, beside block 61's saved tensors (block 60's), the
//   module's input side, 2TH (enorm's input) + 2 x 4T (norm statistics) + 4TH (eh_proj's
//   input) bytes, and its head's saved tensors 2TH + 4T + 2TH (as the main head's): 10TH +
//   12T = 293,650,432 bytes at T = 4096, H = 7168; and the second loss's logits state, the
//   main loss's.
// What the forward of block 61 (the MTP block, its input side and head) leaves saved beyond
// block 60's, on the last stage under ac (b: its build).
int64_t SavedBeyondBlock60(Built *b, mp_ac_mode ac) {
  Build(b, LastStage(ac));
  return ForwardNet(b->s, 61, MP_MEM_ACTIVATIONS) - ForwardNet(b->s, 60, MP_MEM_ACTIVATIONS);
}

TEST(Mtp, LastStageMemoryWithAndWithout) {
  const Opts o = LastStage(MP_AC_NONE);
  Built b;
  const int64_t T = 4096, H = 7168;
  EXPECT_EQ(SavedBeyondBlock60(&b, MP_AC_NONE), 10 * T * H + 12 * T);
  EXPECT_GT(ForwardNet(b.s, 61, MP_MEM_LOGITS), 0);
  EXPECT_EQ(ForwardNet(b.s, 61, MP_MEM_LOGITS), ForwardNet(b.s, -1, MP_MEM_LOGITS));
  // the same plan of the model without MTP
  Built z;
  mp_ctx_init(&z.ctx);
  ASSERT_EQ(mp_model_load(&z.ctx, o.model, &z.model), MP_OK);
  z.model.mtp_layers = 0;
  mp_mesh mesh;
  ASSERT_EQ(mp_mesh_parse(&z.ctx, o.mesh, 0, &mesh), MP_OK);
  mp_plan_options po;
  FillOptions(o, &po);
  ASSERT_EQ(mp_build_plan(&z.ctx, &z.model, &mesh, &po, &z.plan), MP_OK) << mp_errmsg(&z.ctx);
  z.arena = mp_arena_create();
  ASSERT_EQ(mp_schedule_build(&z.ctx, z.plan, o.rank, o.mode, z.arena, &z.s), MP_OK) << mp_errmsg(&z.ctx);
  EXPECT_EQ(ForwardNet(z.s, 61, MP_MEM_ACTIVATIONS), 0);
  EXPECT_EQ(ForwardNet(z.s, 61, MP_MEM_LOGITS), 0);
  // fp32 master parameters at rest: the module's block sharded over its FSDP groups (the
  // routed experts over ep 64 and then dp_shard / ep = 2, the rest over 128: each 1/128) and
  // the embedding copy's rows over 128: 4 bytes x (11,610,067,968 + 129,280 x 7168) / 128 =
  // 391,773,969 (each shard rounded up to whole rows of its group: at most one row a tensor
  // more)
  const double want = 4.0 * (11610067968.0 + 129280.0 * 7168) / 128;
  const double grew = (double)(Resident(b.s, MP_MEM_PARAMS) - Resident(z.s, MP_MEM_PARAMS));
  EXPECT_NEAR(grew, want, 4.0 * 40 * 7168);
}

// Under full AC Megatron-Core checkpoints the input side with the module's block: the forward
// leaves beside block 61's kept input (block 60's) the embedding output 2TH and the head's
// 2TH + 4T + 2TH (10TH + 12T less eh_proj's input 4TH and the norms' statistics 8T: 6TH +
// 4T), and eh_proj's forward GEMM runs again in the backward: 4 x 2 x T x H x 2H in all.
TEST(Mtp, FullAcRecomputesTheInputSide) {
  Built b;
  const int64_t T = 4096, H = 7168;
  EXPECT_EQ(SavedBeyondBlock60(&b, MP_AC_FULL), 6 * T * H + 4 * T);
  EXPECT_DOUBLE_EQ(GemmFlops(b.s, 61, MP_MOD_MTP_EH_PROJ), 4 * 2.0 * T * H * 2 * H);
}

// The tiny model of TinyModelByHand (one MTP module here) on mesh, seq 64, rank 0's expanded
// schedule under torchtitan's memory model.
void BuildTiny(Built *b, const char *mesh_s) {
  mp_ctx_init(&b->ctx);
  const char *js = "{\"name\": \"tiny-mtp\", \"family\": \"llama\", \"vocab\": 100, \"d_model\": 16, "
                   "\"n_layers\": 2, \"n_heads\": 2, \"d_ff\": 32, \"mtp_layers\": 1}";
  ASSERT_EQ(mp_model_from_text(&b->ctx, js, "tiny-mtp.json", &b->model), MP_OK) << mp_errmsg(&b->ctx);
  mp_mesh mesh;
  ASSERT_EQ(mp_mesh_parse(&b->ctx, mesh_s, 0, &mesh), MP_OK) << mp_errmsg(&b->ctx);
  Opts o;
  o.seq = 64;
  mp_plan_options po;
  FillOptions(o, &po);
  ASSERT_EQ(mp_build_plan(&b->ctx, &b->model, &mesh, &po, &b->plan), MP_OK) << mp_errmsg(&b->ctx);
  b->arena = mp_arena_create();
  ASSERT_EQ(mp_schedule_build(&b->ctx, b->plan, 0, MP_SCHEDULE_EXPANDED, b->arena, &b->s), MP_OK)
      << mp_errmsg(&b->ctx);
  ASSERT_EQ(mp_schedule_check(&b->ctx, b->s), MP_OK) << mp_errmsg(&b->ctx);
}

// The collectives of the module's input side (layer 2), payload bytes by hand:
//   tp=2 with SP (T = 64 tokens, H = 16, bf16): eh_proj column-parallel, [16 / 2, 32] on the
//   rank; forward the concat [T, 2H] all-gathered (2 x 64 x 32 = 4096 bytes) and the output
//   [T, H / 2] gathered to [T, H] (2048); backward the split's gradient all-gathered (2048)
//   and the input gradient's partial sums reduce-scattered (4096)
//   cp=2: roll_tensor's two ring shifts (token and position ids), each rank's two chunks'
//   first int64 per sequence: 2 x 8 x 1 = 16 bytes each
TEST(Mtp, CollectivesOfTheInputSide) {
  struct Coll {
    int coll, group;
    double bytes;
    int phase;
  };
  auto colls = [](const mp_schedule *s) {
    std::vector<Coll> v;
    for (const Inst &x : Expand(s))
      if (x.op->type == MP_OP_COMM && x.layer == 2 && x.op->module == MP_MOD_MTP_EH_PROJ)
        v.push_back({x.op->coll, x.op->group, x.op->bytes, x.op->phase});
    return v;
  };
  Built t;
  BuildTiny(&t, "tp=2");
  const std::vector<Coll> tp = colls(t.s);
  ASSERT_EQ(tp.size(), 4u);
  const Coll want[] = {{MP_COLL_ALL_GATHER, MP_GROUP_TP, 4096, MP_PHASE_FORWARD},
                       {MP_COLL_ALL_GATHER, MP_GROUP_TP, 2048, MP_PHASE_FORWARD},
                       {MP_COLL_ALL_GATHER, MP_GROUP_TP, 2048, MP_PHASE_BACKWARD},
                       {MP_COLL_REDUCE_SCATTER, MP_GROUP_TP, 4096, MP_PHASE_BACKWARD}};
  for (int i = 0; i < 4; i++) {
    SCOPED_TRACE(i);
    EXPECT_EQ(tp[i].coll, want[i].coll);
    EXPECT_EQ(tp[i].group, want[i].group);
    EXPECT_DOUBLE_EQ(tp[i].bytes, want[i].bytes);
    EXPECT_EQ(tp[i].phase, want[i].phase);
  }
  EXPECT_DOUBLE_EQ(GemmFlops(t.s, 2, MP_MOD_MTP_EH_PROJ), 3 * 2.0 * 64 * 8 * 32);
  Built c;
  BuildTiny(&c, "cp=2");
  int rolls = 0;
  for (const Inst &x : Expand(c.s))
    if (x.op->type == MP_OP_COMM && x.layer == 2 && x.op->coll == MP_COLL_SENDRECV && x.op->group == MP_GROUP_CP &&
        x.op->module == MP_MOD_TOK_EMBEDDINGS) {
      EXPECT_DOUBLE_EQ(x.op->bytes, 16.0);
      rolls++;
    }
  EXPECT_EQ(rolls, 2);
  EXPECT_TRUE(colls(c.s).empty()); /* no tp */
}

// A stated layout names the model's MTP layers (Megatron-Core's validate_layer_layout): one
// without them for DeepSeek-V3 is refused naming both counts; with them the plan builds and
// the module's block is on the last stage.
TEST(Mtp, LayoutNamesTheModulesLayers) {
  Opts o;
  o.model = "deepseek-v3";
  o.mesh = "pp=16,dp_replicate=128,ep=64";
  o.seq = 4096;
  o.mem_model = MP_MEM_MODEL_MEGATRON;
  for (const char *lay : {"Et*3|(t*4|)*14t*2,L", "Et*3|(t*4|)*14t*2,mL"}) {
    SCOPED_TRACE(lay);
    Built b;
    mp_ctx_init(&b.ctx);
    ASSERT_EQ(mp_model_load(&b.ctx, o.model, &b.model), MP_OK);
    mp_mesh mesh;
    ASSERT_EQ(mp_mesh_parse(&b.ctx, o.mesh, 0, &mesh), MP_OK);
    mp_plan_options po;
    FillOptions(o, &po);
    ASSERT_EQ(mp_pp_layout_parse(&b.ctx, lay, &po), MP_OK) << mp_errmsg(&b.ctx);
    const mp_status st = mp_build_plan(&b.ctx, &b.model, &mesh, &po, &b.plan);
    if (std::strstr(lay, "m") == nullptr) {
      EXPECT_NE(st, MP_OK);
      EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find("names 0 MTP layers (m) but deepseek-v3 has 1"), std::string::npos)
          << mp_errmsg(&b.ctx);
      continue;
    }
    ASSERT_EQ(st, MP_OK) << mp_errmsg(&b.ctx);
    EXPECT_EQ(mp_plan_layer_stage(b.plan, 61), 15);
    EXPECT_EQ(mp_plan_layer_stage(b.plan, 59), 15);
    EXPECT_EQ(mp_plan_layer_stage(b.plan, 58), 14);
  }
}

}  // namespace
