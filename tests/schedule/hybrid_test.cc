// Hybrid Mamba-Transformer models (Nemotron-H; exec/model_hybrid.c, exec/schedule_mamba.c):
// parameter counts of the published configs, Megatron's FLOP count of a tiny hybrid model,
// the Mamba-2 layer's GEMM FLOPs, TP shards and collectives, its saved bytes, and the
// refusals, each against figures derived by hand in the comments.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "exec/plan.h"
#include "exec/runtime/check.h"
#include "exec/schedule.h"
#include "tests/schedule/built.h"

namespace {

using namespace sched_test;

// Megatron-Core's memory model on mesh, tiny-hybrid at seq 64 (its max_seq).
Opts Tiny(const char *mesh) {
  Opts o = Megatron(mesh);
  o.model = "tiny-hybrid";
  o.seq = 64;
  return o;
}

mp_model Load(const char *name) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  EXPECT_EQ(mp_model_load(&ctx, name, &m), MP_OK) << mp_errmsg(&ctx);
  return m;
}

// Nemotron-H 8B (nvidia/Nemotron-H-8B-Base-8K config.json): H 4096, vocab 131072 untied,
// 24 M, 4 *, 24 - layers, each behind an RMSNorm [4096].
//   M: in_proj (2 x 8192 + 2 x 8 x 128 + 128 = 18560) x 4096 = 76,021,760; conv1d
//      (8192 + 2048 = 10240) x 4 + 10240 = 51,200; dt_bias, A_log, D 3 x 128 = 384; norm 8192;
//      out_proj 4096 x 8192 = 33,554,432; pre-norm 4096                   = 109,640,064
//   *: q, o 2 x 4096^2 = 33,554,432; k, v 2 x 1024 x 4096 = 8,388,608; norm = 41,947,136
//   -: up, down 2 x 21504 x 4096 = 176,160,768; norm                      = 176,164,864
//   embeddings 2 x 131072 x 4096 = 1,073,741,824; final norm 4096
//   total 24 x 109,640,064 + 4 x 41,947,136 + 24 x 176,164,864 + 1,073,745,920
//       = 8,100,852,736 (published: 8B; the checkpoint's tensors sum to the same)
// 56B (H 8192, 54 M, 10 *, 54 -, d_ff 32768, 256 heads of 64, state 256):
//   M: in_proj (32768 + 4096 + 256 = 37120) x 8192 = 304,087,040; conv (16384 + 4096 = 20480)
//      x 5 = 102,400; 768; 16384; out_proj 134,217,728; 8192             = 438,432,512
//   *: 2 x 8192^2 + 2 x 1024 x 8192 + 8192 = 150,994,944
//   -: 2 x 32768 x 8192 + 8192 = 536,879,104
//   total 54 x 438,432,512 + 10 x 150,994,944 + 54 x 536,879,104 + 2 x 131072 x 8192 + 8192
//       = 56,324,350,464 (published: 56B)
// 47B: 45 M, 5 *, 48 - and d_ff 30720 (- = 2 x 30720 x 8192 + 8192 = 503,324,672):
//   45 x 438,432,512 + 5 x 150,994,944 + 48 x 503,324,672 + 2,147,491,840 = 46,791,554,816
//   (published: 47B)
TEST(Hybrid, ParameterCountsOfNemotronH) {
  struct Case {
    const char *name;
    int64_t want;
    double published;
  } cases[] = {{"nemotron-h-8b", 8100852736LL, 8e9},
               {"nemotron-h-56b", 56324350464LL, 56e9},
               {"nemotron-h-47b", 46791554816LL, 47e9}};
  for (const Case &c : cases) {
    SCOPED_TRACE(c.name);
    const mp_model m = Load(c.name);
    EXPECT_TRUE(mp_model_is_hybrid(&m));
    EXPECT_EQ(mp_model_param_count(&m), c.want);
    EXPECT_NEAR((double)c.want / c.published, 1.0, 0.013);  // the published names round
  }
  const mp_model m = Load("nemotron-h-8b");
  EXPECT_EQ(mp_model_block_params(&m, 0), 109640064);  // M
  EXPECT_EQ(mp_model_block_params(&m, 1), 176164864);  // -
  EXPECT_EQ(mp_model_block_params(&m, 7), 41947136);   // *: "M-M-M-M*" puts it at index 7
  EXPECT_EQ(mp_model_layer_kind(&m, 7), MP_LAYER_ATTN);
  EXPECT_EQ(mp_model_n_layers_of(&m, MP_LAYER_MAMBA), 24);
  EXPECT_EQ(mp_model_n_layers_of(&m, MP_LAYER_ATTN), 4);
  EXPECT_EQ(mp_model_n_layers_of(&m, MP_LAYER_MLP), 24);
}

// Hugging Face's nemotron_h config.json (the keys of nvidia/Nemotron-H-8B-Base-8K's) reads as
// nemotron-h-8b: the same pattern, Mamba sizes and 8,100,852,736 parameters; a MoE pattern
// (Nemotron 3's E layers) is refused by name.
TEST(Hybrid, HuggingFaceNemotronHConfig) {
  const char *cfg =
      "{\"architectures\": [\"NemotronHForCausalLM\"], \"model_type\": \"nemotron_h\", \"vocab_size\": 131072, "
      "\"hidden_size\": 4096, \"num_hidden_layers\": 52, \"num_attention_heads\": 32, \"num_key_value_heads\": 8, "
      "\"attention_head_dim\": 128, \"intermediate_size\": 21504, \"max_position_embeddings\": 8192, "
      "\"tie_word_embeddings\": false, \"layer_norm_epsilon\": 1e-5, \"mlp_hidden_act\": \"relu2\", "
      "\"hybrid_override_pattern\": \"%s\", \"ssm_state_size\": 128, \"mamba_num_heads\": 128, "
      "\"mamba_head_dim\": 64, \"n_groups\": 8, \"conv_kernel\": 4, \"chunk_size\": 128, \"expand\": 2}";
  char text[2048];
  snprintf(text, sizeof text, cfg, "M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M*-M-M-M-M-M-");
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model hf;
  ASSERT_EQ(mp_model_from_hf_text(&ctx, text, "config.json", &hf), MP_OK) << mp_errmsg(&ctx);
  const mp_model m = Load("nemotron-h-8b");
  EXPECT_EQ(mp_model_param_count(&hf), 8100852736LL);
  EXPECT_EQ(memcmp(hf.layer_kind, m.layer_kind, sizeof m.layer_kind), 0);
  EXPECT_EQ(hf.mlp, MP_MLP_SQUARED_RELU);
  EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&hf, 8192), mp_model_flops_per_token(&m, 8192));
  snprintf(text, sizeof text, cfg, "MEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEM*EMEMEMEM*EMEMEMEME");
  EXPECT_EQ(mp_model_from_hf_text(&ctx, text, "config.json", &hf), MP_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("MoE layer (E)"), std::string::npos);
}

// Megatron-LM's hybrid FLOP count (training.py num_floating_point_operations at core_v0.14.0)
// of tiny-hybrid ("M-M*-": 2 M, 1 *, 2 -; H 64, 8 heads of 8, 4 KV heads, d_ff 128, vocab
// 256; Mamba 8 heads, state 16, 2 groups) at seq 64, per token:
//   attention 4 H p (H + H g / a + s / 2), p = 8 x 8 / 64 = 1: 4 x 64 x (64 + 32 + 32) = 32768
//   MLP 4 x f x H = 4 x 128 x 64 = 32768
//   Mamba, d_in = 2H = 128: 2 H (2 d_in + 2 G N + heads) = 128 x 328 = 41984,
//     7 d_in N = 14336, 2 d_in H = 16384: 72704
//   logits 2 H V = 32768
//   3 x (32768 + 2 x 32768 + 2 x 72704 + 32768) = 3 x 276480 = 829440
TEST(Hybrid, MegatronFlopsPerTokenOfTinyHybrid) {
  const mp_model m = Load("tiny-hybrid");
  EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&m, 64), 829440.0);
  // the attention's s / 2 term: seq 32 takes 4 x 64 x 16 x 3 = 12288 off
  EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&m, 64) - mp_model_flops_per_token(&m, 32), 12288.0);
}

// The GEMM FLOPs of tiny-hybrid's layer 0 (M) forward on T = 64 tokens (micro-batch 1, seq
// 64), megatron-core's memory model, at tp 1 and tp 2 (heads 8 -> 4, groups 2 -> 1, in_proj
// rows 328 -> 164, d_inner 128 -> 64):
//   in_proj 2 T rows H: 2 x 64 x 328 x 64 = 2,686,976 (tp 2: 1,343,488)
//   SSD on 64 / 16 = 4 chunks of Q = 16 (N 16, P 16): CB 2 x 16 x 16 x 16 x 4 x G = 32,768 G;
//     Y_diag, states, Y_off 2 x 16^3 x 4 x heads = 32,768 heads each
//     tp 1: 65,536 + 3 x 262,144 = 851,968; tp 2: 32,768 + 3 x 131,072 = 425,984
//   out_proj 2 T H d_inner: 2 x 64 x 64 x 128 = 1,048,576 (tp 2: 524,288)
// Backward: twice each.
TEST(Hybrid, MambaLayerGemmFlops) {
  for (int tp : {1, 2}) {
    SCOPED_TRACE(tp);
    Opts o = Tiny(tp == 1 ? "dp_shard=1" : "tp=2");
    Built b;
    Build(&b, o);
    double fwd = 0, bwd = 0;
    for (const Inst &x : Expand(b.s)) {
      if (x.layer != 0 || x.op->type != MP_OP_COMPUTE || x.op->kernel != MP_KERNEL_GEMM) continue;
      (x.op->phase == MP_PHASE_FORWARD ? fwd : bwd) += x.op->flops;
    }
    const double want = (2686976.0 + 851968.0 + 1048576.0) / tp;
    EXPECT_DOUBLE_EQ(fwd, want);
    EXPECT_DOUBLE_EQ(bwd, 2 * want);
  }
}

// TP 2 on tiny-hybrid: in_proj [328, 64] colwise -> [164, 64] (41,984 bytes of fp32 at rest
// per rank: 164 x 64 x 4), conv1d [192, 4] -> [96, 4], its bias and the norm's weight halved,
// dt_bias, A_log and D [8] -> [4], out_proj [64, 128] rowwise -> [64, 64]. Under SP the
// layer's forward all-gathers the normed input into in_proj, 2 T H = 8192 bytes, and
// reduce-scatters out_proj's output, 8192 bytes.
TEST(Hybrid, MambaTensorParallelShardsAndCollectives) {
  Opts o = Tiny("tp=2");
  Built b;
  Build(&b, o);
  struct Want {
    mp_module mod;
    mp_param_role role;
    int64_t d0, d1;
    mp_tp_style style;
  } want[] = {{MP_MOD_MAMBA_IN, MP_ROLE_WEIGHT, 164, 64, MP_TP_COLWISE},
              {MP_MOD_MAMBA_CONV, MP_ROLE_WEIGHT, 96, 4, MP_TP_COLWISE},
              {MP_MOD_MAMBA_CONV, MP_ROLE_BIAS, 96, 1, MP_TP_COLWISE},
              {MP_MOD_MAMBA_A_LOG, MP_ROLE_WEIGHT, 4, 1, MP_TP_COLWISE},
              {MP_MOD_MAMBA_NORM, MP_ROLE_WEIGHT, 64, 1, MP_TP_COLWISE},
              {MP_MOD_MAMBA_OUT, MP_ROLE_WEIGHT, 64, 64, MP_TP_ROWWISE}};
  for (const Want &w : want) {
    SCOPED_TRACE(mp_module_name(w.mod));
    const mp_param *p = nullptr;
    for (int i = 0; i < b.plan->n_params; i++)
      if (b.plan->params[i].layer == 0 && b.plan->params[i].module == w.mod && b.plan->params[i].role == w.role)
        p = &b.plan->params[i];
    ASSERT_NE(p, nullptr);
    EXPECT_EQ(p->tp_shape[0], w.d0);
    EXPECT_EQ(p->tp_shape[1], w.d1);
    EXPECT_EQ(p->tp_style, w.style);
    if (w.mod == MP_MOD_MAMBA_IN) {
      EXPECT_EQ(mp_param_tp_numel(p) * 4, 41984);
    }
  }
  std::vector<std::string> fwd;
  for (const Inst &x : Expand(b.s))
    if (x.layer == 0 && x.op->type == MP_OP_COMM && x.op->group == MP_GROUP_TP && x.op->phase == MP_PHASE_FORWARD)
      fwd.push_back(std::string(mp_module_name((mp_module)x.op->module)) + ":" + std::to_string((int)x.op->coll) +
                    ":" + std::to_string((int64_t)x.op->bytes));
  const std::vector<std::string> want_fwd = {
      "mixer.in_proj:" + std::to_string((int)MP_COLL_ALL_GATHER) + ":8192",
      "mixer.out_proj:" + std::to_string((int)MP_COLL_REDUCE_SCATTER) + ":8192"};
  EXPECT_EQ(fwd, want_fwd);
}

// What tiny-hybrid's layers save, megatron-core, tp 1, T = 64, bf16, 4-byte RMSNorm rstd
// (schedule_mamba.c's list: Megatron-Core's MambaMixer with mamba_ssm's kernels):
//   M (layer 0): x 2 T H = 8192; rstd 256, in_proj's input 8192, zxBCdt 2 x 64 x 328 = 41984,
//     the scan's out_x 2 x 64 x 128 = 16384, its gated output (the gated norm's saved input)
//     16384, the norm's rstd 4 x 64 x 2 = 512, out_proj's input 16384: 108,288
//   - (layer 1): x 8192; rstd 256, normed input 8192, up's output and its square
//     2 x 2 x 64 x 128 = 32768: 49,408 (the block's MLP list less its input, which x is)
//   * (layer 3): below, the block's attention list without its MLP
TEST(Hybrid, SavedBytesOfEachLayerKind) {
  Opts o = Tiny("dp_shard=1");
  Built b;
  Build(&b, o);
  EXPECT_EQ(SavedByBlock(b.s, 0), 108288);
  EXPECT_EQ(SavedByBlock(b.s, 1), 49408);
  // the attention layer: rstd 256, in 8192, q/k/v 2T(q + kv) = 2 x 64 x (64 + 32) = 12288,
  // v again 2 T kv = 4096, core 4 T heads = 2048, o's input 2 T q = 8192, and x 8192
  EXPECT_EQ(SavedByBlock(b.s, 3), 8192 + 256 + 8192 + 12288 + 4096 + 2048 + 8192);
}

// The same under Transformer Engine's float8 (megatron-core's delayed recipe): a float8
// Linear saves its input's float8 copy, 1 byte an element, not the bf16 one. tiny-hybrid's
// in_proj [328, 64] stays bf16 (328 rows, not a multiple of 16: mp_rule_fp8_linear_ok);
// out_proj [64, 128], q/k/v/o, up [128, 64] and down [64, 128] run float8:
//   M: out_proj's input 2 x 64 x 128 = 16384 -> 8192: 108,288 - 8192 = 100,096
//   -: the normed input 8192 -> 4096, down's input (the square) 16384 -> 8192:
//      49,408 - 4096 - 8192 = 37,120 (relu's bf16 output 16384 stays: relu and the square
//      both save it)
//   *: q/k/v's normed input 8192 -> 4096; o saves its float8 copy of the attention output,
//      64 x 64 = 4096, beside the bf16 one flash attention keeps: 43,264 as in bf16
TEST(Hybrid, SavedBytesUnderTransformerEngineFloat8) {
  Opts o = Tiny("dp_shard=1");
  o.fp8 = 1;
  Built b;
  Build(&b, o);
  EXPECT_EQ(SavedByBlock(b.s, 0), 100096);
  EXPECT_EQ(SavedByBlock(b.s, 1), 37120);
  EXPECT_EQ(SavedByBlock(b.s, 3), 8192 + 256 + 8192 + 12288 + 4096 + 2048 + 8192 - 4096 + 4096);
}

// Nemotron-H 8B's layers per token (T = 8192, micro-batch 1, seq 8192, tp 1, megatron-core;
// H 4096, in_proj rows 18560, d_inner 8192, 8 groups, d_ff 21504, q 4096, kv 1024, 32 heads):
//   M bf16: x 2H 8192 + rstd 4 + in_proj's input 2H 8192 + zxBCdt 2 x 18560 = 37120 + out_x
//     2 x 8192 = 16384 + the gated output 16384 + the norm's rstd 4 x 8 = 32 + out_proj's
//     input 16384 = 102,692 bytes a token (841,252,864 for the layer)
//   M float8: in_proj's input 4096, out_proj's input 8192: 102,692 - 12,288 = 90,404
//   - bf16: x 8192 + 4 + 8192 + relu's output and the square 2 x 2 x 21504 = 86016: 102,404
//   - float8: 8192 + 4 + 4096 + 43008 + 21504 = 76,804
//   * bf16: x 8192 + 4 + 8192 + q/k/v 2 x (4096 + 2 x 1024) = 12288 + lse 4 x 32 = 128 +
//     o's input 8192 = 36,996; float8: - 4096 (q/k/v's input) + 4096 (o's float8 copy)
// 24 x 90,404 + 24 x 76,804 + 4 x 36,996 = 4,160,976 bytes a token under float8.
TEST(Hybrid, SavedBytesPerTokenOfNemotronH8B) {
  for (int f8 : {0, 1}) {
    SCOPED_TRACE(f8);
    Opts o = Megatron("dp_replicate=8");
    o.model = "nemotron-h-8b";
    o.seq = 8192;
    o.fp8 = f8;
    o.dist_opt = 1;
    Built b;
    Build(&b, o);
    const int64_t T = 8192;
    EXPECT_EQ(SavedByBlock(b.s, 0), T * (f8 ? 90404 : 102692));  // M
    EXPECT_EQ(SavedByBlock(b.s, 1), T * (f8 ? 76804 : 102404));  // -
    EXPECT_EQ(SavedByBlock(b.s, 7), T * 36996);                  // *
  }
}

// Pipeline stages over the pattern's layers: nemotron-h-8b at pp 4 puts 13 layers on each
// stage (Megatron's split of the 52 characters); stage 0's, "M-M-M-M*-M-M-", are 6 M, 6 - and
// one *: 6 x 109,640,064 + 6 x 176,164,864 + 41,947,136 = 1,756,776,704 block parameters.
TEST(Hybrid, PipelineStagesSplitThePattern) {
  Opts o = Megatron("pp=4");
  o.model = "nemotron-h-8b";
  o.seq = 8192;
  Built b;
  ASSERT_EQ(PlanOnly(&b, o), MP_OK) << mp_errmsg(&b.ctx);
  int64_t stage0 = 0;
  int last = -1;
  for (int i = 0; i < b.plan->n_params; i++) {
    const mp_param *p = &b.plan->params[i];
    if (p->layer < 0 || p->pp_stage != 0) continue;
    stage0 += p->shape[0] * p->shape[1] * p->shape[2];
    if (p->layer > last) last = p->layer;
  }
  EXPECT_EQ(last, 12);
  EXPECT_EQ(stage0, 1756776704);
}

// NeMo's recommended layouts for nemotronh (model_configs_h100.csv: 8B on 8 H100s TP 1, 47B and
// 56B on 64 TP 8; MBS 1, seq 8192, fp8) build a plan and a schedule under Megatron-Core's memory
// model, and the schedule's model FLOPs are Megatron's: 56B's per token
// mp_model_hybrid_flops_per_token x tokens of the rank / tp.
TEST(Hybrid, NeMoLayoutsBuild) {
  struct Case {
    const char *model, *mesh;
    int64_t gbs;
    int tp;
  } cases[] = {{"nemotron-h-8b", "dp_replicate=8", 128, 1},
               {"nemotron-h-47b", "dp_replicate=8,tp=8", 192, 8},
               {"nemotron-h-56b", "dp_replicate=8,tp=8", 192, 8}};
  for (const Case &c : cases) {
    SCOPED_TRACE(c.model);
    Opts o = Megatron(c.mesh);
    o.model = c.model;
    o.seq = 8192;
    o.fp8 = 1;
    o.global_batch = c.gbs;
    o.dist_opt = 1;
    o.mode = MP_SCHEDULE_COMPACT;
    Built b;
    Build(&b, o);
    EXPECT_DOUBLE_EQ(b.s->model_flops_per_step,
                     mp_model_flops_per_token(&b.model, 8192) * (double)b.s->tokens_per_step_per_rank / c.tp);
  }
}

// The compact schedule folds only runs of layers of one kind (schedule_prep.c, same_block): its
// ops expanded are the expanded schedule's, FLOPs and bytes alike, on Nemotron-H 8B's pattern.
TEST(Hybrid, CompactScheduleExpandsToTheFullOne) {
  double flops[2] = {0, 0}, bytes[2] = {0, 0};
  size_t n[2] = {0, 0};
  for (int k = 0; k < 2; k++) {
    Opts o = Megatron("tp=2");
    o.model = "nemotron-h-8b";
    o.seq = 8192;
    o.mode = k ? MP_SCHEDULE_COMPACT : MP_SCHEDULE_EXPANDED;
    Built b;
    Build(&b, o);
    for (const Inst &x : Expand(b.s)) {
      flops[k] += x.op->flops;
      bytes[k] += x.op->bytes;
      n[k]++;
    }
  }
  EXPECT_EQ(n[0], n[1]);
  EXPECT_DOUBLE_EQ(flops[0], flops[1]);
  EXPECT_DOUBLE_EQ(bytes[0], bytes[1]);
}

// The refusals: a pattern of the wrong length, a MoE layer (E), Mamba sizes without a
// pattern, tp not dividing the Mamba groups, an AC policy the layers do not model, the
// runtime.
TEST(Hybrid, Refusals) {
  mp_ctx ctx;
  mp_ctx_init(&ctx);
  mp_model m;
  const char *base =
      "{\"name\": \"h\", \"family\": \"llama\", \"mlp\": \"squared_relu\", \"vocab\": 256, \"d_model\": 64, "
      "\"n_layers\": 3, \"n_heads\": 8, \"d_ff\": 128, \"hybrid_override_pattern\": \"%s\", \"mamba\": "
      "{\"ssm_state_size\": 16, \"mamba_num_heads\": 8, \"mamba_head_dim\": 16, \"n_groups\": 2}}";
  char text[1024];
  snprintf(text, sizeof text, base, "M-");
  EXPECT_EQ(mp_model_from_text(&ctx, text, "h.json", &m), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("has 2 layers and n_layers is 3"), std::string::npos);
  snprintf(text, sizeof text, base, "ME-");
  EXPECT_EQ(mp_model_from_text(&ctx, text, "h.json", &m), MP_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("MoE layer (E)"), std::string::npos);
  snprintf(text, sizeof text, base, "M*-");
  ASSERT_EQ(mp_model_from_text(&ctx, text, "h.json", &m), MP_OK) << mp_errmsg(&ctx);
  EXPECT_EQ(mp_model_param_count(&m), 2 * 256 * 64 + 64 + (328 * 64 + 192 * 5 + 24 + 128 + 8192 + 64) +
                                          (4 * 64 * 64 + 64) + (2 * 128 * 64 + 64));
  const char *no_pattern =
      "{\"family\": \"llama\", \"vocab\": 256, \"d_model\": 64, \"n_layers\": 2, \"n_heads\": 8, \"d_ff\": 128, "
      "\"mamba\": {\"ssm_state_size\": 16, \"mamba_num_heads\": 8, \"mamba_head_dim\": 16}}";
  EXPECT_EQ(mp_model_from_text(&ctx, no_pattern, "n.json", &m), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("without 'hybrid_override_pattern'"), std::string::npos);

  Built b;
  Opts o = Tiny("tp=4");  // tiny-hybrid's 2 groups
  EXPECT_EQ(PlanOnly(&b, o), MP_ERR_INVALID);
  EXPECT_NE(std::string(mp_errmsg(&b.ctx)).find("n_groups=2"), std::string::npos);
  Built c;
  o = Tiny("dp_shard=1");
  o.ac = MP_AC_SELECTIVE_CORE;
  EXPECT_EQ(PlanOnly(&c, o), MP_ERR_UNSUPPORTED);

  Built d;
  o = Tiny("cp=2");
  EXPECT_EQ(PlanOnly(&d, o), MP_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(mp_errmsg(&d.ctx)).find("context parallelism of its Mamba-2 layers"), std::string::npos);

  const mp_model t = Load("tiny-hybrid");
  EXPECT_EQ(mp_runtime_model_check(&ctx, &t, 64), MP_ERR_UNSUPPORTED);
  EXPECT_NE(std::string(mp_errmsg(&ctx)).find("2 Mamba-2 layers"), std::string::npos);
}

}  // namespace
