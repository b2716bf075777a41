// exec/model.h: loading (meshplan JSON and Hugging Face config.json) and the parameter and
// FLOP counts, against figures derived by hand in the comments (and, where one exists, the
// figure the model's authors publish).
#include <cjson/cJSON.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <string>

#include "data/embedded.h"
#include "exec/model.h"

namespace {

bool Contains(const std::string &s, const std::string &sub) {
  return s.find(sub) != std::string::npos;
}

// mp_model_to_json writes what mp_model_from_text reads back (the rows of MP_MODEL_FIELDS
// whose saved column is 1, the MoE layers, "mlp" and "norm"): a model without multi-head
// latent attention, a sliding window or chunked attention (none is saved) comes back field
// for field, its kinds of MLP and norm too.
void ExpectSurvivesItsJson(mp_ctx *ctx, const mp_model &m) {
  if (mp_model_is_mla(&m) || m.sliding_window > 0 || m.attn_chunk > 0) return;
  cJSON *j = mp_model_to_json(&m);
  ASSERT_NE(j, nullptr);
  char *text = cJSON_PrintUnformatted(j);
  cJSON_Delete(j);
  ASSERT_NE(text, nullptr);
  mp_model back;
  memset(&back, 0, sizeof back);
  const mp_status st = mp_model_from_text(ctx, text, m.name, &back);
  EXPECT_EQ(st, MP_OK) << mp_errmsg(ctx) << "\n" << text;
  free(text);
  if (st != MP_OK) return;
  EXPECT_STREQ(back.name, m.name);
  EXPECT_EQ(back.family, m.family);
  EXPECT_EQ(back.mlp, m.mlp);
  EXPECT_EQ(back.norm, m.norm);
  for (int f = 0; f < MP_MODEL_FIELD_COUNT; f++)
    EXPECT_EQ(mp_model_field_value(&back, (mp_model_field)f), mp_model_field_value(&m, (mp_model_field)f))
        << mp_model_field_key((mp_model_field)f);
  EXPECT_EQ(memcmp(back.moe_layer, m.moe_layer, sizeof m.moe_layer), 0);
  EXPECT_EQ(memcmp(back.layer_kind, m.layer_kind, sizeof m.layer_kind), 0);  // a hybrid model's pattern
}

struct ModelTest : ::testing::Test {
  mp_ctx ctx;
  mp_model m;
  void SetUp() override {
    mp_ctx_init(&ctx);
    memset(&m, 0, sizeof m);
  }
  std::string msg() const { return mp_errmsg(&ctx); }
  void Load(const char *name) { ASSERT_EQ(mp_model_load(&ctx, name, &m), MP_OK) << msg(); }
};

// Llama-3.1-8B (H=4096, L=32, 32 heads, 8 KV heads, head_dim 128, d_ff 14336, V=128256):
//   embeddings   128256*4096 = 525,336,576, twice (untied head)       1,050,673,152
//   attention    q 4096*4096 + k,v 2*4096*1024 + o 4096*4096 = 41,943,040
//   MLP          3*4096*14336                                 = 176,160,768
//   2 RMSNorms   2*4096                                       =       8,192
//   per layer                                                   218,112,000 (x32 = 6,979,584,000)
//   final norm                                                          4,096
//   total                                                     8,030,261,248 (Meta: 8.03e9)
TEST_F(ModelTest, Llama31_8bParameterCount) {
  Load("llama3.1-8b");
  EXPECT_STREQ(m.name, "llama3.1-8b");
  EXPECT_EQ(m.family, MP_FAMILY_LLAMA);
  EXPECT_EQ(mp_model_embedding_params(&m), 525336576);
  EXPECT_EQ(mp_model_head_params(&m), 525336576 + 4096);
  for (int l = 0; l < 32; l++) ASSERT_EQ(mp_model_block_params(&m, l), 218112000) << l;
  EXPECT_EQ(mp_model_param_count(&m), 8030261248LL);
  EXPECT_EQ(mp_model_active_param_count(&m), 8030261248LL);  // dense: all active
  EXPECT_FALSE(mp_model_is_moe(&m));
  EXPECT_EQ(mp_model_n_moe_layers(&m), 0);
}

// Llama-3.1-70B (H=8192, L=80, 64 heads, 8 KV, d_ff 28672): attention
// 2*8192^2 + 2*8192*1024 = 150,994,944; MLP 3*8192*28672 = 704,643,072; norms 16,384;
// layer 855,654,400 (x80 = 68,452,352,000); embeddings 2*128256*8192 = 2,101,346,304;
// final norm 8,192; total 70,553,706,496.
// Llama-3.1-405B (H=16384, L=126, 128 heads, 8 KV, d_ff 53248): attention
// 2*16384^2 + 2*16384*1024 = 570,425,344; MLP 3*16384*53248 = 2,617,245,696; norms 32,768;
// layer 3,187,703,808 (x126 = 401,650,679,808); embeddings 2*128256*16384 = 4,202,692,608;
// final norm 16,384; total 405,853,388,800.
TEST_F(ModelTest, Llama31_70bAnd405b) {
  Load("llama3.1-70b");
  EXPECT_EQ(mp_model_block_params(&m, 0), 855654400);
  EXPECT_EQ(mp_model_param_count(&m), 70553706496LL);
  Load("llama3.1-405b");
  EXPECT_EQ(mp_model_block_params(&m, 0), 3187703808LL);
  EXPECT_EQ(mp_model_param_count(&m), 405853388800LL);
}

// Llama 2 (V=32000, 4096 positions, RoPE theta 10000), Meta's published sizes:
// 7B (H=4096, L=32, 32 heads, MHA, d_ff 11008): attention 4*4096^2 = 67,108,864; MLP
//   3*4096*11008 = 135,266,304; norms 8,192; layer 202,383,360 (x32 = 6,476,267,520);
//   embeddings 2*32000*4096 = 262,144,000; final norm 4,096; total 6,738,415,616.
// 13B (H=5120, L=40, 40 heads, MHA, d_ff 13824): attention 4*5120^2 = 104,857,600; MLP
//   3*5120*13824 = 212,336,640; norms 10,240; layer 317,204,480 (x40 = 12,688,179,200);
//   embeddings 2*32000*5120 = 327,680,000; final norm 5,120; total 13,015,864,320.
// 70B (Llama 3.1 70B's blocks, 855,654,400 each, x80 = 68,452,352,000): embeddings
//   2*32000*8192 = 524,288,000; final norm 8,192; total 68,976,648,192.
// Llama 3 8B and 70B are Llama 3.1's shapes with 8192 positions: the same counts.
TEST_F(ModelTest, Llama2AndLlama3) {
  Load("llama2-7b");
  EXPECT_EQ(mp_model_block_params(&m, 0), 202383360);
  EXPECT_EQ(mp_model_param_count(&m), 6738415616LL);
  EXPECT_EQ(m.n_kv_heads, m.n_heads);
  Load("llama2-13b");
  EXPECT_EQ(mp_model_block_params(&m, 0), 317204480);
  EXPECT_EQ(mp_model_param_count(&m), 13015864320LL);
  Load("llama2-70b");
  EXPECT_EQ(mp_model_block_params(&m, 0), 855654400);
  EXPECT_EQ(mp_model_param_count(&m), 68976648192LL);
  EXPECT_EQ(m.max_seq, 4096);
  Load("llama3-8b");
  EXPECT_EQ(mp_model_param_count(&m), 8030261248LL);
  EXPECT_EQ(m.max_seq, 8192);
  Load("llama3-70b");
  EXPECT_EQ(mp_model_param_count(&m), 70553706496LL);
  EXPECT_EQ(m.max_seq, 8192);
}

// GPT-2 small (H=768, L=12, 12 heads, d_ff 3072, V=50257, 1024 positions, tied head):
//   token embeddings 50257*768 = 38,597,376; positions 1024*768 = 786,432
//   attention  4*768^2 + biases (3*768 qkv + 768 proj) = 2,359,296 + 3,072 = 2,362,368
//   MLP        2*768*3072 + biases (3072 + 768)      = 4,718,592 + 3,840 = 4,722,432
//   2 LayerNorms (weight + bias) 4*768                                     =     3,072
//   per layer 7,087,872 (x12 = 85,054,464); final LayerNorm 1,536; head tied: 0
//   total 38,597,376 + 786,432 + 85,054,464 + 1,536 = 124,439,808 (HF: 124.4e6)
TEST_F(ModelTest, Gpt2_124mWithTiedEmbeddings) {
  Load("gpt2-124m");
  EXPECT_EQ(m.family, MP_FAMILY_GPT);
  EXPECT_EQ(m.tied_embeddings, 1);
  EXPECT_EQ(m.head_dim, 64);
  EXPECT_EQ(mp_model_embedding_params(&m), 38597376 + 786432);
  EXPECT_EQ(mp_model_head_params(&m), 1536);
  EXPECT_EQ(mp_model_block_params(&m, 0), 7087872);
  EXPECT_EQ(mp_model_param_count(&m), 124439808);
}

// GPT-3 175B (H=12288, L=96, V=51200, 2048 positions, tied): a block is 12*H^2 + 13*H
// (attention 4H^2 + 4H biases, MLP 8H^2 + 5H biases, two LayerNorms 4H)
// = 1,811,939,328 + 159,744 = 1,812,099,072 (x96 = 173,961,510,912); embeddings
// 51200*12288 = 629,145,600, positions 2048*12288 = 25,165,824, final LN 24,576;
// total 174,615,846,912.
TEST_F(ModelTest, Gpt3_175b) {
  Load("gpt3-175b");
  EXPECT_EQ(mp_model_block_params(&m, 95), 1812099072LL);
  EXPECT_EQ(mp_model_param_count(&m), 174615846912LL);
}

// Qwen3-30B-A3B (H=2048, L=48, 32 heads, 4 KV heads, head_dim 128, 128 experts of 768,
// top-8, V=151936, untied):
//   attention q 2048*4096 + k,v 2*2048*512 + o 4096*2048 = 18,874,368; q/k norms 2*128 = 256
//   2 RMSNorms 4,096; router 128*2048 = 262,144; one expert 3*2048*768 = 4,718,592
//   layer, all experts  18,874,624 + 4,096 + 262,144 + 128*4,718,592 = 623,120,640
//   layer, 8 active     18,874,624 + 4,096 + 262,144 +   8*4,718,592 =  56,889,600
//   embeddings 2*151936*2048 = 622,329,856; final norm 2,048
//   total  48*623,120,640 + 622,331,904 = 30,532,122,624 (Qwen: 30.5e9)
//   active 48*56,889,600  + 622,331,904 =  3,353,032,704 (Qwen: 3.3e9)
TEST_F(ModelTest, Qwen3_30bA3bTotalAndActive) {
  Load("qwen3-30b-a3b");
  EXPECT_TRUE(mp_model_is_moe(&m));
  EXPECT_EQ(mp_model_n_moe_layers(&m), 48);
  EXPECT_EQ(mp_model_block_params(&m, 7), 623120640);
  EXPECT_EQ(mp_model_param_count(&m), 30532122624LL);
  EXPECT_EQ(mp_model_active_param_count(&m), 3353032704LL);
}

// gpt-oss-120b (H=2880, L=36, 64 heads, 8 KV, head_dim 64, q/k/v biases, 128 experts of
// 2880, top-4, V=201088, untied; Megatron-Bridge's GPTOSSProvider120B):
//   attention q 2880*4096 + k,v 2*2880*512 + o 4096*2880 = 26,542,080; q/k/v biases
//   4096 + 2*512 = 5,120; 2 RMSNorms 5,760; router 128*2880 = 368,640; one expert
//   3*2880*2880 = 24,883,200
//   layer, all experts  26,547,200 + 5,760 + 368,640 + 128*24,883,200 = 3,211,971,200
//   layer, 4 active     26,547,200 + 5,760 + 368,640 +   4*24,883,200 =   126,454,400
//   embeddings 2*201088*2880 = 1,158,266,880; final norm 2,880
//   total  36*3,211,971,200 + 1,158,269,760 = 116,789,232,960; with the o_proj and expert
//          biases and sinks left out (36*(2,880 + 128*8,640 + 64) = 39,919,104):
//          116,829,152,064, the model card's 116.83B
//   active 36*126,454,400 + 1,158,269,760 = 5,710,628,160; without the input embedding
//          (579,133,440): 5,131,494,720, the card's 5.13B
// gpt-oss-20b (L=24, 32 experts): layer 26,547,200 + 5,760 + 92,160 + 32*24,883,200 =
//   822,907,520, active 126,177,920; total 24*822,907,520 + 1,158,269,760 = 20,908,050,240
//   (+ 24*(2,880 + 32*8,640 + 64) = 6,706,176: 20.91B, the card's); active 4,186,539,840,
//   3,607,406,400 without the input embedding (the card's 3.61B).
// Attention: window 128 on the odd blocks (1-based), the whole prefix on every second
// (window_attn_skip_freq 2). At seq 4096 a windowed query attends to 128 - 128^2/8192 = 126
// keys, a full one to 2048: mean (126 + 2048) / 2 = 1087. FLOPs per token at 4096:
// 6*5,131,494,720 + 12*36*64*64*(2*1087) = 30,788,968,320 + 3,846,832,128 = 34,635,800,448.
// At seq 128 the window holds the sequence: 64 keys, the causal half.
TEST_F(ModelTest, GptOssAlternatingWindow) {
  Load("gpt-oss-120b");
  EXPECT_EQ(m.window_attn_skip_freq, 2);
  EXPECT_EQ(mp_model_n_moe_layers(&m), 36);
  EXPECT_EQ(mp_model_block_params(&m, 0), 3211971200LL);
  EXPECT_EQ(mp_model_param_count(&m), 116789232960LL);
  EXPECT_EQ(mp_model_active_param_count(&m), 5710628160LL);
  EXPECT_DOUBLE_EQ(mp_model_attended_keys(&m, 4096), 1087.0);
  EXPECT_DOUBLE_EQ(mp_model_attended_keys(&m, 128), 64.0);
  EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&m, 4096), 34635800448.0);
  Load("gpt-oss-20b");
  EXPECT_EQ(mp_model_param_count(&m), 20908050240LL);
  EXPECT_EQ(mp_model_active_param_count(&m), 4186539840LL);
  // without the skip every block is windowed: 126 keys
  m.window_attn_skip_freq = 0;
  EXPECT_DOUBLE_EQ(mp_model_attended_keys(&m, 4096), 126.0);
}

// Mixtral-8x7B (H=4096, L=32, 32 heads, 8 KV, 8 experts of 14336, top-2, V=32000):
//   attention 41,943,040; norms 8,192; router 8*4096 = 32,768; expert 3*4096*14336 = 176,160,768
//   layer, all  41,943,040 + 8,192 + 32,768 + 8*176,160,768 = 1,451,270,144
//   layer, top2 41,943,040 + 8,192 + 32,768 + 2*176,160,768 =   394,305,536
//   embeddings 2*32000*4096 = 262,144,000; final norm 4,096
//   total  32*1,451,270,144 + 262,148,096 = 46,702,792,704 (Mistral: 46.7e9)
//   active 32*394,305,536   + 262,148,096 = 12,879,925,248 (Mistral: 12.9e9)
TEST_F(ModelTest, Mixtral8x7b) {
  Load("mixtral-8x7b");
  EXPECT_EQ(mp_model_param_count(&m), 46702792704LL);
  EXPECT_EQ(mp_model_active_param_count(&m), 12879925248LL);
}

// Qwen3-8B (H=4096, L=36, 32 heads, 8 KV, head_dim 128, d_ff 12288, V=151936, qk-norm):
//   attention 41,943,040 + 256; MLP 3*4096*12288 = 150,994,944; norms 8,192
//   layer 192,946,432 (x36 = 6,946,071,552); embeddings 2*151936*4096 = 1,244,659,712;
//   final norm 4,096; total 8,190,735,360 (Qwen: 8.2e9, 6.95e9 without embeddings)
TEST_F(ModelTest, Qwen3_8b) {
  Load("qwen3-8b");
  EXPECT_EQ(m.qk_norm, 1);
  EXPECT_EQ(mp_model_param_count(&m), 8190735360LL);
}

// Qwen3-32B (H=5120, L=64, 64 heads, 8 KV, head_dim 128, d_ff 25600, V=151936, qk-norm):
//   attention q 5120*8192 + k,v 2*5120*1024 + o 8192*5120 = 94,371,840; q/k norms 256
//   MLP 3*5120*25600 = 393,216,000; norms 10,240; layer 487,598,336 (x64 = 31,206,293,504)
//   embeddings 2*151936*5120 = 1,555,824,640; final norm 5,120
//   total 32,762,123,264 (the model card: 32.8B)
// Qwen3-14B (H=5120, L=40, 40 heads, 8 KV, head_dim 128, d_ff 17408, V=151936, qk-norm):
//   attention 5120*5120*2 + 2*5120*1024 = 62,914,560; q/k norms 256
//   MLP 3*5120*17408 = 267,386,880; norms 10,240; layer 330,311,936 (x40 = 13,212,477,440)
//   total 13,212,477,440 + 1,555,829,760 = 14,768,307,200 (the model card: 14.8B)
TEST_F(ModelTest, Qwen3_32bAnd14b) {
  Load("qwen3-32b");
  EXPECT_EQ(mp_model_block_params(&m, 63), 487598336);
  EXPECT_EQ(mp_model_param_count(&m), 32762123264LL);
  Load("qwen3-14b");
  EXPECT_EQ(mp_model_block_params(&m, 0), 330311936);
  EXPECT_EQ(mp_model_param_count(&m), 14768307200LL);
}

// Qwen3-235B-A22B (H=4096, L=94, 64 heads, 4 KV, head_dim 128, 128 experts of 1536, top-8,
// V=151936, qk-norm, every block MoE):
//   attention q 4096*8192 + k,v 2*4096*512 + o 8192*4096 = 71,303,168; q/k norms 256
//   norms 8,192; router 128*4096 = 524,288; one expert 3*4096*1536 = 18,874,368
//   layer, all 71,303,424 + 8,192 + 524,288 + 128*18,874,368 = 2,487,755,008
//   layer, top8 71,303,424 + 8,192 + 524,288 +   8*18,874,368 =   222,830,848
//   embeddings 2*151936*4096 = 1,244,659,712; final norm 4,096
//   total  94*2,487,755,008 + 1,244,663,808 = 235,093,634,560 (Qwen3 report Table 2: 235B)
//   active 94*222,830,848   + 1,244,663,808 =  22,190,763,520 (22B)
TEST_F(ModelTest, Qwen3_235bA22bTotalAndActive) {
  Load("qwen3-235b-a22b");
  EXPECT_EQ(mp_model_n_moe_layers(&m), 94);
  EXPECT_EQ(mp_model_block_params(&m, 93), 2487755008LL);
  EXPECT_EQ(mp_model_param_count(&m), 235093634560LL);
  EXPECT_EQ(mp_model_active_param_count(&m), 22190763520LL);
}

// Mixtral-8x22B (H=6144, L=56, 48 heads, 8 KV, head_dim 128, 8 experts of 16384, top-2,
// V=32768, untied):
//   attention q 6144*6144 + k,v 2*6144*1024 + o 6144*6144 = 88,080,384; norms 12,288;
//   router 8*6144 = 49,152; one expert 3*6144*16384 = 301,989,888
//   layer, all  88,080,384 + 12,288 + 49,152 + 8*301,989,888 = 2,504,060,928
//   layer, top2 88,080,384 + 12,288 + 49,152 + 2*301,989,888 =   692,121,600
//   embeddings 2*32768*6144 = 402,653,184; final norm 6,144
//   total  56*2,504,060,928 + 402,659,328 = 140,630,071,296 (Mistral: 141B; 140.6B)
//   active 56*692,121,600   + 402,659,328 =  39,161,468,928 (Mistral: 39B)
TEST_F(ModelTest, Mixtral8x22b) {
  Load("mixtral-8x22b");
  EXPECT_EQ(mp_model_block_params(&m, 0), 2504060928LL);
  EXPECT_EQ(mp_model_param_count(&m), 140630071296LL);
  EXPECT_EQ(mp_model_active_param_count(&m), 39161468928LL);
}

// Qwen2-57B-A14B (H=3584, L=28, 28 heads, 4 KV, head_dim 128, q/k/v biases, 64 experts of
// 2560 top-8 and one shared expert of 20480, every block MoE, V=151936, untied):
//   attention q 3584*3584 + k,v 2*3584*512 + o 3584*3584 + biases 3584 + 2*512 = 29,364,736
//   norms 7,168; router 64*3584 = 229,376; one expert 3*3584*2560 = 27,525,120;
//   shared expert 3*3584*20480 = 220,200,960
//   layer, all  29,364,736 + 7,168 + 229,376 + 220,200,960 + 64*27,525,120 = 2,011,409,920
//   layer, top8 29,364,736 + 7,168 + 229,376 + 220,200,960 +  8*27,525,120 =   470,003,200
//   embeddings 2*151936*3584 = 1,089,077,248; final norm 3,584
//   total  28*2,011,409,920 + 1,089,080,832 = 57,408,558,592 (Qwen2 blog: 57.41B; without the
//          embeddings 56,319,481,344, the blog's 56.32B)
//   active 28*470,003,200   + 1,089,080,832 = 14,249,170,432 (A14B)
// The shared expert's sigmoid gate ([1, 3584] a block, 100,352 in all) is not modelled; with it
// the total is 57,408,658,944, still 57.41B.
TEST_F(ModelTest, Qwen2_57bA14bTotalAndActive) {
  Load("qwen2-57b-a14b");
  EXPECT_EQ(m.qkv_bias, 1);
  EXPECT_EQ(mp_model_n_moe_layers(&m), 28);
  EXPECT_EQ(mp_model_block_params(&m, 27), 2011409920LL);
  EXPECT_EQ(mp_model_param_count(&m), 57408558592LL);
  EXPECT_EQ(mp_model_active_param_count(&m), 14249170432LL);
}

// DeepSeek-V2 (H=5120, L=60, 128 heads, V=102400; MLA q_lora 1536, kv_lora 512, qk_nope 128,
// qk_rope 64, v 128; block 0 dense of 12288, blocks 1..59 160 routed experts of 1536, top-6,
// and 2 shared, 3072 together):
//   attention q_a 1536*5120 + 1536 + q_b 128*192*1536 + kv_a (512+64)*5120 + 512
//             + kv_b 128*(128+128)*512 + o 5120*128*128
//             = 7,864,320 + 1,536 + 37,748,736 + 2,949,120 + 512 + 16,777,216 + 83,886,080
//             = 149,227,520; norms 10,240
//   dense block 149,237,760 + 3*5120*12288 (188,743,680) = 337,981,440
//   MoE block   149,237,760 + router 160*5120 (819,200) + shared 3*5120*3072 (47,185,920)
//               + 160 experts x 3*5120*1536 (23,592,960) = 3,972,116,480;
//               with 6 routed experts 338,800,640
//   embeddings 2*102400*5120 = 1,048,576,000; final norm 5,120
//   total  337,981,440 + 59*3,972,116,480 + 1,048,581,120 = 235,741,434,880 (published 236B)
//   active 337,981,440 + 59*338,800,640   + 1,048,581,120 =  21,375,800,320, without the
//   input embedding 20,851,512,320 (published 21B)
TEST_F(ModelTest, DeepseekV2TotalAndActive) {
  Load("deepseek-v2");
  EXPECT_TRUE(mp_model_is_mla(&m));
  EXPECT_EQ(mp_model_n_moe_layers(&m), 59);
  EXPECT_EQ(mp_model_block_params(&m, 0), 337981440);
  EXPECT_EQ(mp_model_block_params(&m, 1), 3972116480LL);
  EXPECT_EQ(mp_model_param_count(&m), 235741434880LL);
  EXPECT_EQ(mp_model_active_param_count(&m), 21375800320LL);
  EXPECT_EQ(mp_model_matmul_param_count(&m), 20851512320LL);
}

// Nemotron-3 (NeMo's Nemotron3Config8B and 22B): Nemotron-4's block with multi-head attention.
// 22B (H=6144, L=40, 48 heads of 128, 48 KV, d_ff 24576, V=256000, untied):
//   attention 4*6144^2 = 150,994,944; MLP 2*6144*24576 = 301,989,888; LayerNorms 4*6144 =
//   24,576; layer 453,009,408 (x40 = 18,120,376,320); embeddings 2*256000*6144 =
//   3,145,728,000; final norm 12,288; total 21,266,116,608
// 8B (H=4096, L=32, 32 heads of 128, 32 KV, d_ff 16384): attention 4*4096^2 = 67,108,864;
//   MLP 2*4096*16384 = 134,217,728; LayerNorms 16,384; layer 201,342,976 (x32 =
//   6,442,975,232); embeddings 2*256000*4096 = 2,097,152,000; final norm 8,192;
//   total 8,540,135,424
TEST_F(ModelTest, Nemotron3MultiHead) {
  Load("nemotron3-22b");
  EXPECT_EQ(mp_model_mlp(&m), MP_MLP_SQUARED_RELU);
  EXPECT_EQ(mp_model_norm(&m), MP_NORM_LAYER);
  EXPECT_EQ(mp_model_block_params(&m, 0), 453009408LL);
  EXPECT_EQ(mp_model_param_count(&m), 21266116608LL);
  Load("nemotron3-8b");
  EXPECT_EQ(mp_model_block_params(&m, 0), 201342976LL);
  EXPECT_EQ(mp_model_param_count(&m), 8540135424LL);
}

// Nemotron-4 (arXiv 2402.16819 sec. 2): llama's attention (RoPE, GQA, no biases) with a
// squared-ReLU MLP of up and down only and LayerNorms with weight and bias (2H each).
// 340B (H=18432, L=96, 96 heads of 192, 8 KV, d_ff 73728, V=256000, untied):
//   attention q 18432*18432 + k,v 2*18432*1536 + o 18432*18432 = 736,100,352
//   MLP up, down 2*18432*73728 = 2,717,908,992 (gated it would be 3 x: 4,076,863,488)
//   two LayerNorms 4*18432 = 73,728; layer 3,454,083,072 (x96 = 331,591,974,912: the
//   report's 331.6B non-embedding)
//   embeddings 256000*18432 = 4,718,592,000, output 4,718,592,000 (9.4B), final norm 36,864
//   total 341,029,195,776 (the report's 340B: 9.4B + 331.6B = 341.0B)
// 15B (H=6144, L=32, 48 heads of 128, 8 KV, d_ff 24576, V=256000):
//   attention 2*6144^2 + 2*6144*1024 = 88,080,384; MLP 2*6144*24576 = 301,989,888;
//   LayerNorms 24,576; layer 390,094,848 (x32 = 12,483,035,136: the report's 12.5B)
//   embeddings 2*256000*6144 = 3,145,728,000 (3.2B); final norm 12,288
//   total 15,628,775,424
TEST_F(ModelTest, Nemotron4SquaredReluMlp) {
  Load("nemotron4-340b");
  EXPECT_EQ(m.family, MP_FAMILY_LLAMA);
  EXPECT_EQ(mp_model_mlp(&m), MP_MLP_SQUARED_RELU);
  EXPECT_EQ(mp_model_mlp_gated(&m), 0);
  EXPECT_EQ(mp_model_norm(&m), MP_NORM_LAYER);
  EXPECT_EQ(mp_model_norm_has_bias(&m), 1);
  EXPECT_EQ(mp_model_block_params(&m, 0), 3454083072LL);
  EXPECT_EQ(mp_model_head_params(&m), 4718592000LL + 36864);
  EXPECT_EQ(mp_model_param_count(&m), 341029195776LL);
  // FLOPs per token at seq 4096: 6 x (341,029,195,776 - 4,718,592,000) + 12 x 96 x 96 x 192 x 4096
  // = 2,017,863,622,656 + 86,973,087,744 = 2,104,836,710,400
  EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&m, 4096), 2104836710400.0);
  Load("nemotron4-15b");
  EXPECT_EQ(mp_model_block_params(&m, 31), 390094848);
  EXPECT_EQ(mp_model_param_count(&m), 15628775424LL);
}

// Llama 4 (H=5120, L=48, 40 heads, 8 KV, head_dim 128, V=202048, untied; routed experts of
// 8192, top-1, and one shared expert of 8192; Hugging Face Llama4TextConfig):
//   attention 2*5120*5120 + 2*5120*1024 = 62,914,560; norms 10,240; expert 3*5120*8192 = 125,829,120
//   embeddings 2*202048*5120 = 2,068,971,520; final norm 5,120
// Scout, 16 experts on every block, q/k norm (2 x 128 weights here; Llama 4's L2 norm has none):
//   block, all  62,914,816 + 10,240 + router 81,920 + 17*125,829,120 = 2,202,102,016
//   block, top1 62,914,816 + 10,240 + 81,920 + 2*125,829,120         =   314,665,216
//   total  48*2,202,102,016 + 2,068,976,640 = 107,769,873,408 (Meta: 109B with the vision
//          encoder and its projector, which are not modelled)
//   active 48*314,665,216   + 2,068,976,640 =  17,172,907,008 (Meta: 17B)
// Maverick, 128 experts on blocks 1, 3, .., 47 (interleave_moe_layer_step 2), the others dense
// of 16384:
//   dense block 62,924,800 + 3*5120*16384 (251,658,240)                      =    314,583,040
//   MoE block   62,924,800 + router 655,360 + 129*125,829,120                = 16,295,536,640
//               with one routed expert 62,924,800 + 655,360 + 2*125,829,120  =    315,238,400
//   total  24*(314,583,040 + 16,295,536,640) + 2,068,976,640 = 400,711,848,960 (Meta: 400B)
//   active 24*(314,583,040 + 315,238,400)    + 2,068,976,640 =  17,184,691,200 (Meta: 17B)
TEST_F(ModelTest, Llama4ScoutAndMaverick) {
  Load("llama4-scout-17b-16e");
  EXPECT_EQ(m.attn_chunk, 8192);
  EXPECT_EQ(mp_model_n_moe_layers(&m), 48);
  EXPECT_EQ(mp_model_block_params(&m, 0), 2202102016LL);
  EXPECT_EQ(mp_model_param_count(&m), 107769873408LL);
  EXPECT_EQ(mp_model_active_param_count(&m), 17172907008LL);
  // within one chunk the step is modelled; past it, refused with the chunk named
  EXPECT_EQ(mp_model_check_step(&ctx, &m, 8192, 1, 0), MP_OK) << msg();
  EXPECT_EQ(mp_model_check_step(&ctx, &m, 8193, 1, 0), MP_ERR_UNSUPPORTED);
  EXPECT_NE(msg().find("longer than its attention chunk (attn_chunk 8192"), std::string::npos) << msg();
  Load("llama4-maverick-17b-128e");
  EXPECT_EQ(mp_model_n_moe_layers(&m), 24);
  EXPECT_FALSE(mp_model_layer_is_moe(&m, 0));
  EXPECT_TRUE(mp_model_layer_is_moe(&m, 1));
  EXPECT_TRUE(mp_model_layer_is_moe(&m, 47));
  EXPECT_EQ(mp_model_block_params(&m, 0), 314583040);
  EXPECT_EQ(mp_model_block_params(&m, 1), 16295536640LL);
  EXPECT_EQ(mp_model_param_count(&m), 400711848960LL);
  EXPECT_EQ(mp_model_active_param_count(&m), 17184691200LL);
}

// "mlp" and "norm": the family's by default (llama SwiGLU and RMSNorm, gpt GELU and
// LayerNorm); a llama model may name either; a gpt model may not change its own; a MoE
// model's dense blocks stay SwiGLU; an unknown word is refused with the accepted ones.
TEST_F(ModelTest, MlpAndNormKeys) {
  const char *base =
      "{\"family\": \"llama\", \"vocab\": 100, \"d_model\": 64, \"n_layers\": 2, \"n_heads\": 4, \"d_ff\": 256";
  std::string t = std::string(base) + ", \"mlp\": \"gelu\", \"norm\": \"layernorm\"}";
  ASSERT_EQ(mp_model_from_text(&ctx, t.c_str(), "g.json", &m), MP_OK) << msg();
  // a block: attention 4*64*64 = 16,384; MLP 2*64*256 = 32,768; LayerNorms 2*2*64 = 256
  EXPECT_EQ(mp_model_block_params(&m, 0), 16384 + 32768 + 256);
  t = std::string(base) + "}";
  ASSERT_EQ(mp_model_from_text(&ctx, t.c_str(), "l.json", &m), MP_OK) << msg();
  EXPECT_EQ(mp_model_mlp(&m), MP_MLP_SWIGLU);
  EXPECT_EQ(mp_model_norm(&m), MP_NORM_RMS);
  EXPECT_EQ(mp_model_block_params(&m, 0), 16384 + 3 * 64 * 256 + 128);
  t = std::string(base) + ", \"mlp\": \"relu\"}";
  EXPECT_EQ(mp_model_from_text(&ctx, t.c_str(), "r.json", &m), MP_ERR_INVALID);
  EXPECT_NE(std::string(msg()).find("key 'mlp': expected one of \"swiglu\", \"gelu\", \"squared_relu\", got \"relu\""),
            std::string::npos) << msg();
  t = std::string(base) + ", \"norm\": 3}";
  EXPECT_EQ(mp_model_from_text(&ctx, t.c_str(), "n.json", &m), MP_ERR_INVALID);
  t = std::string(base) + ", \"mlp\": \"squared_relu\", \"moe\": {\"n_experts\": 4, \"top_k\": 1, \"d_ff_expert\": 32}}";
  EXPECT_EQ(mp_model_from_text(&ctx, t.c_str(), "m.json", &m), MP_ERR_INVALID);
  EXPECT_NE(std::string(msg()).find("experts are SwiGLU"), std::string::npos) << msg();
  const char *gpt =
      "{\"family\": \"gpt\", \"vocab\": 100, \"d_model\": 64, \"n_layers\": 2, \"n_heads\": 4, \"d_ff\": 256, "
      "\"mlp\": \"squared_relu\"}";
  EXPECT_EQ(mp_model_from_text(&ctx, gpt, "p.json", &m), MP_ERR_INVALID);
  EXPECT_NE(std::string(msg()).find("a gpt model has a GELU MLP and LayerNorms"), std::string::npos) << msg();
  // Nemotron-4's words survive mp_model_to_json (the checkpoint manifest's model)
  Load("nemotron4-15b");
  cJSON *j = mp_model_to_json(&m);
  ASSERT_NE(j, nullptr);
  EXPECT_STREQ(cJSON_GetStringValue(cJSON_GetObjectItem(j, "mlp")), "squared_relu");
  EXPECT_STREQ(cJSON_GetStringValue(cJSON_GetObjectItem(j, "norm")), "layernorm");
  cJSON_Delete(j);
}

// tiny-moe (H=64, L=2, 8 heads of 8, 4 KV, 8 experts of 32, top-2, one shared expert of 64):
//   attention 64*64 + 2*64*32 + 64*64 = 12,288; norms 128; router 8*64 = 512;
//   expert 3*64*32 = 6,144; shared 3*64*64 = 12,288
//   layer all  12,288 + 128 + 512 + 8*6,144 + 12,288 = 74,368
//   layer top2 12,288 + 128 + 512 + 2*6,144 + 12,288 = 37,504
//   embeddings 2*256*64 = 32,768; final norm 64
//   total 2*74,368 + 32,832 = 181,568; active 2*37,504 + 32,832 = 107,840
// tiny-dense: layer 12,288 + 128 + 3*64*192 = 49,280; total 2*49,280 + 32,832 = 131,392.
TEST_F(ModelTest, TinyModels) {
  Load("tiny-moe");
  EXPECT_EQ(mp_model_param_count(&m), 181568);
  EXPECT_EQ(mp_model_active_param_count(&m), 107840);
  Load("tiny-dense");
  EXPECT_EQ(mp_model_param_count(&m), 131392);
}

// FLOPs per token = 6 * (active params - input embedding lookup) + 12 * L * n_heads * head_dim * seq.
TEST_F(ModelTest, FlopsPerToken) {
  // Llama-3.1-8B, seq 8192: 6*(8,030,261,248 - 525,336,576) = 45,029,548,032;
  // attention 12*32*32*128*8192 = 12,884,901,888; sum 57,914,449,920.
  Load("llama3.1-8b");
  EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&m, 8192), 57914449920.0);
  // GPT-2, seq 1024: the tied head's matmul counts (38,597,376), positions do not:
  // 6*(38,597,376 + 1,536 + 85,054,464) = 741,920,256; 12*12*12*64*1024 = 113,246,208.
  Load("gpt2-124m");
  EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&m, 1024), 855166464.0);
  // Qwen3-30B-A3B, seq 4096: 6*(3,353,032,704 - 311,164,928) = 18,251,206,656;
  // 12*48*32*128*4096 = 9,663,676,416; sum 27,914,883,072.
  Load("qwen3-30b-a3b");
  EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&m, 4096), 27914883072.0);
  // tiny-dense, seq 64: 6*(131,392 - 16,384) = 690,048; 12*2*8*8*64 = 98,304.
  Load("tiny-dense");
  EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&m, 64), 788352.0);
  EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&m, 0), 690048.0);
}

// Mistral-7B (H=4096, L=32, 32 heads, 8 KV, head_dim 128, d_ff 14336, V=32000, untied,
// sliding window 4096; mistralai/Mistral-7B-v0.1's config.json):
//   attention 2*4096*4096 + 2*4096*1024 = 41,943,040; MLP 3*4096*14336 = 176,160,768;
//   norms 8,192; layer 218,112,000 (x32 = 6,979,584,000); embeddings 2*32000*4096 =
//   262,144,000; final norm 4,096; total 7,241,732,096: the model card's 7.24B.
// Sliding window: a query attends to W - W^2/(2 s) keys on average, 4096 - 1024 = 3072 at
// s = 8192 (not 4096, the causal half); at s <= W the window changes nothing (s / 2).
// FLOPs per token at 8192: 6*(7,241,732,096 - 131,072,000) = 42,663,960,576 and
// 12*32*32*128*(2*3072) = 9,663,676,416, sum 52,327,636,992; at 4096: 6,442,450,944 of
// attention, sum 49,106,411,520.
TEST_F(ModelTest, Mistral7bWithSlidingWindow) {
  for (const char *src : {"mistral-7b", "tests/data/hf/mistral-7b.json"}) {
    SCOPED_TRACE(src);
    ASSERT_EQ(mp_model_load(&ctx, src, &m), MP_OK) << msg();
    EXPECT_EQ(m.sliding_window, 4096);
    EXPECT_EQ(m.max_seq, 32768);
    EXPECT_EQ(mp_model_param_count(&m), 7241732096LL);
    EXPECT_DOUBLE_EQ(mp_model_attended_keys(&m, 8192), 3072.0);
    EXPECT_DOUBLE_EQ(mp_model_attended_keys(&m, 4096), 2048.0);
    EXPECT_EQ(mp_model_window_applies(&m, 8192), 1);
    EXPECT_EQ(mp_model_window_applies(&m, 4096), 0);
    EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&m, 8192), 52327636992.0);
    EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&m, 4096), 49106411520.0);
  }
  // Qwen2.5's config carries sliding_window 131072 with use_sliding_window false: no window.
  ASSERT_EQ(mp_model_load(&ctx, "tests/data/hf/qwen2.5-7b.json", &m), MP_OK) << msg();
  EXPECT_EQ(m.sliding_window, 0);
}

// A config of a supported architecture carrying a field that changes the cost which the
// spec cannot describe is refused by the field's name, not costed as if it were absent.
TEST_F(ModelTest, HfFieldsThatChangeCostAreHonouredOrRefused) {
  const char *base =
      "{\"model_type\": \"llama\", \"vocab_size\": 1000, \"hidden_size\": 256, \"num_hidden_layers\": 2, "
      "\"num_attention_heads\": 4, \"intermediate_size\": 512";
  for (const char *key : {"kv_lora_rank", "q_lora_rank", "n_shared_experts", "first_k_dense_replace",
                          "attn_logit_softcapping"}) {
    std::string text = std::string(base) + ", \"" + key + "\": 8}";
    EXPECT_EQ(mp_model_from_hf_text(&ctx, text.c_str(), "cfg.json", &m), MP_ERR_INVALID) << key;
    EXPECT_NE(std::string(msg()).find(key), std::string::npos) << msg();
  }
  // null is absent (published configs write "q_lora_rank": null for V2-Lite's plain q)
  std::string text = std::string(base) + ", \"q_lora_rank\": null, \"sliding_window\": 128}";
  ASSERT_EQ(mp_model_from_hf_text(&ctx, text.c_str(), "cfg.json", &m), MP_OK) << msg();
  EXPECT_EQ(m.sliding_window, 128);
  // attention_bias: q, k and v biases of 256 each (4 heads of 64, n_kv_heads = n_heads) in each
  // of the 2 layers
  text = std::string(base) + ", \"attention_bias\": true}";
  ASSERT_EQ(mp_model_from_hf_text(&ctx, text.c_str(), "cfg.json", &m), MP_OK) << msg();
  EXPECT_EQ(m.qkv_bias, 1);
  mp_model nb = m;
  nb.qkv_bias = 0;
  EXPECT_EQ(mp_model_param_count(&m) - mp_model_param_count(&nb), 2 * 3 * 256);  // 2 layers x q, k, v
}

// Every embedded model file loads, satisfies model.h's invariants and counts sensibly.
TEST_F(ModelTest, EveryDataModelLoads) {
  size_t n = 0;
  const mp_data_entry *e = mp_data_entries(&n);
  int models = 0;
  for (size_t i = 0; i < n; i++) {
    if (strcmp(e[i].kind, "models") != 0) continue;
    models++;
    SCOPED_TRACE(e[i].name);
    ASSERT_EQ(mp_model_load(&ctx, e[i].name, &m), MP_OK) << msg();
    EXPECT_STREQ(m.name, e[i].name);
    EXPECT_EQ(mp_model_validate(&ctx, &m, e[i].name), MP_OK) << msg();
    EXPECT_EQ(m.n_heads % m.n_kv_heads, 0);
    EXPECT_GT(mp_model_param_count(&m), 0);
    EXPECT_LE(mp_model_active_param_count(&m), mp_model_param_count(&m));
    EXPECT_EQ(mp_model_active_param_count(&m) == mp_model_param_count(&m),
              !mp_model_is_moe(&m) || m.top_k == m.n_experts);
    int64_t sum = mp_model_embedding_params(&m) + mp_model_head_params(&m);
    for (int64_t l = 0; l < m.n_layers; l++) sum += mp_model_block_params(&m, l);
    EXPECT_EQ(sum, mp_model_param_count(&m));
    for (int64_t l = m.n_layers; l < MP_MAX_LAYERS; l++) ASSERT_FALSE(m.moe_layer[l]) << l;
    ExpectSurvivesItsJson(&ctx, m);
  }
  // The embedded models: 16 named ones and the two tiny ones.
  EXPECT_GE(models, 18);
  for (const char *want : {"gpt2-124m", "gpt-22b", "gpt3-175b", "turing-530b", "megatron-1t",
                           "llama2-7b", "llama2-13b", "llama2-70b", "llama3-8b", "llama3-70b",
                           "llama3.1-8b", "llama3.1-70b", "llama3.1-405b", "qwen3-8b",
                           "qwen3-30b-a3b", "mixtral-8x7b", "tiny-dense", "tiny-moe", "qwen3-14b",
                           "qwen3-32b", "qwen3-235b-a22b", "mixtral-8x22b", "qwen2-57b-a14b", "deepseek-v2",
                           "nemotron4-15b", "nemotron4-340b", "llama4-scout-17b-16e",
                           "llama4-maverick-17b-128e"})
    EXPECT_NE(mp_data_find("models", want), nullptr) << want;
}

// A model is found by its file's stem ignoring case and the separators - _ . and space,
// and takes the stem as its name; names alike to two stems, or to none, are not found.
TEST_F(ModelTest, ModelByNameAlike) {
  for (const char *n : {"Llama-3.1-8B", "LLAMA3.1_8B", "llama 3.1 8b"}) {
    ASSERT_EQ(mp_model_load(&ctx, n, &m), MP_OK) << n << ": " << msg();
    EXPECT_STREQ(m.name, "llama3.1-8b") << n;
  }
  ASSERT_EQ(mp_model_load(&ctx, "Meta-Llama3-8B", &m), MP_ERR_NOT_FOUND) << "a prefix is not a separator";
  ASSERT_EQ(mp_model_load(&ctx, "Llama-3-8B", &m), MP_OK) << msg();
  EXPECT_STREQ(m.name, "llama3-8b");
  EXPECT_EQ(mp_data_name_alike("llama3.1-8b", "LLAMA_3_1_8B"), 1);
  EXPECT_EQ(mp_data_name_alike("llama3.1-8b", "llama3-8b"), 0);
  EXPECT_EQ(mp_data_name_alike("llama3-8b", "llama3-8"), 0);
  EXPECT_EQ(mp_data_name_alike("-a-", "A"), 1);
  // Hugging Face's repository names find the embedded files; a shortened name finds none
  const char *hf[][2] = {{"Qwen3-235B-A22B", "qwen3-235b-a22b"}, {"Mixtral-8x22B", "mixtral-8x22b"},
                         {"Nemotron-4-340B", "nemotron4-340b"}, {"DeepSeek-V2", "deepseek-v2"},
                         {"Qwen3-32B", "qwen3-32b"}, {"Llama-4-Scout-17B-16E", "llama4-scout-17b-16e"}};
  for (const auto &p : hf) {
    ASSERT_EQ(mp_model_load(&ctx, p[0], &m), MP_OK) << p[0] << ": " << msg();
    EXPECT_STREQ(m.name, p[1]) << p[0];
  }
  EXPECT_EQ(mp_model_load(&ctx, "qwen3-235b", &m), MP_ERR_NOT_FOUND) << "a prefix of qwen3-235b-a22b";
  EXPECT_EQ(mp_model_load(&ctx, "mixtral-8x22b-mcore", &m), MP_ERR_NOT_FOUND) << "the validation set's file is a path";
}

TEST_F(ModelTest, UnknownModelListsTheKnownOnes) {
  EXPECT_EQ(mp_model_load(&ctx, "llama9", &m), MP_ERR_NOT_FOUND);
  EXPECT_TRUE(Contains(msg(), "unknown model 'llama9'")) << msg();
  EXPECT_TRUE(Contains(msg(), "llama3.1-8b")) << msg();
  EXPECT_TRUE(Contains(msg(), "tiny-moe")) << msg();
  EXPECT_TRUE(Contains(msg(), "path")) << msg();
}

TEST_F(ModelTest, MissingFileByPath) {
  EXPECT_EQ(mp_model_load(&ctx, "tests/data/no-such-model.json", &m), MP_ERR_NOT_FOUND);
  EXPECT_TRUE(Contains(msg(), "tests/data/no-such-model.json")) << msg();
}

// ---- Hugging Face config.json files (tests/data/hf/, as published) ----

struct HfCase {
  const char *file;
  mp_family family;
  int64_t params, active;
  int64_t n_kv_heads, head_dim;
  int qkv_bias, qk_norm, tied;
};

TEST_F(ModelTest, HuggingFaceConfigsGiveTheSameCounts) {
  // Qwen2.5-7B (H=3584, L=28, 28 heads, 4 KV, head_dim 128, d_ff 18944, V=152064, q/k/v
  // biases): attention 2*3584^2 + 2*3584*512 + biases 3584 + 2*512 = 29,364,736;
  // MLP 3*3584*18944 = 203,685,888; norms 7,168; layer 233,057,792 (x28 = 6,525,618,176);
  // embeddings 2*152064*3584 = 1,089,994,752; final 3,584; total 7,615,616,512 (Qwen: 7.61e9).
  const HfCase cases[] = {
      {"llama3.1-8b.json", MP_FAMILY_LLAMA, 8030261248LL, 8030261248LL, 8, 128, 0, 0, 0},
      {"qwen2.5-7b.json", MP_FAMILY_LLAMA, 7615616512LL, 7615616512LL, 4, 128, 1, 0, 0},
      {"qwen3-8b.json", MP_FAMILY_LLAMA, 8190735360LL, 8190735360LL, 8, 128, 0, 1, 0},
      {"qwen3-30b-a3b.json", MP_FAMILY_LLAMA, 30532122624LL, 3353032704LL, 4, 128, 0, 1, 0},
      {"mixtral-8x7b.json", MP_FAMILY_LLAMA, 46702792704LL, 12879925248LL, 8, 128, 0, 0, 0},
      {"gpt2.json", MP_FAMILY_GPT, 124439808, 124439808, 12, 64, 0, 0, 1},
  };
  for (const HfCase &c : cases) {
    SCOPED_TRACE(c.file);
    std::string path = std::string("tests/data/hf/") + c.file;
    ASSERT_EQ(mp_model_load(&ctx, path.c_str(), &m), MP_OK) << msg();
    EXPECT_EQ(m.family, c.family);
    EXPECT_EQ(mp_model_param_count(&m), c.params);
    EXPECT_EQ(mp_model_active_param_count(&m), c.active);
    EXPECT_EQ(m.n_kv_heads, c.n_kv_heads);
    EXPECT_EQ(m.head_dim, c.head_dim);
    EXPECT_EQ(m.qkv_bias, c.qkv_bias);
    EXPECT_EQ(m.qk_norm, c.qk_norm);
    EXPECT_EQ(m.tied_embeddings, c.tied);
  }
}

// The HF config and meshplan's own file describe the same model field for field.
// Every field of two specs but the name, and what they count.
static void ExpectSameSpec(const mp_model &hf, const mp_model &ours) {
  EXPECT_EQ(hf.family, ours.family);
  EXPECT_EQ(hf.vocab, ours.vocab);
  EXPECT_EQ(hf.d_model, ours.d_model);
  EXPECT_EQ(hf.n_layers, ours.n_layers);
  EXPECT_EQ(hf.n_heads, ours.n_heads);
  EXPECT_EQ(hf.n_kv_heads, ours.n_kv_heads);
  EXPECT_EQ(hf.head_dim, ours.head_dim);
  EXPECT_EQ(hf.d_ff, ours.d_ff);
  EXPECT_EQ(hf.max_seq, ours.max_seq);
  EXPECT_EQ(hf.tied_embeddings, ours.tied_embeddings);
  EXPECT_EQ(hf.bias, ours.bias);
  EXPECT_EQ(hf.qkv_bias, ours.qkv_bias);
  EXPECT_EQ(hf.qk_norm, ours.qk_norm);
  EXPECT_EQ(hf.sliding_window, ours.sliding_window);
  EXPECT_EQ(hf.norm_eps, ours.norm_eps);
  EXPECT_EQ(hf.rope_theta, ours.rope_theta);
  EXPECT_EQ(hf.n_experts, ours.n_experts);
  EXPECT_EQ(hf.top_k, ours.top_k);
  EXPECT_EQ(hf.n_shared_experts, ours.n_shared_experts);
  EXPECT_EQ(hf.d_ff_expert, ours.d_ff_expert);
  EXPECT_EQ(hf.d_ff_shared, ours.d_ff_shared);
  EXPECT_EQ(hf.aux_loss_coef, ours.aux_loss_coef);
  EXPECT_EQ(hf.norm_topk_prob, ours.norm_topk_prob);
  EXPECT_EQ(hf.n_group, ours.n_group);
  EXPECT_EQ(hf.topk_group, ours.topk_group);
  EXPECT_EQ(memcmp(hf.moe_layer, ours.moe_layer, sizeof hf.moe_layer), 0);
  EXPECT_EQ(hf.q_lora_rank, ours.q_lora_rank);
  EXPECT_EQ(hf.kv_lora_rank, ours.kv_lora_rank);
  EXPECT_EQ(hf.qk_nope_head_dim, ours.qk_nope_head_dim);
  EXPECT_EQ(hf.qk_rope_head_dim, ours.qk_rope_head_dim);
  EXPECT_EQ(hf.v_head_dim, ours.v_head_dim);
  EXPECT_EQ(mp_model_param_count(&hf), mp_model_param_count(&ours));
  EXPECT_EQ(mp_model_flops_per_token(&hf, 4096), mp_model_flops_per_token(&ours, 4096));
}

TEST_F(ModelTest, HfLlamaMatchesOurLlamaFile) {
  mp_model ours, hf;
  ASSERT_EQ(mp_model_load(&ctx, "llama3.1-8b", &ours), MP_OK) << msg();
  ASSERT_EQ(mp_model_load(&ctx, "tests/data/hf/llama3.1-8b.json", &hf), MP_OK) << msg();
  ExpectSameSpec(hf, ours);
}

TEST_F(ModelTest, HfMoeFields) {
  ASSERT_EQ(mp_model_load(&ctx, "tests/data/hf/qwen3-30b-a3b.json", &m), MP_OK) << msg();
  EXPECT_EQ(m.n_experts, 128);
  EXPECT_EQ(m.top_k, 8);
  EXPECT_EQ(m.d_ff_expert, 768);
  EXPECT_EQ(m.n_shared_experts, 0);
  EXPECT_EQ(m.norm_topk_prob, 1);
  EXPECT_DOUBLE_EQ(m.aux_loss_coef, 0.001);
  EXPECT_EQ(mp_model_n_moe_layers(&m), 48);
  ASSERT_EQ(mp_model_load(&ctx, "tests/data/hf/mixtral-8x7b.json", &m), MP_OK) << msg();
  EXPECT_EQ(m.n_experts, 8);
  EXPECT_EQ(m.top_k, 2);
  EXPECT_EQ(m.d_ff_expert, 14336);  // Mixtral's intermediate_size is the expert's
  EXPECT_DOUBLE_EQ(m.aux_loss_coef, 0.02);
  EXPECT_EQ(mp_model_n_moe_layers(&m), 32);
}

// Qwen2-MoE layer selection: layer l is MoE when (l+1) % decoder_sparse_step == 0 and l is
// not in mlp_only_layers. With 4 layers, step 2, mlp_only [3]: only layer 1 is MoE.
// Counts (H=64, 4 heads of 16, 2 KV, q/k/v biases, d_ff 128, 4 experts of 32, top-2):
//   attention 2*64*64 + 2*64*32 + biases 64 + 2*32 = 12,416; norms 128
//   dense layer 12,416 + 128 + 3*64*128 = 37,120
//   MoE layer  12,416 + 128 + router 4*64 + 4*3*64*32 = 37,376 (active: 2 experts, 25,088)
//   embeddings 2*1000*64 = 128,000; final norm 64
//   total 3*37,120 + 37,376 + 128,064 = 276,800; active 3*37,120 + 25,088 + 128,064 = 264,512
TEST_F(ModelTest, HfQwen2MoeLayerSelection) {
  const char *cfg =
      "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"model_type\": \"qwen2_moe\","
      " \"vocab_size\": 1000, \"hidden_size\": 64, \"num_hidden_layers\": 4,"
      " \"num_attention_heads\": 4, \"num_key_value_heads\": 2, \"intermediate_size\": 128,"
      " \"moe_intermediate_size\": 32, \"num_experts\": 4, \"num_experts_per_tok\": 2,"
      " \"shared_expert_intermediate_size\": 0, \"decoder_sparse_step\": 2,"
      " \"mlp_only_layers\": [3], \"norm_topk_prob\": false, \"tie_word_embeddings\": false}";
  ASSERT_EQ(mp_model_from_text(&ctx, cfg, "q2moe.json", &m), MP_OK) << msg();
  EXPECT_FALSE(mp_model_layer_is_moe(&m, 0));
  EXPECT_TRUE(mp_model_layer_is_moe(&m, 1));
  EXPECT_FALSE(mp_model_layer_is_moe(&m, 2));
  EXPECT_FALSE(mp_model_layer_is_moe(&m, 3));
  EXPECT_FALSE(mp_model_layer_is_moe(&m, 4));  // out of range
  EXPECT_EQ(m.qkv_bias, 1);
  EXPECT_EQ(m.norm_topk_prob, 0);
  EXPECT_EQ(mp_model_param_count(&m), 276800);
  EXPECT_EQ(mp_model_active_param_count(&m), 264512);
}

TEST_F(ModelTest, HfMissingFieldNamesFieldAndFile) {
  const char *path = "tests/data/hf/llama-missing-hidden-size.json";
  EXPECT_EQ(mp_model_load(&ctx, path, &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), path)) << msg();
  EXPECT_TRUE(Contains(msg(), "'hidden_size'")) << msg();
  EXPECT_TRUE(Contains(msg(), "missing required key")) << msg();
  EXPECT_EQ(msg().find('\n'), std::string::npos);  // one line
}

TEST_F(ModelTest, HfErrorsPerArchitecture) {
  // GPT-2 without n_layer; Mixtral without num_local_experts; Qwen3-MoE without
  // moe_intermediate_size. Each message names the missing key and the architecture.
  struct { const char *text, *key; } cases[] = {
      {"{\"model_type\": \"gpt2\", \"vocab_size\": 50257, \"n_embd\": 768, \"n_head\": 12,"
       " \"n_positions\": 1024}", "'n_layer'"},
      {"{\"architectures\": [\"MixtralForCausalLM\"], \"model_type\": \"mixtral\","
       " \"vocab_size\": 32000, \"hidden_size\": 4096, \"num_hidden_layers\": 32,"
       " \"num_attention_heads\": 32, \"intermediate_size\": 14336, \"num_experts_per_tok\": 2}",
       "'num_local_experts'"},
      {"{\"architectures\": [\"Qwen3MoeForCausalLM\"], \"model_type\": \"qwen3_moe\","
       " \"vocab_size\": 100, \"hidden_size\": 64, \"num_hidden_layers\": 2,"
       " \"num_attention_heads\": 4, \"intermediate_size\": 128, \"num_experts\": 8,"
       " \"num_experts_per_tok\": 2}", "'moe_intermediate_size'"},
  };
  for (auto &c : cases) {
    EXPECT_EQ(mp_model_from_text(&ctx, c.text, "cfg.json", &m), MP_ERR_INVALID) << c.key;
    EXPECT_TRUE(Contains(msg(), c.key)) << msg();
    EXPECT_TRUE(Contains(msg(), "cfg.json")) << msg();
  }
}

// Zero routed experts, per architecture, as transformers reads the config: Mixtral's and
// DeepSeek's blocks would route among none (transformers fails building or running them),
// so 0 is refused naming the key and the dense alternative; Qwen2-MoE and Qwen3-MoE build
// a MoE block only where num_experts > 0, so 0 is their dense model, read so (a notice
// says it). Before, all three were read as dense without a word.
TEST_F(ModelTest, HfZeroExpertsAreReadAsTransformersReadsThem) {
  const std::string common =
      " \"vocab_size\": 1000, \"hidden_size\": 64, \"num_hidden_layers\": 4, \"num_attention_heads\": 4,"
      " \"intermediate_size\": 128, \"num_experts_per_tok\": 2,";
  const std::string mixtral = "{\"model_type\": \"mixtral\"," + common + " \"num_local_experts\": 0}";
  EXPECT_EQ(mp_model_from_text(&ctx, mixtral.c_str(), "mx.json", &m), MP_ERR_INVALID);
  EXPECT_EQ(msg(), "mx.json (mixtral): num_local_experts = 0: a Mixtral block needs at least one expert; give "
                   "num_local_experts >= 1, or model_type \"mistral\" for the dense model");
  const std::string ds =
      "{\"model_type\": \"deepseek_v2\"," + common +
      " \"kv_lora_rank\": 32, \"qk_nope_head_dim\": 16, \"qk_rope_head_dim\": 8, \"v_head_dim\": 16,"
      " \"moe_intermediate_size\": 32, \"n_routed_experts\": 0}";
  EXPECT_EQ(mp_model_from_text(&ctx, ds.c_str(), "ds.json", &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "ds.json (deepseek_v2): n_routed_experts = 0: DeepSeek's MoE blocks need at "
                              "least one routed expert; give n_routed_experts >= 1, or null for a dense model"))
      << msg();
  std::string ds4 = ds;  // the same config with 4 routed experts is read (the refusal is the zero's)
  ds4.replace(ds4.find("\"n_routed_experts\": 0"), 21, "\"n_routed_experts\": 4");
  ASSERT_EQ(mp_model_from_text(&ctx, ds4.c_str(), "ds.json", &m), MP_OK) << msg();
  EXPECT_EQ(m.n_experts, 4);
  const std::string neg = "{\"model_type\": \"mixtral\"," + common + " \"num_local_experts\": -1}";
  EXPECT_EQ(mp_model_from_text(&ctx, neg.c_str(), "mx.json", &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "num_local_experts = -1 is out of range; accepted 0..")) << msg();
  // Qwen2-MoE with num_experts 0: HfQwen2MoeLayerSelection's config made dense, four
  // blocks of 37,120 (q/k/v biases kept) and embeddings and final norm 128,064: 276,544.
  const std::string qwen = "{\"model_type\": \"qwen2_moe\"," + common +
                           " \"num_key_value_heads\": 2, \"num_experts\": 0, \"moe_intermediate_size\": 32,"
                           " \"decoder_sparse_step\": 2}";
  ASSERT_EQ(mp_model_from_text(&ctx, qwen.c_str(), "q.json", &m), MP_OK) << msg();
  EXPECT_FALSE(mp_model_is_moe(&m));
  EXPECT_EQ(mp_model_n_moe_layers(&m), 0);
  EXPECT_EQ(m.d_ff, 128);
  EXPECT_EQ(m.qkv_bias, 1);
  EXPECT_EQ(mp_model_param_count(&m), 276544);
}

// A config that names no architecture was read as llama: a Qwen2 config lost its q/k/v
// biases (Qwen2's by default, not by a key) and Qwen3's q/k norms, silently. Refused,
// naming both keys and what is read.
TEST_F(ModelTest, HfConfigNamingNoArchitectureIsRefused) {
  const std::string sizes =
      "\"vocab_size\": 1000, \"hidden_size\": 64, \"num_hidden_layers\": 2, \"num_attention_heads\": 4,"
      " \"num_key_value_heads\": 2, \"intermediate_size\": 128}";
  for (const std::string &head : {std::string("{"), std::string("{\"model_type\": \"\", \"architectures\": [], "),
                                   std::string("{\"model_type\": null, \"architectures\": [7], ")}) {
    EXPECT_EQ(mp_model_from_text(&ctx, (head + sizes).c_str(), "cfg.json", &m), MP_ERR_INVALID) << head;
    EXPECT_EQ(msg(), "cfg.json: neither 'model_type' nor 'architectures' is given, so the architecture (and what "
                     "its keys mean) is unknown; add model_type, one of llama, mistral, qwen2, qwen2_moe, qwen3, "
                     "qwen3_moe, mixtral, deepseek_v2, deepseek_v3, nemotron_h and gpt2") << head;
  }
  // either key alone names it
  ASSERT_EQ(mp_model_from_text(&ctx, ("{\"model_type\": \"qwen2\", " + sizes).c_str(), "cfg.json", &m), MP_OK);
  EXPECT_EQ(m.qkv_bias, 1);
  ASSERT_EQ(mp_model_from_text(&ctx, ("{\"architectures\": [\"Qwen2ForCausalLM\"], " + sizes).c_str(), "cfg.json",
                               &m), MP_OK);
  EXPECT_EQ(m.qkv_bias, 1);
}

// A key given twice (cJSON's first against Python's last: two models) is refused in
// meshplan's format, in its "moe" object and in a Hugging Face config (common/json.c).
TEST_F(ModelTest, AKeyGivenTwiceIsRefused) {
  const struct {
    const char *text, *want;
  } cases[] = {
      {"{\"family\": \"llama\", \"vocab\": 16, \"d_model\": 8, \"n_layers\": 2,\n"
       " \"n_heads\": 2, \"d_ff\": 16,\n \"n_heads\": 4}",
       "m.json: key \"n_heads\" appears twice (line 3); remove one"},
      {"{\"family\": \"llama\", \"vocab\": 16, \"d_model\": 8, \"n_layers\": 2, \"n_heads\": 2, \"d_ff\": 16,\n"
       " \"moe\": {\"n_experts\": 4, \"top_k\": 2,\n \"d_ff_expert\": 4, \"top_k\": 1}}",
       "m.json: key \"top_k\" appears twice (line 3); remove one"},
      {"{\"model_type\": \"qwen2\", \"vocab_size\": 1000, \"hidden_size\": 64,\n"
       " \"num_hidden_layers\": 2, \"num_attention_heads\": 4, \"intermediate_size\": 128,\n"
       " \"num_key_value_heads\": 2,\n \"num_key_value_heads\": 4}",
       "m.json: key \"num_key_value_heads\" appears twice (line 4); remove one"},
  };
  for (const auto &c : cases) {
    EXPECT_EQ(mp_model_from_text(&ctx, c.text, "m.json", &m), MP_ERR_INVALID) << c.text;
    EXPECT_EQ(msg(), c.want);
  }
}

// Zero heads must be a clear error, not a division by zero computing head_dim.
TEST_F(ModelTest, HfZeroHeadsIsAnErrorNotACrash) {
  const char *llama =
      "{\"model_type\": \"llama\", \"vocab_size\": 100, \"hidden_size\": 64,"
      " \"num_hidden_layers\": 2, \"num_attention_heads\": 0, \"intermediate_size\": 128}";
  EXPECT_EQ(mp_model_from_text(&ctx, llama, "z.json", &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "n_heads")) << msg();
  const char *gpt2 =
      "{\"model_type\": \"gpt2\", \"vocab_size\": 100, \"n_embd\": 64, \"n_layer\": 2,"
      " \"n_head\": 0, \"n_positions\": 64}";
  EXPECT_EQ(mp_model_from_text(&ctx, gpt2, "z.json", &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "n_heads")) << msg();
}

TEST_F(ModelTest, HfUnsupportedArchitectureIsRefusedByName) {
  const char *gemma =
      "{\"architectures\": [\"Gemma2ForCausalLM\"], \"model_type\": \"gemma2\","
      " \"vocab_size\": 256000, \"hidden_size\": 2304, \"num_hidden_layers\": 26,"
      " \"num_attention_heads\": 8, \"intermediate_size\": 9216}";
  EXPECT_EQ(mp_model_from_text(&ctx, gemma, "g.json", &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "architecture 'gemma2' is refused")) << msg();
  EXPECT_TRUE(Contains(msg(), "soft-capping")) << msg();
  EXPECT_TRUE(Contains(msg(), "alternating")) << msg();
  EXPECT_TRUE(Contains(msg(), "g.json")) << msg();
  // An architecture meshplan knows nothing of is refused with the list it reads.
  const char *phi = "{\"architectures\": [\"Phi3ForCausalLM\"], \"model_type\": \"phi3\"}";
  EXPECT_EQ(mp_model_from_text(&ctx, phi, "p.json", &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "unsupported architecture 'phi3'")) << msg();
  EXPECT_TRUE(Contains(msg(), "deepseek_v3")) << msg();
  // A DeepSeek config without its latent ranks names the missing key.
  const char *ds =
      "{\"architectures\": [\"DeepseekV3ForCausalLM\"], \"model_type\": \"deepseek_v3\","
      " \"vocab_size\": 129280, \"hidden_size\": 7168, \"num_hidden_layers\": 61,"
      " \"num_attention_heads\": 128, \"intermediate_size\": 18432}";
  EXPECT_EQ(mp_model_from_text(&ctx, ds, "ds.json", &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "'kv_lora_rank'")) << msg();
  EXPECT_TRUE(Contains(msg(), "ds.json")) << msg();
}

// ---- DeepSeek: multi-head latent attention, shared and routed experts, dense first layers

// DeepSeek-V3 (H=7168, L=61, 128 heads, q_lora 1536, kv_lora 512, qk_nope 128, qk_rope 64,
// v 128, d_ff 18432 in the first 3 layers, 256 routed experts of 2048 + 1 shared, top-8,
// V=129280, untied), counted by hand:
//   q_a_proj 1536*7168 = 11,010,048; q_a_layernorm 1,536; q_b_proj 128*192*1536 = 37,748,736;
//   kv_a_proj_with_mqa (512+64)*7168 = 4,128,768; kv_a_layernorm 512;
//   kv_b_proj 128*(128+128)*512 = 16,777,216; o_proj 7168*128*128 = 117,440,512
//   attention 187,107,328; block norms 2*7168 = 14,336
//   dense MLP 3*7168*18432 = 396,361,728
//   one expert 3*7168*2048 = 44,040,192; router 256*7168 = 1,835,008
//   MoE, all     257*44,040,192 + 1,835,008 = 11,320,164,352
//   MoE, active    9*44,040,192 + 1,835,008 =    398,196,736 (8 routed + the shared)
//   embeddings 2*129280*7168 = 1,853,358,080; final norm 7,168
//   total  61*187,121,664 + 3*396,361,728 + 58*11,320,164,352 + 1,853,365,248
//        = 671,026,404,352 (DeepSeek: 671B, without the multi-token-prediction module and
//          without the router's selection bias, a buffer: 58*256 more with it)
//   active 61*187,121,664 + 3*396,361,728 + 58*398,196,736 + 1,853,365,248
//        = 37,552,282,624; without the input embedding (926,679,040): 36,625,603,584
//          (DeepSeek publishes 37B activated; neither convention is within 0.5 % of 37.0B:
//          +1.5 % and -1.0 %)
TEST_F(ModelTest, DeepSeekV3TotalAndActive) {
  Load("deepseek-v3");
  EXPECT_TRUE(mp_model_is_mla(&m));
  EXPECT_EQ(m.head_dim, 192);
  EXPECT_EQ(m.n_kv_heads, 128);
  EXPECT_EQ(mp_model_v_head_dim(&m), 128);
  EXPECT_EQ(mp_model_n_moe_layers(&m), 58);
  for (int l = 0; l < 3; l++) EXPECT_FALSE(mp_model_layer_is_moe(&m, l)) << l;
  EXPECT_EQ(mp_model_block_params(&m, 0), 187121664LL + 396361728LL);
  EXPECT_EQ(mp_model_block_params(&m, 3), 187121664LL + 11320164352LL);
  EXPECT_EQ(mp_model_param_count(&m), 671026404352LL);
  EXPECT_NEAR((double)mp_model_param_count(&m), 671e9, 0.005 * 671e9);
  EXPECT_EQ(mp_model_active_param_count(&m), 37552282624LL);
  EXPECT_EQ(mp_model_active_param_count(&m) - mp_model_embedding_params(&m), 36625603584LL);
  // node-limited routing: 8 groups of 32 experts, a token's 8 from its best 4
  EXPECT_EQ(m.n_group, 8);
  EXPECT_EQ(m.topk_group, 4);
}

// DeepSeek-V2-Lite (H=2048, L=27, 16 heads, no q latent, kv_lora 512, qk_nope 128, qk_rope
// 64, v 128, d_ff 10944 in layer 0, 64 routed experts of 1408 + 2 shared, top-6, V=102400):
//   q_proj 16*192*2048 = 6,291,456; kv_a_proj_with_mqa 576*2048 = 1,179,648;
//   kv_a_layernorm 512; kv_b_proj 16*256*512 = 2,097,152; o_proj 2048*16*128 = 4,194,304
//   attention 13,763,072; block norms 4,096; dense MLP 3*2048*10944 = 67,239,936
//   one expert 3*2048*1408 = 8,650,752; router 64*2048 = 131,072
//   MoE, all (64 + 2)*8,650,752 + 131,072 = 571,080,704; active (6 + 2)*8,650,752 + 131,072
//   = 69,337,088; embeddings 2*102400*2048 = 419,430,400; final norm 2,048
//   total  27*13,767,168 + 67,239,936 + 26*571,080,704 + 419,432,448 = 15,706,484,224
//          (DeepSeek: 15.7B)
//   active 27*13,767,168 + 67,239,936 + 26*69,337,088 + 419,432,448 = 2,661,150,208;
//          without the input embedding (209,715,200): 2,451,435,008 (DeepSeek: 2.4B)
TEST_F(ModelTest, DeepSeekV2LiteTotalAndActive) {
  Load("deepseek-v2-lite");
  EXPECT_TRUE(mp_model_is_mla(&m));
  EXPECT_EQ(m.q_lora_rank, 0);
  EXPECT_EQ(mp_model_n_moe_layers(&m), 26);
  EXPECT_EQ(m.d_ff_shared, 2816);
  // topk_method "greedy": no group limit, though its config names n_group 1
  EXPECT_EQ(m.n_group, 0);
  EXPECT_EQ(mp_model_param_count(&m), 15706484224LL);
  EXPECT_EQ(mp_model_active_param_count(&m), 2661150208LL);
  EXPECT_EQ(mp_model_active_param_count(&m) - mp_model_embedding_params(&m), 2451435008LL);
}

// FLOPs per token under MLA: 6 x the activated parameters without the input embedding, plus
// the attention's 6 L heads (qk_head + v_head) seq (QK^T over 192 features, AV over 128):
//   V3 at 4096:      6*36,625,603,584 + 6*61*128*320*4096 = 219,753,621,504 + 61,404,610,560
//                  = 281,158,232,064
//   V2-Lite at 4096: 6*2,451,435,008 + 6*27*16*320*4096  =  14,708,610,048 +  3,397,386,240
//                  =  18,105,996,288
// DeepSeek-V3's MTP module adds, as Megatron's num_floating_point_operations counts it
// (training.py, core_v0.14.0), 6 x per token of: its block's active parameters (MLA
// 187,107,328 + 2 norms 14,336 + 8 routed experts x 3 x 7168 x 2048 = 352,321,536 + router
// 256 x 7168 = 1,835,008 + shared 3 x 7168 x 2048 = 44,040,192: 585,318,400), 3 norms and
// eh_proj (3 x 7168 + 2 x 7168^2 = 102,781,952) and its head (129,280 x 7168 = 926,679,040):
// 6 x 1,614,779,392 = 9,688,676,352; and one block's attention, 6 x 128 heads x (192 + 128)
// x 4096 = 1,006,632,960: 10,695,309,312 in all (per 4,096-token micro-batch forward: 4.795
// TFLOP block GEMMs, 0.687 attention, 0.842 eh_proj, 7.591 head).
TEST_F(ModelTest, DeepSeekFlopsPerToken) {
  Load("deepseek-v3");
  EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&m, 4096), 281158232064.0 + 10695309312.0);
  m.mtp_layers = 0;
  EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&m, 4096), 281158232064.0);
  Load("deepseek-v2-lite");
  EXPECT_DOUBLE_EQ(mp_model_flops_per_token(&m, 4096), 18105996288.0);
}

// The published Hugging Face configs load to the spec of meshplan's files, field for field.
TEST_F(ModelTest, HfDeepSeekConfigsMatchOurFiles) {
  const char *pairs[][2] = {{"deepseek-v3", "tests/data/hf/deepseek-v3.json"},
                            {"deepseek-v2-lite", "tests/data/hf/deepseek-v2-lite.json"}};
  for (auto &pr : pairs) {
    SCOPED_TRACE(pr[0]);
    mp_model ours, hf;
    ASSERT_EQ(mp_model_load(&ctx, pr[0], &ours), MP_OK) << msg();
    ASSERT_EQ(mp_model_load(&ctx, pr[1], &hf), MP_OK) << msg();
    ExpectSameSpec(hf, ours);
  }
}

// DeepSeek's layer rule (l >= first_k_dense_replace and l % moe_layer_freq == 0) differs from
// Qwen's (l + 1) % step: with freq 2 and 1 dense layer, layers 2, 4, 6 are MoE.
TEST_F(ModelTest, HfDeepSeekMoeLayerRule) {
  const char *cfg =
      "{\"model_type\": \"deepseek_v2\", \"vocab_size\": 100, \"hidden_size\": 64,"
      " \"num_hidden_layers\": 7, \"num_attention_heads\": 4, \"intermediate_size\": 128,"
      " \"q_lora_rank\": null, \"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8,"
      " \"qk_rope_head_dim\": 4, \"v_head_dim\": 8, \"n_routed_experts\": 4,"
      " \"num_experts_per_tok\": 2, \"moe_intermediate_size\": 32, \"n_shared_experts\": 2,"
      " \"first_k_dense_replace\": 1, \"moe_layer_freq\": 2}";
  ASSERT_EQ(mp_model_from_text(&ctx, cfg, "ds.json", &m), MP_OK) << msg();
  const int want[7] = {0, 0, 1, 0, 1, 0, 1};
  for (int l = 0; l < 7; l++) EXPECT_EQ(mp_model_layer_is_moe(&m, l), want[l]) << l;
  EXPECT_EQ(m.d_ff_shared, 64);
  EXPECT_EQ(m.head_dim, 12);
}

// MLA's rules, each refused with the field and what to do.
TEST_F(ModelTest, MlaFieldsAreChecked) {
  const std::string base =
      "{\"family\": \"llama\", \"vocab\": 100, \"d_model\": 64, \"n_layers\": 2,"
      " \"n_heads\": 4, \"d_ff\": 128";
  struct { const char *tail, *want; } cases[] = {
      {", \"mla\": {\"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 3,"
       " \"v_head_dim\": 8}}", "qk_rope_head_dim=3 must be even"},
      {", \"n_kv_heads\": 2, \"mla\": {\"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8,"
       " \"qk_rope_head_dim\": 4, \"v_head_dim\": 8}}", "n_kv_heads=2 must equal n_heads=4"},
      {", \"head_dim\": 16, \"mla\": {\"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8,"
       " \"qk_rope_head_dim\": 4, \"v_head_dim\": 8}}", "head_dim=16 must equal"},
      {", \"qk_norm\": true, \"mla\": {\"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8,"
       " \"qk_rope_head_dim\": 4, \"v_head_dim\": 8}}", "q/k norms"},
      {", \"mla\": {\"kv_lora_rank\": 16, \"qk_nope_head_dim\": 8, \"qk_rope_head_dim\": 4}}",
       "missing required key 'v_head_dim'"},
  };
  for (auto &c : cases) {
    std::string text = base + c.tail;
    EXPECT_EQ(mp_model_from_text(&ctx, text.c_str(), "m.json", &m), MP_ERR_INVALID) << c.want;
    EXPECT_TRUE(Contains(msg(), c.want)) << msg();
  }
}

TEST_F(ModelTest, HfKvHeadsMustDivideHeads) {
  const char *cfg =
      "{\"model_type\": \"llama\", \"vocab_size\": 100, \"hidden_size\": 64,"
      " \"num_hidden_layers\": 2, \"num_attention_heads\": 8, \"num_key_value_heads\": 3,"
      " \"intermediate_size\": 128}";
  EXPECT_EQ(mp_model_from_text(&ctx, cfg, "kv.json", &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "n_kv_heads=3 does not divide n_heads=8")) << msg();
}

TEST_F(ModelTest, MalformedJsonNamesLineAndColumn) {
  // tests/data/bad.json: line 3 is ` "n_layers": 2}` after a line missing its comma; cJSON
  // stops at the '"' in column 2.
  EXPECT_EQ(mp_model_load(&ctx, "tests/data/bad.json", &m), MP_ERR_INVALID);
  EXPECT_EQ(msg(), "tests/data/bad.json: malformed JSON at line 3, column 2; fix the file");
  // `{"vocab_size": }`: the value is missing where the '}' stands, column 16.
  EXPECT_EQ(mp_model_from_hf_text(&ctx, "{\"vocab_size\": }", "hf.json", &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "hf.json: malformed JSON at line 1, column 16")) << msg();
}

// meshplan's own format: required keys, family, and MoE block checks.
TEST_F(ModelTest, OwnFormatErrors) {
  struct { const char *text, *want; } cases[] = {
      {"{\"vocab\": 1, \"d_model\": 8, \"n_layers\": 1, \"n_heads\": 2, \"d_ff\": 8}",
       "m.json: missing required key 'family'"},
      {"{\"family\": \"bert\", \"vocab\": 1, \"d_model\": 8, \"n_layers\": 1, \"n_heads\": 2}",
       "key 'family': expected \"gpt\" or \"llama\", got \"bert\""},
      {"{\"family\": \"llama\", \"vocab\": 1, \"d_model\": 8, \"n_layers\": 1, \"n_heads\": 2.5}",
       "key 'n_heads': expected an integer, got a fractional number"},
      {"{\"family\": \"llama\", \"vocab\": 1, \"d_model\": 8, \"n_layers\": 1, \"n_heads\": 2}",
       "'d_ff' must be positive"},
      {"{\"family\": \"llama\", \"vocab\": 1, \"d_model\": 8, \"n_layers\": 1, \"n_heads\": 2,"
       " \"d_ff\": 8, \"moe\": {\"n_experts\": 4, \"d_ff_expert\": 8}}",
       "m.json: moe: missing required key 'top_k'"},
      {"{\"family\": \"llama\", \"vocab\": 1, \"d_model\": 8, \"n_layers\": 1, \"n_heads\": 2,"
       " \"d_ff\": 8, \"moe\": {\"n_experts\": 4, \"top_k\": 5, \"d_ff_expert\": 8}}",
       "top_k=5 must be in 1..n_experts=4"},
      {"{\"family\": \"gpt\", \"vocab\": 1, \"d_model\": 8, \"n_layers\": 1, \"n_heads\": 2,"
       " \"d_ff\": 8, \"moe\": {\"n_experts\": 4, \"top_k\": 1, \"d_ff_expert\": 8}}",
       "mixture-of-experts is supported on the llama family only"},
      {"{\"family\": \"llama\", \"vocab\": 1, \"d_model\": 8, \"n_layers\": 9999, \"n_heads\": 2,"
       " \"d_ff\": 8}",
       "m.json: n_layers = 9999 is out of range; accepted 1..512"},
  };
  for (auto &c : cases) {
    EXPECT_EQ(mp_model_from_text(&ctx, c.text, "m.json", &m), MP_ERR_INVALID) << c.want;
    EXPECT_TRUE(Contains(msg(), c.want)) << msg();
  }
}

// A "moe" object with no experts was read as a dense model (n_experts 0 means dense inside
// mp_model) whatever else it said, or refused for a missing top_k when alone. The object
// always describes experts: 0 (or fewer) is refused, naming the way to a dense model. One
// expert is a MoE as written (a router over one expert, as transformers builds it).
TEST_F(ModelTest, OwnFormatExpertGroupsMustSplitTheExperts) {
  const std::string base =
      "{\"family\": \"llama\", \"vocab\": 16, \"d_model\": 8, \"n_layers\": 2, \"n_heads\": 2,"
      " \"d_ff\": 16, \"moe\": {\"n_experts\": 8, \"top_k\": 2, \"d_ff_expert\": 4";
  ASSERT_EQ(mp_model_from_text(&ctx, (base + ", \"n_group\": 4}}").c_str(), "m.json", &m), MP_OK) << msg();
  EXPECT_EQ(m.topk_group, 4);  // every group by default
  EXPECT_EQ(mp_model_from_text(&ctx, (base + ", \"n_group\": 3}}").c_str(), "m.json", &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "must split n_experts=8 evenly")) << msg();
  EXPECT_EQ(mp_model_from_text(&ctx, (base + ", \"n_group\": 4, \"topk_group\": 5}}").c_str(), "m.json", &m),
            MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "topk_group")) << msg();
}

TEST_F(ModelTest, OwnFormatMoeWithoutExpertsIsRefused) {
  const std::string base =
      "{\"family\": \"llama\", \"vocab\": 16, \"d_model\": 8, \"n_layers\": 2, \"n_heads\": 2,"
      " \"d_ff\": 16, \"moe\": ";
  for (const char *moe : {"{\"n_experts\": 0}", "{\"n_experts\": 0, \"top_k\": 1, \"d_ff_expert\": 4}",
                          "{\"n_experts\": 0, \"top_k\": 2, \"d_ff_expert\": 4, \"n_shared_experts\": 1,"
                          " \"d_ff_shared\": 8}"}) {
    EXPECT_EQ(mp_model_from_text(&ctx, (base + moe + "}").c_str(), "m.json", &m), MP_ERR_INVALID) << moe;
    EXPECT_EQ(msg(), "m.json: moe.n_experts = 0: a MoE block needs at least one expert; drop the moe "
                     "object for a dense model") << moe;
  }
  EXPECT_EQ(mp_model_from_text(&ctx, (base + "{\"n_experts\": -3, \"top_k\": 1, \"d_ff_expert\": 4}}").c_str(),
                               "m.json", &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "moe.n_experts = -3")) << msg();
  // null, like absent, is the dense model; one expert is a MoE of one
  ASSERT_EQ(mp_model_from_text(&ctx, (base + "null}").c_str(), "m.json", &m), MP_OK) << msg();
  EXPECT_FALSE(mp_model_is_moe(&m));
  ASSERT_EQ(mp_model_from_text(&ctx, (base + "{\"n_experts\": 1, \"top_k\": 1, \"d_ff_expert\": 4}}").c_str(),
                               "m.json", &m), MP_OK) << msg();
  EXPECT_EQ(mp_model_n_moe_layers(&m), 2);
}

// A MoE model where every layer is MoE needs no dense d_ff; first_dense_layers keeps the
// first layers dense.
TEST_F(ModelTest, OwnFormatMoeLayerPlacement) {
  const char *all =
      "{\"family\": \"llama\", \"vocab\": 16, \"d_model\": 8, \"n_layers\": 3, \"n_heads\": 2,"
      " \"moe\": {\"n_experts\": 4, \"top_k\": 2, \"d_ff_expert\": 4}}";
  ASSERT_EQ(mp_model_from_text(&ctx, all, "a.json", &m), MP_OK) << msg();
  EXPECT_EQ(mp_model_n_moe_layers(&m), 3);
  const char *first =
      "{\"family\": \"llama\", \"vocab\": 16, \"d_model\": 8, \"n_layers\": 3, \"n_heads\": 2,"
      " \"d_ff\": 16, \"moe\": {\"n_experts\": 4, \"top_k\": 2, \"d_ff_expert\": 4,"
      " \"first_dense_layers\": 1}}";
  ASSERT_EQ(mp_model_from_text(&ctx, first, "f.json", &m), MP_OK) << msg();
  EXPECT_FALSE(mp_model_layer_is_moe(&m, 0));
  EXPECT_TRUE(mp_model_layer_is_moe(&m, 1));
  EXPECT_TRUE(mp_model_layer_is_moe(&m, 2));
  // Block sizes (H=8, 2 heads of 4, MHA): attention 4*64 = 256, norms 16.
  // dense 256 + 16 + 3*8*16 = 656; MoE 256 + 16 + router 32 + 4*3*8*4 = 688.
  EXPECT_EQ(mp_model_block_params(&m, 0), 656);
  EXPECT_EQ(mp_model_block_params(&m, 1), 688);
}

// Hostile fields: each is refused with one line naming the field, its value and the
// accepted range (common/limits.h), never rounded or let through to a negative count.
TEST_F(ModelTest, OutOfRangeFieldsNameTheirRange) {
  const std::string base =
      "{\"family\": \"llama\", \"vocab\": 100, \"n_layers\": 2, \"d_ff\": 128, ";
  struct { std::string text, want; } cases[] = {
      // the "fits yes at a negative peak": 3e9 > 2^20
      {base + "\"d_model\": 3000000000, \"n_heads\": 8}",
       "m.json: d_model = 3000000000 is out of range; accepted 1..1048576"},
      // n_heads 7 with d_model 64 and no head_dim: refused, not rounded to 9
      {base + "\"d_model\": 64, \"n_heads\": 7}",
       "m.json: n_heads = 7 does not divide d_model = 64 and 'head_dim' is not given; give "
       "head_dim or choose n_heads among the divisors of d_model"},
      {base + "\"d_model\": 64, \"n_heads\": 8, \"norm_eps\": 1e999}",
       "m.json: key 'norm_eps': expected a finite number, got inf"},
      {base + "\"d_model\": 64, \"n_heads\": 8, \"norm_eps\": -1}",
       "m.json: norm_eps = -1 is out of range; accepted (0, 1]"},
      {base + "\"d_model\": 64, \"n_heads\": 8, \"rope_theta\": 0}",
       "m.json: rope_theta = 0 is out of range; accepted (0, 1e+12]"},
      {base + "\"d_model\": 64, \"n_heads\": 8, \"max_seq\": 33554432}",
       "m.json: max_seq = 33554432 is out of range; accepted 1..16777216"},
      {base + "\"d_model\": 64, \"n_heads\": 8, \"n_kv_heads\": 16}",
       "m.json: n_kv_heads = 16 is out of range; accepted 1..8"},
      {base + "\"d_model\": 64, \"n_heads\": 8, \"head_dim\": 8192}",
       "m.json: head_dim = 8192 is out of range; accepted 1..4096"},
      {"{\"family\": \"llama\", \"vocab\": 8388608, \"n_layers\": 2, \"d_ff\": 128, "
       "\"d_model\": 64, \"n_heads\": 8}",
       "m.json: vocab = 8388608 is out of range; accepted 1..4194304"},
      {base + "\"d_model\": 64, \"n_heads\": 8, \"moe\": {\"n_experts\": 100000, \"top_k\": 2, "
       "\"d_ff_expert\": 8}}",
       "m.json: n_experts = 100000 is out of range; accepted 0..16384"},
      {base + "\"d_model\": 64, \"n_heads\": 8, \"moe\": {\"n_experts\": 4, \"top_k\": 2, "
       "\"d_ff_expert\": 8, \"layer_freq\": 0}}",
       "m.json: moe: layer_freq = 0 is out of range; accepted 1..2"},
      // every field within its bound, the whole beyond 2^50 parameters: 512 layers of
      // 3 x 2^20 x 2^22 MLP weights are 3 x 2^51
      {"{\"family\": \"llama\", \"vocab\": 100, \"n_layers\": 512, \"d_ff\": 4194304, "
       "\"d_model\": 1048576, \"n_heads\": 256}",
       "parameters is out of range; accepted up to 1125899906842624"},
  };
  for (auto &c : cases) {
    EXPECT_EQ(mp_model_from_text(&ctx, c.text.c_str(), "m.json", &m), MP_ERR_INVALID) << c.want;
    EXPECT_TRUE(Contains(msg(), c.want)) << msg();
    EXPECT_EQ(msg().find('\n'), std::string::npos);
  }
  // head_dim given: any n_heads is fine (Qwen3's q width differs from d_model too)
  ASSERT_EQ(mp_model_from_text(&ctx, (base + "\"d_model\": 64, \"n_heads\": 7, \"head_dim\": 8}").c_str(),
                               "m.json", &m), MP_OK) << msg();
  EXPECT_EQ(m.head_dim, 8);
}

TEST_F(ModelTest, HfHeadsThatDoNotDivideAreRefused) {
  const char *cfg =
      "{\"model_type\": \"llama\", \"vocab_size\": 100, \"hidden_size\": 64,"
      " \"num_hidden_layers\": 2, \"num_attention_heads\": 7, \"intermediate_size\": 128}";
  EXPECT_EQ(mp_model_from_text(&ctx, cfg, "h.json", &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "n_heads = 7 does not divide d_model = 64 and 'head_dim' is not given"))
      << msg();
  const char *gpt2 =
      "{\"model_type\": \"gpt2\", \"vocab_size\": 100, \"n_embd\": 64, \"n_layer\": 2,"
      " \"n_head\": 7, \"n_positions\": 64}";
  EXPECT_EQ(mp_model_from_text(&ctx, gpt2, "g.json", &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "n_heads = 7 does not divide d_model = 64")) << msg();
  const char *only =
      "{\"architectures\": [\"Qwen2MoeForCausalLM\"], \"model_type\": \"qwen2_moe\","
      " \"vocab_size\": 1000, \"hidden_size\": 64, \"num_hidden_layers\": 4,"
      " \"num_attention_heads\": 4, \"intermediate_size\": 128, \"moe_intermediate_size\": 32,"
      " \"num_experts\": 4, \"num_experts_per_tok\": 2, \"mlp_only_layers\": [9]}";
  EXPECT_EQ(mp_model_from_text(&ctx, only, "q.json", &m), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "'mlp_only_layers': every entry must be a layer index in 0..3")) << msg();
}

// The step's sizes: within the bounds every product fits; beyond them a refusal naming the
// limit instead of a wrapped size (the issue's --seq 9223372036854775807 gave -32 tokens).
TEST_F(ModelTest, StepSizesAreBounded) {
  Load("llama3.1-8b");
  EXPECT_EQ(mp_model_check_step(&ctx, &m, 8192, 1, 2048), MP_OK) << msg();
  EXPECT_EQ(mp_model_check_step(&ctx, &m, 8192, 2, 0), MP_OK) << msg();  // batch not resolved
  EXPECT_EQ(mp_model_check_step(&ctx, &m, 0, 1, 8), MP_ERR_INVALID);
  EXPECT_EQ(msg(), "seq = 0 is out of range; accepted 1..16777216");
  EXPECT_EQ(mp_model_check_step(&ctx, &m, INT64_MAX, 1, 8), MP_ERR_INVALID);
  EXPECT_EQ(mp_model_check_step(&ctx, &m, 8192, 1, int64_t(1) << 62), MP_ERR_INVALID);
  EXPECT_EQ(msg(), "global batch = 4611686018427387904 is out of range; accepted 1..16777216");
  // 2^20 sequences of 2^13 tokens = 2^33 tokens > 2^32
  EXPECT_EQ(mp_model_check_step(&ctx, &m, 8192, 1, 1 << 20), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "more than 4294967296 tokens")) << msg();
  // one micro-batch of 2^14 x 2^13 tokens x the vocabulary 128256 > 2^40 elements
  EXPECT_EQ(mp_model_check_step(&ctx, &m, 8192, 1 << 14, 1 << 14), MP_ERR_INVALID);
  EXPECT_TRUE(Contains(msg(), "x 128256 (vocab) is more than 1099511627776 elements")) << msg();
}

}  // namespace
